"""What a timeline picture shows, as data: the PNG (``draw.py``) and the HTML page
(``html_timeline.py``) both draw a ``TimelineLayout``.

    layout = layout_timeline("trace.json.gz")           # default steps, see ``select_steps``
    layout.lanes, layout.bars[0].start_us, layout.summary.busy_fraction

Times in a layout are µs since its first GPU activity (``origin_us`` is that activity's
trace timestamp). One lane per (device, stream) holding an activity of the selected steps;
idle gaps are per device and step: the stretches inside a step's GPU span (its first
activity's start to its last one's end, as in ``StepStats``) where none of the device's
streams runs anything. The time between two steps is not a gap of either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

from .kinds import CATEGORIES
from .timeline import UNAVAILABLE, Thresholds, TraceIndex, step_stats
from .trace import Trace, read_trace

Source = Union[TraceIndex, Trace, str, Path]

# Colours per kernel category (Okabe-Ito, readable by the colour-blind), and of idle gaps.
COLORS = {"elementwise": "#E69F00", "norm": "#56B4E9", "cast": "#CC79A7", "gemm": "#0072B2",
          "attention": "#009E73", "memcpy": "#D55E00", "memset": "#F0E442", "other": "#999999"}
GAP_COLOR = "#F2B8B5"


@dataclass(frozen=True)
class Lane:
    device: int
    stream: int
    label: str


@dataclass(frozen=True)
class Bar:
    """One GPU activity. start_us: since the layout's origin; dur_us: its true duration;
    op: the launching operator (``UNAVAILABLE`` for a graph replay, None when unknown)."""

    lane: int
    start_us: float
    dur_us: float
    name: str
    category: str
    op: str | None
    step: str


@dataclass(frozen=True)
class Gap:
    """An idle stretch of one device within a step: no activity on any of its streams
    (µs since the origin)."""

    device: int
    start_us: float
    end_us: float


@dataclass(frozen=True)
class TimelineSummary:
    """Over the selected steps, from their ``StepStats`` rows (all devices):
    kernels_per_step = kernels / steps; busy_fraction = busy / wall;
    launch_overhead_share = launch overhead (host-wait + kernel-wait) / wall."""

    steps: tuple[str, ...]
    kernels_per_step: float
    busy_fraction: float
    launch_overhead_share: float
    wall_us: float

    def lines(self) -> list[str]:
        per_step = f"{self.kernels_per_step:.1f}".removesuffix(".0")
        return [f"kernels/step  {per_step}", f"busy          {self.busy_fraction:.0%}",
                f"launch ovh.   {self.launch_overhead_share:.0%}"]


@dataclass(frozen=True)
class TimelineLayout:
    """span_us: from the first activity's start to the last one's end.
    step_marks: (step name, µs since the origin of the step's first activity)."""

    title: str
    origin_us: float
    span_us: float
    lanes: tuple[Lane, ...]
    bars: tuple[Bar, ...]
    gaps: tuple[Gap, ...]
    step_marks: tuple[tuple[str, float], ...]
    summary: TimelineSummary

    def categories(self) -> list[str]:
        """The categories present, in ``CATEGORIES`` order."""
        present = {b.category for b in self.bars}
        return [c for c in CATEGORIES if c in present]


def as_index(source: Source) -> TraceIndex:
    """A ``TraceIndex`` from an index, a ``Trace``, or a trace file's path."""
    if isinstance(source, TraceIndex):
        return source
    if isinstance(source, Trace):
        return TraceIndex(source)
    if isinstance(source, (str, Path)):
        return TraceIndex(read_trace(source))
    raise TypeError(f"expected a TraceIndex, a Trace or a trace file path, got {type(source).__name__}")


def select_steps(index: TraceIndex, steps: Sequence[int | str] | None = None) -> list[int]:
    """Indices into ``index.steps`` to draw, in time order.

    steps=None: among the steps with GPU activity, the second and third when there are at
    least three (the first profiled step often carries one-time costs: lazy initialisation,
    allocator growth, autotuning), else the first two. Otherwise each item is a position
    in the trace's steps (0 = the first ProfilerStep; negative counts from the end) or a
    step name ("ProfilerStep#3"). ValueError names an item that is neither.
    """
    if steps is None:
        active = sorted({s for s in index.step_of if s >= 0})
        return active[1:3] if len(active) >= 3 else active[:2]
    if isinstance(steps, (str, int)):
        steps = [steps]
    names = [s.name for s in index.steps]
    chosen = set()
    for item in steps:
        if isinstance(item, str) and item in names:
            chosen.add(names.index(item))
        elif isinstance(item, int) and not isinstance(item, bool) and -len(names) <= item < len(names):
            chosen.add(item % len(names))
        else:
            shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
            raise ValueError(f"steps: no step {item!r} in this trace; give positions 0..{len(names) - 1} "
                             f"or names ({shown})")
    return sorted(chosen)


def layout_timeline(source: Source, steps: Sequence[int | str] | None = None, title: str | None = None,
                    thresholds: Thresholds = Thresholds()) -> TimelineLayout:
    """The ``TimelineLayout`` of the selected steps (``select_steps``). ValueError when they
    hold no GPU activity (a CPU-only trace, or steps that launched nothing)."""
    index = as_index(source)
    chosen = select_steps(index, steps)
    keep = set(chosen)
    kernels = index.trace.kernels
    idx = [i for i, s in enumerate(index.step_of) if s in keep]
    if not idx:
        what = "no GPU activity" if not kernels else f"no GPU activity in steps {sorted(keep)}"
        raise ValueError(f"{index.trace.path}: nothing to draw: {what} (profile with ProfilerActivity.CUDA)")
    origin = min(kernels[i].ts for i in idx)
    lane_keys = sorted({(kernels[i].device, kernels[i].stream) for i in idx})
    lane_of = {key: n for n, key in enumerate(lane_keys)}
    bars = []
    first_of_step: dict[int, float] = {}
    for i in idx:
        k = kernels[i]
        op = index.op(k, i)
        s = index.step_of[i]
        first_of_step[s] = min(first_of_step.get(s, math.inf), k.ts - origin)
        bars.append(Bar(lane_of[(k.device, k.stream)], k.ts - origin, k.dur, k.name, index.category[i],
                        op.name if op is not None else (UNAVAILABLE if index.graph[i] else None),
                        index.steps[s].name))
    span = max(b.start_us + b.dur_us for b in bars)
    rows = [r for r in step_stats(index, thresholds) if r.step in {index.steps[s].name for s in keep}]
    wall = sum(r.wall_us for r in rows)
    summary = TimelineSummary(tuple(index.steps[s].name for s in chosen), sum(r.kernels for r in rows) / len(chosen),
                              sum(r.busy_us for r in rows) / wall if wall > 0 else 1.0,
                              sum(r.launch_overhead_us for r in rows) / wall if wall > 0 else 0.0, wall)
    return TimelineLayout(
        title=title if title is not None else Path(index.trace.path).name, origin_us=origin, span_us=span,
        lanes=tuple(Lane(d, s, f"GPU {d} stream {s}") for d, s in lane_keys), bars=tuple(bars),
        gaps=tuple(_gaps(bars, lane_keys)),
        step_marks=tuple((index.steps[s].name, first_of_step[s]) for s in chosen), summary=summary)


def _gaps(bars: list[Bar], lane_keys: list[tuple[int, int]]) -> list[Gap]:
    """Idle stretches per device and step between the merged busy intervals of all the
    device's streams, in time order."""
    groups: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for b in bars:
        groups.setdefault((lane_keys[b.lane][0], b.step), []).append((b.start_us, b.start_us + b.dur_us))
    out = []
    for (device, _), spans in groups.items():
        spans.sort()
        end = spans[0][1]
        for a, b in spans[1:]:
            if a > end:
                out.append(Gap(device, end, a))
            end = max(end, b)
    return sorted(out, key=lambda g: (g.device, g.start_us))


def nice_step(span: float, ticks: int = 8) -> float:
    """A round tick spacing (1, 2 or 5 x 10^k) giving about ``ticks`` ticks over ``span``."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def time_unit(span_us: float) -> tuple[str, float]:
    """("µs", 1) for spans up to 5 ms, else ("ms", 1000): the unit axes are labelled in."""
    return ("ms", 1000.0) if span_us > 5000 else ("µs", 1.0)


__all__ = ["TimelineLayout", "TimelineSummary", "Lane", "Bar", "Gap", "COLORS", "GAP_COLOR", "as_index",
           "select_steps", "layout_timeline", "nice_step", "time_unit"]
