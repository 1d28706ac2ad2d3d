"""The decode loop: prefill, then one step per token, each step optionally one CUDA-graph replay.

    engine = Engine(model, max_seq=2048, graphs=True)        # model.backend "eager" or "fused"
    result = engine.generate([[1, 15043, 29892]], max_new_tokens=256,
                             sampling=SamplingParams(temperature=0.7, top_p=0.9, seed=1),
                             eos_ids=(2,), on_token=print)
    result.tokens, result.decode_tok_per_s

A decode step is everything between two tokens, on the device and in place on static
buffers (so it can be captured once and replayed):

    logits = model(tok, lens)[:, -1]                    all layers, final norm, LM head
    nxt    = sample(logits, sampling, step)             greedy / temperature / top-k / top-p
    nxt    = where(done, pad, nxt);  out[:, step] = nxt;  done |= nxt in eos
    tok    = nxt;  lens += 1;  step += 1

The fused backend runs the last two lines (and, greedy, the second stage of the argmax) as
one kernel, ``ops.advance`` (``FusedOptions.advance_kernel``); the eager backend op by op.

With ``graphs=True`` on a GPU that is one ``CUDAGraph.replay()`` per token: one launch
from the host instead of hundreds. One graph is captured per batch-size bucket (powers
of two) and sampling setting; the KV cache is allocated once for the largest bucket and
smaller batches run in views of it. Prompts of different lengths are right-padded to
the longest: causal attention keeps real tokens from seeing the padding, each sequence's
first token is sampled from its own last prompt position, and decoding continues from
its own length, overwriting the padding's cache slots.

With ``paged=True`` the cache is a pool of ``num_pages`` pages of ``page_size`` tokens per
layer (``models.paged``) instead of max_batch x max_seq slots: before each prefill the host
gives every sequence ceil((prompt + max_new_tokens) / page_size) pages and writes the block
table in place, so the captured step (which only reads the table) serves every batch,
and a ragged batch holds the pages its lengths need, not the longest one's for each.

A tensor-parallel shard (``models.tp``) runs the same loop on every rank: its logits are
the rank's vocabulary rows, ``sampling.sample_tp`` draws the same token on every rank from
them, and the ranks stop at the same step (the same tokens, the same done flags). The
captured graph holds the step's collectives.

The host reads the device only to stop early: every ``check_every`` steps it looks at
whether every sequence has produced an EOS (each step when a streaming callback wants
the tokens as they come).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from ..graphs import capture
from ..models.layers import KVCache
from ..models.llama import Model
from ..models.paged import SINK, PagedKVCache, PagePlan, pages_for, plan_pages
from ..ops.advance import advance_greedy, advance_ref, advance_tokens
from ._prefill import PrefillGraphs
from .sampling import SamplingParams, sample, sample_tp


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two generations share (where greedy runs first differ)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class GenerationResult:
    """What ``Engine.generate`` produced and how long it took.

    tokens: the new tokens of each sequence, up to and including its first EOS.
    prefill_ms: prompt forward(s) and the first token's sampling, synchronised at both ends.
    decode_ms: the decode steps (every token after the first), synchronised at both ends.
    decode_steps: decode steps run (the batch runs in lock step; finished sequences idle).
    """

    tokens: list[list[int]]
    prompt_lens: list[int]
    prefill_ms: float
    decode_ms: float
    decode_steps: int
    batch_bucket: int
    graphs: bool

    @property
    def ms_per_step(self) -> float:
        return self.decode_ms / max(self.decode_steps, 1)

    @property
    def decode_tok_per_s(self) -> float:
        """Tokens produced per second by the decode steps, all sequences together."""
        return len(self.tokens) * self.decode_steps / (self.decode_ms / 1e3) if self.decode_ms > 0 else 0.0


def bucket_for(batch: int) -> int:
    """The batch-size bucket (a power of two >= batch) whose graph and cache view run it."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    return 1 << (batch - 1).bit_length()


@dataclass
class _Slot:
    """Static buffers (and the captured graph) of one batch bucket and sampling setting."""

    caches: list             # KVCache or PagedKVCache per layer: views for this bucket
    tok: torch.Tensor        # (bucket, 1) int64: the token each sequence feeds next
    lens: torch.Tensor       # (bucket,) int32: tokens in the cache per sequence
    step: torch.Tensor       # () int64: decode step counter (the sampler's RNG counter)
    done: torch.Tensor       # (bucket,) bool: sequence has produced an EOS
    out: torch.Tensor        # (bucket, max_seq) int64: sampled tokens by step
    eos: torch.Tensor        # (n_eos,) int64, or (1,) of -1 when there is none
    graph: Optional[torch.cuda.CUDAGraph] = None
    graph_key: Optional[tuple] = field(default=None)
    rope: Optional[tuple] = None  # the rotary tables the graph reads, kept alive with it


class Engine:
    """Generation with a ``Model`` (either backend) and a static KV cache of ``max_seq``
    positions for up to ``max_batch`` sequences.

    graphs: capture the decode step in a CUDA graph (GPU only; ignored on the CPU).
    prefill_tokens: the most prompt tokens one prefill forward holds, over the batch
        bucket (bucket x chunk): its activations' bound. A row's chunk is
        ``prefill_tokens // bucket`` tokens; longer prompts prefill chunk by chunk. 32,768:
        512 a row at batch 64 (bench serve's static batches of 64-511-token prompts in one
        forward), 32,768 at batch 1; ~4 GB of activations for Llama-3.1-8B.
    prefill_chunk: a fixed chunk a row instead (tokens), whatever the bucket.
    check_every: decode steps between two host reads of the "all done" flag.
    paged: a paged KV cache (module docstring) instead of a contiguous one (the default).
    prefill_graphs: replay short prefills (at most ``_prefill.MAX_TOKENS`` padded tokens)
        from CUDA graphs, one a batch bucket and length padded to a multiple of 128
        (``engine._prefill``). Default: with ``graphs``, but not for a tensor-parallel
        shard. True on the CPU runs the same padded prefill without graphs.
    page_size: tokens per page when paged (default 64).
    num_pages: pages in each layer's pool when paged, one of them the sink that unowned
        table entries point at. Default: max_batch x ceil(max_seq / page_size) + 1, room
        for any batch the contiguous cache takes; less bounds the cache's memory, and a
        batch whose pages do not fit is refused with a ValueError.

    After a paged ``generate``, ``plan`` is the ``PagePlan`` its sequences ran on. The fused
    backend's variants, the step's ``advance_kernel`` among them, are ``model.fused_options``.
    """

    def __init__(self, model: Model, *, max_seq: int = 2048, max_batch: int = 1, graphs: bool = True,
                 prefill_chunk: Optional[int] = None, check_every: int = 16, paged: bool = False,
                 page_size: Optional[int] = None, num_pages: Optional[int] = None,
                 prefill_graphs: Optional[bool] = None, prefill_tokens: int = 32768):
        for name, value in (("max_seq", max_seq), ("max_batch", max_batch), ("prefill_tokens", prefill_tokens),
                            ("prefill_chunk", 1 if prefill_chunk is None else prefill_chunk),
                            ("check_every", check_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.model = model
        self.max_seq = max_seq
        self.max_batch = bucket_for(max_batch)
        self.graphs = bool(graphs) and model.device.type == "cuda"
        if prefill_graphs is not None and not isinstance(prefill_graphs, bool):
            raise TypeError(f"prefill_graphs must be a bool or None, got {prefill_graphs!r}")
        if prefill_graphs is None:  # tensor-parallel prefills stay eager: their collectives are sized for decode
            prefill_graphs = self.graphs and model.tp is None
        self._prefill = PrefillGraphs(capture_graphs=self.graphs) if prefill_graphs else None
        self.prefill_chunk, self.prefill_tokens = prefill_chunk, prefill_tokens
        self.check_every = check_every
        self.paged, self.page_size, self.num_pages = self._paging(paged, page_size, num_pages)
        self.plan: Optional[PagePlan] = None
        self._full: Optional[list] = None             # KVCache or PagedKVCache per layer
        self._table: Optional[torch.Tensor] = None    # paged: (max_batch, max_blocks) int32
        self._slots: dict[int, _Slot] = {}

    def _paging(self, paged: bool, page_size: Optional[int], num_pages: Optional[int]):
        """Checked (paged, page_size, num_pages); the sizes are None for a contiguous cache."""
        if not isinstance(paged, bool):
            raise TypeError(f"paged must be a bool (True for a paged KV cache), got {paged!r}")
        if not paged:
            for name, value in (("page_size", page_size), ("num_pages", num_pages)):
                if value is not None:
                    raise ValueError(f"{name}={value!r} applies to a paged KV cache; pass paged=True with it")
            return False, None, None
        page_size = 64 if page_size is None else page_size
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be an int >= 1 (tokens per page), got {page_size!r}")
        if num_pages is None:
            num_pages = self.max_batch * pages_for(self.max_seq, page_size) + 1
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 2:
            raise ValueError(f"num_pages must be an int >= 2 (one page is the sink), got {num_pages!r}")
        return True, page_size, num_pages

    # -- buffers -------------------------------------------------------------------------------

    def _slot(self, bucket: int, eos_ids: Sequence[int]) -> _Slot:
        model, dev = self.model, self.model.device
        if self._full is None:  # one cache for the largest bucket; smaller ones are views
            c = model.config
            heads = (c.num_kv_heads, c.head_dim)
            positions = self.max_seq
            if self.paged:
                # One table for every layer and bucket: the engine runs one batch at a time.
                max_blocks = pages_for(self.max_seq, self.page_size)
                positions = max_blocks * self.page_size  # the rotary tables cover what the table addresses
                self._table = torch.full((self.max_batch, max_blocks), SINK, dtype=torch.int32, device=dev)
                self._full = [PagedKVCache(self.num_pages, self.page_size, *heads, self._table, model.dtype, dev)
                              for _ in model.layers]
            else:
                self._full = [KVCache(self.max_batch, self.max_seq, *heads, model.dtype, dev) for _ in model.layers]
            model._rope_for(positions)
        slot = self._slots.get(bucket)
        if slot is None:
            slot = _Slot(caches=[kv.narrow(bucket) for kv in self._full],
                         tok=torch.zeros(bucket, 1, dtype=torch.int64, device=dev),
                         lens=torch.zeros(bucket, dtype=torch.int32, device=dev),
                         step=torch.zeros((), dtype=torch.int64, device=dev),
                         done=torch.zeros(bucket, dtype=torch.bool, device=dev),
                         out=torch.zeros(bucket, self.max_seq, dtype=torch.int64, device=dev),
                         eos=torch.full((1,), -1, dtype=torch.int64, device=dev))
            self._slots[bucket] = slot
        eos = torch.tensor(list(eos_ids) or [-1], dtype=torch.int64, device=dev)
        if eos.shape != slot.eos.shape or not torch.equal(eos, slot.eos):
            slot.eos = eos
            slot.graph = None  # the graph captured the old tensor
        model.use_caches(slot.caches)
        return slot

    # -- the step ------------------------------------------------------------------------------

    def _advance(self, slot: _Slot, logits: torch.Tensor, sampling: SamplingParams,
                 lens: Optional[torch.Tensor] = None) -> None:
        """Sample from logits (bucket, vocab), record the token, feed it next, and add one to
        ``lens`` when given: in place. The fused backend does the bookkeeping in one launch
        (``ops.advance``; greedy, with the argmax's second stage) unless its
        ``FusedOptions.advance_kernel`` is off; the eager one op by op."""
        state = (slot.done, slot.eos, slot.out, slot.tok, slot.step, lens)
        tp = self.model.tp
        if tp is not None:  # logits: this rank's vocabulary rows; every rank draws the same tokens
            nxt = sample_tp(logits, sampling, slot.step, tp, tp.vocab_range(self.model.config.vocab_size)[0])
            fused = self.model.backend == "fused" and self.model.fused_options.advance_kernel
            (advance_tokens if fused else advance_ref)(nxt, *state)
        elif self.model.backend != "fused" or not self.model.fused_options.advance_kernel:
            advance_ref(sample(logits, sampling, slot.step), *state)
        elif sampling.greedy:
            advance_greedy(logits, *state)
        else:
            advance_tokens(sample(logits, sampling, slot.step), *state)

    def _decode_step(self, slot: _Slot, sampling: SamplingParams) -> None:
        logits = self.model(slot.tok, slot.lens)[:, -1]  # (bucket, vocab)
        self._advance(slot, logits, sampling, slot.lens)

    def _replay_or_run(self, slot: _Slot, sampling: SamplingParams) -> None:
        if not self.graphs:
            self._decode_step(slot, sampling)
            return
        # The sampler's part of the params only: a new max_tokens or stop list reuses the graph.
        key = (sampling.sampler_key(), self.model.graph_key())
        if slot.graph is None or slot.graph_key != key:
            slot.graph = self._capture(slot, sampling)
            slot.graph_key, slot.rope = key, self.model.rope_tables  # the tables stay where the graph reads them
        slot.graph.replay()

    def _capture(self, slot: _Slot, sampling: SamplingParams) -> torch.cuda.CUDAGraph:
        """Warm the step up on a side stream (kernels compile outside the capture), then
        capture one. The warm-up and capture run real steps on the slot's buffers, so the
        state is saved first and restored after."""
        saved = [t.clone() for t in (slot.tok, slot.lens, slot.step, slot.done, slot.out)]
        graph, _ = capture(lambda: self._decode_step(slot, sampling), warmup=2)
        for t, s in zip((slot.tok, slot.lens, slot.step, slot.done, slot.out), saved):
            t.copy_(s)
        return graph

    # -- generate ------------------------------------------------------------------------------

    def _prompts(self, prompts) -> list[list[int]]:
        if isinstance(prompts, torch.Tensor):
            if prompts.ndim != 2 or prompts.is_floating_point():
                raise ValueError(f"prompts must be (batch, len) integer ids, got {tuple(prompts.shape)} {prompts.dtype}")
            return prompts.tolist()
        out = [list(map(int, p)) for p in prompts]
        if not out:
            raise ValueError("prompts is empty; give at least one prompt")
        return out

    def _start(self, prompts, max_new_tokens: int, sampling: SamplingParams, eos_ids: Sequence[int]):
        """Check the request, pick the bucket, prefill and sample the first token.
        Returns (slot, prompt rows, prompt lengths)."""
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        rows = self._prompts(prompts)
        lens = [len(p) for p in rows]
        if min(lens) < 1:
            raise ValueError(f"every prompt needs at least one token; got lengths {lens}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        if max(lens) + max_new_tokens > self.max_seq:
            raise ValueError(f"the longest prompt ({max(lens)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                             f"the engine's max_seq {self.max_seq}; build the Engine with a larger max_seq")
        if len(rows) > self.max_batch:
            raise ValueError(f"{len(rows)} prompts exceed the engine's max_batch {self.max_batch}")
        vocab = self.model.config.vocab_size
        if any(t < 0 or t >= vocab for p in rows for t in p):
            raise ValueError(f"prompt token ids must lie in [0, {vocab}) (the model's vocab_size)")
        bucket = bucket_for(len(rows))
        if self.paged:  # before anything is allocated or written: a pool too small refuses here
            plan = plan_pages([n + max_new_tokens for n in lens], self.page_size, self.num_pages)
        slot = self._slot(bucket, eos_ids)
        dev = self.model.device
        if self.paged:
            # In place: a captured step reads this tensor. Rows of the bucket's padding stay
            # on the sink (their writes land there; nothing real reads them).
            self._table[:bucket].copy_(plan.table(bucket, self._table.shape[1]))
            self.plan = plan

        # Prefill: right-padded prompts (padding rows for the bucket repeat the first prompt).
        padded = rows + [rows[0]] * (bucket - len(rows))
        p_lens = lens + [lens[0]] * (bucket - len(rows))
        width = max(p_lens)
        slot.lens.zero_()
        slot.step.zero_()
        slot.done.zero_()
        # the padded length within the cache and the chunk (which bounds one forward's activations)
        cap = min(self.max_seq, self._chunk(bucket))
        length = None if self._prefill is None else self._prefill.length_for(bucket, width, cap)
        if length is not None:
            logits = self._prefill.run(self.model, padded, slot.lens, length, self.model.graph_key())
        else:
            logits = self._prefill_eager(slot, padded, p_lens)
        slot.lens.copy_(torch.tensor(p_lens, dtype=torch.int32, device=dev))
        self._advance(slot, logits[:, -1], sampling)
        return slot, rows, lens

    def _chunk(self, bucket: int) -> int:
        """Prompt tokens of one row per prefill forward."""
        return self.prefill_chunk if self.prefill_chunk is not None else max(1, self.prefill_tokens // bucket)

    def _prefill_eager(self, slot: _Slot, padded: list[list[int]], p_lens: list[int]) -> torch.Tensor:
        """Logits (bucket, 1, vocab) at each row's last prompt token: the right-padded prompts in
        chunks (``_chunk``), every row starting at the chunk's start (told to the forward on
        the host, so it reads nothing back)."""
        dev, width, chunk = self.model.device, max(p_lens), self._chunk(len(padded))
        tokens = torch.tensor([p + [0] * (width - len(p)) for p in padded], dtype=torch.int64, device=dev)
        last = torch.tensor(p_lens, dtype=torch.int64, device=dev) - 1
        logits = None
        for lo in range(0, width, chunk):
            hi = min(lo + chunk, width)
            inside = (last >= lo) & (last < hi)  # sequences whose last prompt token is in this chunk
            chunk_logits = self.model(tokens[:, lo:hi], slot.lens, logits_index=(last - lo).clamp(0, hi - lo - 1),
                                      starts=[lo] * len(padded))
            logits = chunk_logits if logits is None else torch.where(inside[:, None, None], chunk_logits, logits)
            slot.lens += hi - lo
        return logits

    @torch.no_grad()
    def stepper(self, prompts, max_steps: int, *, sampling: SamplingParams = SamplingParams()) -> Callable[[], None]:
        """Prefill ``prompts`` and return a function that runs one decode step per call (a
        graph replay when ``graphs``), for profilers and benchmarks; at most ``max_steps``
        calls (the cache has room for that many), EOS ignored."""
        slot, _, _ = self._start(prompts, max_steps + 1, sampling, ())
        calls = [0]

        @torch.no_grad()
        def step() -> None:
            if calls[0] >= max_steps:
                raise RuntimeError(f"this stepper was built for {max_steps} steps; build another")
            calls[0] += 1
            self._replay_or_run(slot, sampling)

        return step

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens: int, *, sampling: SamplingParams = SamplingParams(),
                 eos_ids: Sequence[int] = (), on_token: Optional[Callable[[int, list[int]], None]] = None,
                 on_step: Optional[Callable[[int], None]] = None) -> GenerationResult:
        """Generate up to ``max_new_tokens`` per prompt.

        prompts: a (batch, len) integer tensor or a list of token-id lists (lengths may differ).
        sampling: greedy by default (``SamplingParams``).
        eos_ids: stop a sequence at any of these tokens (it is included in the output).
        on_token(step, tokens): called after each step with that step's token of every
            sequence (forces a host read per step). on_step(steps_done): called for progress
            every ``check_every`` steps, without a per-step read.
        """
        sync = torch.cuda.synchronize if self.model.device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        slot, rows, lens = self._start(prompts, max_new_tokens, sampling, eos_ids)
        sync()
        t1 = time.perf_counter()
        if on_token is not None:
            on_token(0, slot.out[: len(rows), 0].tolist())

        steps = 0
        finished = bool(slot.done[: len(rows)].all())  # prefill synchronised already
        for i in range(1, 1 if finished else max_new_tokens):
            self._replay_or_run(slot, sampling)
            steps += 1
            if on_token is not None:
                on_token(i, slot.out[: len(rows), i].tolist())
            if (i % self.check_every == 0 or on_token is not None) and bool(slot.done[: len(rows)].all()):
                break
            if on_step is not None and i % self.check_every == 0:
                on_step(i)
        sync()
        t2 = time.perf_counter()

        produced = slot.out[: len(rows), : steps + 1].tolist()
        eos = set(eos_ids)
        result = []
        for seq in produced:
            cut = next((j + 1 for j, t in enumerate(seq) if t in eos), len(seq))
            result.append(seq[:cut])
        return GenerationResult(result, lens, (t1 - t0) * 1e3, (t2 - t1) * 1e3, steps, slot.tok.shape[0], self.graphs)
