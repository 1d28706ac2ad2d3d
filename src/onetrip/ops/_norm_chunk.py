"""Chunk-level jit helpers of the residual-add + norm kernel (``norm.py``): the loads and
stores of a (rows, cols) tile, its statistics, and one chunk of mode "loop"'s two passes
(``_norm_jit`` walks them)."""

import triton
import triton.language as tl

from ._jit import cast_out
from ._ptx import smem_load8


@triton.jit
def _load_xr(x_ptr, r_ptr, rows, cols, mask, stride_xm, stride_rm, HAS_RESIDUAL: tl.constexpr,
             EVICT: tl.constexpr = tl.constexpr("")):
    """x and r of a (rows, cols) tile as stored (r: 0.0 without a residual), loaded with
    the L2 eviction hint EVICT ("" for none): ``_sum_h``'s operands."""
    rows64 = rows.to(tl.int64)[:, None]  # rows * stride exceeds 2**31 for tensors over 4 GiB
    x = tl.load(x_ptr + rows64 * stride_xm + cols[None, :], mask=mask, other=0.0, eviction_policy=EVICT)
    r = 0.0
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + rows64 * stride_rm + cols[None, :], mask=mask, other=0.0, eviction_policy=EVICT)
    return x, r


@triton.jit
def _sum_h(x, r, h_ptr, rows, cols, mask, stride_hm, HAS_RESIDUAL: tl.constexpr, STORE_H: tl.constexpr,
           EVICT_H: tl.constexpr = tl.constexpr("")):
    """h = x + r in float32 (unrounded: the statistics use the exact sum) of ``_load_xr``'s
    tiles; stores h rounded to its dtype when STORE_H (hint EVICT_H)."""
    h = x.to(tl.float32)
    if HAS_RESIDUAL:
        h += r.to(tl.float32)
        if STORE_H:
            tl.store(h_ptr + rows.to(tl.int64)[:, None] * stride_hm + cols[None, :],
                     cast_out(h, h_ptr.dtype.element_ty), mask=mask, eviction_policy=EVICT_H)
    return h


@triton.jit
def _load_h(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm,
            HAS_RESIDUAL: tl.constexpr, STORE_H: tl.constexpr, EVICT: tl.constexpr = tl.constexpr(""),
            EVICT_H: tl.constexpr = tl.constexpr("")):
    """h = x + r of a (rows, cols) tile in float32 (``_load_xr``, then ``_sum_h``)."""
    x, r = _load_xr(x_ptr, r_ptr, rows, cols, mask, stride_xm, stride_rm, HAS_RESIDUAL, EVICT)
    return _sum_h(x, r, h_ptr, rows, cols, mask, stride_hm, HAS_RESIDUAL, STORE_H, EVICT_H)


@triton.jit
def _store_y(y_ptr, h, mean, rstd, w, b, rows, cols, mask, stride_ym,
             IS_RMS: tl.constexpr, GEMMA: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
             mean_lo=0.0, TWO_PART: tl.constexpr = False, EVICT: tl.constexpr = tl.constexpr(""),
             FMA: tl.constexpr = False):
    """y = norm(h) from its statistics (scalars, or (BLOCK_M, 1) columns), stored rounded.
    TWO_PART: the mean is mean + mean_lo, kept as two float32s (see ``_mean_rstd``).
    FMA (LayerNorm with a weight, 16-bit y): y = (h - (mean + mean_lo)) * (rstd * w) + b,
    a subtraction, a multiply and an FMA an element instead of five operations; the pair
    folded into one float32 is off by half an ulp of the mean, which a 16-bit y rounds away
    (float32 y keeps the two parts). Mode "loop" only (``affine_fma``): on an H100, layer_norm
    128K 84.6 -> 89.6% of copy; in mode "rows" it cost up to 24 points (a whole row's rstd * w
    held)."""
    if IS_RMS:
        y = h * rstd
        if HAS_WEIGHT:
            if GEMMA:
                y = y * (1.0 + w.to(tl.float32)[None, :])
            else:  # Llama: round to x's dtype, then multiply by the weight
                y = cast_out(y, y_ptr.dtype.element_ty).to(tl.float32) * w.to(tl.float32)[None, :]
    else:
        FOLDED: tl.constexpr = FMA and HAS_WEIGHT and y_ptr.dtype.element_ty != tl.float32
        if FOLDED:
            y = (h - (mean + mean_lo)) * (rstd * w.to(tl.float32)[None, :])
        elif TWO_PART:
            y = ((h - mean) - mean_lo) * rstd
        else:
            y = (h - mean) * rstd
        if HAS_WEIGHT and not FOLDED:
            y = y * w.to(tl.float32)[None, :]
        if HAS_BIAS:
            y += b.to(tl.float32)[None, :]
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :], cast_out(y, y_ptr.dtype.element_ty),
             mask=mask, eviction_policy=EVICT)


@triton.jit
def _mean_rstd(h, mask, N, eps, CORRECTED: tl.constexpr):
    """Per-row (mean, mean_lo, 1/sqrt(var + eps)) of a (BLOCK_M, BLOCK_N) float32 tile.

    mean = sum(h) / N, then var = sum((h - mean)^2) / N: two dependent reductions. The mean
    is off by float32's rounding of a sum of N values, which matters when |mean| >> std:
    rows 100 std from zero gave twice PyTorch's error on float32 outputs. CORRECTED (used
    for float32 inputs) computes mean_lo = sum(h - mean) / N and subtracts its square from
    the variance; the mean stays the pair (mean, mean_lo), because folded into one float32
    near 100 it would again be off by up to half an ulp of 100 (3.8e-6: 2.3x PyTorch's
    error on one seed in 40). The extra reduction cost a 16-bit LayerNorm up to 40% of its
    bandwidth on an H200, and 16-bit rounding hides the error anyway, so 16-bit inputs skip it.
    """
    mean = tl.sum(h, axis=1) / N
    d = tl.where(mask, h - mean[:, None], 0.0)
    var = tl.sum(d * d, axis=1) / N
    mean_lo = tl.zeros_like(mean)
    if CORRECTED:
        mean_lo = tl.sum(d, axis=1) / N
        var = tl.maximum(var - mean_lo * mean_lo, 0.0)
    return mean, mean_lo, tl.rsqrt(var + eps)


@triton.jit
def _load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
             EVICT: tl.constexpr = tl.constexpr("")):
    """The weight and bias of columns ``cols`` (0.0 when absent), loaded with the eviction
    hint EVICT ("" for none)."""
    w = 0.0
    b = 0.0
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0, eviction_policy=EVICT)
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0, eviction_policy=EVICT)
    return w, b


@triton.jit
def _chunk_stats(h, mask, n_here, FP32: tl.constexpr):
    """(mean, M2) of one chunk's h (1, BLOCK_N); FP32: the mean corrected by the mean
    deviation (see ``_mean_rstd``)."""
    mean = tl.sum(h) / n_here
    d = tl.where(mask, h - mean, 0.0)
    m2 = tl.sum(d * d)
    if FP32:
        c1 = tl.sum(d)
        mean += c1 / n_here
        m2 = tl.maximum(m2 - c1 * c1 / n_here, 0.0)
    return mean, m2


@triton.jit
def _row_sums(v, BLOCK_M: tl.constexpr):
    """Per-row sums of a (BLOCK_M, n) tile: a scalar for one row (statistics kept scalar
    keep the chunk's own layout; see norm.py's split rows), else a (BLOCK_M, 1) column."""
    if BLOCK_M == 1:
        s = tl.sum(v)
    else:
        s = tl.sum(v, axis=1, keep_dims=True)
    return s


@triton.jit
def _tile_mask(rows, M, col_ok, BLOCK_M: tl.constexpr):
    """(BLOCK_M, n) mask of rows < M and col_ok; one row is always inside (grid = M)."""
    if BLOCK_M == 1:
        mask = col_ok[None, :]
    else:
        mask = (rows < M)[:, None] & col_ok[None, :]
    return mask


@triton.jit
def _chunk_cols(col0, i, N, BLOCK_N: tl.constexpr, EVEN: tl.constexpr):
    """Columns col0 + i + [0, BLOCK_N) and which are inside the row; EVEN: all of them (a
    constant mask the compiler drops, where col0 is not a constant)."""
    cols = col0 + i + tl.arange(0, BLOCK_N)
    if EVEN:
        col_ok = tl.full((BLOCK_N,), 1, tl.int1)
    else:
        col_ok = cols < N
    return cols, col_ok


@triton.jit
def _ahead_cols(col0, i, N, SEG, BLOCK_N: tl.constexpr, EVEN: tl.constexpr):
    """``_chunk_cols`` of a chunk loaded one ahead (``next_before_store``): none of its columns inside the
    row when it starts past the segment (the loop's last chunk has no next)."""
    cols, col_ok = _chunk_cols(col0, i, N, BLOCK_N, EVEN)
    return cols, tl.where(i < SEG, col_ok, False)


@triton.jit
def _accumulate(v1, v2, d):
    """Pass 1's running sums of d and d^2, per lane (reduced once after the pass)."""
    v1 += d
    v2 += d * d
    return v1, v2


@triton.jit
def _pass1_h(x, r, h_ptr, rows, cols, mask, stride_hm, HAS_RESIDUAL: tl.constexpr, STORE_H: tl.constexpr,
             KEEP: tl.constexpr):
    """h of one chunk in pass 1 of mode "loop" (float32) from its loaded x and r (``_load_xr``:
    with STORE_H read for the last time, DROP; else with KEEP, for pass 2 to find them in L2).
    STORE_H: h is stored rounded (KEEP: pass 2 reads it), then used as stored."""
    if STORE_H:
        h = _sum_h(x, r, h_ptr, rows, cols, mask, stride_hm, True, True, KEEP)
        return cast_out(h, h_ptr.dtype.element_ty).to(tl.float32)
    return _sum_h(x, r, h_ptr, rows, cols, mask, stride_hm, HAS_RESIDUAL, False)


@triton.jit
def _held_pass1(x_ptr, r_ptr, h_ptr, rows, M, col0, i, N, c, stride_xm, stride_rm, stride_hm,
                HAS_RESIDUAL: tl.constexpr, STORE_H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                EVEN: tl.constexpr, DROP: tl.constexpr, xr=None, LOADED: tl.constexpr = False):
    """Pass 1 of a chunk that pass 2 takes from registers: read once (DROP; LOADED: ``xr``
    is its ``_load_xr`` pair, loaded by the caller), h stored now, returned as held (x's
    dtype where that is exact: no residual, or h as STORE_H stores it; else float32) with
    its d = h - c (masked)."""
    cols, col_ok = _chunk_cols(col0, i, N, BLOCK_N, EVEN)
    mask = _tile_mask(rows, M, col_ok, BLOCK_M)
    if LOADED:
        x, r = xr
    else:
        x, r = _load_xr(x_ptr, r_ptr, rows, cols, mask, stride_xm, stride_rm, HAS_RESIDUAL, DROP)
    h = _sum_h(x, r, h_ptr, rows, cols, mask, stride_hm, HAS_RESIDUAL, True, DROP)
    if STORE_H or not HAS_RESIDUAL:
        held = cast_out(h, x_ptr.dtype.element_ty)
    else:
        held = h
    return held, tl.where(mask, held.to(tl.float32) - c, 0.0)


@triton.jit
def _pass2_src(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL: tl.constexpr,
               SMEM: tl.constexpr, STORE_H: tl.constexpr, DROP: tl.constexpr):
    """The global loads of a streamed pass-2 chunk, as stored (``_load_xr``'s pair): h as pass
    1 stored it, or x and r; nothing with SMEM (pass 2 reads shared memory)."""
    xs = 0.0
    rs = 0.0
    if STORE_H and not SMEM:
        xs, rs = _load_xr(h_ptr, r_ptr, rows, cols, mask, stride_hm, stride_rm, False, DROP)
    elif not SMEM:
        xs, rs = _load_xr(x_ptr, r_ptr, rows, cols, mask, stride_xm, stride_rm, HAS_RESIDUAL, DROP)
    return xs, rs


@triton.jit
def _pass2_chunk(x_ptr, r_ptr, y_ptr, h_ptr, w, b, held, base, rows, M, col0, i, N, c, rstd, mean_lo,
                 stride_xm, stride_rm, stride_ym, stride_hm, IS_RMS: tl.constexpr, GEMMA: tl.constexpr,
                 HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, EVEN: tl.constexpr, HELD: tl.constexpr, SMEM: tl.constexpr,
                 STORE_H: tl.constexpr, DROP: tl.constexpr, DROP_Y: tl.constexpr, FMA: tl.constexpr,
                 LOADED: tl.constexpr = False):
    """Pass 2 of the chunk at column col0 + i, given its weight and bias: y from ``held``
    (HELD: the registers pass 1 kept; y stored with DROP), or from shared memory at ``base``
    (SMEM), h as pass 1 stored it (STORE_H), or x (and r, h stored), y stored with DROP_Y.
    LOADED: ``held`` is the chunk's ``_pass2_src`` pair, loaded by the caller."""
    cols, col_ok = _chunk_cols(col0, i, N, BLOCK_N, EVEN)
    mask = _tile_mask(rows, M, col_ok, BLOCK_M)
    if HELD:
        _store_y(y_ptr, held.to(tl.float32), c, rstd, w, b, rows, cols, mask, stride_ym, IS_RMS, GEMMA, HAS_WEIGHT,
                 HAS_BIAS, mean_lo, TWO_PART=not IS_RMS, EVICT=DROP, FMA=FMA)
    else:
        if SMEM:
            h = smem_load8(base + 2 * (i + tl.arange(0, BLOCK_N))[None, :], rstd, x_ptr).to(tl.float32)
        else:
            if LOADED:
                xs, rs = held
            else:
                xs, rs = _pass2_src(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm,
                                    HAS_RESIDUAL, SMEM, STORE_H, DROP)
            h = _sum_h(xs, rs, h_ptr, rows, cols, mask, stride_hm, HAS_RESIDUAL and not STORE_H, True, DROP)
        _store_y(y_ptr, h, c, rstd, w, b, rows, cols, mask, stride_ym, IS_RMS, GEMMA, HAS_WEIGHT, HAS_BIAS,
                 mean_lo, TWO_PART=not IS_RMS, EVICT=DROP_Y, FMA=FMA)


@triton.jit
def _pre_wb(w_ptr, b_ptr, col0, N, BLOCK_N: tl.constexpr, EVEN: tl.constexpr, HAS_WEIGHT: tl.constexpr,
            HAS_BIAS: tl.constexpr, CHUNKS: tl.constexpr, EVICT: tl.constexpr = tl.constexpr("")):
    """The (weight, bias) of a segment's first CHUNKS chunks of BLOCK_N, a tuple for pass 2,
    asked for just before the program waits (on its copies, or on the exchange of sums), so
    that their L2 round trip overlaps the wait; EVICT: ``_load_wb``'s hint."""
    wb = ()
    for k in tl.static_range(CHUNKS):
        cols, col_ok = _chunk_cols(col0, k * BLOCK_N, N, BLOCK_N, EVEN)
        wb = wb + (_load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT, HAS_BIAS, EVICT),)
    return wb
