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

Here: the op, its checks and its reference. The launch and its pick (``DecodeConfig``,
``decode_config``) are in ``_decode_launch.py``, the kernel in ``_decode_jit.py``, the
merge in ``_split_merge.py``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ._common import call_op, use_triton
from ._decode_launch import DecodeConfig, decode_config, default_config, into_out, launch
from ._kv_checks import MAX_Q_LEN, check_decode_args

__all__ = ["MAX_Q_LEN", "DecodeConfig", "decode_config", "decode_attention", "decode_attention_ref"]


@torch.library.custom_op("onetrip::decode_attention", mutates_args=("out",))
def _decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
               block_table: Optional[torch.Tensor], out: torch.Tensor, softmax_scale: float, window_left: int,
               softcap: float, num_splits: int) -> None:
    """num_splits 0: the heuristic's choice. The workspace is allocated here (inside a
    captured graph it comes from the graph's memory pool)."""
    if use_triton(q):
        config = default_config(q, k_cache, block_table, num_splits)
        launch(q, k_cache, v_cache, cache_seqlens, block_table, out, softmax_scale, window_left, softcap, config)
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
            least ``DecodeConfig.min_tiles`` tiles of keys (2 or 4), so short sequences use
            fewer. None picks from the shape and the SM count (``decode_config``).
        out: optional (batch, q_len, heads, head_dim) output of q's dtype.

    Returns:
        out. Rows with no visible key (L = 0, or L < q_len for the first queries) are 0.
        Softmax in float32 with exp2; one or two launches; no host synchronisation, and a
        workspace sized from shapes: CUDA-graph capturable.
    """
    softmax_scale = check_decode_args(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, window,
                                      softcap, num_splits)
    qc = q if q.stride(-1) == 1 or q.shape[-1] == 1 else q.contiguous()
    return into_out(out, q, lambda work: call_op(_decode_op, qc, k_cache, v_cache, cache_seqlens, block_table,
                                                 work, softmax_scale, int(window[0]), float(softcap),
                                                 num_splits or 0))


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
