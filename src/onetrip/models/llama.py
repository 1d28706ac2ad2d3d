"""The Llama-family decoder (Llama 2/3, Qwen2, Qwen3): ``Model`` holds the weights and the
KV caches and runs them through either backend, the eager layers (``layers.py``) or
onetrip's kernels (``fused.py``).

    model = Model.random(get_config("tiny"), torch.float32, "cpu", seed=0)  # or loader.load_model(dir)
    logits = model(tokens)                                   # (batch, seq, vocab), no cache

    model.setup_cache(batch, max_seq)                        # static KV cache per layer
    seqlens = torch.zeros(batch, dtype=torch.int32)          # tokens already in the cache
    logits = model(prompt, seqlens); seqlens += prompt.shape[1]
    logits = model(next_tok[:, None], seqlens); seqlens += 1 # one decode step

A layer's ``attn.cache`` may instead be a ``paged.PagedKVCache`` (pages shared through a
block table; the engine sets it up with ``Engine(..., paged=True)``): both backends read it.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig, rope_tables
from .fused import FusedOptions, forward_fused
from .layers import Block, KVCache, rms_norm, take_positions

BACKENDS = ("eager", "fused")


class Model(nn.Module):
    """A Llama-family decoder. Parameters (fused layouts, (out, in) as in nn.Linear):

    embed (vocab, hidden); per layer attn_norm (hidden,), attn.wqkv (q+2kv heads x head_dim,
    hidden) [+ bias], attn.q_norm/k_norm (head_dim,) for Qwen3, attn.wo (hidden, heads x
    head_dim), mlp_norm (hidden,), mlp.w_gate_up (2 x intermediate, hidden) with gate
    first, mlp.w_down (hidden, intermediate); norm (hidden,); lm_head (vocab, hidden),
    or None when tied to embed.

    A tensor-parallel shard (``tp.py``: ``shard_model``, ``load_model_tp``, ``random_model_tp``)
    is a ``Model`` of ``tp.local_config`` with ``tp`` set; its logits are its own vocabulary
    rows (batch, seq, ceil(vocab / world)).

    Constructed weights are uninitialised (``nn.Linear``'s default init, ones for norms);
    use ``Model.random`` or ``loader.load_model``. ``fused_options``: the fused backend's
    variants (``fused.FusedOptions``; the default is the measured pick), also read by the
    engine for its step.
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32, device=None, *,
                 fused_options: FusedOptions = FusedOptions()):
        super().__init__()
        self.config = config
        self.fused_options = fused_options
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(Block(config, dtype, device) for _ in range(config.num_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size, dtype=dtype, device=device))
        self.lm_head = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype, device=device)
        self._rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # float32 (n, head_dim/2) each
        self._backend = "eager"
        # A tensor-parallel shard's ``tp.TensorParallel`` (set by the builders in tp.py) and
        # the fused backend's all-reduce buffers (``ops.allreduce_norm``); None on one device.
        self.tp = None
        self.tp_comm = None

    @property
    def backend(self) -> str:
        """"eager" (``layers.py``, op by op) or "fused" (onetrip's kernels, ``fused.py``); same weights."""
        return self._backend

    @backend.setter
    def backend(self, name: str) -> None:
        if name not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {name!r}")
        self._backend = name

    @property
    def fused_options(self) -> FusedOptions:
        """The fused backend's variants (``fused.FusedOptions``); the eager backend ignores them."""
        return self._fused_options

    @fused_options.setter
    def fused_options(self, options: FusedOptions) -> None:
        if not isinstance(options, FusedOptions):
            raise TypeError(f"fused_options must be a FusedOptions, got {type(options).__name__}")
        self._fused_options = options

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @classmethod
    @torch.no_grad()
    def random(cls, config: ModelConfig, dtype: torch.dtype = torch.float32, device=None, seed: int = 0, *,
               fused_options: FusedOptions = FusedOptions()) -> "Model":
        """Random weights for benchmarks and tests: matrices and biases N(0, 0.02^2), norm
        weights 1 + N(0, 0.1^2) (not all ones, so a norm applied to the wrong tensor shows).
        Drawn in float32 on ``device`` from a generator seeded with ``seed``: the same seed
        gives the same weights on the same kind of device (CPU and CUDA streams differ).
        On the device because 8e9 normals take about a minute on the host."""
        device = torch.device(device or "cpu")
        with torch.device("meta"):
            model = cls(config, dtype, fused_options=fused_options)
        model = model.to_empty(device=device)
        gen = torch.Generator(device=device).manual_seed(seed)
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, device=device)
            p.copy_(1 + 0.1 * r if p.ndim == 1 and "bias" not in name else 0.02 * r)
        return model.requires_grad_(False)

    def setup_cache(self, batch: int, max_seq: int) -> None:
        """Allocate a zeroed static KV cache of ``max_seq`` positions for ``batch`` sequences
        in every layer (2 x num_layers x batch x max_seq x kv_heads x head_dim elements of
        the model dtype), and rotary tables for ``max_seq`` positions."""
        c = self.config
        for layer in self.layers:
            layer.attn.cache = KVCache(batch, max_seq, c.num_kv_heads, c.head_dim, self.dtype, self.device)
        self._rope_for(max_seq)

    def reset_cache(self) -> None:
        """Drop the KV cache: later calls run without one."""
        for layer in self.layers:
            layer.attn.cache = None

    def use_caches(self, caches) -> None:
        """Point each layer's attention at its cache, one a layer in order (KVCache, or a
        PagedKVCache view of a shared pool)."""
        for layer, kv in zip(self.layers, caches):
            layer.attn.cache = kv

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head's weight (vocab, hidden): the embedding's when the two are tied."""
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    @property
    def head_bias(self) -> Optional[torch.Tensor]:
        """None, except on a tensor-parallel shard whose head rows run past the vocabulary:
        (rows,) zeros with -inf on the padding rows (``tp.py``)."""
        return None if self.lm_head is None else self.lm_head.bias

    def graph_key(self) -> tuple:
        """What a CUDA graph of this model's forward depends on beyond its arguments and caches:
        the backend, the fused options and the rotary tables' addresses (made anew when a
        larger max_seq asks for more positions). A graph keeps ``rope_tables`` alive beside
        it, so those addresses are not reused while it may replay."""
        rope = self._rope
        return self.backend, self.fused_options, None if rope is None else (rope[0].data_ptr(), rope[1].data_ptr())

    @property
    def rope_tables(self) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """The float32 (positions, head_dim / 2) cos and sin tables the forward reads, or None before any."""
        return self._rope

    def _rope_for(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._rope is None or self._rope[0].shape[0] < n or self._rope[0].device != self.device:
            self._rope = rope_tables(self.config, max(n, 64), self.device)
        return self._rope

    def forward(self, tokens: torch.Tensor, cache_seqlens: Optional[torch.Tensor] = None,
                logits_index: Optional[torch.Tensor] = None, *, starts: Optional[Sequence[int]] = None
                ) -> torch.Tensor:
        """Logits (batch, seq, vocab) in the model dtype for ``tokens`` (batch, seq) int.

        Without a cache (``setup_cache`` not called): a causal forward of the whole
        sequences from position 0; ``cache_seqlens`` may give each sequence's start
        position instead.

        With a cache: ``cache_seqlens`` (batch,) int32/int64 (required) counts the tokens
        each sequence already has in the cache; the new tokens take positions
        ``cache_seqlens[b] + i`` and their k, v are written into the cache there. The
        lengths are NOT updated: the caller adds ``seq`` afterwards (``seqlens += seq``),
        on the device. Positions must stay below the cache's max_seq (not checked, to
        keep the host out of the decode step). Prefill and decode are the same call.

        ``logits_index`` (batch,) int64: return only the logits at position
        ``logits_index[b]`` of each sequence, (batch, 1, vocab), so a prefill of a long or
        right-padded prompt does not compute (or hold) seq x vocab logits.

        ``starts``: ``cache_seqlens`` as host ints, where the caller knows them (the engine
        does). A fused prefill with a cache otherwise reads them from the device once, a
        synchronisation that keeps the host from running ahead and a CUDA graph from
        capturing the call; with them the call reads nothing back (they must equal the
        device's: not checked, as that would be the read).
        """
        if tokens.ndim != 2 or tokens.is_floating_point():
            raise ValueError(f"tokens must be (batch, seq) integer ids, got {tuple(tokens.shape)} {tokens.dtype}")
        b, s = tokens.shape
        cache = self.layers[0].attn.cache if len(self.layers) else None
        cached = cache is not None
        if cache_seqlens is not None and (cache_seqlens.shape != (b,) or cache_seqlens.is_floating_point()):
            raise ValueError(f"cache_seqlens must be ({b},) integers (one per sequence), "
                             f"got {tuple(cache_seqlens.shape)} {cache_seqlens.dtype}")
        if cached and cache_seqlens is None:
            raise ValueError("the model has a KV cache (setup_cache was called): pass cache_seqlens, "
                             "the (batch,) count of tokens already cached per sequence")
        if cached and (b != cache.batch or s > cache.max_seq):
            raise ValueError(f"tokens {tuple(tokens.shape)} do not fit the KV cache of batch {cache.batch} "
                             f"and max_seq {cache.max_seq}; call setup_cache(batch, max_seq) again")
        if starts is not None and (len(starts) != b or any(type(n) is not int or n < 0 for n in starts)):
            raise ValueError(f"starts must be {b} ints >= 0 (cache_seqlens on the host), got {starts!r}")
        if cached and self.backend == "fused":
            # append_kv derives the positions from cache_seqlens on the device: computing them
            # here would cost three kernels per decode step.
            cos, sin = self._rope_for(cache.max_seq)
            return forward_fused(self, tokens, cache_seqlens, None, cos, sin, logits_index, self.fused_options, starts)
        offsets = torch.arange(s, device=tokens.device)[None, :]
        positions = offsets if cache_seqlens is None else cache_seqlens.long()[:, None] + offsets
        positions = positions.expand(b, s)  # (batch, seq) int64
        if cached:
            cos, sin = self._rope_for(cache.max_seq)
        else:
            # Host-side bound, fine here: without a cache this is not the graph-captured path.
            cos, sin = self._rope_for(s if cache_seqlens is None else int(positions.max()) + 1)
        if self.backend == "fused":
            return forward_fused(self, tokens, cache_seqlens, positions, cos, sin, logits_index, self.fused_options)
        cos, sin = cos[positions].to(self.dtype), sin[positions].to(self.dtype)  # (batch, seq, head_dim/2)

        x = self.embed(tokens)  # (batch, seq, hidden)
        eps = self.config.rms_norm_eps
        for layer in self.layers:
            if self.tp is None:
                x = layer(x, cos, sin, positions)
            else:  # the o and down projections give this rank's partial sums: summed before each add
                x = x + self.tp.all_reduce(layer.attn(rms_norm(x, layer.attn_norm, eps), cos, sin, positions))
                x = x + self.tp.all_reduce(layer.mlp(rms_norm(x, layer.mlp_norm, eps)))
        if logits_index is not None:
            x = take_positions(x, logits_index)
        x = rms_norm(x, self.norm, eps)
        return F.linear(x, self.head_weight, self.head_bias)  # (batch, seq, vocab), or this rank's vocab rows


@torch.no_grad()
def greedy_generate(model: Model, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy decoding with the KV cache: prefill ``prompt`` (batch, prompt_len) int64, then
    ``max_new_tokens`` single-token steps. Returns the new tokens (batch, max_new_tokens).
    (Re)allocates the model's cache for prompt_len + max_new_tokens positions. A full model
    only: a tensor-parallel shard's logits are its vocabulary rows (``Engine`` draws from those)."""
    if model.tp is not None:
        raise ValueError("greedy_generate takes a full model; for a tensor-parallel shard use engine.Engine, "
                         "whose sampler reduces over the ranks' vocabulary rows")
    b, p = prompt.shape
    model.setup_cache(b, p + max_new_tokens)
    seqlens = torch.zeros(b, dtype=torch.int32, device=prompt.device)
    logits = model(prompt, seqlens)
    seqlens += p
    out = []
    for _ in range(max_new_tokens):
        tok = logits[:, -1].argmax(-1)  # (batch,)
        out.append(tok)
        if len(out) == max_new_tokens:
            break
        logits = model(tok[:, None], seqlens)
        seqlens += 1
    return torch.stack(out, dim=1)
