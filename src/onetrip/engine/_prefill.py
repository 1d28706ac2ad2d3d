"""A prompt's prefill replayed from a CUDA graph: one graph a (batch bucket, padded length).

An eager prefill pays the host cost of every op call (~25-70 us each on an H200 host, ~10
calls a layer), and up to ~2K tokens the GPU finishes its share sooner than the host issues
it (Llama-3.2-1B on an H200: 2.2 ms of GPU work in a 14 ms eager call at 512 tokens, 7.1 ms
in 13 ms at 2,048). Replayed, the
call costs one launch. What makes it capturable:

- lengths right-padded to a multiple of ``step`` (the graph's static shape): causal attention
  keeps every real token from seeing the padding, the logits are taken at each sequence's
  last real position, and decoding overwrites the padding's cache slots (a paged cache
  points the slots past a sequence's pages at the sink page);
- every sequence starts empty (the engine's prefill), so the forward is told its starts on
  the host (``Model.forward(starts=...)``) and reads nothing back;
- tokens and positions come in through static buffers, copied in before each replay.

Padding costs GPU work (at most ``step - 1`` tokens a sequence), so only calls of at most
``max_tokens`` padded tokens (batch bucket x length) take this path: past that the GPU's
share outgrows the host's. The graphs share one memory pool, captured on one stream (the
allocator reuses a block only on its stream): they replay one at a time, and each keeps its
outputs alive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..graphs import capture
from ._rows import to_device

STEP = 128  # padded lengths are multiples of this: at most 127 padded tokens a sequence
MAX_TOKENS = 2048  # batch bucket x padded length at most (the module docstring's 1B figures); more prefills eagerly


@dataclass
class _Entry:
    tokens: torch.Tensor   # (bucket, length) int64, static
    last: torch.Tensor     # (bucket,) int64: each row's last real position, static
    logits: Optional[torch.Tensor] = None  # (bucket, 1, vocab): the graph's output
    graph: Optional[torch.cuda.CUDAGraph] = None
    rope: Optional[tuple] = None  # the rotary tables the graph reads, kept alive with it


class PrefillGraphs:
    """The graphs of one engine (its caches, its model). ``capture=False`` runs the same
    padded forward from the same static buffers without a graph (the CPU's tests)."""

    def __init__(self, *, capture_graphs: bool, step: int = STEP, max_tokens: int = MAX_TOKENS):
        self.capture_graphs = capture_graphs
        self.step, self.max_tokens = step, max_tokens
        self.pool = torch.cuda.graph_pool_handle() if capture_graphs else None
        self.stream = torch.cuda.Stream() if capture_graphs else None  # every capture on it: the pool's blocks reused
        self._entries: dict[tuple, _Entry] = {}

    def length_for(self, bucket: int, width: int, max_len: int) -> Optional[int]:
        """The padded length a prefill of ``bucket`` rows, the longest ``width`` tokens,
        runs at, or None when it takes the eager path (too many tokens, or past ``max_len``:
        the cache's positions, or a forward's most tokens a row)."""
        length = -(-width // self.step) * self.step
        if bucket * length > self.max_tokens or length > max_len:
            return None
        return length

    def run(self, model, rows: Sequence[Sequence[int]], lens: torch.Tensor, length: int, key: tuple) -> torch.Tensor:
        """Logits (bucket, 1, vocab) at each row's last token for ``rows`` (bucket prompts,
        each at most ``length`` tokens) into the model's current caches, whose ``lens`` (bucket,)
        are zero. ``key``: what else the graph depends on (``Model.graph_key()``, the cache views)."""
        bucket = len(rows)
        dev = lens.device
        entry = self._entries.get((bucket, length, key))
        if entry is None:
            entry = _Entry(torch.zeros(bucket, length, dtype=torch.int64, device=dev),
                           torch.zeros(bucket, dtype=torch.int64, device=dev))
            self._entries[(bucket, length, key)] = entry
        flat = []  # per row: the tokens, zeros to the length, then the last real index
        for r in rows:
            flat += r
            flat += [0] * (length - len(r))
            flat.append(len(r) - 1)
        host = to_device(flat, torch.int64, dev).view(bucket, length + 1)  # asynchronous: the replay goes on
        entry.tokens.copy_(host[:, :length])
        entry.last.copy_(host[:, length])

        def forward() -> torch.Tensor:
            return model(entry.tokens, lens, logits_index=entry.last, starts=[0] * bucket)

        if not self.capture_graphs:
            return forward()
        if entry.graph is None:  # the warm-up runs the prefill; the captured call is only recorded
            entry.graph, entry.logits = capture(forward, warmup=1, pool=self.pool, stream=self.stream)
            entry.rope = model.rope_tables
        entry.graph.replay()
        return entry.logits
