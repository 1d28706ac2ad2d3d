"""Triton kernels of ``cross_entropy`` (``cross_entropy.py`` launches them; docs/losses.md).

Per row of logits x (V,), t its target, eps the label smoothing, f the gradient's factor
(1 / n_valid, 1, or the row's upstream gradient), z = x or softcap * tanh(x / softcap):

    lse  = log sum_j exp(z_j)                         (online: a running max and sum)
    loss = (1 - eps)(lse - z_t) + eps (lse - mean z) + z_loss lse^2
    g_j  = f [exp(z_j - lse)(1 + 2 z_loss lse) - eps / V - (1 - eps)[j = t]] (1 - (z_j / softcap)^2)

Two kernels, the same math:
  * ``_ce_rows_kernel``: ``BLOCK_R`` whole rows a program held in registers (V <= 8192): the
    row is read once and its gradient written from the registers.
  * ``_ce_loop_kernel``: a program walks its row, or its segment of a row split over
    ``SPLIT`` programs, in steps of ``UNROLL`` 16-byte vectors a thread. Pass 1 keeps a
    running max and sum of exponentials per thread (no block reduction inside the loop);
    the row's (max, sum) is reduced once at the end and, for a split row, exchanged with the
    other programs of the row (one Hopper thread-block cluster, through distributed shared
    memory). Pass 2 re-reads the segment (from L2: pass 1 loads it evict_last) and writes
    the gradient. Rows whose stride is not a multiple of 16 elements walk 16-byte aligned
    steps from just before the row's start, so every whole step is vector loads and stores.
Three small kernels: the count of rows not ignored (``_count_kernel``), the loss total
(``_loss_total_kernel``, which counts the rows itself in a forward without gradient) and the
backward's scaling (``_scale_kernel``), each one program or one wave, so that no other launch
of the step moves N x V bytes. ``_rows_unfused`` is the
kernels' math in PyTorch (the CPU fallback).
"""

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._jit import cast_out, gdc_launch_dependents, gdc_wait, tanh
from ._ptx import MAX_RANKS, cluster_arrive, cluster_share3, smem_load_f32

_LOG2E = tl.constexpr(1.4426950408889634)
# A running max before any logit: finite (and finite times log2(e)), so that a thread that
# has seen only masked (-inf) logits gets exp(0) x 0 and exp(-inf) = 0, never inf - inf.
_NO_MAX = tl.constexpr(-1e38)
_XSTRIDE = tl.constexpr(4 * MAX_RANKS)  # bytes between cluster_share3's value k and k + 1 of a rank


@triton.jit
def _capped(x, softcap, HAS_SOFTCAP: tl.constexpr):
    """z = x in float32, or softcap * tanh(x / softcap)."""
    z = x.to(tl.float32)
    if HAS_SOFTCAP:
        z = softcap * tanh(z / softcap)
    return z


@triton.jit
def _row_loss(lse, zt, sz, valid, in_range, smoothing, z_loss, V: tl.constexpr):
    """The loss of a row from its lse, target logit and sum of logits: 0 where ignored, NaN
    where the target is out of range."""
    loss = (1.0 - smoothing) * (lse - zt) + smoothing * (lse - sz / V) + z_loss * lse * lse
    return tl.where(valid, tl.where(in_range, loss, float("nan")), 0.0)


@triton.jit
def _grad_factor(scale_ptr, rows, stride_scale, valid, in_range, HAS_SCALE: tl.constexpr, PDL: tl.constexpr):
    """The gradient's factor f of rows ``rows``: 0 on an ignored row (its gradient is then 0
    without a select), NaN for a target out of range. Loaded when a program starts, so that
    no load stands between the passes; PDL: scale is written by the kernel just before."""
    if PDL:
        gdc_wait()
    if HAS_SCALE:
        scale = tl.load(scale_ptr + rows * stride_scale).to(tl.float32)
    else:
        scale = 1.0
    return tl.where(valid, tl.where(in_range, scale, float("nan")), 0.0)


@triton.jit
def _grad_coefs(f, lse, smoothing, z_loss, V: tl.constexpr):
    """(a, b, t) of g = exp(z - lse) a - b - t [j = target], the factor ``f`` folded in."""
    return (1.0 + 2.0 * z_loss * lse) * f, (smoothing / V) * f, (1.0 - smoothing) * f


@triton.jit
def _grad(x, at_target, lse, a, b, t, softcap, HAS_SOFTCAP: tl.constexpr):
    """The gradient of logits ``x`` (any shape; ``at_target``: which are the target's) in float32."""
    if HAS_SOFTCAP:
        th = tanh(x.to(tl.float32) / softcap)
        z = softcap * th
    else:
        z = x.to(tl.float32)
    g = tl.exp2(z * _LOG2E - lse * _LOG2E) * a - tl.where(at_target, b + t, b)
    if HAS_SOFTCAP:
        g = g * (1.0 - th * th)
    return g


@triton.jit
def _ce_rows_kernel(
    x_ptr, t_ptr, scale_ptr, loss_ptr, lse_ptr, g_ptr,  # x, g (N, V) unit column stride; the rest (N,)
    N, stride_x, stride_g, stride_scale,  # stride_scale 0: one factor for every row
    ignore_index, smoothing, z_loss, softcap,
    V: tl.constexpr,
    BLOCK_R: tl.constexpr,  # rows a program
    BLOCK: tl.constexpr,  # >= V, a power of two
    HAS_SOFTCAP: tl.constexpr,
    HAS_SCALE: tl.constexpr,  # the gradient times scale[row * stride_scale]
    FORWARD: tl.constexpr,  # compute lse and the loss; else read lse (the backward of reduction="none")
    WRITE_GRAD: tl.constexpr,
    PDL: tl.constexpr,  # launched after the kernel that writes scale: wait for it before reading scale
):
    # The flags are constexpr so that the loss-only pass and the backward compile to their
    # own code: no per-element branch, one body for the four uses.
    if PDL:
        gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < N
    t = tl.load(t_ptr + rows, mask=row_ok, other=ignore_index).to(tl.int64)
    valid = (t != ignore_index) & row_ok
    in_range = (t >= 0) & (t < V)
    cols = tl.arange(0, BLOCK)
    at_target = cols[None, :] == tl.where(in_range, t, -1).to(tl.int32)[:, None]
    mask = valid[:, None] & (cols < V)[None, :]  # an ignored row is not read
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_x + cols[None, :], mask=mask, other=float("-inf"))
    if WRITE_GRAD:
        f = _grad_factor(scale_ptr, rows, stride_scale, valid, in_range, HAS_SCALE, PDL)
    if FORWARD:
        z = tl.where(mask, _capped(x, softcap, HAS_SOFTCAP), float("-inf"))
        m = tl.where(valid, tl.max(z, 1), 0.0)  # ignored rows: exp(-inf - 0) = 0, no NaN
        s = tl.sum(tl.exp2((z - m[:, None]) * _LOG2E), 1)
        lse = tl.where(valid, m + tl.log(tl.where(valid, s, 1.0)), 0.0)
        zt = tl.sum(tl.where(at_target, z, 0.0), 1)
        sz = tl.sum(tl.where(mask, z, 0.0), 1)
        tl.store(loss_ptr + rows, _row_loss(lse, zt, sz, valid, in_range, smoothing, z_loss, V), mask=row_ok)
        tl.store(lse_ptr + rows, lse, mask=row_ok)
    else:
        lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    if WRITE_GRAD:
        a, b, tt = _grad_coefs(f, lse, smoothing, z_loss, V)
        g = _grad(x, at_target, lse[:, None], a[:, None], b[:, None], tt[:, None], softcap, HAS_SOFTCAP)
        g = tl.where(valid[:, None], g, 0.0)  # masked logits are -inf: exp(-inf) x 0 is 0, but inf x 0 is not
        tl.store(g_ptr + rows.to(tl.int64)[:, None] * stride_g + cols[None, :], cast_out(g, g_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (cols < V)[None, :])


@triton.jit
def _online(z, m, s, sz, ok, SMOOTH: tl.constexpr):
    """Fold a step's logits z (steps, lanes, vec; float32, or as loaded: the max is exact in
    16 bits and needs no conversion first) into each thread's running max m and sum of
    exp(z - m) (and sum of z, SMOOTH; ``ok``: which z are logits), all (1, lanes, 1) float32:
    the step's own max and sums are within a thread, so no block reduction."""
    m_new = tl.maximum(m, tl.max(tl.max(z, axis=2, keep_dims=True), axis=0, keep_dims=True).to(tl.float32))
    z = z.to(tl.float32)
    e = tl.exp2(z * _LOG2E - m_new * _LOG2E)
    s = s * tl.exp2((m - m_new) * _LOG2E) + tl.sum(tl.sum(e, axis=2, keep_dims=True), axis=0, keep_dims=True)
    if SMOOTH:
        sz += tl.sum(tl.sum(tl.where(ok, z, 0.0), axis=2, keep_dims=True), axis=0, keep_dims=True)
    return m_new, s, sz


@triton.jit
def _combine(m, s, sz):
    """The (max, sum of exp(z - max), sum of z) of partials (m, s, sz), any shape."""
    big = tl.max(m)
    return big, tl.sum(s * tl.exp2((m - big) * _LOG2E)), tl.sum(sz)


@triton.jit
def _pass1_step(ptrs, mask, m, s, sz, softcap, EV: tl.constexpr, HAS_SOFTCAP: tl.constexpr, SMOOTH: tl.constexpr):
    """Load a step's logits where ``mask`` (eviction hint EV) and fold them into (m, s, sz)."""
    z = tl.load(ptrs, mask=mask, other=float("-inf"), eviction_policy=EV)
    if HAS_SOFTCAP:
        z = tl.where(mask, _capped(z, softcap, HAS_SOFTCAP), float("-inf"))
    return _online(z, m, s, sz, mask, SMOOTH)


@triton.jit
def _pass2_step(x_ptrs, g_ptrs, read, write, at_target, lse, a, b, t, softcap, EV: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr):
    """A step's gradient: logits loaded where ``read`` (0 elsewhere), stored where ``write``."""
    x = tl.load(x_ptrs, mask=read, other=0.0, eviction_policy=EV)
    g = _grad(x, at_target, lse, a, b, t, softcap, HAS_SOFTCAP)
    tl.store(g_ptrs, cast_out(g, g_ptrs.dtype.element_ty), mask=write, eviction_policy=EV)


@triton.jit
def _edge(chunk, on, valid, shift, C: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr, V: tl.constexpr):
    """A chunk masked by column (the row's head or tail): its offsets (1, LANES, VEC), where
    it is stored (``on`` and inside the row) and where loaded (an ignored row: nowhere). The
    flags go in as ints: Triton's interpreter turns a broadcast scalar bool into int32."""
    offs = chunk * C + (tl.arange(0, LANES)[:, None] * VEC + tl.arange(0, VEC)[None, :])[None, :, :]
    cols = offs - shift
    inside = (cols >= 0) & (cols < V)
    write = tl.where(inside, on.to(tl.int32), 0) > 0
    return offs, write, tl.where(write, valid.to(tl.int32), 0) > 0


@triton.jit
def _ce_loop_kernel(
    x_ptr, t_ptr, scale_ptr, loss_ptr, lse_ptr, g_ptr,  # x, g (N, V) unit column stride; the rest (N,)
    part_ptr,  # (N, SPLIT, 3) float32: a split row's partials between the two launches of PASSES 1 and 2
    N, stride_x, stride_g, stride_scale,
    ignore_index, smoothing, z_loss, softcap,
    V: tl.constexpr,
    LANES: tl.constexpr,  # 32 x num_warps
    VEC: tl.constexpr,  # logits in 16 bytes
    UNROLL: tl.constexpr,  # 16-byte vectors a thread a step
    SPLIT: tl.constexpr,  # programs a row (pid = row * SPLIT + rank), each a segment of whole chunks
    CLUSTER: tl.constexpr,  # the SPLIT programs of a row are one thread-block cluster
    PASSES: tl.constexpr,  # 0: all; 1: pass 1, partials stored; 2: partials combined, pass 2 (interpreter)
    SHIFT: tl.constexpr,  # the row stride is not a multiple of 16: steps aligned to 16 bytes of memory
    G_ALIGNED: tl.constexpr,  # g's rows are as (mis)aligned as x's (stride_g = stride_x mod VEC)
    KEEP: tl.constexpr,  # L2 hints: pass 1 loads evict_last, pass 2 loads and stores evict_first
    HAS_SOFTCAP: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    FORWARD: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    SMOOTH: tl.constexpr,  # label smoothing: pass 1 also sums the logits
    PDL: tl.constexpr,
):
    tl.static_assert(SPLIT == 1 or not FORWARD or CLUSTER or PASSES != 0, "a split row exchanges its sums")
    pid = tl.program_id(0)
    xbuf = 0
    if CLUSTER:
        xbuf = cluster_arrive(pid)  # first thing: cluster_share3's wait pairs with this arrival
    if PDL:
        gdc_launch_dependents()
    C: tl.constexpr = LANES * VEC  # logits a chunk: one 16-byte vector a thread
    # chunks a program: the row's chunk count (one more when steps start before the row) over SPLIT
    P: tl.constexpr = ((V + (VEC - 1 if SHIFT else 0) + C - 1) // C + SPLIT - 1) // SPLIT
    EV1: tl.constexpr = "evict_last" if KEEP else ""
    EV2: tl.constexpr = "evict_first" if KEEP else ""
    row = pid // SPLIT
    rank = pid % SPLIT
    t = tl.load(t_ptr + row).to(tl.int64)
    valid = t != ignore_index
    in_range = (t >= 0) & (t < V)
    x_off = row.to(tl.int64) * stride_x
    g_off = row.to(tl.int64) * stride_g
    shift = 0  # the row's column j is at offset shift + j from x_row
    if SHIFT:
        shift = (x_off % VEC).to(tl.int32)
        x_off = tl.multiple_of(x_off - shift, VEC)  # true by construction; with x_ptr's alignment: 16-byte vectors
        g_off = g_off - shift
        if G_ALIGNED:
            g_off = tl.multiple_of(g_off, VEC)
    x_row = x_ptr + x_off
    g_row = g_ptr + g_off
    # Chunk k is offsets [k C, (k + 1) C) from x_row. This program takes chunks [k0, k1): the
    # whole ones [a, b) in steps of UNROLL, then the head (chunk 0 when shift > 0) and the
    # tail (chunk f1 when the row ends inside it), masked by column.
    n_chunks = (V + shift + C - 1) // C
    f1 = (V + shift) // C
    k0 = rank * P
    k1 = tl.minimum(k0 + P, n_chunks)
    a = k0
    b = tl.minimum(k1, f1)
    tail = (f1 >= k0) & (f1 < k1)  # (k1 <= n_chunks: no tail where the row ends at a chunk's end)
    steps = tl.arange(0, UNROLL)[:, None, None]
    offs = steps * C + (tl.arange(0, LANES)[:, None] * VEC + tl.arange(0, VEC)[None, :])[None, :, :]
    if SHIFT:
        head = (shift > 0) & (k0 == 0)
        a = tl.maximum(k0, (shift > 0).to(tl.int32))
        tail = tail & ((shift == 0) | (f1 > 0))  # a row inside chunk 0 is the head's

    lse = 0.0
    zt = 0.0
    if not FORWARD:
        lse = tl.load(lse_ptr + row)
    elif PASSES != 1:  # the target's logit, by the first program of the row, before pass 1's loads
        zt = tl.load(x_row + shift + t, mask=valid & in_range & (rank == 0), other=0.0)
    if WRITE_GRAD and PASSES != 1:
        f = _grad_factor(scale_ptr, row, stride_scale, valid, in_range, HAS_SCALE, PDL)
    if FORWARD:
        big = _NO_MAX
        total = 0.0
        zsum = 0.0
        if PASSES != 2:  # pass 1: each thread's running max and sum, then the program's
            m = tl.full((1, LANES, 1), _NO_MAX, tl.float32)
            s = tl.zeros((1, LANES, 1), tl.float32)
            sz = tl.zeros((1, LANES, 1), tl.float32)
            for k in range(a, tl.where(valid, b, a), UNROLL):  # an ignored row is not read
                m, s, sz = _pass1_step(x_row + k * C + offs, k + steps < b, m, s, sz, softcap, EV1, HAS_SOFTCAP,
                                       SMOOTH)
            if SHIFT:
                o, _, read = _edge(0, head, valid, shift, C, LANES, VEC, V)
                m, s, sz = _pass1_step(x_row + o, read, m, s, sz, softcap, EV1, HAS_SOFTCAP, SMOOTH)
            o, _, read = _edge(f1, tail, valid, shift, C, LANES, VEC, V)
            m, s, sz = _pass1_step(x_row + o, read, m, s, sz, softcap, EV1, HAS_SOFTCAP, SMOOTH)
            big, total, zsum = _combine(m, s, sz)
        if SPLIT > 1:
            if CLUSTER:
                vals = cluster_share3(big, total, zsum, SPLIT, xbuf) + 4 * tl.arange(0, SPLIT)
                big, total, zsum = _combine(smem_load_f32(vals), smem_load_f32(vals + _XSTRIDE),
                                            smem_load_f32(vals + 2 * _XSTRIDE))
            else:
                part = part_ptr + row.to(tl.int64) * (3 * SPLIT)
                if PASSES == 1:
                    tl.store(part + 3 * rank, big)
                    tl.store(part + 3 * rank + 1, total)
                    tl.store(part + 3 * rank + 2, zsum)
                else:
                    j = 3 * tl.arange(0, SPLIT)
                    big, total, zsum = _combine(tl.load(part + j), tl.load(part + j + 1), tl.load(part + j + 2))
        if PASSES != 1:
            lse = tl.where(valid, big + tl.log(tl.where(valid, total, 1.0)), 0.0)
            loss = _row_loss(lse, _capped(zt, softcap, HAS_SOFTCAP), zsum, valid, in_range, smoothing, z_loss, V)
            tl.store(loss_ptr + row, loss, mask=rank == 0)
            tl.store(lse_ptr + row, lse, mask=rank == 0)
    if WRITE_GRAD and PASSES != 1:  # pass 2: an ignored row's gradient is stored as zeros, nothing loaded
        ca, cb, ct = _grad_coefs(f, lse, smoothing, z_loss, V)
        t_at = tl.where(in_range, t, -1 - VEC).to(tl.int32) + shift  # the target's offset from x_row
        if SHIFT:
            o, write, read = _edge(0, head, valid, shift, C, LANES, VEC, V)
            _pass2_step(x_row + o, g_row + o, read, write, o == t_at, lse, ca, cb, ct, softcap, EV2, HAS_SOFTCAP)
        o, write, read = _edge(f1, tail, valid, shift, C, LANES, VEC, V)
        _pass2_step(x_row + o, g_row + o, read, write, o == t_at, lse, ca, cb, ct, softcap, EV2, HAS_SOFTCAP)
        b_load = tl.where(valid, b, a)
        for k in range(a, b, UNROLL):
            ok = k * C + offs
            _pass2_step(x_row + ok, g_row + ok, k + steps < b_load, k + steps < b, ok == t_at, lse, ca, cb, ct,
                        softcap, EV2, HAS_SOFTCAP)


@triton.jit
def _count_kernel(t_ptr, out_ptr, N, ignore_index, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """out = (1 / n, n) float32, n the targets != ignore_index (1 / 0 = inf); one program."""
    if PDL:
        gdc_launch_dependents()  # the row kernel may be scheduled now; it waits for out before reading it
    acc = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, N, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        t = tl.load(t_ptr + idx, mask=idx < N, other=ignore_index)
        acc += (t != ignore_index).to(tl.int32)
    n = tl.sum(acc).to(tl.float32)
    tl.store(out_ptr, tl.where(n > 0, 1.0 / tl.maximum(n, 1.0), float("inf")))  # no 1 / 0 evaluated
    tl.store(out_ptr + 1, n)


@triton.jit
def _loss_total_kernel(loss_ptr, n_ptr, out_ptr, N, ignore_index, BLOCK: tl.constexpr, MEAN: tl.constexpr,
                       COUNT: tl.constexpr, PDL: tl.constexpr):
    """out = sum of the N float32 losses, divided when MEAN by n_ptr[0], or with COUNT by the
    count of the N targets at n_ptr that are not ignore_index (a forward without gradient
    needs no count before its rows); one program."""
    if PDL:
        gdc_wait()
    acc = tl.zeros((BLOCK,), tl.float32)
    valid = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, N, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        acc += tl.load(loss_ptr + idx, mask=idx < N, other=0.0)
        if COUNT:
            t = tl.load(n_ptr + idx, mask=idx < N, other=ignore_index)
            valid += (t != ignore_index).to(tl.int32)
    total = tl.sum(acc)
    if MEAN:
        if COUNT:
            n = tl.sum(valid).to(tl.float32)
        else:
            n = tl.load(n_ptr)
        total = tl.where(n > 0, total / tl.maximum(n, 1.0), float("nan"))  # PyTorch's 0 / 0
    tl.store(out_ptr, total)


@triton.jit
def _scale_kernel(y_ptr, s_ptr, M, K, stride_m, BLOCK: tl.constexpr):  # y (M, K), unit column stride
    s = tl.load(s_ptr).to(tl.float32)
    # A loss that is the graph's root gets exactly 1.0: one wave of programs, each exits after one load.
    if s != 1.0:
        n_blocks = tl.cdiv(K, BLOCK)
        for i in range(tl.program_id(0), M * n_blocks, tl.num_programs(0)):
            cols = (i % n_blocks) * BLOCK + tl.arange(0, BLOCK)
            ptrs = y_ptr + (i // n_blocks).to(tl.int64) * stride_m + cols
            y = tl.load(ptrs, mask=cols < K, other=0.0).to(tl.float32)
            tl.store(ptrs, cast_out(y * s, y_ptr.dtype.element_ty), mask=cols < K)


def _rows_unfused(x, target, scale, lse, want_grad, ignore_index, smoothing, z_loss, softcap):
    """The kernel's math in PyTorch, float32 (the CPU fallback): (loss, lse, grad or None);
    ``lse`` given: it is used and no loss is computed."""
    z = x.float()
    if softcap > 0:
        z = softcap * torch.tanh(z / softcap)
    V = z.shape[1]
    t = target.long()
    valid, in_range = t != ignore_index, (t >= 0) & (t < V)
    tt = torch.where(valid & in_range, t, 0)
    loss = None
    if lse is None:
        lse = torch.where(valid, torch.logsumexp(z, -1), 0.0)
        zt = z.gather(1, tt[:, None])[:, 0]
        loss = (1 - smoothing) * (lse - zt) + smoothing * (lse - z.mean(-1)) + z_loss * lse * lse
        loss = torch.where(valid, torch.where(in_range, loss, math.nan), 0.0)
    grad = None
    if want_grad:
        grad = torch.exp(z - lse[:, None]) * (1 + 2 * z_loss * lse)[:, None] - smoothing / V
        grad = grad - (1 - smoothing) * F.one_hot(tt, V)
        if softcap > 0:
            grad = grad * (1 - (z / softcap) ** 2)
        if scale is not None:
            grad = grad * scale.float().reshape(-1, 1)
        grad = torch.where(valid[:, None], torch.where(in_range[:, None], grad, math.nan), 0.0)
    return loss, lse, grad
