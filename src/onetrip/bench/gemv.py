"""The suite behind ``onetrip bench gemv``: the decode step's projections as skinny matmuls.

At batch 1 each projection is a matrix-vector product whose time is the time to read its
weight, so the figure of merit is bandwidth: for every projection of a preset,

    qkv      (qkv_size, hidden)        + bias on Qwen2
    o        (hidden, heads * head_dim)
    gate_up  (2 * intermediate, hidden)
    down     (hidden, intermediate)
    lm_head  (vocab, hidden)

at M = 1, 8 and 32 rows (bf16), each provider is timed as CUDA-graph replays on cold L2
(``harness.time_ms``); a replay runs the call on enough copies of the weight to pass
256 MiB (one for the large ones), and the time is per call:

    cublas         torch.nn.functional.linear (cuBLAS's GEMV / GEMM)
    torch.compile  torch.compile(F.linear), static shapes (with ``--compile``: slow to compile)
    onetrip        onetrip.ops.skinny_matmul

A record per (preset, proj, M, provider) holds median_ms, p20_ms, p80_ms, bytes (weight +
bias + x read once, y written once), gbs, pct_of_copy (of the copy bandwidth measured in
the same run), max_diff_vs_cublas, error; onetrip's adds ok / max_err / bound
(``onetrip.testing``'s rule) and speedup_vs_cublas (cuBLAS's median / onetrip's).

Without a GPU, ``run_gemv_check`` checks skinny_matmul through Triton's interpreter on
the tiny preset's projections and a few awkward shapes instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from . import harness

PRESETS = ("llama-3.2-1b", "llama-3.1-8b", "qwen2.5-0.5b", "qwen2.5-7b")
MAX_SETS = 32
ROWS = (1, 8, 32)
PROVIDERS = ("cublas", "torch.compile", "onetrip")
STYLE = {"cublas": {"color": "#7f7f7f", "marker": "o"}, "torch.compile": {"color": "#1f77b4", "marker": "s"},
         "onetrip": {"color": "#d62728", "marker": "D"}}


@dataclass(frozen=True)
class Projection:
    """One linear layer of a preset: y (M, n) = x (M, k) @ weight (n, k).T (+ bias (n,))."""

    preset: str
    name: str
    n: int
    k: int
    bias: bool = False

    @property
    def label(self) -> str:
        return f"{self.name} {self.n}x{self.k}"

    def bytes_moved(self, rows: int, dtype: torch.dtype = torch.bfloat16) -> int:
        """Weight and bias read once, x read once, y written once."""
        size = torch.empty((), dtype=dtype).element_size()
        return size * (self.n * self.k + self.n * self.bias + rows * self.k + rows * self.n)


def projections(presets: Sequence[str] = PRESETS) -> list[Projection]:
    """The per-layer projections and the LM head of each preset, in decode order."""
    from onetrip.models.config import get_config

    out = []
    for name in presets:
        c = get_config(name)
        h = c.hidden_size
        out += [Projection(name, "qkv", c.qkv_size, h, c.attention_bias),
                Projection(name, "o", h, c.num_heads * c.head_dim),
                Projection(name, "gate_up", 2 * c.intermediate_size, h),
                Projection(name, "down", h, c.intermediate_size),
                Projection(name, "lm_head", c.vocab_size, h)]
    return out


def layer_floor_us(presets: Sequence[str] = PRESETS, copy_gbs: float = 4250.0) -> dict[str, float]:
    """Per preset, the microseconds one layer's projections need at batch 1: bytes / copy_gbs."""
    return {p: sum(pr.bytes_moved(1) for pr in projections([p]) if pr.name != "lm_head") / copy_gbs / 1e3
            for p in presets}


def _inputs(proj: Projection, rows: int, dtype: torch.dtype, device, gen) -> tuple:
    def rn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    scale = proj.k ** -0.5  # outputs of order 1, as in a trained model
    return rn(rows, proj.k), (rn(proj.n, proj.k) * scale).to(dtype), rn(proj.n) if proj.bias else None


def _check(x, w, b, y) -> dict:
    from onetrip.testing import error_report, upcast

    wide = upcast(x, w, b) if b is not None else upcast(x, w)
    report = error_report("skinny_matmul", y, F.linear(*wide), F.linear(x, w, b))
    return {"ok": report.ok, "max_err": report.max_err, "bound": report.bound, "check_report": str(report)}


def bench_projection(proj: Projection, rows: int, dtype: torch.dtype, providers: Sequence[str], compiled,
                     copy_gbs: float, flush: torch.Tensor | None, device="cuda") -> list[dict]:
    """Check, then time, each provider on one (projection, rows); one record per provider."""
    from onetrip.ops.skinny_matmul import skinny_matmul

    gen = torch.Generator(device=device).manual_seed(0)
    # Weights under harness.ROTATE_BYTES would be timed from L2 and one graph launch would dominate
    # a 2-6 us call: each timed replay runs the call on n_sets copies, back to back as the
    # layers of a model do, and the time is divided by n_sets.
    n_sets = harness.rotation_sets(proj.n * proj.k * dtype.itemsize, max_sets=MAX_SETS)
    n_sets = n_sets if torch.device(device).type == "cuda" else 1  # no L2 to defeat on the CPU
    sets = [_inputs(proj, rows, dtype, device, gen) for _ in range(n_sets)]
    ys = [torch.empty(rows, proj.n, dtype=dtype, device=device) for _ in range(n_sets)]
    x, w, b = sets[0]
    one = {"cublas": lambda x, w, b, y: F.linear(x, w, b), "torch.compile": lambda x, w, b, y: compiled(x, w, b),
           "onetrip": lambda x, w, b, y: skinny_matmul(x, w, b, out=y)}

    def every_set(f):
        def call():
            out = f(*sets[0], ys[0])
            for (xi, wi, bi), yi in zip(sets[1:], ys[1:]):
                f(xi, wi, bi, yi)
            return out
        return call
    calls = {p: every_set(f) for p, f in one.items()}
    keys = ("median_ms", "p20_ms", "p80_ms", "graph", "graph_error", "gbs", "pct_of_copy", "max_diff_vs_cublas",
            "ok", "max_err", "bound", "check_report", "speedup_vs_cublas", "error")
    records, base = [], None
    for provider in providers:
        rec = {"preset": proj.preset, "proj": proj.name, "shape": proj.label, "n": proj.n, "k": proj.k,
               "bias": proj.bias, "rows": rows, "dtype": str(dtype).removeprefix("torch."), "provider": provider,
               "bytes": proj.bytes_moved(rows, dtype), **dict.fromkeys(keys)}
        records.append(rec)
        try:
            out = calls[provider]().clone()  # the first call compiles
            if provider == "cublas":
                base = out
            elif base is not None:
                rec["max_diff_vs_cublas"] = float((out.float() - base.float()).abs().max())
            if provider == "onetrip":
                rec.update(_check(x, w, b, out))
            t = harness.per_call(harness.time_ms(calls[provider], flush=flush), n_sets)
            rate = harness.gbs(rec["bytes"], t.median_ms)
            rec.update(median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms, graph=t.graph,
                       graph_error=t.graph_error, gbs=rate, pct_of_copy=100 * rate / copy_gbs, input_sets=n_sets)
        except Exception as exc:  # noqa: BLE001 - recorded, the suite goes on
            rec["error"] = harness.error_string(exc)
    cublas = records[0] if records and records[0]["provider"] == "cublas" else None
    for r in records:
        if r["provider"] == "onetrip" and r["median_ms"] and cublas and cublas["median_ms"]:
            r["speedup_vs_cublas"] = cublas["median_ms"] / r["median_ms"]
    return records


def _rate(r: dict | None) -> str:
    if r is None:
        return "—"
    if r["error"]:
        return "[red]error[/]"
    return f"{r['gbs']:.0f} ({r['pct_of_copy']:.0f}%)" + ("" if r["graph"] else " [yellow]no graph[/]")


def print_tables(con, records: list[dict], providers: Sequence[str]) -> None:
    """Per preset: one row per (projection, rows), GB/s (% of copy) per provider, onetrip / cuBLAS."""
    from rich.table import Table

    for preset in dict.fromkeys(r["preset"] for r in records):
        recs = [r for r in records if r["preset"] == preset]
        table = Table(title=f"{preset}: GB/s (% of copy bandwidth), {recs[0]['dtype']}", title_justify="left")
        for col in ("projection", "M", "MiB", "µs (cublas)", *providers, "onetrip / cublas", "check"):
            table.add_column(col, justify="left" if col == "projection" else "right")
        for key in dict.fromkeys((r["shape"], r["rows"]) for r in recs):
            by = {r["provider"]: r for r in recs if (r["shape"], r["rows"]) == key}
            first, mine = next(iter(by.values())), by.get("onetrip") or {}
            base = by.get("cublas") or {}
            sp = mine.get("speedup_vs_cublas")
            check = "—" if mine.get("ok") is None else ("[green]ok[/]" if mine["ok"] else "[red]FAIL[/]")
            table.add_row(key[0], str(key[1]), f"{first['bytes'] / 2**20:.1f}",
                          f"{base['median_ms'] * 1e3:.1f}" if base.get("median_ms") else "—",
                          *(_rate(by.get(p)) for p in providers), f"{sp:.2f}x" if sp else "—", check)
        con.print(table)
    for r in records:
        if r["error"] or r["ok"] is False:
            con.print(f"  [red]{r['provider']} {r['preset']} {r['shape']} M={r['rows']}[/]: "
                      f"{r['error'] or r['check_report']}", highlight=False)


def run_gemv_bench(out_dir: Path, quick: bool = False, compile: bool = False,
                   presets: Sequence[str] = PRESETS, console=None) -> list[dict]:
    """Time every projection of ``presets`` on the current GPU; write JSON, CSV and PNG.

    Files are ``gemv-<gpu>-bf16-<YYYYMMDD>.{json,csv,png}`` under ``out_dir``, rewritten after
    each preset. ``quick``: M = 1 only. ``compile``: add torch.compile(F.linear).
    """
    from . import report
    from .ops import raise_recompile_limit

    console = console or report.console()
    dtype, device = torch.bfloat16, torch.device("cuda")
    providers = [p for p in PROVIDERS if compile or p != "torch.compile"]
    rows_list = (1,) if quick else ROWS
    meta = {**harness.device_info(device), "suite": "gemv", "dtype": "bfloat16", "quick": quick,
            "timing": "median of 100 CUDA-graph replays, L2 flushed (by reading 256 MiB) before each; a "
                      "replay runs input_sets copies (weights together >= 256 MiB), time per call",
            "bytes": "weight (+ bias) + x read once, y written once; 1 GB = 1e9 bytes"}
    meta["copy_gbs"] = harness.copy_bandwidth_gbs(device)
    console.print(f"{meta['gpu']}: copy bandwidth {meta['copy_gbs']:.0f} GB/s (read + write)")
    stem = Path(out_dir) / f"gemv-{harness.slug(meta['gpu'])}-bf16-{meta['date'][:10].replace('-', '')}"
    compiled = None
    if compile:
        raise_recompile_limit()
        compiled = torch.compile(F.linear, dynamic=False)
    flush = harness.new_flush_buffer(device)
    records: list[dict] = []
    with torch.inference_mode():
        for preset in presets:
            for proj in projections([preset]):
                for rows in rows_list:
                    console.print(f"{preset} {proj.label} M={rows}", highlight=False)
                    records += bench_projection(proj, rows, dtype, providers, compiled, meta["copy_gbs"], flush)
            harness.write_results(records, meta, stem)
    json_path, csv_path = harness.write_results(records, meta, stem)
    png = harness.plot_lines(
        records, stem.with_suffix(".png"), panel=lambda r: f"{r['preset']} M={r['rows']}", x=lambda r: r["proj"],
        y="pct_of_copy", series=lambda r: r["provider"], style=lambda s: STYLE.get(s, {}), ylabel="% of copy",
        title=f"{meta['gpu']} · bf16 · {meta['date'][:10]} · copy {meta['copy_gbs']:.0f} GB/s",
        hlines=[(100.0, "copy", "--"), (90.0, "90% of copy", ":")])
    print_tables(console, records, providers)
    console.print(f"wrote {json_path}, {csv_path}, {png}")
    ours = [r for r in records if r["provider"] == "onetrip"]
    mine = [r for r in ours if r["speedup_vs_cublas"]]
    print(json.dumps({"bench": "gemv", "gpu": meta["gpu"], "copy_gbs": meta["copy_gbs"], "results": len(records),
                      "onetrip_faster": sum(r["speedup_vs_cublas"] > 1 for r in mine), "compared": len(mine),
                      "failed": sum(bool(r["error"]) or r["ok"] is False for r in ours), "json": str(json_path)}),
          flush=True)
    return records


CHECK_SHAPES = ((1, 1, 1), (3, 17, 111), (1, 111, 1023), (17, 40, 300))  # (M, N, K), besides the tiny preset


def run_gemv_check(console=None) -> int:
    """Without a GPU: skinny_matmul against F.linear through Triton's interpreter (bf16).

    The tiny preset's projections at M = 1 and 3, and a few awkward shapes. Returns 1 if
    any check failed, else 0.
    """
    from onetrip.ops.skinny_matmul import skinny_matmul

    from . import report

    console = console or report.console()
    cases = [(p, m) for p in projections(["tiny"]) for m in (1, 3)]
    cases += [(Projection("-", "awkward", n, k, bias=m == 3), m) for m, n, k in CHECK_SHAPES]
    rows = []
    gen = torch.Generator().manual_seed(0)
    for proj, m in cases:
        x, w, b = _inputs(proj, m, torch.bfloat16, "cpu", gen)
        try:
            result = _check(x, w, b, skinny_matmul(x, w, b))
        except Exception as exc:  # noqa: BLE001 - a crash is a failed check, shown in the table
            result = {"ok": False, "max_err": None, "bound": None, "check_report": harness.error_string(exc)}
        rows.append(("skinny_matmul", f"{proj.preset} {proj.label} M={m}", "bfloat16", result["max_err"],
                     result["bound"], "ok" if result["ok"] else f"FAIL {result['check_report']}"))
    return report.finish_check(console, rows, "gemv-check", "bfloat16",
                               "skinny_matmul was only checked against F.linear")
