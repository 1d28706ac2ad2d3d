"""The Scheduler's decode steps (``scheduler.py``): one eager step a (batch bucket, sampling
mode) over the first rows of the table, and on a GPU its CUDA graph, captured on first use
or ahead of serving (``Scheduler.warm_up``)."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..graphs import capture
from ..models.llama import Model
from ..models.paged import SINK, PagedKVCache
from ._rows import Rows
from .sampling import sample_rows


class DecodeSteps:
    """``get(bucket, mode)``: (the eager step, its graph or None without ``graphs``). A step
    reads the rows' tokens, lengths and sampling rows, writes each row's new token into
    ``reads[:bucket]`` and its ``tok``, and advances ``lens`` by ``active`` and the sampling
    step by one. ``views[bucket]``: the pools through the decode columns of rows 0..bucket-1."""

    def __init__(self, model: Model, rows: Rows, reads: torch.Tensor, views: dict[int, list[PagedKVCache]],
                 graphs: bool):
        self.model, self.rows, self.reads, self.views, self.graphs = model, rows, reads, views, graphs
        self._runs: dict[tuple[int, str], Callable[[], None]] = {}
        self._graphs: dict[tuple, tuple] = {}  # (bucket, mode, model.graph_key()) -> (graph, rotary tables)

    def __len__(self) -> int:
        """Graphs captured."""
        return len(self._graphs)

    def get(self, bucket: int, mode: str) -> tuple[Callable[[], None], Optional[torch.cuda.CUDAGraph]]:
        run = self._runs.get((bucket, mode))
        if run is None:
            run = self._runs[(bucket, mode)] = self._step(bucket, mode)
        if not self.graphs:
            return run, None
        # keyed by what the captured forward reads too; the entry keeps the rotary tables alive
        key = (bucket, mode, self.model.graph_key())
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = (self._capture(run, bucket), self.model.rope_tables)
        return run, entry[0]

    def _step(self, bucket: int, mode: str) -> Callable[[], None]:
        d = self.rows.dev
        tok, lens, active, reads = d["tok"][:bucket], d["lens"][:bucket], d["active"][:bucket], self.reads[:bucket]
        rows, views, model = self.rows.sampling.rows(0, bucket), self.views[bucket], self.model

        def run() -> None:
            model.use_caches(views)
            logits = model(tok, lens)[:, -1]  # (bucket, vocab)
            nxt = sample_rows(logits, rows, mode)
            reads.copy_(nxt)
            tok[:, 0].copy_(nxt)
            lens.add_(active)
            rows.step.add_(1)

        return run

    def _capture(self, run: Callable[[], None], bucket: int) -> torch.cuda.CUDAGraph:
        """Capture ``run``; the warm-up and capture run real steps, so they run on sink rows
        that do not grow, and every row of the bucket is rewritten from the host after."""
        d = self.rows.dev
        d["table"][:bucket].fill_(SINK)
        d["lens"][:bucket].zero_()
        d["active"][:bucket].zero_()
        graph, _ = capture(run, warmup=2)
        self.rows.dirty.update(range(bucket))
        return graph
