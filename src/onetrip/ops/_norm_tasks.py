"""Mode "tasks" of the residual-add + norm kernel (``norm.py``): persistent programs that
take (row, chunk) tasks from one ticket counter, a row's pass 2 ``lag`` rows behind its
pass 1, so that reads and writes mix through the whole launch as a copy's do.

Why: a few very wide rows (64 x 256K) leave every one-launch design in ``norm.py`` with a
row's programs that read, wait for their siblings' sums, then write, in 1-2 waves fixed
at launch: the thirty-third session's stamps show the waits (median 1.2 us, p90 3.1 us:
the slowest of a cluster's 16 ranks), the turn of each wave from reads to writes, a
cluster of 16 leaving 16 of the H100's 132 SMs idle, and with one CTA an SM (the residual
pick, a cluster of 2) GPCs that finish 5 us apart. Here no program owns a row:

  * tickets t = 0, 1, ... (one atomic a task) name the tasks in this order: pass 1 of
    rows 0 .. lag-1, then pass 1 of row i + lag and pass 2 of row i alternating chunk by
    chunk for i = 0 .. M - lag - 1, then pass 2 of the last ``lag`` rows;
  * pass 1 of (row, chunk): load x (and r; store h = x + r), store the chunk's partial
    sums around its own mean, count the chunk in on the row (release);
  * pass 2 of (row, chunk): wait until the row's chunks are all in (acquire; ``lag`` rows
    of tasks ago, so it has rarely anything left to wait for), combine the partials
    (``_norm_jit._split_combine``), re-read the chunk's x (or h) from L2 (a reuse distance
    of ``lag`` rows, not the whole tensor that two launches have), and store y.

No deadlock whatever the grid: tickets are taken in order, and a task depends only on
tasks with smaller tickets, so the smallest unfinished ticket's program is running it and
everything it waits for is done. (Under the interpreter, which runs programs one after
another, the first program takes every task.) The counters live in a buffer kept per
(device, rows) that is zero at each launch's start: the last program out (an exit count)
sets them back to zero, and the next launch on the stream starts after that. Two launches
with the same row count running at once on two streams would share it: ``launch`` is for
one stream (the bench, the engine's graphs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import sm_count
from ._jit import cast_out, pdl_start
from ._norm_chunk import _load_h, _load_wb, _store_y
from ._norm_jit import _split_combine, _sums_rstd

_COUNTERS: dict = {}  # (device, rows) -> int32 [ticket, exits, a count per row], zero between launches


@triton.jit
def _task(t, M, lag, CH: tl.constexpr):
    """(row, chunk, second pass) of ticket ``t`` (see the module docstring's order)."""
    head = lag * CH
    u = t - head
    v = u - 2 * CH * (M - lag)
    j = u % (2 * CH)
    in_head = t < head
    in_tail = v >= 0
    p2 = tl.where(in_head, 0, tl.where(in_tail, 1, j % 2))
    k = tl.where(in_head, t % CH, tl.where(in_tail, v % CH, j // 2))
    row = tl.where(in_head, t // CH, tl.where(in_tail, M - lag + v // CH, u // (2 * CH) + lag * (1 - p2)))
    return row, k, p2


@triton.jit
def _run_task(t, x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, part_ptr, sync_ptr, M, lag,
              stride_xm, stride_rm, stride_ym, stride_hm, eps, IS_RMS: tl.constexpr, GEMMA: tl.constexpr,
              HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, N: tl.constexpr,
              BLOCK_N: tl.constexpr, CH: tl.constexpr, BLOCK_S: tl.constexpr, HINTS: tl.constexpr):
    """Ticket ``t``'s task: a chunk's pass 1 (load, h stored, partial sums, counted in) or
    pass 2 (wait for the row, combine, re-read, y stored)."""
    KEEP: tl.constexpr = "evict_last" if HINTS else ""
    DROP: tl.constexpr = "evict_first" if HINTS else ""
    row, k, p2 = _task(t, M, lag, CH)
    rows = row + tl.arange(0, 1)  # (1,)
    cols = k * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    mask = (cols < N)[None, :]  # (1, BLOCK_N)
    count = sync_ptr + 2 + row
    if p2 == 0:
        # h rounded to its dtype when stored, so that pass 2's y and these sums agree
        h = _load_h(x_ptr, r_ptr, h_ptr, rows, cols, mask, stride_xm, stride_rm, stride_hm, HAS_RESIDUAL, True,
                    DROP if HAS_RESIDUAL else KEEP, KEEP)
        if HAS_RESIDUAL:
            h = cast_out(h, h_ptr.dtype.element_ty).to(tl.float32)
        c = 0.0
        if not IS_RMS:  # sums around the chunk's own mean (``_split_combine`` moves them)
            c = tl.sum(h) / tl.minimum(N - k * BLOCK_N, BLOCK_N).to(tl.float32)
        d = tl.where(mask, h - c, 0.0)
        part = part_ptr + (row.to(tl.int64) * CH + k) * 3
        if not IS_RMS:
            tl.store(part, c)
            tl.store(part + 1, tl.sum(d))
        tl.store(part + 2, tl.sum(d * d))
        tl.debug_barrier()  # every thread's stores (h, partials) before the count's release
        tl.atomic_add(count, 1, sem="release")
    else:
        seen = tl.atomic_add(count, 0, sem="acquire")
        while seen < CH:
            seen = tl.atomic_add(count, 0, sem="acquire")
        tl.debug_barrier()  # every thread reads the partials (and h) after the acquire
        c0, s1, s2 = _split_combine(part_ptr, row, N, BLOCK_N, CH, BLOCK_S, IS_RMS)
        mean_lo, rstd = _sums_rstd(s1, s2, N, eps, IS_RMS)
        src = h_ptr if HAS_RESIDUAL else x_ptr
        stride = stride_hm if HAS_RESIDUAL else stride_xm
        v = tl.load(src + rows.to(tl.int64)[:, None] * stride + cols[None, :], mask=mask, other=0.0,
                    eviction_policy=DROP).to(tl.float32)
        w, b = _load_wb(w_ptr, b_ptr, cols, cols < N, HAS_WEIGHT, HAS_BIAS)
        _store_y(y_ptr, v, c0, rstd, w, b, rows, cols, mask, stride_ym, IS_RMS, GEMMA, HAS_WEIGHT, HAS_BIAS,
                 mean_lo, TWO_PART=True, EVICT=DROP)


@triton.jit
def _tasks_kernel(
    x_ptr, r_ptr, w_ptr, b_ptr,       # x, r: (M, N) rows; w, b: (N,)
    y_ptr, h_ptr,                     # y = norm(h), h = x + r: (M, N) rows
    part_ptr, sync_ptr,               # (M, CH, 3) fp32 partials; int32 [ticket, exits, M row counts]
    M, lag, stride_xm, stride_rm, stride_ym, stride_hm, eps,
    IS_RMS: tl.constexpr, GEMMA: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    N: tl.constexpr, BLOCK_N: tl.constexpr, CH: tl.constexpr, BLOCK_S: tl.constexpr,
    GRAB: tl.constexpr = 1,       # tickets taken by one atomic (run in order)
    HINTS: tl.constexpr = False,  # L2 hints: what pass 2 reads again evict_last, the rest evict_first
    PDL: tl.constexpr = 0,
):
    pdl_start(PDL)
    total = 2 * M * CH
    # the tickets order nothing but the tasks: relaxed (acq_rel would fence the last task's
    # stores and drop the L1 at every ticket)
    t = tl.atomic_add(sync_ptr, GRAB, sem="relaxed")
    while t < total:
        for g in tl.static_range(GRAB):
            if t + g < total:
                _run_task(t + g, x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, part_ptr, sync_ptr, M, lag,
                          stride_xm, stride_rm, stride_ym, stride_hm, eps, IS_RMS, GEMMA, HAS_RESIDUAL, HAS_WEIGHT,
                          HAS_BIAS, N, BLOCK_N, CH, BLOCK_S, HINTS)
        t = tl.atomic_add(sync_ptr, GRAB, sem="relaxed")
    # the last program out sets the counters back to zero for the next launch (every other
    # program's counts came before its exit, which this acquire sees)
    tl.debug_barrier()
    if tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel") == tl.num_programs(0) - 1:
        for i in tl.range(0, M + 2, 1024):
            idx = i + tl.arange(0, 1024)
            tl.store(sync_ptr + idx, tl.zeros((1024,), tl.int32), mask=idx < M + 2)


def counters(device: torch.device, rows: int) -> torch.Tensor:
    """The zeroed counter buffer of launches over ``rows`` rows on ``device`` (made once)."""
    key = (str(device), rows)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(2 + rows, dtype=torch.int32, device=device)
    return _COUNTERS[key]


def launch(x, residual, weight, bias, y, h, eps: float, is_rms: bool, gemma: bool, cfg, pdl: dict):
    """Mode "tasks" on validated 2-D views: chunks of ``cfg.block_n`` at ``cfg.num_warps``,
    ``cfg.per_sm`` programs an SM, pass 2 ``cfg.lag`` rows behind pass 1, ``cfg.unroll``
    tickets an atomic. Returns the kernel."""
    M, N = x.shape
    ch = triton.cdiv(N, cfg.block_n)
    part = torch.empty((M, ch, 3), dtype=torch.float32, device=x.device)
    grid = (max(1, min(2 * M * ch, cfg.per_sm * sm_count(x.device))),)
    return _tasks_kernel[grid](
        x, residual if residual is not None else x, weight if weight is not None else x,
        bias if bias is not None else x, y, h if h is not None else x, part, counters(x.device, M),
        M, min(cfg.lag, M), x.stride(0), residual.stride(0) if residual is not None else 0, y.stride(0),
        h.stride(0) if h is not None else 0, eps,
        IS_RMS=is_rms, GEMMA=gemma, HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None, N=N, BLOCK_N=cfg.block_n, CH=ch, BLOCK_S=max(2, triton.next_power_of_2(ch)),
        GRAB=cfg.unroll, HINTS=cfg.hints, num_warps=cfg.num_warps, **pdl, **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}))
