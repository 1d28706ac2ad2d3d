"""Skinny matmuls: y = x @ weight.T (+ bias) for a few rows, as a decode step runs them.

At batch 1 every projection of a decoder is a matrix-vector product. Its traffic is
almost all weight: for the 8B model's gate_up (28672 x 4096, bf16) the weight is 224 MiB
and x and y together 64 KiB, while the arithmetic is 2 FLOP per weight element, far below
what the tensor cores could do in the time the weight takes to stream in. So the kernel's
only job is to read the weight exactly once, at the copy bandwidth:

    each program owns BLOCK_N output columns and walks K in BLOCK_K chunks; every
    (BLOCK_N, BLOCK_K) weight tile is loaded once and used for all M rows of x.

When N / BLOCK_N programs are too few to keep every SM streaming (o_proj of the 8B model,
4096 x 4096, gives 128 programs of 32 columns on 132 SMs), K is split over SPLIT_K
programs per column block: each writes float32 partials to a workspace of
(SPLIT_K, M, N) and a second, small kernel sums them, adds the bias and rounds once.

Rows M > 32 are left to ``torch.nn.functional.linear`` (cuBLAS): there the product is no
longer bandwidth-bound by a wide margin and tensor-core GEMMs are the right tool.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._common import (
    as_rows,
    call_op,
    check_dtype_match,
    check_same_device,
    check_shape,
    check_tensor,
    gpu_name,
    gpu_table_entry,
    is_interpreting,
    output,
    pdl_args,
    rows_out,
    sm_count,
    use_triton,
)
from ._gemv_jit import _gemv_row
from ._gemv_picks import _TUNED_GEMV, _TUNED_GEMV_GPU, EARLY_CHUNKS  # noqa: F401 - tests and A/Bs patch them here
from ._jit import cast_out, pdl_start
from .glu import silu_mul as glu_silu_mul  # the unfused path of silu_mul_matmul

MAX_ROWS = 32  # above this many rows, F.linear (cuBLAS) runs instead


@triton.jit
def _skinny_matmul_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr,  # x (M, K), w (N, K), b (N,), y (M, N) or the (SPLIT_K, M, N) fp32 workspace
    M, N, K, K_PER_SPLIT,
    stride_xm, stride_wn, stride_wk, stride_ym,
    res_ptr, ss_out_ptr,         # RES_OUT: residual (N,); float32 sum of squares per program (grid,)
    ss_in_ptr, n_ss, nw_ptr, eps,  # NORM_IN: the producer's n_ss sums of squares; norm weight (K,)
    HAS_BIAS: tl.constexpr,
    RES_OUT: tl.constexpr,  # y = x @ w^T + residual, and this program's sum of y^2 (one row)
    NORM_IN: tl.constexpr,  # x -> x * rsqrt(sum(ss_in) / K + eps) * nw: RMSNorm in the prologue
    NORM_LATE: tl.constexpr,  # apply NORM_IN's rsqrt (one scalar per row) after the K loop
    BLOCK_SS: tl.constexpr,
    SPLIT: tl.constexpr,  # write float32 partials of this program's K range to the workspace
    USE_DOT: tl.constexpr,  # tl.dot on the tile (M padded to 16) instead of multiply + sum
    EVEN_K: tl.constexpr,   # every K chunk is whole: no K mask, so loads stay 16-byte vectors
    SILU_MUL: tl.constexpr,  # x is (M, 2K) [gate | up]: use silu(gate) * up (one row only)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ACC: tl.constexpr = tl.float32,  # one row: the dtype of the products and sums (float64 for float32 x)
    PDL: tl.constexpr = 0,  # programmatic dependent launch (_common.pdl_mode)
    EARLY: tl.constexpr = 0,  # one row under PDL: weight chunks put in flight before the wait (0-2)
    W_EVICT: tl.constexpr = "",  # one row: the weight loads' L2 eviction policy (WEIGHT_EVICT)
):
    # HAS_BIAS / SPLIT / USE_DOT are constexpr so each variant compiles to straight-line code
    # without the others' loads and stores: one kernel body instead of four copies.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    # 64-bit column offsets: N * stride_wn exceeds 2**31 for an LM head of 152K x 16K.
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn  # (BLOCK_N, 1)
    x_rows = x_ptr + rows[:, None] * stride_xm  # (BLOCK_M, 1)
    if BLOCK_M == 1 and not USE_DOT:
        # One row (batch 1): a (BLOCK_N, BLOCK_K) accumulator of products, summed over K
        # once after the loop, so the loop is loads and FMAs only; a sum per chunk costs a
        # cross-thread reduction (shuffles) for every BLOCK_K weights. ACC is float32, or
        # float64 for float32 x: a float32 sum of 5000 products missed the 2 x PyTorch rule
        # on the H200 (cuBLAS's float32 GEMV is that accurate), and Hopper's float64 FMA
        # runs at half the float32 rate, far above what a GEMV's bytes allow.
        acc = _gemv_row(x_ptr, w_rows, k_lo, k_hi, K, stride_wk, col_ok, ss_in_ptr, n_ss, nw_ptr, eps,
                        NORM_IN, NORM_LATE, BLOCK_SS, EVEN_K, SILU_MUL, BLOCK_K, ACC, PDL, EARLY, W_EVICT)
    else:
        pdl_start(PDL)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            k = k0 + ks
            k_ok = k < k_hi
            w = tl.load(w_rows + k[None, :] * stride_wk, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            x = tl.load(x_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            if USE_DOT:
                acc = tl.dot(x, tl.trans(w), acc)
            else:
                # (BLOCK_M, 1, BLOCK_K) * (1, BLOCK_N, BLOCK_K), summed over K: a GEMV's dot
                # products, without the tensor cores that tl.dot would pad M to 16 rows for.
                prod = x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
                acc += tl.sum(prod, axis=2)
    mask = row_ok[:, None] & col_ok[None, :]
    if SPLIT:
        part = y_ptr + pid_k.to(tl.int64) * M * N  # this split's (M, N) float32 slab
        tl.store(part + rows[:, None] * N + cols[None, :], acc.to(tl.float32), mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if RES_OUT:  # the residual add of the next norm, and its statistic, in the epilogue
            acc += tl.load(res_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if ACC == tl.float64:  # float32 y: one rounding from the float64 sum
            y = acc.to(y_ptr.dtype.element_ty)
        else:
            y = cast_out(acc, y_ptr.dtype.element_ty)
        tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y, mask=mask)
        if RES_OUT:  # of the rounded h, as the unfused norm sees it
            yf = tl.where(mask, y.to(tl.float32), 0.0)
            tl.store(ss_out_ptr + pid_n, tl.sum(tl.sum(yf * yf, axis=1), axis=0))


@triton.jit
def _split_reduce_kernel(
    part_ptr, b_ptr, y_ptr,  # part (SPLIT_K, M, N) float32, b (N,), y (M, N)
    M, N, SPLIT_K,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    pdl_start(PDL)
    # The partials are SPLIT_K * M * N * 4 bytes: 192 KiB for o_proj of the 8B model at
    # M = 1 and SPLIT_K = 3, against the weight's 32 MiB, so this pass costs ~1%.
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = idx < M * N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, SPLIT_K):
        acc += tl.load(part_ptr + s * M * N + idx, mask=ok, other=0.0)
    row = idx // N
    col = idx % N
    if HAS_BIAS:
        acc += tl.load(b_ptr + col, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_ym + col, cast_out(acc, y_ptr.dtype.element_ty), mask=ok)


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
                  fusion: str = "plain", gpu: str = "") -> SkinnyConfig:
    """A config from the shape and the SM count (a first guess, to be tuned on a GPU).

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
        return _gemv_config(N, K, fusion, gpu)
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


def _tuned_launch(N: int, K: int, fusion: str, gpu: str) -> Optional[tuple]:
    """The measured launch of this shape: the GPU model's table first, then _TUNED_GEMV."""
    launch = gpu_table_entry(_TUNED_GEMV_GPU, gpu, (N, K, fusion))
    return launch if launch is not None else _TUNED_GEMV.get((N, K, fusion))


def _gemv_config(N: int, K: int, fusion: str = "plain", gpu: str = "") -> SkinnyConfig:
    """Batch 1 (16-bit): the rule read off ``benchmarks/sweep_gemv.py`` on an H200
    (2026-11-21, benchmarks/NOTES.md), where it beat cuBLAS on all ten 1B/8B projections:

    - N <= 8192 (qkv, o, down): few output columns, so few columns per program (4-16, about
      N / 512 -> 256-512 programs) and long K chunks (1024) with 8 warps: each program
      keeps 16-32 KB of weight in flight. o_proj of 1B: 4.3 us against cuBLAS's 6.1.
    - wider (gate_up, lm_head): 16 x 256 tiles at 4 warps, already thousands of programs.
    No split-K: it never won there (its float32 partials and second launch cost more than
    the parallelism buys at these sizes). ``_TUNED_GEMV`` (and, on the GPU model named
    by ``gpu``, ``_TUNED_GEMV_GPU``) overrides the rule for the
    shapes later sweeps found >3% faster with the fusion each carries in the engine
    (one of ``GEMV_FUSIONS``): a prologue or epilogue changes the best launch (8B qkv with
    its norm: 15.2 us at 8 x 512, 4 warps; 18.6 at the plain rule's 16 x 1024, 8 warps)."""
    if fusion not in GEMV_FUSIONS:
        raise ValueError(f"fusion must be one of {GEMV_FUSIONS}, got {fusion!r}")
    early = EARLY_CHUNKS[_gemv_role(N, K, fusion)]
    launch = _tuned_launch(N, K, fusion, gpu)
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
# the lines that are read again (the KV cache, the activations) from being pushed out. H100
# (round 23, benchmarks/NOTES.md): the 1B's attention kernel 7.4 -> 6.3 us a layer, step
# 1.016 -> 0.998-1.005 ms; 8B 5.343 -> 5.325 ms.
WEIGHT_EVICT = "evict_first"


def _gemv_role(N: int, K: int, fusion: str) -> str:
    """A batch-1 GEMV's place in a decoder layer, from its fusion and shape: the RMSNorm
    prologue carries qkv (N <= 2K: 1.3-1.5 K in Llama and Qwen) or gate_up and the LM head
    (N >= 7K); the residual epilogue o, with SwiGLU's prologue down."""
    if fusion == "norm":
        return "qkv" if N <= 2 * K else "gate_up"
    return {"residual": "o", "silu_residual": "down"}.get(fusion, "plain")


def _gemv_pdl_args(x: torch.Tensor, cfg: SkinnyConfig) -> dict:
    """``pdl_args``, with EARLY = ``cfg.early`` (weight chunks before the wait) for one-row
    launches."""
    args = pdl_args(x)
    if args and cfg.early and cfg.block_m == 1 and not cfg.use_dot:
        args["EARLY"] = cfg.early
    return args


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], y: torch.Tensor,
            cfg: SkinnyConfig, silu_mul: bool = False, residual: Optional[torch.Tensor] = None,
            ss_out: Optional[torch.Tensor] = None, ss_in: Optional[torch.Tensor] = None,
            norm_weight: Optional[torch.Tensor] = None, eps: float = 0.0, norm_late: bool = False) -> None:
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
        NORM_LATE=norm_late,
        BLOCK_SS=max(16, triton.next_power_of_2(ss_in.numel())) if ss_in is not None else 16,
        SPLIT=split, USE_DOT=cfg.use_dot,
        EVEN_K=k_per_split % cfg.block_k == 0 and K % k_per_split == 0, SILU_MUL=silu_mul,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        ACC=tl.float64 if x.dtype == torch.float32 and cfg.block_m == 1 and not cfg.use_dot else tl.float32,
        W_EVICT=WEIGHT_EVICT if M == 1 and not cfg.use_dot else "",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_gemv_pdl_args(x, cfg),
    )
    if split:
        block = 1024
        _split_reduce_kernel[(triton.cdiv(M * N, block),)](
            target, b, y, M, N, split_k, y.stride(0),
            HAS_BIAS=bias is not None, BLOCK=block, num_warps=4, **pdl_args(x),
        )


@torch.library.custom_op("onetrip::skinny_matmul", mutates_args=("out",))
def _skinny_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], out: torch.Tensor,
               config: Optional[list[int]], silu_mul: bool = False) -> None:
    if not use_triton(x):
        out.copy_(skinny_matmul_ref(x, weight, bias, silu_mul))
        return
    M, K = x.shape[0], weight.shape[1]
    cfg = (SkinnyConfig.from_list(config) if config is not None
           else skinny_config(M, weight.shape[0], K, sm_count(x.device), x.dtype, gpu=gpu_name(x.device)))
    _launch(x, weight, bias, out, cfg, silu_mul)


@_skinny_op.register_fake
def _(x, weight, bias, out, config, silu_mul=False):
    return None


def _check_args(name: str, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                per_column: int) -> tuple[int, int, Optional[torch.Tensor]]:
    """Checks shared by the GEMV entry points: x (..., per_column * K) against weight (N, K)
    and bias (N,). Returns N, K and the bias with unit stride (it is small)."""
    check_tensor(name, x)
    check_tensor("weight", weight)
    k = "K" if per_column == 1 else "F"
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (N, {k}) as nn.Linear stores it, got shape {tuple(weight.shape)}")
    N, K = weight.shape
    if x.shape[-1] != per_column * K:
        need = (f"K = {K}, the second dimension of weight {tuple(weight.shape)}" if per_column == 1 else
                f"{per_column} * F = {per_column * K} for weight {tuple(weight.shape)} (gate and up side by side)")
        raise ValueError(f"{name} has shape {tuple(x.shape)}; its last dimension must be {need}")
    check_dtype_match("weight", weight, name, x)
    if bias is not None:
        check_tensor("bias", bias)
        check_shape("bias", bias, (N,), "(N,): one per output column, N = weight.shape[0]")
        check_dtype_match("bias", bias, name, x)
        bias = bias.contiguous()
    check_same_device(name, x, weight=weight, bias=bias)
    return N, K, bias


def _check_config(config: Optional[SkinnyConfig]) -> None:
    if config is not None and not isinstance(config, SkinnyConfig):
        raise TypeError(f"config must be a SkinnyConfig or None, got {type(config).__name__}")


def _into_rows(out: torch.Tensor, n: int, run) -> torch.Tensor:
    """``run(y2)`` writes the (M, n) rows of ``out``: into out itself when one row stride
    describes it, else into a scratch copied back."""
    y2, scratch = rows_out(out, n)
    run(y2)
    if scratch:
        out.copy_(y2.view(out.shape))
    return out


def skinny_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
    config: Optional[SkinnyConfig] = None,
) -> torch.Tensor:
    """y = x @ weight.T + bias for few rows: float32 accumulation, rounded once.

    Args:
        x: (..., K) float32, float16 or bfloat16; M = the product of the leading dimensions.
            Any strides (a layout no single row stride describes is copied; x is small).
        weight: (N, K) of x's dtype and device, as ``nn.Linear`` stores it. Read exactly
            once; any strides, but a unit stride along K is what runs at full bandwidth.
        bias: None, or (N,) of x's dtype.
        out: optional (..., N) tensor of x's dtype to write into; any strides.
        config: a ``SkinnyConfig`` to force (tests, tuning); default ``skinny_config``.

    Returns:
        (..., N) tensor of x's dtype (``out`` when given). For M <= 32 one Triton launch, or
        two with split-K (plus a float32 workspace of split_k * M * N, sized from the shapes
        alone); no host synchronisation, so the call can be captured in a CUDA graph. For
        M > 32 the call is ``torch.nn.functional.linear`` (cuBLAS), copied into ``out``.
    """
    N, K, bias = _check_args("x", x, weight, bias, 1)
    _check_config(config)
    out = output("out", out, x.shape[:-1] + (N,), x.dtype, x.device)
    if out.numel() == 0:
        return out
    x2 = as_rows(x, K)
    if x2.shape[0] > MAX_ROWS:
        out.copy_(F.linear(x, weight, bias))
        return out
    return _into_rows(out, N, lambda y2: call_op(_skinny_op, x2, weight, bias, y2,
                                                 config.as_list() if config is not None else None))


def silu_mul_matmul(
    gate_up: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
    config: Optional[SkinnyConfig] = None,
) -> torch.Tensor:
    """y = (silu(gate) * up) @ weight.T (+ bias): a SwiGLU MLP's down projection with the
    activation in the GEMV's prologue (one launch, no (.., F) intermediate in HBM).

    Args:
        gate_up: (..., 2F), the gate in ``[..., :F]`` and up in ``[..., F:]`` (as
            ``silu_mul`` takes it); float32, float16 or bfloat16.
        weight: (N, F) of gate_up's dtype. bias: None or (N,). out: optional (..., N).
        config: a ``SkinnyConfig`` to force (tests, tuning).

    Returns:
        (..., N) of gate_up's dtype. With one row, one Triton launch that computes the
        activation in float32 (not rounded to the dtype first, unlike the unfused pair).
        With more rows: ``silu_mul`` then ``torch.nn.functional.linear``.
    """
    N, F_, bias = _check_args("gate_up", gate_up, weight, bias, 2)
    _check_config(config)
    out = output("out", out, gate_up.shape[:-1] + (N,), gate_up.dtype, gate_up.device)
    if out.numel() == 0:
        return out
    x2 = as_rows(gate_up, 2 * F_)
    if x2.shape[0] != 1 or F_ == 0:
        out.copy_(F.linear(glu_silu_mul(gate_up), weight, bias))
        return out
    cfg = config or skinny_config(1, N, F_, sm_count(gate_up.device), gate_up.dtype, gpu=gpu_name(gate_up.device))
    return _into_rows(out, N, lambda y2: call_op(_skinny_op, x2, weight, bias, y2,
                                                 dataclasses.replace(cfg, split_k=1).as_list(), True))


def skinny_matmul_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                      silu_mul: bool = False) -> torch.Tensor:
    """What a user writes: ``torch.nn.functional.linear`` (cuBLAS on a GPU); with
    ``silu_mul``, x is [gate | up] and the input is F.silu(gate) * up first."""
    if silu_mul:
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    return F.linear(x, weight, bias)
