"""What the section writers share: the curated results folder, loading a run, its header line, tables."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"  # read at call time, so a test can point it elsewhere


def load(gpu: str, suite: str) -> dict | None:
    path = RESULTS / gpu / f"{suite}.json"
    return json.loads(path.read_text()) if path.exists() else None


def header(meta: dict) -> str:
    """One line: the GPU(s), date, versions and the copy bandwidth of the run."""
    versions = ", ".join(f"{name} {meta[key]}" for key, name in (("torch", "torch"), ("triton", "Triton"),
                                                                  ("cuda", "CUDA"), ("nccl", "NCCL"),
                                                                  ("liger_kernel", "Liger-Kernel"),
                                                                  ("transformers", "transformers")) if meta.get(key))
    copy = f", copy {meta['copy_gbs']:.0f} GB/s" if meta.get("copy_gbs") else ""
    if len(meta.get("copy_gbs_per_rank") or ()) > 1:
        copy += " a GPU (the slowest)"
    quick = " (`--quick`)" if meta.get("quick") else ""
    when = meta["date"][:16].replace("T", " ") + " UTC" if "T" in meta["date"] else meta["date"]
    gpu = meta["gpu"] if " x " in meta["gpu"] or not meta.get("world") else f"{meta['gpu']} x {meta['world']}"
    return f"**{gpu}**, {when}{quick}; {versions}{copy}."


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def pct(value) -> str:
    return "—" if value is None else f"{value:.1f}%"


def span(values: list[float], unit: str = "%") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    lo, hi = min(values), max(values)
    return f"{lo:.1f}{unit}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f}{unit}"


def first_line(error: str) -> str:
    """An error's first line, without its closing full stop (it goes inside a sentence)."""
    return (error.splitlines() or [""])[0].rstrip(".")


def figure(gpu: str, name: str, alt: str) -> list[str]:
    """The markdown lines showing the run's plot ``RESULTS/<gpu>/<name>``, or none where there is none."""
    if not (RESULTS / gpu / name).exists():
        return []
    return [f"![{alt}](benchmarks/results/{gpu}/{name})", ""]
