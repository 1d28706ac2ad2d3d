"""The norm's shared-memory segment (``Reuse.smem_segment``): a "loop" program copies its
row segment from HBM straight into shared memory (``cp.async``), and both its statistics
and pass 2 read it there, so nothing of the row is read twice from L2.

Why: pass 2 otherwise re-reads every chunk from L2 beside the weight and bias, and a chunk
held in registers instead costs occupancy; shared memory is idle in this kernel (an H100
SM has 228 KB, a 16K-column bf16 segment is 32 KB). On an H100, layer_norm 256 x 256K
80.6 -> 84.9% of copy. Only 16-bit dtypes, dense rows cut into whole chunks, no residual
(the launcher checks; ``smem_fits``). The asm is in ``_ptx.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._ptx import SMEM_BYTES, smem_commit, smem_fetch16, smem_quads, smem_wait_groups


@triton.jit
def smem_copy(dst, src_ptr, SEG: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr = False):
    """Start copying SEG 16-bit elements from global ``src_ptr`` (16-byte aligned) to shared
    ``dst``, BLOCK_N a step in 16-byte copies, all issued before any wait; GROUPS: each step's
    copies one ``cp.async`` group (for ``smem_sums_per_chunk``)."""
    octs = tl.arange(0, BLOCK_N // 8)[None, :]  # (1, BLOCK_N / 8): 8 elements (16 bytes) each
    q_ptr = src_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
    for i in tl.range(0, SEG, BLOCK_N):
        smem_fetch16(dst + 2 * i + 16 * octs, q_ptr + i // 4 + 2 * octs)
        if GROUPS:
            smem_commit(i)


@triton.jit
def quad_lane(q, k: tl.constexpr, like_ptr):
    """16-bit lane k (0-3, the k-th in memory) of int64 quads ``q`` as float32, of the type
    ``like_ptr`` points to (bf16: a shift; fp16: a conversion)."""
    bits = ((q.to(tl.uint64, bitcast=True) >> (16 * k)) & 0xFFFF).to(tl.uint32)
    if like_ptr.dtype.element_ty == tl.bfloat16:
        return (bits << 16).to(tl.float32, bitcast=True)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _add_quads(q, c, v1, v2, like_ptr):
    """The running sums (v1, v2) of d and d^2 over the four 16-bit lanes of quads ``q``, d = x - c."""
    for k in tl.static_range(4):
        d = quad_lane(q, k, like_ptr) - c
        v1 += d
        v2 += d * d
    return v1, v2


@triton.jit
def smem_sums(base, c, after, like_ptr, SEG: tl.constexpr, BLOCK_N: tl.constexpr):
    """(sum d, sum d^2), d = x - c, over the SEG 16-bit elements at shared ``base``, read
    after ``after`` (``smem_wait_all``'s), BLOCK_N a step as int64 quads."""
    quads = tl.arange(0, BLOCK_N // 4)[None, :]
    v1 = tl.zeros((1, BLOCK_N // 4), tl.float32)
    v2 = tl.zeros((1, BLOCK_N // 4), tl.float32)
    for i in tl.range(0, SEG, BLOCK_N):
        v1, v2 = _add_quads(smem_quads(base + 2 * i + 8 * quads, after), c, v1, v2, like_ptr)
    return tl.sum(v1), tl.sum(v2)


@triton.jit
def smem_sums_per_chunk(base, c, pid, like_ptr, CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr):
    """``smem_sums`` of CHUNKS steps copied as groups: step k is summed as soon as its own
    group is in, while the later steps still arrive."""
    quads = tl.arange(0, BLOCK_N // 4)[None, :]
    v1 = tl.zeros((1, BLOCK_N // 4), tl.float32)
    v2 = tl.zeros((1, BLOCK_N // 4), tl.float32)
    for k in tl.static_range(CHUNKS):
        q = smem_quads(base + 2 * k * BLOCK_N + 8 * quads, smem_wait_groups(pid, CHUNKS - 1 - k))
        v1, v2 = _add_quads(q, c, v1, v2, like_ptr)
    return tl.sum(v1), tl.sum(v2)


def smem_fits(seg_cols: int, block_n: int, num_warps: int, itemsize: int) -> bool:
    """A segment of ``seg_cols`` 16-bit columns, whole chunks of ``block_n``, fits SMEM_BYTES,
    and each thread of a chunk has whole runs of 8 elements (``smem_load8``'s 16-byte reads)."""
    per_thread, rem = divmod(block_n, 32 * num_warps)
    return (itemsize == 2 and rem == 0 and per_thread % 8 == 0 and seg_cols % block_n == 0
            and seg_cols * itemsize <= SMEM_BYTES)
