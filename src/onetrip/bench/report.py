"""Benchmark output for people (rich tables) and for scripts (one JSON summary line)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path


def console():
    """A rich console; 150 columns wide when the output is a file or a pipe (rich would use 80)."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=150)


def _rate(r: dict | None) -> str:
    if r is None:
        return "—"
    if r["error"]:
        return "[red]error[/]"
    graph = "" if r["graph"] else " [yellow]no graph[/]"
    return f"{r['gbs']:.0f} ({r['pct_of_copy']:.0f}%){graph}"


def print_op_table(con, records: list[dict], op: str, providers: list[str]) -> None:
    """One row per shape: GB/s (% of copy) per provider, onetrip / best peer, onetrip's check.

    Errors are listed under the table, one line each.
    """
    from rich.table import Table

    recs = [r for r in records if r["op"] == op]
    if not recs:
        return
    table = Table(title=f"{op}: GB/s (% of copy bandwidth), {recs[0]['dtype']}", title_justify="left")
    table.add_column("shape")
    for p in providers:
        table.add_column(p, justify="right")
    table.add_column("onetrip / best peer", justify="right")
    table.add_column("check (max err / bound)")
    for shape in dict.fromkeys(r["shape"] for r in recs):
        by = {r["provider"]: r for r in recs if r["shape"] == shape}
        mine = by.get("onetrip") or {}
        sp = mine.get("speedup_vs_best_peer")
        ratio = f"{sp:.2f}x vs {mine['best_peer']}" if sp else "—"
        if mine.get("ok") is None:
            check = "—"
        else:
            verdict = "[green]ok[/]" if mine["ok"] else "[red]FAIL[/]"
            check = f"{verdict} {mine['max_err']:.1e} / {mine['bound']:.1e}"
        table.add_row(shape, *(_rate(by.get(p)) for p in providers), ratio, check)
    con.print(table)
    for r in recs:
        if r["error"]:
            con.print(f"  [red]{r['provider']} {r['shape']}[/]: {r['error']}", highlight=False)
        elif r["ok"] is False:
            con.print(f"  [red]onetrip {r['shape']}[/]: {r['check_report']}", highlight=False)


def print_check_table(con, rows: list[tuple]) -> None:
    """rows: (op, shape, dtype, max_err, bound, verdict)."""
    from rich.table import Table

    table = Table(title="onetrip against its references (Triton interpreter)", title_justify="left")
    for name in ("op", "shape", "dtype", "max err", "bound", "ok"):
        table.add_column(name, justify="right" if name in ("max err", "bound") else "left")
    for op, shape, dtype, err, bound, verdict in rows:
        style = "green" if verdict == "ok" else ("yellow" if verdict.startswith("not") else "red")
        table.add_row(op, shape, dtype, "—" if err is None else f"{err:.2e}", "—" if bound is None else f"{bound:.2e}",
                      f"[{style}]{verdict}[/]")
    con.print(table)


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summary(records: list[dict], meta: dict, json_path: Path, skipped: list[str] = ()) -> dict:
    """The one-line summary: per op, onetrip's median % of copy and its speedup over the best peer.

    speedup_geomean / speedup_min: geometric mean and minimum over shapes of
    speedup_vs_best_peer. checks_failed counts onetrip records failing the accuracy rule;
    onetrip_errors those where onetrip could not run at all.
    """
    mine = [r for r in records if r["provider"] == "onetrip"]
    per_op = {}
    for op in dict.fromkeys(r["op"] for r in mine):
        rs = [r for r in mine if r["op"] == op]
        sp = [r["speedup_vs_best_peer"] for r in rs if r["speedup_vs_best_peer"]]
        pct = [r["pct_of_copy"] for r in rs if r["pct_of_copy"] is not None]
        per_op[op] = {
            "shapes": len(rs),
            "pct_of_copy_median": round(statistics.median(pct), 1) if pct else None,
            "speedup_geomean": round(_geomean(sp), 3) if sp else None,
            "speedup_min": round(min(sp), 3) if sp else None,
        }
    return {
        "bench": "ops",
        "gpu": meta.get("gpu"),
        "dtype": meta.get("dtype"),
        "copy_gbs": round(meta["copy_gbs"], 1) if meta.get("copy_gbs") else None,
        "checks_failed": sum(r["ok"] is False for r in mine),
        "onetrip_errors": sum(bool(r["error"]) for r in mine),
        "skipped": list(skipped),
        "results": str(json_path),
        "ops": per_op,
    }
