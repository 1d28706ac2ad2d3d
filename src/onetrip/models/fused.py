"""The fused forward of the Llama-family decoder: the same weights as ``llama.Model``, run
on onetrip's kernels. Selected with ``model.backend = "fused"`` (``llama.Model.forward``
dispatches here); the eager layers (``layers.py``) are the reference it is checked against.
``FusedOptions`` (passed to ``Model``) picks between measured variants.

One layer at a decode step, kernel by kernel (Llama; Qwen2 adds the q/k/v bias to the
QKV GEMM, Qwen3 two RMSNorms of the q and k heads):

    normed, res = add_rms_norm(x, res, attn_norm)     x: the previous layer's MLP output
    qkv  = normed @ wqkv^T                            one GEMM for q, k and v
    append_kv(q, k, v, k_cache, v_cache, lens, cos, sin)   RoPE on q, k + k, v into the cache
    o    = decode_attention(q, k_cache, v_cache, lens + 1)  split-KV over the cache
           (or both in one launch, append_attention: FusedOptions.append_in_attention)
    x    = o @ wo^T
    normed, res = add_rms_norm(x, res, mlp_norm)      the residual add rides in the norm
    y    = silu_mul(normed @ w_gate_up^T)             one GEMM for gate and up
    x    = y @ w_down^T

8 kernels per layer plus the split-KV merge where the context is split (9), one fewer with
append_attention; at batch 1 the projections are onetrip's GEMVs, and the norms, residual
adds and silu_mul ride in them (6, or 5).
The eager form takes ~25 (norm statistics, casts, rotary halves, cache index_put, repeat
of K/V for GQA, SDPA with its mask, residual adds, SiLU and multiply). The residual stream never
makes its own pass: each add happens inside the next norm, whose ``h`` output is the new
residual. Prefill (more than ``MAX_Q_LEN`` new tokens) attends with ``flash_attention``.

On a tensor-parallel shard (``model.tp`` set, ``tp.py``) the o and down projections give
this rank's partial sums, and the ``add_rms_norm`` after each is ``allreduce_add_rms_norm``:
the sum over the ranks, the residual add and the norm. Batch 1 then takes the same path as
more rows (GEMVs, no residual in their epilogues: a partial sum is not the residual's
addend), 7 kernels a layer with a one-kernel all-reduce + norm; the LM head gives this
rank's vocabulary rows. (With NCCL's all-reduce instead, each reduction is a copy, the
all-reduce and ``add_rms_norm``: 11 a layer.)

A paged cache (``paged.PagedKVCache``) passes its block table to append_attention (or
append_kv), which follows it in the kernel; prefill's flash_attention reads each
sequence's pages gathered into a contiguous copy first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.allreduce_norm import AllReduceComm, allreduce_add_rms_norm, make_comm
from ..ops.append_attention import append_attention
from ..ops.append_kv import append_kv
from ..ops.decode_attention import MAX_Q_LEN, decode_attention
from ..ops.flash_attention import flash_attention
from ..ops.gemv_norm import gemv_add_residual, gemv_rms_norm, loads_weight_early
from ..ops.glu import silu_mul
from ..ops.norm import add_rms_norm, rms_norm
from ..ops.rotary import apply_rotary
from ..ops.skinny_matmul import GEMV_PICKS, GemvPicks, silu_mul_matmul, skinny_matmul
from .config import ModelConfig
from .layers import Attention, Block, take_positions


@dataclass(frozen=True)
class FusedOptions:
    """Variants of the fused backend's decode step (prefill always appends to the cache, then
    attends); the defaults are the measured picks.

    append_in_attention: a decode step appends K/V and attends in one ``append_attention``
        launch, instead of ``append_kv`` then ``decode_attention``.
    trigger_o: at batch 1, the attention kernel triggers the o GEMV's launch at its start
        where that GEMV loads its whole weight before its PDL wait
        (``gemv_norm.loads_weight_early``), so W_o streams during the attention.
    advance_kernel: the engine ends each step (record the token, EOS, lens += 1, step += 1;
        greedy, the argmax's second stage too) with one ``ops.advance`` kernel, not op by op.
    gemv_picks: the batch-1 GEMVs' measured launches (``ops.skinny_matmul.GEMV_PICKS``);
        another ``GemvPicks`` A/Bs a launch or the early weight chunks.
    """

    append_in_attention: bool = True  # H200 step: 1B 0.872 -> 0.849 ms, 8B 4.003 -> 3.967 ms
    trigger_o: bool = True  # H100 1B step 1.041 -> 1.028 ms (the 8B's o GEMV does not load early: unchanged)
    advance_kernel: bool = True  # ~9 small kernels fewer: H200 step 1B 0.861 -> 0.837 ms, 8B 3.980 -> 3.952 ms
    gemv_picks: GemvPicks = GEMV_PICKS


class Decoder(Protocol):
    """What the fused forward reads of a model (``llama.Model`` is one)."""

    config: ModelConfig
    embed: nn.Embedding
    layers: Sequence[Block]
    norm: torch.Tensor  # (hidden,) the final RMSNorm's weight
    tp: Any  # tp.TensorParallel of a tensor-parallel shard, else None
    tp_comm: Optional[AllReduceComm]  # a shard's all-reduce buffers (made here on first use)

    @property
    def head_weight(self) -> torch.Tensor:  # (vocab, hidden): the LM head's, or the tied embedding's
        ...

    @property
    def head_bias(self) -> Optional[torch.Tensor]:  # None, or a shard's -inf on padding rows
        ...


# Rows an all-reduce + norm takes in one kernel (``ops.allreduce_norm``, "fused" mode): a
# decode step's batch (1.21-1.67x NCCL + add_rms_norm at 1-64 rows, hidden 8192, 2 H200s; past
# 64 not measured); a longer call (a prefill chunk) takes NCCL's all-reduce. The symmetric
# buffer is 2 x world x this x hidden: world x 8 MB a rank at hidden 8192 in bf16.
FUSED_ALLREDUCE_ROWS = 256


def _comm(model: Decoder, x: torch.Tensor) -> AllReduceComm:
    """The shard's all-reduce buffers, made on the first forward (a collective: every rank
    makes them there, outside any graph capture) and kept while the model lives, since a
    captured graph holds their addresses."""
    if model.tp_comm is None:
        tp = model.tp
        model.tp_comm = make_comm(tp.group, tp.rank, tp.world, x.shape[-1], FUSED_ALLREDUCE_ROWS, x.dtype, x.device,
                                  tp.allreduce)
    return model.tp_comm


def _add_norm(model: Decoder, x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor,
              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """add_rms_norm(x, residual): (normed, x + residual). On a tensor-parallel shard an x
    with a residual is an o or down projection, this rank's partial sum: all-reduced in
    the same call. Without a residual x is the embedding, the same on every rank."""
    if model.tp is None or residual is None:
        return add_rms_norm(x, residual, weight, eps)
    return allreduce_add_rms_norm(x, residual, weight, eps, _comm(model, x))


def _gemv(x: torch.Tensor) -> bool:
    """One 16-bit row on a GPU (batch-1 decode, the LM head of one sequence): onetrip's
    GEMV, 1.02-1.42x cuBLAS on the ten 1B/8B projections (H200); more rows go to cuBLAS,
    which reads at 21-98% of copy at 32 rows against Triton's 18-88%."""
    return x.is_cuda and x.numel() == x.shape[-1] and x.dtype != torch.float32


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], picks: GemvPicks) -> torch.Tensor:
    """x @ weight^T (+ bias); ``picks``: the GEMV's launches."""
    return skinny_matmul(x, weight, bias, picks=picks) if _gemv(x) else F.linear(x, weight, bias)


def _down(gate_up: torch.Tensor, weight: torch.Tensor, picks: GemvPicks) -> torch.Tensor:
    """(silu(gate) * up) @ weight^T: at batch 1 one GEMV with SwiGLU in its prologue."""
    if _gemv(gate_up):
        return silu_mul_matmul(gate_up, weight, picks=picks)
    return F.linear(silu_mul(gate_up), weight)


def _attention(attn: Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               lens: Optional[torch.Tensor], lens_after: Optional[torch.Tensor],
               positions: Optional[torch.Tensor], starts: Optional[list[int]], options: FusedOptions
               ) -> torch.Tensor:
    """x (batch, seq, hidden) normed -> (batch, seq, hidden) before the residual add.

    With a cache: ``lens`` (batch,) int32 tokens cached before this call, ``lens_after`` =
    lens + seq (None where append_attention counts them itself). Without: ``positions``
    (batch, seq), the tokens' positions, give the rotary angles and attention is causal
    within the call (only used there). ``starts``: lens on the host, for a prefill (read
    once per forward, not once per layer).
    """
    picks = options.gemv_picks
    qkv = _linear(x, attn.wqkv.weight, attn.wqkv.bias, picks)  # (batch, seq, q + 2 kv heads x head_dim)
    out = _attend(attn, qkv.view(*x.shape[:2], -1), cos, sin, lens, lens_after, positions, starts,
                  options.append_in_attention)
    return _linear(out, attn.wo.weight, None, picks)


def _attend(attn: Attention, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            lens: Optional[torch.Tensor], lens_after: Optional[torch.Tensor],
            positions: Optional[torch.Tensor], starts: Optional[list[int]], append_in_attention: bool,
            trigger_next: bool = False) -> torch.Tensor:
    """qkv (batch, seq, (heads + 2 kv_heads) x head_dim) -> attention output (batch, seq,
    heads x head_dim), before the output projection. ``append_in_attention``: a decode
    step appends and attends in one ``append_attention`` launch; ``trigger_next``: that
    kernel's scheduling hint for the kernel after it."""
    c = attn.config
    b, s, _ = qkv.shape
    q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.view(b, s, c.num_heads, c.head_dim)
    k = k.view(b, s, c.num_kv_heads, c.head_dim)
    v = v.view(b, s, c.num_kv_heads, c.head_dim)
    if c.qk_norm:
        q = rms_norm(q, attn.q_norm, c.rms_norm_eps)
        k = rms_norm(k, attn.k_norm, c.rms_norm_eps)

    cache = attn.cache
    if cache is None:
        q, k = apply_rotary(q, k, cos, sin, positions)
        out = flash_attention(q, k, v, causal=True)
    elif s <= MAX_Q_LEN and append_in_attention:
        out = append_attention(q, k, v, cache.k, cache.v, lens, cos, sin, block_table=cache.block_table,
                               trigger_next=trigger_next)
    else:
        table = cache.block_table  # (batch, max_blocks) int32 for a paged cache, else None
        q = append_kv(q, k, v, cache.k, cache.v, lens, cos, sin, block_table=table)  # q rotated in place
        if s <= MAX_Q_LEN:
            out = decode_attention(q, cache.k, cache.v, lens_after, block_table=table)
        else:
            out = _prefill_attention(q, cache.k, cache.v, starts, table)
    return out.reshape(b, s, q_size)


def _prefix(cache: torch.Tensor, table: Optional[torch.Tensor], rows: slice, n: int) -> torch.Tensor:
    """Positions 0..n-1 of sequences ``rows`` of one cache tensor: (rows, n, kv_heads,
    head_dim), a view of a contiguous cache, or a gather of a paged one's pages through
    ``table`` (flash_attention reads strided keys but not a page indirection)."""
    if table is None:
        return cache[rows, :n]
    blocks = table[rows, : -(-n // cache.shape[1])].long()  # (rows, pages holding n positions)
    return cache[blocks].flatten(1, 2)[:, :n]


def _prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, starts: list[int],
                       table: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Causal attention of q (batch, seq, heads, head_dim), already in the cache, over each
    sequence's cached prefix plus itself. Prefill is not graph-captured, so the lengths come
    from the host (``starts``: read once per forward by forward_fused): one ``flash_attention``
    over the common prefix when every sequence has the same length, else one per sequence.
    A paged cache (``table``) is gathered into contiguous keys first, per call of
    flash_attention: a transient copy of just the prefix that call attends over."""
    s = q.shape[1]
    if len(set(starts)) == 1:
        n, rows = starts[0] + s, slice(None)
        return flash_attention(q, _prefix(k_cache, table, rows, n), _prefix(v_cache, table, rows, n), causal=True)
    out = torch.empty_like(q)
    for i, start in enumerate(starts):
        n, rows = start + s, slice(i, i + 1)
        flash_attention(q[rows], _prefix(k_cache, table, rows, n), _prefix(v_cache, table, rows, n), causal=True,
                        out=out[rows])
    return out


def forward_fused(model: Decoder, tokens: torch.Tensor, cache_seqlens: Optional[torch.Tensor],
                  positions: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
                  logits_index: Optional[torch.Tensor] = None, options: FusedOptions = FusedOptions(),
                  starts: Optional[Sequence[int]] = None) -> torch.Tensor:
    """Logits (batch, seq, vocab) of ``tokens`` (batch, seq) through onetrip's kernels.

    Called by ``Model.forward`` after its argument checks, with ``positions`` (batch, seq)
    int64 (None with a cache: append_kv takes them from cache_seqlens), the float32 rotary
    tables ``cos, sin`` (max_pos, head_dim / 2), the optional ``logits_index`` (see
    ``Model.forward``) and the model's ``FusedOptions``. No host synchronisation on the
    decode path (seq <= MAX_Q_LEN with a cache), nor on a prefill given ``starts`` (the
    cached lengths as host ints): capturable.
    """
    c = model.config
    b, s = tokens.shape
    lens = lens_after = None
    if model.layers and model.layers[0].attn.cache is not None:
        lens = cache_seqlens if cache_seqlens.dtype == torch.int32 else cache_seqlens.to(torch.int32)
        if s <= MAX_Q_LEN and not options.append_in_attention:
            lens_after = lens + s  # decode_attention counts the appended tokens (one tiny kernel per step)

    x = F.embedding(tokens, model.embed.weight)  # (batch, seq, hidden)
    if b * s == 1 and _gemv(x) and lens is not None and model.tp is None:
        return _decode_one_row(model, x, cos, sin, lens, lens_after, options)
    residual = None
    # A prefill needs the lengths on the host: the caller's ``starts``, else one read here (not
    # once a layer: each read waits for the GPU to drain, so the host never ran ahead of it).
    if lens is None or s <= MAX_Q_LEN:
        starts = None
    elif starts is None:
        starts = lens.tolist()
    for layer in model.layers:
        normed, residual = _add_norm(model, x, residual, layer.attn_norm, c.rms_norm_eps)
        x = _attention(layer.attn, normed, cos, sin, lens, lens_after, positions, starts, options)
        normed, residual = _add_norm(model, x, residual, layer.mlp_norm, c.rms_norm_eps)
        mlp = layer.mlp
        x = _down(_linear(normed, mlp.w_gate_up.weight, None, options.gemv_picks), mlp.w_down.weight,
                  options.gemv_picks)
    if logits_index is not None:
        x = take_positions(x, logits_index)
        residual = None if residual is None else take_positions(residual, logits_index)
    x, _ = _add_norm(model, x, residual, model.norm, c.rms_norm_eps)
    return _linear(x, model.head_weight, model.head_bias, options.gemv_picks)  # (batch, seq, vocab)


def _decode_one_row(model: Decoder, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    lens: torch.Tensor, lens_after: Optional[torch.Tensor], options: FusedOptions) -> torch.Tensor:
    """One token of one sequence (x (1, 1, hidden)): every projection a GEMV, and each
    residual add + RMSNorm carried by the GEMVs around it (``ops.gemv_norm``):

        qkv = gemv_rms_norm(h, ss, attn_norm, Wqkv)        norm in the prologue
        o   = attention(qkv)                                append_kv, decode_attention (or append_attention)
        h, ss = gemv_add_residual(o, Wo, h)                 residual add in the epilogue
        gu  = gemv_rms_norm(h, ss, mlp_norm, Wgate_up)
        h, ss = gemv_add_residual(gu, Wdown, h, silu_mul)   SwiGLU in the prologue

    6 kernels per layer (7 with the split-KV merge; one fewer with append_in_attention)
    against 9-10; the first layer's norm is an ``add_rms_norm`` of the embedding. Returns
    logits (1, 1, vocab)."""
    c = model.config
    eps, picks = c.rms_norm_eps, options.gemv_picks
    h = ss = None
    # Every layer's W_o has one shape: whether its GEMV loads it early is asked once a step.
    trigger_o = (options.trigger_o and bool(model.layers)
                 and loads_weight_early(model.layers[0].attn.wo.weight, picks=picks))
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.attn, layer.mlp
        if i == 0:
            normed, h = add_rms_norm(x, None, layer.attn_norm, eps)
            qkv = _linear(normed, attn.wqkv.weight, attn.wqkv.bias, picks)
        else:
            qkv = gemv_rms_norm(h, ss, layer.attn_norm, eps, attn.wqkv.weight, attn.wqkv.bias, picks=picks)
        o = _attend(attn, qkv.view(1, 1, -1), cos, sin, lens, lens_after, None, None,
                    options.append_in_attention, trigger_next=trigger_o)
        h, ss = gemv_add_residual(o, attn.wo.weight, h, picks=picks)
        gate_up = gemv_rms_norm(h, ss, layer.mlp_norm, eps, mlp.w_gate_up.weight, picks=picks)
        h, ss = gemv_add_residual(gate_up, mlp.w_down.weight, h, silu_mul=True, picks=picks)
    if h is None:  # no layers
        return _linear(rms_norm(x, model.norm, eps), model.head_weight, None, picks)
    return gemv_rms_norm(h, ss, model.norm, eps, model.head_weight, picks=picks).view(1, 1, -1)
