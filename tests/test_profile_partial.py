"""Traces that lack something: no events, no GPU kernels, no recorded shapes, no CPU
operators. Each gets a report that says what is missing and how to record it."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from onetrip.profile import analyze_trace, read_trace, render_report
from onetrip.profile.report import NO_GPU, NO_OPS, NO_SHAPES, hints

from profile_traces import BF16, EW_ADD, EW_MUL, TraceBuilder

SHAPE = [[8, 4096], [8, 4096]]


def text_of(report) -> str:
    return render_report(report, Console(record=True, width=1000, file=io.StringIO())).export_text()


def cpu_trace(shapes: bool = True, square: bool = False) -> TraceBuilder:
    """Two steps of CPU operators, no GPU activity (what a CPU-only machine records)."""
    b = TraceBuilder()
    for n, t0 in ((1, 0), (2, 100)):
        b.step(n, t0, 90)
        b.op("aten::add", t0 + 10, 5, dims=SHAPE if shapes else None)
        if square:
            b.op("aten::softmax", t0 + 20, 5, dims=[[2, 4, 128, 128], []], types=["float", "Scalar"])
    return b


def gpu_trace(shapes: bool = True, ops: bool = True) -> TraceBuilder:
    """One step of two element-wise kernels launched by two operators."""
    b = TraceBuilder()
    b.step(1, 0, 100)
    for i, kernel in enumerate((EW_ADD, EW_MUL)):
        ext = b.op("aten::add", 10 * i, 5, dims=SHAPE if shapes else None, types=[BF16] * 2) if ops else None
        b.launched_kernel(kernel, 10 * i + 1, 20 + 10 * i, 8, ext=ext)
    return b


@pytest.mark.parametrize("content", ['{"traceEvents": []}', "[]", '{"traceEvents": [], "schemaVersion": 1}'])
def test_empty_trace_is_an_error_naming_the_file(tmp_path, content):
    path = tmp_path / "empty.json"
    path.write_text(content)
    for read in (read_trace, analyze_trace):
        with pytest.raises(ValueError, match="empty trace: traceEvents holds no events") as info:
            read(path)
        assert str(path) in str(info.value)


def test_cpu_only_trace_says_so_and_promises_nothing(tmp_path):
    r = analyze_trace(cpu_trace().write(tmp_path / "cpu.json"))
    assert (r.gpu_activities, r.cpu_ops, r.shaped_ops, r.profiler_steps, r.steps) == (0, 2, 2, 2, ())
    assert hints(r) == [NO_GPU]
    text = text_of(r)
    assert "2 CPU operators in 2 ProfilerStep spans, no GPU kernels" in text
    assert NO_GPU in text and "record_shapes=True" in text
    assert "nothing more to report" in text and "below" not in text and "follow" not in text
    assert "Verdict: none — no GPU kernels" in text
    assert "Top kernels" not in text and "Per step" not in text


def test_cpu_only_trace_with_a_square_intermediate(tmp_path):
    r = analyze_trace(cpu_trace(square=True).write(tmp_path / "cpu.json"))
    text = text_of(r)
    assert "From the CPU operators alone:" in text and "2x4x128x128" in text
    assert "Verdict: memory-bound, missing fusion" in text


def test_cpu_only_trace_without_shapes_gets_both_hints(tmp_path):
    r = analyze_trace(cpu_trace(shapes=False).write(tmp_path / "cpu.json"))
    assert r.shaped_ops == 0 and hints(r) == [NO_GPU, NO_SHAPES]


def test_missing_shapes_give_one_hint(tmp_path):
    r = analyze_trace(gpu_trace(shapes=False).write(tmp_path / "t.json"))
    assert r.cpu_ops == 2 and r.shaped_ops == 0 and hints(r) == [NO_SHAPES]
    text = text_of(r)
    assert text.count("record_shapes=True") == 1 and "unknown" in text  # the bandwidth table's bytes/call
    assert "No GPU kernels" not in text


def test_missing_cpu_operators_give_one_hint(tmp_path):
    r = analyze_trace(gpu_trace(ops=False).write(tmp_path / "t.json"))
    assert r.cpu_ops == 0 and hints(r) == [NO_OPS]


def test_a_full_trace_gets_no_hint(tmp_path):
    r = analyze_trace(gpu_trace().write(tmp_path / "t.json"))
    assert r.kernels == 2 and hints(r) == []
    text = text_of(r)
    assert "record_shapes" not in text and "No GPU kernels" not in text and "Per step" in text
    back = json.loads(r.to_json())
    assert (back["cpu_ops"], back["shaped_ops"], back["profiler_steps"]) == (2, 2, 1)
