"""Read-ahead into the L2 for the "loop" norm (``NormConfig.pf``): once its own pass-1
reads are in, a program asks the L2 for its segment of the row ``pf`` rows on, so that the
program which takes that row later finds it there.

Why: a wide row's program holds its SM slot from its first load to its last store, but
keeps HBM reads in flight only during pass 1; while it waits on its sums' exchange and
writes y, its SM asks HBM for less than its share. A bulk prefetch
(``cp.async.bulk.prefetch.L2``, served by the TMA unit, Hopper) holds no register, shared
memory or slot, so the reads it starts go on through that wait.

Measured (H100, benchmarks/NOTES.md, twenty-fifth and twenty-eighth sessions): layer_norm's
128K shelf pick takes it from 384 rows (ops bench, 512 x 128K: 89.7 -> 91.0% of copy); the
gain grows with the rows behind those in flight and is a loss below ~300. It lost at 256K
in the ops bench (-1 to -2 points, though tune_ops read +2), and outright where the L2 is
full already: the picks that re-read their row from L2 (rms_norm; the residual picks, whose
stashed h fills it), and any pick when the request is made at the program's start (it then
competes with the program's own first pass). (The twenty-fifth session's ops-bench losses
of 9-11 points were torch's ptxas building the kernel; ``maxnreg`` on the pick fixes it.)

A program issues one 4 KB request a lane, from as many lanes as its segment has 4 KB
pieces (a 16384-column bf16 segment: 8), none past the last row. The requests are hints
and change no result; under the interpreter (no inline PTX) and off Hopper the launcher
passes pf = 0.

``l2_first`` (``NormConfig.l2_first``): a program asks for the first chunks of its own
segment before it waits for the previous kernel (``griddepcontrol.wait``). Under PDL the
next launch's first wave sits on the SMs this launch's tail frees, so a few MB asked then
start that wave from L2. On an H100 (NOTES.md, thirty-fourth session; ops bench, 64 x 256K):
rms_norm 88 -> 92.6-92.8% of copy with one 8 KB chunk a program (4.5 MB a launch),
layer_norm 80.4-80.9 -> 83.9-84.2 with two, add_rms_norm 90.8-91.0 -> 92.4-92.5 with one;
the whole segment (17-64 MB) lost 1.5-14 points instead: those reads go to HBM ahead of
the previous launch's last stores, whose drain the wait waits for.

``wb_first`` (``NormConfig.wb_first``): the programs of the first ``wb_first`` rows ask the
L2 for their segment's weight and bias, also before the wait. Every row reads them in pass 2,
but a call whose weight and bias are not in the L2 yet (a model's next layer; the ops bench's
next input set) finds them in HBM, behind the row's own reads. On an H100 (NOTES.md,
fortieth session; timed as the ops bench times) layer_norm's 256K shelf pick 95.2 -> 96.1%
of copy at 256 rows and 89.3-89.5 -> 89.8-90.0 on 64 with two rows (1 MB asked 2 times);
every row asking lost 0.4-3.5 (the same lines asked 64 times). rms_norm, with half the
bytes to ask, and the residual picks read level or lost (-0.1 to -1.6): not taken there.
The kernel asks with ``l2_first`` itself, over the weight and bias as a tensor of
``wb_first`` "rows" of stride 0 (program t asks if t // split < wb_first).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import hopper_or_newer, is_interpreting

REQUEST = tl.constexpr(4096)  # bytes a request asks for (the asm's size)
AHEAD_ASM = tl.constexpr("{\n.reg .pred %sp;\nsetp.lt.s32 %sp, $2, $3;\n"
                         "@%sp cp.async.bulk.prefetch.L2.global [$1], 4096;\nmov.u32 $0, 0;\n}")


@triton.jit
def l2_ahead(ptr, row, M, col0, stride_m, SEG: tl.constexpr, LANES: tl.constexpr):
    """Ask the L2 for row ``row``'s SEG elements from column ``col0`` (rows ``stride_m``
    elements apart; the start 16-byte aligned, SEG's bytes a multiple of 4 KB); nothing
    when ``row`` >= M. One request a lane of the first SEG bytes / 4 KB lanes."""
    ELEMS: tl.constexpr = REQUEST * 8 // ptr.dtype.element_ty.primitive_bitwidth  # elements a request
    lane = tl.arange(0, LANES)  # (LANES,): one element a thread, so no request is issued twice
    count = tl.where(row < M, SEG // ELEMS, 0)
    p = ptr + row.to(tl.int64) * stride_m + col0 + tl.minimum(lane, SEG // ELEMS - 1) * ELEMS
    tl.inline_asm_elementwise(AHEAD_ASM, "=r,l,r,r", [p, lane, count], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def l2_first(x_ptr, r_ptr, M, HAS_RESIDUAL: tl.constexpr, SPLIT: tl.constexpr, SEG: tl.constexpr,
             COLS: tl.constexpr, N: tl.constexpr, LANES: tl.constexpr):
    """Ask the L2 for the first COLS elements of this program's own segment (of x, and r
    with a residual) of a "loop" launch over dense rows of N = SPLIT x SEG elements, program
    t taking row t // SPLIT, segment t % SPLIT: ``NormConfig.l2_first``, issued before the
    kernel waits for the previous one under programmatic dependent launch (see the module
    docstring). A prefetch to the L2 changes no value a later load sees (the L2 is where
    every SM's stores land), so it may go out while the previous kernel still writes those
    rows."""
    t = tl.program_id(0)
    col0 = (t % SPLIT) * SEG
    l2_ahead(x_ptr, t // SPLIT, M, col0, N, COLS, LANES)
    if HAS_RESIDUAL:
        l2_ahead(r_ptr, t // SPLIT, M, col0, N, COLS, LANES)


def ahead_ok(seg_bytes: int, x: torch.Tensor, *others) -> bool:
    """``l2_ahead`` may run on ``x``'s rows (and ``others``', None skipped): a compiled kernel
    (not the interpreter) on a Hopper-or-newer GPU, segments of whole 4 KB requests, every
    tensor 16-byte aligned (dense rows of such segments then start on 16 bytes too)."""
    if is_interpreting() or seg_bytes % REQUEST.value or not hopper_or_newer(x):
        return False
    return all(t is None or t.data_ptr() % 16 == 0 for t in (x, *others))


def requests(cfg, x: torch.Tensor, residual, rows: int, seg: int, even: bool, ticketless: bool,
             pdl: bool, weight=None, bias=None) -> tuple[int, int, int]:
    """(pf, columns asked first, rows whose programs ask for the weight and bias first) of a
    launch of norm config ``cfg`` over ``rows`` rows cut into
    segments of ``seg`` columns: ``cfg.pf`` on a compiled Hopper kernel of mode "loop", a row
    a program, over dense, evenly cut rows (``even``; at least ``cfg.pf_rows`` of them: the
    shape, fixed at capture, not a value) whose segments start on 16 bytes and are whole 4 KB
    requests (``ahead_ok``); ``cfg.l2_first`` chunks likewise, and only under PDL (``pdl``:
    without it the program's own loads follow at once) where program t runs row t // split
    (``ticketless``: a cluster, or one program a row); ``cfg.wb_first`` under the same
    terms where there is a ``weight`` (``bias`` may be None) and its segments are whole
    requests. 0 where no request is made."""
    if cfg.mode != "loop" or cfg.block_m != 1 or not even:
        return 0, 0, 0
    pf = cfg.pf if cfg.pf and rows >= cfg.pf_rows and ahead_ok(seg * x.element_size(), x, residual) else 0
    first = min(seg, cfg.l2_first * cfg.block_n)
    if not (first and ticketless and pdl and ahead_ok(first * x.element_size(), x, residual)):
        first = 0
    wb_rows = cfg.wb_first if weight is not None and ticketless and pdl else 0
    if wb_rows and not ahead_ok(seg * weight.element_size(), weight, bias):
        wb_rows = 0
    return pf, first, wb_rows
