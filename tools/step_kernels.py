"""Per-kernel times of a decode step from a profiler trace of CUDA-graph replays.

    python tools/step_kernels.py TRACE.json[.gz] [--per N]

``onetrip profile --model PRESET --backend fused --trace-out T.json`` records each kernel
of the replayed graphs. Replays run back to back, and with programmatic dependent launch a
kernel starts before the previous one ends and waits, so a kernel's own duration overstates
what it costs. What it costs the step is the time from the previous kernel's end to its own
end; this prints that (median over the recorded steps) for each position of the step, with
the grid and registers, then the per-layer median of each kernel of a layer. ``--per``: the
kernels in a step (default: found as the shortest period of the kernel-name sequence).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from onetrip.profile.trace import iter_events  # noqa: E402 - streams .json / .json.gz


def _kernels(path: Path) -> list[dict]:
    return sorted((e for e in iter_events(path) if e.get("cat") == "kernel"), key=lambda e: e["ts"])


def _period(names: list[str]) -> int:
    for p in range(1, len(names) // 2 + 1):
        if len(names) % p == 0 and all(names[i] == names[i % p] for i in range(len(names))):
            return p
    return len(names)


def step_table(ev: list[dict], per: int) -> list[tuple]:
    """(position, name, us from the previous kernel's end, programs, registers) per position."""
    steps = [ev[i * per:(i + 1) * per] for i in range(len(ev) // per)]
    rows = []
    for i in range(per):
        costs = []
        for s in steps:
            end = s[i]["ts"] + s[i]["dur"]
            prev = s[i - 1]["ts"] + s[i - 1]["dur"] if i else s[i]["ts"]
            costs.append(end - prev)
        a = steps[0][i]["args"]
        grid = a.get("grid", [0, 1, 1])
        rows.append((i, steps[0][i]["name"][:40], statistics.median(costs), grid[0] * grid[1] * grid[2],
                     a.get("registers per thread")))
    return rows


def per_layer(rows: list[tuple], first: int = 2, L: int = 5) -> tuple[list[int], list[tuple[str, float]]]:
    """The layers' first positions in ``step_table``'s rows (every L from ``first`` whose
    second kernel is the first layer's: one attention kernel a layer), and each of a
    layer's L kernels with its median cost over them."""
    starts = [j for j in range(first, len(rows) - L + 1, L) if rows[j + 1][1] == rows[first + 1][1]]
    return starts, [(rows[first + k][1], statistics.median(rows[j + k][2] for j in starts
                                                            if rows[j + k][1] == rows[first + k][1]))
                    for k in range(L)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--per", type=int, default=0, help="kernels per step (default: the name sequence's period)")
    ap.add_argument("--layer", type=int, default=5, help="kernels per layer (the fused batch-1 step: 5)")
    ap.add_argument("--first", type=int, default=2, help="position of the first layer's first kernel")
    args = ap.parse_args()
    ev = _kernels(args.trace)
    per = args.per or _period([e["name"] for e in ev])
    rows = step_table(ev, per)
    print(f"{len(ev)} kernels, {len(ev) // per} steps of {per}; step {sum(r[2] for r in rows):.1f} us")
    for r in rows:
        print(f"{r[0]:4d} {r[1]:40s} {r[2]:8.2f} us  {r[3]:6d} programs  {r[4]} registers")
    layers, medians = per_layer(rows, args.first, args.layer)
    print(f"per layer (median over {len(layers)} layers):")
    for k, (name, us) in enumerate(medians):
        print(f"  {k} {name:40s} {us:8.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
