"""Timeline pictures: the layout's numbers exactly, then the PNG and HTML files they become."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from onetrip.cli import main
from onetrip.profile import draw_timeline, draw_timelines, layout_timeline, read_trace, write_html_timeline
from onetrip.profile.lanes import COLORS, select_steps
from onetrip.profile.kinds import CATEGORIES
from onetrip.profile.timeline import UNAVAILABLE, TraceIndex

from profile_traces import EW_ADD, GEMM, TraceBuilder, eager_steps, fused_steps

DATA = Path(__file__).parent / "data"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_layout_of_default_steps(tmp_path):
    lay = layout_timeline(eager_steps(TraceBuilder()).write(tmp_path / "eager.json"))
    assert lay.summary.steps == ("ProfilerStep#1", "ProfilerStep#2")  # the first of three steps is skipped
    assert lay.origin_us == 1016.0 and lay.span_us == 2090.0 - 1016.0
    assert len(lay.bars) == 16 and [(la.device, la.stream) for la in lay.lanes] == [(0, 7)]
    assert lay.bars[0].start_us == 0.0 and lay.bars[0].op == "aten::add" and lay.bars[0].category == "elementwise"
    assert [g.end_us - g.start_us for g in lay.gaps] == [6.0] * 14  # not the 926 µs between the steps
    assert lay.step_marks == (("ProfilerStep#1", 0.0), ("ProfilerStep#2", 1000.0))
    s = lay.summary
    assert (s.kernels_per_step, s.wall_us) == (8.0, 148.0)
    assert s.busy_fraction == pytest.approx(64 / 148) and s.launch_overhead_share == pytest.approx(84 / 148)
    assert s.lines()[0].split() == ["kernels/step", "8"]


def test_step_selection(tmp_path):
    index = TraceIndex(read_trace(eager_steps(TraceBuilder(), steps=5).write(tmp_path / "t.json")))
    assert select_steps(index) == [1, 2]
    assert select_steps(index, [0, -1]) == [0, 4] and select_steps(index, ["ProfilerStep#3", 3]) == [3]
    with pytest.raises(ValueError, match=r"steps: no step 9 in this trace; give positions 0..4 or names"):
        select_steps(index, [9])
    with pytest.raises(ValueError, match="no step 'ProfilerStep#9'"):
        select_steps(index, ["ProfilerStep#9"])
    two = TraceIndex(read_trace(eager_steps(TraceBuilder(), steps=2).write(tmp_path / "two.json")))
    assert select_steps(two) == [0, 1]


def test_layout_streams_gaps_and_graphs(tmp_path):
    """Two streams on one device: a gap is idle only when neither stream runs."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.launched_kernel(GEMM, 1, 10, 10)                 # stream 7 [10, 20]
    b.launched_kernel(EW_ADD, 2, 15, 20, stream=8)     # stream 8 [15, 35]
    b.kernel(GEMM, 50, 5, corr=b.launch(40, name="cudaGraphLaunch"))  # [50, 55], replayed
    lay = layout_timeline(b.write(tmp_path / "t.json"))
    assert [la.label for la in lay.lanes] == ["GPU 0 stream 7", "GPU 0 stream 8"]
    assert [(g.start_us, g.end_us) for g in lay.gaps] == [(25.0, 40.0)]
    assert lay.bars[-1].op == UNAVAILABLE and [b.lane for b in lay.bars] == [0, 1, 0]


def test_nothing_to_draw(tmp_path):
    with pytest.raises(ValueError, match="nothing to draw: no GPU activity"):
        layout_timeline(DATA / "cpu_attention.json.gz")


def test_png(tmp_path):
    path = draw_timeline(eager_steps(TraceBuilder()).write(tmp_path / "eager.json"), tmp_path / "t.png",
                         title="eager")
    assert path == tmp_path / "t.png" and path.stat().st_size > 10_000
    width, height = png_size(path)
    assert width == 1400 and 150 <= height <= 400  # 14 in x (0.3 in per lane + 2 in) at 100 dpi


def test_png_of_several_runs(tmp_path):
    eager = TraceIndex(read_trace(eager_steps(TraceBuilder()).write(tmp_path / "eager.json")))
    fused = read_trace(fused_steps(TraceBuilder()).write(tmp_path / "fused.json"))
    path = draw_timelines([eager, fused, tmp_path / "eager.json"], tmp_path / "runs.png",
                          labels=["eager", "fused", "eager again"], title="three runs")
    width, height = png_size(path)
    assert width == 1400 and 400 <= height <= 800
    with pytest.raises(ValueError, match=r"labels: give one per trace \(2\), got 1"):
        draw_timelines([eager, fused], tmp_path / "x.png", labels=["eager"])
    with pytest.raises(ValueError, match="min_width must be a fraction"):
        draw_timeline(eager, tmp_path / "x.png", min_width=0.5)
    assert not (tmp_path / "x.png").exists()


def test_html(tmp_path):
    b = fused_steps(TraceBuilder())
    b.launched_kernel("reduce&friends<float>_kernel", 1060, 1075, 3)  # a name to escape, in step 1
    eager = eager_steps(TraceBuilder()).write(tmp_path / "eager.json")
    path = write_html_timeline([eager, b.write(tmp_path / "fused.json")], tmp_path / "t.html",
                               labels=["eager <A>", "fused"])
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count("<svg") == 4  # labels + timeline per run
    assert "vectorized_elementwise_kernel[CUDAFunctor_add]" in text and "operator: aten::add" in text
    assert "4.00 µs · elementwise" in text and "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0" in text
    assert "reduce&amp;friends" in text and "eager &lt;A&gt;" in text
    assert "kernels/step" in text and "busy 43%, launch overhead 57%" in text  # eager: 64 / 148, 84 / 148
    assert not re.search(r"https?:|//[a-z]|<script|<link|<img|@import|url\(", text)  # nothing external
    rects = text.count('class="k ')
    assert rects == 16 + 4 + 1  # eager steps 1-2, fused steps 1-2, the escaped kernel


def test_colors_cover_every_category():
    assert set(COLORS) == set(CATEGORIES)


def test_cli_png_html_and_errors(tmp_path, capsys):
    trace = eager_steps(TraceBuilder()).write(tmp_path / "eager.json")
    png, html = tmp_path / "t.png", tmp_path / "t.html"
    assert main(["profile", str(trace), "--png", str(png), "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {png}" in out and f"wrote {html}" in out
    assert png_size(png)[0] == 1400 and "vectorized_elementwise_kernel" in html.read_text()
    png.unlink()
    assert main(["profile", str(DATA / "cpu_attention.json.gz"), "--png", str(png)]) == 1  # the report, no PNG
    assert f"--png {png} not written: no GPU kernels to draw" in capsys.readouterr().err and not png.exists()
