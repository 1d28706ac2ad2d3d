"""The residual-add + norm kernel (``norm.py``): one launch a phase of ``NormConfig.mode``
("rows" tiles, "coop" chunks, "two_pass"'s statistics and apply, "loop" programs; the loop
mode's body is in ``_norm_jit.py``, a chunk's loads and stores in ``_norm_chunk.py``)."""

import triton
import triton.language as tl

from ._jit import pdl_start
from ._norm_chunk import _chunk_stats, _load_h, _load_wb, _mean_rstd, _store_y
from ._norm_jit import _loop_row, _wait_row
from ._norm_l2 import l2_first

# the kernel's PHASE: a "rows" tile, a "coop" chunk, "two_pass"'s statistics and apply, a "loop" program
_ROWS, _COOP, _STATS, _APPLY, _LOOP = (tl.constexpr(p) for p in range(5))


@triton.jit
def _rows_tile(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, t, M, n, sx, sr, sy, sh, eps, IS_RMS: tl.constexpr,
               GEMMA: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LATE_WB: tl.constexpr):
    """Mode "rows": the BLOCK_M whole rows of tile ``t``, h stored, y = norm(h) stored. LATE_WB:
    the weight and bias loaded after the statistics, not live while the rows load (layer_norm
    1K on an H100: 98.1 -> 98.6% of copy)."""
    cols = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    col_ok = cols < n  # with BLOCK_N == CONST_N the column mask folds away
    w = 0.0
    b = 0.0
    if not LATE_WB:
        w, b = _load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT, HAS_BIAS)
    rows = t * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    mask = (rows < M)[:, None] & col_ok[None, :]
    h = _load_h(x_ptr, r_ptr, h_ptr, rows, cols, mask, sx, sr, sh, HAS_RESIDUAL, True)
    if IS_RMS:
        mean = 0.0
        mean_lo = 0.0
        rstd = tl.rsqrt(tl.sum(h * h, axis=1) / n + eps)[:, None]  # (BLOCK_M, 1)
    else:
        mean, mean_lo, rstd = _mean_rstd(h, mask, n, eps, x_ptr.dtype.element_ty == tl.float32)
        mean = mean[:, None]
        mean_lo = mean_lo[:, None]
        rstd = rstd[:, None]
    if LATE_WB:
        w, b = _load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT, HAS_BIAS)
    _store_y(y_ptr, h, mean, rstd, w, b, rows, cols, mask, sy, IS_RMS, GEMMA, HAS_WEIGHT, HAS_BIAS,
             mean_lo, TWO_PART=x_ptr.dtype.element_ty == tl.float32 and not IS_RMS)


@triton.jit
def _split_chunk(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, part_ptr, sync_ptr, t, N, C, stride_xm, stride_rm,
                 stride_ym, stride_hm, eps, IS_RMS: tl.constexpr, GEMMA: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                 HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, PHASE: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_C: tl.constexpr):
    """Modes "coop" and "two_pass": chunk t % C of row t // C. Its partial statistics (RMSNorm:
    sum h^2; LayerNorm: mean and M2) go to ``part_ptr`` (M, C, 2); "coop" then waits for the
    row's C partials and normalizes the chunk it holds, "two_pass" returns (_STATS) and its
    second launch (_APPLY) re-reads the chunk. Statistics stay scalars: a (1, BLOCK_C) tensor
    of partials broadcast against the chunk made the compiler pick a layout for the whole
    chunk that ran 10-100x slower (H200)."""
    chunk = t % C
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    col_ok = cols < N
    w, b = _load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT, HAS_BIAS)
    row = t // C
    rows = row + tl.arange(0, 1)
    mask = col_ok[None, :]
    h = _load_h(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL,
                PHASE != 3)  # the apply pass of "two_pass" recomputes h; it was stored already
    part = part_ptr + (row.to(tl.int64) * C + chunk) * 2
    if PHASE != 3:
        if IS_RMS:
            s0 = tl.sum(h * h)
            s1 = s0
        else:
            n_here = tl.minimum(N - chunk * BLOCK_N, BLOCK_N).to(tl.float32)
            s0, s1 = _chunk_stats(h, mask, n_here, x_ptr.dtype.element_ty == tl.float32)  # mean, M2
        tl.store(part, s0)
        tl.store(part + 1, s1)
    if PHASE != 2:
        if PHASE == 1:  # grid-wide wait for this row's C partials
            _wait_row(sync_ptr + 1 + row, C)
        cidx = tl.arange(0, BLOCK_C)
        c_ok = cidx < C
        pp = part_ptr + (row.to(tl.int64) * C + cidx) * 2  # (BLOCK_C,)
        p0 = tl.load(pp, mask=c_ok, other=0.0, volatile=True)
        if IS_RMS:
            mean = 0.0
            rstd = tl.rsqrt(tl.sum(p0) / N + eps)
        else:
            # Chan et al.: M2 = sum_c [M2_c + n_c (mean_c - mean)^2], stable for large N.
            p1 = tl.load(pp + 1, mask=c_ok, other=0.0, volatile=True)
            n_c = tl.where(c_ok, tl.minimum(N - cidx * BLOCK_N, BLOCK_N).to(tl.float32), 0.0)
            mean = tl.sum(n_c * p0) / N
            if x_ptr.dtype.element_ty == tl.float32:
                # The sum of C chunk sums (~N |mean|) rounds to ~1e-7 of itself; rows 100 std
                # from zero then drew up to 2.3x PyTorch's float32 error. Adding the mean
                # deviation of the chunk means (exact differences, small sum) removes it.
                mean += tl.sum(n_c * tl.where(c_ok, p0 - mean, 0.0)) / N
            dm = p0 - mean
            rstd = tl.rsqrt(tl.sum(p1 + n_c * dm * dm) / N + eps)
        _store_y(y_ptr, h, mean, rstd, w, b, rows, cols, mask, stride_ym, IS_RMS, GEMMA, HAS_WEIGHT, HAS_BIAS)


@triton.jit
def _norm_kernel(
    x_ptr, r_ptr, w_ptr, b_ptr,       # x, r: (M, N) rows; w, b: (N,)
    y_ptr, h_ptr,                     # y = norm(h), h = x + r: (M, N) rows
    part_ptr, sync_ptr,               # split rows: float32 partials ((M, C, 2); "loop": (M, SPLIT, 3));
                                      # int32 [ticket, M row counters]
    M, N, C, seg_n,                   # C: chunks a row ("coop", "two_pass"); seg_n: a "loop" segment's columns
    stride_xm, stride_rm, stride_ym, stride_hm,
    eps,
    # the op
    IS_RMS: tl.constexpr, GEMMA: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    # the tile
    PHASE: tl.constexpr,              # _ROWS, _COOP, _STATS, _APPLY or _LOOP
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,            # C rounded up to a power of two
    CONST_N: tl.constexpr,            # "rows", "loop": the width, when every row stride equals it (0: runtime)
    LATE_WB: tl.constexpr,            # "rows": the weight and bias loaded after the statistics
    PDL: tl.constexpr,                # programmatic dependent launch (_common.pdl_mode)
    # "loop" (_norm_jit describes each)
    UNROLL: tl.constexpr, SPLIT: tl.constexpr,
    SEG_N: tl.constexpr,              # with CONST_N: seg_n as a constant
    CLUSTER: tl.constexpr,            # a row's SPLIT programs one thread-block cluster
    PASSES: tl.constexpr,             # 0: both passes; 1 / 2: pass 1 / pass 2 of the interpreter's two launches
    KEEP_ROW: tl.constexpr, DROP_Y: tl.constexpr, KEEP_WB: tl.constexpr,
    HOLD: tl.constexpr, STORE_H: tl.constexpr, SMEM: tl.constexpr, SMEM_PER_CHUNK: tl.constexpr,
    WB_EARLY: tl.constexpr, WB_WITH_COPIES: tl.constexpr, HALF_STEPS: tl.constexpr, NEXT_FIRST: tl.constexpr,
    FMA: tl.constexpr,
    L2_FIRST: tl.constexpr,           # columns of the program's segment asked of the L2 before the PDL wait
    AHEAD: tl.constexpr,              # after pass 1, this segment of the row AHEAD rows on asked of the L2
    LANES: tl.constexpr,              # the program's threads (with L2 requests: a lane each)
):
    if L2_FIRST > 0:  # a hint, safe before the wait (_norm_l2.l2_first)
        l2_first(x_ptr, r_ptr, M, HAS_RESIDUAL, SPLIT, SEG_N, L2_FIRST, CONST_N, LANES)
    pdl_start(PDL)  # wait for the previous kernel's writes, then let the next one's programs in
    # CONST_N > 0: the width and dense rows' strides as constants, so trip counts, masks and
    # row addresses are known to the compiler (the runtime values are then not read).
    n = CONST_N if CONST_N > 0 else N
    sx = CONST_N if CONST_N > 0 else stride_xm
    sr = CONST_N if CONST_N > 0 else stride_rm
    sy = CONST_N if CONST_N > 0 else stride_ym
    sh = CONST_N if CONST_N > 0 else stride_hm
    if PHASE == _LOOP:
        if SPLIT > 1 and PASSES == 0 and not CLUSTER:
            t = tl.atomic_add(sync_ptr, 1)  # ticket in start order, as "coop" (no deadlock)
        else:
            t = tl.program_id(0)  # a cluster's ranks run together: no order to keep
        # dense rows cut into SPLIT segments of whole chunks: no masks
        EVEN: tl.constexpr = CONST_N > 0 and CONST_N == SEG_N * SPLIT and SEG_N % BLOCK_N == 0
        seg_cols = SEG_N if CONST_N > 0 else seg_n
        _loop_row(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, part_ptr, sync_ptr, t // SPLIT, t % SPLIT, M, n, seg_cols,
                  sx, sr, sy, sh, eps, IS_RMS, GEMMA, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N, SEG_N, EVEN,
                  UNROLL, SPLIT, CLUSTER, PASSES, KEEP_ROW, DROP_Y, KEEP_WB, HOLD, STORE_H, SMEM, SMEM_PER_CHUNK,
                  WB_EARLY, WB_WITH_COPIES, HALF_STEPS, NEXT_FIRST, FMA, AHEAD, LANES)
    elif PHASE == _ROWS:
        _rows_tile(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, tl.program_id(0), M, n, sx, sr, sy, sh, eps, IS_RMS,
                   GEMMA, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N, LATE_WB)
    else:
        if PHASE == _COOP:
            t = tl.atomic_add(sync_ptr, 1)  # ticket in start order (see the module docstring)
        else:
            t = tl.program_id(0)
        _split_chunk(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, part_ptr, sync_ptr, t, N, C, stride_xm, stride_rm,
                     stride_ym, stride_hm, eps, IS_RMS, GEMMA, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, PHASE, BLOCK_N,
                     BLOCK_C)
