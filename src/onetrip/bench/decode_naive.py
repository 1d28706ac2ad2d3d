"""The eager peers of ``onetrip bench decode-attention``: decode attention and the KV-cache
append as a user writes them with PyTorch ops (what onetrip's fused kernels replace)."""

from __future__ import annotations

import torch


def naive_decode(q, k_cache, v_cache, cache_seqlens, block_table=None):
    """Decode attention as a user writes it, for q_len = 1: (batch, 1, heads, head_dim).

    Keys at or past cache_seqlens[b] are masked; q is viewed as (batch, kv_heads, group,
    head_dim), so GQA needs no repeat of K and V. The matmuls copy the transposed K and V
    views; a paged cache is first gathered through block_table (another copy)."""
    B, Q, H, D = q.shape
    if Q != 1:
        raise ValueError(f"naive_decode takes one new token a sequence; q has shape {tuple(q.shape)}")
    if block_table is not None:
        k_cache, v_cache = (c[block_table.long()].flatten(1, 2) for c in (k_cache, v_cache))  # (B, S, KVH, D)
    kvh, S = k_cache.shape[2], k_cache.shape[1]
    s = (q.view(B, kvh, H // kvh, D) @ k_cache.permute(0, 2, 3, 1)) * D ** -0.5  # (B, KVH, group, S)
    past = torch.arange(S, device=q.device) >= cache_seqlens.long()[:, None, None, None]
    p = torch.softmax(s.masked_fill(past, float("-inf")).float(), dim=-1).to(q.dtype)
    return (p @ v_cache.transpose(1, 2)).view(B, 1, H, D)


def slots(cache: torch.Tensor, positions: torch.Tensor, block_table=None) -> torch.Tensor:
    """Flat slot of each position (batch, q_len) in ``cache`` viewed as (slots, kv_heads, head_dim)."""
    if block_table is None:
        return (torch.arange(positions.shape[0], device=positions.device)[:, None] * cache.shape[1] + positions).flatten()
    page = cache.shape[1]
    return (block_table.long().gather(1, positions // page) * page + positions % page).flatten()


def naive_append_kv(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, block_table=None):
    """Unfused append_kv: ``apply_rotary_ref`` at positions cache_seqlens[b] + i, then
    ``index_copy_`` of k and v into the caches (in place). Returns q rotated (a new tensor)."""
    from onetrip.ops import apply_rotary_ref

    positions = cache_seqlens.long()[:, None] + torch.arange(q.shape[1], device=q.device)
    q_rot, k_rot = apply_rotary_ref(q, k, cos, sin, positions)
    idx = slots(k_cache, positions, block_table)
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, idx, k_rot.flatten(0, 1))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, idx, v.flatten(0, 1))
    return q_rot
