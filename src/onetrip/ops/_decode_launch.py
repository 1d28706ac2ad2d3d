"""The launch of decode attention, shared by ``decode_attention`` and ``append_attention``
(which runs the same kernel with APPEND): the launch shape (``DecodeConfig``) and its
pick (``decode_config``), the kernel and split-merge launches (``launch``), and the
output handling of both ops (``into_out``). The kernel is ``_decode_jit._decode_kernel``,
the merge ``_split_merge._merge_kernel``."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional

import torch

from ._common import cdiv, hopper_or_newer, next_pow2, output, pdl_mode, sm_count
from ._decode_jit import _decode_kernel
from ._launch import launch as launch_kernel
from ._launch import meta_key
from ._split_merge import _merge_kernel

LOG2E = 1.4426950408889634
# The fewest key tiles a split takes below 4K cache slots (decode_config lowers it to 2 from
# there): the grid follows the cache's capacity (graph capture), the work its length, and on
# an H200 288 keys take 7.8 us in one split against 11.0 in 16 (batch 1, bf16, 128-key tiles).
MIN_TILES = 4
# Splits the merge takes whole rows of head_dim for; more are merged in slices of 32 dims, a
# program each, so that tens of partials still load in one round trip.
MERGE_WHOLE = 8


@dataclass(frozen=True)
class DecodeConfig:
    """Launch shape: keys in tiles of ``block_n`` at ``num_warps``; the visible keys cut
    into at most ``num_splits`` runs of at least ``min_tiles`` tiles (merged by a second
    kernel); ``table_ahead`` (paged caches): each tile's block-table entries are loaded
    while the previous tile is computed, so the K/V addresses do not wait on the table."""

    block_n: int
    num_warps: int
    num_splits: int
    table_ahead: bool = False
    min_tiles: int = MIN_TILES


def decode_config(batch: int, kv_heads: int, max_seq: int, head_dim: int, device: torch.device, *,
                  rows: int = 1, paged: bool = False, waves: Optional[int] = None) -> DecodeConfig:
    """The launch for this shape (``rows`` = GROUP * q_len query rows a program). Each pick,
    measured on an H200 (bf16, 32 / 8 heads, head dim 128):

    - 128-key tiles at 8 warps (at 4 warps they spill); head_dim > 128: 32-key tiles, at 8
      warps once the (rows, head_dim) float32 accumulator passes 64 values a thread of 4.
    - Splits: as many as fit batch * kv_heads * splits programs in ``waves`` waves of SMs:
      batch 4 x 32K 148 -> 128 us with 4 splits rather than 9.
    - ``waves``: 1, or 2 for a paged cache (a tile's address waits on its table entry):
      batch 16 x 8K paged-64 65% -> 93% of copy; contiguous loses with two (101% -> 96%).
    - ``min_tiles`` 2 from 4K cache slots (batch 1 x 4K: 31% -> 34-37% of copy), else 4.
    - Caches of <= 2K slots over two or more waves: 32-key tiles at 4 warps, four CTAs an
      SM hiding each other's loads: batch 64 x 1K 87% -> 94% of copy (paged-64 80% -> 93%).
    - Paged: 64-key tiles with ``table_ahead`` (batch 64 x 1K paged-64 86% -> 89%), at 4
      warps under two programs an SM (batch 1 x 128K paged-64 80% -> 91%), else 8 (batch
      64: 4 warps lose 15-18 points)."""
    return _decode_config(batch, kv_heads, max_seq, head_dim, sm_count(device), rows, paged, waves)


@functools.lru_cache(maxsize=4096)  # a launch asks at every call
def _decode_config(batch: int, kv_heads: int, max_seq: int, head_dim: int, sms: int, rows: int, paged: bool,
                   waves: Optional[int]) -> DecodeConfig:
    if waves is None:
        waves = 2 if paged else 1
    if head_dim <= 128:
        block_n, warps = 128, 8
    else:
        block_n = 32
        warps = 4 if max(16, next_pow2(rows)) * next_pow2(head_dim) <= 64 * 128 else 8
    programs = max(1, batch * kv_heads)
    min_tiles = 2 if max_seq >= 4096 else MIN_TILES
    splits = max(1, min(waves * sms // programs, cdiv(max(max_seq, 1), block_n * min_tiles)))
    if block_n == 128 and rows <= 16 and programs >= 2 * sms and max_seq <= 2048:
        return DecodeConfig(32, 4, splits, table_ahead=paged, min_tiles=min_tiles)
    if paged and block_n == 128:  # the split count stays the 128-key one: it won at each cell
        return DecodeConfig(64, 4 if programs < 2 * sms else 8, splits, table_ahead=True, min_tiles=min_tiles)
    return DecodeConfig(block_n, warps, splits, min_tiles=min_tiles)


def default_config(q, k_cache, block_table, num_splits: int = 0) -> DecodeConfig:
    """``decode_config`` for these tensors; ``num_splits`` > 0 overrides its split count."""
    B, Q, H, D = q.shape
    paged = block_table is not None
    max_seq = k_cache.shape[1] * (block_table.shape[1] if paged else 1)
    cfg = decode_config(B, k_cache.shape[2], max_seq, D, q.device, rows=Q * H // k_cache.shape[2], paged=paged)
    return cfg if num_splits <= 0 else _with_splits(cfg, num_splits)


@functools.lru_cache(maxsize=4096)
def _with_splits(cfg: DecodeConfig, num_splits: int) -> DecodeConfig:
    return dataclasses.replace(cfg, num_splits=num_splits)


def _merge_chunk(splits: int, rows: int, block_d: int, num_warps: int) -> int:
    """Splits merged per tile: (CHUNK_S, rows, D) float32 tiles of at most 32 values a thread."""
    return max(1, min(next_pow2(splits), 32 * 32 * num_warps // (rows * block_d)))


def launch(q, k_cache, v_cache, cache_seqlens, block_table, out, softmax_scale: float, window_left: int,
           softcap: float, config: DecodeConfig | None = None, append: Optional[tuple] = None,
           trigger_next: bool = False):
    """Launch on validated tensors (last dims unit stride; q (batch, q_len, heads, head_dim),
    the caches as ``decode_attention`` takes them). ``config`` defaults to ``default_config``.
    ``append``: (k_new, v_new, cos, sin, interleaved) to rotate and write the new tokens in
    the same launch (``append_attention``). ``trigger_next`` (Hopper, ``pdl_mode`` on): the
    kernel triggers its dependents at its start (kernel TRIGGER), so the next kernel, if
    launched under PDL, is placed on the SMs this grid leaves idle and can load what does
    not depend on it. Returns the compiled attention kernel (its ``n_regs``, ``n_spills``),
    or None when nothing ran."""
    B, Q, H, D = q.shape
    KVH = k_cache.shape[2]
    group = H // KVH
    paged = block_table is not None
    page = k_cache.shape[1]
    if B * H * D == 0:
        return None
    cfg = config or default_config(q, k_cache, block_table)
    S = cfg.num_splits
    # The workspace is sized from shapes alone, so the call is graph capturable.
    ws_o = torch.empty((B * KVH, S, group * Q, D) if S > 1 else (1,), dtype=torch.float32, device=q.device)
    ws_lse = torch.empty((B * KVH, S, group * Q) if S > 1 else (1,), dtype=torch.float32, device=q.device)
    if softcap > 0:
        qk_scale, softcap_log2 = softmax_scale / softcap, softcap * LOG2E
    else:
        qk_scale, softcap_log2 = softmax_scale * LOG2E, 0.0
    kn, vn, cos, sin, interleaved = append if append is not None else (q, q, q, q, False)
    args = (q, k_cache, v_cache, out, cache_seqlens, block_table if paged else cache_seqlens, ws_o, ws_lse,
            kn, vn, cos, sin,
            KVH, S, D, cos.shape[1] if append is not None else 0,
            *q.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3], *out.stride()[:3],
            block_table.stride()[0] if paged else 0,
            *kn.stride()[:3], *vn.stride()[:3], cos.stride()[0], sin.stride()[0],
            qk_scale, softcap_log2, max(window_left, 0))
    trigger = trigger_next and bool(pdl_mode()) and hopper_or_newer(q)
    # the config by its fields: a dataclass hashes in Python, ~0.5 us
    meta, key = _meta(group, Q, D, paged, page if paged else 1, softcap > 0, window_left >= 0, S > 1,
                      q.dtype == torch.float32, cfg.block_n, cfg.min_tiles, append is not None, bool(interleaved),
                      bool(paged and cfg.table_ahead), cfg.num_warps, trigger)
    kernel = launch_kernel(_decode_kernel, (B * KVH, S), args, meta, key)
    if S > 1:
        chunks, merge_meta, merge_key = _merge_meta(group, Q, D, S)
        launch_kernel(_merge_kernel, (B * KVH * chunks,), (ws_o, ws_lse, out, KVH, S, D, *out.stride()[:3]),
                      merge_meta, merge_key)
    return kernel


@functools.lru_cache(maxsize=4096)
def _meta(group: int, q_len: int, head_dim: int, paged: bool, page_size: int, softcap: bool, window: bool,
          split: bool, fp32: bool, block_n: int, min_tiles: int, append: bool, interleaved: bool, table_ahead: bool,
          num_warps: int, trigger: bool) -> tuple[dict, int]:
    """The attention kernel's constexprs and options, and their ``meta_key``: kept, as a
    launch needs them at every call. num_stages: Triton's default, 3 (on an H200, 2-4 time
    alike). ``trigger``: TRIGGER (the kernel itself launches without PDL: it starts after
    the previous kernel ends)."""
    meta = dict(GROUP=group, Q_LEN=q_len, PAGED=paged, PAGE_SIZE=page_size, SOFTCAP=softcap, HAS_WINDOW=window,
                SPLIT=split, PRECISION="ieee" if fp32 else "tf32",
                BLOCK_M=max(16, next_pow2(group * q_len)),  # tl.dot needs 16 rows at least
                BLOCK_N=block_n, BLOCK_D=max(16, next_pow2(head_dim)), MIN_TILES=min_tiles,
                APPEND=append, INTERLEAVED=interleaved, BLOCK_Q=max(16, next_pow2(q_len)), TABLE_AHEAD=table_ahead,
                num_warps=num_warps)
    if trigger:
        meta["TRIGGER"] = True
    return meta, meta_key(meta)


@functools.lru_cache(maxsize=4096)
def _merge_meta(group: int, q_len: int, head_dim: int, splits: int) -> tuple[int, dict, int]:
    """The merge's programs per (sequence, kv head), its constexprs and options, and their ``meta_key``."""
    block_d = max(16, next_pow2(head_dim))
    block_r = min(next_pow2(group * q_len), 16)
    block_ds = block_d if splits <= MERGE_WHOLE else min(block_d, 32)  # more splits: head_dim in slices
    meta = dict(GROUP=group, Q_LEN=q_len, BLOCK_R=block_r, BLOCK_D=block_d,
                CHUNK_S=_merge_chunk(splits, block_r, block_ds, 4), BLOCK_DS=block_ds, num_warps=4)
    return cdiv(group * q_len, block_r) * (block_d // block_ds), meta, meta_key(meta)


def into_out(out: Optional[torch.Tensor], q: torch.Tensor, run) -> torch.Tensor:
    """``run(work)`` writes the (batch, q_len, heads, head_dim) result into ``out`` (checked,
    or made), or into a unit-stride buffer copied into it; nothing runs for an empty q."""
    out = output("out", out, q.shape, q.dtype, q.device)
    unit = out.stride(-1) == 1 or q.shape[-1] == 1
    work = out if unit else torch.empty_like(out, memory_format=torch.contiguous_format)
    if q.numel() > 0:
        run(work)
    if work is not out:
        out.copy_(work)
    return out
