"""Token sampling that a CUDA graph can capture: greedy, temperature, top-k, top-p, min-p.

    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=1234)
    step = torch.zeros((), dtype=torch.int64, device="cuda")  # the engine bumps it in-graph
    tokens = sample(logits, params, step)                     # (batch,) int64, no host sync
    tokens = sample_tp(local_logits, params, step, tp, start) # the same, the vocabulary split over ranks
    tokens = sample_rows(logits, rows, mode)                  # per-row params as tensors (the scheduler)

Order of the warps, as in Hugging Face's generate: divide by the temperature (a multiply by
1 / temperature computed on the host, so the scalar and the per-row samplers temper to the
same bits on any device: torch's CUDA division by a Python scalar is such a multiply, its
CPU one a true division), keep the ``top_k`` largest logits, then keep the nucleus (the
smallest set of most likely tokens whose probability reaches ``top_p``), then drop tokens
whose probability is below ``min_p`` times the largest one's, then draw from what is left. The min-p test is
p_i < min_p * p_max, i.e. x_i < x_max + log(min_p) on the tempered logits: no softmax.

Why a hash instead of ``torch.multinomial`` / torch's generators:
  * reproducibility: a generator is global state. Under graph capture PyTorch advances its
    Philox offset on every replay, so a token would depend on everything that drew random
    numbers before it (warm-up, the capture itself, other batch buckets, other requests).
    Here the randomness is a pure function of ``(seed, step, row, vocab id)`` computed with
    integer tensor ops: eager, compiled and replayed runs draw the same numbers, a row's
    draw does not depend on the batch around it, and there is no state to save.
  * static shapes: a Gumbel-max draw is an elementwise add and an ``argmax``.
  * noise is keyed by the vocab id, not by the position among the candidates, so a token's
    noise does not change with ``top_k``/``top_p``: tightening the filter only removes
    candidates, it never reshuffles the draw among the ones that stay.

Gumbel-max: with g_i = -log(-log(u_i)), u_i ~ U(0, 1) independent,
argmax_i (x_i + g_i) is distributed as softmax(x) (the exponential race argmax p_i / E_i
with E_i = -log u_i is the same draw written in probability space).

Cost: the hash is ~30 elementwise int64 ops over (batch, candidates). With ``top_k`` the
candidates are k wide and it is negligible; over a full 128k vocab in eager mode it is ~30
small launches, which ``torch.compile`` fuses into one kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..ops.argmax import argmax, tile_keys

_MASK32 = 0xFFFFFFFF
_UNIFORM_BITS = 23  # (k + 0.5) / 2**23 is exact in float32, so u stays strictly inside (0, 1)


@dataclass(frozen=True)
class SamplingParams:
    """How to turn logits into tokens, and when a request stops. Frozen and hashable.

    temperature     0 means greedy (argmax); otherwise logits are divided by it.
    top_k           keep the k largest logits; 0 turns the filter off.
    top_p           keep the smallest set of most likely tokens whose probability reaches
                    top_p (at least one token); 1.0 turns the filter off.
    seed            any Python int; with the step and batch row it fixes every draw.
    min_p           drop tokens whose probability is below min_p x the largest; in [0, 1], 0 = off.
    max_tokens      new tokens at most (>= 1); ``Engine.generate`` takes its own max_new_tokens.
    stop            stop strings (a str or a list is kept as a tuple); the text layer
                    (``llm.LLM``, the server) cuts the text before the first one.
    stop_token_ids  stop at any of these ids (the id is part of the output, like EOS).
    ignore_eos      keep going past the model's EOS ids.

    ``sampler_key()`` is the part a captured sampling step depends on.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    min_p: float = 0.0
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0 (0 = greedy), "
                             f"got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) \
                or not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"SamplingParams.seed must be an int, got {self.seed!r}")
        if isinstance(self.min_p, bool) or not isinstance(self.min_p, (int, float)) or not 0 <= self.min_p <= 1:
            raise ValueError(f"SamplingParams.min_p must be in [0, 1] (0 = off), got {self.min_p!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be an int >= 1, got {self.max_tokens!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise TypeError(f"SamplingParams.stop must be a non-empty str or a list of them, got {self.stop!r}")
        ids = self.stop_token_ids
        if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                         for i in ids):
            raise TypeError(f"SamplingParams.stop_token_ids must be a list of ints >= 0, got {ids!r}")
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"SamplingParams.ignore_eos must be a bool, got {self.ignore_eos!r}")
        object.__setattr__(self, "stop", tuple(stop))  # hashable whatever was given
        object.__setattr__(self, "stop_token_ids", tuple(ids))

    @property
    def greedy(self) -> bool:
        """True when the draw is an argmax (temperature 0, or top_k 1 at any temperature)."""
        return self.temperature == 0 or self.top_k == 1

    def sampler_key(self) -> tuple:
        """(temperature, top_k, top_p, min_p, seed): what ``sample`` branches on, so what a
        captured step depends on; max_tokens and the stops are the host's business."""
        return (self.temperature, self.top_k, self.top_p, self.min_p, self.seed)


# ---- counter-based random numbers ------------------------------------------------------------

def _mul32(x, c: int):
    """(x * c) mod 2**32 for x in [0, 2**32) held in int64 (tensor or Python int).

    A constant above 2**31 is split in 16-bit halves so no product leaves int64's range:
    signed overflow is not something to lean on across backends.
    """
    if c < 2**31:
        return (x * c) & _MASK32
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _MASK32


def _mix32(x):
    """A bijective 32-bit finalizer (xorshift-multiply, the "lowbias32" constants published
    by C. Wellons' hash-prospector): each input bit flips each output bit with probability
    close to 1/2. Works on int64 tensors holding values in [0, 2**32) and on Python ints."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def seed_key(seed: int) -> int:
    """A seed (any Python int, folded to 64 bits) mixed into the 32-bit key the noise starts from."""
    seed &= 2**64 - 1
    return _mix32(_mix32(seed & _MASK32) ^ (seed >> 32))


def hash_uniform(seed: int, step: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Uniform numbers in (0, 1) from a hash of (seed, step, row, col); no generator state.

    Args:
        seed: Python int (any size; folded to 64 bits).
        step: 0-dim integer tensor (taken modulo 2**32).
        rows: integer tensor broadcastable against ``cols``, e.g. (batch, 1): the batch row.
        cols: integer tensor, e.g. (batch, n) vocab ids or (1, vocab): the token id.

    Returns:
        float32 tensor of the broadcast shape, values (k + 0.5) / 2**23 for k in [0, 2**23):
        never 0 or 1, so -log(-log(u)) is always finite.

    The key is mixed in stages: seed (on the host), then step, then row, giving two 32-bit
    keys per row; the column goes through two keyed rounds, mix(mix(col ^ a) ^ b). One round
    would make every row a xor-shifted copy of another row's numbers.
    """
    return keyed_uniform(seed_key(seed), step.to(torch.int64), rows.to(torch.int64), cols)


def keyed_uniform(key, step, rows, cols: torch.Tensor) -> torch.Tensor:
    """``hash_uniform`` from a mixed seed ``key`` (``seed_key(seed)``: a Python int, or an
    int64 tensor of keys, e.g. (batch, 1) for a seed per row); ``step`` and ``rows`` int64
    tensors or Python ints broadcastable against ``cols``."""
    step_key = _mix32((step & _MASK32) ^ key)
    key_a = _mix32(step_key ^ (rows & _MASK32))
    key_b = _mix32(key_a ^ 0x9E3779B9)
    bits = _mix32(_mix32((cols.to(torch.int64) & _MASK32) ^ key_a) ^ key_b)
    return ((bits >> (32 - _UNIFORM_BITS)).to(torch.float32) + 0.5) * (2.0 ** -_UNIFORM_BITS)


def _gumbel(u: torch.Tensor) -> torch.Tensor:
    # u in [2**-24, 1 - 2**-24] gives g in about [-2.8, 16.6]: a token 19 nats (prob. ratio
    # 5e-9) below the best can never win, a truncation far below any sampling error that matters.
    return -torch.log(-torch.log(u))


# ---- sampling ---------------------------------------------------------------------------------

def _check(logits: torch.Tensor, step: torch.Tensor) -> None:
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a (batch, vocab) float tensor, got shape {tuple(logits.shape)} "
                         f"dtype {logits.dtype}")
    if not isinstance(step, torch.Tensor) or step.dim() != 0 or step.is_floating_point() \
            or step.dtype == torch.bool:
        raise ValueError(f"step must be a 0-dim integer tensor, got "
                         f"{step if not isinstance(step, torch.Tensor) else (tuple(step.shape), step.dtype)}")
    if step.device != logits.device:
        raise ValueError(f"step must live on the logits' device {logits.device}, got {step.device}")


def _argmax(x: torch.Tensor) -> torch.Tensor:
    """(batch, n) -> (batch,) int64. On a GPU onetrip's split argmax: torch's gives each row
    to one block, 36 us for a 128k-vocab row on an H200, against ~3 us. On the CPU torch's
    (the same indices; the kernel's own tests cover it under the interpreter)."""
    return argmax(x) if x.is_cuda else torch.argmax(x, dim=-1)


def sample(logits: torch.Tensor, params: SamplingParams, step: torch.Tensor) -> torch.Tensor:
    """Draw one token per row.

    Args:
        logits: (batch, vocab), any float dtype; read, never written. The softmax and the
            noise are float32.
        params: SamplingParams; Python branches on it select the path, so one capture
            serves one set of params.
        step: 0-dim integer tensor on the logits' device (the decode step); the engine can
            increment it in place inside the graph.

    Returns:
        (batch,) int64 token ids.

    Graph capture: no host synchronisation and only static shapes (``topk`` with a fixed
    k, a full ``sort`` for top-p, ``argmax``); deterministic for a given (seed, step, row)
    on a given device. Rows with identical logits still draw independently.
    """
    _check(logits, step)
    if params.greedy:
        return _argmax(logits)
    batch, vocab = logits.shape
    x = logits.float() * (1.0 / params.temperature)                  # (batch, vocab) fp32
    if params.top_k:
        x, ids = torch.topk(x, min(params.top_k, vocab), dim=-1)     # (batch, k), descending
    elif params.top_p < 1:
        x, ids = torch.sort(x, dim=-1, descending=True)              # (batch, vocab)
    else:
        x = _min_p(x, x.amax(-1, keepdim=True), params.min_p)
        return _argmax(x + _noise(params, step, batch, torch.arange(vocab, device=x.device).unsqueeze(0)))
    probs = torch.softmax(x, dim=-1) if params.top_p < 1 else None
    return _draw(x, ids, probs, params, step)


def _min_p(x: torch.Tensor, x_max: torch.Tensor, min_p: float) -> torch.Tensor:
    """x (batch, n) with -inf where p < min_p * p_max, i.e. x < x_max + log(min_p); x_max (batch, 1)."""
    return x if min_p == 0 else x.masked_fill(x < x_max + math.log(min_p), float("-inf"))


def _noise(params: SamplingParams, step: torch.Tensor, batch: int, ids: torch.Tensor) -> torch.Tensor:
    """Gumbel noise (batch, n) of vocab ids (batch, n) or (1, n), keyed by (seed, step, row, id)."""
    rows = torch.arange(batch, device=ids.device).unsqueeze(1)       # (batch, 1)
    return _gumbel(hash_uniform(params.seed, step, rows, ids))


def _draw(x: torch.Tensor, ids: torch.Tensor, probs, params: SamplingParams, step: torch.Tensor) -> torch.Tensor:
    """The token drawn from candidates x (batch, n) fp32, sorted descending, of vocab ids
    ``ids`` (batch, n): the nucleus of ``probs`` (their probabilities, None without top_p)
    kept, the min-p cut against the first (largest), then the Gumbel-max draw. Returns
    (batch,) int64 vocab ids."""
    if probs is not None:
        mass_before = torch.cumsum(probs, dim=-1) - probs            # 0 for the first: kept
        x = x.masked_fill(mass_before >= params.top_p, float("-inf"))
    x = _min_p(x, x[:, :1], params.min_p)
    choice = _argmax(x + _noise(params, step, x.shape[0], ids))      # (batch,)
    return ids.gather(-1, choice.unsqueeze(-1)).squeeze(-1)


# ---- over a vocabulary split across tensor-parallel ranks ------------------------------------

# Candidates per rank for top_p without top_k: the nucleus is exact when it holds at most
# this many tokens, otherwise the draw is from the 1024 most likely (their exact probabilities).
TOP_P_CANDIDATES = 1024


def _keys(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered as (value, -id): order32(value) in the high word (a float32's bits
    mapped to an int32 of the same order), 2^31 - 1 - id in the low, so the larger value and
    then the smaller id wins a max; ``ops.argmax``'s tile keys, in torch ops."""
    bits = values.float().contiguous().view(torch.int32)
    order = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    return (order << 32) | (0x7FFFFFFF - ids)


def _unkeys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``_keys`` inverted: (values float32, ids int64), bit for bit."""
    order = (keys >> 32).to(torch.int32)
    return torch.where(order < 0, order ^ 0x7FFFFFFF, order).view(torch.float32), 0x7FFFFFFF - (keys & 0xFFFFFFFF)


def _global_argmax(x: torch.Tensor, vocab_start: int, tp) -> torch.Tensor:
    """The full vocabulary's argmax (first id among ties) from each rank's columns x (batch,
    n) of ids vocab_start + j: each rank's best key per tile (``ops.argmax.tile_keys`` on a
    GPU, one tile of n on the CPU), with its global id, max-reduced over the ranks."""
    if x.is_cuda:
        keys = tile_keys(x) - vocab_start                            # (batch, tiles)
    else:
        ids = vocab_start + torch.arange(x.shape[-1], device=x.device)
        keys = _keys(x, ids.unsqueeze(0)).amax(-1, keepdim=True)     # (batch, 1)
    best = tp.all_reduce(keys, "max").amax(-1)
    return 0x7FFFFFFF - (best & 0xFFFFFFFF)


def sample_tp(local_logits: torch.Tensor, params: SamplingParams, step: torch.Tensor, tp,
              vocab_start: int) -> torch.Tensor:
    """``sample`` over a vocabulary split across the ranks of ``tp`` (``models.tp``), without
    gathering the logits: every rank passes its own columns and gets the same tokens.

    Args:
        local_logits: (batch, n) this rank's logits of vocab ids [vocab_start, vocab_start
            + n) (ids past the vocabulary hold -inf).
        params, step: as for ``sample``.
        tp: the ``TensorParallel`` whose group the ranks share.
        vocab_start: this rank's first vocab id (``tp.vocab_range(vocab)[0]``).

    Returns:
        (batch,) int64 global token ids, equal on every rank and equal to ``sample`` on the
        full logits: the noise is keyed by the vocab id, so each rank adds to its columns
        what ``sample`` adds to them.

    What crosses the ranks: greedy or plain temperature, one max-reduce of a key per row
    (and tile), with min_p one of the largest logit first; top_k, the k best (value, id)
    of each rank, all-gathered, before the usual top-k / top-p / min-p / draw on the
    world x k; top_p alone, the ``TOP_P_CANDIDATES`` best of
    each rank and two reductions (max and sum of exp) that make their probabilities exact.
    Graph capture: collectives on the current stream, static shapes, no host reads.
    """
    _check(local_logits, step)
    if params.greedy:
        return _global_argmax(local_logits, vocab_start, tp)
    batch, n = local_logits.shape
    x = local_logits.float() * (1.0 / params.temperature)            # (batch, n) fp32
    if not params.top_k and params.top_p == 1:
        ids = vocab_start + torch.arange(n, device=x.device).unsqueeze(0)
        if params.min_p:  # the cut is against the largest logit of every rank
            x = _min_p(x, tp.all_reduce(x.amax(-1, keepdim=True), "max"), params.min_p)
        return _global_argmax(x + _noise(params, step, batch, ids), vocab_start, tp)
    k = params.top_k or TOP_P_CANDIDATES
    values, cols = torch.topk(x, min(k, n), dim=-1)                  # (batch, k') this rank's best
    gathered = tp.all_gather(_keys(values, cols + vocab_start))      # (world, batch, k')
    values, ids = _unkeys(gathered.permute(1, 0, 2).reshape(batch, -1))
    values, order = torch.topk(values, min(k, values.shape[-1]), dim=-1)  # the global best k, descending
    ids = ids.gather(-1, order)
    probs = None
    if params.top_p < 1 and params.top_k:
        probs = torch.softmax(values, dim=-1)
    elif params.top_p < 1:  # the full softmax's probabilities: its max and normalizer reduced
        m = tp.all_reduce(x.amax(-1, keepdim=True), "max")
        total = tp.all_reduce(torch.exp(x - m).sum(-1, keepdim=True), "sum")
        probs = torch.exp(values - m) / total
    return _draw(values, ids, probs, params, step)


# ---- rows with params of their own (the scheduler's batch) --------------------------------------

# What a batch's rows need, cheapest first: every row greedy (one argmax); no row filters
# (temperature alone: one noise pass over the vocabulary); some row filters (a full sort).
ROW_MODES = ("greedy", "sample", "filter")


@dataclass
class RowParams:
    """Per-row sampling params as tensors of one device, (rows,) each; a captured step
    reads them, the host writes them in place between steps (``row_values``).

    inv_temperature  float32, 1 / temperature; 0 for a greedy row (top_k 1 included).
    top_k        int64, 0 = off.
    top_p        float32, 1 = off.
    log_min_p    float32, log(min_p); -inf = off.
    seed_key     int64, ``seed_key(seed)``.
    step         int64, the row's own draw counter (its request's tokens so far).
    """

    inv_temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    log_min_p: torch.Tensor
    seed_key: torch.Tensor
    step: torch.Tensor

    @classmethod
    def empty(cls, rows: int, device, pin: bool = False) -> "RowParams":
        """Greedy rows, step 0; ``pin``: in page-locked host memory (a host mirror)."""
        f = dict(dtype=torch.float32, device=device, pin_memory=pin)
        i = dict(dtype=torch.int64, device=device, pin_memory=pin)
        return cls(torch.zeros(rows, **f), torch.zeros(rows, **i), torch.ones(rows, **f),
                   torch.full((rows,), float("-inf"), **f), torch.zeros(rows, **i), torch.zeros(rows, **i))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.inv_temperature, self.top_k, self.top_p, self.log_min_p, self.seed_key, self.step)

    def rows(self, lo: int, hi: int) -> "RowParams":
        """Rows lo..hi-1, views."""
        return RowParams(*(t[lo:hi] for t in self.tensors()))


def row_values(params: SamplingParams) -> tuple[float, int, float, float, int]:
    """(inv_temperature, top_k, top_p, log_min_p, seed_key) of one row, as ``RowParams`` holds them."""
    greedy = params.greedy
    return (0.0 if greedy else 1.0 / params.temperature, params.top_k, float(params.top_p),
            math.log(params.min_p) if params.min_p else float("-inf"), seed_key(params.seed))


def row_mode(params) -> str:
    """The cheapest of ``ROW_MODES`` that serves every SamplingParams in ``params``."""
    mode = "greedy"
    for p in params:
        if p.greedy:
            continue
        if p.top_k or p.top_p < 1 or p.min_p:
            return "filter"
        mode = "sample"
    return mode


def sample_rows(logits: torch.Tensor, rows: RowParams, mode: str) -> torch.Tensor:
    """Draw one token per row, each row with its own params (``RowParams``), in one call
    with static shapes: a captured graph serves any mix of params within ``mode``.

    Args:
        logits: (batch, vocab) float; read only.
        rows: RowParams of ``batch`` rows on the logits' device.
        mode: one of ``ROW_MODES``, at least as general as every row (``row_mode``).

    Returns:
        (batch,) int64. A greedy row is exactly the argmax of its logits. A sampled row
        draws with the noise of ``sample`` at batch row 0, keyed by its own seed and step,
        so its token does not depend on its neighbours or its row: equal to ``sample`` on
        that row alone (with top_k and top_p together, barring the rounding of a softmax
        over k candidates against one over the vocabulary with the rest at -inf).
    """
    if mode not in ROW_MODES:
        raise ValueError(f"mode must be one of {', '.join(ROW_MODES)}, got {mode!r}")
    greedy_pick = _argmax(logits)
    if mode == "greedy":
        return greedy_pick
    batch, vocab = logits.shape
    greedy = rows.inv_temperature == 0                                # (batch,)
    x = logits.float() * torch.where(greedy, 1.0, rows.inv_temperature)[:, None]
    if mode == "sample":
        ids = torch.arange(vocab, device=x.device).unsqueeze(0)       # (1, vocab)
    else:
        x, ids = torch.sort(x, dim=-1, descending=True)               # (batch, vocab)
        k = rows.top_k[:, None]
        x = x.masked_fill((k > 0) & (torch.arange(vocab, device=x.device) >= k), float("-inf"))
        probs = torch.softmax(x, dim=-1)
        top_p = rows.top_p[:, None]
        x = x.masked_fill((top_p < 1) & (torch.cumsum(probs, dim=-1) - probs >= top_p), float("-inf"))
        x = x.masked_fill(x < x[:, :1] + rows.log_min_p[:, None], float("-inf"))
    noise = _gumbel(keyed_uniform(rows.seed_key[:, None], rows.step[:, None], 0, ids))
    choice = _argmax(x + noise)                                       # (batch,)
    drawn = choice if mode == "sample" else ids.gather(-1, choice.unsqueeze(-1)).squeeze(-1)
    return torch.where(greedy, greedy_pick, drawn)


def sample_ref(logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor) -> torch.Tensor:
    """Op-by-op reference for :func:`sample`, with filters written as full-vocab masks.

    Args:
        logits: (batch, vocab) float.
        params: SamplingParams.
        uniforms: (batch, vocab) float32 in (0, 1), indexed by vocab id, e.g.
            ``hash_uniform(seed, step, arange(batch)[:, None], arange(vocab)[None])``.

    Returns:
        (batch,) int64. Equal to ``sample`` on the same numbers, barring float ties.
    """
    if params.greedy:
        return _argmax(logits)
    x = logits.float() * (1.0 / params.temperature)
    if params.top_k:
        kth = torch.topk(x, min(params.top_k, x.shape[-1]), dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1:
        probs = torch.softmax(x, dim=-1)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        drop_sorted = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    if params.min_p:
        x = x.masked_fill(x < x.amax(-1, keepdim=True) + math.log(params.min_p), float("-inf"))
    return torch.argmax(x + _gumbel(uniforms), dim=-1)
