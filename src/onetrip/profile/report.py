"""Plain-text rendering of a ``TraceReport`` with rich tables.

    render_report(analyze_trace("trace.json"))            # to the terminal
    text = render_report(report, console=Console(record=True, width=120)); console.export_text()
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .analyze import TraceReport
from .kinds import short_name
from .timeline import UNLINKED


def _name(s: str | None, width: int = 60) -> str:
    """A kernel name shortened and escaped: "[direct_copy_kernel_cuda]" is not rich markup."""
    return escape(short_name(s, width)) if s else "—"


def _us(x: float) -> str:
    return f"{x / 1000:.2f} ms" if x >= 1000 else f"{x:.1f} µs"


def _bytes(b: int | None) -> str:
    if b is None:
        return "unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b} B"


def _steps(report: TraceReport, n: int) -> Table:
    t = Table(title="Per step: kernels, busy / dashboard utilization, idle split as host-wait / kernel-wait / "
                    "other, launch overhead share of wall time")
    for col in ("step", "dev", "kernels", "graph", "median", "mean", "wall", "busy", "dash", "idle",
                "host", "kernel", "other", "launch", "verdict"):
        t.add_column(col, justify="left" if col in ("step", "verdict") else "right")
    steps = report.steps
    for s, v in zip(steps[:n], report.step_verdicts):
        t.add_row(escape(s.step), str(s.device), str(s.kernels), str(s.graph_kernels), _us(s.median_us), _us(s.mean_us),
                  _us(s.wall_us), f"{s.busy_fraction:.0%}", f"{s.dashboard_utilization:.0%}", _us(s.idle_us),
                  _us(s.host_wait_us), _us(s.kernel_wait_us), _us(s.other_wait_us), f"{s.launch_overhead_share:.0%}",
                  v.kind)
    if len(steps) > 1:
        wall = sum(s.wall_us for s in steps) or 1.0
        total = lambda f: sum(getattr(s, f) for s in steps)  # noqa: E731
        more = f"all {len(steps)}" + (f" ({len(steps) - n} not shown)" if len(steps) > n else "")
        t.add_row(more, "", str(total("kernels")), str(total("graph_kernels")), "", "", _us(total("wall_us")),
                  f"{total('busy_us') / wall:.0%}", "", _us(total("idle_us")), _us(total("host_wait_us")),
                  _us(total("kernel_wait_us")), _us(total("other_wait_us")),
                  f"{total('launch_overhead_us') / wall:.0%}", report.verdict.kind, style="bold")
    return t


def _top(report: TraceReport) -> Table:
    t = Table(title="Top kernels by total time")
    for col in ("kernel", "category", "count", "total", "mean", "share", "operator"):
        t.add_column(col, justify="left" if col in ("kernel", "category", "operator") else "right")
    for k in report.top_kernels:
        t.add_row(_name(k.name), k.category, str(k.count), _us(k.total_us), _us(k.mean_us), f"{k.share:.1%}",
                  escape(k.op or "—"))
    return t


def _ops(report: TraceReport) -> Table:
    t = Table(title="GPU time by launching operator")
    for col in ("operator", "kernels", "total", "share"):
        t.add_column(col, justify="left" if col == "operator" else "right")
    for o in report.top_ops:
        t.add_row(escape(o.op), str(o.kernels), _us(o.total_us), f"{o.share:.1%}")
    return t


SHORT_DTYPES = {"float": "f32", "double": "f64", "c10::Half": "f16", "c10::BFloat16": "bf16", "long int": "i64",
                "int": "i32", "short int": "i16", "signed char": "i8", "unsigned char": "u8", "bool": "bool",
                "c10::Float8_e4m3fn": "f8e4m3", "c10::Float8_e5m2": "f8e5m2"}


def shapes_text(dims: tuple | None, types: tuple | None) -> str:
    """The tensor inputs of an operator as "1024x1024 f32, 1024x1024 f32" (non-tensor
    arguments dropped); "—" when no shapes were recorded."""
    if not dims or not types:
        return "—"
    parts = []
    for d, t in zip(dims, types):
        if not d and t in ("", "Scalar", "ScalarList"):
            continue
        shape = "x".join(map(str, d)) if isinstance(d, tuple) and all(isinstance(x, int) for x in d) else "?"
        parts.append(f"{shape or 'scalar'} {SHORT_DTYPES.get(t, t)}")
    return ", ".join(parts) or "—"


def _bandwidth(report: TraceReport) -> Table:
    peak = report.bandwidth
    if peak.gbs is None:
        against = (f"no peak known for {peak.device!r}" if peak.device else "no device in the trace") + \
            ": pass --bandwidth GBS"
    elif peak.source == "argument":
        against = f"% of {peak.gbs:.0f} GB/s, as given"
    else:
        against = f"% of {peak.gbs:.0f} GB/s, the {peak.source.partition(': ')[2]}'s nominal datasheet peak"
    t = Table(title=f"Achieved bandwidth per operator ({escape(against)})",
              caption="bytes: tensor inputs read once + output written once, from the recorded shapes.\n"
              "! above 100% of the peak: the estimate does not hold for this op (L2 hits, a smaller output, "
              "overlapping streams); unreliable")
    for col in ("operator", "inputs", "category", "calls", "GPU time", "bytes/call", "GB/s", "% peak"):
        t.add_column(col, justify="left" if col in ("operator", "inputs", "category") else "right")
    for o in report.op_bandwidth:
        if not o.attributed:
            gbs, frac = "—", "n/a" if o.op == UNLINKED else "n/a (graph)"
        else:
            gbs = "—" if o.achieved_gbs is None else f"{o.achieved_gbs:.0f}"
            frac = "—" if o.peak_fraction is None else f"{o.peak_fraction:.0%}" + (" !" if o.unreliable else "")
        t.add_row(escape(o.op), escape(shapes_text(o.input_dims, o.input_types)), o.category,
                  str(o.calls) if o.attributed else "—",
                  _us(o.gpu_us), _bytes(o.bytes_per_call) if o.attributed else "—", gbs, frac,
                  style="yellow" if o.unreliable else None)
    return t


def _chains(report: TraceReport, n: int) -> Table:
    saved = report.chain_saved_bytes
    if saved is None:
        known = sum(p.saved_bytes for p in report.chains if p.saved_bytes is not None)
        saved_text = f"at least {_bytes(known)} (some chains have no recorded shapes)"
    else:
        saved_text = _bytes(saved)
    t = Table(title=f"Element-wise chains ({report.chain_count} found; fusing each would save {saved_text} "
                    "of HBM traffic)")
    for col in ("kernels", "operators", "times", "kernel time", "each intermediate", "saved bytes", "saved launches"):
        t.add_column(col, justify="left" if col in ("kernels", "operators") else "right")
    for p in report.chains[:n]:
        t.add_row(" → ".join(_name(x, 30) for x in p.names), " → ".join(escape(o or "?") for o in p.ops),
                  str(p.occurrences), _us(p.kernel_us), ", ".join(_bytes(b) for b in p.intermediate_sizes),
                  _bytes(p.saved_bytes), str(p.saved_launches))
    return t


NO_GPU = ("No GPU kernels in this trace (recorded without ProfilerActivity.CUDA, or on a machine without a GPU). "
          "Steps, idle gaps, launch overhead, element-wise chains and achieved bandwidth are measured on GPU "
          "kernels, so they need a CUDA trace: record on a GPU with torch.profiler.profile(activities="
          "[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True), or run "
          "`onetrip profile --model PRESET` there.")
NO_SHAPES = ("The trace has no input shapes, so byte figures read unknown and N x N intermediates cannot be "
             "found; record with torch.profiler.profile(record_shapes=True).")
NO_OPS = ("Byte figures and operators are unknown: the trace has no CPU operators; record with "
          "torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True).")


def hints(report: TraceReport) -> list[str]:
    """What the trace lacks for a full report, one line each with how to record it."""
    out = []
    if not report.gpu_activities:
        out.append(NO_GPU)
    if report.cpu_ops and not report.shaped_ops:
        out.append(NO_SHAPES)
    elif not report.cpu_ops and report.gpu_activities:
        out.append(NO_OPS)
    return out


def _summary(report: TraceReport) -> str:
    if not report.gpu_activities:
        return (f"[bold]{escape(report.path)}[/]: {report.events} events: {report.cpu_ops} CPU operators in "
                f"{report.profiler_steps} ProfilerStep spans, no GPU kernels")
    return (f"[bold]{escape(report.path)}[/]: {report.events} events, {report.kernels} kernels "
            f"({_us(report.kernel_us)}), {report.memcpy} memcpy, {report.memset} memset, {report.cpu_ops} CPU "
            f"operators, {len(report.steps)} step rows, {report.unassigned} GPU activities outside every step")


def render_report(report: TraceReport, console: Console | None = None, steps: int = 8, chains: int = 10) -> Console:
    """Print the report's tables and verdict to ``console`` (a new one when None); returns it.
    At most ``steps`` step rows and ``chains`` chain patterns are shown (the JSON has all).
    A trace without GPU kernels gets a note saying so and how to record one, then only the
    finding its CPU operators give (N x N intermediates), if any."""
    console = console or Console()
    console.print(_summary(report))
    for line in hints(report):
        console.print(f"[yellow]{escape(line)}[/]")
    if not report.gpu_activities:
        console.print("From the CPU operators alone:" if report.square_intermediates else
                      "The CPU operators show no N x N intermediate either: nothing more to report.")
    elif report.steps:
        console.print(_steps(report, steps))
    if report.gpu_activities:
        console.print(_top(report))
        console.print(_ops(report))
        if report.op_bandwidth:
            console.print(_bandwidth(report))
    if report.chains:
        console.print(_chains(report, chains))
    if report.square_intermediates:
        t = Table(title="N x N intermediates written to memory")
        for col in ("operator", "shape", "dtype", "times", "size", "traffic"):
            t.add_column(col)
        for s in report.square_intermediates:
            t.add_row(escape(s.op), "x".join(map(str, s.shape)), s.dtype, str(s.occurrences), _bytes(s.bytes),
                      _bytes(s.traffic_bytes))
        console.print(t)
    if report.casts:
        t = Table(title="dtype casts")
        for col in ("kernel", "operator", "input dtypes", "count", "time", "bytes read"):
            t.add_column(col)
        for c in report.casts:
            dtypes = escape(", ".join(c.from_types or ()) or "—")
            t.add_row(_name(c.name), escape(c.op or "—"), dtypes, str(c.count), _us(c.total_us), _bytes(c.bytes))
        console.print(t)
    g = report.graphs
    if g.launches or g.kernels:
        console.print(f"CUDA graphs: {g.launches} launches replayed {g.kernels} kernels ({_us(g.kernel_us)}); "
                      f"per-operator attribution {g.attribution}")
    v = report.verdict
    if report.gpu_activities or v.square_intermediates:
        console.print(f"[bold]Verdict: {v.kind}[/] — {escape(v.reason)}")
    else:
        console.print("[bold]Verdict: none[/] — no GPU kernels to judge launch overhead or element-wise chains by")
    return console
