"""A paged KV cache: one pool of fixed-size pages per layer, shared by the sequences of a
batch through a block table, so a ragged batch holds only the pages its lengths need.

    table = torch.full((batch, max_blocks), SINK, dtype=torch.int32, device=dev)  # static
    caches = [PagedKVCache(pool, 64, kv_heads, head_dim, table, dtype, dev) for _ in layers]
    plan = plan_pages([prompt_len + max_new for prompt_len in lens], page_size=64, num_pages=pool)
    table.copy_(plan.table(batch, max_blocks))    # on the host, before the prefill

Position p of sequence b lives in page ``block_table[b, p // page_size]`` at slot
``p % page_size``:

    block_table  seq 0: [ 1  2  3  0  0 ]      pool  page 0: the sink (no sequence owns it)
                 seq 1: [ 4  0  0  0  0 ]            pages 1-3: seq 0, page 4: seq 1

A contiguous cache of batch x max_seq slots reserves the longest sequence's room for every
sequence; here sequence b takes ceil(n_b / page_size) pages for its n_b = prompt +
max_new_tokens positions. Pages are assigned on the host before the prefill (``plan_pages``);
the decode step only reads the table, so a captured CUDA graph serves any plan written
into the same table tensor in place.

Every table entry a sequence does not own points at page 0, the sink. Writes there come
from positions no real query reads (right padding past a short prompt's end, the rows that
pad a batch up to its bucket), so they need a valid page but no room of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn as nn

SINK = 0  # the page that unowned table entries point at


class PagedKVCache(nn.Module):
    """The paged cache of one layer: pools k and v, each (num_pages, page_size, kv_heads,
    head_dim) in the model dtype, and ``block_table`` (batch, max_blocks) int32 on the same
    device, usually one tensor shared by every layer (the allocator writes it once).

    Holds max_blocks x page_size positions per sequence (``max_seq``); only the pages a
    sequence's table row names are its own (module docstring). The pools start zeroed, so
    even a sink page that nothing wrote holds finite values.
    """

    def __init__(self, num_pages: int, page_size: int, kv_heads: int, head_dim: int, block_table: torch.Tensor,
                 dtype, device):
        super().__init__()
        if block_table.dtype != torch.int32 or block_table.ndim != 2:
            raise ValueError(f"block_table must be a (batch, max_blocks) int32 tensor, "
                             f"got {tuple(block_table.shape)} {block_table.dtype}")
        shape = (num_pages, page_size, kv_heads, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.block_table = block_table

    @property
    def page_size(self) -> int:
        return self.k.shape[1]

    @property
    def batch(self) -> int:
        return self.block_table.shape[0]

    @property
    def max_seq(self) -> int:
        """Positions a sequence can address: max_blocks x page_size."""
        return self.block_table.shape[1] * self.page_size

    def narrow(self, batch: int) -> "PagedKVCache":
        """The first ``batch`` rows of the block table over the same pools (the engine's
        smaller batch buckets run in views, as with ``KVCache.narrow``)."""
        return self.with_table(self.block_table[:batch])

    def with_table(self, block_table: torch.Tensor) -> "PagedKVCache":
        """The same pools read through another (rows, max_blocks) int32 table, e.g. one row
        of it for a single sequence's prefill (the scheduler)."""
        view = PagedKVCache(0, 0, 0, 0, block_table, self.k.dtype, self.k.device)
        view.k, view.v = self.k, self.v
        return view

    def store(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k, v (batch, seq, kv_heads, head_dim) at ``positions`` (batch, seq) int64:
        the page of each position from the table, then an index_put into the pools."""
        pages = self.block_table.long().gather(1, positions // self.page_size)  # (batch, seq)
        slots = positions % self.page_size
        self.k[pages, slots] = k
        self.v[pages, slots] = v

    def contiguous(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every sequence's pages gathered in order: k, v (batch, max_seq, kv_heads, head_dim),
        new tensors. Positions past a sequence's pages come from the sink; a causal mask
        hides them."""
        table = self.block_table.long()
        return self.k[table].flatten(1, 2), self.v[table].flatten(1, 2)


@dataclass(frozen=True)
class PagePlan:
    """The pages of each sequence of one batch: ``pages[b]`` in position order, page ids in
    1..num_pages-1 (page 0 is the sink). ``page_size`` tokens a page."""

    page_size: int
    pages: tuple[tuple[int, ...], ...]

    @property
    def pages_used(self) -> int:
        return sum(len(p) for p in self.pages)

    def table(self, rows: int, max_blocks: int) -> torch.Tensor:
        """The block table (rows, max_blocks) int32 on the CPU: row b lists sequence b's
        pages, then SINK; rows past the plan's sequences (bucket padding) are all SINK."""
        if rows < len(self.pages) or any(len(p) > max_blocks for p in self.pages):
            raise ValueError(f"a table of {rows} rows x {max_blocks} blocks cannot hold this plan of "
                             f"{len(self.pages)} sequences of up to {max(map(len, self.pages))} pages")
        table = torch.full((rows, max_blocks), SINK, dtype=torch.int32)
        for b, pages in enumerate(self.pages):
            table[b, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        return table


def pages_for(tokens: int, page_size: int) -> int:
    """Pages that hold ``tokens`` positions: ceil(tokens / page_size)."""
    return -(-tokens // page_size)


def plan_pages(tokens: Sequence[int], page_size: int, num_pages: int) -> PagePlan:
    """Give sequence b ``pages_for(tokens[b], page_size)`` pages of a pool of ``num_pages``
    (page 0 being the sink, pages 1..num_pages-1 are free), in order: the engine runs one
    batch at a time, so every call starts from an empty pool.

    tokens: positions each sequence will occupy, prompt length + max_new_tokens.
    Raises ValueError when the pool is too small, naming what the batch needs.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if any(n < 0 for n in tokens):
        raise ValueError(f"token counts must be >= 0, got {list(tokens)}")
    counts = [pages_for(n, page_size) for n in tokens]
    free = num_pages - 1
    if sum(counts) > free:
        raise ValueError(f"the batch needs {sum(counts)} pages of {page_size} tokens ({counts} per sequence) but "
                         f"the pool has {free} (num_pages {num_pages}, one is the sink); num_pages >= "
                         f"{sum(counts) + 1} fits it (Engine(..., num_pages=N))")
    pages, nxt = [], 1
    for n in counts:
        pages.append(tuple(range(nxt, nxt + n)))
        nxt += n
    return PagePlan(page_size, tuple(pages))
