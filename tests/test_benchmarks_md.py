"""BENCHMARKS.md is generated from the curated results: a figure there cannot drift from its data."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_benchmarks_md_matches_results():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "benchmarks_md.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_curated_results_stay_small():
    results = ROOT / "benchmarks" / "results"
    tracked = [*results.glob("*/*.json"), *results.glob("*/*.png")]  # what .gitignore lets in
    assert len(tracked) <= 40, f"{len(tracked)} result files: keep the latest run of each suite on each GPU"
    assert sum(p.stat().st_size for p in tracked) <= 8 << 20


def test_train_section_renders_a_run():
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmarks_md", ROOT / "tools" / "benchmarks_md.py")
    md = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(md)
    rec = dict(model="llama-3.2-1b", seq=4096, batch=4, losses=[11.9, 11.2], error=None, skipped=None,
               max_batch=7, max_batch_exact=True, max_tokens_vs_eager=None, tokens_per_s=30000.0,
               speedup_vs_eager=None, peak_bytes=100 * 2**30, peak_vs_eager=None, max_loss_diff=0.0)
    mine = dict(rec, provider="onetrip", max_batch=23, max_batch_exact=False, max_tokens_vs_eager=23 / 7,
                tokens_per_s=45000.0, speedup_vs_eager=1.5, peak_bytes=40 * 2**30, peak_vs_eager=0.4,
                max_loss_diff=0.0123)
    data = {"meta": {"gpu": "NVIDIA H200", "date": "2026-11-29T12:00:00+00:00", "torch": "2.11.0",
                     "transformers": "5.17.0", "suite": "train", "settings": {"seq": 4096}},
            "results": [dict(rec, provider="eager"), mine,
                        dict(rec, provider="liger", losses=[], skipped="liger-kernel is not installed")]}
    text = md.train_section("h200", data)
    assert "| llama-3.2-1b | onetrip | 4 | **45,000** (1.50x) | **40.0** (0.40x) | 23+ x 4096 (3.29x) | 1.2e-02 |" \
        in text, text
    assert "| llama-3.2-1b | eager | 4 | 30,000 | 100.0 | 7 x 4096 | 0.0e+00 |" in text, text
    assert "Not measured: llama-3.2-1b liger: liger-kernel is not installed." in text
    assert "transformers 5.17.0" in text
