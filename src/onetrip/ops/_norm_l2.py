"""L2 requests of the "loop" norm (``NormConfig.l2``, Hopper): prefetches that change no
value, only where the bytes wait.

  * ``first_chunks``: a program asks for the first chunks of its own segment before it waits
    for the previous kernel (``griddepcontrol.wait``, PDL). The next launch's first wave sits
    on the SMs the previous launch's tail frees, so a few MB asked then start it from L2; the
    whole segment (17-64 MB) would delay the previous kernel's drain instead. On an H100,
    rms_norm 64 x 256K 88.0 -> 92.6% of copy (one chunk a program).
  * ``ahead_rows``: once its pass-1 reads are in, a program asks for its segment of the row
    ``ahead_rows`` on, so that the program that takes that row finds it in L2; the request
    holds no register or slot, so HBM keeps reading while the program waits on its sums and
    writes y. It pays only with many rows behind those in flight (``ahead_min_rows``): on an
    H100, layer_norm 512 x 128K 89.7 -> 91.0%.

A request is one 4 KB ``cp.async.bulk.prefetch.L2`` a lane (``_ptx.l2_prefetch_4k``), from as
many lanes as the segment has 4 KB pieces, none past the last row. Under the interpreter
and off Hopper the launcher makes none.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import hopper_or_newer, is_interpreting
from ._ptx import L2_REQUEST, l2_prefetch_4k


@triton.jit
def l2_ask(ptr, row, M, col0, stride_m, SEG: tl.constexpr, LANES: tl.constexpr):
    """Ask the L2 for row ``row``'s SEG elements from column ``col0`` (the start 16-byte
    aligned, SEG's bytes a multiple of 4 KB); nothing when ``row`` >= M."""
    ELEMS: tl.constexpr = L2_REQUEST * 8 // ptr.dtype.element_ty.primitive_bitwidth  # elements a request
    lane = tl.arange(0, LANES)  # (LANES,): one element a thread, so no request is issued twice
    count = tl.where(row < M, SEG // ELEMS, 0)
    p = ptr + row.to(tl.int64) * stride_m + col0 + tl.minimum(lane, SEG // ELEMS - 1) * ELEMS
    l2_prefetch_4k(p, lane, count)


@triton.jit
def l2_first(x_ptr, r_ptr, M, HAS_RESIDUAL: tl.constexpr, SPLIT: tl.constexpr, SEG: tl.constexpr,
             COLS: tl.constexpr, N: tl.constexpr, LANES: tl.constexpr):
    """Ask for the first COLS elements of this program's segment of x (and r) in a "loop"
    launch over dense rows of N = SPLIT x SEG, program t on row t // SPLIT, segment t % SPLIT.
    Safe before the PDL wait: a prefetch into the L2, where every SM's stores land, changes
    no value a later load sees."""
    t = tl.program_id(0)
    col0 = (t % SPLIT) * SEG
    l2_ask(x_ptr, t // SPLIT, M, col0, N, COLS, LANES)
    if HAS_RESIDUAL:
        l2_ask(r_ptr, t // SPLIT, M, col0, N, COLS, LANES)


@triton.jit
def l2_ahead(x_ptr, r_ptr, row, M, col0, stride_xm, stride_rm, HAS_RESIDUAL: tl.constexpr, SEG: tl.constexpr,
             LANES: tl.constexpr):
    """Ask for the segment of x (and r) of row ``row`` (the read-ahead, ``ahead_rows`` on)."""
    l2_ask(x_ptr, row, M, col0, stride_xm, SEG, LANES)
    if HAS_RESIDUAL:
        l2_ask(r_ptr, row, M, col0, stride_rm, SEG, LANES)


def can_ask(seg_bytes: int, x: torch.Tensor, *others) -> bool:
    """Requests may run on ``x``'s rows (and ``others``', None skipped): a compiled kernel on a
    Hopper-or-newer GPU, segments of whole 4 KB requests, every tensor 16-byte aligned."""
    if is_interpreting() or seg_bytes % L2_REQUEST.value or not hopper_or_newer(x):
        return False
    return all(t is None or t.data_ptr() % 16 == 0 for t in (x, *others))


def requests(cfg, x: torch.Tensor, residual, rows: int, seg: int, even: bool, ticketless: bool,
             pdl: bool) -> tuple[int, int]:
    """(rows ahead, columns asked first) of a launch of "loop" config ``cfg`` over ``rows``
    rows cut into segments of ``seg`` columns; 0 where no request is made. Both need a row a
    program over dense rows cut into whole chunks (``even``) that ``can_ask`` serves; the
    read-ahead needs ``cfg.l2.ahead_min_rows`` rows (the shape, fixed at graph capture), the
    first chunks PDL (``pdl``) and program t on row t // split (``ticketless``: a cluster, or
    one program a row)."""
    if cfg.mode != "loop" or cfg.block_m != 1 or not even:
        return 0, 0
    ahead = cfg.l2.ahead_rows
    if not (ahead and rows >= cfg.l2.ahead_min_rows and can_ask(seg * x.element_size(), x, residual)):
        ahead = 0
    first = min(seg, cfg.l2.first_chunks * cfg.block_n)
    if not (first and ticketless and pdl and can_ask(first * x.element_size(), x, residual)):
        first = 0
    return ahead, first
