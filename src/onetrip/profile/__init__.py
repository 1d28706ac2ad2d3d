"""Trace analysis: what a PyTorch profiler trace says about the seams between kernels.

    from onetrip.profile import analyze_trace, render_report
    report = analyze_trace("trace.json.gz")   # streams the file; multi-GB traces are fine
    render_report(report)                     # rich tables on the terminal
    report = run(lambda: model(x), steps=5)   # or profile a callable directly
    report.to_json()                          # the same, for scripts

Layers: ``trace`` (streaming reader) -> ``timeline`` (steps, busy time, idle gaps),
``fusion`` (element-wise chains, N x N intermediates, casts), ``kinds`` (kernel categories)
-> ``analyze`` (top kernels, CUDA graph replays, verdict, the ``TraceReport`` facade)
-> ``report`` (text rendering).
"""

from .analyze import GraphReplays, KernelTotal, OpTotal, TraceReport, Verdict, analyze_trace
from .fusion import CastGroup, Chain, ChainPattern, SquareIntermediate
from .report import render_report
from .run import run
from .timeline import StepStats, Thresholds
from .trace import iter_events, read_trace

__all__ = ["analyze_trace", "render_report", "run", "TraceReport", "StepStats", "Thresholds", "Chain", "ChainPattern",
           "SquareIntermediate", "CastGroup", "KernelTotal", "OpTotal", "GraphReplays", "Verdict", "iter_events",
           "read_trace"]
