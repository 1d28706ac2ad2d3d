"""Backward of the residual-add + RMSNorm / LayerNorm ops (``norm.py``).

    h = x + residual (or x), d = h - mean(h) (RMSNorm: d = h), D = mean(d^2) + eps
    rstd = 1 / sqrt(D), hn = d * rstd, g = dy * w        (Gemma: dy * (1 + w); no weight: dy)
    dh = rstd * (g - mean(g) - d * mean(g * d) / D) + dh_out   (RMSNorm: no mean(g) term)
    dx = dresidual = dh,   dw = sum over rows of dy * hn,   db = sum over rows of dy

Statistics are recomputed in float32 from the saved h: the row is read anyway, so saving
mean and rstd would add the forward's writes (8 bytes a row) and save no backward bytes.
Bytes for M rows of N elements of b bytes: dy, h (and dh_out) read once, dx written once,
the weight once a program, plus a (P, N) float32 partial of dw (and db), P the programs,
that ``_reduce.column_sum`` adds in a fixed order (no atomics: the same bits run to run).

How rows are covered (``NormBackwardConfig``):
  * whole rows (padded width up to ``ROW_MAX``): one wave of persistent programs, each a band
    of consecutive rows, ``rows`` whole rows a step in registers. The next step's dy, h (and
    dh_out) are loaded before this step's reductions; the dw / db partials accumulate in
    float32 registers across the band and are stored once.
  * wide rows: a statistics launch (a program a row, chunks combined with Chan's formula)
    writes (mean, rstd, mean(g * d) / D, mean(g)) a row, then a grid of (band, column segment)
    programs applies them: dy and h are read twice.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import cdiv, is_interpreting, next_pow2, pdl_kwargs, pdl_on, sm_count
from ._jit import cast_out, pdl_start
from ._launch import launch, meta_key
from ._reduce import column_sum

# Whole rows held up to this padded width of 2-byte elements (4-byte ones: half of it). At 16384 a
# row's float32 dw and db partials alone take 32K of an SM's 64K registers: segments.
ROW_MAX = 8192
# column_sum walks its partial rows 32 a step, in sequence (a program per 256 columns), so
# past _ONE_PASS rows it runs twice: first over the (P / split, split * N) view of the partials
# (split x the programs), then over the (split, N) sums; split: the power of two at or under
# sqrt(P), at most 32 (one step).
_ONE_PASS = 64
_SPLIT = 32
_INTERPRETED = tl.constexpr(is_interpreting())  # _row_sums says why


@dataclass(frozen=True)
class NormBackwardConfig:
    """How the backward's programs cover the (M, N) rows.

    The step: ``rows`` rows at a time, each the whole row padded to a power of two
    (``segment`` 0) or a ``segment``-column slice of it (wide rows, after a statistics
    launch), in a program of ``num_warps`` warps.
    The grid: one wave of ``programs_per_sm`` x SMs programs (fewer with fewer steps), each a
    band of consecutive rows, registers capped (``maxnreg``) so that all are resident at once;
    a second, partial wave of band-long programs would run at a fraction of the bandwidth.
    Latency: ``prefetch`` loads the next step's dy, h (and dh_out) into registers before this
    step's reductions; ``stages`` > 1 lets Triton's pipeliner keep them in flight through
    shared memory instead; with neither only other warps hide it.
    """

    rows: int = 1
    num_warps: int = 4
    programs_per_sm: int = 4
    prefetch: bool = True
    stages: int = 1
    segment: int = 0

    def __post_init__(self):
        for name in ("rows", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"NormBackwardConfig.{name}={v} must be a power of two >= 1")
        if self.num_warps > 32:
            raise ValueError(f"NormBackwardConfig.num_warps={self.num_warps} must be <= 32 (1024 threads)")
        if self.segment and (self.segment < 16 or self.segment & (self.segment - 1)):
            raise ValueError(f"NormBackwardConfig.segment={self.segment} must be 0 (whole rows) or a power of two "
                             f">= 16")
        for name in ("programs_per_sm", "stages"):
            if getattr(self, name) < 1:
                raise ValueError(f"NormBackwardConfig.{name}={getattr(self, name)} must be >= 1")
        if self.prefetch and self.stages > 1:
            raise ValueError(f"NormBackwardConfig: prefetch and stages={self.stages} both keep loads in flight; "
                             f"take one (stages=1 with prefetch)")

    @property
    def wide(self) -> bool:
        return self.segment > 0

    @property
    def maxnreg(self) -> int:
        """Registers a thread may hold so that programs_per_sm programs fit an SM's 64K (a
        multiple of 8, at most 255)."""
        return min(255, 65536 // (self.programs_per_sm * self.num_warps * 32) // 8 * 8)


def whole_rows(width: int, per_thread: int = 16, warps_per_sm: int = 16, prefetch: bool = True,
               stages: int = 1) -> NormBackwardConfig:
    """The whole-row config of ``width`` (padded to a power of two) with ``per_thread``
    elements of each row tensor a thread a step and ``warps_per_sm`` warps an SM: a step of
    max(padded width, 64 x per_thread) elements (narrow rows share a step), at most 32 warps.
    Registers a thread (sm_90a): ~8 an element plus ~42 for add_layer_norm (168 at 16 a thread,
    105 at 8), fewer for the others (rms_norm 111 at 16); 16 warps an SM leave each 128."""
    block_n = next_pow2(max(width, 1))
    step = max(block_n, 64 * per_thread)
    num_warps = min(32, step // (32 * per_thread))
    return NormBackwardConfig(rows=step // block_n, num_warps=num_warps,
                              programs_per_sm=max(1, warps_per_sm // num_warps), prefetch=prefetch, stages=stages)


# Picks by padded width of 2-byte elements (``backward_config``), as tools/tune_norm_backward.py
# prints them; widths under the smallest take ``whole_rows``. H200, bf16, backward alone, % of
# copy (rms_norm, add_rms_norm, layer_norm, add_layer_norm): the 3-stage pipeliner beats the
# register prefetch at 1K, 2K and 8K (add_layer_norm 1K 86.1 -> 85.2 .. 8K 86.4 -> 87.2).
BACKWARD_PICKS = {
    1024: NormBackwardConfig(rows=1, num_warps=2, programs_per_sm=8, prefetch=False, stages=3),  # 87.3 90.6 81.8 85.2
    2048: NormBackwardConfig(rows=1, num_warps=4, programs_per_sm=4, prefetch=False, stages=3),  # 86.9 90.7 81.2 85.1
    4096: NormBackwardConfig(rows=1, num_warps=8, programs_per_sm=2),  # 85.8 91.1 79.6 86.2
    8192: NormBackwardConfig(rows=1, num_warps=16, programs_per_sm=1, prefetch=False, stages=3),  # 87.5 91.5 78.4 87.2
}
# Past ROW_MAX: 2048-column segments at 8 warps, 64-103 registers (two programs an SM); H200
# 16K / 64K: 50.6 / 50.6, 60.4 / 61.0, 42.7 / 42.7, 51.6 / 41.5% of copy (each row read twice)
WIDE_PICK = NormBackwardConfig(rows=1, num_warps=8, programs_per_sm=2, prefetch=False, segment=2048)


def backward_config(M: int, N: int, device: torch.device, itemsize: int = 2) -> NormBackwardConfig:
    """The launch shape for M rows of N elements of ``itemsize`` bytes: the pick of the padded
    width in 2-byte elements (4-byte rows take the pick of twice their width, the same bytes a
    step), ``whole_rows`` under the table, ``WIDE_PICK`` past ``ROW_MAX``. Memoized on (N,
    itemsize), as a launch asks at every call: after editing the table at run time,
    ``_backward_config.cache_clear()``."""
    return _backward_config(N, itemsize)


@functools.lru_cache(maxsize=4096)
def _backward_config(N: int, itemsize: int) -> NormBackwardConfig:
    key = next_pow2(max(N, 1)) * max(1, itemsize // 2)
    if key > ROW_MAX:
        return WIDE_PICK
    return BACKWARD_PICKS.get(key) or whole_rows(N, per_thread=max(1, 32 // max(itemsize, 2)))


@dataclass(frozen=True)
class BackwardPlan:
    """One row-kernel launch: ``bands`` x ``segs`` programs of ``block_n`` columns, each
    ``band_rows`` rows (bands past M: none, zero partials); ``bands`` partial rows, added in
    ``split`` groups first where ``split`` > 1 (``_sum_partials``)."""

    block_n: int
    segs: int
    band_rows: int
    bands: int
    split: int = 1


def backward_plan(M: int, N: int, config: NormBackwardConfig, sms: int, grads: bool = True) -> BackwardPlan:
    """``config``'s layout of (M, N) on ``sms`` SMs: programs_per_sm x sms programs (fewer
    with fewer steps) over the column segments, each band a whole number of steps; with
    ``grads`` (a dw or db partial) and more than ``_ONE_PASS`` bands, a multiple of ``split``
    bands. At the picks on 132 SMs, bf16: 65536 x 1024 in 1041 bands of 63 rows (1056
    partial rows, split 32); 8192 x 8192 in 131 bands of 63 (136, split 8)."""
    block_n = config.segment if config.wide else next_pow2(max(N, 1))
    segs = cdiv(N, block_n)
    steps = cdiv(M, config.rows)
    bands = max(1, min(steps, cdiv(sms * config.programs_per_sm, segs)))
    band_rows = cdiv(steps, bands) * config.rows  # whole steps a band
    bands = cdiv(M, band_rows)
    split = 1
    if grads and bands > _ONE_PASS:
        split = min(_SPLIT, 1 << (math.isqrt(bands).bit_length() - 1))
        bands = cdiv(bands, split) * split
    return BackwardPlan(block_n, segs, band_rows, bands, split)


@functools.lru_cache(maxsize=4096)  # a launch asks at every call
def _launch_plan(M: int, N: int, config: NormBackwardConfig, sms: int, one_pass: int, is_rms: bool, gemma: bool,
                 has_weight: bool, has_dh_out: bool, store_dx: bool, has_dw: bool, has_db: bool,
                 pdl: bool) -> tuple:
    """(``backward_plan``, the statistics launch's (meta, meta_key) or None, the row launch's
    (meta, meta_key)) of one call; ``one_pass`` is ``_ONE_PASS`` (read by ``backward_plan``),
    in the key so that a changed value is not served an old plan."""
    plan = backward_plan(M, N, config, sms, has_dw or has_db)
    flags = dict(IS_RMS=is_rms, GEMMA=gemma, HAS_WEIGHT=has_weight)
    stats = None
    if config.wide:
        meta = dict(flags, BLOCK_N=plan.block_n, num_warps=config.num_warps, **pdl_kwargs(pdl))
        stats = meta, meta_key(meta)
    meta = dict(flags, HAS_DH_OUT=has_dh_out, STORE_DX=store_dx, HAS_DW=has_dw, HAS_DB=has_db, WIDE=config.wide,
                EVEN=N % plan.block_n == 0, BLOCK_M=config.rows, BLOCK_N=plan.block_n, PREFETCH=config.prefetch,
                STAGES=config.stages, num_warps=config.num_warps, maxnreg=config.maxnreg, **pdl_kwargs(pdl))
    return plan, stats, (meta, meta_key(meta))


@triton.jit
def _stats_kernel(
    dy_ptr, h_ptr, w_ptr,            # dy, h: (M, N) rows; w: (N,)
    stats_ptr,                       # (M, 4) float32: mean, rstd, mean(g * (h - mean)) / var, mean(g)
    N, stride_dym, stride_hm,
    eps,
    IS_RMS: tl.constexpr, GEMMA: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr = 0,           # programmatic dependent launch (_common.pdl_mode says why)
):
    """Wide rows: one program a row walks its chunks. RMSNorm sums h^2 and g * h; LayerNorm
    combines each chunk's mean, M2, sum(g) and co-moment sum(g * (h - mean)) with Chan's
    formula (no cancellation for rows far from zero)."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    n_a = 0.0
    mean = 0.0
    m2 = 0.0  # RMSNorm: sum h^2
    gsum = 0.0
    cgh = 0.0  # LayerNorm: sum g * (h - mean); RMSNorm: sum g * h
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        ok = cols < N
        dy = tl.load(dy_ptr + row * stride_dym + cols, mask=ok, other=0.0).to(tl.float32)
        h = tl.load(h_ptr + row * stride_hm + cols, mask=ok, other=0.0).to(tl.float32)
        g = dy
        if HAS_WEIGHT:
            w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
            if GEMMA:
                w += 1.0
            g = dy * w
        if IS_RMS:
            m2 += tl.sum(h * h)
            cgh += tl.sum(g * h)
        else:
            n_b = tl.minimum(N - start, BLOCK_N).to(tl.float32)
            mean_b = tl.sum(h) / n_b
            d = tl.where(ok, h - mean_b, 0.0)
            g_b = tl.sum(g)
            n = n_a + n_b
            delta = mean_b - mean
            new_mean = mean + delta * (n_b / n)
            m2 += tl.sum(d * d) + delta * delta * (n_a * n_b / n)
            cgh += tl.sum(g * d) + gsum * (mean - new_mean) + g_b * (mean_b - new_mean)
            gsum += g_b
            mean = new_mean
            n_a = n
    var = tl.div_rn(m2, N * 1.0) + eps  # correctly rounded: x / 1 stays x (width-1 rows)
    st = stats_ptr + row * 4
    tl.store(st, mean)
    tl.store(st + 1, tl.rsqrt(var))
    tl.store(st + 2, tl.div_rn(tl.div_rn(cgh, N * 1.0), var))  # mean(g * d) / D (_backward_kernel)
    tl.store(st + 3, tl.div_rn(gsum, N * 1.0))



@triton.jit
def _add2(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def _row_sums(a, b):
    """Row sums of two (BLOCK_M, BLOCK_N) tensors, (BLOCK_M, 1) each, in one reduction: one
    exchange between warps through shared memory, not two. Under the interpreter two
    ``tl.sum``: its tuple reduction runs element by element (20x slower) and in sequence
    (float32 sums of 1K offset values ~25x further off than NumPy's pairwise ones)."""
    if _INTERPRETED:
        s_a = tl.sum(a, axis=1)
        s_b = tl.sum(b, axis=1)
    else:
        s_a, s_b = tl.reduce((a, b), 1, _add2)
    return s_a[:, None], s_b[:, None]


@triton.jit
def _backward_kernel(
    dy_ptr, h_ptr, dho_ptr, w_ptr,   # dy, h, dh_out: (M, N) rows; w: (N,)
    dx_ptr,                          # (M, N) rows
    pw_ptr, pb_ptr,                  # dw, db partials: (programs // n_segs, N) float32
    stats_ptr,                       # wide rows: (M, 4) float32 from _stats_kernel
    M, N, band_rows, n_segs,
    stride_dym, stride_hm, stride_dhom, stride_dxm,
    eps,
    IS_RMS: tl.constexpr, GEMMA: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_DH_OUT: tl.constexpr,
    STORE_DX: tl.constexpr, HAS_DW: tl.constexpr, HAS_DB: tl.constexpr,
    WIDE: tl.constexpr,              # statistics read from stats_ptr; else computed from the whole row held
    EVEN: tl.constexpr,              # N a multiple of BLOCK_N: no column masks (no selects an element)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr = False,  # the next step's loads issued before this step's reductions
    STAGES: tl.constexpr = 1,        # > 1: Triton pipelines the loop's loads through shared memory
    PDL: tl.constexpr = 0,           # programmatic dependent launch (_common.pdl_mode says why)
):
    """Program (band, segment): rows [band * band_rows, +band_rows) x the segment's columns,
    BLOCK_M rows a step (a band past M: no rows, zero partials). dx stored rounded once
    (dh_out added in float32); the dw / db partials kept in float32 registers across the
    band and stored once."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    band = pid // n_segs
    cols = (pid % n_segs) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    col_ok = cols < N
    if EVEN:
        col_ok = tl.full((BLOCK_N,), 1, tl.int1)
    w = 1.0
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if GEMMA:
            w += 1.0
    acc_w = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    inv_n = 1.0 / N
    first = band.to(tl.int64) * band_rows
    end = tl.minimum(first + band_rows, M)
    rows = first + tl.arange(0, BLOCK_M)  # (BLOCK_M,) int64: rows * stride exceeds 2**31 past 4 GiB
    dy_ptrs = dy_ptr + rows[:, None] * stride_dym + cols[None, :]
    h_ptrs = h_ptr + rows[:, None] * stride_hm + cols[None, :]
    dho_ptrs = dho_ptr + rows[:, None] * stride_dhom + cols[None, :]
    dx_ptrs = dx_ptr + rows[:, None] * stride_dxm + cols[None, :]
    mask = (rows < end)[:, None] & col_ok[None, :]
    LOAD_DHO: tl.constexpr = HAS_DH_OUT and STORE_DX
    if PREFETCH:
        dy_next = tl.load(dy_ptrs, mask=mask, other=0.0)
        h_next = tl.load(h_ptrs, mask=mask, other=0.0)
        if LOAD_DHO:
            dho_next = tl.load(dho_ptrs, mask=mask, other=0.0)
    for _ in tl.range(first, end, BLOCK_M, num_stages=STAGES):
        row_ok = rows < end
        next_mask = (rows + BLOCK_M < end)[:, None] & col_ok[None, :]
        if PREFETCH:  # this step's loads went out a step ago: send the next step's now
            dy_raw, h_raw = dy_next, h_next
            dy_next = tl.load(dy_ptrs + BLOCK_M * stride_dym, mask=next_mask, other=0.0)
            h_next = tl.load(h_ptrs + BLOCK_M * stride_hm, mask=next_mask, other=0.0)
            if LOAD_DHO:
                dho_raw = dho_next
                dho_next = tl.load(dho_ptrs + BLOCK_M * stride_dhom, mask=next_mask, other=0.0)
        else:
            dy_raw = tl.load(dy_ptrs, mask=mask, other=0.0)
            h_raw = tl.load(h_ptrs, mask=mask, other=0.0)
            if LOAD_DHO:
                dho_raw = tl.load(dho_ptrs, mask=mask, other=0.0)
        dy = dy_raw.to(tl.float32)
        h = h_raw.to(tl.float32)
        g = dy
        if HAS_WEIGHT:
            g = dy * w
            if not IS_RMS and (dy_ptr.dtype.element_ty == tl.float32 or w_ptr.dtype.element_ty == tl.float32):
                # the select keeps g rounded where g - mean(g) uses it: fused into dy * w - mean(g) it
                # differs by the product's rounding (width-1 LayerNorm's dx ~5e-5 off its exact dh_out);
                # a product of 16-bit dy and w is exact in float32
                g = tl.where(mask, g, 0.0)
        # dh = rstd * (g - mean(g) - d * mean(g * d) / D), d = h - mean, D = mean(d^2) + eps: hn * mean(g * hn)
        # with 1 / D for rstd^2, fewer roundings before g and d * (...) cancel (width 1, h in 1e-3..3e-2:
        # mean relative error 5.8e-6, against 9.9e-6 with rstd^2 and PyTorch's 1.1e-5)
        if WIDE:
            st = stats_ptr + rows * 4
            rstd = tl.load(st + 1, mask=row_ok, other=0.0)[:, None]
            c1 = tl.load(st + 2, mask=row_ok, other=0.0)[:, None]
            d = h
            c2 = 0.0
            if not IS_RMS:
                d = tl.where(mask, h - tl.load(st, mask=row_ok, other=0.0)[:, None], 0.0)
                c2 = tl.load(st + 3, mask=row_ok, other=0.0)[:, None]
        else:
            # means as sums times 1 / N, not four IEEE divisions a row (a slow-path check each); at
            # width 1 the products by 1.0 keep g - mean(g) exactly 0 (LayerNorm's dx there is dh_out)
            d = h
            c2 = 0.0
            if not IS_RMS:
                s_h, s_g = _row_sums(h, g)
                d = h - s_h * inv_n
                if not EVEN:
                    d = tl.where(mask, d, 0.0)
                c2 = s_g * inv_n
            s_dd, s_gd = _row_sums(d * d, g * d)
            var = s_dd * inv_n + eps  # (BLOCK_M, 1)
            rstd = tl.where(row_ok[:, None], tl.rsqrt(var), 0.0)  # rows past the band: hn 0, not 0 * inf at eps = 0
            c1 = s_gd * inv_n / var
        dh = (g - c2 - d * c1) * rstd
        hn = d * rstd  # 0 in masked columns (d is)
        if STORE_DX:
            if LOAD_DHO:
                dh += dho_raw.to(tl.float32)
            tl.store(dx_ptrs, cast_out(dh, dx_ptr.dtype.element_ty), mask=mask)
        if HAS_DW:
            acc_w += dy * hn
        if HAS_DB:
            acc_b += dy
        rows += BLOCK_M
        mask = next_mask
        dy_ptrs += BLOCK_M * stride_dym
        h_ptrs += BLOCK_M * stride_hm
        dho_ptrs += BLOCK_M * stride_dhom
        dx_ptrs += BLOCK_M * stride_dxm
    part = band.to(tl.int64) * N + cols
    if HAS_DW:
        tl.store(pw_ptr + part, tl.sum(acc_w, axis=0), mask=col_ok)
    if HAS_DB:
        tl.store(pb_ptr + part, tl.sum(acc_b, axis=0), mask=col_ok)


def _sum_partials(part: torch.Tensor, split: int, out: torch.Tensor) -> None:
    """out = the column sums of the (P, N) float32 partials in a fixed order: one
    ``column_sum``, or (split > 1, P a multiple of it) the sums of each of ``split`` groups of
    rows, then theirs."""
    P, N = part.shape
    if split > 1:
        part = column_sum(part.view(P // split, split * N), torch.float32).view(split, N)
    column_sum(part, out.dtype, out=out)


def launch_backward(dy: torch.Tensor, h: torch.Tensor, dh_out: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                    dx: Optional[torch.Tensor], dweight: Optional[torch.Tensor], dbias: Optional[torch.Tensor],
                    eps: float, is_rms: bool, gemma: bool, config: NormBackwardConfig | None = None):
    """Write dx (M, N) and dweight, dbias (N,) (each optional) from 2-D row views (unit
    column stride) dy, h, dh_out and the contiguous weight. The row kernel, then
    ``column_sum`` for each of dweight, dbias (two past ``_ONE_PASS`` bands), after a
    statistics launch for wide rows; no host synchronisation. Returns the compiled row
    kernel (its ``n_regs``, ``n_spills``), or None when nothing ran."""
    M, N = h.shape
    if N == 0:
        return None
    if M == 0:
        for t in (dweight, dbias):
            if t is not None:
                t.zero_()
        return None
    cfg = config or backward_config(M, N, h.device, h.element_size())
    plan, stats_meta, (meta, key) = _launch_plan(
        M, N, cfg, sm_count(h.device), _ONE_PASS, is_rms, gemma, weight is not None, dh_out is not None,
        dx is not None, dweight is not None, dbias is not None, pdl_on(h))
    bands = plan.bands
    w = weight if weight is not None else h
    stats = h
    if stats_meta is not None:
        stats = torch.empty((M, 4), dtype=torch.float32, device=h.device)
        launch(_stats_kernel, (M,), (dy, h, w, stats, N, dy.stride(0), h.stride(0), eps), *stats_meta)
    pw = torch.empty((bands, N), dtype=torch.float32, device=h.device) if dweight is not None else h
    pb = torch.empty((bands, N), dtype=torch.float32, device=h.device) if dbias is not None else h
    args = (dy, h, dh_out if dh_out is not None else h, w, dx if dx is not None else h, pw, pb, stats,
            M, N, plan.band_rows, plan.segs,
            dy.stride(0), h.stride(0), dh_out.stride(0) if dh_out is not None else 0,
            dx.stride(0) if dx is not None else 0,
            eps)
    kernel = launch(_backward_kernel, (bands * plan.segs,), args, meta, key)
    if dweight is not None:
        _sum_partials(pw, plan.split, dweight)
    if dbias is not None:
        _sum_partials(pb, plan.split, dbias)
    return kernel


def backward_unfused(dy: torch.Tensor, h: torch.Tensor, dh_out: Optional[torch.Tensor],
                     weight: Optional[torch.Tensor], eps: float, is_rms: bool, gemma: bool):
    """The same math op by op in float32 (the CPU fallback): (dh (M, N), dw (N,), db (N,))
    in float32, dh including dh_out."""
    hf, dyf = h.float(), dy.float()
    d = hf if is_rms else hf - hf.mean(-1, keepdim=True)
    var = d.pow(2).mean(-1, keepdim=True) + eps
    g = dyf
    if weight is not None:
        g = dyf * (weight.float() + 1.0 if gemma else weight.float())
    dh = g - d * ((g * d).mean(-1, keepdim=True) / var)  # as _backward_kernel: 1 / var, not rstd^2
    if not is_rms:
        dh = dh - g.mean(-1, keepdim=True)
    rstd = torch.rsqrt(var)
    dh = dh * rstd
    if dh_out is not None:
        dh = dh + dh_out.float()
    return dh, (dyf * (d * rstd)).sum(0), dyf.sum(0)
