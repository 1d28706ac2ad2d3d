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
    """One row per shape: GB/s (% of copy) per provider, the same-bytes copy's GB/s with
    onetrip's % of it (where measured), onetrip / best peer, onetrip's check.

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
    size_copy = any(r.get("size_copy_gbs") for r in recs)
    if size_copy:  # what a plain element-wise kernel of the same bytes reaches, timed alike
        table.add_column("copy, same bytes", justify="right")
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
        extra = []
        if size_copy:
            first = next(iter(by.values()))
            gbs, pct = first.get("size_copy_gbs"), mine.get("pct_of_size_copy")
            extra = [f"{gbs:.0f}" + (f" (onetrip {pct:.0f}%)" if pct else "") if gbs else "—"]
        table.add_row(shape, *(_rate(by.get(p)) for p in providers), *extra, ratio, check)
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


def finish_check(con, rows: list[tuple], bench: str, dtype: str, checked: str) -> int:
    """The end of every bench's CPU check: the table, what was (and was not) done, the JSON
    summary line scripts read, and the exit status. ``checked`` completes "This machine has
    none, so ..." (e.g. "skinny_matmul was only checked against F.linear")."""
    import json

    failed = sum(r[5].startswith("FAIL") for r in rows)  # "not written yet" is no failure
    print_check_table(con, rows)
    con.print(f"Timings need a CUDA GPU. This machine has none, so {checked}, through Triton's interpreter.")
    print(json.dumps({"bench": bench, "dtype": dtype, "checks": len(rows), "failed": failed}), flush=True)
    return 1 if failed else 0


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


# ---------------------------------------------------------------------------- attention suites


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:.0f}"


def _cell(r: dict | None, fmt) -> str:
    """A provider's figure, or why there is none (details are listed under the table)."""
    if r is None:
        return "—"
    if r["error"]:
        return "[red]error[/]"
    if r["skipped"]:
        return "[yellow]n/a[/]" if r["skipped"].startswith("n/a") else "[yellow]skipped[/]"
    if r["median_ms"] is None:
        return "—"
    return fmt(r) + ("" if r["graph"] else " [yellow]no graph[/]")


def _diff(r: dict | None) -> str:
    if not r or r.get("max_diff") is None:
        return "—"
    verdict = "" if r.get("ok") is None else (" [green]ok[/]" if r["ok"] else " [red]FAIL[/]")
    return f"{r['max_diff']:.1e} ({r['diff_base'].removeprefix('sdpa-')}){verdict}"


def _why_not(con, recs: list[dict]) -> None:
    """Errors one per line; skips grouped by provider and reason."""
    skips: dict[tuple[str, str], list[str]] = {}
    for r in recs:
        if r["error"]:
            con.print(f"  [red]{r['provider']} {r['cell']}[/]: {r['error']}", highlight=False)
        elif r["skipped"]:
            skips.setdefault((r["provider"], r["skipped"]), []).append(r["cell"])
    for (provider, why), where in skips.items():
        con.print(f"  [yellow]{provider} skipped[/] ({len(where)} cell{'s' * (len(where) > 1)}: "
                  f"{', '.join(where[:4])}{', ...' if len(where) > 4 else ''}): {why}", highlight=False)


def print_attention_table(con, records: list[dict], providers) -> None:
    """One row per cell: TFLOP/s per provider, onetrip / FA2 and / cuDNN, onetrip's max diff
    (and its ok) against the base, and the peak extra memory of onetrip and the reference."""
    from rich.table import Table

    if not records:
        return
    table = Table(title=f"attention: TFLOP/s, {records[0]['dtype']}", title_justify="left")
    table.add_column("cell")
    for name in (*providers, "onetrip / FA2", "onetrip / cuDNN", "onetrip diff (vs)", "peak MiB onetrip / eager"):
        table.add_column(name, justify="right")
    for cell in dict.fromkeys(r["cell"] for r in records):
        by = {r["provider"]: r for r in records if r["cell"] == cell}
        mine, eager = by.get("onetrip") or {}, by.get("eager") or {}
        ratio = lambda key: "—" if not mine.get(key) else f"{mine[key]:.2f}x"
        table.add_row(cell, *(_cell(by.get(p), lambda r: f"{r['tflops']:.0f}") for p in providers),
                      ratio("vs_fa2"), ratio("vs_cudnn"), _diff(mine),
                      f"{_mib(mine.get('peak_extra_bytes'))} / {_mib(eager.get('peak_extra_bytes'))}")
    con.print(table)
    _why_not(con, records)


def print_decode_tables(con, records: list[dict], providers, append_providers) -> None:
    """Decode: one row per cell, GB/s (% of copy) per provider, what a plain read of the cell's
    K and V reaches (with onetrip's % of it), onetrip's split count, its
    speedup over the fastest peer, its max diff, the peak extra memory of SDPA and the
    naive version (a copy of the cache would show here). Then the same for append_kv."""
    from rich.table import Table

    rate = lambda r: f"{r['gbs']:.0f} ({r['pct_of_copy']:.0f}%)"
    for kind, names in (("decode", providers), ("append_kv", append_providers)):
        recs = [r for r in records if r["kind"] == kind]
        if not recs:
            continue
        table = Table(title=f"{kind}: GB/s (% of copy bandwidth), {recs[0]['dtype']}", title_justify="left")
        table.add_column("cell")
        extra = ("plain read (onetrip's %)", "splits", "onetrip / best peer", "onetrip diff (vs)",
                 "peak MiB sdpa / eager")
        for name in (*names, *(extra if kind == "decode" else extra[2:4])):
            table.add_column(name, justify="right")
        for cell in dict.fromkeys(r["cell"] for r in recs):
            by = {r["provider"]: r for r in recs if r["cell"] == cell}
            mine = by.get("onetrip") or {}
            sp = mine.get("speedup_vs_best_peer")
            row = [cell, *(_cell(by.get(p), rate) for p in names)]
            if kind == "decode":
                read, pct = mine.get("read_gbs"), mine.get("pct_of_read")
                row.append(f"{read:.0f}" + (f" ({pct:.0f}%)" if pct else "") if read else "—")
                row.append("—" if mine.get("num_splits") is None else str(mine["num_splits"]))
            row += [f"{sp:.2f}x vs {mine['best_peer']}" if sp else "—", _diff(mine)]
            if kind == "decode":
                row.append(f"{_mib((by.get('sdpa') or {}).get('peak_extra_bytes'))} / "
                           f"{_mib((by.get('eager') or {}).get('peak_extra_bytes'))}")
            table.add_row(*row)
        con.print(table)
        _why_not(con, recs)
