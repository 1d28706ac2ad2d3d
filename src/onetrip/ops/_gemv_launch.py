"""The launch of the skinny matmul kernel, shared by ``skinny_matmul`` and ``gemv_norm``:
its launch shape (``SkinnyConfig``), the shape's pick (``skinny_config``; at batch 1
``gemv_config``, with the measured table ``_gemv_picks``), and ``launch_skinny``. The
kernels are in ``_gemv_jit.py``."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Optional

import torch
import triton.language as tl

from ._common import cdiv, gpu_table_entry, is_interpreting, next_pow2, pdl_kwargs, pdl_on
from ._gemv_jit import _skinny_matmul_kernel, _split_reduce_kernel
from ._gemv_picks import GEMV_PICKS, GemvPicks
from ._launch import launch, meta_key

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
        return _from_tuple(tuple(v))


@functools.lru_cache(maxsize=4096)  # the custom ops rebuild their config from its list at every call
def _from_tuple(v: tuple) -> SkinnyConfig:
    return SkinnyConfig(*v[:5], bool(v[5]), *v[6:8])


@functools.lru_cache(maxsize=256)  # asked at every call: dataclasses.replace costs ~3 us
def no_split(cfg: SkinnyConfig) -> SkinnyConfig:
    """``cfg`` without split-K: the GEMVs whose prologue or epilogue needs whole rows."""
    return replace(cfg, split_k=1)


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
    use_dot = M > 8 and dtype != torch.float32 and not (is_interpreting() and dtype == torch.bfloat16)
    return _rule_config(M, N, K, sms, use_dot)


@functools.lru_cache(maxsize=4096)  # a launch asks at every call
def _rule_config(M: int, N: int, K: int, sms: int, use_dot: bool) -> SkinnyConfig:
    """``skinny_config`` past one 16-bit row."""
    block_m = next_pow2(max(M, 1))
    if use_dot:
        block_m, block_n, block_k = max(16, block_m), 64, 64
    else:
        budget = 4096 if M == 1 else 8192
        block_k = min(256, next_pow2(max(K, 16)))
        block_n = max(1, min(32, next_pow2(max(N, 1)), budget // (block_m * block_k)))
        if block_n < 8:  # keep a few columns per program; give up K length instead
            block_n = min(8, next_pow2(max(N, 1)))
            block_k = max(16, min(next_pow2(max(K, 16)), budget // (block_m * block_n)))
    programs = cdiv(N, block_n)
    split_k = 1
    if programs < 2 * sms:
        split_k = max(1, min(cdiv(2 * sms, programs), K // (2 * block_k)))
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
    # Memoized per picks object: hashing a GemvPicks walks its tables (~4 us), its id does not.
    held = _GEMV_CONFIGS.get(id(picks))
    if held is None:  # the memo holds picks, so no other object takes its id meanwhile
        if len(_GEMV_CONFIGS) >= 64:
            _GEMV_CONFIGS.clear()
        held = _GEMV_CONFIGS[id(picks)] = (picks, {})
    configs = held[1]
    cfg = configs.get((N, K, fusion, gpu))
    if cfg is None:
        if len(configs) >= 4096:
            configs.clear()
        cfg = configs[(N, K, fusion, gpu)] = _gemv_config(N, K, fusion, gpu, picks)
    return cfg


_GEMV_CONFIGS: dict[int, tuple[GemvPicks, dict]] = {}


def _gemv_config(N: int, K: int, fusion: str, gpu: str, picks: GemvPicks) -> SkinnyConfig:
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
        return c if K % c == 0 else min(limit, next_pow2(max(K, 16)))
    if N <= 8192:
        return SkinnyConfig(1, min(16, max(4, next_pow2(max(1, N // 512)))), chunk(1024), 1, 8, False, 1, early)
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
    has_bias, pdl = bias is not None, pdl_on(x)
    # the config by its fields: a dataclass hashes in Python, ~0.5 us
    plan = _plan(M, N, K, cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_warps, cfg.use_dot,
                 cfg.num_stages, cfg.early, has_bias, residual is not None, ss_in.numel() if ss_in is not None else -1,
                 silu_mul, x.dtype == torch.float32, pdl)
    k_per_split, split_k, meta, key = plan[:4]
    split = split_k > 1
    # Sized from the shape alone, so a CUDA graph captures it from its private pool.
    target = torch.empty((split_k, M, N), dtype=torch.float32, device=x.device) if split else y
    b = bias if bias is not None else x  # never read without HAS_BIAS
    launch(_skinny_matmul_kernel, (cdiv(N, cfg.block_n), split_k),
           (x, weight, b, target,
            M, N, K, k_per_split,
            x.stride()[0], *weight.stride(), y.stride()[0],
            residual if residual is not None else x, ss_out if ss_out is not None else x,
            ss_in if ss_in is not None else x, ss_in.numel() if ss_in is not None else 0,
            norm_weight if norm_weight is not None else x, eps),
           meta, key)
    if split:
        reduce_meta, reduce_key = plan[4:]
        launch(_split_reduce_kernel, (cdiv(M * N, SPLIT_REDUCE_BLOCK),), (target, b, y, M, N, split_k, y.stride()[0]),
               reduce_meta, reduce_key)


SPLIT_REDUCE_BLOCK = 1024  # outputs a program of the split-K reduce


@functools.lru_cache(maxsize=4096)
def _plan(M: int, N: int, K: int, block_m: int, block_n: int, block_k: int, split_k: int, num_warps: int,
          use_dot: bool, num_stages: int, early: int, has_bias: bool, res_out: bool, n_ss: int, silu_mul: bool,
          fp32: bool, pdl: bool) -> tuple:
    """(K per split, splits, the matmul's meta and its ``meta_key``, and with splits the
    reduce's meta and key): kept, as a launch needs them at every call. ``n_ss``: the
    producer's sums of squares (NORM_IN), -1 for none."""
    k_per_split = cdiv(cdiv(K, split_k), block_k) * block_k
    splits = cdiv(K, k_per_split)  # no empty splits
    split = splits > 1
    one_row = block_m == 1 and not use_dot
    meta = dict(HAS_BIAS=has_bias and not split, RES_OUT=res_out, NORM_IN=n_ss >= 0,
                BLOCK_SS=max(16, next_pow2(n_ss)) if n_ss >= 0 else 16,
                SPLIT=split, USE_DOT=use_dot, EVEN_K=k_per_split % block_k == 0 and K % k_per_split == 0,
                SILU_MUL=silu_mul, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                ACC=tl.float64 if fp32 and one_row else tl.float32,
                W_EVICT=WEIGHT_EVICT if M == 1 and not use_dot else "",
                num_warps=num_warps, num_stages=num_stages, **pdl_kwargs(pdl))
    if pdl and early and one_row:  # EARLY: weight chunks put in flight before the PDL wait
        meta["EARLY"] = early
    plan = (k_per_split, splits, meta, meta_key(meta))
    if split:
        reduce_meta = dict(HAS_BIAS=has_bias, BLOCK=SPLIT_REDUCE_BLOCK, num_warps=4, **pdl_kwargs(pdl))
        plan += (reduce_meta, meta_key(reduce_meta))
    return plan
