"""Profile any callable and analyse the trace: ``onetrip.profile.run(fn, steps=5)``.

    from onetrip.profile import run, render_report
    report = run(lambda: model(tokens), steps=5, warmup=2)   # e.g. one decode step of an HF model
    render_report(report)

Each call of ``fn`` is one ProfilerStep of PyTorch's profiler (CPU activity, plus CUDA when a
GPU is present, shapes recorded so that byte estimates work); the Chrome trace is written to
``trace_path`` (a temporary file when None) and analysed by ``analyze_trace``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from .analyze import TraceReport, analyze_trace
from .bandwidth import check_bandwidth


def run(fn: Callable[[], object], *, steps: int = 5, warmup: int = 2,
        trace_path: str | os.PathLike | None = None, bandwidth_gbs: float | None = None) -> TraceReport:
    """Call ``fn`` ``warmup`` times untraced (compilation, caches), then ``steps`` times under
    the profiler, one ProfilerStep each; return the analysed ``TraceReport``.

    The trace is kept at ``trace_path`` when given (open it in Perfetto or chrome://tracing);
    otherwise it is deleted after the analysis. ``fn`` is called with no arguments.
    ``bandwidth_gbs`` is passed to ``analyze_trace`` (the peak per-op bandwidth is compared with).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    check_bandwidth(bandwidth_gbs)
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    keep = trace_path is not None
    path = Path(trace_path) if keep else Path(tempfile.mkstemp(suffix=".json", prefix="onetrip-trace-")[1])
    try:
        with profile(activities=activities, record_shapes=True) as prof:
            for i in range(steps):
                # Our own step spans: prof.step() leaves no ProfilerStep event in the trace
                # of some versions (torch 2.13 on a CPU), and the analysis reports per step.
                with record_function(f"ProfilerStep#{i}"):
                    fn()
            if cuda:
                torch.cuda.synchronize()
        prof.export_chrome_trace(str(path))
        return analyze_trace(path, bandwidth_gbs=bandwidth_gbs)
    finally:
        if not keep:
            path.unlink(missing_ok=True)


def kernels_per_step(fn: Callable[[], object], *, steps: int = 4, warmup: int = 2) -> tuple[float | None, float | None]:
    """Profile ``fn`` (one step per call) and return the median number of GPU kernels per
    step and the median of those replayed from CUDA graphs; (None, None) without GPU activity."""
    report = run(fn, steps=steps, warmup=warmup)
    if not report.steps:
        return None, None
    return (float(statistics.median(s.kernels for s in report.steps)),
            float(statistics.median(s.graph_kernels for s in report.steps)))
