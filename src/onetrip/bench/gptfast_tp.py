"""gpt-fast's tensor-parallel decoder, the peer of ``onetrip bench decode --tp N``: a plain
PyTorch module on the tensors of one rank's ``models.tp`` shard, written the way gpt-fast
writes its model and TP patch (column-parallel q/k/v and gate/up, row-parallel o and down,
an all-reduce after each of the two), for ``torch.compile(mode="reduce-overhead",
fullgraph=True)`` of its decode step. One difference, in gpt-fast's favour: the LM head is
the shard's vocabulary slice, where gpt-fast replicates it (each rank would read all 1.05 GB
of Llama-3.1-8B's head, 2.1 GB of 70B's, every step).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..models import Model
from ..models.config import rope_tables
from ..models.layers import rms_norm, rotate


def _all_reduce(x: torch.Tensor, op: str, group) -> torch.Tensor:
    """x reduced over the group, x left as it is: under torch.compile a functional
    collective (inductor schedules its wait, as in gpt-fast); eager, ``dist.all_reduce`` of a
    copy (the functional op's first eager call imports dynamo: ~6 s on a CPU)."""
    if torch.compiler.is_compiling():
        from torch.distributed import _functional_collectives as funcol

        return funcol.all_reduce(x, op, group)
    out = x.clone()
    dist.all_reduce(out, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op],
                    group=group)
    return out


class GptFastTP(nn.Module):
    """gpt-fast's tensor-parallel decoder on one rank's shard (``model``: a local
    ``llama.Model``; its parameters are used, not copied). Per layer:

        x = x + all_reduce(o(attention(rope(q), rope(k), v)))    q, k, v = wqkv(rms_norm(x)): local heads
        x = x + all_reduce(down(silu(gate) * up))                 gate, up: local columns

    The KV cache is static, (layers, batch, max_seq, local kv heads, head_dim), written at
    each token's position; attention reads all of it under a mask, as gpt-fast does.
    ``forward(tokens (batch, seq), lens (batch,) int32) -> (batch, 1) int64`` is the greedy
    next token: each rank's max over its vocabulary slice, then the largest value over the
    ranks (ties: the lowest token id) by two all-reduces of (batch,) tensors. A model
    without ``tp`` (one GPU) runs the same code without collectives."""

    def __init__(self, model: Model, batch: int, max_seq: int):
        super().__init__()
        c, tp = model.config, model.tp
        self.model = model
        # the functional collectives take a group object, not None for the default one
        self.group, self.world = (None, 1) if tp is None else (tp.group or dist.group.WORLD, tp.world)
        self.start = 0 if tp is None else tp.vocab_range(c.vocab_size)[0]  # this rank's first token id
        shape = (c.num_layers, batch, max_seq, c.num_kv_heads, c.head_dim)
        kw = dict(dtype=model.dtype, device=model.device)
        self.register_buffer("k_cache", torch.zeros(shape, **kw), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, **kw), persistent=False)
        cos, sin = rope_tables(c, max_seq, model.device)
        self.register_buffer("cos", cos.to(model.dtype), persistent=False)  # (max_seq, head_dim / 2)
        self.register_buffer("sin", sin.to(model.dtype), persistent=False)
        self.register_buffer("key_pos", torch.arange(max_seq, device=model.device), persistent=False)

    def _reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return x if self.world == 1 else _all_reduce(x, op, self.group)

    def _attention(self, i: int, attn, x, cos, sin, pos, rows, mask) -> torch.Tensor:
        c = self.model.config
        b, s, _ = x.shape
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        q, k, v = F.linear(x, attn.wqkv.weight, attn.wqkv.bias).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(b, s, c.num_heads, c.head_dim)
        k = k.view(b, s, c.num_kv_heads, c.head_dim)
        v = v.view(b, s, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = rms_norm(q, attn.q_norm, c.rms_norm_eps), rms_norm(k, attn.k_norm, c.rms_norm_eps)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k_cache, v_cache = self.k_cache[i], self.v_cache[i]  # (batch, max_seq, kv heads, head_dim)
        k_cache[rows, pos] = k
        v_cache[rows, pos] = v
        rep = c.num_heads // c.num_kv_heads
        keys = k_cache.transpose(1, 2).repeat_interleave(rep, dim=1)  # (batch, heads, max_seq, head_dim)
        values = v_cache.transpose(1, 2).repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask)
        return F.linear(out.transpose(1, 2).reshape(b, s, q_size), attn.wo.weight)

    def forward(self, tokens: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        m, c = self.model, self.model.config
        b, s = tokens.shape
        pos = lens.long()[:, None] + torch.arange(s, device=tokens.device)  # (batch, seq)
        cos, sin = self.cos[pos], self.sin[pos]  # (batch, seq, head_dim / 2)
        mask = (self.key_pos <= pos[..., None])[:, None]  # (batch, 1, seq, max_seq): causal over the cache
        rows = torch.arange(b, device=tokens.device)[:, None]
        x = F.embedding(tokens, m.embed.weight)  # (batch, seq, hidden): the table is replicated
        for i, layer in enumerate(m.layers):
            h = rms_norm(x, layer.attn_norm, c.rms_norm_eps)
            x = x + self._reduce(self._attention(i, layer.attn, h, cos, sin, pos, rows, mask))
            gate, up = F.linear(rms_norm(x, layer.mlp_norm, c.rms_norm_eps), layer.mlp.w_gate_up.weight).chunk(2, -1)
            x = x + self._reduce(F.linear(F.silu(gate) * up, layer.mlp.w_down.weight))
        logits = F.linear(rms_norm(x[:, -1], m.norm, c.rms_norm_eps), m.head_weight, m.head_bias)  # (batch, rows)
        value, index = logits.float().max(-1)
        index = index + self.start
        best = self._reduce(value, "max")
        token = self._reduce(torch.where(value == best, index, c.vocab_size), "min")
        return token[:, None]
