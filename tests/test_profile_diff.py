"""Two traces compared: every figure of the diff, exactly, on an eager and a fused synthetic run."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from onetrip.cli import main
from onetrip.profile import analyze_trace, diff_reports, render_diff

from profile_traces import TraceBuilder, eager_steps, fused_steps

# (A, B) per metric: eager steps are 8 adds, wall 74, busy 32, 42 µs of host-wait; fused steps
# are a norm and a gemm, wall 51, busy 50, one 1 µs kernel-wait gap (see profile_traces).
EXPECTED = {
    "steps": (3, 3), "kernels per step": (8, 2), "median step wall time": (74, 51),
    "busy time per step": (32, 50), "idle share": (42 / 74, 1 / 51), "launch-overhead share": (42 / 74, 1 / 51),
    "graph-replayed kernels": (0, 0), "element-wise chains": (3, 0), "N x N intermediates": (0, 0),
    "elementwise time per step": (32, 0), "norm time per step": (0, 20), "gemm time per step": (0, 30),
}


@pytest.fixture
def reports(tmp_path):
    a = analyze_trace(eager_steps(TraceBuilder()).write(tmp_path / "eager.json"))
    b = analyze_trace(fused_steps(TraceBuilder()).write(tmp_path / "fused.json"))
    return a, b


def test_diff_numbers(reports):
    d = diff_reports(*reports)
    got = {c.metric: c for c in d.metrics + d.category_us}
    assert set(got) == set(EXPECTED)
    for name, (a, b) in EXPECTED.items():
        c = got[name]
        assert (c.a, c.b, c.delta) == (pytest.approx(a), pytest.approx(b), pytest.approx(b - a)), name
        assert c.ratio == (None if a == 0 else pytest.approx(b / a)), name
    assert d.metric("kernels per step").ratio == 0.25 and d.metric("element-wise chains").ratio == 0.0
    assert [c.metric for c in d.category_us] == ["elementwise time per step", "norm time per step",
                                                 "gemm time per step"]  # kinds.CATEGORIES order
    assert (d.verdict_a, d.verdict_b) == ("launch-bound", "neither")
    with pytest.raises(KeyError, match="no metric 'tok/s'; have: steps, kernels per step"):
        d.metric("tok/s")
    back = json.loads(d.to_json())
    assert back["metrics"][1] == {"metric": "kernels per step", "unit": "count", "a": 8.0, "b": 2.0, "delta": -6.0,
                                  "ratio": 0.25}


def test_diff_of_a_trace_with_itself_is_zero(reports):
    d = diff_reports(reports[0], reports[0])
    assert all(c.delta == 0 and c.ratio in (1.0, None) for c in d.metrics + d.category_us)


def test_render_diff(reports):
    text = render_diff(diff_reports(*reports), Console(record=True, width=160, file=io.StringIO())).export_text()
    for row in ("kernels per step", "8", "2", "-6", "0.25x"):
        assert row in text
    assert "-54.8 pts" in text and "56.8%" in text  # launch-overhead share: 1/51 - 42/74; 42/74
    assert "launch-bound" in text and "neither" in text and "changed" in text


def test_cli_diff(tmp_path, capsys):
    a = eager_steps(TraceBuilder()).write(tmp_path / "eager.json")
    b = fused_steps(TraceBuilder()).write(tmp_path / "fused.json")
    out, png, html = tmp_path / "diff.json", tmp_path / "d.png", tmp_path / "d.html"
    assert main(["profile", str(a), "--diff", str(b), "--json", str(out), "--png", str(png), "--html",
                 str(html)]) == 0
    text = capsys.readouterr().out
    assert "A: " in text and "median step wall time" in text and "74.0 µs" in text and "51.0 µs" in text
    d = json.loads(out.read_text())
    assert d["a_path"] == str(a) and d["verdict_b"] == "neither"
    assert png.stat().st_size > 10_000 and "A: eager.json" in html.read_text() and "B: fused.json" in html.read_text()
    assert main(["profile", str(a), "--diff", str(tmp_path / "nope.json")]) == 2
    assert "no such trace file" in capsys.readouterr().err


def test_cli_bandwidth(tmp_path, capsys):
    a = eager_steps(TraceBuilder()).write(tmp_path / "eager.json")
    out = tmp_path / "r.json"
    assert main(["profile", str(a), "--bandwidth", "2000", "--json", str(out)]) == 0
    assert "% of 2000 GB/s, as given" in capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["bandwidth"] == {"device": "NVIDIA H100 80GB HBM3", "gbs": 2000.0, "source": "argument"}
    add = r["op_bandwidth"][0]  # 24 adds of 12 MiB, 4 µs each: 3145.7 GB/s
    assert (add["op"], add["calls"], add["bytes"]) == ("aten::add", 24, 24 * 12 << 20)
    assert add["achieved_gbs"] == pytest.approx((12 << 20) / 4e3) and add["unreliable"] is True
    for bad in ("0", "-3", "fast", "inf"):
        with pytest.raises(SystemExit):
            main(["profile", str(a), "--bandwidth", bad])
        assert "expected GB/s as a number above 0" in capsys.readouterr().err
