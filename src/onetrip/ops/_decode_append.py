"""Jit helpers of ``append_attention`` (the op, in ``append_attention.py``): inside the decode
attention kernel, the rotary embedding of the new tokens' q and k and the write of their k,
v into the cache (``append_kv``'s work, without its launch).

    q_i  <- rope(q_i, p_i)           in registers only (q in memory is not changed)
    k_cache[slot(b, p_t)] <- rope(k_t, p_t),   v_cache[slot(b, p_t)] <- v_t

with p = L - q_len + i for new token i and L the length counting the new tokens.
``rope`` is ``apply_rotary``'s rotation (NeoX halves or GPT-J pairs, partial rotary), in
float32 with one rounding to the tensor's dtype, as ``append_kv`` rounds it.
"""

import triton
import triton.language as tl

from ._jit import cast_out


@triton.jit
def cache_slot(table_ptr, b, pos, ok, stride_tb, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """(block, slot) of positions ``pos`` of sequence b in the cache: (b, pos) contiguous,
    (block_table[b, pos // PAGE_SIZE], pos % PAGE_SIZE) paged (one table entry per
    position covers any page size; entries where not ``ok`` are not read)."""
    if PAGED:
        blk = tl.load(table_ptr + b.to(tl.int64) * stride_tb + pos // PAGE_SIZE, mask=ok, other=0)
        slot = pos % PAGE_SIZE
    else:
        blk = b  # a scalar: the contiguous path keeps its scalar base address
        slot = pos
    return blk, slot


@triton.jit
def rope_rows(ptr, row_off, row_ok, pos, d, head_dim, cos_ptr, sin_ptr, half, stride_cos, stride_sin,
              INTERLEAVED: tl.constexpr):
    """rope of R rows of head_dim values at ``ptr + row_off`` (R,) for positions ``pos``
    (R,): a (R, BLOCK_D) float32 tile. Each element is rotated with its pair partner, loaded
    as a second gather of the same (L1-resident) row, so the tile needs no shuffle:
    first of a pair  x1 cos - x2 sin,  second  x2 cos + x1 sin; dims past 2 * half pass."""
    if INTERLEAVED:  # GPT-J: pairs (x[2p], x[2p+1])
        p = d // 2
        first = d % 2 == 0
        partner = tl.where(first, d + 1, d - 1)
    else:            # NeoX: pairs (x[p], x[p + half])
        first = d < half
        p = tl.where(first, d, d - half)
        partner = tl.where(first, d + half, d - half)
    in_rot = d < 2 * half
    partner = tl.where(in_rot, partner, d)
    mask = row_ok[:, None] & (d < head_dim)[None, :]
    x = tl.load(ptr + row_off[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(ptr + row_off[:, None] + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    cmask = row_ok[:, None] & in_rot[None, :]
    pos64 = pos.to(tl.int64)[:, None]
    c = tl.load(cos_ptr + pos64 * stride_cos + p[None, :], mask=cmask, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + pos64 * stride_sin + p[None, :], mask=cmask, other=0.0).to(tl.float32)
    return tl.where(first[None, :], x * c - xp * s, x * c + xp * s)


@triton.jit
def new_kv(kn_ptr, vn_ptr, kc_ptr, vc_ptr, table_ptr, b, kvh, L, d, cos_ptr, sin_ptr, half,
           stride_cos, stride_sin, stride_knb, stride_kns, stride_knh, stride_vnb, stride_vns, stride_vnh,
           stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_tb, head_dim,
           Q_LEN: tl.constexpr, INTERLEAVED: tl.constexpr,
           PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr):
    """The new tokens of kv head ``kvh`` of sequence b: (k rotated, v), (BLOCK_Q, BLOCK_D)
    tiles in the cache's dtype, stored into the cache (split 0 of each (b, kvh) calls
    this), and their positions (BLOCK_Q,) with a mask."""
    t = tl.arange(0, BLOCK_Q)
    pos = L - Q_LEN + t
    t_ok = (t < Q_LEN) & (pos >= 0)  # cache_seqlens < q_len would be a caller's error: write nothing
    d_ok = d < head_dim
    k_row = b.to(tl.int64) * stride_knb + t * stride_kns + kvh * stride_knh
    k = cast_out(rope_rows(kn_ptr, k_row, t_ok, pos, d, head_dim, cos_ptr, sin_ptr, half, stride_cos, stride_sin,
                           INTERLEAVED), kc_ptr.dtype.element_ty)
    v_row = b.to(tl.int64) * stride_vnb + t * stride_vns + kvh * stride_vnh
    mask = t_ok[:, None] & d_ok[None, :]
    v = tl.load(vn_ptr + v_row[:, None] + d[None, :], mask=mask, other=0.0)
    blk, slot = cache_slot(table_ptr, b, pos, t_ok, stride_tb, PAGED, PAGE_SIZE)
    kc = blk.to(tl.int64) * stride_kb + slot * stride_ks + kvh * stride_kh
    vc = blk.to(tl.int64) * stride_vb + slot * stride_vs + kvh * stride_vh
    tl.store(kc_ptr + kc[:, None] + d[None, :], k, mask=mask)
    tl.store(vc_ptr + vc[:, None] + d[None, :], v, mask=mask)
    return k, v, pos, t_ok
