"""A shelf in shared memory from Triton: the chunks a "loop" norm program reads in pass 1,
put aside for pass 2 instead of read again from L2.

Why: a wide row's pass 2 re-reads every chunk that pass 1 read. Held in registers
(``NormConfig.hold``) a chunk costs the SM occupancy (an H100's 64 warps an SM at 32
registers a thread; a 16K-column segment held at 16 warps takes ~100); re-read from the
L2 it costs L2 bandwidth beside HBM's (at 256K wide pass 2 moves as many bytes out of
the L2 as pass 1 did, and the weight as many again). Shared memory is idle in this
kernel: an H100 SM has 228 KB, four programs of a 16K-column bf16 segment want 4 x 32 KB.

Triton (3.6) exposes no shared-memory allocation, so, as ``_cluster.py`` does for its
exchange buffer, a static ``.shared`` array is declared in inline PTX (``shelf_base``
returns its address) and each thread stores and loads its own elements there
(``shelf_store`` / ``shelf_load``): a thread reads back what it wrote itself (the kernel still
puts a CTA barrier between the passes, so that this holds whatever threads Triton gives
the elements). Both take ``pack=8`` 16-bit elements an instance (four 32-bit
registers) with their 8 addresses, and move them with one 16-byte ``st.shared.v4`` /
``ld.shared.v4``: the 8 must be a thread's contiguous run, as Triton's coalesced layout
gives a thread of a bf16 / fp16 tile of >= 8 elements a thread. Each checks that the
addresses span 16 aligned bytes and traps otherwise: a loud error, never a wrong row.
(With a fallback of 8 two-byte accesses instead, all 8 addresses stay live: the 256K
rms_norm pick, 16 warps, sm_90a, went 32 -> 62 registers; checked, it keeps 32.)
"""

from __future__ import annotations

import triton
import triton.language as tl

SHELF_BYTES = 32768  # a 16384-column segment of bf16: 256K rows in 16 programs, 128K in 8


def _check(first: int) -> list[str]:
    """PTX that traps unless the pack's 8 addresses $first.. span 16 aligned bytes: the first
    16-byte aligned, the last 14 bytes above it (a thread's 8 elements of a run, in order)."""
    return [".reg .pred %sv;", ".reg .b32 %sd;", f"and.b32 %sd, ${first}, 15;", "setp.ne.u32 %sv, %sd, 0;",
            f"sub.u32 %sd, ${first + 7}, ${first};", "setp.ne.or.u32 %sv, %sd, 14, %sv;", "@%sv trap;"]


def _store_asm() -> str:
    """$0-$3: the values back (packed pairs), $4-$7 the values, $8-$15 their addresses."""
    return "\n".join(["{", *_check(8), "st.shared.v4.b32 [$8], {$4, $5, $6, $7};",
                      *[f"mov.b32 ${k}, ${4 + k};" for k in range(4)], "}"])


def _load_asm() -> str:
    """$0-$3: the values (packed pairs) at the 8 addresses $4-$11."""
    return "\n".join(["{", *_check(4), "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "}"])


BASE_ASM = tl.constexpr("{\n.shared .align 16 .b8 oshelf[" + str(SHELF_BYTES) + "];\nmov.u32 $0, oshelf;\n}")
STORE_ASM = tl.constexpr(_store_asm())
LOAD_ASM = tl.constexpr(_load_asm())
LOAD_CONSTRAINTS = tl.constexpr("=r,=r,=r,=r," + ",".join(["r"] * 8 + ["f"] * 8))  # values; addresses; ``after``


@triton.jit
def shelf_base(pid):
    """The shared address of this CTA's shelf (SHELF_BYTES; int32). ``pid``: any int32 scalar."""
    return tl.inline_asm_elementwise(BASE_ASM, "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def shelf_store(addr, v):
    """Store ``v`` (16-bit floats) at the shared addresses ``addr`` (int32, ``v``'s shape);
    returns ``v``, so that what follows uses the values after their store."""
    return tl.inline_asm_elementwise(STORE_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r", [v, addr], dtype=v.dtype,
                                     is_pure=False, pack=8)


@triton.jit
def shelf_load(addr, after, like_ptr):
    """The 16-bit floats at the shared addresses ``addr`` (int32, any shape), of the type
    ``like_ptr`` points to. ``after``: a float32 scalar computed from what was stored (the
    row's statistics), so that the load, declared pure, follows the stores by data flow.
    (Pure, Triton may give it the layout of its users' loads and stores, the coalesced one
    with each thread's 8 elements contiguous, and drops the copy in the layout it had; a
    side-effecting one is kept in both, so the slow form would run beside the fast.)"""
    return tl.inline_asm_elementwise(LOAD_ASM, LOAD_CONSTRAINTS, [addr, after],
                                     dtype=like_ptr.dtype.element_ty, is_pure=True, pack=8)


def shelf_fits(seg_cols: int, block_n: int, num_warps: int, itemsize: int) -> bool:
    """A "loop" program's segment of ``seg_cols`` columns (rounded up to whole chunks of
    ``block_n``) fits the shelf, and each thread has whole runs of 8 elements of a chunk
    (>= 8 and a multiple of 8: the 16-byte accesses above; the shelf takes 16-bit dtypes)."""
    per_thread, rem = divmod(block_n, 32 * num_warps)
    return (itemsize == 2 and rem == 0 and per_thread % 8 == 0
            and triton.cdiv(seg_cols, block_n) * block_n * itemsize <= SHELF_BYTES)
