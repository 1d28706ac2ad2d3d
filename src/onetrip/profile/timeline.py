"""Steps, GPU busy time and idle gaps.

Every metric here is computed per step and per device from the kernels assigned to that
step; times are in µs.

Step assignment: a kernel belongs to the ``ProfilerStep#N`` span that contains the start
of the CPU call that launched it (found through the correlation id), or, when the launch
is not in the trace, the start of the kernel itself. A trace without ProfilerStep spans is
one step, ``"trace"``, covering everything. Kernels launched outside every step are
counted in ``TraceIndex.unassigned``.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass

from .kinds import classify, is_cast
from .trace import CpuOp, Kernel, RuntimeCall, Step, Trace

UNAVAILABLE = "unavailable (CUDA graph replay)"
UNLINKED = "unlinked (no operator in the trace)"
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cudaGraphLaunch_v10000", "cuGraphLaunch", "cuGraphLaunch_ptsz",
                            "cudaGraphLaunch_ptsz"})


@dataclass(frozen=True)
class Thresholds:
    """The knobs of the analyses, with the values the report uses by default.

    kernel_wait_max_us: longest gap, with the next kernel already queued, still counted as
        the GPU's own cost of starting the next kernel (kernel-wait); longer ones are "other".
    window_us: the sampling window of ``dashboard_utilization`` (NVML's counter uses 1/6 s to
        1 s; 1 ms keeps the effect visible within one step).
    chain_max_gap_us: the largest idle gap allowed between two kernels of one element-wise chain.
    square_min: the smallest N for which an N x N intermediate is reported.
    launch_bound_share: launch_overhead_share at or above which a trace is launch-bound.
    fusible_share: share of busy time in element-wise chains at or above which a trace that
        is not launch-bound is memory-bound with missing fusion.
    """

    kernel_wait_max_us: float = 10.0
    window_us: float = 1000.0
    chain_max_gap_us: float = 50.0
    square_min: int = 64
    launch_bound_share: float = 0.30
    fusible_share: float = 0.20


@dataclass(frozen=True)
class StepStats:
    """One step on one device.

    kernels: GPU kernels (memcpy/memset counted apart); graph_kernels: those replayed from a
        CUDA graph (included in ``kernels``).
    median_us / mean_us: of kernel durations (0 when there are none).
    wall_us: from the first GPU activity's start to the last one's end.
    busy_us: length of the union of all activity intervals (kernels, memcpy, memset), so
        overlapping streams are not counted twice. busy_fraction = busy_us / wall_us.
    dashboard_utilization: fraction of ``window_us`` windows, tiled from the step's start,
        in which any activity ran: what a utilization dashboard shows; it reads near 1 while
        busy_fraction is low when many short kernels are spread over every window.
    idle_us = wall_us - busy_us, the sum of the gaps between busy intervals, split by the
        kernel b that ends each gap (a: the activity whose end starts the gap):
        host_wait_us: b's launch call returned at or after a ended: the GPU had no queued
            work and waited for the CPU.
        kernel_wait_us: b was queued before a ended and the gap is <= kernel_wait_max_us:
            the cost of starting one kernel after another.
        other_wait_us: b was queued but the gap is longer (waiting on an event, another
            stream, a synchronisation), or b's launch is not in the trace.
    launch_overhead_us = host_wait_us + kernel_wait_us: idle time that fewer, larger kernel
        launches (fusion, CUDA graphs) remove; launch_overhead_share = that / wall_us.
    """

    step: str
    device: int
    kernels: int
    graph_kernels: int
    memcpy: int
    memset: int
    median_us: float
    mean_us: float
    start_us: float
    wall_us: float
    busy_us: float
    busy_fraction: float
    dashboard_utilization: float
    gaps: int
    idle_us: float
    host_wait_us: float
    kernel_wait_us: float
    other_wait_us: float
    launch_overhead_us: float
    launch_overhead_share: float


class TraceIndex:
    """Links between the trace's records, built once: launch of a kernel, its operator,
    its category, its step."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.launch_by_corr: dict[int, RuntimeCall] = {r.correlation: r for r in trace.runtime
                                                       if r.correlation is not None}
        self.op_by_ext: dict[int, CpuOp] = {o.external_id: o for o in trace.cpu_ops if o.external_id is not None}
        self.whole_trace = not trace.steps  # no ProfilerStep spans: one step covering everything
        self.steps: list[Step] = list(trace.steps) or [self._whole(trace)]
        self._starts = [s.ts for s in self.steps]
        self.step_of: list[int] = []  # per kernel, index into steps or -1
        self.category: list[str] = []
        self.graph: list[bool] = []
        by_name: dict[tuple, str] = {}
        for k in trace.kernels:
            launch = self.launch(k)
            self.graph.append(k.graph_id is not None or (launch is not None and launch.name in GRAPH_LAUNCHES))
            self.step_of.append(self.find_step(launch.ts if launch is not None else k.ts))
            op = self.op(k, len(self.graph) - 1)
            key = (k.name, k.kind, op is not None and is_cast(op))  # classify once per distinct kernel
            if key not in by_name:
                by_name[key] = classify(k, op)
            self.category.append(by_name[key])
        self.unassigned = self.step_of.count(-1)

    @staticmethod
    def _whole(trace: Trace) -> Step:
        times = [k.ts for k in trace.kernels] + [r.ts for r in trace.runtime]
        ends = [k.end for k in trace.kernels] + [r.ts + r.dur for r in trace.runtime]
        start = min(times, default=0.0)
        return Step("trace", 0, start, max(ends, default=start) - start)

    def find_step(self, t: float) -> int:
        """Index of the step whose CPU span contains time ``t``; -1 when none does."""
        if self.whole_trace:
            return 0
        i = bisect.bisect_right(self._starts, t) - 1
        if i >= 0 and t <= self.steps[i].ts + self.steps[i].dur:
            return i
        return -1

    def launch(self, k: Kernel) -> RuntimeCall | None:
        return self.launch_by_corr.get(k.correlation) if k.correlation is not None else None

    def op(self, k: Kernel, i: int) -> CpuOp | None:
        """The operator that launched kernel ``i``; None when unknown or replayed from a graph
        (a replay's launch belongs to no operator, so attribution is unavailable)."""
        if self.graph[i]:
            return None
        ext = k.external_id
        if ext is None:
            launch = self.launch(k)
            ext = launch.external_id if launch is not None else None
        return self.op_by_ext.get(ext) if ext is not None else None

    def by_step_device(self) -> dict[tuple[int, int], list[int]]:
        """Kernel indices grouped by (step index, device), in start order."""
        groups: dict[tuple[int, int], list[int]] = {}
        for i, k in enumerate(self.trace.kernels):
            if self.step_of[i] >= 0:
                groups.setdefault((self.step_of[i], k.device), []).append(i)
        return groups


def step_stats(index: TraceIndex, th: Thresholds = Thresholds()) -> list[StepStats]:
    """``StepStats`` for every (step, device) with GPU activity, in step order."""
    out = []
    kernels = index.trace.kernels
    for (s, device), idx in sorted(index.by_step_device().items()):
        acts = [kernels[i] for i in idx]
        durs = [k.dur for k in acts if k.kind == "kernel"]
        graph = sum(1 for i in idx if index.graph[i] and kernels[i].kind == "kernel")
        start = min(k.ts for k in acts)
        wall = max(k.end for k in acts) - start
        busy, gaps = 0.0, {"host": 0.0, "kernel": 0.0, "other": 0.0}
        n_gaps, windows = 0, set()
        cur_start, cur_end, cur_last = acts[0].ts, acts[0].end, acts[0]
        merged = []
        for k in acts[1:]:
            if k.ts > cur_end:
                merged.append((cur_start, cur_end))
                n_gaps += 1
                gaps[_gap_kind(index.launch(k), cur_last, k.ts - cur_end, th)] += k.ts - cur_end
                cur_start, cur_end, cur_last = k.ts, k.end, k
            elif k.end > cur_end:
                cur_end, cur_last = k.end, k
        merged.append((cur_start, cur_end))
        for a, b in merged:
            busy += b - a
            first = int((a - start) // th.window_us)
            last = max(first, int(math.ceil((b - start) / th.window_us)) - 1)
            windows.update(range(first, last + 1))
        n_windows = max(1, math.ceil(wall / th.window_us))
        launch = gaps["host"] + gaps["kernel"]
        out.append(StepStats(
            step=index.steps[s].name, device=device, kernels=len(durs), graph_kernels=graph,
            memcpy=sum(k.kind == "memcpy" for k in acts), memset=sum(k.kind == "memset" for k in acts),
            median_us=statistics.median(durs) if durs else 0.0, mean_us=statistics.fmean(durs) if durs else 0.0,
            start_us=start, wall_us=wall, busy_us=busy, busy_fraction=busy / wall if wall > 0 else 1.0,
            dashboard_utilization=min(1.0, len(windows) / n_windows), gaps=n_gaps, idle_us=wall - busy,
            host_wait_us=gaps["host"], kernel_wait_us=gaps["kernel"], other_wait_us=gaps["other"],
            launch_overhead_us=launch, launch_overhead_share=launch / wall if wall > 0 else 0.0))
    return out


def _gap_kind(launch: RuntimeCall | None, before: Kernel, gap: float, th: Thresholds) -> str:
    """host / kernel / other, as defined on ``StepStats``."""
    if launch is None:
        return "other"
    if launch.ts + launch.dur >= before.end:
        return "host"
    return "kernel" if gap <= th.kernel_wait_max_us else "other"
