"""The facade: one call reads a trace and runs every analysis.

    report = analyze_trace("trace.json.gz")
    report.verdict.kind          # "launch-bound", "memory-bound, missing fusion" or "neither"
    print(report.to_json())

Each analysis is a function of a ``TraceIndex`` returning plain frozen dataclasses:
``step_stats`` (timeline.py), ``find_chains`` / ``find_square_intermediates`` /
``find_casts`` (fusion.py), ``op_bandwidth`` (bandwidth.py), ``top_kernels``, ``top_ops``,
``graph_replays`` and ``verdict`` (here). ``analyze_index`` runs them on a trace already read
(to draw its timeline too without reading the file twice).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .fusion import (CastGroup, ChainPattern, SquareIntermediate, find_casts, find_chains, find_square_intermediates,
                     group_chains, square_ops)
from .bandwidth import OpBandwidth, PeakBandwidth, check_bandwidth, op_bandwidth, trace_bandwidth
from .timeline import GRAPH_LAUNCHES, UNAVAILABLE, UNLINKED, StepStats, Thresholds, TraceIndex, step_stats
from .trace import read_trace


@dataclass(frozen=True)
class KernelTotal:
    """One kernel name over the whole trace. share: total_us / the sum over all kernels.
    op: the operator that launched it most often; ``UNAVAILABLE`` when every launch was
    a graph replay, None when no launch could be linked to an operator."""

    name: str
    category: str
    count: int
    total_us: float
    mean_us: float
    median_us: float
    share: float
    op: str | None
    graph_replays: int


def top_kernels(index: TraceIndex, n: int = 15) -> list[KernelTotal]:
    """The ``n`` kernel names with the most total time (memcpy/memset included)."""
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(index.trace.kernels):
        groups.setdefault(k.name, []).append(i)
    kernels = index.trace.kernels
    grand = sum(k.dur for k in kernels) or 1.0
    out = []
    for name, idx in groups.items():
        durs = [kernels[i].dur for i in idx]
        graph = sum(index.graph[i] for i in idx)
        ops = Counter(op.name for i in idx if (op := index.op(kernels[i], i)) is not None)
        op = ops.most_common(1)[0][0] if ops else (UNAVAILABLE if graph == len(idx) else None)
        out.append(KernelTotal(name, index.category[idx[0]], len(idx), sum(durs), statistics.fmean(durs),
                               statistics.median(durs), sum(durs) / grand, op, graph))
    return sorted(out, key=lambda t: -t.total_us)[:n]


@dataclass(frozen=True)
class OpTotal:
    """GPU time by the operator that launched it (memcpy/memset included). op: the cpu_op's
    name; ``UNAVAILABLE`` for kernels replayed from a CUDA graph; ``UNLINKED`` when neither
    the kernel nor its launch carries an External id found among the cpu ops.
    share: total_us / the sum over all GPU activities."""

    op: str
    kernels: int
    total_us: float
    share: float


def top_ops(index: TraceIndex, n: int = 15) -> list[OpTotal]:
    """The ``n`` operators with the most GPU time, most first."""
    count: Counter = Counter()
    time_us: Counter = Counter()
    for i, k in enumerate(index.trace.kernels):
        op = index.op(k, i)
        name = op.name if op is not None else (UNAVAILABLE if index.graph[i] else UNLINKED)
        count[name] += 1
        time_us[name] += k.dur
    grand = sum(time_us.values()) or 1.0
    out = [OpTotal(name, count[name], us, us / grand) for name, us in time_us.items()]
    return sorted(out, key=lambda t: -t.total_us)[:n]


@dataclass(frozen=True)
class GraphReplays:
    """CUDA graph replays. A kernel is replayed from a graph when its correlation id points
    to a graph launch call (``GRAPH_LAUNCHES``) or its args carry a graph id. Such kernels
    are counted and timed like any other; which operator they belong to is not in the
    trace, so their attribution is ``UNAVAILABLE``.

    launches: graph launch calls on the CPU; kernels / kernel_us: replayed kernels and
    their summed duration; kernels_per_launch: kernels / launches (0 without launches).
    """

    launches: int
    kernels: int
    kernel_us: float
    kernels_per_launch: float
    attribution: str


def graph_replays(index: TraceIndex) -> GraphReplays:
    launches = sum(1 for r in index.trace.runtime if r.name in GRAPH_LAUNCHES)
    replayed = [k for i, k in enumerate(index.trace.kernels) if index.graph[i] and k.kind == "kernel"]
    return GraphReplays(launches, len(replayed), sum(k.dur for k in replayed),
                        len(replayed) / launches if launches else 0.0, UNAVAILABLE if replayed else "available")


@dataclass(frozen=True)
class Verdict:
    """What limits the trace, decided in this order:

    launch-bound: launch_overhead_share (summed over steps: launch overhead / wall time)
        >= ``launch_bound_share`` (0.30): the GPU spends that much of its time waiting for
        launches; fuse kernels or capture a CUDA graph.
    memory-bound, missing fusion: otherwise, when fusible_share (kernel time in
        element-wise chains / busy time) >= ``fusible_share`` (0.20), or an N x N
        intermediate was materialized (square_intermediates: how many times).
    neither: none of the above.

    The trace's verdict sums over all step rows; a step's verdict uses that step's row, its
    chains, and the N x N intermediates whose operator started inside its span.
    """

    kind: str
    reason: str
    launch_overhead_share: float
    fusible_share: float
    square_intermediates: int


def verdict(steps: list[StepStats], chain_us: float, squares: int, th: Thresholds = Thresholds()) -> Verdict:
    wall = sum(s.wall_us for s in steps)
    busy = sum(s.busy_us for s in steps)
    launch = sum(s.launch_overhead_us for s in steps) / wall if wall > 0 else 0.0
    fusible = chain_us / busy if busy > 0 else 0.0
    if launch >= th.launch_bound_share:
        kind = "launch-bound"
        reason = (f"{launch:.0%} of wall time is the GPU waiting on kernel launches "
                  f"(threshold {th.launch_bound_share:.0%}): fuse kernels or capture a CUDA graph")
    elif fusible >= th.fusible_share or squares:
        kind = "memory-bound, missing fusion"
        parts = []
        if fusible >= th.fusible_share:
            parts.append(f"{fusible:.0%} of busy time is in chains of element-wise kernels "
                         f"(threshold {th.fusible_share:.0%})")
        if squares:
            parts.append(f"N x N intermediates are written to memory {squares} time(s)")
        reason = "; ".join(parts)
    else:
        kind = "neither"
        reason = (f"launch overhead {launch:.0%} < {th.launch_bound_share:.0%} and element-wise chains "
                  f"{fusible:.0%} < {th.fusible_share:.0%} of busy time")
    return Verdict(kind, reason, launch, fusible, squares)


@dataclass(frozen=True)
class TraceReport:
    """Everything ``analyze_trace`` finds. Totals count every event of the trace (kernels
    launched outside every ProfilerStep included); ``steps`` only those inside a step.
    cpu_ops: CPU operator spans; shaped_ops: those with recorded input shapes (0 when the
    trace was recorded without ``record_shapes=True``: every byte figure is then unknown);
    profiler_steps: ``ProfilerStep#N`` spans, with or without GPU activity.
    bandwidth: the peak that ``op_bandwidth`` (achieved GB/s per operator and input
    shapes, the most GPU time first) is compared with; see ``bandwidth.py``."""

    path: str
    events: int
    kernels: int
    memcpy: int
    memset: int
    unassigned: int
    cpu_ops: int
    shaped_ops: int
    profiler_steps: int
    kernel_us: float
    categories: dict[str, int]
    category_us: dict[str, float]
    steps: tuple[StepStats, ...]
    step_verdicts: tuple[Verdict, ...]  # one per row of steps
    chains: tuple[ChainPattern, ...]
    chain_count: int
    chain_saved_bytes: int | None
    square_intermediates: tuple[SquareIntermediate, ...]
    casts: tuple[CastGroup, ...]
    top_kernels: tuple[KernelTotal, ...]
    top_ops: tuple[OpTotal, ...]
    graphs: GraphReplays
    verdict: Verdict
    thresholds: Thresholds
    bandwidth: PeakBandwidth
    op_bandwidth: tuple[OpBandwidth, ...]

    @property
    def gpu_activities(self) -> int:
        """Kernels, memcpy and memset: 0 for a trace recorded without CUDA activity."""
        return self.kernels + self.memcpy + self.memset

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON (tuples become lists; unknown byte counts are null)."""
        return json.dumps(self.to_dict(), indent=indent)


def analyze_trace(path: str | Path, thresholds: Thresholds = Thresholds(), top: int = 15,
                  bandwidth_gbs: float | None = None) -> TraceReport:
    """Stream the trace at ``path`` and run every analysis; see ``TraceReport``.

    bandwidth_gbs: the device bandwidth (GB/s) that per-operator achieved bandwidth is
    compared with; None: the nominal datasheet peak of the GPU named in the trace, if known.
    Raises ValueError (naming the file) when the file is missing, not JSON, cut short, or
    has no traceEvents, and when ``bandwidth_gbs`` is not a positive number.
    """
    check_bandwidth(bandwidth_gbs)  # before reading a file of gigabytes
    return analyze_index(TraceIndex(read_trace(path)), thresholds, top, bandwidth_gbs)


def analyze_index(index: TraceIndex, thresholds: Thresholds = Thresholds(), top: int = 15,
                  bandwidth_gbs: float | None = None) -> TraceReport:
    """``analyze_trace`` on a trace already read: ``analyze_index(TraceIndex(read_trace(path)))``."""
    trace = index.trace
    peak = trace_bandwidth(trace, bandwidth_gbs)
    steps = step_stats(index, thresholds)
    chains = find_chains(index, thresholds)
    squares = find_square_intermediates(index, thresholds)
    square_steps = Counter(index.steps[s].name for op, _, _ in square_ops(index, thresholds)
                           if (s := index.find_step(op.ts)) >= 0)
    chain_us: Counter = Counter()
    for c in chains:
        chain_us[(c.step, c.device)] += c.kernel_us
    step_verdicts = tuple(verdict([s], chain_us[(s.step, s.device)], square_steps[s.step], thresholds) for s in steps)
    cats: Counter = Counter()
    cat_us: Counter = Counter()
    for i, k in enumerate(trace.kernels):
        cats[index.category[i]] += 1
        cat_us[index.category[i]] += k.dur
    saved = [c.saved_bytes for c in chains]
    return TraceReport(
        path=trace.path, events=trace.events, kernels=sum(k.kind == "kernel" for k in trace.kernels),
        memcpy=sum(k.kind == "memcpy" for k in trace.kernels), memset=sum(k.kind == "memset" for k in trace.kernels),
        unassigned=index.unassigned, cpu_ops=len(trace.cpu_ops),
        shaped_ops=sum(op.input_dims is not None for op in trace.cpu_ops), profiler_steps=len(trace.steps),
        kernel_us=sum(k.dur for k in trace.kernels if k.kind == "kernel"),
        categories=dict(cats), category_us=dict(cat_us), steps=tuple(steps), step_verdicts=step_verdicts,
        chains=tuple(group_chains(chains)),
        chain_count=len(chains), chain_saved_bytes=None if None in saved else sum(saved),
        square_intermediates=tuple(squares), casts=tuple(find_casts(index)),
        top_kernels=tuple(top_kernels(index, top)), top_ops=tuple(top_ops(index, top)), graphs=graph_replays(index),
        verdict=verdict(steps, sum(c.kernel_us for c in chains), sum(s.occurrences for s in squares), thresholds),
        thresholds=thresholds, bandwidth=peak, op_bandwidth=tuple(op_bandwidth(index, peak, top)))


__all__ = ["analyze_trace", "analyze_index", "TraceReport", "KernelTotal", "OpTotal", "GraphReplays", "Verdict",
           "top_kernels", "top_ops", "graph_replays", "verdict", "UNAVAILABLE", "UNLINKED"]
