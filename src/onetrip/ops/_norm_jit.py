"""Jit helpers of the residual-add + norm kernel (``norm.py``): the loads and stores of a
(rows, cols) tile, the statistics, and mode "loop"'s row walk (see norm.py's docstring for
the modes)."""

import triton
import triton.language as tl

from ._jit import cast_out


@triton.jit
def _load_h(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm,
            HAS_RESIDUAL: tl.constexpr, STORE_H: tl.constexpr, EVICT: tl.constexpr = tl.constexpr(""),
            EVICT_H: tl.constexpr = tl.constexpr("")):
    """h = x + r of a (rows, cols) tile in float32 (unrounded: the statistics use the exact
    sum); stores h rounded to its dtype when STORE_H. EVICT, EVICT_H: L2 eviction hints of
    the loads and of h's store ("" for none)."""
    rows64 = rows.to(tl.int64)[:, None]  # rows * stride exceeds 2**31 for tensors over 4 GiB
    h = tl.load(x_ptr + rows64 * stride_xm + cols[None, :], mask=mask, other=0.0,
                eviction_policy=EVICT).to(tl.float32)
    if HAS_RESIDUAL:
        h += tl.load(r_ptr + rows64 * stride_rm + cols[None, :], mask=mask, other=0.0,
                     eviction_policy=EVICT).to(tl.float32)
        if STORE_H:
            tl.store(h_ptr + rows64 * stride_hm + cols[None, :], cast_out(h, h_ptr.dtype.element_ty), mask=mask,
                     eviction_policy=EVICT_H)
    return h


@triton.jit
def _store_y(y_ptr, h, mean, rstd, w, b, rows, cols, mask, stride_ym,
             IS_RMS: tl.constexpr, GEMMA: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
             mean_lo=0.0, TWO_PART: tl.constexpr = False, EVICT: tl.constexpr = tl.constexpr("")):
    """y = norm(h) from its statistics (scalars, or (BLOCK_M, 1) columns), stored rounded.
    TWO_PART: the mean is mean + mean_lo, kept as two float32s (see ``_mean_rstd``)."""
    if IS_RMS:
        y = h * rstd
        if HAS_WEIGHT:
            if GEMMA:
                y = y * (1.0 + w.to(tl.float32)[None, :])
            else:  # Llama: round to x's dtype, then multiply by the weight
                y = cast_out(y, y_ptr.dtype.element_ty).to(tl.float32) * w.to(tl.float32)[None, :]
    else:
        if TWO_PART:
            y = ((h - mean) - mean_lo) * rstd
        else:
            y = (h - mean) * rstd
        if HAS_WEIGHT:
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
    bandwidth on an H200, whose rounding hides the error anyway, so 16-bit inputs skip it.
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
def _load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The weight and bias of columns ``cols`` (0.0 when absent)."""
    w = 0.0
    b = 0.0
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0)
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0)
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
def _pass1_chunk(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm,
                 HAS_RESIDUAL: tl.constexpr, STASH: tl.constexpr, KEEP: tl.constexpr, DROP: tl.constexpr):
    """h of one chunk in pass 1 of mode "loop" (float32). STASH: x and r are read for the
    last time (DROP) and h is stored rounded (KEEP: pass 2 reads it), then used as stored;
    else x (and r) are read with KEEP, for pass 2 to find them in L2."""
    if STASH:
        h = _load_h(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm, True, True, DROP, KEEP)
        return cast_out(h, h_ptr.dtype.element_ty).to(tl.float32)
    return _load_h(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL, False, KEEP)


@triton.jit
def _loop_row(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, row, N, stride_xm, stride_rm, stride_ym, stride_hm, eps,
              IS_RMS: tl.constexpr, GEMMA: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
              HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, HINTS: tl.constexpr, STASH: tl.constexpr,
              VEC: tl.constexpr, UNROLL: tl.constexpr):
    """Mode "loop": one program per row, two passes over its chunks of BLOCK_N. Pass 1 sums
    the statistics; pass 2 reads each chunk again, which a row of <= 512 KB finds in L2 (two
    programs an SM hold 132 x 2 x 256 KB at 64K wide: 68 MB for the H200's 60 MB L2, most
    of it), and writes h and y. No program waits on another: nothing to deadlock.

    HINTS: pass 1 loads with evict_last (the lines are read again), pass 2 loads and every
    store with evict_first (never read again), so the row being re-read is the last thing
    the L2 gives up. STASH (with a residual): pass 1 also stores h = x + r (evict_last) and
    pass 2 re-reads h alone: half the bytes kept in L2 between the passes, the same bytes
    to HBM; y is then normalized from h as stored (rounded to its dtype, as PyTorch's
    ``x + residual`` is), so pass 1 takes its statistics from the rounded h too.

    LayerNorm sums d = h - c around c = h[0] (the shifted-data algorithm): with c within a
    few standard deviations of the mean, sum(d^2) - sum(d)^2 / N does not cancel, and y =
    ((h - c) - sum(d) / N) * rstd keeps the mean as the exact pair (c, sum(d) / N). A
    running Chan combine of chunk means instead drew 2.8x PyTorch's float32 error on rows
    100 standard deviations from zero (5000 wide, chunks of 128: ~40 roundings of a mean
    near 100)."""
    KEEP: tl.constexpr = "evict_last" if HINTS else ""
    DROP: tl.constexpr = "evict_first" if HINTS else ""
    rows = row + tl.arange(0, 1)
    c = 0.0
    if not IS_RMS:
        # (Taking c from the first chunk instead of this load of its own, with the chunk
        # peeled off the loop, measured -4 to +3 points: 16K / 32K wide, H200.)
        one = tl.arange(0, 1) < 1
        c = _pass1_chunk(x_ptr, r_ptr, h_ptr, rows, tl.arange(0, 1), one[None, :], stride_xm, stride_rm, stride_hm,
                         HAS_RESIDUAL, False, "", "")
        if STASH:
            c = cast_out(c, h_ptr.dtype.element_ty).to(tl.float32)
        c = tl.sum(c)
    if VEC:  # per-lane partial sums, reduced once after the loop
        s1 = tl.zeros((1, BLOCK_N), tl.float32)
        s2 = tl.zeros((1, BLOCK_N), tl.float32)
    else:  # a block-wide sum per chunk
        s1 = 0.0
        s2 = 0.0
    for c0 in tl.range(0, N, BLOCK_N, loop_unroll_factor=UNROLL):
        cols = c0 + tl.arange(0, BLOCK_N)
        mask = (cols < N)[None, :]
        h = _pass1_chunk(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL,
                         STASH, KEEP, DROP)
        d = tl.where(mask, h - c, 0.0)
        if VEC:
            s1 += d
            s2 += d * d
        else:
            s1 += tl.sum(d)
            s2 += tl.sum(d * d)
    if VEC:
        s1 = tl.sum(s1)
        s2 = tl.sum(s2)
    mean_lo = s1 / N
    if IS_RMS:
        rstd = tl.rsqrt(s2 / N + eps)
    else:
        rstd = tl.rsqrt(tl.maximum(s2 / N - mean_lo * mean_lo, 0.0) + eps)
    if STASH:
        tl.debug_barrier()  # pass 2 reads h as this program's other threads stored it
    for c0 in tl.range(0, N, BLOCK_N, loop_unroll_factor=UNROLL):
        cols = c0 + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        mask = col_ok[None, :]
        if STASH:
            h = _load_h(h_ptr, r_ptr, h_ptr, rows, cols, mask, stride_hm, stride_rm, stride_hm, False, False, DROP)
        else:
            h = _load_h(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL, True,
                        DROP, DROP)
        w, b = _load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT, HAS_BIAS)
        _store_y(y_ptr, h, c, rstd, w, b, rows, cols, mask, stride_ym, IS_RMS, GEMMA, HAS_WEIGHT, HAS_BIAS,
                 mean_lo, TWO_PART=not IS_RMS, EVICT=DROP)
