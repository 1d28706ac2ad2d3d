"""@triton.jit helpers of the one-row GEMV (``skinny_matmul._skinny_matmul_kernel`` at
batch 1): a K chunk's weight tile, its products with the prologue-made x (SwiGLU, RMSNorm's
gain), RMSNorm's statistic from the producer's partial sums, and one program's K loop."""

import triton
import triton.language as tl

from ._jit import gdc_launch_dependents, gdc_wait, pdl_start


@triton.jit
def _rstd(ss_in_ptr, n_ss, K, eps, BLOCK_SS: tl.constexpr, ACC: tl.constexpr):
    """rsqrt(mean(h^2) + eps) from the producer's n_ss float32 partial sums, in float64,
    rounded once to ``ACC`` (the accumulation dtype). The statistic scales every output of
    the row alike, so its error does not average out over K the way the products'
    roundings do. In float32 with the fast sqrt and divisions (~2 ulp) float32 outputs
    reached 2.1-2.4x PyTorch's error on an H200 (tests/test_gemv_norm.py::test_chain, rows
    of 7 and 17 outputs); with round-to-nearest float32 ones, still in 2 of 12 runs; with
    the statistic alone in float64, in 6 of 54 test runs (six runs of the file) (the products' float32
    roundings): hence ACC. One scalar a program."""
    j = tl.arange(0, BLOCK_SS)
    ss = tl.sum(tl.load(ss_in_ptr + j, mask=j < n_ss, other=0.0).to(tl.float64), axis=0)
    return (1.0 / tl.sqrt(ss / K + eps)).to(ACC)


@triton.jit
def _row_weights(w_rows, k, k_hi, col_ok, stride_wk, EVEN_K: tl.constexpr, EVICT: tl.constexpr):
    """The (BLOCK_N, BLOCK_K) weight tile at columns ``k`` of a one-row GEMV's K loop, loaded
    with L2 eviction policy ``EVICT`` ("" for none; no default: Triton 3.6 passes a jit
    function's default string to it unwrapped, which fails to compile)."""
    if EVEN_K:
        return tl.load(w_rows + k[None, :] * stride_wk, mask=col_ok[:, None], other=0.0, eviction_policy=EVICT)
    else:
        return tl.load(w_rows + k[None, :] * stride_wk, mask=col_ok[:, None] & (k < k_hi)[None, :], other=0.0,
                       eviction_policy=EVICT)


@triton.jit
def _row_products(w, x_ptr, nw_ptr, k, k_hi, K, rstd, EVEN_K: tl.constexpr, SILU_MUL: tl.constexpr,
                  NORM_IN: tl.constexpr, NORM_LATE: tl.constexpr, ACC: tl.constexpr):
    """w * x[k] for one K chunk of a one-row GEMV, (BLOCK_N, BLOCK_K) in ``ACC``, with x
    made by the fused prologue: silu(gate) * up (x is [gate | up]), then RMSNorm's gain
    and (unless NORM_LATE) its rsqrt."""
    if EVEN_K:
        x = tl.load(x_ptr + k).to(tl.float32)
        if SILU_MUL:
            up = tl.load(x_ptr + K + k).to(tl.float32)
    else:
        k_ok = k < k_hi
        x = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        if SILU_MUL:
            up = tl.load(x_ptr + K + k, mask=k_ok, other=0.0).to(tl.float32)
    if SILU_MUL:
        # SwiGLU's product in the prologue, in float32: every program recomputes its K
        # chunk (BLOCK_K exps against BLOCK_N * BLOCK_K weights), which costs less than the
        # launch and the HBM round trip of a separate silu_mul.
        x = x / (1.0 + tl.exp(-x)) * up
    x = x.to(ACC)
    if NORM_IN:  # Llama's RMSNorm (weight after the normalisation), in ACC
        if EVEN_K:
            nw = tl.load(nw_ptr + k).to(ACC)
        else:
            nw = tl.load(nw_ptr + k, mask=k < k_hi, other=0.0).to(ACC)
        x = x * nw
    if NORM_IN and not NORM_LATE:
        x = x * rstd
    return w.to(ACC) * x[None, :]


@triton.jit
def _gemv_row(x_ptr, w_rows, k_lo, k_hi, K, stride_wk, col_ok, ss_in_ptr, n_ss, nw_ptr, eps,
              NORM_IN: tl.constexpr, NORM_LATE: tl.constexpr, BLOCK_SS: tl.constexpr, EVEN_K: tl.constexpr,
              SILU_MUL: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr, PDL: tl.constexpr,
              EARLY: tl.constexpr, W_EVICT: tl.constexpr = ""):
    """One program's (1, BLOCK_N) dot products of a one-row GEMV over K in [k_lo, k_hi), in
    ``ACC``: the weight rows at ``w_rows`` (BLOCK_N, 1) pointers, x made by the prologue
    (``_row_products``), the PDL wait placed as ``EARLY`` says: the one-row path of
    ``skinny_matmul._skinny_matmul_kernel``, a function so that other kernels can hold
    GEMV programs (``benchmarks/experiments/gemv-attention.patch``)."""
    ks = tl.arange(0, BLOCK_K)
    k = k_lo + ks
    if PDL > 0 and EARLY > 0:
        # The weight never depends on the previous kernel: let the next kernel be
        # scheduled, put this program's first EARLY chunks in flight, and only then
        # wait for the previous kernel's writes (x, the residual, the norm's partials).
        gdc_launch_dependents()
        w = _row_weights(w_rows, k, k_hi, col_ok, stride_wk, EVEN_K, W_EVICT)
        if EARLY > 1:  # the second chunk, if the program has one (a scalar test: 16-byte loads stay)
            k_b = k + BLOCK_K
            has_b = k_lo + BLOCK_K < k_hi
            w_b = _row_weights(w_rows, k_b, k_hi, col_ok & has_b, stride_wk, EVEN_K, W_EVICT)
        gdc_wait()
    else:
        # Launched early under PDL: nothing the previous kernel wrote is read, and
        # nothing is written, before this wait.
        pdl_start(PDL)
        w = _row_weights(w_rows, k, k_hi, col_ok, stride_wk, EVEN_K, W_EVICT)
    rstd = 1.0
    if NORM_IN and not NORM_LATE:
        # The row's sum of squares arrives as the producer GEMV's per-program partials
        # (n_ss floats, summed here in a fixed order: deterministic, no atomics).
        rstd = _rstd(ss_in_ptr, n_ss, K, eps, BLOCK_SS, ACC)
    acc2 = _row_products(w, x_ptr, nw_ptr, k, k_hi, K, rstd, EVEN_K, SILU_MUL, NORM_IN, NORM_LATE, ACC)
    loop_lo = k_lo + BLOCK_K
    if PDL > 0 and EARLY > 1:
        if has_b:
            acc2 += _row_products(w_b, x_ptr, nw_ptr, k_b, k_hi, K, rstd, EVEN_K, SILU_MUL, NORM_IN, NORM_LATE,
                                  ACC)
        loop_lo += BLOCK_K
    for k0 in range(loop_lo, k_hi, BLOCK_K):
        k = k0 + ks
        w = _row_weights(w_rows, k, k_hi, col_ok, stride_wk, EVEN_K, W_EVICT)
        acc2 += _row_products(w, x_ptr, nw_ptr, k, k_hi, K, rstd, EVEN_K, SILU_MUL, NORM_IN, NORM_LATE, ACC)
    acc = tl.sum(acc2, axis=1)[None, :]  # (1, BLOCK_N)
    if NORM_IN and NORM_LATE:
        # rsqrt is one scalar per row, so it factors out of the dot product: its
        # partials load overlaps the whole K loop instead of gating the first FMA.
        acc = acc * _rstd(ss_in_ptr, n_ss, K, eps, BLOCK_SS, ACC)
    return acc
