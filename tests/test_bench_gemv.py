"""The gemv suite's pure-Python parts (shapes from presets, byte counts) and its CPU path."""

import json

import pytest
import torch

from conftest import ON_GPU
from onetrip.bench.gemv import PRESETS, Projection, layer_floor_us, projections
from onetrip.cli import main


def test_projection_shapes_from_presets():
    shapes = {(p.preset, p.name): (p.n, p.k, p.bias) for p in projections()}
    assert len(shapes) == 5 * len(PRESETS)
    assert shapes["llama-3.1-8b", "qkv"] == (6144, 4096, False)  # (32 + 2 x 8) heads of 128
    assert shapes["llama-3.1-8b", "o"] == (4096, 4096, False)
    assert shapes["llama-3.1-8b", "gate_up"] == (28672, 4096, False)
    assert shapes["llama-3.1-8b", "down"] == (4096, 14336, False)
    assert shapes["llama-3.2-1b", "lm_head"] == (128256, 2048, False)
    assert shapes["qwen2.5-0.5b", "qkv"] == (1152, 896, True)  # (14 + 2 x 2) x 64, with bias
    assert shapes["qwen2.5-7b", "o"] == (3584, 3584, False)


def test_bytes_moved():
    p = Projection("-", "o", n=2048, k=2048)
    assert p.bytes_moved(1) == 2 * (2048 * 2048 + 2048 + 2048)
    assert p.bytes_moved(8, torch.float32) == 4 * (2048 * 2048 + 8 * 2048 + 8 * 2048)
    assert Projection("-", "qkv", 10, 3, bias=True).bytes_moved(2) == 2 * (30 + 10 + 6 + 20)
    # The 1B layer: 121.7 MB at batch 1, 28.6 us at 4250 GB/s.
    assert layer_floor_us(["llama-3.2-1b"])["llama-3.2-1b"] == pytest.approx(28.6, abs=0.05)


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError, match="llama-3.2-1b"):
        projections(["llama-9"])


@pytest.mark.skipif(ON_GPU, reason="the CPU path; on a GPU the command runs the full benchmark")
def test_cli_bench_gemv_cpu_end_to_end(capsys):
    assert main(["bench", "gemv", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "Timings need a CUDA GPU" in out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["bench"] == "gemv-check" and summary["failed"] == 0 and summary["checks"] >= 10


def test_records_tables_and_plot_with_fake_timings(monkeypatch, tmp_path):
    """The GPU path's bookkeeping on the CPU: harness.time_ms replaced by fixed timings."""
    from onetrip.bench import gemv, harness, report

    fake = {"cublas": 0.004, "onetrip": 0.002}
    calls = iter(["cublas", "onetrip"])
    monkeypatch.setattr(harness, "time_ms", lambda fn, flush=None: harness.Timing(fake[next(calls)], 0, 0, True))
    proj = Projection("tiny", "o", 64, 96, bias=True)
    recs = gemv.bench_projection(proj, 3, torch.bfloat16, ("cublas", "onetrip"), None, 100.0, None, device="cpu")
    cub, mine = recs
    assert cub["error"] is None and mine["error"] is None, (cub["error"], mine["error"])
    assert mine["ok"] and mine["max_diff_vs_cublas"] is not None
    assert mine["speedup_vs_cublas"] == pytest.approx(2.0)
    assert mine["gbs"] == pytest.approx(proj.bytes_moved(3) / 1e9 / 2e-6)
    assert mine["pct_of_copy"] == pytest.approx(mine["gbs"])  # copy_gbs = 100
    gemv.print_tables(report.console(), recs, ("cublas", "onetrip"))
    harness.write_results(recs, {"gpu": "cpu"}, tmp_path / "gemv")
    assert (tmp_path / "gemv.csv").exists()
