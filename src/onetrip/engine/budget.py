"""What a decode step must read from HBM, and the tokens per second that allows.

At batch b each decode step reads every weight once (the GEMMs are matrix-vector
products, so weights dominate) plus each sequence's cached keys and values:

    weight bytes = (all parameters - the input embedding table) x element size
                   + b rows of the input embedding (only the fed tokens are gathered)
                   (with tied embeddings the table is the LM head's: read once, counted once)
    KV bytes     = 2 x layers x kv_heads x head_dim x element size x sum over sequences of
                   the context read at that step

    limit tok/s  = b x copy bandwidth / (weight bytes + KV bytes)

The ideal counts each byte once: activations (a few KB per token at batch 1) and the
logits are left out. This is how the reference figures are stated: an H200 copying at
~4.25 TB/s allows ~1710 tok/s for Llama-3.2-1B (2.47 GB of bf16 weights, tied head) and
~282 tok/s for Llama-3.1-8B (15.0 GB without its 1.05 GB input embedding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.config import ModelConfig
from ..models.paged import pages_for


def weight_bytes(config: ModelConfig, dtype: torch.dtype, batch: int = 1) -> int:
    """Bytes of weights one decode step of ``batch`` sequences reads (module docstring)."""
    elem = torch.empty((), dtype=dtype).element_size()
    params = config.num_parameters()
    if not config.tie_word_embeddings:
        params -= config.vocab_size * config.hidden_size - batch * config.hidden_size
    return params * elem


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V cached per token of context, all layers."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * elem


@dataclass(frozen=True)
class DecodeBudget:
    """Bytes per decode step and what they allow at a given copy bandwidth.

    bytes_per_step: weights + KV read per step, averaged over the steps of the run.
    limit_tok_s: batch x bandwidth / bytes_per_step (None without a bandwidth).
    """

    batch: int
    mean_context: float
    weight_bytes: int
    kv_bytes: float
    bytes_per_step: float
    bandwidth_gbs: float | None
    limit_tok_s: float | None

    def achieved_gbs(self, ms_per_step: float) -> float:
        return self.bytes_per_step / 1e9 / (ms_per_step / 1e3)

    def pct_of_limit(self, ms_per_step: float) -> float | None:
        """Achieved bandwidth as % of the copy bandwidth (= tok/s as % of limit_tok_s)."""
        if not self.bandwidth_gbs:
            return None
        return 100.0 * self.achieved_gbs(ms_per_step) / self.bandwidth_gbs


def decode_budget(config: ModelConfig, dtype: torch.dtype, batch: int, prompt_lens: list[int], steps: int,
                  bandwidth_gbs: float | None = None) -> DecodeBudget:
    """The budget of ``steps`` decode steps after prompts of ``prompt_lens`` tokens: step i
    (1-based) of sequence b reads prompt_lens[b] + i cached tokens (the first new token was
    sampled by the prefill), so the mean context is prompt + (steps + 1) / 2."""
    if batch < 1 or len(prompt_lens) != batch:
        raise ValueError(f"prompt_lens must have one length per sequence (batch {batch}), got {len(prompt_lens)}")
    mean_ctx = sum(prompt_lens) / batch + (steps + 1) / 2
    w = weight_bytes(config, dtype, batch)
    kv = kv_bytes_per_token(config, dtype) * mean_ctx * batch
    total = w + kv
    limit = batch * bandwidth_gbs * 1e9 / total if bandwidth_gbs else None
    return DecodeBudget(batch, mean_ctx, w, kv, total, bandwidth_gbs, limit)


def pool_pages(model, max_batch: int, max_seq: int, page_size: int, memory_fraction: float) -> int:
    """KV pages (per layer, the sink included) for a paged pool: on a GPU, what
    ``memory_fraction`` of the free memory holds, at most ``max_batch`` sequences of
    ``max_seq``; on the CPU, those sequences. ValueError when not even two pages fit."""
    c = model.config
    room = max_batch * pages_for(max_seq, page_size) + 1
    if model.device.type != "cuda":
        return room
    page_bytes = 2 * c.num_layers * page_size * c.num_kv_heads * c.head_dim * model.dtype.itemsize
    free, _ = torch.cuda.mem_get_info(model.device)
    fits = int(free * memory_fraction) // page_bytes
    if fits < 2:
        raise ValueError(f"{free / 2**30:.2f} GiB free x memory_fraction {memory_fraction} holds no KV page of "
                         f"{page_bytes / 2**20:.1f} MiB; free GPU memory or pass num_pages")
    return min(fits, room)
