"""Continuous batching: requests join and leave a running batch between decode steps, their
KV caches in one paged pool.

    sched = Scheduler(model, max_batch=64, page_size=64, eos_ids=tokenizer.eos_ids)
    sched.add_request("a", prompt_ids, SamplingParams(temperature=0.7, max_tokens=256, seed=1))
    while sched.has_unfinished():
        for out in sched.step():       # RequestOutput: new_token_ids, finished, finish_reason
            ...
    sched.abort("b")                   # between steps: its pages are free at once

One ``step()``:

    1. pages   a running request whose next position starts a page gets one from the pool;
               when the pool is dry the youngest admitted request is preempted: its pages
               go back, it returns to the queue's front with its tokens appended to its
               prompt, and is recomputed later (its output goes on where it stopped).
    2. admit   the queue's head (FIFO) joins the prefilling requests while a table row and
               the pages of its prompt + 1 are free and their next chunks add up to less
               than ``prefill_tokens``.
    3. prefill one ``Model.forward`` over a block table of up to ``max_batch`` rows: the
               oldest prefilling request and the others that fill the budget best
               (``prefill_tokens`` counts rows x the longest chunk), each its next chunk
               of at most ``prefill_chunk`` tokens, right-padded. A request whose prompt
               ends in its chunk draws its first token and takes the next table row.
    4. decode  one step of rows 0..n-1 in bucket ``min(bucket_for(n), max_batch)``; rows past
               n point at the sink page. With ``graphs`` on a GPU this is one CUDA-graph
               replay per (bucket, sampling mode), over static buffers that the host
               rewrites in place between steps.
    5. read    one host read (the new tokens); EOS, stop_token_ids and max_tokens are
               decided on the host; a finished request leaves and the last row moves into
               its place (table row, length, token, sampling row).

Every row samples with its own params (``sampling.sample_rows``): temperature, top_k,
top_p, min_p and seed are per-row tensors, and a row's noise is keyed by its request's seed
and its own token count at batch row 0, so a request draws the same tokens alone, in any
batch and after a preemption. The host keeps a mirror of the row buffers (``_rows.Rows``) and
uploads the rows that changed, asynchronously, before the step that reads them.
"""

from __future__ import annotations

import collections
import itertools
import operator
from typing import Optional, Sequence

import numpy as np
import torch

from ..models.llama import Model
from ..models.paged import PagedKVCache, pages_for
from ._decode_steps import DecodeSteps
from ._prefill import PrefillGraphs
from .budget import pool_pages
from ._requests import RequestOutput, Request, StepOutput, pick_prefill
from ._rows import Rows, to_device
from .generate import bucket_for
from .sampling import ROW_MODES, SamplingParams, row_mode, row_values, sample_rows


class Scheduler:
    """Continuous batching of requests on ``model`` (eager or fused backend; module docstring).

    max_batch: table rows, i.e. requests decoding at once.
    max_seq: prompt + max_tokens allowed per request; default the config's
        max_position_embeddings, capped by the pool (one request must fit the pool).
    page_size: tokens per KV page.
    num_pages: pages per layer, one of them the sink. Default: on a GPU, what
        ``memory_fraction`` of the free memory holds (at most ``max_batch`` sequences of
        the default max_seq); on the CPU, ``max_batch`` sequences of max_seq.
    prefill_chunk: prompt tokens of one request per prefill forward at most; a longer
        prompt goes on chunk by chunk, one chunk a step.
    prefill_tokens: the prefill forward's budget, rows x its longest chunk (padding
        counted): the most tokens one step prefills, bounding how long it stalls the
        running decodes. A request's chunk is at most min(prefill_chunk, prefill_tokens).
    graphs: capture each decode bucket's step in a CUDA graph (GPU only; ignored on the CPU).
    prefill_graphs: a block of fresh prompts of at most 1,024 padded tokens
        is prefilled from a CUDA graph (``engine._prefill``). Default: with ``graphs``. True
        on the CPU runs the same padded forward without graphs.
    eos_ids: the model's end ids; a request stops at them unless ``ignore_eos``.

    Not thread-safe: one thread calls add_request, abort and step.
    """

    def __init__(self, model: Model, *, max_batch: int = 64, max_seq: Optional[int] = None, page_size: int = 64,
                 num_pages: Optional[int] = None, prefill_chunk: int = 512, graphs: bool = True,
                 eos_ids: Sequence[int] = (), memory_fraction: float = 0.9, prefill_tokens: int = 4096,
                 prefill_graphs: Optional[bool] = None):
        if not isinstance(model, Model):
            raise TypeError(f"model must be an onetrip Model, got {type(model).__name__}")
        if model.tp is not None:
            raise ValueError("model is a tensor-parallel shard; the Scheduler samples from full-vocabulary "
                             "logits: give it a model on one device")
        for name, value in (("max_batch", max_batch), ("page_size", page_size), ("prefill_chunk", prefill_chunk),
                            ("prefill_tokens", prefill_tokens), ("max_seq", 1 if max_seq is None else max_seq)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if num_pages is not None and (isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 2):
            raise ValueError(f"num_pages must be an int >= 2 (one page is the sink) or None, got {num_pages!r}")
        if isinstance(memory_fraction, bool) or not isinstance(memory_fraction, (int, float)) \
                or not 0 < memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
        for name, value in (("graphs", graphs), ("prefill_graphs", True if prefill_graphs is None else prefill_graphs)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool{' or None' if name == 'prefill_graphs' else ''}, got {value!r}")
        try:
            self.eos_ids = tuple(operator.index(i) for i in eos_ids)
        except TypeError:
            raise TypeError(f"eos_ids must be a sequence of ints, got {eos_ids!r}") from None
        c, dev = model.config, model.device
        self.model = model
        self.max_batch, self.page_size, self.prefill_chunk = max_batch, page_size, prefill_chunk
        self.prefill_tokens = prefill_tokens
        self._chunk_cap = min(prefill_chunk, prefill_tokens)
        self.graphs = graphs and dev.type == "cuda"
        use = self.graphs if prefill_graphs is None else prefill_graphs
        # each new (rows, length) block is a capture while serving: half the engine's limit keeps them few
        self._prefill_graphs = PrefillGraphs(capture_graphs=self.graphs, max_tokens=1024) if use else None
        if num_pages is None:
            num_pages = pool_pages(model, max_batch, max_seq or c.max_position_embeddings, page_size,
                                   memory_fraction)
        if max_seq is None:
            max_seq = min(c.max_position_embeddings, (num_pages - 1) * page_size)
        elif pages_for(max_seq, page_size) > num_pages - 1:
            raise ValueError(f"max_seq {max_seq} needs {pages_for(max_seq, page_size)} pages of {page_size} tokens "
                             f"but num_pages {num_pages} leaves {num_pages - 1} (one is the sink): one request "
                             f"must fit the pool; raise num_pages or lower max_seq")
        self.max_seq = max_seq
        self._num_pages = num_pages
        # A prefill row's right padding runs up to a chunk past its last real position: the
        # table addresses that far (on the sink); the decode views see max_seq's columns only,
        # so the decode kernels' split heuristic and the eager gather do not grow with the chunk.
        max_blocks = pages_for(max_seq + self._chunk_cap, page_size)
        self._rows = Rows(max_batch, max_blocks, dev)
        table = self._rows.dev["table"]
        self._pools = [PagedKVCache(num_pages, page_size, c.num_kv_heads, c.head_dim, table, model.dtype, dev)
                       for _ in model.layers]
        self._prefill_views: dict[tuple[int, int], list[PagedKVCache]] = {}  # (rows, columns) of the block
        decode_table = table[:, : pages_for(max_seq, page_size)]
        buckets = sorted({min(1 << i, max_batch) for i in range(max_batch.bit_length() + 1)})
        model._rope_for(max_blocks * page_size)  # the rotary tables cover what the table addresses
        # The new tokens: the decode's at [:max_batch], the prefill's first tokens after them.
        self._reads = torch.zeros(2 * max_batch, dtype=torch.int64, device=dev)
        self._steps = DecodeSteps(model, self._rows, self._reads, {
            b: [kv.with_table(decode_table[:b]) for kv in self._pools] for b in buckets}, self.graphs)
        self._free = list(range(num_pages - 1, 0, -1))  # page ids 1.. (0 is the sink); pop() gives 1 first
        self._waiting: collections.deque[Request] = collections.deque()
        self._prefilling: list[Request] = []  # admitted, prompt not all in the cache; admission order
        self._block: list[Request] = []  # the last prefill forward's rows, from table row max_batch
        self._running: list[Request] = []  # index = table row
        self._requests: dict[str, Request] = {}  # every unfinished one
        self._admissions = itertools.count()
        self._modes = [0] * len(ROW_MODES)  # running requests per sampling mode
        self._maybe_stop = np.zeros(c.vocab_size, dtype=bool)  # some request stops at this id
        self.num_preemptions = 0

    # -- the API ---------------------------------------------------------------------------------

    @property
    def total_pages(self) -> int:
        """Pages in the pool, the sink excluded."""
        return self._num_pages - 1

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def num_running(self) -> int:
        """Requests admitted: decoding, or prefilling."""
        return len(self._running) + len(self._prefilling)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        """Queue a request (never blocks). ValueError: an empty prompt, ids outside the
        vocabulary, prompt + params.max_tokens > max_seq, a request_id already unfinished."""
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already queued or running; give each request its own id")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        try:
            prompt = [operator.index(t) for t in prompt_ids]
        except TypeError:
            raise TypeError(f"prompt_ids must be a sequence of int token ids, got {prompt_ids!r:.80}") from None
        if not prompt:
            raise ValueError(f"prompt_ids of request {request_id!r} is empty; give at least one token")
        vocab = self.model.config.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            bad = next(t for t in prompt if not 0 <= t < vocab)
            raise ValueError(f"prompt_ids must lie in [0, {vocab}) (the model's vocab_size), got {bad}")
        if len(prompt) + params.max_tokens > self.max_seq:
            raise ValueError(f"prompt_ids ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds max_seq "
                             f"{self.max_seq}; shorten the prompt or lower max_tokens")
        stop = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_ids))
        req = Request(request_id, prompt, params, frozenset(stop), row_values(params),
                       ROW_MODES.index(row_mode((params,))))
        self._maybe_stop[[i for i in stop if i < vocab]] = True
        self._requests[request_id] = req
        self._waiting.append(req)

    def abort(self, request_id: str, reason: str = "abort") -> Optional[RequestOutput]:
        """Remove a request wherever it is and free its pages now. Returns its final output
        (finished, ``finish_reason=reason``), or None for an unknown or finished id."""
        req = self._requests.get(request_id)
        if req is None:
            return None
        if req in self._waiting:
            self._waiting.remove(req)
        self._release(req)
        del self._requests[request_id]
        req.finish_reason = reason
        return RequestOutput(req.id, len(req.prompt), [], list(req.tokens), True, reason)

    @torch.no_grad()
    def warm_up(self, modes: Sequence[str] = ROW_MODES, progress=None) -> int:
        """Pay first use before serving: two requests through the prefill paths (a short
        whole prompt, and a long one in chunks: Triton's compiles, the short prompt's prefill
        graph), then every decode bucket's CUDA graph for each sampling mode in ``modes``.
        Only while idle (RuntimeError otherwise). ``progress(done, total)`` after each part.
        Returns the decode graphs captured (0 without ``graphs``)."""
        if self._requests:
            raise RuntimeError(f"warm_up runs on an idle scheduler; it has {len(self._requests)} unfinished requests")
        bad = [m for m in modes if m not in ROW_MODES]
        if bad:
            raise ValueError(f"modes must be among {ROW_MODES}, got {bad}")
        shapes = [(b, m) for b in self._steps.views for m in modes] if self.graphs else []
        # prompt + 2 tokens within max_seq (a context under 3 tokens has no prefill to warm)
        top = self.max_seq - 2
        lengths = [min(64, top), min(2 * self._chunk_cap + 1, top)] if top >= 1 else []
        total, done = len(lengths) + len(shapes), 0
        for i, n in enumerate(lengths):
            self.add_request(f"warm-up-{i}", [0] * n, SamplingParams(max_tokens=2, ignore_eos=True))
            while self.has_unfinished():
                self.step()
            done += 1
            if progress is not None:
                progress(done, total)
        for bucket, mode in shapes:
            self._steps.get(bucket, mode)
            done += 1
            if progress is not None:
                progress(done, total)
        return len(shapes)

    @torch.no_grad()
    def step(self) -> list[RequestOutput]:
        """One iteration (module docstring): an output for every request that got tokens
        or finished."""
        self._grow()
        self._admit()
        first = self._prefill()      # their first tokens are at _reads[max_batch:]
        batch = list(self._running)  # rows 0..n-1, the joined requests last
        joined = sum(r.row >= 0 for r in first)
        if batch:
            self._decode(len(batch), joined)
        if not batch and not first:
            return []
        values = self._reads[: self.max_batch + len(first) if first else len(batch)].tolist()  # the one host read
        new: dict[Request, list[int]] = {}
        for req, token in zip(first, values[self.max_batch:]):
            req.first_pending = False
            self._take(req, token, new)
        m = len(batch) - joined  # rows m.. are the joined requests
        if batch:  # the mirror follows what the step did on the device
            h, n = self._rows.np, len(batch)
            h["tok"][:n, 0] = values[:n]
            h["lens"][:n] += 1
            h["step"][:n] += 1
            for i in range(m, n):
                self._take(batch[i], values[i], new)
        outs = [StepOutput(r.id, len(r.prompt), toks, r.tokens, r.finish_reason is not None, r.finish_reason)
                for r, toks in new.items()]
        if not m:
            return outs
        # Rows 0..m-1 decoded from their own last token: step counts their tokens after this one.
        for req, token in zip(batch, values[:m]):
            req.tokens.append(token)
        ends = self._maybe_stop[h["tok"][:m, 0]] | (h["step"][:m] >= self._rows.limit[:m])
        for i in np.flatnonzero(ends).tolist():  # candidates: a stop id of some request, or the limit
            req = batch[i]
            if req.tokens[-1] in req.stop_ids:
                self._finish(req, "stop")
            elif len(req.tokens) >= req.params.max_tokens:
                self._finish(req, "length")
        outs += [StepOutput(r.id, len(r.prompt), [t], r.tokens, r.finish_reason is not None, r.finish_reason)
                 for r, t in zip(batch, values[:m])]
        return outs

    # -- pages -----------------------------------------------------------------------------------

    def _grow(self) -> None:
        """A page for every running request whose next decode position starts one."""
        n, h = len(self._running), self._rows.np
        # Candidates: rows whose mirror (lens = next position) reaches past their pages, and
        # the rows rewritten since the last upload, whose mirror is stale.
        rows = np.flatnonzero(h["lens"][:n] >= self._rows.cap[:n]).tolist()
        rows = sorted(set(rows).union(i for i in self._rows.dirty if i < n)) if self._rows.dirty else rows
        for req in [self._running[i] for i in rows]:
            if req.row < 0:  # preempted by an earlier turn of this loop
                continue
            need = pages_for(len(req.prompt) + len(req.tokens), self.page_size)  # positions 0..lens
            while len(req.pages) < need:
                if self._free:
                    req.pages.append(self._free.pop())
                    self._rows.grown.add(req.row)
                    continue
                victim = max([*self._running, *self._prefilling], key=lambda r: r.order)
                self._preempt(victim)
                if victim is req:
                    break

    def _preempt(self, req: Request) -> None:
        """Free its pages; back to the queue's front, to be prefilled again over prompt + tokens."""
        self._release(req)
        self._waiting.appendleft(req)
        self.num_preemptions += 1

    def _release(self, req: Request) -> None:
        """Its pages back to the pool; out of the prefilling requests or its table row."""
        self._free.extend(reversed(req.pages))
        req.pages = []
        req.filled = 0
        if req.row < 0 and req in self._prefilling:
            self._prefilling.remove(req)
        if req.row >= 0:  # the last row moves into its place
            self._modes[req.mode] -= 1
            i, last = req.row, len(self._running) - 1
            moved = self._running.pop()
            if moved is not req:
                self._running[i] = moved
                moved.row = i
            req.row = -1
            self._rows.dirty.update((i, last))

    def _chunk(self, req: Request) -> int:
        """The tokens of ``req``'s next prefill chunk."""
        return min(self._chunk_cap, len(req.context) - req.filled)

    def _admit(self) -> None:
        """FIFO: the queue's head starts prefilling while a table row and the pages of its
        prompt + 1 are free and the prefilling requests' next chunks add up to less than
        ``prefill_tokens`` (pages are not taken for prefills a step cannot run)."""
        pending = sum(map(self._chunk, self._prefilling))
        while self._waiting and pending < self.prefill_tokens \
                and len(self._running) + len(self._prefilling) < self.max_batch:
            req = self._waiting[0]
            need = pages_for(len(req.prompt) + len(req.tokens) + 1, self.page_size)  # the prompt and the first input
            if need > len(self._free):
                return
            self._waiting.popleft()
            req.pages = [self._free.pop() for _ in range(need)]
            req.context = req.prompt + req.tokens
            req.filled = 0
            req.order = next(self._admissions)
            self._prefilling.append(req)
            pending += self._chunk(req)

    # -- the device ------------------------------------------------------------------------------

    def _upload(self) -> None:
        if self._rows.dirty or self._rows.grown:
            self._rows.write(self._running, self._block, self.page_size)
            self._rows.upload()

    def _prefill(self) -> list[Request]:
        """One forward of the ``pick_prefill`` block, right-padded to its longest chunk, in table
        rows max_batch.. (the finishing rows first). Returns the requests whose prompt
        ended in it, in row order, their first tokens drawn into ``_reads[max_batch:]``;
        those that decode on (the first of them) took the last table rows, in that order."""
        block = pick_prefill(self._prefilling, self._chunk, self.prefill_tokens)
        if not block:
            return []
        # 0: its first token, then it decodes on; 1: its first token ends it; 2: no token yet
        block.sort(key=lambda r: 2 if self._chunk(r) < len(r.context) - r.filled
                   else int(len(r.tokens) + 1 >= r.params.max_tokens))
        sizes = [self._chunk(r) for r in block]
        k, width, mb = len(block), max(sizes), self.max_batch
        self._block = block
        self._rows.dirty.update(range(mb, mb + k))
        self._upload()  # the block's tables and sampling rows
        logits = self._block_graph(block, sizes, width) if self._prefill_graphs is not None else None
        if logits is None:
            flat = []  # tokens (k, width), then the starts (k,) and each row's last real index (k,)
            for r, n in zip(block, sizes):
                flat += r.context[r.filled: r.filled + n]
                flat += [0] * (width - n)
            flat += [r.filled for r in block]
            flat += [n - 1 for n in sizes]
            data = to_device(flat, torch.int64, self.model.device)  # one copy
            start, last = data[k * width:].view(2, k)
            self.model.use_caches(self._views(k, self._reach(max(r.filled for r in block) + width)))
            logits = self.model(data[: k * width].view(k, width), start, logits_index=last,
                                starts=[r.filled for r in block])[:, -1]  # (k, vocab); no read of start back
        for r, n in zip(block, sizes):
            r.filled += n
        done = [r for r in block if r.filled == len(r.context)]
        if not done:
            return []
        f = len(done)
        self._reads[mb: mb + f].copy_(sample_rows(logits[:f], self._rows.sampling.rows(mb, mb + f),
                                                  row_mode(r.params for r in done)))
        self._prefilling = [r for r in self._prefilling if r.filled < len(r.context)]
        for r in done:
            if len(r.tokens) + 1 < r.params.max_tokens:  # it decodes on, from this step
                r.row, r.first_pending = len(self._running), True
                self._running.append(r)
                self._modes[r.mode] += 1
                self._rows.dirty.add(r.row)
        return done

    def _reach(self, positions: int) -> int:
        """The table's columns a block addressing ``positions`` reads: a power of two (few view
        sets), at most the table's. The eager backend gathers and masks every column."""
        reach = pages_for(positions, self.page_size)
        return min(1 << (reach - 1).bit_length(), self._rows.dev["table"].shape[1])

    def _block_graph(self, block: list[Request], sizes: list[int], width: int) -> Optional[torch.Tensor]:
        """Logits (k, vocab) of a block of fresh prompts (each whole in its chunk) replayed from
        its (rows, padded length) graph; None for a block that prefills eagerly."""
        if any(r.filled or n != len(r.context) for r, n in zip(block, sizes)):
            return None
        table_positions = self._rows.dev["table"].shape[1] * self.page_size
        length = self._prefill_graphs.length_for(len(block), width, table_positions)
        if length is None:
            return None
        k, cols, mb = len(block), self._reach(length), self.max_batch
        self.model.use_caches(self._views(k, cols))
        key = (cols, self.model.graph_key())
        # the block's rows have length 0 on the device (Rows.write), their padding's table entries the sink
        return self._prefill_graphs.run(self.model, [r.context for r in block], self._rows.dev["lens"][mb: mb + k],
                                        length, key)[:, -1]

    def _views(self, rows: int, cols: int) -> list[PagedKVCache]:
        """The pools through the first ``cols`` columns of table rows max_batch..max_batch+rows-1
        (the prefill block)."""
        views = self._prefill_views.get((rows, cols))
        if views is None:
            table = self._rows.dev["table"][self.max_batch: self.max_batch + rows, :cols]
            views = self._prefill_views[(rows, cols)] = [kv.with_table(table) for kv in self._pools]
        return views

    def _decode(self, n: int, joined: int) -> None:
        """One decode step of rows 0..n-1 (the graph of their bucket and mode on a GPU); the
        last ``joined`` rows feed the first tokens the prefill drew."""
        bucket = min(bucket_for(n), self.max_batch)
        mode = ROW_MODES[max(i for i, k in enumerate(self._modes) if k)]  # the most general in the batch
        run, graph = self._steps.get(bucket, mode)
        self._upload()
        if joined:
            self._rows.dev["tok"][n - joined: n, 0].copy_(self._reads[self.max_batch: self.max_batch + joined])
        if graph is not None:
            graph.replay()
        else:
            run()

    # -- the host --------------------------------------------------------------------------------

    def _take(self, req: Request, token: int, new: dict) -> None:
        """Record one new token of ``req`` and finish it on a stop id or at max_tokens."""
        if req.finish_reason is not None:  # its first token ended it: the decode's is void
            return
        req.tokens.append(token)
        new.setdefault(req, []).append(token)
        if token in req.stop_ids:
            self._finish(req, "stop")
        elif len(req.tokens) >= req.params.max_tokens:
            self._finish(req, "length")

    def _finish(self, req: Request, reason: str) -> None:
        self._release(req)
        del self._requests[req.id]
        req.finish_reason = reason
