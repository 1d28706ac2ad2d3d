"""Jit helpers of the residual-add + norm kernel (``norm.py``): mode "loop"'s row walk
(``_loop_row``) and the exchange of a split row's sums (see norm.py's docstring for the
modes); a chunk's loads, stores and passes are in ``_norm_chunk.py``."""

import triton
import triton.language as tl

from ._cluster import cluster_arrive, share3, smem_load
from ._jit import cast_out
from ._l2_ahead import l2_ahead
from ._norm_chunk import (_accumulate, _ahead_cols, _chunk_cols, _held_pass1, _load_h, _load_wb, _load_xr, _pass1_h,
                          _pass2_chunk, _pass2_src, _pre_wb, _row_sums, _tile_mask)
from ._shelf import shelf_base, shelf_copy, shelf_sums, shelf_sums_piped, shelf_wait
from ._stamp import stamp_phase, stamp_start


@triton.jit
def _loop_shift(x_ptr, r_ptr, h_ptr, rows, M, col, N, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL: tl.constexpr,
                STASH: tl.constexpr, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr = 1):
    """LayerNorm's shift c (``_row_sums``' shape): the mean of h over the WIDTH columns from
    ``col`` that are inside the row (WIDTH 1: h[rows, col], 0.0 past the row's end), h
    rounded to its dtype when STASH (pass 1 then sums h as stored)."""
    cols = col + tl.arange(0, WIDTH)
    ok = _tile_mask(rows, M, cols < N, BLOCK_M)
    c = _load_h(x_ptr, r_ptr, h_ptr, rows, cols, ok, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL, False)
    if STASH:
        c = cast_out(c, h_ptr.dtype.element_ty).to(tl.float32)
    if WIDTH == 1:
        return _row_sums(c, BLOCK_M)
    return _row_sums(tl.where(ok, c, 0.0), BLOCK_M) / tl.maximum(_row_sums(ok.to(tl.float32), BLOCK_M), 1.0)


@triton.jit
def _split_combine(part_ptr, row, N, SEG, SPLIT: tl.constexpr, BLOCK_S: tl.constexpr, IS_RMS: tl.constexpr,
                   CLUSTER: tl.constexpr = False):
    """A row's statistics from the partials (c_j, s1_j, s2_j) of its SPLIT segments (sums of
    d = h - c_j over n_j columns): moved to the common shift c_0,
        S1 = sum_j s1_j + n_j (c_j - c_0),   S2 = sum_j s2_j + (c_j - c_0)(2 s1_j + n_j (c_j - c_0)).
    Every segment shifts by its own first value because with the stash (and h written over
    the residual) another segment's first value may already be overwritten when it is read.
    The partials come from global memory, or with CLUSTER from this CTA's shared memory at
    address ``part_ptr`` (``_cluster.share3``'s buffer). Returns (c_0, S1, S2); RMSNorm sums
    s2 alone."""
    j = tl.arange(0, BLOCK_S)
    ok = j < SPLIT
    if CLUSTER:
        slot = part_ptr + 4 * j  # (BLOCK_S,) shared addresses of value 0; value k at + 64 k
        s2 = tl.where(ok, smem_load(slot + 128), 0.0)
        cj = tl.where(ok, smem_load(slot), 0.0)
        s1 = tl.where(ok, smem_load(slot + 64), 0.0)
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
def _ahead(x_ptr, r_ptr, row, M, col0, stride_xm, stride_rm, HAS_RESIDUAL: tl.constexpr, EVEN: tl.constexpr,
           BLOCK_M: tl.constexpr, SEG: tl.constexpr, LANES: tl.constexpr):
    """Ask the L2 for the segment of x (and r) of row ``row`` (``_l2_ahead``)."""
    tl.static_assert(EVEN and BLOCK_M == 1, "read-ahead takes dense rows of whole segments, a row a program")
    l2_ahead(x_ptr, row, M, col0, stride_xm, SEG, LANES)
    if HAS_RESIDUAL:
        l2_ahead(r_ptr, row, M, col0, stride_rm, SEG, LANES)


@triton.jit
def _loop_row(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, part_ptr, sync_ptr, row, seg, M, N, SEG,
              stride_xm, stride_rm, stride_ym, stride_hm, eps,
              IS_RMS: tl.constexpr, GEMMA: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
              HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HINTS: tl.constexpr,
              STASH: tl.constexpr, VEC: tl.constexpr, UNROLL: tl.constexpr, SPLIT: tl.constexpr,
              BLOCK_S: tl.constexpr, LOOP_PART: tl.constexpr, EVEN: tl.constexpr, HOLD: tl.constexpr = 0,
              DROP_Y: tl.constexpr = False, CLUSTER: tl.constexpr = False, SHELF: tl.constexpr = False,
              FOLD: tl.constexpr = False, PF: tl.constexpr = 0, PF_LANES: tl.constexpr = 32,
              WB_PRE: tl.constexpr = 0, WB_EARLY: tl.constexpr = False, PIPE: tl.constexpr = 0,
              TRACE: tl.constexpr = False, SHELF_PIPE: tl.constexpr = 0, WB_LAST: tl.constexpr = False,
              WB_MIX: tl.constexpr = False, HALF_STEPS: tl.constexpr = 0):
    """Mode "loop": a program per BLOCK_M rows (per segment of SEG columns of a row with
    SPLIT > 1), two passes over its chunks of BLOCK_N. Pass 1 sums the statistics; pass 2
    reads each chunk again, which a row of <= 512 KB finds in L2 (two programs an SM hold
    132 x 2 x 256 KB at 64K wide: 68 MB for the H200's 60 MB L2, most of it), and writes h
    and y. BLOCK_M > 1: the rows share each chunk's weight (and bias) loads in pass 2.

    SPLIT > 1: the SPLIT programs of a row exchange their partial sums between the passes
    (``_split_combine``): each waits on a per-row counter, as mode "coop" does (LOOP_PART 0),
    so a program holds SPLIT times fewer bytes in L2 for SPLIT times less time. CLUSTER
    (Hopper): the row's programs are one thread-block cluster and exchange their sums
    through distributed shared memory instead (``_cluster``): no atomics, no polling. Under the
    interpreter, which cannot wait on a sibling, the passes run as two launches instead:
    LOOP_PART 1 (pass 1, partials stored) and 2 (partials combined, pass 2).

    HINTS: pass 1 loads with evict_last (the lines are read again), pass 2's loads, the
    stores of h and the y of held chunks with evict_first (never read again), so the row
    being re-read is the last thing the L2 gives up. DROP_Y: the y of the streamed chunks
    evict_first too (without it, no hint): on an H200 +1 to +3 points of copy without a
    residual at 64K-256K, -1.5 with one at 64K (benchmarks/NOTES.md, thirteenth session).
    STASH (with a residual): pass 1 also stores h = x + r (evict_last) and pass 2 re-reads
    h alone: half the bytes kept in L2 between the passes, the same bytes to HBM; y is
    then normalized from h as stored (rounded to its dtype, as PyTorch's ``x + residual``
    is), so pass 1 takes its statistics from the rounded h too.

    HOLD (0-2): the segment's first HOLD chunks stay in registers between the passes (read
    once, evict_first; pass 2 takes them from there), so the row keeps HOLD chunks fewer in
    L2. Nsight Compute on the H200: the loop reads each byte once from DRAM at 32K-64K
    (rms_norm), but 1.13x at 128K and 1.24-1.27x for layer_norm at 64K-128K, where the rows
    in flight (132-264 programs) pass ~30 MB.

    TRACE (a cluster's programs; ``_stamp``): each program stores its SM, row, segment and the
    time it started, had its partial sums (pass 1's loads in), had the row's (the exchange
    done) and had issued its last store, at part_ptr (int64, 12 a program): the phases of
    ``benchmarks/norm_timeline.py``'s picture. Without it nothing of this is compiled.

    SHELF (one row a program, dense 16-bit rows without a residual, EVEN; ``_shelf``): the
    segment is copied into shared memory at once, the statistics and pass 2 read it there:
    nothing of the row is read twice, and HOLD does not apply. SHELF_PIPE (the segment's
    chunks, 0: off): each chunk's copies are a group, summed as soon as it lands.

    WB_PRE (0-4): the weight (and bias) of pass 2's first WB_PRE chunks are loaded before
    the exchange of sums (WB_EARLY, with the shelf: right after its copies are issued), so
    their L2 round trip overlaps the wait for the row's other programs instead of following
    it. Pass 2 otherwise asks for a chunk's weight only after storing the previous chunk's
    y (a store may alias it), one L2 round trip a chunk; where the row's programs all reach
    pass 2 together (64 rows of 256K: one wave and a half) those trips are the kernel's
    tail. On an H100 (thirty-first session, tune_ops): rms_norm 64 x 256K on the shelf
    82.6 -> 85.5% (two chunks, early), add_rms_norm 256K 93.7 -> 94.8 (two), rms_norm 256K
    +0.5-0.7 (one), layer_norm 128K +1.1 (one, early), and add_layer_norm 256K as a cluster
    of 16 with nothing held 88.3 -> 92.5 (two: beside a held chunk its weight and bias did
    not fit); LayerNorm's 64-row shelf lost 0.4-2.5 (its weight and bias take twice the
    registers under its cap of 48).

    WB_MIX (with WB_EARLY): only the first chunk's weight and bias go out with the copies; the
    others' once the shelf's sums are in, when pass 1's accumulators no longer hold registers.
    Two chunks this way fit LayerNorm's 256K shelf under its cap of 48 (both with the copies
    spilled 6 bytes): 94.5 -> 95.1% at 256 x 256K, level on 64 rows (H100, thirty-ninth session).
    No pick takes it now: HALF_STEPS (below) replaced it on the H100 and then on the H200.

    HALF_STEPS (the shelf, no WB_MIX, HOLD or pass 2's PIPE; 0: off): pass 2 walks the segment in
    HALF_STEPS steps of BLOCK_N / 2 and asks for each step's weight and bias 2 x WB_PRE steps
    ahead (the early ones, WB_PRE chunks' worth, are then loaded as half steps too), before the
    stores of the steps between. The same look-ahead as pipe 2's next chunk, in registers a step
    wide instead of a chunk: LayerNorm's 256K shelf keeps 48 registers, no spills (pipe 2 needs
    56). On an H100 (thirty-ninth session, ops bench) layer_norm 64 x 256K 87.9-88.0 -> 89.4%,
    256 x 256K 95.0-95.1 -> 95.3.

    WB_LAST: every weight and bias load carries an L1::evict_last hint, so that the L1 gives up
    the row's own lines before them (the shelf's copies, ``cp.async.ca``, pass through it; so do
    x, r and h's loads): on an H100 (ops bench) layer_norm 64 x 256K 86.4 -> 87.6%, 512 x 128K
    95.7 -> 96.3 (thirty-seventh session), add_rms_norm 64 x 256K 92.7-92.8 -> 94.6-94.9,
    add_layer_norm 89.4-89.9 -> 90.6-90.9 (thirty-eighth); the L1 hits of LayerNorm's shelf rise
    only from 15.5 to 16.8% of those loads' sectors (the CTAs of an SM seldom meet the same lines
    in time).

    PIPE (1: pass 1, 2: pass 2, 3: both): chunk k+1's loads are issued at the top of
    iteration k, before chunk k's stores, which would otherwise hold them back for the same
    aliasing reason: one chunk in flight a program and, between chunks, none. Pass 1 stores
    (h) only with a residual, so only then does its PIPE act; it also issues every held
    chunk's loads and the first streamed chunk's before any h is stored. Pass 2's carries
    the next chunk's weight and bias, and its h (stash) or x and r. On an H100 (thirty-second
    session): add_rms_norm 256K 94.6 -> 96.4% (pass 1's), add_layer_norm 256K 91.8 -> 93.5,
    rms_norm's shelf 85.8 -> 87.1 on 64 rows (pass 2's); the registers it adds cost a CTA an
    SM or spill elsewhere (the 32-register clusters, LayerNorm's shelf).

    LayerNorm sums d = h - c around c = the segment's first h (the shifted-data algorithm):
    with c within a few standard deviations of the mean, sum(d^2) - sum(d)^2 / N does not
    cancel much, and y = ((h - c) - sum(d) / N) * rstd keeps the mean as the exact pair (c,
    sum(d) / N). Much is too much for float32 outputs: a first value 4 standard deviations
    out drew 4-7x PyTorch's float32 error (N(0, 1) rows, 1023 wide, interpreter; 2.4x with no
    outlier on an H100). Float32 inputs (MEAN_SHIFT) take c = the mean of the segment's
    first chunk instead, within ~std / sqrt(BLOCK_N) of the row's mean, for one more load of
    that chunk and a block reduction (16-bit outputs round the difference away). A running
    Chan combine of chunk means instead drew 2.8x PyTorch's float32 error on rows 100
    standard deviations from zero (5000 wide, chunks of 128: ~40 roundings of a mean near
    100)."""
    WB_N: tl.constexpr = BLOCK_N // 2 if HALF_STEPS > 0 else BLOCK_N  # the early weight and bias loads' width
    WB_K: tl.constexpr = 2 * WB_PRE if HALF_STEPS > 0 else WB_PRE  # and how many
    tl.static_assert(HALF_STEPS == 0 or (SHELF and not WB_MIX and HOLD == 0 and PIPE < 2),
                     "half steps are the shelf's pass 2, without wb_mix, held chunks or pass 2's pipe")
    KEEP: tl.constexpr = "evict_last" if HINTS else ""
    WB_EV: tl.constexpr = "evict_last" if WB_LAST else ""  # the weight and bias's loads
    MEAN_SHIFT: tl.constexpr = x_ptr.dtype.element_ty == tl.float32
    DROP: tl.constexpr = "evict_first" if HINTS else ""
    tl.static_assert(not SHELF or (BLOCK_M == 1 and not HAS_RESIDUAL and EVEN and HOLD == 0),
                     "the shelf takes a dense row's segment of whole chunks, no residual, nothing held")
    DROP_STREAMED_Y: tl.constexpr = "evict_first" if HINTS and DROP_Y else ""
    tl.static_assert(SPLIT == 1 or BLOCK_M == 1, "a split row is one row a program")
    if CLUSTER:
        xbuf = cluster_arrive(row)  # first thing: share3's wait pairs with this arrival
    tl.static_assert(not TRACE or CLUSTER, "stamps are stored where a cluster's programs keep no partials")
    if TRACE:
        stamp_start(part_ptr, row * SPLIT + seg, row, seg)
    rows = row * BLOCK_M + tl.arange(0, BLOCK_M)
    col0 = seg * SEG
    base = 0
    if SHELF:
        base = shelf_base(row)  # column col0 + j of the row at base + 2 j
    c = 0.0
    s1 = 0.0
    s2 = 0.0
    held = ()  # pass 1's HOLD chunks, for pass 2
    wb = ()  # pass 2's first WB_PRE chunks' (weight, bias), asked for before the exchange
    if LOOP_PART != 2:
        if not IS_RMS:
            # (Taking c from the first chunk instead of this load of its own, with the chunk
            # peeled off the loop, measured -4 to +3 points: 16K / 32K wide, H200.)
            c = _loop_shift(x_ptr, r_ptr, h_ptr, rows, M, col0, N, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL,
                            STASH, BLOCK_M, BLOCK_N if MEAN_SHIFT else 1)
            if STASH or HOLD > 0:
                # Pass 1 may store h over the residual (residual_out=residual) at col0: every
                # thread's load of c is performed before any thread's store (bar.sync orders them).
                tl.debug_barrier()
        if SHELF:  # every copy issued, then one wait (SHELF_PIPE: one a chunk); the sums read back from the shelf
            shelf_copy(base, x_ptr + row.to(tl.int64) * stride_xm + col0, SEG, BLOCK_N, SHELF_PIPE > 0)
            if WB_EARLY:  # WB_MIX: the first chunk's now, the rest once the sums are in (below)
                wb = _pre_wb(w_ptr, b_ptr, col0, N, WB_N, EVEN, HAS_WEIGHT, HAS_BIAS, 1 if WB_MIX else WB_K,
                             WB_EV)
            if SHELF_PIPE > 0:  # each chunk summed as it lands
                s1, s2 = shelf_sums_piped(base, c, row, x_ptr, SHELF_PIPE, BLOCK_N)
            else:
                s1, s2 = shelf_sums(base, c, shelf_wait(row), x_ptr, SEG, BLOCK_N)
        else:
            if VEC:  # per-lane partial sums, reduced once after the loop
                v1 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
                v2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            else:  # a block-wide sum per chunk
                v1 = _row_sums(tl.zeros((BLOCK_M, 1), tl.float32), BLOCK_M)
                v2 = _row_sums(tl.zeros((BLOCK_M, 1), tl.float32), BLOCK_M)
            # PIPE 1 (pass 1 stores h only with a residual): every held chunk's loads, then the
            # first streamed chunk's, are issued before any h is stored; then chunk i + 1's
            # loads before chunk i's h
            PIPE1: tl.constexpr = PIPE % 2 == 1 and HAS_RESIDUAL
            EV1: tl.constexpr = DROP if STASH else KEEP
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
                                    stride_hm, HAS_RESIDUAL, STASH, BLOCK_M, BLOCK_N, EVEN, DROP,
                                    held_xr[k] if PIPE1 else None, PIPE1)
                held = held + (hk,)
                v1, v2 = _accumulate(v1, v2, d, VEC, BLOCK_M)
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
                h = _pass1_h(xs, rs, h_ptr, rows, cols, mask, stride_hm, HAS_RESIDUAL, STASH, KEEP)
                v1, v2 = _accumulate(v1, v2, tl.where(mask, h - c, 0.0), VEC, BLOCK_M)
            if VEC:
                s1 = _row_sums(v1, BLOCK_M)
                s2 = _row_sums(v2, BLOCK_M)
            else:
                s1 = v1
                s2 = v2
    if TRACE:
        stamp_phase(part_ptr, row * SPLIT + seg, 1, s2)
    if PF > 0:  # pass 1's reads are in: the HBM reads ahead while the sums travel and y is written
        _ahead(x_ptr, r_ptr, row + PF, M, col0, stride_xm, stride_rm, HAS_RESIDUAL, EVEN, BLOCK_M, SEG, PF_LANES)
    if LOOP_PART != 1 and not (SHELF and WB_EARLY):  # pass 2's first weights travel while the sums do
        wb = _pre_wb(w_ptr, b_ptr, col0, N, WB_N, EVEN, HAS_WEIGHT, HAS_BIAS, WB_K, WB_EV)
    elif LOOP_PART != 1 and WB_MIX:  # the shelf's sums are in: its accumulators' registers are free
        wb = wb + _pre_wb(w_ptr, b_ptr, col0, N, BLOCK_N, EVEN, HAS_WEIGHT, HAS_BIAS, WB_PRE, WB_EV, START=1)
    if SPLIT > 1 and CLUSTER:  # the row's programs are one cluster: sums through shared memory
        c, s1, s2 = _split_combine(share3(c, s1, s2, SPLIT, xbuf), row, N, SEG, SPLIT, BLOCK_S, IS_RMS, True)
    elif SPLIT > 1:
        if LOOP_PART != 2:
            part = part_ptr + (row.to(tl.int64) * SPLIT + seg) * 3
            if not IS_RMS:
                tl.store(part, c)
                tl.store(part + 1, s1)
            tl.store(part + 2, s2)
        if LOOP_PART == 1:
            return
        if LOOP_PART == 0:
            _wait_row(sync_ptr + 1 + row, SPLIT)
        c, s1, s2 = _split_combine(part_ptr, row, N, SEG, SPLIT, BLOCK_S, IS_RMS)
    mean_lo, rstd = _sums_rstd(s1, s2, N, eps, IS_RMS)
    if TRACE:
        stamp_phase(part_ptr, row * SPLIT + seg, 2, rstd)
    if STASH:
        tl.debug_barrier()  # pass 2 reads h as this program's other threads stored it
    if HALF_STEPS > 0:  # the shelf's segment in HALF_STEPS steps of BLOCK_N / 2, each step's weight and bias
        H: tl.constexpr = BLOCK_N // 2  # asked for WB_K steps ahead, before the stores of the steps between
        ahead = wb  # (weight, bias) of steps 0 .. WB_K - 1, asked for early; each later step's appended
        for s in tl.static_range(HALF_STEPS):
            if s + WB_K < HALF_STEPS:
                hcols, hok = _chunk_cols(col0, (s + WB_K) * H, N, H, EVEN)
                ahead = ahead + (_load_wb(w_ptr, b_ptr, hcols, hok, HAS_WEIGHT, HAS_BIAS, WB_EV),)
            w, b = ahead[s]
            _pass2_chunk(x_ptr, r_ptr, y_ptr, h_ptr, w, b, 0.0, base, rows, M, col0, s * H, N, c, rstd, mean_lo,
                         stride_xm, stride_rm, stride_ym, stride_hm, IS_RMS, GEMMA, HAS_RESIDUAL, HAS_WEIGHT,
                         HAS_BIAS, BLOCK_M, H, EVEN, False, SHELF, STASH, DROP, DROP_STREAMED_Y, FOLD)
    else:
        PEEL: tl.constexpr = HOLD if HOLD > WB_PRE else WB_PRE
        if PIPE >= 2:  # the first streamed chunk's loads, before the peeled chunks' stores
            cols, col_ok = _ahead_cols(col0, PEEL * BLOCK_N, N, SEG, BLOCK_N, EVEN)
            mask = _tile_mask(rows, M, col_ok, BLOCK_M)
            wn, bn = _load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT, HAS_BIAS, WB_EV)
            xn, rn = _pass2_src(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL,
                                SHELF, STASH, DROP)
        for k in tl.static_range(PEEL):  # the held chunks and those whose weight is in already
            if k < WB_PRE:
                w, b = wb[k]
            else:
                cols, col_ok = _chunk_cols(col0, k * BLOCK_N, N, BLOCK_N, EVEN)
                w, b = _load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT, HAS_BIAS, WB_EV)
            _pass2_chunk(x_ptr, r_ptr, y_ptr, h_ptr, w, b, held[k] if k < HOLD else 0.0, base, rows, M, col0,
                         k * BLOCK_N, N, c, rstd, mean_lo, stride_xm, stride_rm, stride_ym, stride_hm, IS_RMS, GEMMA,
                         HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N, EVEN, k < HOLD, SHELF, STASH, DROP,
                         DROP_STREAMED_Y, FOLD)
        for i in tl.range(PEEL * BLOCK_N, SEG, BLOCK_N, loop_unroll_factor=UNROLL):
            if PIPE >= 2:  # this chunk's loads came in the last iteration; the next one's go out before y's store
                w = wn
                b = bn
                src = (xn, rn)
                cols, col_ok = _ahead_cols(col0, i + BLOCK_N, N, SEG, BLOCK_N, EVEN)
                mask = _tile_mask(rows, M, col_ok, BLOCK_M)
                wn, bn = _load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT, HAS_BIAS, WB_EV)
                xn, rn = _pass2_src(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL,
                                    SHELF, STASH, DROP)
            else:  # _pass2_chunk loads the chunk's h (or x and r) itself
                cols, col_ok = _chunk_cols(col0, i, N, BLOCK_N, EVEN)
                w, b = _load_wb(w_ptr, b_ptr, cols, col_ok, HAS_WEIGHT, HAS_BIAS, WB_EV)
                src = 0.0
            _pass2_chunk(x_ptr, r_ptr, y_ptr, h_ptr, w, b, src, base, rows, M, col0, i, N, c, rstd, mean_lo,
                         stride_xm, stride_rm, stride_ym, stride_hm, IS_RMS, GEMMA, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS,
                         BLOCK_M, BLOCK_N, EVEN, False, SHELF, STASH, DROP, DROP_STREAMED_Y, FOLD, PIPE >= 2)
    if TRACE:
        stamp_phase(part_ptr, row * SPLIT + seg, 3, rstd)
