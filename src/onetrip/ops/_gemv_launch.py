"""The launch of the skinny matmul kernel, shared by ``skinny_matmul`` and ``gemv_norm``:
its launch shape (``SkinnyConfig``), the shape's pick (``skinny_config``; at batch 1
``gemv_config``, with the measured table ``_gemv_picks``), and ``launch_skinny``. The
kernels are in ``_gemv_jit.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import gpu_table_entry, is_interpreting, pdl_args
from ._gemv_jit import _skinny_matmul_kernel, _split_reduce_kernel
from ._gemv_picks import GEMV_PICKS, GemvPicks

@dataclass(frozen=True)
class SkinnyConfig:
    """Launch shape of ``_skinny_matmul_kernel``.

    block_m: rows of x per program (all of them: a power of two >= M; 16 or 32 with use_dot).
    block_n, block_k: the weight tile loaded per step. split_k: programs per column block
    (1: no split). use_dot: tl.dot on the tile instead of multiply + sum. early: one row
    under programmatic dependent launch, the weight chunks (0-2) put in flight before
    waiting for the previous kernel (the weight never depends on it).
    """

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    use_dot: bool = False
    num_stages: int = 3
    early: int = 0

    def as_list(self) -> list[int]:
        return [self.block_m, self.block_n, self.block_k, self.split_k, self.num_warps, int(self.use_dot),
                self.num_stages, self.early]

    @classmethod
    def from_list(cls, v: list[int]) -> "SkinnyConfig":
        return cls(*v[:5], bool(v[5]), *v[6:8])


def skinny_config(M: int, N: int, K: int, sms: int, dtype: torch.dtype = torch.bfloat16, *,
                  fusion: str = "plain", gpu: str = "", picks: GemvPicks = GEMV_PICKS) -> SkinnyConfig:
    """A config from the shape and the SM count; one 16-bit row: ``gemv_config`` (``fusion``,
    ``gpu`` and ``picks`` are read there only).

    - M <= 8, or float32: multiply + sum with a (block_m, block_n, block_k) product of at
      most 8192 elements (64 registers a thread at 4 warps; 4096 for one float32 row, whose
      products accumulate in float64); block_k up to 256 so each thread loads 16
      contiguous bytes of a weight row.
    - 16-bit M > 8: tl.dot with M padded to 16 or 32 (the tensor cores are idle anyway), a
      64 x 64 weight tile. Not under the interpreter in bf16, whose tl.dot is wrong there.
    - split_k when ceil(N / block_n) programs are fewer than 2 per SM, with at least two
      K chunks per split.
    """
    if M == 1 and dtype != torch.float32:
        return gemv_config(N, K, fusion, gpu, picks)
    block_m = triton.next_power_of_2(max(M, 1))
    use_dot = M > 8 and dtype != torch.float32 and not (is_interpreting() and dtype == torch.bfloat16)
    if use_dot:
        block_m, block_n, block_k = max(16, block_m), 64, 64
    else:
        budget = 4096 if M == 1 else 8192
        block_k = min(256, triton.next_power_of_2(max(K, 16)))
        block_n = max(1, min(32, triton.next_power_of_2(max(N, 1)), budget // (block_m * block_k)))
        if block_n < 8:  # keep a few columns per program; give up K length instead
            block_n = min(8, triton.next_power_of_2(max(N, 1)))
            block_k = max(16, min(triton.next_power_of_2(max(K, 16)), budget // (block_m * block_n)))
    programs = triton.cdiv(N, block_n)
    split_k = 1
    if programs < 2 * sms:
        split_k = max(1, min(triton.cdiv(2 * sms, programs), K // (2 * block_k)))
    return SkinnyConfig(block_m, block_n, block_k, split_k, 4, use_dot)


# What a batch-1 GEMV carries besides the product (gemv_norm): an RMSNorm in the prologue,
# a residual add + sum of squares in the epilogue, or SwiGLU in the prologue as well.
GEMV_FUSIONS = ("plain", "norm", "residual", "silu_residual")


def gemv_config(N: int, K: int, fusion: str = "plain", gpu: str = "", picks: GemvPicks = GEMV_PICKS) -> SkinnyConfig:
    """Batch 1 (16-bit): the measured launch of (N, K, fusion) in ``picks`` (the GPU model's
    table first), else the rule, read off ``tools/sweep_gemv.py`` on an H200, where it beats
    cuBLAS on all ten 1B/8B projections (1B o_proj: 4.3 us against 6.1):

    - N <= 8192 (qkv, o, down): 4-16 columns a program (about N / 512: 256-512 programs),
      1024-long K chunks, 8 warps: each program keeps 16-32 KB of weight in flight.
    - wider (gate_up, lm_head): 16 x 256 tiles at 4 warps, already thousands of programs.
    - no split-K: its float32 partials and second launch cost more than it gains here.

    ``fusion`` (one of ``GEMV_FUSIONS``) is what the GEMV carries: a prologue or epilogue
    moves the best launch (8B qkv + RMSNorm: 15.2 us at 8 x 512, 4 warps; 18.6 at the rule's
    16 x 1024, 8 warps). ``early``: ``picks.early_chunks`` of the GEMV's role."""
    if fusion not in GEMV_FUSIONS:
        raise ValueError(f"fusion must be one of {GEMV_FUSIONS}, got {fusion!r}")
    early = picks.early_chunks[gemv_role(N, K, fusion)]
    launch = gpu_table_entry(picks.tuned_gpu, gpu, (N, K, fusion))
    if launch is None:
        launch = picks.tuned.get((N, K, fusion))
    if launch is not None:
        bn, bk, warps, *chunks = launch  # (an entry may set its own early chunks)
        return SkinnyConfig(1, bn, bk, 1, warps, False, 1, chunks[0] if chunks else early)

    def chunk(limit: int) -> int:  # the largest power of two <= limit dividing K (EVEN_K)
        c = limit
        while c > 16 and K % c:
            c //= 2
        return c if K % c == 0 else min(limit, triton.next_power_of_2(max(K, 16)))
    if N <= 8192:
        return SkinnyConfig(1, min(16, max(4, triton.next_power_of_2(max(1, N // 512)))), chunk(1024), 1, 8, False, 1,
                            early)
    return SkinnyConfig(1, 16, chunk(256), 1, 4, False, 1, early)


# The L2 eviction policy of the batch-1 GEMVs' weight loads ("" the default). A decode step
# streams every weight once (2.5 GB on the 1B against a 50-60 MiB L2): "evict_first" keeps
# the lines that are read again (the KV cache, the activations) from being pushed out. H100:
# the 1B's attention kernel 7.4 -> 6.3 us a layer, step 1.016 -> 0.998-1.005 ms.
WEIGHT_EVICT = "evict_first"


def gemv_role(N: int, K: int, fusion: str) -> str:
    """A batch-1 GEMV's place in a decoder layer, from its fusion and shape: the RMSNorm
    prologue carries qkv (N <= 2K: 1.3-1.5 K in Llama and Qwen) or gate_up and the LM head
    (N >= 7K); the residual epilogue o, with SwiGLU's prologue down."""
    if fusion == "norm":
        return "qkv" if N <= 2 * K else "gate_up"
    return {"residual": "o", "silu_residual": "down"}.get(fusion, "plain")


def _pdl_args(x: torch.Tensor, cfg: SkinnyConfig) -> dict:
    """``pdl_args``, with EARLY = ``cfg.early`` (weight chunks before the wait) for one-row
    launches."""
    args = pdl_args(x)
    if args and cfg.early and cfg.block_m == 1 and not cfg.use_dot:
        args["EARLY"] = cfg.early
    return args


def launch_skinny(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], y: torch.Tensor,
                  cfg: SkinnyConfig, silu_mul: bool = False, residual: Optional[torch.Tensor] = None,
                  ss_out: Optional[torch.Tensor] = None, ss_in: Optional[torch.Tensor] = None,
                  norm_weight: Optional[torch.Tensor] = None, eps: float = 0.0) -> None:
    """x (M, K) with unit column stride, weight (N, K), bias (N,) or None, y (M, N) unit column
    stride. One row only (``gemv_norm``): silu_mul: x is (1, 2K), [gate | up], and the
    product uses silu(gate) * up; residual (N,) + ss_out (grid,): y += residual and each
    program's sum of y^2; ss_in + norm_weight (K,): x is RMS-normalised first."""
    M = x.shape[0]
    N, K = weight.shape
    if K == 0:  # an empty sum: y = bias, or 0
        y.copy_(bias.expand(M, N) if bias is not None else torch.zeros((), dtype=y.dtype, device=y.device))
        return
    k_per_split = triton.cdiv(triton.cdiv(K, cfg.split_k), cfg.block_k) * cfg.block_k
    split_k = triton.cdiv(K, k_per_split)  # no empty splits
    split = split_k > 1
    # Sized from the shape alone, so a CUDA graph captures it from its private pool.
    target = torch.empty((split_k, M, N), dtype=torch.float32, device=x.device) if split else y
    b = bias if bias is not None else x  # never read without HAS_BIAS
    _skinny_matmul_kernel[(triton.cdiv(N, cfg.block_n), split_k)](
        x, weight, b, target,
        M, N, K, k_per_split,
        x.stride(0), weight.stride(0), weight.stride(1), y.stride(0),
        residual if residual is not None else x, ss_out if ss_out is not None else x,
        ss_in if ss_in is not None else x, ss_in.numel() if ss_in is not None else 0,
        norm_weight if norm_weight is not None else x, eps,
        HAS_BIAS=bias is not None and not split, RES_OUT=residual is not None, NORM_IN=ss_in is not None,
        BLOCK_SS=max(16, triton.next_power_of_2(ss_in.numel())) if ss_in is not None else 16,
        SPLIT=split, USE_DOT=cfg.use_dot,
        EVEN_K=k_per_split % cfg.block_k == 0 and K % k_per_split == 0, SILU_MUL=silu_mul,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        ACC=tl.float64 if x.dtype == torch.float32 and cfg.block_m == 1 and not cfg.use_dot else tl.float32,
        W_EVICT=WEIGHT_EVICT if M == 1 and not cfg.use_dot else "",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_pdl_args(x, cfg),
    )
    if split:
        block = 1024
        _split_reduce_kernel[(triton.cdiv(M * N, block),)](
            target, b, y, M, N, split_k, y.stride(0),
            HAS_BIAS=bias is not None, BLOCK=block, num_warps=4, **pdl_args(x),
        )

