"""``onetrip bench attention --backward``: attention's training pass against SDPA's backends.

The cells of ``bench attention`` (16K tokens each; quick: seq 2K and 8K, the bar's range),
per (cell, provider) two records, ``pass``:

    fwd+bwd  one replay of the forward (autograd recording) and ``torch.autograd.grad`` of
             the output against a random upstream gradient
    bwd      fwd+bwd minus the forward alone, timed alike

FLOPs as FlashAttention counts them: the backward 2.5x the forward's (``attention.flops``:
4 * seq_q * seq_k * heads * head_dim per sequence, halved when causal), fwd+bwd 3.5x.
peak_extra_bytes: the memory one fwd+bwd call adds beyond its inputs (gradients included).
Providers: SDPA's FlashAttention-2, cuDNN and memory-efficient backends on (batch, heads,
seq, head_dim) copies made before timing (varlen: one call per sequence), and onetrip's
``flash_attention`` in its default mode (atomic dQ) and with ``deterministic=True``
(``onetrip-det``). The naive reference is not timed here (its backward holds several
S x S tensors).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch

from . import harness
from .attention import SDPA_BACKENDS, STYLE, AttnCell, cells, flops, make_inputs, spans
from .cases import DTYPE_NAMES

PROVIDERS = (*SDPA_BACKENDS, "onetrip-det", "onetrip")  # onetrip-det: deterministic=True
PASSES = {"fwd+bwd": 3.5, "bwd": 2.5}  # FLOPs as multiples of the forward's
QUICK_SEQS = (2048, 8192)


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def forward_call(provider: str, cell: AttnCell, q, k, v):
    """(a zero-argument forward returning a list of outputs, the leaves that get gradients)."""
    if provider.startswith("onetrip"):
        from onetrip.ops import flash_attention

        q, k, v = _leaf(q), _leaf(k), _leaf(v)
        kw = {"causal": cell.causal, "deterministic": provider == "onetrip-det"}
        if cell.lengths:
            cu = torch.tensor([0, *itertools.accumulate(cell.lengths)], dtype=torch.int32, device=q.device)
            n = max(cell.lengths)
            kw.update(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=n, max_seqlen_k=n)
        return (lambda: [flash_attention(q, k, v, **kw)]), (q, k, v)
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = getattr(SDPBackend, SDPA_BACKENDS[provider])
    kw = {"is_causal": cell.causal, "enable_gqa": cell.kv_heads != cell.heads}
    if cell.lengths:
        seqs = [tuple(_leaf(t[a:b].transpose(0, 1).unsqueeze(0)) for t in (q, k, v)) for a, b in spans(cell)]
    else:
        seqs = [tuple(_leaf(t.transpose(1, 2)) for t in (q, k, v))]

    def call():
        with sdpa_kernel(chosen):
            return [F.scaled_dot_product_attention(*s, **kw) for s in seqs]

    return call, tuple(t for s in seqs for t in s)


def bench_cell(cell: AttnCell, dtype: torch.dtype, flush: torch.Tensor, done=lambda provider: None) -> list[dict]:
    device = torch.device("cuda")
    q, k, v = make_inputs(cell, dtype, device, torch.Generator(device=device).manual_seed(0))
    fwd_flops = flops(cell)
    records = []
    for provider in PROVIDERS:
        recs = {p: {**cell.fields(), "dtype": DTYPE_NAMES[dtype], "provider": provider, "pass": p,
                    "flops": int(mult * fwd_flops), "median_ms": None, "p20_ms": None, "p80_ms": None, "graph": None,
                    "tflops": None, "peak_extra_bytes": None, "vs_fa2": None, "vs_cudnn": None, "error": None}
                for p, mult in PASSES.items()}
        records += recs.values()
        try:
            forward, leaves = forward_call(provider, cell, q, k, v)
            outs = forward()
            gen = torch.Generator(device=device).manual_seed(1)
            gos = [torch.randn(o.shape, generator=gen, device=device).to(o.dtype) for o in outs]
            del outs

            def step():
                return torch.autograd.grad(forward(), leaves, gos)

            _, peak = harness.peak_extra_bytes(step, device)
            t_all = harness.time_budgeted(step, flush=flush)
            t_fwd = harness.time_budgeted(forward, flush=flush)
            times = {"fwd+bwd": (t_all.median_ms, t_all.p20_ms, t_all.p80_ms),
                     "bwd": (t_all.median_ms - t_fwd.median_ms, t_all.p20_ms - t_fwd.p20_ms,
                             t_all.p80_ms - t_fwd.p80_ms)}
            for p, rec in recs.items():
                med, p20, p80 = times[p]
                rec.update(median_ms=med, p20_ms=p20, p80_ms=p80, graph=t_all.graph and t_fwd.graph,
                           peak_extra_bytes=peak, tflops=rec["flops"] / (med * 1e9) if med > 0 else None)
        except Exception as exc:  # noqa: BLE001 - recorded, the suite goes on (a backend refusing a cell)
            for rec in recs.values():
                rec["error"] = harness.error_string(exc)
        done(provider)
        torch.cuda.empty_cache()
    for p in PASSES:
        by = {r["provider"]: r for r in records if r["pass"] == p}
        for peer, key in (("sdpa-flash", "vs_fa2"), ("sdpa-cudnn", "vs_cudnn")):
            if by["onetrip"]["tflops"] and by[peer]["tflops"]:
                by["onetrip"][key] = by["onetrip"]["tflops"] / by[peer]["tflops"]
    return records


def backward_cells(quick: bool) -> list[AttnCell]:
    if not quick:
        return cells(False)
    return [c for c in cells(False) if c.kind != "dense" or c.seq in QUICK_SEQS]


def run_attention_backward_bench(dtype: torch.dtype, out_dir: Path, quick: bool, console=None) -> list[dict]:
    """Time the suite's training pass on the current CUDA device; JSON, CSV and PNG under
    ``out_dir`` named ``attention-backward-<gpu>-<dtype>-<YYYYMMDD>``; a table, one JSON line."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from . import report

    console = console or report.console()
    device = torch.device("cuda")
    meta = {**harness.device_info(device), "suite": "attention-backward", "dtype": DTYPE_NAMES[dtype],
            "quick": quick, "timing": "median CUDA-graph replay, L2 flushed before each; bwd = fwd+bwd - fwd",
            "flops": "forward: 4 * seq_q * seq_k * heads * head_dim per sequence, halved when causal; "
                     "bwd 2.5x, fwd+bwd 3.5x"}
    stem = Path(out_dir) / (f"attention-backward-{harness.slug(meta['gpu'])}-{meta['dtype']}-"
                            f"{meta['date'][:10].replace('-', '')}")
    flush = harness.new_flush_buffer(device)
    todo = backward_cells(quick)
    records: list[dict] = []
    columns = (TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("attention --backward", total=len(todo) * len(PROVIDERS))
        for cell in todo:
            progress.update(task, description=f"{cell.label} backward")
            records += bench_cell(cell, dtype, flush, lambda provider: progress.advance(task))
            harness.write_results(records, meta, stem)
    json_path, csv_path = harness.write_results(records, meta, stem)
    png = harness.plot_lines(
        [r for r in records if r["pass"] == "bwd"], stem.with_suffix(".png"),
        panel=lambda r: ("GQA and varlen" if r["kind"] != "dense" else
                         f"backward: head_dim {r['head_dim']}, {'causal' if r['causal'] else 'not causal'}"),
        x=lambda r: r["seq"] if r["kind"] == "dense" else r["kind"], y="tflops", series=lambda r: r["provider"],
        style=lambda p: STYLE.get(p, {"marker": "x"}), ylabel="TFLOP/s (backward)",
        title=f"attention backward · {meta['gpu']} · {meta['dtype']} · {meta['date'][:10]}")
    table = Table(title=f"attention fwd+bwd and bwd, TFLOP/s, {meta['dtype']}", title_justify="left")
    for col in ("cell", "pass", *PROVIDERS, "vs FA2", "vs cuDNN", "onetrip peak MiB"):
        table.add_column(col, justify="left" if col in ("cell", "pass") else "right")
    for cell in dict.fromkeys(r["cell"] for r in records):
        for p in PASSES:
            by = {r["provider"]: r for r in records if r["cell"] == cell and r["pass"] == p}
            me = by["onetrip"]
            table.add_row(cell, p, *("[red]error[/]" if by[x]["error"] else
                                     f"{by[x]['tflops']:.0f}" if by[x]["tflops"] else "—" for x in PROVIDERS),
                          *(f"{me[k]:.2f}x" if me[k] else "—" for k in ("vs_fa2", "vs_cudnn")),
                          f"{me['peak_extra_bytes'] / 2**20:.0f}" if me["peak_extra_bytes"] else "—")
    console.print(table)
    for r in records:
        if r["error"] and r["pass"] == "bwd":
            console.print(f"  [red]{r['provider']} {r['cell']}[/]: {r['error']}", highlight=False)
    console.print(f"wrote {json_path}, {csv_path}, {png}")
    mine = [r for r in records if r["provider"] == "onetrip" and r["pass"] == "bwd"]
    print(json.dumps({"bench": "attention-backward", "gpu": meta["gpu"], "results": str(json_path),
                      "bwd": {r["cell"]: {"tflops": r["tflops"], "vs_fa2": r["vs_fa2"], "vs_cudnn": r["vs_cudnn"]}
                              for r in mine}}), flush=True)
    return records
