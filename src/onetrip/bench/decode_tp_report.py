"""The tables of ``onetrip bench decode --tp N``: the GPU run's, and the CPU check's."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def _num(x, fmt: str, suffix: str = "") -> str:
    return "—" if x is None else format(x, fmt) + suffix


def print_tp_table(con, records: list[dict], meta: dict, tp1: Optional[Path] = None) -> None:
    """One table per preset: a row per (batch, provider) with tok/s, ms per step, % of the
    step floor, the all-reduces' time a layer and share of the step, the ratios to
    gptfast-tp and to TP 1, and the greedy tokens' agreement."""
    from rich.table import Table

    world = meta.get("tp")
    for preset in dict.fromkeys(r["preset"] for r in records):
        rows = [r for r in records if r["preset"] == preset]
        t = Table(title=f"{preset}: decode at TP {world}, {meta.get('dtype')}, prompt {meta.get('prompt')}, "
                        f"{meta.get('new_tokens')} new tokens · {meta.get('gpu')} · copy "
                        f"{meta.get('copy_gbs', 0):.0f} GB/s per GPU (slowest)")
        for col in ("batch", "provider", "tok/s", "ms / step", "% of floor", "AR us / layer", "AR % of step",
                    "vs gptfast-tp", "vs TP 1", "same prefix", "ranks agree"):
            t.add_column(col, justify="left" if col == "provider" else "right", no_wrap=col == "provider")
        for r in rows:
            if "error" in r:
                t.add_row(str(r["batch"]), r["provider"], "[red]error[/]", *[""] * 8)
                continue
            t.add_row(str(r["batch"]), r["provider"], f"{r['tok_s']:.0f}", f"{r['ms_per_step']:.3f}",
                      _num(r.get("pct_of_floor"), ".0f", "%"), _num(r.get("allreduce_us_per_layer"), ".1f"),
                      _num(r.get("allreduce_pct_of_step"), ".0f", "%"), _num(r.get("vs_gptfast"), ".2f", "x"),
                      _num(r.get("vs_tp1"), ".2f", "x"), f"{r['same_prefix']}/{r['new_tokens']}",
                      "yes" if r.get("ranks_agree") else "[red]NO[/]")
        con.print(t)
        for r in rows:
            if "error" in r:
                con.print(f"  [red]{r['provider']} batch {r['batch']}[/]: {r['error']}", highlight=False)
        floors = {r["batch"]: r for r in rows if r.get("floor_ms")}
        for b, r in floors.items():
            con.print(f"  floor at batch {b}: {r['floor_ms']:.3f} ms a step = {r['limit_tok_s']:.0f} tok/s "
                      f"({r['bytes_per_rank'] / 1e9:.2f} GB a GPU: its weights + its KV cache at the mean length, "
                      f"over its copy bandwidth; the slowest GPU)")
    con.print("  AR: a layer's two (batch, hidden) all-reduces timed alone in a CUDA graph, as each provider runs "
              "them (gptfast-tp: NCCL; onetrip-tp-nccl: NCCL + add + norm; onetrip-tp: the fused op); % of step: "
              "layers x that over the step time.")
    if tp1:
        con.print(f"  vs TP 1: tok/s over the TP-1 run in {tp1.name} (another invocation of the same build, this day).")
    elif world and world > 1:
        con.print("  vs TP 1: no TP-1 results of this GPU and day in the results folder; run "
                  "`onetrip bench decode --tp 1` with the same options first.")
    con.print("  same prefix: greedy tokens equal to the first provider's before the first difference (shortest "
              "over the batch); random bf16 weights leave near ties that another reduction order flips.")


def print_check_table(con, world: int, results: dict[str, list[list[int]]], ref: list[list[int]]) -> int:
    """The CPU check: each provider's greedy tokens against the full model's; returns the
    number of providers that differ."""
    from rich.table import Table

    table = Table(title=f"TP decode providers on the tiny preset: {world} gloo processes (CPU, fp32), greedy tokens")
    for col in ("provider", "tokens (sequence 0)", "same as the full model"):
        table.add_column(col)
    table.add_row("full model (one process)", " ".join(map(str, ref[0])), "—")
    bad = 0
    for name, toks in results.items():
        ok = toks == ref
        bad += not ok
        table.add_row(name, " ".join(map(str, toks[0])), "[green]yes[/]" if ok else "[red]NO[/]")
    con.print(table)
    return bad
