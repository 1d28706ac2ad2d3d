"""Trace analysis: what a PyTorch profiler trace says about the seams between kernels.

    from onetrip.profile import analyze_trace, render_report
    report = analyze_trace("trace.json.gz")   # streams the file; multi-GB traces are fine
    render_report(report)                     # rich tables on the terminal
    report = run(lambda: model(x), steps=5)   # or profile a callable directly
    report.to_json()                          # the same, for scripts
    report.op_bandwidth[0].achieved_gbs       # per operator and shapes, vs the GPU's peak
    draw_timeline("trace.json.gz", "t.png")   # kernels per stream over time; write_html_timeline
    render_diff(diff_reports(report_a, report_b))   # eager vs fused, side by side

Layers: ``trace`` (streaming reader) -> ``timeline`` (steps, busy time, idle gaps),
``fusion`` (element-wise chains, N x N intermediates, casts), ``kinds`` (kernel categories),
``bandwidth`` (bytes per operator, achieved GB/s, datasheet peaks)
-> ``analyze`` (top kernels, CUDA graph replays, verdict, the ``TraceReport`` facade)
-> ``report`` (text rendering), ``diff`` (two reports compared), ``lanes`` (what a timeline
shows) -> ``draw`` (PNG) and ``html_timeline`` (a self-contained HTML page).
"""

from .analyze import GraphReplays, KernelTotal, OpTotal, TraceReport, Verdict, analyze_index, analyze_trace
from .bandwidth import PEAK_HBM_GBS, OpBandwidth, PeakBandwidth, op_bytes
from .diff import Change, ReportDiff, diff_reports, render_diff
from .draw import draw_timeline, draw_timelines
from .fusion import CastGroup, Chain, ChainPattern, SquareIntermediate
from .html_timeline import write_html_timeline
from .lanes import TimelineLayout, layout_timeline
from .report import render_report
from .run import run
from .timeline import StepStats, Thresholds, TraceIndex
from .trace import iter_events, read_trace

__all__ = ["analyze_trace", "analyze_index", "render_report", "run", "TraceReport", "StepStats", "Thresholds",
           "TraceIndex", "Chain", "ChainPattern", "SquareIntermediate", "CastGroup", "KernelTotal", "OpTotal",
           "GraphReplays", "Verdict", "OpBandwidth", "PeakBandwidth", "PEAK_HBM_GBS", "op_bytes", "ReportDiff",
           "Change", "diff_reports", "render_diff", "draw_timeline", "draw_timelines", "write_html_timeline",
           "TimelineLayout", "layout_timeline", "iter_events", "read_trace"]
