"""@triton.jit code of the skinny matmuls (``skinny_matmul``, ``gemv_norm``): the kernel,
its split-K reduce, and the one-row GEMV's helpers: a K chunk's weight tile, its products
with the prologue-made x (SwiGLU, RMSNorm's gain), RMSNorm's statistic from the
producer's partial sums, and one program's K loop. ``_gemv_launch.py`` launches them."""

import triton
import triton.language as tl

from ._jit import cast_out, gdc_launch_dependents, gdc_wait, pdl_start


@triton.jit
def _rstd(ss_in_ptr, n_ss, K, eps, BLOCK_SS: tl.constexpr, ACC: tl.constexpr):
    """rsqrt(mean(h^2) + eps) from the producer's n_ss float32 partial sums, in float64,
    rounded once to ``ACC`` (the accumulation dtype). The statistic scales every output of
    the row alike, so its error does not average out over K the way the products'
    roundings do. In float32 (fast sqrt and divisions, ~2 ulp) float32 outputs reach
    2.1-2.4x PyTorch's error on an H200 (tests/test_gemv_norm.py::test_chain, rows of 7 and
    17 outputs), and with the statistic alone in float64 still in 6 of 54 runs (the
    products' float32 roundings): hence float64 and ACC. One scalar a program."""
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
                  NORM_IN: tl.constexpr, ACC: tl.constexpr):
    """w * x[k] for one K chunk of a one-row GEMV, (BLOCK_N, BLOCK_K) in ``ACC``, with x
    made by the fused prologue: silu(gate) * up (x is [gate | up]), then RMSNorm's gain
    and its rsqrt."""
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
        x = x * rstd
    return w.to(ACC) * x[None, :]


@triton.jit
def _gemv_row(x_ptr, w_rows, k_lo, k_hi, K, stride_wk, col_ok, ss_in_ptr, n_ss, nw_ptr, eps,
              NORM_IN: tl.constexpr, BLOCK_SS: tl.constexpr, EVEN_K: tl.constexpr,
              SILU_MUL: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr, PDL: tl.constexpr,
              EARLY: tl.constexpr, W_EVICT: tl.constexpr = ""):
    """One program's (1, BLOCK_N) dot products of a one-row GEMV over K in [k_lo, k_hi), in
    ``ACC``: the weight rows at ``w_rows`` (BLOCK_N, 1) pointers, x made by the prologue
    (``_row_products``), the PDL wait placed as ``EARLY`` says: the one-row path of
    ``_skinny_matmul_kernel``, a function so that other kernels can hold GEMV programs."""
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
    if NORM_IN:
        # The row's sum of squares arrives as the producer GEMV's per-program partials
        # (n_ss floats, summed here in a fixed order: deterministic, no atomics).
        rstd = _rstd(ss_in_ptr, n_ss, K, eps, BLOCK_SS, ACC)
    acc2 = _row_products(w, x_ptr, nw_ptr, k, k_hi, K, rstd, EVEN_K, SILU_MUL, NORM_IN, ACC)
    loop_lo = k_lo + BLOCK_K
    if PDL > 0 and EARLY > 1:
        if has_b:
            acc2 += _row_products(w_b, x_ptr, nw_ptr, k_b, k_hi, K, rstd, EVEN_K, SILU_MUL, NORM_IN, ACC)
        loop_lo += BLOCK_K
    for k0 in range(loop_lo, k_hi, BLOCK_K):
        k = k0 + ks
        w = _row_weights(w_rows, k, k_hi, col_ok, stride_wk, EVEN_K, W_EVICT)
        acc2 += _row_products(w, x_ptr, nw_ptr, k, k_hi, K, rstd, EVEN_K, SILU_MUL, NORM_IN, ACC)
    return tl.sum(acc2, axis=1)[None, :]  # (1, BLOCK_N)


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
                        NORM_IN, BLOCK_SS, EVEN_K, SILU_MUL, BLOCK_K, ACC, PDL, EARLY, W_EVICT)
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
