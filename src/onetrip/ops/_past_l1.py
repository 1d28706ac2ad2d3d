"""Pass 1 of the "loop" norm with x loaded past the L1, its L2 hint kept (inline PTX;
``NormConfig.l1w``).

Why: Triton gives a load's ``eviction_policy`` to both caches (``ld.global.L1::evict_last
.L2::cache_hint``), and PTX takes no eviction hint beside ``.cg``. Pass 1 of a wide row
loads x evict_last so that pass 2 finds it in L2; in the L1 the same hint keeps lines the
SM never reads again and pushes out the segment's weight, which the SM's other programs
read next (the H100 places a cluster rank on the same SMs for every row). Nsight Compute
on an H100: the loop picks' global loads hit the L1 5% of the time, the shelf's (copies
without a hint) 31%. ``.cg`` alone, which drops the L2 hint, lost 1-8 points where that hint
mattered (NOTES.md, twenty-second session).

``past_l1_sums``: pass 1's sums of d = x - c over a segment, read as int64 quads (4
16-bit elements) with ``ld.global.L1::no_allocate.L2::cache_hint.b64``, one asm an element
(pack=1: right whatever quads Triton gives a thread, one 64-bit address each, where a
16-byte pack=8 load would take eight); the sums do not need the elements in order
(``_shelf.quad_lane`` unpacks a lane). Dense 16-bit rows of whole chunks, 8-byte aligned,
no residual (pass 1 then stores nothing).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._shelf import quad_lane

# $0: the int64 at $1, past the L1, kept in the L2 (evict_last: pass 2 reads it again)
KEEP_ASM = tl.constexpr("{\n.reg .b64 %pol;\ncreatepolicy.fractional.L2::evict_last.b64 %pol, 1.0;\n"
                        "ld.global.L1::no_allocate.L2::cache_hint.b64 $0, [$1], %pol;\n}")


@triton.jit
def past_l1_quads(q_ptrs):
    """The int64 at each ``q_ptrs``, past the L1, kept in the L2."""
    return tl.inline_asm_elementwise(KEEP_ASM, "=l,l", [q_ptrs.to(tl.int64, bitcast=True)], dtype=tl.int64,
                                     is_pure=True, pack=1)


@triton.jit
def past_l1_sums(row_ptr, c, start, SEG: tl.constexpr, BLOCK_N: tl.constexpr):
    """(sum d, sum d^2) of d = x - c over columns [start, SEG) of the 16-bit row at ``row_ptr``
    (the segment's first column), BLOCK_N a step."""
    quads = tl.arange(0, BLOCK_N // 4)
    q_ptr = row_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
    v1 = tl.zeros((BLOCK_N // 4,), tl.float32)
    v2 = tl.zeros((BLOCK_N // 4,), tl.float32)
    for i in tl.range(start, SEG, BLOCK_N):
        q = past_l1_quads(q_ptr + i // 4 + quads)
        for k in tl.static_range(4):
            d = quad_lane(q, k, row_ptr) - c
            v1 += d
            v2 += d * d
    return tl.sum(v1), tl.sum(v2)
