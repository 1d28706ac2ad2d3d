"""append_kv + decode_attention in one launch: a decode step's attention with no seam.

For each sequence b with L = cache_seqlens[b] tokens cached BEFORE this call and q_len new
tokens at positions p_i = L + i:

    q_i <- rope(q_i, p_i);  k_cache[slot(b, p_i)] <- rope(k_i, p_i);  v_cache[slot(b, p_i)] <- v_i
    out_i = attention of q_i over keys 0..p_i (decode_attention's masks, window, softcap)

which is exactly ``append_kv`` then ``decode_attention`` with the lengths plus q_len (see
their modules), except that q in memory is not rotated (only its registers are).

Why: at a batch-1 decode step both launches are latency, not bytes (append_kv moves a few
KB; H200: ~2.2 us a launch in a 1B engine step, 16 a step). Here each (sequence, kv head)
program of the attention kernel rotates its queries as it loads them; split 0 rotates the
new keys, writes them and v into the cache, and attends over them from registers as one
more key tile; the other splits never read those slots (the cached range ends at L), so
nothing waits on the write. Kernel: ``_decode_jit._decode_kernel`` with APPEND (launched
by ``_decode_launch.launch``), its helpers in ``_decode_append.py``.

The unfused reference is the pair it replaces, op by op: ``append_attention_ref``.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._common import call_op, heads_view, use_triton
from ._decode_launch import default_config, into_out, launch
from ._kv_checks import check_decode_args, check_new_kv
from .append_kv import append_kv_ref
from .decode_attention import decode_attention_ref


@torch.library.custom_op("onetrip::append_attention", mutates_args=("out", "k_cache", "v_cache"))
def _append_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, cache_seqlens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         block_table: Optional[torch.Tensor], out: torch.Tensor, interleaved: bool,
                         softmax_scale: float, window_left: int, softcap: float, num_splits: int,
                         trigger_next: bool = False) -> None:
    if use_triton(q):
        config = default_config(q, k_cache, block_table, num_splits)
        launch(q, k_cache, v_cache, cache_seqlens, block_table, out, softmax_scale, window_left, softcap, config,
                append=(k, v, cos, sin, interleaved), trigger_next=trigger_next)
        return
    # CPU without the interpreter: the pair in float32, each output rounded once like the kernel.
    q_rot, kc, vc = append_kv_ref(q.float(), k.float(), v.float(), k_cache.float(), v_cache.float(), cache_seqlens,
                                  cos.float(), sin.float(), block_table, interleaved)
    k_cache.copy_(kc)
    v_cache.copy_(vc)
    ref = decode_attention_ref(q_rot.to(q.dtype).float(), k_cache.float(), v_cache.float(),
                               cache_seqlens + q.shape[1], block_table, softmax_scale, (window_left, -1), softcap)
    out.copy_(ref)


@_append_attention_op.register_fake
def _(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, block_table, out, interleaved, softmax_scale,
      window_left, softcap, num_splits, trigger_next=False):
    return None


def append_attention(
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
    softmax_scale: Optional[float] = None,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    num_splits: Optional[int] = None,
    out: Optional[torch.Tensor] = None,
    trigger_next: bool = False,
) -> torch.Tensor:
    """Rotate and append the new tokens' k, v to the cache and attend over it, one launch.

    Args:
        q: (batch, q_len, heads, head_dim), float16, bfloat16 or float32; q_len 1..16. Read
            only (rotated in registers, not in place as ``append_kv`` does).
        k, v: (batch, q_len, kv_heads, head_dim) of q's dtype: the new tokens' keys (not yet
            rotated) and values.
        k_cache, v_cache, block_table: as ``decode_attention``; written at the new tokens'
            slots only.
        cache_seqlens: (batch,) int32: each sequence's length BEFORE the new tokens, as
            ``append_kv`` takes it. Not updated here: add q_len afterwards.
        cos, sin, interleaved: the rotary tables and layout of ``append_kv``.
        softmax_scale, window, softcap, num_splits, out: as ``decode_attention``.
        trigger_next: a scheduling hint, results unchanged: on Hopper the kernel lets the
            next kernel, if launched under programmatic dependent launch, be placed while it
            runs (the batch-1 engine's o GEMV loads its weight then: ``gemv_norm.loads_weight_early``).

    Returns:
        out (batch, q_len, heads, head_dim): ``decode_attention`` of the rotated q over the
        cache holding the new tokens. No host synchronisation, a workspace sized from
        shapes: CUDA-graph capturable.
    """
    softmax_scale = check_decode_args(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, window,
                                      softcap, num_splits)
    cos, sin = check_new_kv(q, k, v, k_cache, cos, sin)
    B = q.shape[0]

    def run(work):
        (qw, _), (kw, _), (vw, _) = (heads_view(t, B, True) for t in (q, k, v))
        call_op(_append_attention_op, qw, kw, vw, k_cache, v_cache, cache_seqlens, cos, sin, block_table, work,
                bool(interleaved), softmax_scale, int(window[0]), float(softcap), num_splits or 0, bool(trigger_next))
    return into_out(out, q, run)


def append_attention_ref(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, block_table=None, interleaved=False,
                         softmax_scale=None, window=(-1, -1), softcap=0.0):
    """Unfused: ``append_kv_ref`` then ``decode_attention_ref`` with the lengths plus q_len.
    Returns (out, k_cache, v_cache), new tensors; the inputs are not modified."""
    q_rot, kc, vc = append_kv_ref(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, block_table, interleaved)
    out = decode_attention_ref(q_rot, kc, vc, cache_seqlens + q.shape[1], block_table, softmax_scale, window, softcap)
    return out, kc, vc
