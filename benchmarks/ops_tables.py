"""Markdown tables of an ops bench result (``onetrip bench ops``'s JSON), as BENCHMARKS.md
shows them: per op, one row per shape, GB/s (% of copy) per provider, the same-bytes
copy with onetrip's % of it, and onetrip against the best peer.

    python benchmarks/ops_tables.py benchmarks/results/ops-nvidia-h200-bf16-20261122-session14.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PROVIDERS = ("eager", "torch.compile", "liger", "onetrip")


def _cell(r: dict | None) -> str:
    if r is None:
        return "—"
    if r.get("error"):
        return "fails"
    text = f"{r['gbs']:.0f} ({r['pct_of_copy']:.0f}%)"
    return f"**{text}**" if r["provider"] == "onetrip" else text


def tables(data: dict) -> str:
    """The markdown of every op in ``data`` (a results file's JSON)."""
    out = []
    recs = data["results"]
    for op in dict.fromkeys(r["op"] for r in recs):
        mine = [r for r in recs if r["op"] == op]
        provs = [p for p in PROVIDERS if any(r["provider"] == p for r in mine)]
        size_copy = any(r.get("size_copy_gbs") for r in mine)
        head = ["shape", *provs] + (["copy, same bytes (onetrip's %)"] if size_copy else []) + ["onetrip vs best peer"]
        out += [f"**{op}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for shape in dict.fromkeys(r["shape"] for r in mine):
            by = {r["provider"]: r for r in mine if r["shape"] == shape}
            one = by.get("onetrip") or {}
            row = [shape, *(_cell(by.get(p)) for p in provs)]
            if size_copy:
                gbs, pct = one.get("size_copy_gbs"), one.get("pct_of_size_copy")
                row.append(f"{gbs:.0f} ({pct:.0f}%)" if gbs and pct else "—")
            sp = one.get("speedup_vs_best_peer")
            row.append((f"{sp:.3f}x" if sp < 1.01 else f"{sp:.2f}x") + f" ({one['best_peer']})" if sp else "—")
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    print(tables(json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
