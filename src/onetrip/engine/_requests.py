"""The Scheduler's requests (``scheduler.py``): a request's state while it is queued,
prefilling or decoding (``Request``), and what a step did to it (``RequestOutput``, public
through ``onetrip.engine.scheduler``; ``StepOutput``, the lazily copied form ``step()`` returns),
and which prefilling requests share a prefill forward (``pick_prefill``)."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from typing import Callable, Optional

from .sampling import SamplingParams


@dataclass
class RequestOutput:
    """What a step did to one request. ``token_ids`` is a copy of every token so far."""

    request_id: str
    prompt_len: int
    new_token_ids: list[int]        # the tokens this step added (may be empty on finish)
    token_ids: list[int]            # every generated token so far
    finished: bool
    finish_reason: Optional[str]    # "stop" (EOS, stop_token_ids, a stop string), "length", "abort"


class StepOutput(RequestOutput):
    """A ``step()`` output whose ``token_ids`` is copied on first read: the first ``n`` of
    the given list, ``n`` its length at construction (a request's tokens only grow).
    Copying every request's tokens every step costs O(tokens so far): 43 us a step for 64
    requests of 256 tokens."""

    def __init__(self, request_id: str, prompt_len: int, new_token_ids: list[int], token_ids: list[int],
                 finished: bool, finish_reason: Optional[str]):
        self.request_id, self.prompt_len, self.new_token_ids = request_id, prompt_len, new_token_ids
        self.finished, self.finish_reason = finished, finish_reason
        self._src, self._n = token_ids, len(token_ids)

    @property
    def token_ids(self) -> list[int]:
        if self._src is not None:
            self._ids, self._src = self._src[: self._n], None
        return self._ids

    @token_ids.setter
    def token_ids(self, value: list[int]) -> None:
        self._ids, self._src = value, None

    def __eq__(self, other):  # equal to a RequestOutput of the same fields
        if not isinstance(other, RequestOutput):
            return NotImplemented
        names = ("request_id", "prompt_len", "new_token_ids", "token_ids", "finished", "finish_reason")
        return all(getattr(self, k) == getattr(other, k) for k in names)


@dataclass(eq=False)
class Request:
    id: str
    prompt: list[int]
    params: SamplingParams
    stop_ids: frozenset
    row_values: tuple                 # sampling.row_values(params)
    mode: int                         # its index in ROW_MODES
    tokens: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    context: list[int] = field(default_factory=list)  # what the prefill computes: prompt + tokens
    filled: int = 0                   # tokens of ``context`` in the cache
    row: int = -1                     # its table row while it decodes
    order: int = 0                    # admission count: the largest is the youngest
    first_pending: bool = False       # its first token is on the device, not read yet
    finish_reason: Optional[str] = None


def pick_prefill(prefilling: list[Request], chunk: Callable[[Request], int], budget: int) -> list[Request]:
    """The prefill block: the oldest of ``prefilling`` (admission order; so each makes
    progress) and the others that put the most real tokens into rows x width <= ``budget``,
    ``chunk(r)`` the tokens of r's next chunk. For a width W (a chunk size >= the oldest's)
    that is the longest chunks <= W, as many as fit; ties go to the narrower W and, within a
    chunk size, to the older requests."""
    if not prefilling:
        return []
    first, rest = prefilling[0], prefilling[1:]
    c0 = chunk(first)
    rest.sort(key=lambda r: (chunk(r), -r.order))  # ascending; the oldest of a size last
    sizes = [chunk(r) for r in rest]
    sums = list(itertools.accumulate(sizes, initial=0))
    ends = [bisect.bisect_right(sizes, c0)]  # rest[:end] fits the width
    ends += [m for m in range(ends[0] + 1, len(sizes) + 1) if m == len(sizes) or sizes[m] > sizes[m - 1]]
    best, pick = -1, (0, 0)
    for m in ends:
        width = max(c0, sizes[m - 1]) if m else c0
        lo = max(0, m - (budget // width - 1))
        if sums[m] - sums[lo] > best:
            best, pick = sums[m] - sums[lo], (lo, m)
    return [first, *rest[pick[0]:pick[1]]]
