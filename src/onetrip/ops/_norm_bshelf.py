"""LayerNorm's bias through the shelf (``NormConfig.bshelf``): pass 2 of a "loop" shelf
program (``_shelf.py``) takes its bias from shared memory, copied there steps ahead, and
its weight from registers loaded two steps ahead, so that no step of pass 2 waits on an L2
round trip of its own.

Why (H100, NOTES.md, thirty-fifth session): layer_norm 64 x 256K reads 85.8% of copy with
its weight and bias, 88.4% with the weight alone and 94.9% with neither; pass 2's median is
2.6-3.1 us with them against 2.1-2.4 without. Each chunk of pass 2 asks the L2 for its
weight and bias only after the previous chunk's stores (a store may alias them), and waits
for them. Carrying them ahead in registers costs what the shelf picks do not have (a cap
of 48 registers for five CTAs an SM; runs 2-4 and 10 of that session lost), and the L1
prefetch of them lost too (``wb_l1``). Shared memory has room: five CTAs of 33.2 KB use
166 of an SM's 228 KB, so 12 KB more a CTA still fits five.

How, for a segment of S steps of BLOCK_N (<= 2048) columns, x's shelf slot k holding step
k's x (2 BLOCK_N bytes; a step's bias is as many):
  * pass 1 copies the bias of steps 0-2 into the bias area (``bias_base``, 12 KB) beside
    the shelf's copies, and the weight of steps 0 and 1 is loaded while the sums travel;
  * step k >= 1 begins with ``step_gate``: commit the copies issued at step k - 1, wait for
    all but them (so step k's bias, issued at step k - 2, is in), and a CTA barrier (so it
    is every thread's, and every thread has read slot k - 1: its reads fed step k - 1's
    stores, which precede the barrier). Then the bias of step k + 2 is copied into slot
    k - 1: two steps ahead; step k's bias is in the bias area (k < 3) or in slot k - 3;
  * the weight of step k + 2 is loaded into registers at step k.
One barrier a step; 4 bytes a thread of bias in flight, no registers for it.
"""

import triton
import triton.language as tl

from ._norm_chunk import _chunk_cols, _load_wb, _store_y, _tile_mask
from ._shelf import shelf_fetch, shelf_load

BIAS_BYTES = 12288  # three steps of 2048 bf16 columns: 5 CTAs x (32 + 12 + 0.2 KB) + 1 KB each fit 228 KB
BIAS_STEPS = tl.constexpr(3)
BIAS_ASM = tl.constexpr("{\n.shared .align 16 .b8 obias[" + str(BIAS_BYTES) + "];\nmov.u32 $0, obias;\n}")
# commit this thread's copies of the last step, wait for all but that group, then the CTA's barrier
GATE_ASM = tl.constexpr("cp.async.commit_group;\ncp.async.wait_group 1;\nbar.sync 0;\nmov.b32 $0, 0;")


def bshelf_fits(block_n: int) -> bool:
    """Three steps of ``block_n`` 16-bit columns fit the bias area."""
    return BIAS_STEPS.value * 2 * block_n <= BIAS_BYTES


@triton.jit
def bias_base(pid):
    """The shared address of this CTA's bias area (BIAS_BYTES; int32). ``pid``: any int32 scalar."""
    return tl.inline_asm_elementwise(BIAS_ASM, "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def step_gate(pid):
    """Commit this thread's outstanding copies as a group, wait until at most that group is
    pending, then a CTA barrier; returns float32 0.0 for ``shelf_load``'s ``after``."""
    return tl.inline_asm_elementwise(GATE_ASM, "=r,r", [pid], dtype=tl.int32, is_pure=False,
                                     pack=1).to(tl.float32, bitcast=True)


@triton.jit
def _copy_step(dst, b_ptr, col, BLOCK_N: tl.constexpr):
    """Start copying the bias of columns [col, col + BLOCK_N) to the shared address ``dst``
    in 16-byte copies (b_ptr + col 16-byte aligned)."""
    octs = tl.arange(0, BLOCK_N // 8)[None, :]
    q_ptr = (b_ptr + col).to(tl.pointer_type(tl.int64), bitcast=True)
    shelf_fetch(dst + 16 * octs, q_ptr + 2 * octs, 16)


@triton.jit
def bias_first(bbase, b_ptr, col0, STEPS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pass 1's part: start copying the bias of the segment's first (up to) three steps into
    the bias area (waited on with the shelf's copies)."""
    for k in tl.static_range(BIAS_STEPS):
        if k < STEPS:
            _copy_step(bbase + 2 * k * BLOCK_N, b_ptr, col0 + k * BLOCK_N, BLOCK_N)


@triton.jit
def bshelf_pass2(w_ptr, b_ptr, y_ptr, x_ptr, base, bbase, ww, row, rows, M, col0, N, c, rstd, mean_lo, stride_ym,
                 HAS_WEIGHT: tl.constexpr, STEPS: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr,
                 DROP_Y: tl.constexpr, FOLD: tl.constexpr):
    """Pass 2 of a LayerNorm shelf segment of STEPS steps of BLOCK_N columns, with a bias
    (module docstring): x from the shelf
    at ``base``, the bias from the bias area at ``bbase`` and from freed shelf slots, the
    weight from ``ww`` (steps 0 and 1, ``_pre_wb``'s tuple) then two steps ahead."""
    STEP: tl.constexpr = 2 * BLOCK_N  # bytes of a step's x (or bias)
    ar = tl.arange(0, BLOCK_N)
    tl.static_assert(STEPS >= 2, "the weight of steps 0 and 1 comes loaded (ww)")
    w_now = ww[0][0]
    w_next = ww[1][0]
    after = rstd  # x's slots and the bias area are in since the shelf's wait
    for k in tl.static_range(STEPS):
        if k > 0:
            after = step_gate(row)
            if k + 2 < STEPS:
                _copy_step(base + (k - 1) * STEP, b_ptr, col0 + (k + 2) * BLOCK_N, BLOCK_N)
        w = w_now
        w_now = w_next
        if k + 2 < STEPS:
            cols2, ok2 = _chunk_cols(col0, (k + 2) * BLOCK_N, N, BLOCK_N, EVEN)
            w_next, _ = _load_wb(w_ptr, b_ptr, cols2, ok2, HAS_WEIGHT, False)
        if k < BIAS_STEPS:
            baddr = bbase + k * STEP
        else:
            baddr = base + (k - BIAS_STEPS) * STEP
        b = shelf_load(baddr + 2 * ar, after, b_ptr)  # (BLOCK_N,)
        h = shelf_load(base + k * STEP + 2 * ar[None, :], after, x_ptr).to(tl.float32)  # (1, BLOCK_N)
        cols, col_ok = _chunk_cols(col0, k * BLOCK_N, N, BLOCK_N, EVEN)
        _store_y(y_ptr, h, c, rstd, w, b, rows, cols, _tile_mask(rows, M, col_ok, 1), stride_ym, False, False,
                 HAS_WEIGHT, True, mean_lo, TWO_PART=True, EVICT=DROP_Y, FOLD=FOLD)
