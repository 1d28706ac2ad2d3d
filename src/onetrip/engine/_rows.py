"""The per-row state of the Scheduler's decode step (``scheduler.py``): device buffers and
their host mirror, written from the requests' state and uploaded a run of changed rows at a
time."""

from __future__ import annotations

import itertools
from typing import Optional

import numpy as np
import torch

from ..models.paged import SINK
from ._requests import Request
from .sampling import RowParams


class Rows:
    """The per-row state a decode step reads, (rows,) each but the table, on the device and
    as a host mirror (page-locked on a GPU, so uploads are asynchronous).

    table (rows, max_blocks) int32; lens int32 (tokens in the cache); tok (rows, 1) int64
    (the next input); active int32 (1 for a real row: lens += active); the sampling rows
    (``RowParams``). Rows 0..max_batch-1 decode; rows max_batch..2 * max_batch - 1 hold a
    step's prefill block (its tables and sampling params).

    ``dirty`` rows are rewritten whole from their request; ``grown`` rows only took pages, so
    only their table row is written and uploaded.

    Host only (numpy, never uploaded; they let the step's checks run as array ops):
    ``limit`` int64, the row's max_tokens; ``cap`` int64, the positions its pages hold."""

    def __init__(self, max_batch: int, max_blocks: int, device: torch.device):
        rows, pin = 2 * max_batch, device.type == "cuda"
        self.max_batch = max_batch

        def make(dev, pin_memory):
            return dict(table=torch.full((rows, max_blocks), SINK, dtype=torch.int32, device=dev,
                                         pin_memory=pin_memory),
                        lens=torch.zeros(rows, dtype=torch.int32, device=dev, pin_memory=pin_memory),
                        tok=torch.zeros(rows, 1, dtype=torch.int64, device=dev, pin_memory=pin_memory),
                        active=torch.zeros(rows, dtype=torch.int32, device=dev, pin_memory=pin_memory))

        self.dev = make(device, False)
        self.host = make("cpu", pin)
        self.sampling = RowParams.empty(rows, device)
        host_sampling = RowParams.empty(rows, "cpu", pin=pin)
        names = ("inv_temperature", "top_k", "top_p", "log_min_p", "seed_key", "step")
        self.dev.update(zip(names, self.sampling.tensors()))
        self.host.update(zip(names, host_sampling.tensors()))
        self.np = {name: t.numpy() for name, t in self.host.items()}  # fast element writes
        self.limit = np.zeros(rows, dtype=np.int64)
        self.cap = np.zeros(rows, dtype=np.int64)
        self.dirty: set[int] = set()
        self.grown: set[int] = set()  # decode rows whose table alone changed (they took a page)
        self.copied: Optional[torch.cuda.Event] = None  # the last upload's end (GPU)

    def write(self, running: list[Request], block: list[Request], page_size: int) -> None:
        """The dirty rows of the host mirror from the requests' state: row i < max_batch from
        ``running[i]``, row max_batch + j from ``block[j]`` (the prefill block), padding past them."""
        h, mb = self.writable(), self.max_batch
        self.grown -= self.dirty
        for i in self.grown:  # the table row alone: steady decode's one change a step (~1 row at 64 rows)
            req = running[i]
            n = len(req.pages)
            self.cap[i] = n * page_size
            h["table"][i, :n] = req.pages
        for i in self.dirty:
            is_block = i >= mb
            rows, j = (block, i - mb) if is_block else (running, i)
            req = rows[j] if j < len(rows) else None
            if req is None:  # padding: the sink page, a greedy row that does not grow
                h["table"][i] = SINK
                h["lens"][i] = h["tok"][i, 0] = h["active"][i] = 0
                values, step = (0.0, 0, 1.0, float("-inf"), 0), 0
                self.limit[i] = self.cap[i] = 0
            else:
                n = len(req.pages)
                self.limit[i], self.cap[i] = req.params.max_tokens, n * page_size
                h["table"][i, :n] = req.pages
                h["table"][i, n:] = SINK
                values = req.row_values
                if is_block:  # the prefill forward takes its start and tokens as arguments
                    h["lens"][i] = h["tok"][i, 0] = h["active"][i] = 0
                    step = len(req.tokens)
                elif req.first_pending:  # its first token comes from the prefill's sample, on the device
                    h["lens"][i], h["tok"][i, 0], h["active"][i] = len(req.context), 0, 1
                    step = len(req.tokens) + 1
                else:
                    h["lens"][i], h["tok"][i, 0], h["active"][i] = len(req.prompt) + len(req.tokens) - 1, \
                        req.tokens[-1], 1
                    step = len(req.tokens)
            for name, v in zip(("inv_temperature", "top_k", "top_p", "log_min_p", "seed_key"), values):
                h[name][i] = v
            h["step"][i] = step

    def upload(self) -> None:
        """Copy the dirty rows (runs of consecutive rows) of every buffer to the device, and
        the grown rows' tables: one copy a run instead of ten, each ~8-15 us of an H200
        host's time (cProfile of the 1B's steady decode at 64 rows: ~1 row takes a page a step)."""
        for rows, names in ((self.dirty, self.dev.keys()), (self.grown, ("table",))):
            for _, run in itertools.groupby(enumerate(sorted(rows)), lambda p: p[1] - p[0]):
                run = [r for _, r in run]
                lo, hi = run[0], run[-1] + 1
                for name in names:
                    self.dev[name][lo:hi].copy_(self.host[name][lo:hi], non_blocking=True)
        self.dirty.clear()
        self.grown.clear()
        if self.dev["lens"].is_cuda:
            self.copied = torch.cuda.Event()
            self.copied.record()

    def writable(self) -> dict:
        """The host mirror's numpy views, once the last upload has read them (an asynchronous
        copy reads the page-locked mirror when it runs; the copies sit ahead of the step's
        kernels in the stream, so this wait is short)."""
        if self.copied is not None:
            self.copied.synchronize()
            self.copied = None
        return self.np


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list on ``device``, copied asynchronously from page-locked memory on a GPU
    (the caching host allocator keeps the block until the copy has run)."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
