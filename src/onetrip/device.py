"""Timing on the GPU and the copy ceiling: how onetrip measures, shared by the engine's
report and the benchmark suites (``bench.harness`` re-exports these names).

    t = time_ms(fn)                     # Timing: median / p20 / p80 ms of fn() with a cold L2
    gbs = copy_bandwidth_gbs("cuda")    # device-to-device copy, (read + write) bytes / s / 1e9

``copy_bandwidth_gbs`` is the practical ceiling of a memory-bound kernel on this GPU: a
decode step's bytes over its time are reported as a % of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from .graphs import capture

MIN_FLUSH_BYTES = 256 << 20


def new_flush_buffer(device: torch.device | str = "cuda") -> torch.Tensor:
    """The buffer ``time_ms`` reads before each rep to evict its inputs from L2."""
    return torch.ones(flush_bytes(device) // 4, dtype=torch.float32, device=device)


def flush_bytes(device: torch.device | str | None = None) -> int:
    """Size of the buffer read before each timed call: max(256 MiB, 4 x L2)."""
    if not torch.cuda.is_available():
        return MIN_FLUSH_BYTES
    l2 = getattr(torch.cuda.get_device_properties(device or torch.cuda.current_device()), "L2_cache_size", 0) or 0
    return max(MIN_FLUSH_BYTES, 4 * l2)


@dataclass(frozen=True)
class Timing:
    """GPU time of one call, in milliseconds: the median and the 20th / 80th percentiles
    over the timed calls (``time_ms``).

    graph: True when the call was captured in a CUDA graph and replayed, so no CPU launch
    overhead is timed; False when capture failed and the call was timed directly
    (graph_error then says why).
    """

    median_ms: float
    p20_ms: float
    p80_ms: float
    graph: bool
    graph_error: str | None = None


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted list, q in [0, 1]."""
    if not sorted_values:
        raise ValueError("quantile of an empty list")
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _try_capture(fn: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph | None, str | None]:
    """Capture ``fn`` in a CUDA graph, or return (None, reason) when it cannot be captured."""
    try:
        graph, _ = capture(fn)
        graph.replay()
        torch.cuda.synchronize()
        return graph, None
    except Exception as exc:  # noqa: BLE001 - any failure means "time it without a graph"
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            pass
        return None, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def time_ms(
    fn: Callable[[], object],
    *,
    reps: int = 100,
    warmup: int = 5,
    use_graph: bool = True,
    flush: torch.Tensor | None = None,
) -> Timing:
    """Median GPU time of ``fn()`` with cold L2, under a CUDA graph when it can be captured.

    1. ``warmup`` direct calls (the first one triggers torch.compile / Triton compilation);
    2. if ``use_graph``, capture ``fn`` into a CUDA graph on a side stream; when capture
       raises, fall back to direct calls (``Timing.graph`` is False);
    3. ``reps`` times: read a buffer of max(256 MiB, 4 x L2) so ``fn`` reads its inputs
       from HBM, then record CUDA events around one replay (or one call). The flush
       reads rather than writes: a written buffer leaves L2 full of dirty lines that the
       timed call must write back, ~60 MB of extra traffic on an H200 that cost the
       read-once-write-once ops up to 15% of their measured bandwidth.

    Graph replay removes CPU launch overhead for every provider alike, so the figures
    compare kernels, not Python. ``fn`` must not synchronise with the host. Caveat: a
    device-to-device ``copy_`` inside a graph runs on the copy engines, about 35% slower
    than launched directly (see ``copy_bandwidth_gbs``).
    """
    for _ in range(max(1, warmup)):
        fn()
    torch.cuda.synchronize()
    graph, graph_error = _try_capture(fn) if use_graph else (None, None)
    run = graph.replay if graph is not None else fn
    if flush is None:
        flush = new_flush_buffer()
    flush_sink = torch.empty((), dtype=flush.dtype, device=flush.device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        torch.amax(flush, dim=0, out=flush_sink)  # read, not write: see the docstring
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    captured = graph is not None
    del graph, run  # frees the graph's private memory pool now, not at the next collection
    return Timing(quantile(times, 0.5), quantile(times, 0.2), quantile(times, 0.8), captured, graph_error)


def copy_bandwidth_gbs(device: torch.device | str = "cuda", nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s: (bytes read + bytes written) / median time.

    The practical ceiling for a memory-bound kernel; ``pct_of_copy`` is measured against it.
    Timed without a CUDA graph: captured, the copy becomes a memcpy node served by the copy
    engines, 2697 GB/s on an H200 against 4224 GB/s launched directly (and 4256 GB/s for
    an element-wise kernel); at 1 GiB the launch overhead is below 0.1%.
    """
    with torch.cuda.device(torch.device(device)):
        src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
        dst = torch.empty_like(src)
        timing = time_ms(lambda: dst.copy_(src), reps=30, warmup=3, use_graph=False)
    return 2 * nbytes / 1e9 / (timing.median_ms / 1e3)
