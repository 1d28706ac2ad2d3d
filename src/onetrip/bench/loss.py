"""``onetrip bench loss``: the loss of a language model, forward and backward, against its peers.

Two parts, bf16, one run:

- **cross_entropy** over (tokens, vocab) logits, vocabularies 32000 .. 262144 with
  tokens * vocab = 2**28 (512 MiB of bf16 logits): fwd+bwd time, GB/s with bytes = logits
  read once + their gradient written once (2 x tokens x vocab x 2), % of copy bandwidth, and
  the peak memory the call adds. Providers: eager (``F.cross_entropy(logits.float(), t)``,
  what a Hugging Face model runs), torch.compile of it, Liger-Kernel's
  ``LigerCrossEntropyLoss`` (writes the gradient over the logits), onetrip, and onetrip with
  ``inplace_backward=True`` (the same trade as Liger's).
- **linear_cross_entropy** at (tokens, hidden, vocab) = (8192, 4096, 128256),
  (16384, 2048, 151936), (4096, 8192, 262144): fwd+bwd time, TFLOP/s of the three matmuls
  (6 x tokens x hidden x vocab FLOPs) and peak memory. Providers: eager (x @ W.T, upcast,
  cross-entropy, autograd), torch.compile of it, Liger's ``LigerFusedLinearCrossEntropyLoss``
  (default: the weight gradient accumulated in bf16; and ``accum_dtype=float32``), onetrip
  (float32 accumulation, the default) and onetrip with ``accumulation="weight_dtype"``.

Peak memory is ``torch.cuda.max_memory_allocated`` during one fwd+bwd call minus what was
allocated before it (inputs excluded, the gradients it returns included).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from . import harness

CE_VOCABS = (32000, 50257, 128256, 151936, 262144)
CE_ELEMENTS = 1 << 28
LCE_SHAPES = ((8192, 4096, 128256), (16384, 2048, 151936), (4096, 8192, 262144))
QUICK_CE_VOCABS = (32000, 128256, 262144)


def _eager_ce(logits, target):
    return F.cross_entropy(logits.float(), target)


def _eager_lce(x, weight, target):
    return F.cross_entropy((x @ weight.T).float(), target)


def ce_providers(compiled: Callable) -> dict[str, Callable]:
    """name -> loss(logits, target), the logits leaf requiring a gradient."""
    import onetrip

    providers = {"eager": _eager_ce, "torch.compile": compiled}
    if importlib.util.find_spec("liger_kernel") is not None:
        from liger_kernel.transformers import LigerCrossEntropyLoss

        providers["liger"] = LigerCrossEntropyLoss()
    providers["onetrip"] = onetrip.cross_entropy
    providers["onetrip inplace"] = lambda logits, target: onetrip.cross_entropy(logits, target, inplace_backward=True)
    return providers


def lce_providers(compiled: Callable) -> dict[str, Callable]:
    """name -> loss(x, weight, target), x and weight leaves requiring gradients."""
    import onetrip

    providers = {"eager": _eager_lce, "torch.compile": compiled}
    if importlib.util.find_spec("liger_kernel") is not None:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        bf16_acc = LigerFusedLinearCrossEntropyLoss()
        providers["liger"] = lambda x, w, t: bf16_acc(w, x, t)
        try:
            fp32_acc = LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.float32)
            providers["liger fp32-acc"] = lambda x, w, t: fp32_acc(w, x, t)
        except TypeError:  # a Liger without accum_dtype
            pass
    providers["onetrip"] = onetrip.linear_cross_entropy
    providers["onetrip weight-dtype-acc"] = lambda x, w, t: onetrip.linear_cross_entropy(
        x, w, t, accumulation="weight_dtype")
    return providers


def _time_step(loss_fn: Callable, leaves: tuple, rest: tuple, flush: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """Time loss + autograd.grad; returns (timing fields, the loss of one call)."""

    def step():
        return torch.autograd.grad(loss_fn(*leaves, *rest), leaves)

    loss = loss_fn(*(t.detach().clone().requires_grad_(True) for t in leaves), *rest).detach()
    _, peak = harness.peak_extra_bytes(step, leaves[0].device)
    t = harness.time_budgeted(step, flush=flush, budget_ms=1500.0)
    return {"median_ms": t.median_ms, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms, "graph": t.graph,
            "graph_error": t.graph_error, "peak_extra_bytes": peak}, loss


def _cell(part: str, shape: str, provider: str, fields: dict) -> dict:
    return {"part": part, "shape": shape, "provider": provider, "median_ms": None, "p20_ms": None, "p80_ms": None,
            "graph": None, "graph_error": None, "peak_extra_bytes": None, "loss_diff_vs_eager": None,
            "speedup_vs_eager": None, "error": None, **fields}


def bench_ce(vocab: int, copy_gbs: float, compiled: Callable, flush: torch.Tensor) -> list[dict]:
    tokens = CE_ELEMENTS // vocab
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(tokens, vocab, device="cuda", generator=gen).to(torch.bfloat16)
    target = torch.randint(0, vocab, (tokens,), device="cuda", generator=gen)
    nbytes = 2 * tokens * vocab * logits.itemsize
    records, eager_loss = [], None
    for name, fn in ce_providers(compiled).items():
        rec = _cell("cross_entropy", f"{tokens}x{vocab}", name, {"tokens": tokens, "vocab": vocab, "bytes": nbytes,
                                                                  "gbs": None, "pct_of_copy": None})
        records.append(rec)
        try:
            leaf = logits.clone().requires_grad_(True)
            fields, loss = _time_step(fn, (leaf,), (target,), flush)
            rec.update(fields)
            rec["gbs"] = harness.gbs(nbytes, rec["median_ms"])
            rec["pct_of_copy"] = 100 * rec["gbs"] / copy_gbs
            eager_loss = loss if name == "eager" else eager_loss
            if eager_loss is not None:
                rec["loss_diff_vs_eager"] = float((loss.float() - eager_loss.float()).abs())
        except Exception as exc:  # noqa: BLE001 - recorded, the suite goes on
            rec["error"] = harness.error_string(exc)
        torch.cuda.empty_cache()
    _speedups(records)
    return records


def bench_lce(shape: tuple[int, int, int], compiled: Callable, flush: torch.Tensor) -> list[dict]:
    tokens, hidden, vocab = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(tokens, hidden, device="cuda", generator=gen)).to(torch.bfloat16)
    w = (torch.randn(vocab, hidden, device="cuda", generator=gen) * hidden ** -0.5).to(torch.bfloat16)
    target = torch.randint(0, vocab, (tokens,), device="cuda", generator=gen)
    flops = 6 * tokens * hidden * vocab
    records, eager_loss = [], None
    for name, fn in lce_providers(compiled).items():
        rec = _cell("linear_cross_entropy", f"{tokens}x{hidden}x{vocab}", name,
                    {"tokens": tokens, "hidden": hidden, "vocab": vocab, "flops": flops, "tflops": None})
        records.append(rec)
        try:
            leaves = (x.clone().requires_grad_(True), w.clone().requires_grad_(True))
            fields, loss = _time_step(fn, leaves, (target,), flush)
            rec.update(fields)
            rec["tflops"] = flops / 1e12 / (rec["median_ms"] / 1e3)
            eager_loss = loss if name == "eager" else eager_loss
            if eager_loss is not None:
                rec["loss_diff_vs_eager"] = float((loss.float() - eager_loss.float()).abs())
        except Exception as exc:  # noqa: BLE001
            rec["error"] = harness.error_string(exc)
        torch.cuda.empty_cache()
    _speedups(records)
    return records


def _speedups(records: list[dict]) -> None:
    eager = next((r for r in records if r["provider"] == "eager" and r["median_ms"]), None)
    for r in records:
        if eager and r["median_ms"]:
            r["speedup_vs_eager"] = eager["median_ms"] / r["median_ms"]


def _table(console, records: list[dict], part: str, rate_key: str, rate_name: str) -> None:
    from rich.table import Table

    recs = [r for r in records if r["part"] == part]
    if not recs:
        return
    table = Table(title=f"{part}: fwd+bwd, bf16", title_justify="left")
    for col in ("shape", "provider", "ms", rate_name, "vs eager", "peak MiB", "|loss - eager|"):
        table.add_column(col, justify="left" if col in ("shape", "provider") else "right")
    for r in recs:
        if r["error"]:
            table.add_row(r["shape"], r["provider"], f"[red]{r['error'][:60]}[/]", "", "", "", "")
            continue
        rate = r.get(rate_key)
        extra = f" ({r['pct_of_copy']:.0f}%)" if rate_key == "gbs" and r.get("pct_of_copy") else ""
        table.add_row(r["shape"], r["provider"], f"{r['median_ms']:.3f}", f"{rate:.0f}{extra}" if rate else "—",
                      f"{r['speedup_vs_eager']:.2f}x" if r["speedup_vs_eager"] else "—",
                      f"{r['peak_extra_bytes'] / 2**20:.0f}" if r["peak_extra_bytes"] is not None else "—",
                      f"{r['loss_diff_vs_eager']:.1e}" if r["loss_diff_vs_eager"] is not None else "—")
    console.print(table)


def run_loss_bench(out_dir: Path, quick: bool, console=None) -> list[dict]:
    """Both parts on the current CUDA device; JSON, CSV and PNG under ``out_dir`` named
    ``loss-<gpu>-bf16-<YYYYMMDD>``; two tables, then one JSON summary line."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import report

    console = console or report.console()
    device = torch.device("cuda")
    meta = {**harness.device_info(device), "suite": "loss", "dtype": "bf16", "quick": quick,
            "timing": "median of CUDA-graph replays of loss + torch.autograd.grad (direct calls where capture "
            "fails), L2 flushed before each",
            "bytes": "cross_entropy: logits read once + gradient written once; 1 GB = 1e9 bytes"}
    meta["copy_gbs"] = harness.copy_bandwidth_gbs(device)
    stem = Path(out_dir) / f"loss-{harness.slug(meta['gpu'])}-bf16-{meta['date'][:10].replace('-', '')}"
    flush = harness.new_flush_buffer(device)
    vocabs = QUICK_CE_VOCABS if quick else CE_VOCABS
    records: list[dict] = []
    columns = (TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("loss", total=len(vocabs) + len(LCE_SHAPES))
        compiled = torch.compile(_eager_ce, dynamic=False)
        for vocab in vocabs:
            progress.update(task, description=f"cross_entropy V={vocab}")
            records += bench_ce(vocab, meta["copy_gbs"], compiled, flush)
            harness.write_results(records, meta, stem)
            progress.advance(task)
        compiled = torch.compile(_eager_lce, dynamic=False)
        for shape in LCE_SHAPES:
            progress.update(task, description=f"linear_cross_entropy {shape}")
            records += bench_lce(shape, compiled, flush)
            harness.write_results(records, meta, stem)
            progress.advance(task)
    json_path, csv_path = harness.write_results(records, meta, stem)
    png = plot(records, meta, stem.with_suffix(".png"))
    _table(console, records, "cross_entropy", "gbs", "GB/s (% copy)")
    _table(console, records, "linear_cross_entropy", "tflops", "TFLOP/s")
    console.print(f"wrote {json_path}, {csv_path}, {png}")
    mine = [r for r in records if r["provider"] == "onetrip"]
    print(json.dumps({"bench": "loss", "gpu": meta["gpu"], "results": str(json_path),
                      "errors": sum(bool(r["error"]) for r in records),
                      "onetrip": {r["shape"]: {"ms": r["median_ms"], "speedup_vs_eager": r["speedup_vs_eager"],
                                               "peak_mib": (r["peak_extra_bytes"] or 0) / 2**20} for r in mine}}),
          flush=True)
    return records


def plot(records: list[dict], meta: dict, path: Path) -> Path:
    """Cross-entropy GB/s against vocabulary; linear cross-entropy time and peak memory per shape."""
    style = {p: dict(color=c, marker=m) for p, (c, m) in harness.PROVIDER_STYLE.items()}

    def look(series):
        return style.get(series.split(" ")[0] if series.startswith("onetrip") else series,
                         dict(color="#2ca02c", marker="x")) | ({"linestyle": "--"} if " " in series else {})

    rows = [r for r in records if not r["error"]]
    shown = ([{**r, "panel": "cross_entropy fwd+bwd: GB/s", "x": r["vocab"], "y": r["gbs"]}
              for r in rows if r["part"] == "cross_entropy"]
             + [{**r, "panel": "linear_cross_entropy fwd+bwd: ms", "x": r["shape"], "y": r["median_ms"]}
                for r in rows if r["part"] == "linear_cross_entropy"]
             + [{**r, "panel": "linear_cross_entropy: peak GiB", "x": r["shape"],
                 "y": (r["peak_extra_bytes"] or 0) / 2**30} for r in rows if r["part"] == "linear_cross_entropy"])
    return harness.plot_lines(shown, path, panel=lambda r: r["panel"], x=lambda r: r["x"], y="y",
                              series=lambda r: r["provider"], style=look, ylabel="",
                              title=f"{meta['gpu']} · bf16 · {meta['date'][:10]}")
