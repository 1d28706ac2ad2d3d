"""A/B of norm configs timed exactly as ``onetrip bench ops`` times onetrip: the ops bench's
input sets and calls a replay, the L2 flushed before each of 100 replays, the median; every
variant in one process, interleaved over ``--rounds`` rounds (the order reversed every other
round), so that a machine's drift falls on all alike.

Each variant is this GPU's pick for the shape with some fields replaced (a group's field as
``group.field``); it is timed by putting it in the pick's place (``PICKS_GPU``, or
``FEW_ROWS_GPU`` under its row count), so the op's own launcher, graph capture and PDL run
it. tune_ops.py times kernels back to back on one weight, which the next call finds in the
L2; here, as in the ops bench, every input set has its own weight and bias, so a variant
that changes how they come from HBM reads as it would there (on an H100, ``keep_weight``
off read +0.5 in tune_ops and -1.1 to -2 here and in the ops bench).

    python tools/norm_ab.py --rounds 4 --out ab.json \\
        'layer_norm,64,262144:first1=l2.first_chunks=1|first4=l2.first_chunks=4' \\
        'layer_norm,512,131072:whole=order.half_steps=False'
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from onetrip.bench import harness  # noqa: E402
from onetrip.bench.cases import CASES  # noqa: E402
from onetrip.bench.ops import timing_plan  # noqa: E402
from onetrip.ops import _norm_picks as picks  # noqa: E402
from onetrip.ops import norm  # noqa: E402


def replace_field(cfg, name: str, value):
    """``cfg`` with field ``name`` (a NormConfig field, or a group's as 'group.field') set to ``value``."""
    if "." in name:
        group, field = name.split(".", 1)
        return dataclasses.replace(cfg, **{group: dataclasses.replace(getattr(cfg, group), **{field: value})})
    return dataclasses.replace(cfg, **{name: value})


def with_fields(cfg, fields: dict):
    for name, value in fields.items():
        cfg = replace_field(cfg, name, value)
    return cfg


def parse(spec: str):
    """'op,rows,width:name=field=value;field=value|name2=...' -> (op, rows, width, {name: fields})."""
    head, body = spec.split(":", 1)
    op, rows, width = head.split(",")
    variants = {}
    for part in body.split("|"):
        name, fields = part.split("=", 1)
        variants[name] = {k: eval(v) for k, v in (f.split("=", 1) for f in fields.split(";"))}  # noqa: S307
    return op, int(rows), int(width), variants


def slot(device: torch.device, op: str, rows: int, width: int):
    """(table, key, wrap) where this GPU keeps its pick for the shape: ``table[key]`` holds
    the config (``wrap(cfg)`` is what to store there), found as ``norm_config`` finds it."""
    gpu = picks.gpu_name(device)
    key = ("loop", "rms" in op, op.startswith("add_"), min(262144, width))
    for family, few in picks.FEW_ROWS_GPU.items():
        if family in gpu and key in few and rows < few[key][0]:
            return few, key, lambda cfg, n=few[key][0]: (n, cfg)
    for family, table in picks.PICKS_GPU.items():
        if family in gpu and key in table:
            return table, key, lambda cfg: cfg
    raise SystemExit(f"{gpu}: no 'loop' pick in PICKS_GPU for {key}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("specs", nargs="+", help="op,rows,width:name=field=value;field=value|name2=...")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None, help="JSON of every round's %% of copy")
    args = ap.parse_args()
    device = torch.device("cuda")
    cases = {c.name: c for c in CASES}
    copy = harness.copy_bandwidth_gbs(device)
    flush = harness.new_flush_buffer(device)
    info = {**harness.device_info(device), "copy_gbs": copy, "rounds": args.rounds, "results": []}
    print(f"{info['gpu']}: copy {copy:.0f} GB/s", flush=True)
    for spec in args.specs:
        op, rows, width, fields = parse(spec)
        case = cases[op]
        table, key, wrap = slot(device, op, rows, width)
        stored = table[key]
        base = stored[1] if isinstance(stored, tuple) else stored
        variants = {"pick": base, **{n: with_fields(base, f) for n, f in fields.items()}}
        shape = next(s for s in case.shapes(False) if (s.rows, s.width) == (rows, width))
        n_sets, n_calls = timing_plan(case.bytes_moved(shape, torch.bfloat16), "rotate")
        gen = torch.Generator(device=device)
        gen.manual_seed(0)
        sets = [case.make_inputs(shape, torch.bfloat16, device, gen) for _ in range(n_sets)]
        pct = {n: [] for n in variants}
        try:
            with torch.inference_mode():
                for r in range(args.rounds):
                    for name in list(variants)[::1 if r % 2 == 0 else -1]:
                        table[key] = wrap(variants[name])
                        norm.clear_plans()  # the calls' kept plans hold the last variant's config

                        def replay():
                            for i in range(n_calls):
                                case.fused(*sets[i % n_sets])
                        t = harness.per_call(harness.time_ms(replay, flush=flush), n_calls)
                        pct[name].append(100 * harness.gbs(case.bytes_moved(shape, torch.bfloat16), t.median_ms) / copy)
        finally:
            table[key] = stored
            norm.clear_plans()
        for name, cfg in variants.items():
            med = statistics.median(pct[name])
            print(f"{op} {rows}x{width} {name:10s} median {med:5.1f}  " + " ".join(f"{p:.1f}" for p in pct[name]),
                  flush=True)
            info["results"].append(dict(op=op, rows=rows, width=width, variant=name, config=repr(cfg),
                                        median_pct_of_copy=med, pct_of_copy=pct[name]))
    if args.out:
        args.out.write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
