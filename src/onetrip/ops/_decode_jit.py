"""@triton.jit code of decode attention: a K/V tile, one tile folded into the online
softmax, and the kernel, a program per (sequence, kv head) and split (``_decode_launch.py``
launches it and the split merge; ``decode_attention.py`` has the op and its reference)."""

import triton
import triton.language as tl

from ._decode_append import cache_slot, new_kv, rope_rows
from ._jit import cast_out, dot_f32, gdc_launch_dependents, tanh


@triton.jit
def _kv_tile(k_ptr, v_ptr, blk, slot, j_ok, kvh, d, d_ok, stride_kb, stride_ks, stride_kh,
             stride_vb, stride_vs, stride_vh):
    """The (BLOCK_N, BLOCK_D) K and V tiles of the keys at cache (blk, slot) (``cache_slot``),
    zeros where not ``j_ok`` (those slots may hold anything and are never read)."""
    kv_mask = j_ok[:, None] & d_ok[None, :]
    k_off = blk.to(tl.int64) * stride_kb + slot * stride_ks + kvh * stride_kh
    k = tl.load(k_ptr + k_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    # V is issued with K, before the scores need K: both tiles' HBM latency (~1 us, cold)
    # overlaps instead of following one another.
    v_off = blk.to(tl.int64) * stride_vb + slot * stride_vs + kvh * stride_vh
    v = tl.load(v_ptr + v_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    return k, v


@triton.jit
def _attend_tile(q, k, v, j, j_ok, qpos, m_i, l_i, acc, qk_scale, softcap_log2, window_left,
                 SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, PRECISION: tl.constexpr):
    """One tile of keys j (BLOCK_N,) folded into the online softmax of the (BLOCK_M, D)
    queries at positions qpos: returns the new (m_i, l_i, acc)."""
    s = dot_f32(q, tl.trans(k), PRECISION)  # (BLOCK_M, BLOCK_N) float32
    if SOFTCAP:  # qk_scale = scale / softcap, softcap_log2 = softcap * log2(e)
        s = softcap_log2 * tanh(s * qk_scale)
    else:        # qk_scale = scale * log2(e)
        s = s * qk_scale
    visible = j_ok[None, :] & (j[None, :] <= qpos[:, None])
    if HAS_WINDOW:
        visible = visible & (j[None, :] >= qpos[:, None] - window_left)
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row with nothing visible yet keeps m = -inf; subtracting 0 instead of -inf
    # keeps its exponentials at 0 rather than NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    # P rounded to V's dtype for the tensor-core product, as FlashAttention does.
    acc = acc * alpha[:, None] + dot_f32(cast_out(p, v.dtype), v, PRECISION)
    return m_new, l_i, acc


@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr,        # q, out (B, Q_LEN, H, D); caches (blocks, block_size, KVH, D)
    seqlens_ptr, table_ptr,            # (B,) int32; (B, max_blocks) int32 when PAGED
    ws_o_ptr, ws_lse_ptr,              # SPLIT: (B * KVH, S, GROUP * Q_LEN, D) and (B * KVH, S, GROUP * Q_LEN) fp32
    kn_ptr, vn_ptr, cos_ptr, sin_ptr,  # APPEND: new k, v (B, Q_LEN, KVH, D); rotary tables (max_pos, half)
    kv_heads, num_splits, head_dim, half,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_tb,
    stride_knb, stride_kns, stride_knh, stride_vnb, stride_vns, stride_vnh, stride_cos, stride_sin,
    qk_scale, softcap_log2, window_left,
    GROUP: tl.constexpr, Q_LEN: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,   # constexpr: j // PAGE_SIZE becomes a shift
    SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,                        # "ieee" for float32 (no TF32), else "tf32"
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MIN_TILES: tl.constexpr,                        # the fewest key tiles a split takes
    APPEND: tl.constexpr, INTERLEAVED: tl.constexpr,  # rope + cache write of the new tokens (_decode_append)
    BLOCK_Q: tl.constexpr,                          # APPEND: the new tokens as one key tile (>= 16 for tl.dot)
    TABLE_AHEAD: tl.constexpr = False,              # PAGED: load the next tile's table entries early
    TRIGGER: tl.constexpr = False,                  # let the next (PDL-launched) kernel be placed now
):
    # TRIGGER (``trigger_next``): launched as usual, after the previous kernel, but lets the
    # next (PDL-launched) kernel's programs be placed on the SMs this small grid leaves
    # idle, where they can load weights that depend on nothing here (on an H100 a trigger
    # placed just before the key loop times the same).
    if TRIGGER:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // kv_heads
    kvh = pid % kv_heads
    L = tl.load(seqlens_ptr + b)
    if APPEND:  # the lengths before the append: the new tokens count from here on
        L = L + Q_LEN

    # -- the (GROUP * Q_LEN, D) queries of this kv head: row r = query i, head kvh*GROUP + g
    r = tl.arange(0, BLOCK_M)
    i = r // GROUP
    g = r % GROUP
    row_ok = r < GROUP * Q_LEN
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    q_off = b.to(tl.int64) * stride_qb + i * stride_qs + (kvh * GROUP + g) * stride_qh
    qpos = L - Q_LEN + i  # (BLOCK_M,) negative when L < Q_LEN: such rows see nothing
    if APPEND:  # rotated in registers, rounded to q's dtype as append_kv leaves it in memory
        q = cast_out(rope_rows(q_ptr, q_off, row_ok & (qpos >= 0), qpos, d, head_dim, cos_ptr, sin_ptr, half,
                               stride_cos, stride_sin, INTERLEAVED), q_ptr.dtype.element_ty)
    else:
        q = tl.load(q_ptr + q_off[:, None] + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    # -- this split's keys: the visible range [lo, L) in whole tiles, cut into runs of at
    # least MIN_TILES tiles, at most num_splits of them. Splitting the visible range (not
    # max_seq) keeps splits balanced for short sequences and sliding windows; a split past
    # the last run writes lse = -inf only (its partial output is never read).
    # APPEND: the q_len new tokens are not read from the cache (split 0 writes them there
    # during this launch) but taken from registers by split 0, as one more tile.
    L_cached = L - Q_LEN if APPEND else L
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(L - Q_LEN - window_left, 0)
    tile_lo = lo // BLOCK_N
    n_tiles = tl.maximum(tl.cdiv(L_cached, BLOCK_N) - tile_lo, 0)
    per_split = tl.maximum(tl.cdiv(n_tiles, num_splits), MIN_TILES)
    start = (tile_lo + split * per_split) * BLOCK_N
    end = tl.minimum(start + per_split * BLOCK_N, L_cached)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)  # running max, base-2 units
    l_i = tl.zeros((BLOCK_M,), tl.float32)                  # running sum of 2^(s - m)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    if APPEND:
        if split == 0:  # the new tokens first: their registers are free again for the loop
            k, v, j, j_ok = new_kv(kn_ptr, vn_ptr, k_ptr, v_ptr, table_ptr, b, kvh, L, d, cos_ptr, sin_ptr, half,
                                   stride_cos, stride_sin, stride_knb, stride_kns, stride_knh, stride_vnb,
                                   stride_vns, stride_vnh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                                   stride_vh, stride_tb, head_dim, Q_LEN, INTERLEAVED, PAGED, PAGE_SIZE,
                                   BLOCK_Q)
            m_i, l_i, acc = _attend_tile(q, k, v, j, j_ok, qpos, m_i, l_i, acc, qk_scale, softcap_log2,
                                         window_left, SOFTCAP, HAS_WINDOW, PRECISION)

    # On an H200 num_stages 2-4 time alike here, and holding the next tile in registers to
    # overlap it with this one is slower in every cell measured (batch 1 x 4K: 4 tiles a
    # program take 9.8 us for 4 us of bytes). Compiled for sm_90a with a launch's marks
    # (head_dim and strides multiples of 16), the loads are cp.async copies that Triton
    # double-buffers at its default 3 stages; without the marks (head dim 40) 137 scalar
    # loads, not pipelined (tools/ptxas_report.py). (One scalar table entry per tile where a
    # page holds the tile uses fewer registers but reads slower: paged-256, batch 64,
    # 86-101% -> 77-89% of copy on an H200.)
    if TABLE_AHEAD:  # paged: each tile's block-table entries load one tile ahead
        j = start + tl.arange(0, BLOCK_N)
        blk_next, _ = cache_slot(table_ptr, b, j, j < end, stride_tb, PAGED, PAGE_SIZE)
    for n0 in range(start, end, BLOCK_N):
        j = n0 + tl.arange(0, BLOCK_N)
        j_ok = j < end  # never read slots at or past L: they may hold anything
        if TABLE_AHEAD:
            blk = blk_next
            slot = j % PAGE_SIZE
            j_next = j + BLOCK_N
            blk_next, _ = cache_slot(table_ptr, b, j_next, j_next < end, stride_tb, PAGED, PAGE_SIZE)
        else:
            blk, slot = cache_slot(table_ptr, b, j, j_ok, stride_tb, PAGED, PAGE_SIZE)
        k, v = _kv_tile(k_ptr, v_ptr, blk, slot, j_ok, kvh, d, d_ok, stride_kb, stride_ks, stride_kh,
                        stride_vb, stride_vs, stride_vh)
        m_i, l_i, acc = _attend_tile(q, k, v, j, j_ok, qpos, m_i, l_i, acc, qk_scale, softcap_log2, window_left,
                                     SOFTCAP, HAS_WINDOW, PRECISION)
    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # rows with no visible key: 0
    if SPLIT:
        lse = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
        rows = (pid.to(tl.int64) * num_splits + split) * (GROUP * Q_LEN) + r
        tl.store(ws_lse_ptr + rows, lse, mask=row_ok)
        # (vector compares: the interpreter refuses a scalar in a mask)
        o_ok = row_ok & ((start + tl.zeros_like(r) < end) | ((split + tl.zeros_like(r) == 0) & APPEND))
        tl.store(ws_o_ptr + rows[:, None] * head_dim + d[None, :], o, mask=o_ok[:, None] & d_ok[None, :])
    else:
        o_off = b.to(tl.int64) * stride_ob + i * stride_os + (kvh * GROUP + g) * stride_oh
        tl.store(o_ptr + o_off[:, None] + d[None, :], cast_out(o, o_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])
