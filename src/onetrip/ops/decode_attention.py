"""Decode attention over a KV cache (contiguous or paged), split-KV (flash-decoding), GQA.

For each sequence b of length L = cache_seqlens[b] (the q_len new tokens already
appended to the cache) and query i < q_len at position p_i = L - q_len + i:

    s_ij = (q_i . k_j) * scale                    scale defaults to 1 / sqrt(head_dim)
    s_ij = softcap * tanh(s_ij / softcap)          when softcap > 0
    visible: j <= p_i (causal among the new tokens), and j >= p_i - left when left >= 0
    out_i = sum_j softmax_j(s_ij) v_j              zeros when no key is visible

Why a dedicated kernel: at decode, attention is a stream over the cache (read once,
bandwidth bound) with only q_len queries per head. A program per (sequence, kv head) loads
each K/V tile once for its whole group of GROUP = heads / kv_heads query heads and q_len
queries, a (GROUP * q_len, BLOCK_N) score tile, so GQA costs no extra cache traffic. With
few sequences there are too few (sequence, kv head) pairs to fill the GPU, so the sequence
is split into ``num_splits`` ranges handled by separate programs (flash-decoding): each
writes its normalized partial output and log-sum-exp (float32) to a workspace, and a small
second kernel merges them:

    out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M),    M = max_s lse_s

Scores are kept in base 2 (log2(e) folded into the scale) so the online softmax uses exp2.
The unfused reference (``decode_attention_ref``) gathers the cache, materializes the
(heads, q_len, max_seq) scores and probabilities and re-reads them: ~4 extra passes over
heads * max_seq scores, for a stream whose essential traffic is the cache itself.

Graph capture: cache_seqlens stays on the device (never read on the host); the grid and
the workspace depend only on shapes (batch, heads, q_len, num_splits, head_dim), so one
captured call serves any lengths: change cache_seqlens in place and replay.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import torch
import triton

from ._common import call_op, hopper_or_newer, output, pdl_mode, sm_count, use_triton
from ._decode_jit import _decode_kernel
from ._decode_tma import kv_descriptors
from ._kv_checks import MAX_Q_LEN, _check_args  # noqa: F401 - MAX_Q_LEN re-exported (models.fused)
from ._split_merge import _merge_kernel

LOG2E = 1.4426950408889634
# A split takes at least this many key tiles (``DecodeConfig.min_tiles``; decode_config
# lowers it to 2 from 4K cache slots); the rest of the splits stay empty. On an H200
# (batch 1, bf16, 128-key tiles) 288 keys ran fastest in one split (7.8 us, 16 splits:
# 11.0): the grid is fixed by the cache's capacity (graph capture), the work by the length.
# (An early sweep had 4K keys fastest in 8 splits of 4 tiles, 13.8 us against 14.6 for "16
# splits of 2"; with this floor at 4, those 16 splits had only 8 holding keys. With the
# merge sliced, 16 splits of 2 tiles read 34-37% of copy against 31%: round 14.)
MIN_TILES = 4
# Splits the merge takes whole rows of head_dim for; more are merged in slices of 32 dims, a
# program each, so that tens of partials still load in one round trip.
MERGE_WHOLE = 8


@dataclass(frozen=True)
class DecodeConfig:
    """Launch shape: keys in tiles of ``block_n``; the sequence cut into ``num_splits``
    (merged by a second kernel, ``_split_merge._merge_kernel``); ``table_ahead`` (paged):
    each tile's block-table entries are loaded while the previous tile is computed, so the
    K/V addresses do not wait on a table round trip (the paged default, see decode_config).

    ``use_tma`` (contiguous caches only, an experiment that decode_config never picks): K/V
    tiles through Hopper tensor descriptors (``_decode_tma``), launched with ``num_stages``
    so the pipeliner keeps num_stages - 1 tiles in flight; a cache that does not allow it
    is a ValueError. ``num_stages`` applies to the TMA path only: the pointer path keeps
    Triton's launch default, 3 (on an H200, 2-4 timed alike there: round 6a)."""

    block_n: int
    num_warps: int
    num_splits: int
    table_ahead: bool = False
    use_tma: bool = False
    num_stages: int = 1
    min_tiles: int = MIN_TILES  # the fewest key tiles a split takes (the rest of the splits stay empty)


def decode_config(batch: int, kv_heads: int, max_seq: int, head_dim: int, device: torch.device, *,
                  rows: int = 1, paged: bool = False, waves: Optional[int] = None) -> DecodeConfig:
    """Tiles of 128 keys at 8 warps (32 keys for head_dim > 128, to bound the K/V tile's
    registers), and as many splits as fit batch * kv_heads * num_splits programs into
    ``waves`` waves of SMs without passing them, at most one split per MIN_TILES tiles of
    max_seq. ``rows`` = group * q_len query rows per program: with 32-key tiles, 8 warps
    once the float32 accumulator (rows x head_dim) passes 64 values per thread of 4 warps.
    ``waves`` defaults to 1, or 2 for a ``paged`` cache: each tile's K/V address waits on
    its block-table load, and with one 8-warp CTA per SM nothing else runs meanwhile.

    From H200 sweeps (2026-11-21, bf16, 32/8 heads, head dim 128, benchmarks/NOTES.md):
    128-key tiles at 8 warps (no spills; 4 warps spill) and one wave won or
    tied every cell: batch 4 x 32K 148 -> 128 us (4 splits, not 9), batch 64 x 8K 551 ->
    479 us, batch 1 x 4K 20.6 -> 14.5 us (16 splits, not 33: fewer partials to merge).
    One CTA fits an SM (3 stages of 128-key K/V tiles take 136 KiB of shared memory; the
    207 registers once quoted here came from an offline compile without the launch's
    divisibility marks, which does not pipeline), so a wave is the SM count: rounding the
    splits up (batch 4 x 32K: 5 splits, 160 programs on 132 SMs) fell to 71% of copy.
    Paged, two waves (benchmarks/results/ab-round4-h200-20261121.json): batch 16 x 8K
    paged-64 read 65% of copy with one wave and 93% with two; batch 4 x 32K 61% -> 91%;
    batch 1 x 32K 49% -> 64%; batch 64 keeps one split (512 programs, 101%). Contiguous
    caches lose with a second wave (batch 16 x 8K 101% -> 96%).

    Short contiguous caches over several waves take 32-key tiles at 4 warps (128 registers:
    four CTAs an SM, so one program's wait for its tile hides behind another's): batch
    64 x 1K, 512 programs of 8 tiles, 87% -> 94% of copy (ab-round6a-h200-20261121.json);
    batch 16 x 1K (one wave) stays best with 128-key tiles (77% vs 75%). Paged caches take
    the same rule (with ``table_ahead``): batch 64 x 1K paged-64 / paged-256 80% / 90% ->
    93% / 93% (round 12, ab-round12-h200-20261121.json; before the table loaded ahead, 32
    keys had lost there, 82% vs 87%); batch 32 x 2K (256 programs, under two waves) keeps
    64-key tiles (93% vs 88%).

    Paged caches take 64-key tiles whose block-table entries load one tile ahead
    (``table_ahead``; as launched at head dim 128, 8 warps: 80 registers and two K/V
    buffers in flight, where paged 128-key tiles get one; no spills in either): round 9 (ab-round9-h200-20261121.json) batch 64 x 1K paged-64 86% -> 89%,
    4 x 8K 72% -> 75%, 1 x 128K 88% -> 89%, 1 x 4K 22% -> 22%, at the same split counts.
    At 4 warps rather than 8 (158 registers, no spills, the same two buffers and 70 KiB)
    while batch * kv_heads is under two programs an SM: round 12b (ab-round12-h200-20261121.json)
    batch 1 x 128K paged-64 / paged-256 80% / 90% -> 91% / 91%, 4 x 32K 95% -> 96%, 32 x 2K
    93% both; the 8-warp figure of one cell moved by 10 points between runs an hour apart,
    the 4-warp one did not. At batch 64 (512 programs, one split) 4 warps lost 15-18 points
    in the full bench (8K-128K: 104-107% -> 88-89%), so 8 warps stay there."""
    if waves is None:
        waves = 2 if paged else 1
    if head_dim <= 128:
        block_n, warps = 128, 8
    else:
        block_n = 32
        warps = 4 if max(16, triton.next_power_of_2(rows)) * triton.next_power_of_2(head_dim) <= 64 * 128 else 8
    programs, sms = max(1, batch * kv_heads), sm_count(device)
    # Caches of 4K slots and more split down to 2 tiles (round 14, ab-round14-h200-20261122.json:
    # batch 1 x 4K 31% -> 34-37% of copy, paged 24% -> 33%; 8K-32K and batch 4 unchanged).
    # Shorter ones keep 4: there a second split adds a merge launch to a kernel of a few us
    # (288 keys: 7.8 us in one split, 11.0 in 16), the engine's batch-1 decode among them.
    min_tiles = 2 if max_seq >= 4096 else MIN_TILES
    splits = max(1, min(waves * sms // programs, triton.cdiv(max(max_seq, 1), block_n * min_tiles)))
    if block_n == 128 and rows <= 16 and programs >= 2 * sms and max_seq <= 2048:
        return DecodeConfig(32, 4, splits, table_ahead=paged, min_tiles=min_tiles)
    if paged and block_n == 128:  # the split count stays the 128-key one: it won at each cell
        return DecodeConfig(64, 4 if programs < 2 * sms else 8, splits, table_ahead=True, min_tiles=min_tiles)
    return DecodeConfig(block_n, warps, splits, min_tiles=min_tiles)


def _default_config(q, k_cache, block_table, num_splits: int = 0) -> DecodeConfig:
    """decode_config for these tensors; ``num_splits`` > 0 overrides its split count."""
    B, Q, H, D = q.shape
    paged = block_table is not None
    max_seq = k_cache.shape[1] * (block_table.shape[1] if paged else 1)
    cfg = decode_config(B, k_cache.shape[2], max_seq, D, q.device, rows=Q * H // k_cache.shape[2], paged=paged)
    return cfg if num_splits <= 0 else dataclasses.replace(cfg, num_splits=num_splits)


def _merge_chunk(splits: int, rows: int, block_d: int, num_warps: int) -> int:
    """Splits merged per tile: (CHUNK_S, rows, D) float32 tiles of at most 32 values a thread."""
    return max(1, min(triton.next_power_of_2(splits), 32 * 32 * num_warps // (rows * block_d)))


def _launch(q, k_cache, v_cache, cache_seqlens, block_table, out, softmax_scale: float, window_left: int,
            softcap: float, config: DecodeConfig | None = None, append: Optional[tuple] = None,
            trigger_next: bool = False):
    """Launch on validated tensors (last dims unit stride). ``append``: (k_new, v_new, cos,
    sin, interleaved) to rotate and write the new tokens in the same launch. ``trigger_next``
    (Hopper, ``pdl_mode`` on): the kernel triggers its dependents at its start (kernel
    TRIGGER), so the next kernel, if launched under PDL, is placed on the SMs this grid leaves
    idle and can load what does not depend on it (``append_attention``). ``config.use_tma``
    with a paged or misaligned cache raises ValueError (``_decode_tma.kv_descriptors``); an
    empty cache (max_seq 0) has nothing to read and takes the pointer path. Returns the
    compiled attention kernel (its ``n_regs``, ``n_spills``), or None when nothing ran."""
    B, Q, H, D = q.shape
    KVH = k_cache.shape[2]
    group = H // KVH
    paged = block_table is not None
    page = k_cache.shape[1]
    if B * H * D == 0:
        return None
    cfg = config or _default_config(q, k_cache, block_table)
    S = cfg.num_splits
    # The workspace is sized from shapes alone, so the call is graph capturable.
    ws_o = torch.empty((B * KVH, S, group * Q, D) if S > 1 else (1,), dtype=torch.float32, device=q.device)
    ws_lse = torch.empty((B * KVH, S, group * Q) if S > 1 else (1,), dtype=torch.float32, device=q.device)
    if softcap > 0:
        qk_scale, softcap_log2 = softmax_scale / softcap, softcap * LOG2E
    else:
        qk_scale, softcap_log2 = softmax_scale * LOG2E, 0.0
    block_m = max(16, triton.next_power_of_2(group * Q))  # tl.dot needs 16 rows at least
    block_d = max(16, triton.next_power_of_2(D))
    kn, vn, cos, sin, interleaved = append if append is not None else (q, q, q, q, False)
    use_tma = cfg.use_tma and k_cache.numel() > 0
    descs = kv_descriptors(k_cache, v_cache, paged, cfg.block_n, block_d) if use_tma else (None, None)
    extra = {"num_stages": cfg.num_stages} if use_tma else {}  # the pointer path: Triton's default
    if trigger_next and pdl_mode() and hopper_or_newer(q):
        extra["TRIGGER"] = True  # launched without PDL itself: it starts after the previous kernel ends
    kernel = _decode_kernel[(B * KVH, S)](
        q, k_cache, v_cache, out, *descs, cache_seqlens, block_table if paged else cache_seqlens, ws_o, ws_lse,
        kn, vn, cos, sin,
        KVH, S, D, cos.shape[1] if append is not None else 0,
        *q.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3], *out.stride()[:3],
        block_table.stride(0) if paged else 0,
        *kn.stride()[:3], *vn.stride()[:3], cos.stride(0), sin.stride(0),
        qk_scale, softcap_log2, max(window_left, 0),
        GROUP=group, Q_LEN=Q, PAGED=paged, PAGE_SIZE=page if paged else 1,
        SOFTCAP=softcap > 0, HAS_WINDOW=window_left >= 0, SPLIT=S > 1,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_D=block_d, MIN_TILES=cfg.min_tiles,
        APPEND=append is not None, INTERLEAVED=interleaved, BLOCK_Q=max(16, triton.next_power_of_2(Q)),
        TABLE_AHEAD=paged and cfg.table_ahead, USE_TMA=use_tma,
        num_warps=cfg.num_warps, **extra,
    )
    if S > 1:
        block_r = min(triton.next_power_of_2(group * Q), 16)
        block_ds = block_d if S <= MERGE_WHOLE else min(block_d, 32)  # more splits: head_dim in slices
        _merge_kernel[(B * KVH * triton.cdiv(group * Q, block_r) * (block_d // block_ds),)](
            ws_o, ws_lse, out, KVH, S, D, *out.stride()[:3],
            GROUP=group, Q_LEN=Q, BLOCK_R=block_r, BLOCK_D=block_d,
            CHUNK_S=_merge_chunk(S, block_r, block_ds, 4), BLOCK_DS=block_ds, num_warps=4,
        )
    return kernel


@torch.library.custom_op("onetrip::decode_attention", mutates_args=("out",))
def _decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
               block_table: Optional[torch.Tensor], out: torch.Tensor, softmax_scale: float, window_left: int,
               softcap: float, num_splits: int) -> None:
    """num_splits 0: the heuristic's choice. The workspace is allocated here (inside a
    captured graph it comes from the graph's memory pool)."""
    if use_triton(q):
        config = _default_config(q, k_cache, block_table, num_splits)
        _launch(q, k_cache, v_cache, cache_seqlens, block_table, out, softmax_scale, window_left, softcap, config)
        return
    # CPU without the interpreter: the reference in float32, rounded once like the kernel.
    ref = decode_attention_ref(q.float(), k_cache.float(), v_cache.float(), cache_seqlens, block_table,
                               softmax_scale, (window_left, -1), softcap)
    out.copy_(ref)


@_decode_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, out, softmax_scale, window_left, softcap, num_splits):
    return None


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    block_table: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    num_splits: Optional[int] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Attention of q_len new queries per sequence over its KV cache (see the module docstring).

    Query i of sequence b sits at position L - q_len + i with L = cache_seqlens[b]; it sees
    keys 0..L - q_len + i (causal among the new tokens, which must already be in the cache:
    ``append_kv`` writes them). q_len > 1 is speculative verification::

        keys    0 1 2 ... L-3 L-2 L-1
        q0      x x x ...  x              (q_len = 3)
        q1      x x x ...  x   x
        q2      x x x ...  x   x   x

    Args:
        q: (batch, q_len, heads, head_dim), float16, bfloat16 or float32; q_len 1..16,
            head_dim up to 256 (any; powers of two waste nothing).
        k_cache, v_cache: of q's dtype, unit stride along head_dim; contiguous
            (batch, max_seq, kv_heads, head_dim), or paged (num_blocks, block_size,
            kv_heads, head_dim) with ``block_table``. heads % kv_heads == 0 (GQA, MQA).
        cache_seqlens: (batch,) int32 on q's device, each in [0, max_seq]; not read on the
            host and not checked (that would need a sync). Slots at or past it are never read.
        block_table: (batch, max_blocks) int32: page b's n-th block of block_size tokens;
            entries past a sequence's length are never read. max_seq = max_blocks * block_size.
        softmax_scale: default 1 / sqrt(head_dim).
        window: (left, right) as in FlashAttention, -1 unbounded: query at p sees keys
            p - left .. p. The op is causal, so right must be -1 or 0 (the same thing).
        softcap: > 0 gives s = softcap * tanh(s / softcap) (Gemma 2, Grok), before masking.
        num_splits: the most split-KV programs per (sequence, kv head); each split takes at
            least ``MIN_TILES`` tiles of keys, so short sequences use fewer. None picks
            from the shape and the SM count.
        out: optional (batch, q_len, heads, head_dim) output of q's dtype.

    Returns:
        out. Rows with no visible key (L = 0, or L < q_len for the first queries) are 0.
        Softmax in float32 with exp2; one or two launches; no host synchronisation, and a
        workspace sized from shapes: CUDA-graph capturable.
    """
    softmax_scale = _check_args(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, window, softcap,
                                num_splits)
    qc = q if q.stride(-1) == 1 or q.shape[-1] == 1 else q.contiguous()
    return _into_out(out, q, lambda work: call_op(_decode_op, qc, k_cache, v_cache, cache_seqlens, block_table,
                                                  work, softmax_scale, int(window[0]), float(softcap),
                                                  num_splits or 0))


def _into_out(out: Optional[torch.Tensor], q: torch.Tensor, launch) -> torch.Tensor:
    """``launch(work)`` writes the (batch, q_len, heads, head_dim) result into ``out`` (checked,
    or made), or into a unit-stride buffer copied into it; nothing runs for an empty q.
    Shared by decode_attention and append_attention."""
    out = output("out", out, q.shape, q.dtype, q.device)
    unit = out.stride(-1) == 1 or q.shape[-1] == 1
    work = out if unit else torch.empty_like(out, memory_format=torch.contiguous_format)
    if q.numel() > 0:
        launch(work)
    if work is not out:
        out.copy_(work)
    return out


def decode_attention_ref(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None,
                         window=(-1, -1), softcap=0.0):
    """Unfused, op by op in q's dtype: gather each sequence's cache (through block_table when
    paged), scores matmul, scale, softcap, mask, softmax, matmul. Returns (batch, q_len,
    heads, head_dim); rows with no visible key give zeros. On float64 copies it is the exact
    reference of the tests."""
    B, Q, H, D = q.shape
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else softmax_scale
    if block_table is not None:
        idx = block_table.long().clamp(0, k_cache.shape[0] - 1)  # unused entries may be anything
        k, v = k_cache[idx].flatten(1, 2), v_cache[idx].flatten(1, 2)  # (B, max_blocks * page, KVH, D)
    else:
        k, v = k_cache, v_cache
    S, group = k.shape[1], H // k.shape[2]
    L = cache_seqlens.long()
    j = torch.arange(S, device=q.device)
    valid = j[None, :] < L[:, None]  # (B, S); slots past L may hold NaN: zero them
    k = torch.where(valid[:, :, None, None], k, 0).repeat_interleave(group, dim=2).transpose(1, 2)  # (B, H, S, D)
    v = torch.where(valid[:, :, None, None], v, 0).repeat_interleave(group, dim=2).transpose(1, 2)
    qpos = L[:, None] - Q + torch.arange(Q, device=q.device)[None, :]  # (B, Q)
    visible = valid[:, None, :] & (j[None, None, :] <= qpos[:, :, None])  # (B, Q, S)
    if window[0] >= 0:
        visible &= j[None, None, :] >= qpos[:, :, None] - window[0]
    scores = q.transpose(1, 2) @ k.transpose(-1, -2)  # (B, H, Q, S)
    scores = scores * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all -inf rows: NaN -> 0
    return (p @ v).transpose(1, 2)  # (B, Q, H, D)
