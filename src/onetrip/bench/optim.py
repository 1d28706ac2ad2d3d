"""``onetrip bench optim``: one AdamW step over a Llama-3.1-8B-shaped parameter list.

The parameters are the 8B model's tensors (embedding, LM head, final norm and the first
``layers`` decoder layers: q, k, v, o, gate, up, down, two norms; 8 layers = 2.8 B
parameters unless told otherwise, so that parameters, gradients and state fit on one GPU
beside torch's), random, with random gradients. Configurations:

    fp32         float32 parameters and gradients: torch.optim.AdamW fused=True, foreach=True,
                 and onetrip.optim.AdamW
    bf16+master  bfloat16 parameters and gradients with float32 master weights and state:
                 onetrip.optim.AdamW(master_weights=True) (torch's AdamW keeps bf16 state for
                 bf16 parameters, a different optimizer, so it is not a peer here)

Bytes per parameter (read + write, each once): fp32 4 (p) + 4 (g) + 8 (m, v) read,
4 + 8 written = 28; bf16+master 2 (p) + 2 (g) + 12 (master, m, v) read, 2 + 12 written = 30.
A step is timed as a CUDA-graph replay where the optimizer allows capture (torch's with
``capturable=True``), else called directly; L2 is flushed before each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from . import harness

LAYERS = 8
BYTES_PER_PARAM = {"fp32": 28, "bf16+master": 30}


def llama_8b_shapes(layers: int = LAYERS) -> list[tuple[int, ...]]:
    """Parameter shapes of Llama-3.1-8B's embedding, LM head, final norm and ``layers`` layers."""
    from onetrip.models.config import get_config

    c = get_config("llama-3.1-8b")
    h, hd, f = c.hidden_size, c.head_dim, c.intermediate_size
    layer = [(c.num_heads * hd, h), (c.num_kv_heads * hd, h), (c.num_kv_heads * hd, h), (h, c.num_heads * hd),
             (f, h), (f, h), (h, f), (h,), (h,)]
    return [(c.vocab_size, h), (c.vocab_size, h), (h,)] + layer * layers


def make_params(shapes, dtype: torch.dtype, seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    params = []
    for s in shapes:
        p = torch.nn.Parameter(torch.randn(s, device="cuda", generator=gen).mul_(0.02).to(dtype))
        p.grad = torch.randn(s, device="cuda", generator=gen).mul_(1e-3).to(dtype)
        params.append(p)
    return params


def providers(config: str) -> dict[str, Callable]:
    """name -> (params -> optimizer)."""
    from onetrip.optim import AdamW

    kw = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    if config == "fp32":
        return {"torch fused": lambda ps: torch.optim.AdamW(ps, fused=True, capturable=True, **kw),
                "torch foreach": lambda ps: torch.optim.AdamW(ps, foreach=True, capturable=True, **kw),
                "onetrip": lambda ps: AdamW(ps, **kw)}
    return {"onetrip": lambda ps: AdamW(ps, master_weights=True, **kw)}


def bench_config(config: str, layers: int, copy_gbs: float, flush: torch.Tensor) -> list[dict]:
    shapes = llama_8b_shapes(layers)
    n = sum(torch.Size(s).numel() for s in shapes)
    nbytes = BYTES_PER_PARAM[config] * n
    dtype = torch.float32 if config == "fp32" else torch.bfloat16
    records = []
    for name, make in providers(config).items():
        rec = {"config": config, "provider": name, "params": n, "tensors": len(shapes), "bytes": nbytes,
               "median_ms": None, "p20_ms": None, "p80_ms": None, "graph": None, "graph_error": None, "gbs": None,
               "pct_of_copy": None, "speedup_vs_best_peer": None, "error": None}
        records.append(rec)
        params = opt = None
        try:
            params = make_params(shapes, dtype)
            opt = make(params)
            opt.step()  # allocates the state
            t = harness.time_ms(opt.step, reps=30, warmup=3, flush=flush)
            rec.update(median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms, graph=t.graph,
                       graph_error=t.graph_error, gbs=harness.gbs(nbytes, t.median_ms))
            rec["pct_of_copy"] = 100 * rec["gbs"] / copy_gbs
        except Exception as exc:  # noqa: BLE001 - recorded, the suite goes on
            rec["error"] = harness.error_string(exc)
        del params, opt
        torch.cuda.empty_cache()
    peers = [r for r in records if r["provider"] != "onetrip" and r["median_ms"]]
    for r in records:
        if r["provider"] == "onetrip" and r["median_ms"] and peers:
            r["speedup_vs_best_peer"] = min(p["median_ms"] for p in peers) / r["median_ms"]
    return records


def run_optim_bench(out_dir: Path, layers: int = LAYERS, console=None) -> list[dict]:
    """Both configurations on the current CUDA device; JSON and CSV under ``out_dir`` named
    ``optim-<gpu>-<YYYYMMDD>``; a table, then one JSON summary line."""
    from rich.table import Table

    from . import report

    console = console or report.console()
    device = torch.device("cuda")
    meta = {**harness.device_info(device), "suite": "optim", "layers": layers,
            "timing": "median of 30 CUDA-graph replays of optimizer.step() (direct calls where capture fails), "
            "L2 flushed before each", "bytes": "per parameter: fp32 28, bf16+master 30 (see onetrip.bench.optim)"}
    meta["copy_gbs"] = harness.copy_bandwidth_gbs(device)
    stem = Path(out_dir) / f"optim-{harness.slug(meta['gpu'])}-{meta['date'][:10].replace('-', '')}"
    flush = harness.new_flush_buffer(device)
    records = []
    for config in BYTES_PER_PARAM:
        records += bench_config(config, layers, meta["copy_gbs"], flush)
        harness.write_results(records, meta, stem)
    json_path, csv_path = harness.write_results(records, meta, stem)
    table = Table(title=f"AdamW step, Llama-3.1-8B shapes ({layers} layers, {records[0]['params'] / 1e9:.2f} B "
                  f"parameters)", title_justify="left")
    for col in ("config", "provider", "ms", "GB/s (% copy)", "onetrip / best peer", "graph"):
        table.add_column(col, justify="left" if col in ("config", "provider") else "right")
    for r in records:
        if r["error"]:
            table.add_row(r["config"], r["provider"], f"[red]{r['error'][:70]}[/]", "", "", "")
            continue
        table.add_row(r["config"], r["provider"], f"{r['median_ms']:.2f}", f"{r['gbs']:.0f} ({r['pct_of_copy']:.0f}%)",
                      f"{r['speedup_vs_best_peer']:.2f}x" if r["speedup_vs_best_peer"] else "—",
                      "yes" if r["graph"] else "no")
    console.print(table)
    console.print(f"wrote {json_path}, {csv_path}")
    print(json.dumps({"bench": "optim", "gpu": meta["gpu"], "results": str(json_path),
                      "onetrip": {r["config"]: {"pct_of_copy": r["pct_of_copy"],
                                                "speedup_vs_best_peer": r["speedup_vs_best_peer"]}
                                  for r in records if r["provider"] == "onetrip"}}), flush=True)
    return records
