"""Mode "loop" of the residual-add + norm kernel (``norm.py``), phase by phase: a program
walks its row segment twice (pass 1: the statistics; pass 2: normalize and store), and a
split row's programs exchange their sums in between. A chunk's loads, stores and passes are
in ``_norm_chunk.py``; the inline PTX in ``_ptx.py``.

Knobs, as constexprs (``NormConfig`` names them):
  KEEP_ROW (``hints.keep_row``): pass 1 loads evict_last (pass 2 reads the lines again), what
    is never read again evict_first; DROP_Y (``drop_y``) the streamed y evict_first too.
  STORE_H (``reuse.store_h_early``, with a residual): pass 1 stores h = x + r, pass 2 re-reads
    h alone: half the bytes kept in L2. y is then normalized from h as stored (rounded, as
    PyTorch's ``x + residual`` is), so pass 1 sums the rounded h too.
  HOLD (``reuse.held_chunks``): the segment's first chunks stay in registers between passes.
  SMEM (``reuse.smem_segment``): the segment is copied into shared memory, both passes read
    it there; SMEM_PER_CHUNK sums each chunk as its copies land.
  WB_EARLY (``order.early_weight_chunks``): pass 2's first chunks' weight and bias are loaded
    before the exchange of sums (WB_WITH_COPIES: right after the copies are issued), so their
    L2 round trip overlaps the wait; otherwise pass 2 asks for each only after the previous
    chunk's store (a store may alias it).
  HALF_STEPS (with SMEM): pass 2 in steps of half a chunk, each step's weight and bias asked
    for 2 x WB_EARLY steps ahead: the look-ahead of NEXT_FIRST 2 in half the registers.
  NEXT_FIRST (``order.next_before_store``; 1: pass 1, 2: pass 2, 3: both): chunk k + 1's loads
    are issued before chunk k's stores.
  KEEP_WB (``hints.keep_weight``): the weight and bias loaded L1::evict_last.

LayerNorm sums d = h - c around c = the segment's first h (shifted data): with c within a
few standard deviations of the mean, sum(d^2) - sum(d)^2 / N does not cancel much, and y =
((h - c) - sum(d) / N) * rstd keeps the mean as the exact pair (c, sum(d) / N). Float32 inputs
take c = the mean of the segment's first chunk instead (a first value 4 standard deviations
out drew 4-7x PyTorch's float32 error).
"""

import triton
import triton.language as tl

from ._jit import cast_out
from ._norm_chunk import (_accumulate, _ahead_cols, _chunk_cols, _held_pass1, _load_h, _load_wb, _load_xr, _pass1_h,
                          _pass2_chunk, _pass2_src, _pre_wb, _row_sums, _tile_mask)
from ._norm_l2 import l2_ahead
from ._norm_smem import smem_copy, smem_sums, smem_sums_per_chunk
from ._ptx import cluster_arrive, cluster_share3, smem_base, smem_load_f32, smem_wait_all


@triton.jit
def _loop_shift(x_ptr, r_ptr, h_ptr, rows, M, col, N, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL: tl.constexpr,
                STORE_H: tl.constexpr, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr = 1):
    """LayerNorm's shift c (``_row_sums``' shape): the mean of h over the WIDTH columns from
    ``col`` that are inside the row (WIDTH 1: h[rows, col], 0.0 past the row's end), h
    rounded to its dtype with STORE_H (pass 1 then sums h as stored)."""
    cols = col + tl.arange(0, WIDTH)
    ok = _tile_mask(rows, M, cols < N, BLOCK_M)
    c = _load_h(x_ptr, r_ptr, h_ptr, rows, cols, ok, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL, False)
    if STORE_H:
        c = cast_out(c, h_ptr.dtype.element_ty).to(tl.float32)
    if WIDTH == 1:
        return _row_sums(c, BLOCK_M)
    return _row_sums(tl.where(ok, c, 0.0), BLOCK_M) / tl.maximum(_row_sums(ok.to(tl.float32), BLOCK_M), 1.0)


@triton.jit
def _pass1_smem(x_ptr, w_ptr, b_ptr, base, row, col0, N, SEG, c, stride_xm, HAS_WEIGHT: tl.constexpr,
                HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, SEG_N: tl.constexpr, SMEM_PER_CHUNK: tl.constexpr,
                WB_N: tl.constexpr, WB_K: tl.constexpr, WB_WITH_COPIES: tl.constexpr, WB_EV: tl.constexpr):
    """Pass 1 from shared memory over the segment's SEG (= SEG_N, a constant) columns: every
    copy issued, then (WB_WITH_COPIES)
    pass 2's first WB_K weight and bias loads, then the sums read back once the copies are in
    (SMEM_PER_CHUNK: chunk by chunk as each lands). Returns (sum d, sum d^2, early (w, b)s)."""
    smem_copy(base, x_ptr + row.to(tl.int64) * stride_xm + col0, SEG, BLOCK_N, SMEM_PER_CHUNK)
    wb = ()
    if WB_WITH_COPIES:
        wb = _pre_wb(w_ptr, b_ptr, col0, N, WB_N, True, HAS_WEIGHT, HAS_BIAS, WB_K, WB_EV)
    if SMEM_PER_CHUNK:
        s1, s2 = smem_sums_per_chunk(base, c, row, x_ptr, SEG_N // BLOCK_N, BLOCK_N)
    else:
        s1, s2 = smem_sums(base, c, smem_wait_all(row), x_ptr, SEG, BLOCK_N)
    return s1, s2, wb


@triton.jit
def _pass1_chunks(x_ptr, r_ptr, h_ptr, rows, M, col0, N, SEG, c, stride_xm, stride_rm, stride_hm,
                  HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr,
                  UNROLL: tl.constexpr, HOLD: tl.constexpr, STORE_H: tl.constexpr, NEXT_FIRST: tl.constexpr,
                  KEEP: tl.constexpr, DROP: tl.constexpr):
    """Pass 1 over the segment's chunks: the first HOLD kept in registers (read once, h
    stored), the rest loaded with KEEP for pass 2 (with STORE_H: h stored with KEEP, x and r
    dropped); per-lane sums of d = h - c and d^2. With a residual and NEXT_FIRST 1 or 3, every
    held chunk's loads and then the first streamed chunk's are issued before any h is stored,
    and chunk i + 1's before chunk i's h. Returns (sum d, sum d^2, held chunks)."""
    v1 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    v2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    PIPE1: tl.constexpr = NEXT_FIRST % 2 == 1 and HAS_RESIDUAL
    EV1: tl.constexpr = DROP if STORE_H else KEEP
    held = ()
    held_xr = ()  # PIPE1: the held chunks' x and r, loaded before any h is stored
    if PIPE1:
        for k in tl.static_range(HOLD):
            cols, col_ok = _chunk_cols(col0, k * BLOCK_N, N, BLOCK_N, EVEN)
            mask = _tile_mask(rows, M, col_ok, BLOCK_M)
            held_xr = held_xr + (_load_xr(x_ptr, r_ptr, rows, cols, mask, stride_xm, stride_rm, HAS_RESIDUAL,
                                          DROP),)
        cols, col_ok = _ahead_cols(col0, HOLD * BLOCK_N, N, SEG, BLOCK_N, EVEN)
        xn, rn = _load_xr(x_ptr, r_ptr, rows, cols, _tile_mask(rows, M, col_ok, BLOCK_M), stride_xm, stride_rm,
                          HAS_RESIDUAL, EV1)
    for k in tl.static_range(HOLD):
        hk, d = _held_pass1(x_ptr, r_ptr, h_ptr, rows, M, col0, k * BLOCK_N, N, c, stride_xm, stride_rm,
                            stride_hm, HAS_RESIDUAL, STORE_H, BLOCK_M, BLOCK_N, EVEN, DROP,
                            held_xr[k] if PIPE1 else None, PIPE1)
        held = held + (hk,)
        v1, v2 = _accumulate(v1, v2, d)
    for i in tl.range(HOLD * BLOCK_N, SEG, BLOCK_N, loop_unroll_factor=UNROLL):
        cols, col_ok = _chunk_cols(col0, i, N, BLOCK_N, EVEN)
        mask = _tile_mask(rows, M, col_ok, BLOCK_M)
        if PIPE1:  # this chunk's x and r came in the last iteration; the next one's go out now
            xs = xn
            rs = rn
            ncols, ncol_ok = _ahead_cols(col0, i + BLOCK_N, N, SEG, BLOCK_N, EVEN)
            xn, rn = _load_xr(x_ptr, r_ptr, rows, ncols, _tile_mask(rows, M, ncol_ok, BLOCK_M), stride_xm,
                              stride_rm, HAS_RESIDUAL, EV1)
        else:
            xs, rs = _load_xr(x_ptr, r_ptr, rows, cols, mask, stride_xm, stride_rm, HAS_RESIDUAL, EV1)
        h = _pass1_h(xs, rs, h_ptr, rows, cols, mask, stride_hm, HAS_RESIDUAL, STORE_H, KEEP)
        v1, v2 = _accumulate(v1, v2, tl.where(mask, h - c, 0.0))
    return _row_sums(v1, BLOCK_M), _row_sums(v2, BLOCK_M), held


@triton.jit
def _wait_row(counter_ptr, count):
    """Count this program in on its row and wait until ``count`` programs are in: its
    partials made visible first (barrier, then a release by the counter update), the spin
    on acquire loads, a barrier again so every thread reads the partials after it."""
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="release") + 1
    while arrived < count:
        arrived = tl.atomic_add(counter_ptr, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def _split_combine(part_ptr, row, N, SEG, SPLIT: tl.constexpr, IS_RMS: tl.constexpr, CLUSTER: tl.constexpr):
    """A row's statistics from the partials (c_j, s1_j, s2_j) of its SPLIT segments (sums of
    d = h - c_j over n_j columns), moved to the common shift c_0:
        S1 = sum_j s1_j + n_j (c_j - c_0),   S2 = sum_j s2_j + (c_j - c_0)(2 s1_j + n_j (c_j - c_0)).
    Each segment shifts by its own first value: with h written over the residual another
    segment's first value may already be overwritten when it is read. The partials come from
    global memory, or with CLUSTER from shared memory at ``part_ptr`` (value k of rank j at
    4 (16 k + j)). Returns (c_0, S1, S2); RMSNorm sums s2 alone."""
    BLOCK_S: tl.constexpr = 2 if SPLIT <= 2 else (4 if SPLIT <= 4 else (8 if SPLIT <= 8 else 16))
    j = tl.arange(0, BLOCK_S)
    ok = j < SPLIT
    if CLUSTER:
        slot = part_ptr + 4 * j
        s2 = tl.where(ok, smem_load_f32(slot + 128), 0.0)
        cj = tl.where(ok, smem_load_f32(slot), 0.0)
        s1 = tl.where(ok, smem_load_f32(slot + 64), 0.0)
    else:
        pp = part_ptr + (row.to(tl.int64) * SPLIT + j) * 3  # (BLOCK_S,)
        s2 = tl.load(pp + 2, mask=ok, other=0.0, volatile=True)
        cj = tl.load(pp, mask=ok, other=0.0, volatile=True)
        s1 = tl.load(pp + 1, mask=ok, other=0.0, volatile=True)
    if IS_RMS:
        return 0.0, 0.0, tl.sum(s2)
    nj = tl.minimum(tl.maximum(N - j * SEG, 0), SEG).to(tl.float32)
    c0 = tl.sum(tl.where(j == 0, cj, 0.0))
    dc = tl.where(ok, cj - c0, 0.0)
    return c0, tl.sum(s1 + nj * dc), tl.sum(s2 + dc * (2.0 * s1 + nj * dc))


@triton.jit
def _exchange_sums(c, s1, s2, part_ptr, sync_ptr, xbuf, row, seg, N, SEG, SPLIT: tl.constexpr,
                   IS_RMS: tl.constexpr, CLUSTER: tl.constexpr, PASSES: tl.constexpr):
    """The row's (c, S1, S2) from its SPLIT programs' partials. CLUSTER: through the cluster's
    shared memory (``xbuf``: ``cluster_arrive``'s buffer). Else through global memory
    (``part_ptr``: (M, SPLIT, 3) float32): each program stores its partials and (PASSES 0)
    waits on the row's counter, as mode "coop" does; PASSES 1 only stores (the first of the
    interpreter's two launches), PASSES 2 only combines (the second)."""
    if CLUSTER:
        c, s1, s2 = _split_combine(cluster_share3(c, s1, s2, SPLIT, xbuf), row, N, SEG, SPLIT, IS_RMS, True)
    else:
        if PASSES != 2:
            part = part_ptr + (row.to(tl.int64) * SPLIT + seg) * 3
            if not IS_RMS:
                tl.store(part, c)
                tl.store(part + 1, s1)
            tl.store(part + 2, s2)
        if PASSES == 0:
            _wait_row(sync_ptr + 1 + row, SPLIT)
        if PASSES != 1:
            c, s1, s2 = _split_combine(part_ptr, row, N, SEG, SPLIT, IS_RMS, False)
    return c, s1, s2


@triton.jit
def _sums_rstd(s1, s2, N, eps, IS_RMS: tl.constexpr):
    """(mean_lo, rstd) of a row from its sums of d = h - c and d^2 over N columns: mean_lo =
    S1 / N (the mean is c + mean_lo), rstd = 1 / sqrt(S2 / N - mean_lo^2 + eps); RMSNorm:
    (S1 / N, 1 / sqrt(S2 / N + eps)) with c = 0."""
    mean_lo = s1 / N
    if IS_RMS:
        rstd = tl.rsqrt(s2 / N + eps)
    else:
        rstd = tl.rsqrt(tl.maximum(s2 / N - mean_lo * mean_lo, 0.0) + eps)
    return mean_lo, rstd


@triton.jit
def _pass2_half_steps(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, wb, base, rows, M, col0, N, c, rstd, mean_lo,
                      stride_xm, stride_rm, stride_ym, stride_hm, IS_RMS: tl.constexpr, GEMMA: tl.constexpr,
                      HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SEG_N: tl.constexpr, WB_K: tl.constexpr,
                      WB_EV: tl.constexpr, STORE_H: tl.constexpr, DROP: tl.constexpr, DROP_Y: tl.constexpr,
                      FMA: tl.constexpr):
    """Pass 2 from shared memory over the segment's SEG_N columns in steps of BLOCK_N / 2, each
    step's weight and bias asked
    for WB_K steps ahead, before the stores of the steps between (``wb``: steps 0 .. WB_K - 1,
    asked for early)."""
    H: tl.constexpr = BLOCK_N // 2
    STEPS: tl.constexpr = 2 * SEG_N // BLOCK_N
    ahead = wb
    for s in tl.static_range(STEPS):
        if s + WB_K < STEPS:
            hcols, hok = _chunk_cols(col0, (s + WB_K) * H, N, H, True)
            ahead = ahead + (_load_wb(w_ptr, b_ptr, hcols, hok, HAS_WEIGHT, HAS_BIAS, WB_EV),)
        w, b = ahead[s]
        _pass2_chunk(x_ptr, r_ptr, y_ptr, h_ptr, w, b, 0.0, base, rows, M, col0, s * H, N, c, rstd, mean_lo,
                     stride_xm, stride_rm, stride_ym, stride_hm, IS_RMS, GEMMA, HAS_RESIDUAL, HAS_WEIGHT,
                     HAS_BIAS, BLOCK_M, H, True, False, True, STORE_H, DROP, DROP_Y, FMA)


@triton.jit
def _pass2_chunks(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, wb, held, base, rows, M, col0, N, SEG, c, rstd, mean_lo,
                  stride_xm, stride_rm, stride_ym, stride_hm, IS_RMS: tl.constexpr, GEMMA: tl.constexpr,
                  HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr, UNROLL: tl.constexpr,
                  HOLD: tl.constexpr, WB_EARLY: tl.constexpr, WB_EV: tl.constexpr, SMEM: tl.constexpr,
                  STORE_H: tl.constexpr, NEXT_FIRST: tl.constexpr, DROP: tl.constexpr, DROP_Y: tl.constexpr,
                  FMA: tl.constexpr):
    """Pass 2 chunk by chunk: first the held chunks and those whose weight came early (``wb``),
    then the rest streamed; with NEXT_FIRST 2 or 3 the next chunk's weight, bias and h (or x
    and r) are loaded before this chunk's y is stored."""
    PEEL: tl.constexpr = HOLD if HOLD > WB_EARLY else WB_EARLY
    PIPE2: tl.constexpr = NEXT_FIRST >= 2
    if PIPE2:  # the first streamed chunk's loads, before the peeled chunks' stores
        cols, col_ok = _ahead_cols(col0, PEEL * BLOCK_N, N, SEG, BLOCK_N, EVEN)
        mask = _tile_mask(rows, M, col_ok, BLOCK_M)
        wn, bn = _load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT, HAS_BIAS, WB_EV)
        xn, rn = _pass2_src(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL,
                            SMEM, STORE_H, DROP)
    for k in tl.static_range(PEEL):
        if k < WB_EARLY:
            w, b = wb[k]
        else:
            cols, col_ok = _chunk_cols(col0, k * BLOCK_N, N, BLOCK_N, EVEN)
            w, b = _load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT, HAS_BIAS, WB_EV)
        _pass2_chunk(x_ptr, r_ptr, y_ptr, h_ptr, w, b, held[k] if k < HOLD else 0.0, base, rows, M, col0,
                     k * BLOCK_N, N, c, rstd, mean_lo, stride_xm, stride_rm, stride_ym, stride_hm, IS_RMS, GEMMA,
                     HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N, EVEN, k < HOLD, SMEM, STORE_H, DROP,
                     DROP_Y, FMA)
    for i in tl.range(PEEL * BLOCK_N, SEG, BLOCK_N, loop_unroll_factor=UNROLL):
        if PIPE2:  # this chunk's loads came in the last iteration; the next one's go out before y's store
            w = wn
            b = bn
            src = (xn, rn)
            cols, col_ok = _ahead_cols(col0, i + BLOCK_N, N, SEG, BLOCK_N, EVEN)
            mask = _tile_mask(rows, M, col_ok, BLOCK_M)
            wn, bn = _load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT, HAS_BIAS, WB_EV)
            xn, rn = _pass2_src(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL,
                                SMEM, STORE_H, DROP)
        else:  # _pass2_chunk loads the chunk's h (or x and r) itself
            cols, col_ok = _chunk_cols(col0, i, N, BLOCK_N, EVEN)
            w, b = _load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT, HAS_BIAS, WB_EV)
            src = 0.0
        _pass2_chunk(x_ptr, r_ptr, y_ptr, h_ptr, w, b, src, base, rows, M, col0, i, N, c, rstd, mean_lo,
                     stride_xm, stride_rm, stride_ym, stride_hm, IS_RMS, GEMMA, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS,
                     BLOCK_M, BLOCK_N, EVEN, False, SMEM, STORE_H, DROP, DROP_Y, FMA, PIPE2)


@triton.jit
def _loop_row(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, part_ptr, sync_ptr, row, seg, M, N, SEG,
              stride_xm, stride_rm, stride_ym, stride_hm, eps,
              IS_RMS: tl.constexpr, GEMMA: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
              HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SEG_N: tl.constexpr,
              EVEN: tl.constexpr,
              UNROLL: tl.constexpr, SPLIT: tl.constexpr, CLUSTER: tl.constexpr, PASSES: tl.constexpr,
              KEEP_ROW: tl.constexpr, DROP_Y: tl.constexpr, KEEP_WB: tl.constexpr, HOLD: tl.constexpr,
              STORE_H: tl.constexpr, SMEM: tl.constexpr, SMEM_PER_CHUNK: tl.constexpr, WB_EARLY: tl.constexpr,
              WB_WITH_COPIES: tl.constexpr, HALF_STEPS: tl.constexpr, NEXT_FIRST: tl.constexpr, FMA: tl.constexpr,
              AHEAD: tl.constexpr, LANES: tl.constexpr):
    """Mode "loop": program ``seg`` of row ``row`` (BLOCK_M rows from ``row * BLOCK_M`` when
    SPLIT is 1) over the SEG columns from ``seg * SEG`` (SEG_N: SEG as a constant, or 0), in
    chunks of BLOCK_N. PASSES 0 runs
    every phase; under the interpreter a split row's programs cannot wait on each other, so
    PASSES 1 runs pass 1 and stores the partials, PASSES 2 combines them and runs pass 2.

    1. pass 1: the sums of d = h - c and d^2 (LayerNorm's shift c first);
    2. read-ahead: AHEAD > 0 asks the L2 for this segment of the row AHEAD rows on;
    3. pass 2's first WB_EARLY chunks' weight and bias, asked for before the wait;
    4. SPLIT > 1: the exchange of the row's sums;
    5. pass 2: y = norm(h) (and h) stored, chunk by chunk or in half steps.
    """
    xbuf = 0
    if CLUSTER:
        xbuf = cluster_arrive(row)  # first thing: cluster_share3's wait pairs with this arrival
    KEEP: tl.constexpr = "evict_last" if KEEP_ROW else ""
    DROP: tl.constexpr = "evict_first" if KEEP_ROW else ""
    DROP_STREAMED_Y: tl.constexpr = "evict_first" if KEEP_ROW and DROP_Y else ""
    WB_EV: tl.constexpr = "evict_last" if KEEP_WB else ""
    WB_N: tl.constexpr = BLOCK_N // 2 if HALF_STEPS else BLOCK_N  # the early weight and bias loads' width
    WB_K: tl.constexpr = 2 * WB_EARLY if HALF_STEPS else WB_EARLY  # and how many
    tl.static_assert(not SMEM or (BLOCK_M == 1 and not HAS_RESIDUAL and EVEN and HOLD == 0 and SEG_N > 0),
                     "the shared-memory segment takes a dense row's segment of whole chunks, no residual, none held")
    tl.static_assert(not HALF_STEPS or (SMEM and NEXT_FIRST < 2), "half steps are pass 2 from shared memory")
    tl.static_assert(SPLIT == 1 or BLOCK_M == 1, "a split row is one row a program")
    rows = row * BLOCK_M + tl.arange(0, BLOCK_M)
    col0 = seg * SEG
    base = 0
    if SMEM:
        base = smem_base(row)  # column col0 + j of the row at base + 2 j
    c = 0.0
    s1 = 0.0
    s2 = 0.0
    held = ()  # pass 1's HOLD chunks, for pass 2
    wb = ()  # pass 2's first chunks' (weight, bias), asked for early
    if PASSES != 2:  # 1. pass 1
        if not IS_RMS:
            c = _loop_shift(x_ptr, r_ptr, h_ptr, rows, M, col0, N, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL,
                            STORE_H, BLOCK_M, BLOCK_N if x_ptr.dtype.element_ty == tl.float32 else 1)
            if STORE_H or HOLD > 0:
                # Pass 1 may store h over the residual (residual_out=residual) at col0: every
                # thread's load of c is performed before any thread's store (bar.sync orders them).
                tl.debug_barrier()
        if SMEM:
            s1, s2, wb = _pass1_smem(x_ptr, w_ptr, b_ptr, base, row, col0, N, SEG, c, stride_xm, HAS_WEIGHT,
                                     HAS_BIAS, BLOCK_N, SEG_N, SMEM_PER_CHUNK, WB_N, WB_K, WB_WITH_COPIES, WB_EV)
        else:
            s1, s2, held = _pass1_chunks(x_ptr, r_ptr, h_ptr, rows, M, col0, N, SEG, c, stride_xm, stride_rm,
                                         stride_hm, HAS_RESIDUAL, BLOCK_M, BLOCK_N, EVEN, UNROLL, HOLD, STORE_H,
                                         NEXT_FIRST, KEEP, DROP)
    if AHEAD > 0:  # 2. pass 1's reads are in: HBM reads ahead while the sums travel and y is written
        tl.static_assert(EVEN and BLOCK_M == 1, "read-ahead takes dense rows of whole segments, a row a program")
        l2_ahead(x_ptr, r_ptr, row + AHEAD, M, col0, stride_xm, stride_rm, HAS_RESIDUAL, SEG, LANES)
    if PASSES != 1 and not (SMEM and WB_WITH_COPIES):  # 3. pass 2's first weights travel while the sums do
        wb = _pre_wb(w_ptr, b_ptr, col0, N, WB_N, EVEN, HAS_WEIGHT, HAS_BIAS, WB_K, WB_EV)
    if SPLIT > 1:  # 4.
        c, s1, s2 = _exchange_sums(c, s1, s2, part_ptr, sync_ptr, xbuf, row, seg, N, SEG, SPLIT, IS_RMS, CLUSTER,
                                   PASSES)
    if PASSES != 1:  # 5. pass 2
        mean_lo, rstd = _sums_rstd(s1, s2, N, eps, IS_RMS)
        if STORE_H:
            tl.debug_barrier()  # pass 2 reads h as this program's other threads stored it
        if HALF_STEPS:
            _pass2_half_steps(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, wb, base, rows, M, col0, N, c, rstd, mean_lo,
                              stride_xm, stride_rm, stride_ym, stride_hm, IS_RMS, GEMMA, HAS_RESIDUAL, HAS_WEIGHT,
                              HAS_BIAS, BLOCK_M, BLOCK_N, SEG_N, WB_K, WB_EV, STORE_H, DROP, DROP_STREAMED_Y, FMA)
        else:
            _pass2_chunks(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, wb, held, base, rows, M, col0, N, SEG, c, rstd,
                          mean_lo, stride_xm, stride_rm, stride_ym, stride_hm, IS_RMS, GEMMA, HAS_RESIDUAL,
                          HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N, EVEN, UNROLL, HOLD, WB_EARLY, WB_EV, SMEM,
                          STORE_H, NEXT_FIRST, DROP, DROP_STREAMED_Y, FMA)
