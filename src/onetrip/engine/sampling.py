"""Token sampling that a CUDA graph can capture: greedy, temperature, top-k, top-p.

    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=1234)
    step = torch.zeros((), dtype=torch.int64, device="cuda")  # the engine bumps it in-graph
    tokens = sample(logits, params, step)                     # (batch,) int64, no host sync
    tokens = sample_tp(local_logits, params, step, tp, start) # the same, the vocabulary split over ranks

Order of the warps, as in Hugging Face's generate: divide by the temperature, keep the
``top_k`` largest logits, then keep the nucleus (the smallest set of most likely tokens
whose probability reaches ``top_p``), then draw from what is left.

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
    """How to turn logits into a token. Fixed per captured graph (Python values, not tensors).

    temperature  0 means greedy (argmax); otherwise logits are divided by it.
    top_k        keep the k largest logits; 0 turns the filter off.
    top_p        keep the smallest set of most likely tokens whose probability reaches
                 top_p (at least one token); 1.0 turns the filter off.
    seed         any Python int; with the step and batch row it fixes every draw.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

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

    @property
    def greedy(self) -> bool:
        """True when the draw is an argmax (temperature 0, or top_k 1 at any temperature)."""
        return self.temperature == 0 or self.top_k == 1


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
    seed &= 2**64 - 1
    seed_key = _mix32(_mix32(seed & _MASK32) ^ (seed >> 32))  # Python int, folded at trace time
    step_key = _mix32((step.to(torch.int64) & _MASK32) ^ seed_key)
    key_a = _mix32(step_key ^ (rows.to(torch.int64) & _MASK32))
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
    x = logits.float() / params.temperature                          # (batch, vocab) fp32
    if params.top_k:
        x, ids = torch.topk(x, min(params.top_k, vocab), dim=-1)     # (batch, k), descending
    elif params.top_p < 1:
        x, ids = torch.sort(x, dim=-1, descending=True)              # (batch, vocab)
    else:
        return _argmax(x + _noise(params, step, batch, torch.arange(vocab, device=x.device).unsqueeze(0)))
    probs = torch.softmax(x, dim=-1) if params.top_p < 1 else None
    return _draw(x, ids, probs, params, step)


def _noise(params: SamplingParams, step: torch.Tensor, batch: int, ids: torch.Tensor) -> torch.Tensor:
    """Gumbel noise (batch, n) of vocab ids (batch, n) or (1, n), keyed by (seed, step, row, id)."""
    rows = torch.arange(batch, device=ids.device).unsqueeze(1)       # (batch, 1)
    return _gumbel(hash_uniform(params.seed, step, rows, ids))


def _draw(x: torch.Tensor, ids: torch.Tensor, probs, params: SamplingParams, step: torch.Tensor) -> torch.Tensor:
    """The token drawn from candidates x (batch, n) fp32, sorted descending, of vocab ids
    ``ids`` (batch, n): the nucleus of ``probs`` (their probabilities, None without top_p)
    kept, then the Gumbel-max draw. Returns (batch,) int64 vocab ids."""
    if probs is not None:
        mass_before = torch.cumsum(probs, dim=-1) - probs            # 0 for the first: kept
        x = x.masked_fill(mass_before >= params.top_p, float("-inf"))
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
    (and tile); top_k, the k best (value, id) of each rank, all-gathered, before the usual
    top-k / top-p / draw on the world x k; top_p alone, the ``TOP_P_CANDIDATES`` best of
    each rank and two reductions (max and sum of exp) that make their probabilities exact.
    Graph capture: collectives on the current stream, static shapes, no host reads.
    """
    _check(local_logits, step)
    if params.greedy:
        return _global_argmax(local_logits, vocab_start, tp)
    batch, n = local_logits.shape
    x = local_logits.float() / params.temperature                    # (batch, n) fp32
    if not params.top_k and params.top_p == 1:
        ids = vocab_start + torch.arange(n, device=x.device).unsqueeze(0)
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
    x = logits.float() / params.temperature
    if params.top_k:
        kth = torch.topk(x, min(params.top_k, x.shape[-1]), dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1:
        probs = torch.softmax(x, dim=-1)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        drop_sorted = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.argmax(x + _gumbel(uniforms), dim=-1)
