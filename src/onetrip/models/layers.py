"""The eager layers of the Llama-family decoder, op by op as a user writes it: the
reference the fused forward (``fused.py``) is checked against, and the "eager" backend.

One layer (pre-norm):

    h   = x + o_proj(attention(rope(q), rope(k), v))     q, k, v = split(wqkv(rms_norm(x)) [+ bqkv])
    out = h + down(silu(gate) * up)                      gate, up = split(w_gate_up(rms_norm(h)))

q/k/v and gate/up are each one fused projection (one GEMM instead of three or two), joined
at load time. Qwen3 normalizes each q and k head (RMSNorm over head_dim) before the
rotary. The rotary is the NeoX layout (pairs x[i], x[i + head_dim/2]) as in Hugging Face
checkpoints. A layer's ``attn.cache`` is a ``KVCache`` (contiguous) or a
``paged.PagedKVCache`` (pages shared through a block table); both backends read either.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig
from .paged import PagedKVCache


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim, statistics in float32;
    the result is cast back to x's dtype before the weight multiply (the Llama/HF order)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rotary of x (batch, seq, heads, head_dim) with cos, sin (batch, seq, head_dim/2)
    already cast to x's dtype: ``x * cos + rotate_half(x) * sin`` as Hugging Face writes it."""
    cos = torch.cat([cos, cos], dim=-1)[:, :, None, :]  # (batch, seq, 1, head_dim)
    sin = torch.cat([sin, sin], dim=-1)[:, :, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class KVCache(nn.Module):
    """A static cache of one layer: k and v, each (batch, max_seq, num_kv_heads, head_dim)
    in the model dtype; slot (b, p) holds the key/value of sequence b at position p.
    ``paged.PagedKVCache`` is the paged form, with the same methods."""

    block_table = None  # contiguous: the kernels take no table

    def __init__(self, batch: int, max_seq: int, kv_heads: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch, max_seq, kv_heads, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    @property
    def batch(self) -> int:
        return self.k.shape[0]

    @property
    def max_seq(self) -> int:
        return self.k.shape[1]

    def store(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k, v (batch, seq, kv_heads, head_dim) at ``positions`` (batch, seq) int64."""
        rows = torch.arange(k.shape[0], device=k.device)[:, None]  # (batch, 1)
        self.k[rows, positions] = k
        self.v[rows, positions] = v

    def contiguous(self) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (batch, max_seq, kv_heads, head_dim): the buffers themselves."""
        return self.k, self.v

    def narrow(self, batch: int) -> "KVCache":
        """A cache of the first ``batch`` sequences sharing this one's memory (the engine
        keeps one allocation for its largest batch and runs smaller batches in views)."""
        view = KVCache(0, 0, 0, 0, self.k.dtype, self.k.device)
        view.k, view.v = self.k[:batch], self.v[:batch]
        return view


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, dtype, device):
        super().__init__()
        c = config
        self.config = c
        self.wqkv = nn.Linear(c.hidden_size, c.qkv_size, bias=c.attention_bias, dtype=dtype, device=device)
        self.wo = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False, dtype=dtype, device=device)
        if c.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(c.head_dim, dtype=dtype, device=device))
            self.k_norm = nn.Parameter(torch.ones(c.head_dim, dtype=dtype, device=device))
        self.cache: Optional[KVCache | PagedKVCache] = None

    def forward(self, x, cos, sin, positions):
        """x (batch, seq, hidden); cos, sin (batch, seq, head_dim/2) in x's dtype; positions
        (batch, seq) int64, each token's absolute position. Returns (batch, seq, hidden)."""
        c = self.config
        b, s, _ = x.shape
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        q, k, v = self.wqkv(x).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(b, s, c.num_heads, c.head_dim)
        k = k.view(b, s, c.num_kv_heads, c.head_dim)
        v = v.view(b, s, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = rms_norm(q, self.q_norm, c.rms_norm_eps), rms_norm(k, self.k_norm, c.rms_norm_eps)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)

        if self.cache is not None:
            # Write this step's k, v into their slots, then attend over the whole cache (a
            # paged one gathered through its block table); the mask hides slots past each
            # query's position (so no host read of the lengths).
            self.cache.store(positions, k, v)
            k, v = self.cache.contiguous()  # (batch, max_seq, kv_heads, head_dim)
            key_pos = torch.arange(k.shape[1], device=x.device)[None, :].expand(b, -1)
        else:
            key_pos = positions
        mask = key_pos[:, None, :] <= positions[:, :, None]  # (batch, seq, keys): causal

        # GQA: query head h reads kv head h // (num_heads / num_kv_heads).
        rep = c.num_heads // c.num_kv_heads
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (batch, heads, len, head_dim)
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])  # (batch, heads, seq, head_dim)
        return self.wo(out.transpose(1, 2).reshape(b, s, q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, dtype, device):
        super().__init__()
        self.inter = config.intermediate_size
        self.w_gate_up = nn.Linear(config.hidden_size, 2 * self.inter, bias=False, dtype=dtype, device=device)
        self.w_down = nn.Linear(self.inter, config.hidden_size, bias=False, dtype=dtype, device=device)

    def forward(self, x):
        gate, up = self.w_gate_up(x).split([self.inter, self.inter], dim=-1)
        return self.w_down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, dtype, device):
        super().__init__()
        self.eps = config.rms_norm_eps
        self.attn_norm = nn.Parameter(torch.ones(config.hidden_size, dtype=dtype, device=device))
        self.attn = Attention(config, dtype, device)
        self.mlp_norm = nn.Parameter(torch.ones(config.hidden_size, dtype=dtype, device=device))
        self.mlp = MLP(config, dtype, device)

    def forward(self, x, cos, sin, positions):
        h = x + self.attn(rms_norm(x, self.attn_norm, self.eps), cos, sin, positions)
        return h + self.mlp(rms_norm(h, self.mlp_norm, self.eps))


def take_positions(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (batch, seq, ...) -> (batch, 1, ...): row ``index[b]`` of each sequence."""
    return x[torch.arange(x.shape[0], device=x.device), index][:, None]
