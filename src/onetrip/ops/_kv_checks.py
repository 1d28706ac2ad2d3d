"""Argument checks shared by the KV-cache ops (decode_attention, append_kv,
append_attention): each error names the argument, what it got and what is allowed.

    check_cache        q against the caches, cache_seqlens and block_table
    check_new_kv       the new tokens' k, v and the rotary tables (append_kv, append_attention)
    check_decode_args  decode_attention's arguments (append_attention's too)
"""

from __future__ import annotations

import math

import torch

from ._common import check_dtype_match, check_same_device, check_shape, check_tensor

MAX_Q_LEN = 16  # new tokens per sequence that decode attention takes (speculative verification)


def _check_int(name: str, t: object, shape: tuple, what: str, device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} has dtype {t.dtype}; allowed: torch.int32")
    check_shape(name, t, shape, what)
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}; all tensors must share a device")
    return t


def check_cache(q, k_cache, v_cache, cache_seqlens, block_table):
    """Shared by decode_attention and append_kv: returns (kv_heads, page size or None)."""
    B, _, H, D = q.shape
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, c)
        check_dtype_match(name, c, "q", q)
        if c.dim() != 4:
            raise ValueError(f"{name} has shape {tuple(c.shape)}; expected (batch, max_seq, kv_heads, head_dim) "
                             f"or, paged, (num_blocks, block_size, kv_heads, head_dim)")
        if c.shape[-1] != D:
            raise ValueError(f"{name} has head_dim {c.shape[-1]} but q has {D}; they must match")
        if c.stride(-1) != 1 and D > 1:
            raise ValueError(f"{name} must have unit stride along head_dim (got strides {c.stride()}); the cache "
                             f"is written in place, so it is not copied")
    check_shape("v_cache", v_cache, k_cache.shape, "the shape of k_cache")
    check_same_device("q", q, k_cache=k_cache, v_cache=v_cache)
    kvh = k_cache.shape[2]
    if kvh == 0 or H % kvh != 0:
        raise ValueError(f"q has {H} heads and the cache {kvh} kv_heads; heads must be a multiple of kv_heads")
    _check_int("cache_seqlens", cache_seqlens, (B,), "one length per sequence of q's batch", q.device)
    if block_table is None:
        if k_cache.shape[0] != B:
            raise ValueError(f"k_cache has shape {tuple(k_cache.shape)} but q's batch is {B}; a contiguous cache "
                             f"is (batch, max_seq, kv_heads, head_dim) (pass block_table for a paged cache)")
        return kvh, None
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
        got = tuple(block_table.shape) if isinstance(block_table, torch.Tensor) else type(block_table).__name__
        raise ValueError(f"block_table must be a (batch, max_blocks) int32 tensor, got {got}")
    _check_int("block_table", block_table, (B, block_table.shape[1]), "(batch, max_blocks)", q.device)
    if block_table.stride(-1) != 1 and block_table.shape[1] > 1:
        raise ValueError("block_table must have unit stride along max_blocks")
    return kvh, k_cache.shape[1]


def check_decode_args(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, window, softcap,
                      num_splits) -> float:
    """decode_attention's checks (shared with append_attention); returns the softmax scale."""
    check_tensor("q", q, min_ndim=4)
    if q.dim() != 4:
        raise ValueError(f"q has shape {tuple(q.shape)}; expected (batch, q_len, heads, head_dim)")
    B, Q, H, D = q.shape
    if not 1 <= Q <= MAX_Q_LEN:
        raise ValueError(f"q has q_len {Q} (shape {tuple(q.shape)}); decode_attention takes 1..{MAX_Q_LEN} "
                         f"new tokens per sequence")
    if not 1 <= D <= 256:
        raise ValueError(f"q has head_dim {D}; allowed: 1..256")
    check_cache(q, k_cache, v_cache, cache_seqlens, block_table)
    if (not isinstance(window, (tuple, list)) or len(window) != 2 or not all(isinstance(w, int) for w in window)
            or window[0] < -1 or window[1] not in (-1, 0)):
        raise ValueError(f"window must be (left, right) with left >= -1 (-1: unbounded) and right -1 or 0 "
                         f"(the op is causal); got {window!r}")
    if not isinstance(softcap, (int, float)) or softcap < 0 or math.isnan(softcap):
        raise ValueError(f"softcap must be a float >= 0 (0: off), got {softcap!r}")
    if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    return 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)


def check_new_kv(q, k, v, k_cache, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    """Checks of the new tokens' k, v and the rotary tables against q and a checked cache
    (append_kv, append_attention); returns cos, sin with unit column stride."""
    B, Q, H, D = q.shape
    for name, t in (("k", k), ("v", v)):
        check_tensor(name, t, min_ndim=4)
        check_dtype_match(name, t, "q", q)
    check_shape("k", k, (B, Q, k_cache.shape[2], D), "(batch, q_len, kv_heads, head_dim) of q and the cache")
    check_shape("v", v, k.shape, "the shape of k")
    table_dtypes = (torch.float32,) if q.dtype == torch.float32 else (torch.float32, q.dtype)
    check_tensor("cos", cos, dtypes=table_dtypes, min_ndim=2)
    if cos.dim() != 2 or cos.shape[1] == 0 or 2 * cos.shape[1] > D:
        raise ValueError(f"cos has shape {tuple(cos.shape)}; expected (max_pos, rot_dim // 2) with "
                         f"2 <= rot_dim <= head_dim = {D}")
    check_tensor("sin", sin, dtypes=table_dtypes)
    check_shape("sin", sin, cos.shape, "the shape of cos")
    check_dtype_match("sin", sin, "cos", cos)
    check_same_device("q", q, k=k, v=v, cos=cos, sin=sin)
    return (cos if cos.stride(-1) == 1 else cos.contiguous()), (sin if sin.stride(-1) == 1 else sin.contiguous())
