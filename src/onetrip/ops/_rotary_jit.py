"""@triton.jit helpers of the rotary embedding, shared by ``apply_rotary``'s kernel
(``rotary.py``) and ``append_kv``'s: the columns of a rotated pair, a chunk of heads'
row pointers, the pair's loads and rotated stores, the pass-through dims of partial
rotary, and the cos/sin rows of each token's position.

    out1 = x1 cos - x2 sin,    out2 = x2 cos + x1 sin      (float32, one rounding)

and, with sin negated, its inverse (the backward of apply_rotary).
"""

import triton
import triton.language as tl

from ._jit import cast_out


@triton.jit
def pair_cols(INTERLEAVED: tl.constexpr, BLOCK_HALF: tl.constexpr, half):
    """Columns (BLOCK_HALF,) of x1 and x2 in a head. Both layouts are the same rotation of
    (x1, x2); only the columns of the pair differ. Constexpr, so that each layout compiles
    to straight-line address arithmetic."""
    i = tl.arange(0, BLOCK_HALF)
    if INTERLEAVED:  # GPT-J: pairs (x[2i], x[2i+1])
        return 2 * i, 2 * i + 1
    else:  # NeoX: x1 = x[:rot/2], x2 = x[rot/2:rot]
        return i, i + half


@triton.jit
def head_rows(ptr, tok_off, tok_ok, stride_h, n_heads, h0, BLOCK_H: tl.constexpr):
    """Pointers (BLOCK_T, BLOCK_H, 1) to the first element of heads h0 .. h0 + BLOCK_H - 1
    of each token, and their mask."""
    h = h0 + tl.arange(0, BLOCK_H)
    ok = tok_ok[:, None, None] & (h < n_heads)[None, :, None]
    return ptr + tok_off[:, None, None] + (h * stride_h)[None, :, None], ok


@triton.jit
def load_pair(s, ok, half, INTERLEAVED: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """x1, x2 (BLOCK_T, BLOCK_H, BLOCK_HALF) float32 of the rows at ``s``."""
    c1, c2 = pair_cols(INTERLEAVED, BLOCK_HALF, half)
    mask = ok & (tl.arange(0, BLOCK_HALF) < half)[None, None, :]
    x1 = tl.load(s + c1[None, None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(s + c2[None, None, :], mask=mask, other=0.0).to(tl.float32)
    return x1, x2


@triton.jit
def store_pair(d, ok, half, x1, x2, cos, sin, INTERLEAVED: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin into the rows at ``d``."""
    c1, c2 = pair_cols(INTERLEAVED, BLOCK_HALF, half)
    mask = ok & (tl.arange(0, BLOCK_HALF) < half)[None, None, :]
    tl.store(d + c1[None, None, :], cast_out(x1 * cos - x2 * sin, d.dtype.element_ty), mask=mask)
    tl.store(d + c2[None, None, :], cast_out(x2 * cos + x1 * sin, d.dtype.element_ty), mask=mask)


@triton.jit
def load_tail(s, ok, half, tail, BLOCK_TAIL: tl.constexpr):
    """The pass-through dims rot .. head_dim (BLOCK_T, BLOCK_H, BLOCK_TAIL) of the rows at ``s``."""
    j = tl.arange(0, BLOCK_TAIL)
    return tl.load(s + 2 * half + j[None, None, :], mask=ok & (j < tail)[None, None, :])


@triton.jit
def store_tail(d, ok, half, tail, x, BLOCK_TAIL: tl.constexpr):
    j = tl.arange(0, BLOCK_TAIL)
    tl.store(d + 2 * half + j[None, None, :], x, mask=ok & (j < tail)[None, None, :])


@triton.jit
def rotate_heads(
    src, dst,  # one tensor's (B, S, heads, D) views, unit stride along D
    tok_src, tok_dst, tok_ok,  # (BLOCK_T,) int64 offsets of each token's first element; (BLOCK_T,) mask
    stride_sh, stride_dh, n_heads, half, tail,
    cos, sin,  # (BLOCK_T, 1, BLOCK_HALF) float32: the tokens' rows, shared by all heads
    INTERLEAVED: tl.constexpr, COPY_TAIL: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr,
):
    """One tensor's heads, BLOCK_H at a time: each chunk's rotated pairs are loaded and
    stored, then its pass-through dims (partial rotary, out of place) copied."""
    for h0 in range(0, n_heads, BLOCK_H):
        s, ok = head_rows(src, tok_src, tok_ok, stride_sh, n_heads, h0, BLOCK_H)
        d, _ = head_rows(dst, tok_dst, tok_ok, stride_dh, n_heads, h0, BLOCK_H)
        x1, x2 = load_pair(s, ok, half, INTERLEAVED, BLOCK_HALF)
        store_pair(d, ok, half, x1, x2, cos, sin, INTERLEAVED, BLOCK_HALF)
        if COPY_TAIL:
            store_tail(d, ok, half, tail, load_tail(s, ok, half, tail, BLOCK_TAIL), BLOCK_TAIL)


@triton.jit
def cos_sin_rows(cos_ptr, sin_ptr, pos, tok_ok, half, stride_cos, stride_sin, BLOCK_HALF: tl.constexpr,
                 NEG_SIN: tl.constexpr = False):
    """The cos and sin rows of each token's position, float32 (BLOCK_T, 1, BLOCK_HALF):
    loaded once per token and broadcast over all of its q and k heads. ``NEG_SIN``: -sin,
    the rotation by -theta (the backward: the rotation's transpose is its inverse)."""
    i = tl.arange(0, BLOCK_HALF)
    cmask = tok_ok[:, None] & (i < half)[None, :]
    cos = tl.load(cos_ptr + pos[:, None] * stride_cos + i[None, :], mask=cmask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos[:, None] * stride_sin + i[None, :], mask=cmask, other=0.0).to(tl.float32)
    if NEG_SIN:
        sin = -sin
    return cos[:, None, :], sin[:, None, :]
