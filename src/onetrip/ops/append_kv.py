"""Rotary embedding of the new tokens' q and k, and their k, v written into the KV cache: one launch.

At a decode step (or speculative verification) each sequence b brings q_len new tokens
at positions  pos = cache_seqlens[b] + i,  i < q_len  (the lengths BEFORE this append):

    q[b, i]                    <- rope(q[b, i], pos)          in place
    k_cache[slot(b, pos)]      <- rope(k[b, i], pos)
    v_cache[slot(b, pos)]      <- v[b, i]

with slot(b, pos) = (b, pos) for a contiguous cache and (block_table[b, pos // block_size],
pos % block_size) for a paged one. ``rope`` is the rotation of ``apply_rotary`` (NeoX or
GPT-J pairs, partial rotary: dims past rot_dim pass through), computed in float32 with
one rounding. cache_seqlens is NOT updated: the caller adds q_len afterwards, on the
device (``cache_seqlens += q_len``), and then calls ``decode_attention``, which expects
the new tokens to be counted in the lengths. A decode step is therefore

    append_kv(q, k, v, k_cache, v_cache, seqlens, cos, sin)   # positions seqlens + i
    seqlens += q_len
    out = decode_attention(q, k_cache, v_cache, seqlens)

Bytes: unfused, rotary writes q and k (reading them), then two index_put kernels read k
and v again and scatter them: ~3 extra passes over k and v and 3-5 launches (plus ~6 for
the cos/sin gathers of the Hugging Face form). Fused: q read and written once, k and v
read once and written once, directly into the cache.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import call_op, cdiv, check_tensor, heads_view, next_pow2, sm_count, use_triton
from ._kv_checks import check_cache, check_new_kv
from ._launch import launch, meta_key
from ._rotary_jit import cos_sin_rows, rotate_heads
from .rotary import RotaryConfig, apply_rotary_ref, rotary_config


@triton.jit
def _append_kv_kernel(
    q_ptr, k_ptr, v_ptr,                # (B, Q_LEN, H, D), (B, Q_LEN, KVH, D) x 2; unit stride along D
    kc_ptr, vc_ptr,                     # caches (batch or blocks, max_seq or block_size, KVH, D)
    cos_ptr, sin_ptr,                   # (max_pos, half), unit column stride
    seqlens_ptr, table_ptr,             # (B,) int32; (B, max_blocks) int32 when PAGED
    n_tokens, q_len, q_heads, kv_heads, half, tail, head_dim,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    stride_cos, stride_sin, stride_tb,
    INTERLEAVED: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, COPY_TAIL: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # 64-bit token offsets: b * stride exceeds 2**31 elements for caches over 4 GiB.
    tok = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tok_ok = tok < n_tokens
    b = tok // q_len
    i = tok % q_len
    pos = tl.load(seqlens_ptr + b, mask=tok_ok, other=0).to(tl.int64) + i  # (BLOCK_T,)
    if PAGED:
        blk = tl.load(table_ptr + b * stride_tb + pos // PAGE_SIZE, mask=tok_ok, other=0).to(tl.int64)
        slot = pos % PAGE_SIZE
    else:
        blk = b
        slot = pos

    cos, sin = cos_sin_rows(cos_ptr, sin_ptr, pos, tok_ok, half, stride_cos, stride_sin, BLOCK_HALF)
    q_off = b * stride_qb + i * stride_qs
    # q in place: its pass-through dims are already where they belong.
    rotate_heads(q_ptr, q_ptr, q_off, q_off, tok_ok, stride_qh, stride_qh, q_heads, half, tail, cos, sin,
                 INTERLEAVED, False, BLOCK_H, BLOCK_HALF, BLOCK_TAIL)
    rotate_heads(k_ptr, kc_ptr, b * stride_kb + i * stride_ks, blk * stride_kcb + slot * stride_kcs, tok_ok,
                 stride_kh, stride_kch, kv_heads, half, tail, cos, sin,
                 INTERLEAVED, COPY_TAIL, BLOCK_H, BLOCK_HALF, BLOCK_TAIL)
    # v: a plain copy of each head into its slot (no arithmetic, so no rounding).
    d = tl.arange(0, BLOCK_D)
    v_src = v_ptr + (b * stride_vb + i * stride_vs)[:, None, None]
    v_dst = vc_ptr + (blk * stride_vcb + slot * stride_vcs)[:, None, None]
    for h0 in range(0, kv_heads, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        mask = tok_ok[:, None, None] & (h < kv_heads)[None, :, None] & (d < head_dim)[None, None, :]
        x = tl.load(v_src + (h * stride_vh)[None, :, None] + d[None, None, :], mask=mask)
        tl.store(v_dst + (h * stride_vch)[None, :, None] + d[None, None, :], x, mask=mask)


def append_config(tokens: int, heads: int, half: int, device: torch.device) -> RotaryConfig:
    """One token a program, heads 8 at a time, 4 warps, once the tokens fill the SMs:
    on an H200 (64 sequences x 64 new tokens, 32/8 heads of 128, bf16) that read and
    wrote 86% of copy bandwidth contiguous and 85% paged, against 81% / 69% for
    ``rotary_config``'s 2 tokens x 32 heads at 8 warps. Fewer tokens
    (a decode step's 1-64) keep ``rotary_config``, the best there (launch-bound, ~10%)."""
    if tokens >= sm_count(device):
        return _wide_config(heads)
    return rotary_config(tokens, heads, half, device)


@functools.lru_cache(maxsize=4096)  # a launch asks at every call
def _wide_config(heads: int) -> RotaryConfig:
    return RotaryConfig(1, min(8, next_pow2(max(heads, 1))), 4)


def _launch(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, block_table, interleaved: bool, config=None):
    """Launch on validated views (unit stride along head_dim). ``config`` is a
    ``rotary.RotaryConfig``. Returns the compiled kernel, or None when nothing ran."""
    B, Q, H, D = q.shape
    KVH = k.shape[2]
    half = cos.shape[1]
    n_tokens = B * Q
    if n_tokens == 0:
        return None
    cfg = config or append_config(n_tokens, max(H, KVH), max(half, D // 2), q.device)
    tail = D - 2 * half
    paged = block_table is not None
    args = (q, k, v, k_cache, v_cache, cos, sin, cache_seqlens, block_table if paged else cache_seqlens,
            n_tokens, Q, H, KVH, half, tail, D,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3],
            cos.stride()[0], sin.stride()[0], block_table.stride()[0] if paged else 0)
    # the config by its fields: a dataclass hashes in Python, ~0.5 us
    meta, key = _meta(bool(interleaved), paged, k_cache.shape[1] if paged else 1, cfg.block_t, cfg.block_h,
                      cfg.num_warps, half, tail, D)
    return launch(_append_kv_kernel, (cdiv(n_tokens, cfg.block_t),), args, meta, key)


@functools.lru_cache(maxsize=4096)
def _meta(interleaved: bool, paged: bool, page_size: int, block_t: int, block_h: int, num_warps: int, half: int,
          tail: int, head_dim: int) -> tuple[dict, int]:
    """The kernel's constexprs and options, and their ``meta_key``: kept, as a launch needs them at every call."""
    meta = dict(INTERLEAVED=interleaved, PAGED=paged, PAGE_SIZE=page_size, COPY_TAIL=tail > 0,
                BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_HALF=next_pow2(half), BLOCK_TAIL=next_pow2(max(tail, 1)),
                BLOCK_D=next_pow2(head_dim), num_warps=num_warps)
    return meta, meta_key(meta)


@torch.library.custom_op("onetrip::append_kv", mutates_args=("q", "k_cache", "v_cache"))
def _append_kv_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  cache_seqlens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  block_table: Optional[torch.Tensor], interleaved: bool) -> None:
    if use_triton(q):
        _launch(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, block_table, interleaved)
        return
    # CPU without the interpreter: rotation in float32 rounded once, like the kernel.
    positions = _positions(cache_seqlens, q.shape[1])
    q_rot, k_rot = apply_rotary_ref(q.float(), k.float(), cos.float(), sin.float(), positions, interleaved)
    q.copy_(q_rot)
    _scatter_(k_cache, v_cache, k_rot.to(k.dtype), v, positions, block_table)


@_append_kv_op.register_fake
def _(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, block_table, interleaved):
    return None


def append_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    block_table: Optional[torch.Tensor] = None,
    interleaved: bool = False,
) -> torch.Tensor:
    """Rotate q in place, rotate k and write it and v into the cache (module docstring).

    Args:
        q: (batch, q_len, heads, head_dim) float16, bfloat16 or float32; rotated in place
            (a layout with no unit head_dim stride goes through a copy, written back).
        k, v: (batch, q_len, kv_heads, head_dim) of q's dtype, any strides; read only.
        k_cache, v_cache: of q's dtype, unit stride along head_dim, written in place at the
            new tokens' slots only: contiguous (batch, max_seq, kv_heads, head_dim), or
            paged (num_blocks, block_size, kv_heads, head_dim) with ``block_table``.
        cache_seqlens: (batch,) int32 on q's device: each sequence's length BEFORE the
            append; token i goes to position cache_seqlens[b] + i. Not updated here (add
            q_len afterwards) and not read on the host: positions must lie below max_seq
            and max_pos, and the block_table entries they hit must be valid; none of this is
            checked (it would need a host sync).
        cos, sin: (max_pos, rot_dim // 2), float32 or q's dtype: the compact tables
            cos[p, i] = cos(p * base ** (-2 i / rot_dim)); rot_dim <= head_dim.
        block_table: (batch, max_blocks) int32 for a paged cache.
        interleaved: False for NeoX pairs (x[i], x[i + rot/2]), True for GPT-J (x[2i], x[2i+1]).

    Returns:
        q (rotated). One launch, no host synchronisation, no allocation on the usual path:
        CUDA-graph capturable (replay after changing cache_seqlens in place).
    """
    check_tensor("q", q, min_ndim=4)
    if q.dim() != 4:
        raise ValueError(f"q has shape {tuple(q.shape)}; expected (batch, q_len, heads, head_dim)")
    B, Q = q.shape[:2]
    check_cache(q, k_cache, v_cache, cache_seqlens, block_table)
    cos, sin = check_new_kv(q, k, v, k_cache, cos, sin)
    if B * Q == 0:
        return q
    qw, q_scratch = heads_view(q, B, True)
    kw, _ = heads_view(k, B, True)
    vw, _ = heads_view(v, B, True)
    call_op(_append_kv_op, qw, kw, vw, k_cache, v_cache, cache_seqlens, cos, sin, block_table, bool(interleaved))
    if q_scratch:
        q.copy_(qw)
    return q


def _positions(cache_seqlens: torch.Tensor, q_len: int) -> torch.Tensor:
    """(batch, q_len) int64 positions of the new tokens."""
    return cache_seqlens.long()[:, None] + torch.arange(q_len, device=cache_seqlens.device)[None, :]


def _scatter_(k_cache, v_cache, k, v, positions, block_table):
    """index_put of (batch, q_len, kv_heads, head_dim) k, v at their positions' slots."""
    if block_table is None:
        rows = torch.arange(k.shape[0], device=k.device)[:, None].expand_as(positions)
        k_cache[rows, positions] = k.to(k_cache.dtype)
        v_cache[rows, positions] = v.to(v_cache.dtype)
    else:
        page = k_cache.shape[1]
        blocks = block_table.long().gather(1, positions // page)
        k_cache[blocks, positions % page] = k.to(k_cache.dtype)
        v_cache[blocks, positions % page] = v.to(v_cache.dtype)


def append_kv_ref(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, block_table=None, interleaved=False):
    """Unfused: ``apply_rotary_ref`` (Hugging Face style, in q's dtype) at positions
    cache_seqlens[b] + i, then index_put into copies of the caches. Returns new tensors
    (q_rotated, k_cache, v_cache); the inputs are not modified. On float64 copies it is
    the exact reference of the tests."""
    positions = _positions(cache_seqlens, q.shape[1])
    q_rot, k_rot = apply_rotary_ref(q, k, cos, sin, positions, interleaved)
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    _scatter_(k_cache, v_cache, k_rot, v, positions, block_table)
    return q_rot, k_cache, v_cache
