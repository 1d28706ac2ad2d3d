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
