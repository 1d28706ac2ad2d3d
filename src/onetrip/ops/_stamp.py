"""Time stamps from inside a kernel (Hopper or any NVIDIA GPU; not Triton's interpreter): when
each program reached each phase, for ``benchmarks/norm_timeline.py``'s picture of a launch.

Why: a norm over 64 rows of 256K runs ~26 us on an H100, 2-3 us more than a plain kernel
moving its bytes (benchmarks/NOTES.md, thirty-second session), and every design tried so far
was judged by that total alone. Where the 2-3 us go (the first wave's wait on its sums, the
last wave's tail, the gap between a program's end and the next one's start on its SM) is
visible only from the programs' own clocks.

``stamp(after)`` reads ``%globaltimer`` (ns, common to the SMs) and ``%clock64`` (the SM's
cycles) once ``after`` (a float32 scalar) is known: the reads are predicated on a test of
``after``'s bits (true unless they are one NaN pattern), so ptxas cannot issue them before
the value exists; an unpredicated read would be free to move above the work it should
follow. Stamps cost a few instructions and a store each.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# $0, $1: %globaltimer, %clock64; $2: after's bits. 0x7FC00001 (a NaN no computation here
# yields) makes the predicate false, and the stamp 0: harmless, and unknowable to ptxas.
STAMP_ASM = tl.constexpr("\n".join([
    "{", ".reg .pred %tp;", "setp.ne.u32 %tp, $2, 2143289345;", "mov.u64 $0, 0;", "mov.u64 $1, 0;",
    "@%tp mov.u64 $0, %globaltimer;", "@%tp mov.u64 $1, %clock64;", "}"]))

STAMP_FIELDS = ("smid", "pid", "row", "seg", "g0", "g1", "g2", "g3", "c0", "c1", "c2", "c3")  # a program's int64s
STAMP_WORDS = tl.constexpr(len(STAMP_FIELDS))


def check_trace(trace, programs: int, cluster: bool, what: str) -> None:
    """A ValueError unless ``trace`` can take the stamps of ``programs`` programs of a launch
    of clusters (contiguous int64, STAMP_WORDS a program); ``what``: the launch, for the message."""
    if not (cluster and trace.dtype == torch.int64 and trace.is_contiguous()
            and trace.numel() >= STAMP_WORDS * programs):
        raise ValueError(f"trace: stamps are taken of a launch of clusters into a contiguous int64 tensor of "
                         f"{STAMP_WORDS * programs} or more; got {tuple(trace.shape)} {trace.dtype} for a "
                         f"{'cluster' if cluster else 'non-cluster'} launch of {what}")


@triton.jit
def stamp(after):
    """(%globaltimer, %clock64) as int64, read once ``after`` (float32 scalar) is known."""
    return tl.inline_asm_elementwise(STAMP_ASM, "=l,=l,r", [after.to(tl.float32).to(tl.int32, bitcast=True)],
                                     dtype=(tl.int64, tl.int64), is_pure=False, pack=1)


@triton.jit
def sm_id(pid):
    """The SM this program runs on (``%smid``); ``pid``: any int32 scalar."""
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def stamp_phase(trace_ptr, pid, k: tl.constexpr, after):
    """Stamp k (0-3) of program ``pid``, taken once ``after`` (float32 scalar) is known, stored."""
    p = trace_ptr.to(tl.pointer_type(tl.int64)) + pid.to(tl.int64) * STAMP_WORDS
    s = stamp(after)
    tl.store(p + 4 + k, s[0])
    tl.store(p + 8 + k, s[1])


@triton.jit
def stamp_start(trace_ptr, pid, row, seg):
    """Program ``pid``'s record (STAMP_FIELDS: STAMP_WORDS int64 from trace_ptr + STAMP_WORDS pid): its SM, pid, row
    and segment, and stamp 0 (taken now). Each stamp is stored as it is taken, so that none
    holds registers through the kernel (two int64 a stamp held to the end cost add_rms_norm's
    64-row pick 2 registers over 64: half its CTAs an SM)."""
    stamp_phase(trace_ptr, pid, 0, row.to(tl.float32))
    p = trace_ptr.to(tl.pointer_type(tl.int64)) + pid.to(tl.int64) * STAMP_WORDS
    tl.store(p, sm_id(pid).to(tl.int64))
    tl.store(p + 1, pid.to(tl.int64))
    tl.store(p + 2, row.to(tl.int64))
    tl.store(p + 3, seg.to(tl.int64))
