"""A shelf in shared memory from Triton: a "loop" norm program's segment copied from HBM
straight into shared memory (``cp.async``), its statistics and pass 2 read from there
instead of pass 2 reading the segment again from L2.

Why: a wide row's pass 2 re-reads every chunk that pass 1 read. Held in registers
(``NormConfig.hold``) a chunk costs occupancy (an H100's 64 warps an SM at 32 registers a
thread); re-read from L2 it costs L2 bandwidth beside the weight's and bias's, which pass
2 reads from L2 for every row too. Shared memory is idle in the norm kernel (an H100 SM
has 228 KB; a 16K-column bf16 segment is 32 KB). On an H100 (NOTES.md, twentieth session,
timed as the ops bench times): layer_norm 256 x 256K 80.6 -> 84.9% of copy, 512 x 128K
88.3 -> 89.5, 64 x 256K 70.0 -> 72.0; RMSNorm, with no bias to read, +-0.5.

Triton (3.6) exposes no shared-memory allocation, so, as ``_cluster.py`` does for its
exchange buffer, a static ``.shared`` array is declared in inline PTX (``shelf_base``) and:
  * ``shelf_fetch``: ``cp.async.ca`` copies of 16 bytes (8 bf16 / fp16; ``shelf_copy``'s)
    or 8 (benchmarks/' experiments), one asm per copy (pack=1), so the copy is right
    whatever elements Triton gives a thread; every copy of the segment is issued before any
    is waited on (SASS: LDGSTS back to back). 16 bytes against 8 on an H100 (tune_ops,
    rotate 4, nine processes; NOTES.md, twenty-sixth session): layer_norm's shelf picks
    +0.7-0.9 points of copy at 256 x 256K, +2.2 at 64 x 256K, level at 512 x 128K. (The
    ops bench could not tell them apart then: its "slow state", which the twenty-seventh
    session traced to torch's ptxas building the kernel, moved these cells by 1-5 points;
    the picks' ``maxnreg`` now removes it.) Past the L1 (``.cg``) the copies lost 1.1 points
    at 128K; one bulk copy a program (TMA, an mbarrier behind the shelf) lost 0.7-1.4.
    A first version stored each chunk from registers after its load, and in-order issue
    then held the next load behind each store (LDG STS LDG STS): one chunk in flight, 88 ->
    66% at 256K. (With an ``L2::cache_hint`` policy the copy raised an illegal instruction
    on an H100, so it has none.)
  * ``shelf_wait``: ``cp.async.wait_all`` and a CTA barrier in one asm whose result the
    loads depend on, so that the loads, declared pure, cannot be scheduled above it; after
    it every thread may read any thread's copies.
  * ``shelf_quads``: the statistics' reads, int64 quads, pack=1 (any layout);
    ``quad_lane`` unpacks one 16-bit lane to float32.
  * ``shelf_copy`` and ``shelf_sums``: a whole segment's copies, and its sums of d and
    d^2 read back (the library's pass 1, in ``_norm_jit._loop_row``). ``shelf_sums_piped``
    (with ``shelf_copy``'s GROUPS: each chunk's copies committed as a ``cp.async`` group)
    sums chunk k once its own group is in (``cp.async.wait_group``, then a CTA barrier),
    while the later chunks still arrive, instead of after the last one.
  * ``shelf_load``: pass 2's reads, pack=8 16-bit elements with one 16-byte ``ld.shared.v4``,
    in the layout of y's coalesced store (Triton gives a pure asm its users' layout): the 8
    must be a thread's contiguous run, which needs 16-byte aligned rows and >= 8 elements
    a thread (``shelf_fits``, and the launcher's alignment test). The asm checks that its
    addresses span 16 aligned bytes and traps otherwise: a loud error, never a wrong row.
"""

from __future__ import annotations

import triton
import triton.language as tl

SHELF_BYTES = 32768  # a 16384-column segment of bf16: 256K rows in 16 programs, 128K in 8


def _load_asm() -> str:
    """$0-$3: the values (packed pairs) at the 8 addresses $4-$11; traps unless those span
    16 aligned bytes (the first 16-byte aligned, the last 14 bytes above it)."""
    return "\n".join(["{", ".reg .pred %sv;", ".reg .b32 %sd;", "and.b32 %sd, $4, 15;", "setp.ne.u32 %sv, %sd, 0;",
                      "sub.u32 %sd, $11, $4;", "setp.ne.or.u32 %sv, %sd, 14, %sv;", "@%sv trap;",
                      "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "}"])


BASE_ASM = tl.constexpr("{\n.shared .align 16 .b8 oshelf[" + str(SHELF_BYTES) + "];\nmov.u32 $0, oshelf;\n}")
FETCH8_ASM = tl.constexpr("cp.async.ca.shared.global [$1], [$2], 8;\nmov.u32 $0, 0;")
FETCH16_ASM = tl.constexpr("cp.async.ca.shared.global [$1], [$2], 16;\nmov.u32 $0, 0;")
WAIT_ASM = tl.constexpr("cp.async.wait_all;\nbar.sync 0;\nmov.b32 $0, 0;")
COMMIT_ASM = tl.constexpr("cp.async.commit_group;\nmov.u32 $0, 0;")

# wait until at most P of this thread's groups are pending, then the CTA's barrier (P = 0-3;
# the count is an immediate, so one string each)
GROUP_WAIT0, GROUP_WAIT1, GROUP_WAIT2, GROUP_WAIT3 = (
    tl.constexpr(f"cp.async.wait_group {p};\nbar.sync 0;\nmov.b32 $0, 0;") for p in range(4))
LOAD_ASM = tl.constexpr(_load_asm())
LOAD_CONSTRAINTS = tl.constexpr("=r,=r,=r,=r," + ",".join(["r"] * 8 + ["f"] * 8))  # values; addresses; ``after``


@triton.jit
def shelf_base(pid):
    """The shared address of this CTA's shelf (SHELF_BYTES; int32). ``pid``: any int32 scalar."""
    return tl.inline_asm_elementwise(BASE_ASM, "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def shelf_fetch(addr, quad_ptrs, BYTES: tl.constexpr):
    """Start copying BYTES (8 or 16) from each global int64 ``quad_ptrs`` to the shared
    ``addr`` (int32); both BYTES-aligned. (The library copies 16; benchmarks/' experiments 8.)"""
    tl.static_assert(BYTES == 8 or BYTES == 16, "cp.async copies 8 or 16 bytes here")
    tl.inline_asm_elementwise(FETCH8_ASM if BYTES == 8 else FETCH16_ASM, "=r,r,l",
                              [addr, quad_ptrs.to(tl.int64, bitcast=True)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def shelf_wait(pid):
    """Wait for this thread's copies, then for the CTA's (a barrier); returns float32 0.0,
    to be passed as ``after`` to every read of the copies."""
    return tl.inline_asm_elementwise(WAIT_ASM, "=r,r", [pid], dtype=tl.int32, is_pure=False,
                                     pack=1).to(tl.float32, bitcast=True)


@triton.jit
def shelf_quads(addr, after):
    """The int64 at each shared ``addr`` (int32, any shape), read after ``after``."""
    return tl.inline_asm_elementwise("ld.shared.b64 $0, [$1];", "=l,r,f", [addr, after], dtype=tl.int64,
                                     is_pure=True, pack=1)


@triton.jit
def quad_lane(q, k: tl.constexpr, like_ptr):
    """16-bit lane k (0-3, the k-th element in memory) of int64 quads ``q``, as float32, of
    the type ``like_ptr`` points to (bf16: a shift; fp16: a conversion)."""
    bits = ((q.to(tl.uint64, bitcast=True) >> (16 * k)) & 0xFFFF).to(tl.uint32)
    if like_ptr.dtype.element_ty == tl.bfloat16:
        return (bits << 16).to(tl.float32, bitcast=True)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def shelf_load(addr, after, like_ptr):
    """The 16-bit floats at the shared addresses ``addr`` (int32, any shape), of the type
    ``like_ptr`` points to, read after ``after`` (a float32 scalar computed from earlier
    reads of the shelf, or ``shelf_wait``'s). Pure, so that Triton gives it its users'
    layout (a side-effecting one was kept in its own layout beside a copy in theirs)."""
    return tl.inline_asm_elementwise(LOAD_ASM, LOAD_CONSTRAINTS, [addr, after], dtype=like_ptr.dtype.element_ty,
                                     is_pure=True, pack=8)


@triton.jit
def shelf_copy(dst, src_ptr, SEG: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr = False):
    """Start copying SEG 16-bit elements from global ``src_ptr`` (16-byte aligned) to the
    shared address ``dst``, BLOCK_N a step in 16-byte copies; every copy is issued before
    any is waited on (``shelf_wait``; GROUPS: each step's copies committed as a group, for
    ``shelf_sums_piped``)."""
    octs = tl.arange(0, BLOCK_N // 8)[None, :]  # (1, BLOCK_N / 8): 8 elements (16 bytes) each
    q_ptr = src_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
    for i in tl.range(0, SEG, BLOCK_N):
        shelf_fetch(dst + 2 * i + 16 * octs, q_ptr + i // 4 + 2 * octs, 16)
        if GROUPS:
            tl.inline_asm_elementwise(COMMIT_ASM, "=r,r", [i], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def shelf_sums(base, c, after, like_ptr, SEG: tl.constexpr, BLOCK_N: tl.constexpr):
    """(sum d, sum d^2) of d = x - c over the SEG 16-bit elements (of ``like_ptr``'s type)
    on the shelf at ``base``, read after ``after``, BLOCK_N a step as int64 quads."""
    quads = tl.arange(0, BLOCK_N // 4)[None, :]
    v1 = tl.zeros((1, BLOCK_N // 4), tl.float32)
    v2 = tl.zeros((1, BLOCK_N // 4), tl.float32)
    for i in tl.range(0, SEG, BLOCK_N):
        v1, v2 = _add_quads(shelf_quads(base + 2 * i + 8 * quads, after), c, v1, v2, like_ptr)
    return tl.sum(v1), tl.sum(v2)


@triton.jit
def _add_quads(q, c, v1, v2, like_ptr):
    """The running sums (v1, v2) of d and d^2 over the four 16-bit lanes of quads ``q``, d = x - c."""
    for k in tl.static_range(4):
        d = quad_lane(q, k, like_ptr) - c
        v1 += d
        v2 += d * d
    return v1, v2


@triton.jit
def group_wait(pid, PENDING: tl.constexpr):
    """Wait until at most PENDING (0-3; more waits as for 3) of this thread's copy groups are
    pending, then for the CTA (a barrier); returns float32 0.0 for the reads' ``after``.
    (ptxas schedules the previous chunk's sums after this wait: they touch no memory. A
    shared store under a never-true predicate that depends on them keeps them before it, and
    bought nothing on an H100: NOTES.md, thirty-sixth session, run 11.)"""
    ASM: tl.constexpr = GROUP_WAIT0 if PENDING == 0 else (
        GROUP_WAIT1 if PENDING == 1 else (GROUP_WAIT2 if PENDING == 2 else GROUP_WAIT3))
    g = tl.inline_asm_elementwise(ASM, "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)
    return g.to(tl.float32, bitcast=True)


@triton.jit
def shelf_sums_piped(base, c, pid, like_ptr, CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr):
    """``shelf_sums`` of CHUNKS steps of BLOCK_N copied by ``shelf_copy`` with GROUPS: step k
    read once its group is in, while steps k + 1 on may still be arriving."""
    quads = tl.arange(0, BLOCK_N // 4)[None, :]
    v1 = tl.zeros((1, BLOCK_N // 4), tl.float32)
    v2 = tl.zeros((1, BLOCK_N // 4), tl.float32)
    for k in tl.static_range(CHUNKS):
        q = shelf_quads(base + 2 * k * BLOCK_N + 8 * quads, group_wait(pid, CHUNKS - 1 - k))
        v1, v2 = _add_quads(q, c, v1, v2, like_ptr)
    return tl.sum(v1), tl.sum(v2)


def shelf_fits(seg_cols: int, block_n: int, num_warps: int, itemsize: int) -> bool:
    """A "loop" program's segment of ``seg_cols`` columns, a whole number of chunks of
    ``block_n``, fits the shelf, and each thread of a chunk has whole runs of 8 elements
    (>= 8, a multiple of 8: the 16-byte reads above; the shelf takes 16-bit dtypes)."""
    per_thread, rem = divmod(block_n, 32 * num_warps)
    return (itemsize == 2 and rem == 0 and per_thread % 8 == 0 and seg_cols % block_n == 0
            and seg_cols * itemsize <= SHELF_BYTES)
