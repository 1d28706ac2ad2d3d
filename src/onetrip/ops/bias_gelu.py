"""Bias + GELU in one pass: y = GELU(x + bias).

The unfused version (``bias_gelu_ref``) launches two kernels and moves
read x + write t + read t + write y = 4 bytes-per-element passes over HBM
(8 per element in bf16, plus the bias); the fused kernel moves 2 (read x, write y).

The backward (``_bias_gelu_backward_kernel``) recomputes t = x + bias from the saved x
and bias and reads dy: dx = dy * GELU'(t), dbias = the column sums of dx, 3 passes
(read dy, x, write dx) plus float32 partial rows of dbias, one per band of rows (<= ~1% of
the bytes), added by ``_reduce.column_sum``. Its programs make one wave (``BackwardConfig``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._jit import cast_out, gelu, gelu_and_grad, pdl_start, row_tile
from ._common import (
    TileConfig,
    as_rows,
    call_op,
    cdiv,
    check_dtype_match,
    check_no_out,
    check_same_device,
    check_shape,
    check_tensor,
    empty_as,
    needs_grad,
    next_pow2,
    output_like,
    pdl_args,
    pdl_kwargs,
    pdl_on,
    rows_out,
    sm_count,
    tile_config,
    use_triton,
)
from ._launch import launch, meta_key
from ._reduce import column_sum

APPROXIMATIONS = ("tanh", "none")


@triton.jit
def _bias_gelu_kernel(
    x_ptr, bias_ptr, y_ptr,  # x, y: (M, N) with unit column stride; bias: (N,)
    M, N,
    stride_xm, stride_ym,
    HAS_BIAS: tl.constexpr,
    APPROX_TANH: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr = 0,  # programmatic dependent launch (_common.pdl_mode says why)
):
    pdl_start(PDL)
    rows64, cols, mask = row_tile(M, N, BLOCK_M, BLOCK_N)
    x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    y = gelu(x, APPROX_TANH)
    tl.store(y_ptr + rows64[:, None] * stride_ym + cols[None, :], cast_out(y, y_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, bias: Optional[torch.Tensor], y: torch.Tensor, approximate: str,
            config: TileConfig | None = None):
    """Launch on 2-D views: x, y (M, N) with unit column stride; bias (N,) contiguous or None.

    Returns the compiled kernel (its ``n_regs``, ``n_spills``), or None when nothing ran.
    """
    M, N = x.shape
    if M == 0 or N == 0:
        return None
    cfg = config or tile_config(M, N)
    grid = (cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n),)
    meta, key = _meta(cfg.block_m, cfg.block_n, cfg.num_warps, bias is not None, approximate == "tanh", pdl_on(x))
    return launch(_bias_gelu_kernel, grid, (x, bias if bias is not None else x, y, M, N, x.stride()[0], y.stride()[0]),
                  meta, key)


@functools.lru_cache(maxsize=1024)
def _meta(block_m: int, block_n: int, num_warps: int, has_bias: bool, tanh: bool, pdl: bool) -> tuple[dict, int]:
    """The forward's constexprs and options, and their ``meta_key``: kept, as a launch needs them at every call."""
    meta = dict(HAS_BIAS=has_bias, APPROX_TANH=tanh, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps,
                **pdl_kwargs(pdl))
    return meta, meta_key(meta)


@torch.library.custom_op("onetrip::bias_gelu", mutates_args=("out",))
def _bias_gelu_op(x: torch.Tensor, bias: Optional[torch.Tensor], out: torch.Tensor, approximate: str) -> None:
    if use_triton(x):
        _launch(x, bias, out, approximate)
    else:
        out.copy_(bias_gelu_ref(x, bias, approximate))


@_bias_gelu_op.register_fake
def _(x, bias, out, approximate):
    return None


def bias_gelu(
    x: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    approximate: str = "tanh",
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """y = GELU(x + bias), computed in float32 and rounded once.

    Args:
        x: (..., N) float32, float16 or bfloat16; any strides.
        bias: (N,) of x's dtype, or None for plain GELU.
        approximate: "tanh" (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))) or
            "none" (0.5 x (1 + erf(x / sqrt(2)))), as in ``torch.nn.functional.gelu``.
        out: optional (..., N) tensor of x's dtype to write into.

    Returns:
        (..., N) tensor of x's dtype. One kernel launch; no host synchronisation, so the
        call can be captured in a CUDA graph.

    Differentiable with respect to x and bias: dx = dy * GELU'(x + bias) in float32,
    rounded once; dbias = sum of dx over all rows, in float32 in a fixed order (the same
    bits run to run), rounded once. x and bias are saved, not y. ``out`` must then be None.
    """
    check_tensor("x", x)
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate must be one of {APPROXIMATIONS}, got {approximate!r}")
    N = x.shape[-1]
    if bias is not None:
        check_tensor("bias", bias)
        check_shape("bias", bias, (N,), "the last dimension of x")
        check_dtype_match("bias", bias, "x", x)
        check_same_device("x", x, bias=bias)
        bias = bias.contiguous()
    if needs_grad(x, bias):
        check_no_out("out", out)
        return _BiasGeluFunction.apply(x, bias, approximate)
    out = output_like("out", out, x)
    y2, scratch = rows_out(out, N)
    call_op(_bias_gelu_op, as_rows(x, N), bias, y2, approximate)
    if scratch:
        out.copy_(y2.view(out.shape))
    return out


@triton.jit
def _gelu_grad(t, APPROX_TANH: tl.constexpr):
    """GELU'(t) of float32 ``t`` in few instructions (the backward issues ~24 an element
    against 6 bytes of HBM traffic, so they count).

    tanh: with z = 2 sqrt(2/pi) (t + 0.044715 t^3), e = exp(-z) and s = sigmoid(z) = 1 / (1 + e),
    GELU' = s + t s (1 - s) z', z' = 2 sqrt(2/pi) (1 + 3 * 0.044715 t^2), 1 - s = e s to full
    relative accuracy. t is clamped at -7.5 (NaN kept), where |GELU'| < 1e-16, so that e (exp2
    of t (K1 + K2 t^2), the constants times -log2 e) stays below 2**61 and e s is never
    inf * 0; s is rsqrt(1 + e)^2, two instructions where a division takes six (its range
    check). Both approximations are within ~2**-22 relative. The backward's loop on sm_90a:
    24 SASS instructions an element, 27 with the division, 34 in the band layout with
    ``_jit.gelu_and_grad``. erf: ``gelu_and_grad``'s.
    """
    if APPROX_TANH:
        t = tl.maximum(t, -7.5, propagate_nan=tl.PropagateNan.ALL)
        t2 = t * t
        e = tl.exp2(t * (-2.302208198144325 - 0.1029432395800235 * t2))
        r = tl.rsqrt(1.0 + e)
        s = r * r
        return s + t * s * (e * s) * (1.5957691216057308 + 0.21406444881780073 * t2)
    else:
        _, g = gelu_and_grad(t, False)
        return g


@triton.jit
def _bias_gelu_backward_kernel(
    dy_ptr, x_ptr, bias_ptr, dx_ptr, part_ptr,  # dy, x, dx: (M, N), unit column stride; bias: (N,); part: (P, N) f32
    M, N,
    band,  # rows a program owns: a multiple of BLOCK_M
    stride_dym, stride_xm, stride_dxm,
    HAS_BIAS: tl.constexpr,
    HAS_DBIAS: tl.constexpr,  # write the band's column sums of dx to part[band index]
    APPROX_TANH: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr = False,  # issue the next tile's loads before this tile's arithmetic
    STAGES: tl.constexpr = 1,  # > 1: Triton pipelines the loop's loads through shared memory
    PDL: tl.constexpr = 0,  # programmatic dependent launch (_common.pdl_mode says why)
):
    pdl_start(PDL)
    # One grid axis, column blocks fastest (as the forward's, _jit.row_tile says why): program
    # pid owns columns [c * BLOCK_N, +BLOCK_N) of rows [b * band, +band) and walks them BLOCK_M
    # rows at a time, summing dx in float32 in a fixed order.
    pid = tl.program_id(0)
    n_col_blocks = tl.cdiv(N, BLOCK_N)
    b = pid // n_col_blocks
    cols = (pid % n_col_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    first = b.to(tl.int64) * band
    end = tl.minimum(first + band, M)
    rows = first + tl.arange(0, BLOCK_M)  # int64: rows * stride can pass 2**31
    dy_ptrs = dy_ptr + rows[:, None] * stride_dym + cols[None, :]
    x_ptrs = x_ptr + rows[:, None] * stride_xm + cols[None, :]
    dx_ptrs = dx_ptr + rows[:, None] * stride_dxm + cols[None, :]
    mask = (rows < end)[:, None] & col_ok[None, :]
    if PREFETCH:
        dy_next = tl.load(dy_ptrs, mask=mask, other=0.0)
        x_next = tl.load(x_ptrs, mask=mask, other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # summed over rows once, after the loop
    for _ in tl.range(0, band, BLOCK_M, num_stages=STAGES):
        next_mask = (rows + BLOCK_M < end)[:, None] & col_ok[None, :]
        if PREFETCH:  # this tile's loads went out a step ago: send the next tile's now
            dy_raw, x_raw = dy_next, x_next
            dy_next = tl.load(dy_ptrs + BLOCK_M * stride_dym, mask=next_mask, other=0.0)
            x_next = tl.load(x_ptrs + BLOCK_M * stride_xm, mask=next_mask, other=0.0)
        else:
            dy_raw = tl.load(dy_ptrs, mask=mask, other=0.0)
            x_raw = tl.load(x_ptrs, mask=mask, other=0.0)
        t = x_raw.to(tl.float32)
        if HAS_BIAS:
            t += bias[None, :]
        dx = dy_raw.to(tl.float32) * _gelu_grad(t, APPROX_TANH)  # 0 where masked: dy is
        tl.store(dx_ptrs, cast_out(dx, dx_ptr.dtype.element_ty), mask=mask)
        if HAS_DBIAS:
            acc += dx
        rows += BLOCK_M
        mask = next_mask
        dy_ptrs += BLOCK_M * stride_dym
        x_ptrs += BLOCK_M * stride_xm
        dx_ptrs += BLOCK_M * stride_dxm
    if HAS_DBIAS:
        tl.store(part_ptr + b.to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=col_ok)


# A program's column slice when dbias is wanted: at least a 128-byte line of a bf16 row, at
# most the forward's widest tile row.
MIN_BLOCK_N, MAX_BLOCK_N = 64, 1024


@dataclass(frozen=True)
class BackwardConfig:
    """How the backward lays out its programs when dbias is wanted (without dbias each
    program owns one tile of the forward's grid).

    One wave: ``programs_per_sm`` x SMs programs of ``num_warps`` warps, registers capped
    (``maxnreg``) so that all are resident from the start and finish together; a second,
    partial wave of band-long programs would run at a fraction of the bandwidth. A program
    owns a column slice (MIN_BLOCK_N to MAX_BLOCK_N wide) of a band of rows, walks it a
    (BLOCK_M, BLOCK_N) tile of ``tile`` 16-bit elements (float32: half as many) at a time
    and sums its dx in registers. Its loads stay in flight while it computes: ``prefetch``
    (the next tile in registers) or ``stages`` > 1 (Triton's pipeliner, through shared
    memory); with neither only other warps hide the latency. One float32 partial row of
    dbias a band; ``column_sum`` reads them 32 at a time, serially, so the slice is the
    widest with which ``max_partials`` bands fill the wave (narrower rows take more bands),
    and bands hold at least ``min_band`` rows (the partials then <= ~1% of the bytes at 128
    rows of bf16).
    """

    tile: int = 1024
    num_warps: int = 4
    programs_per_sm: int = 8
    prefetch: bool = True
    stages: int = 1
    max_partials: int = 64
    min_band: int = 128

    def __post_init__(self):
        if self.tile < MIN_BLOCK_N or self.tile & (self.tile - 1):
            raise ValueError(f"BackwardConfig.tile={self.tile} must be a power of two >= {MIN_BLOCK_N}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"BackwardConfig.num_warps={self.num_warps} must be 1, 2, 4, 8 or 16")
        if self.prefetch and self.stages > 1:
            raise ValueError(f"BackwardConfig: prefetch and stages={self.stages} both keep loads in flight; "
                             f"take one (stages=1 with prefetch)")
        for name in ("programs_per_sm", "stages", "max_partials", "min_band"):
            if getattr(self, name) < 1:
                raise ValueError(f"BackwardConfig.{name}={getattr(self, name)} must be >= 1")

    @property
    def maxnreg(self) -> int:
        """Registers a thread may hold so that programs_per_sm programs fit an SM's 64K (a
        multiple of 8, at most 255)."""
        return min(255, 65536 // (self.programs_per_sm * self.num_warps * 32) // 8 * 8)


# Named picks; BACKWARD_PICK is the one launched. Registers of the bench's bf16 widths, 1K to 256K
# (``tools/tune_bias_gelu_backward.py --offline``: Triton 3.9, sm_90a), none spilled.
BACKWARD_PICKS = {
    # 8 four-warp programs an SM, 8 elements a thread a step, the next tile in registers: 63-64 of 64
    "wave8x4": BackwardConfig(),
    # 4 eight-warp programs an SM, the same 8 elements a thread: 64 of 64
    "wave4x8": BackwardConfig(tile=2048, num_warps=8, programs_per_sm=4),
    # 8 four-warp programs an SM, 16 elements a thread, 3 stages in 16 KiB of shared memory: 64 of 64
    "wave8x4_stages3": BackwardConfig(tile=2048, prefetch=False, stages=3),
    # 16 two-warp programs an SM, 8 elements a thread: H200 84.8-93.8% of copy at 1K-256K
    # (geomean 90.0 against wave8x4's 86.8; 1K alone prefers wave8x4, 88.1 against 84.8)
    "wave16x2": BackwardConfig(tile=512, num_warps=2, programs_per_sm=16),
}
BACKWARD_PICK = "wave16x2"


@dataclass(frozen=True)
class BackwardPlan:
    """One launch: (block_m, block_n) tiles, bands of ``band`` rows, ``bands`` x
    ``col_blocks`` programs, ``bands`` partial rows of dbias."""

    block_m: int
    block_n: int
    band: int
    bands: int
    col_blocks: int


@functools.lru_cache(maxsize=4096)  # a launch asks at every call
def backward_plan(M: int, N: int, config: BackwardConfig, sms: int, itemsize: int = 2) -> BackwardPlan:
    """``config``'s one-wave layout of an (M, N) problem on ``sms`` SMs (BackwardConfig says
    why): as many bands as fill programs_per_sm x SMs programs, each of at least min_band
    rows, in the widest power-of-two column slice with which max_partials bands fill them
    (rows under ~1K wide at 8 programs an SM take more bands). At the default on 132 SMs:
    65536 x 1024 in 64-column slices of 1008-row bands (16 x 66 programs); 4096 x 16384 in
    256-column slices of 256-row bands (64 x 16); 256 x 262144 in 256-column slices of whole
    columns (1024 x 1). ``tile`` counts 16-bit elements: 4-byte ones take the same bytes a
    step (at 8 float32 a thread, 64 registers spilled 64 bytes)."""
    target = config.programs_per_sm * sms
    max_bands = max(1, M // config.min_band)
    ideal = N * min(config.max_partials, max_bands) // target  # the slice width that makes ``target`` programs
    block_n = min(max(MIN_BLOCK_N, min(MAX_BLOCK_N, 1 << max(0, ideal.bit_length() - 1))), next_pow2(N))
    block_m = max(1, min(config.tile * 2 // itemsize // block_n, next_pow2(M)))
    col_blocks, row_tiles = cdiv(N, block_n), cdiv(M, block_m)
    bands = max(1, min(max_bands, target // col_blocks, row_tiles))
    band = block_m * cdiv(row_tiles, bands)
    return BackwardPlan(block_m, block_n, band, cdiv(M, band), col_blocks)


def _launch_backward(dy: torch.Tensor, x: torch.Tensor, bias: Optional[torch.Tensor], dx: torch.Tensor,
                     dbias: Optional[torch.Tensor], approximate: str, config: BackwardConfig | None = None):
    """Launch on 2-D views: dy, x, dx (M, N) with unit column stride; bias, dbias (N,)
    contiguous or None. With dbias, ``config`` (default ``BACKWARD_PICKS[BACKWARD_PICK]``)
    lays out one wave of programs and ``column_sum`` adds their partial rows; without, each
    program owns one tile of the forward's grid. Returns the row kernel (its ``n_regs``,
    ``n_spills``), or None when nothing ran."""
    M, N = x.shape
    if N == 0:
        return None
    if M == 0:
        if dbias is not None:
            dbias.zero_()
        return None
    if dbias is None:
        tile = tile_config(M, N)
        plan = BackwardPlan(tile.block_m, tile.block_n, tile.block_m, cdiv(M, tile.block_m), cdiv(N, tile.block_n))
        options = dict(num_warps=tile.num_warps)
    else:
        cfg = config or BACKWARD_PICKS[BACKWARD_PICK]
        plan = backward_plan(M, N, cfg, sm_count(x.device), x.element_size())
        options = dict(PREFETCH=cfg.prefetch, STAGES=cfg.stages, num_warps=cfg.num_warps, maxnreg=cfg.maxnreg)
    partials = None if dbias is None else torch.empty((plan.bands, N), dtype=torch.float32, device=x.device)
    args = (dy, x, bias if bias is not None else x, dx, partials if partials is not None else dx, M, N, plan.band,
            dy.stride()[0], x.stride()[0], dx.stride()[0])
    kernel = launch(_bias_gelu_backward_kernel, (plan.bands * plan.col_blocks,), args,
                    dict(HAS_BIAS=bias is not None, HAS_DBIAS=dbias is not None, APPROX_TANH=approximate == "tanh",
                         BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, **options, **pdl_args(x)))
    if dbias is not None:
        column_sum(partials, dbias.dtype, out=dbias)
    return kernel


@torch.library.custom_op("onetrip::bias_gelu_backward", mutates_args=("dx", "dbias"))
def _bias_gelu_backward_op(dy: torch.Tensor, x: torch.Tensor, bias: Optional[torch.Tensor], dx: torch.Tensor,
                           dbias: Optional[torch.Tensor], approximate: str) -> None:
    if use_triton(x):
        _launch_backward(dy, x, bias, dx, dbias, approximate)
    else:  # unfused, in float32
        t = x.float() if bias is None else x.float() + bias.float()
        g = torch.ops.aten.gelu_backward(dy.float(), t, approximate=approximate)
        dx.copy_(g)
        if dbias is not None:
            dbias.copy_(g.sum(0))


@_bias_gelu_backward_op.register_fake
def _(dy, x, bias, dx, dbias, approximate):
    return None


class _BiasGeluFunction(torch.autograd.Function):
    """bias_gelu under autograd: the forward op, then the backward op on the saved x and bias."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, bias: Optional[torch.Tensor], approximate: str) -> torch.Tensor:
        N = x.shape[-1]
        y = empty_as(x)
        call_op(_bias_gelu_op, as_rows(x, N), bias, as_rows(y, N), approximate)
        ctx.save_for_backward(x, bias)
        ctx.approximate = approximate
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, bias = ctx.saved_tensors
        N = x.shape[-1]
        dx = empty_as(x)
        dbias = torch.empty_like(bias) if ctx.needs_input_grad[1] else None
        call_op(_bias_gelu_backward_op, as_rows(dy, N), as_rows(x, N), bias, as_rows(dx, N), dbias, ctx.approximate)
        return dx if ctx.needs_input_grad[0] else None, dbias, None


def bias_gelu_ref(x: torch.Tensor, bias: Optional[torch.Tensor] = None, approximate: str = "tanh") -> torch.Tensor:
    """Unfused: two kernels, the sum rounded to x's dtype in between (as eager PyTorch does)."""
    if bias is not None:
        x = x + bias
    return F.gelu(x, approximate=approximate)
