"""Two traces side by side: what changed between a run A and a run B (eager vs fused,
before vs after a CUDA graph).

    d = diff_reports(analyze_trace("eager.json"), analyze_trace("fused.json"))
    d.metric("kernels per step").ratio      # 0.25: a quarter of the launches
    render_diff(d)                          # a rich table; d.to_json() for scripts

Each figure is computed the same way from either ``TraceReport`` (see ``report_metrics``)
and reported for A, for B, and as the change: delta = B - A, ratio = B / A.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .analyze import TraceReport
from .kinds import CATEGORIES


@dataclass(frozen=True)
class Change:
    """One figure of A and B. unit: "count", "µs" or "share" (a fraction of 1).
    delta = b - a; ratio = b / a, None when a is 0."""

    metric: str
    unit: str
    a: float
    b: float
    delta: float
    ratio: float | None


@dataclass(frozen=True)
class ReportDiff:
    """``metrics``: the figures of ``report_metrics``; ``category_us``: GPU time per step of
    each kernel category present in A or B (``category_per_step``); verdict_a / verdict_b:
    the traces' verdict kinds, with their reasons."""

    a_path: str
    b_path: str
    metrics: tuple[Change, ...]
    category_us: tuple[Change, ...]
    verdict_a: str
    verdict_b: str
    reason_a: str
    reason_b: str

    def metric(self, name: str) -> Change:
        """The ``Change`` named ``name`` (a metric or a category); KeyError lists the names."""
        for c in self.metrics + self.category_us:
            if c.metric == name:
                return c
        raise KeyError(f"no metric {name!r}; have: {', '.join(c.metric for c in self.metrics + self.category_us)}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def _by_step(report: TraceReport) -> dict[str, list]:
    groups: dict[str, list] = {}
    for s in report.steps:
        groups.setdefault(s.step, []).append(s)
    return groups


def report_metrics(report: TraceReport) -> dict[str, tuple[str, float]]:
    """The figures a diff compares, as {name: (unit, value)}. A step's figures sum its rows
    over devices (its wall time is the longest device's):

        steps                    distinct steps with GPU activity
        kernels per step         median over steps of the kernels launched (memcpy/memset apart)
        median step wall time    median over steps of first GPU activity start to last end
        busy time per step       median over steps of the union of GPU activity
        idle share               idle / wall time, summed over all step rows
        launch-overhead share    (host-wait + kernel-wait) / wall time, summed over all step rows
        graph-replayed kernels   kernels replayed from CUDA graphs, whole trace
        element-wise chains      chains found (``fusion.Chain``), whole trace
        N x N intermediates      times an N x N tensor was written, whole trace
    """
    steps = _by_step(report)
    med = lambda f: statistics.median(f(rows) for rows in steps.values()) if steps else 0.0  # noqa: E731
    wall = sum(s.wall_us for s in report.steps)
    share = lambda f: sum(getattr(s, f) for s in report.steps) / wall if wall > 0 else 0.0  # noqa: E731
    return {
        "steps": ("count", float(len(steps))),
        "kernels per step": ("count", float(med(lambda rows: sum(s.kernels for s in rows)))),
        "median step wall time": ("µs", float(med(lambda rows: max(s.wall_us for s in rows)))),
        "busy time per step": ("µs", float(med(lambda rows: sum(s.busy_us for s in rows)))),
        "idle share": ("share", share("idle_us")),
        "launch-overhead share": ("share", share("launch_overhead_us")),
        "graph-replayed kernels": ("count", float(report.graphs.kernels)),
        "element-wise chains": ("count", float(report.chain_count)),
        "N x N intermediates": ("count", float(sum(s.occurrences for s in report.square_intermediates))),
    }


def category_per_step(report: TraceReport) -> dict[str, float]:
    """GPU time (µs) per kernel category over the whole trace, divided by its number of
    steps with GPU activity (1 when it has none), so runs of different lengths compare."""
    n = max(1, len(_by_step(report)))
    return {c: us / n for c, us in report.category_us.items()}


def _change(metric: str, unit: str, a: float, b: float) -> Change:
    return Change(metric, unit, a, b, b - a, b / a if a else None)


def diff_reports(a: TraceReport, b: TraceReport) -> ReportDiff:
    """Compare two reports; see ``ReportDiff`` and ``report_metrics``."""
    ma, mb = report_metrics(a), report_metrics(b)
    metrics = tuple(_change(name, unit, value, mb[name][1]) for name, (unit, value) in ma.items())
    ca, cb = category_per_step(a), category_per_step(b)
    cats = tuple(_change(f"{c} time per step", "µs", ca.get(c, 0.0), cb.get(c, 0.0))
                 for c in CATEGORIES if c in ca or c in cb)
    return ReportDiff(a.path, b.path, metrics, cats, a.verdict.kind, b.verdict.kind, a.verdict.reason,
                      b.verdict.reason)


def _value(unit: str, x: float, signed: bool = False) -> str:
    sign = "+" if signed and x > 0 else ""
    if unit == "share":
        return f"{sign}{x * 100:.1f} pts" if signed else f"{x:.1%}"
    if unit == "µs":
        return f"{sign}{x / 1000:.2f} ms" if abs(x) >= 1000 else f"{sign}{x:.1f} µs"
    return f"{sign}{x:.0f}" if x == int(x) else f"{sign}{x:.1f}"


def render_diff(diff: ReportDiff, console: Console | None = None) -> Console:
    """Print ``diff`` as a table (A, B, B - A, B / A) and the two verdicts; returns the console."""
    console = console or Console()
    t = Table(title=f"A: {escape(diff.a_path)}\nB: {escape(diff.b_path)}")
    for col in ("", "A", "B", "B - A", "B / A"):
        t.add_column(col, justify="left" if col == "" else "right")
    for i, c in enumerate(diff.metrics + diff.category_us):
        ratio = "—" if c.ratio is None else f"{c.ratio:.2f}x"
        t.add_row(c.metric, _value(c.unit, c.a), _value(c.unit, c.b), _value(c.unit, c.delta, signed=True), ratio,
                  end_section=i == len(diff.metrics) - 1)
    t.add_row("verdict", diff.verdict_a, diff.verdict_b, "same" if diff.verdict_a == diff.verdict_b else "changed",
              "", style="bold")
    console.print(t)
    console.print(f"[bold]A:[/] {escape(diff.verdict_a)} — {escape(diff.reason_a)}")
    console.print(f"[bold]B:[/] {escape(diff.verdict_b)} — {escape(diff.reason_b)}")
    return console


__all__ = ["ReportDiff", "Change", "diff_reports", "render_diff", "report_metrics", "category_per_step"]
