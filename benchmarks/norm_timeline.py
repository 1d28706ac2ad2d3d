"""Diagnostic: where a norm launch's time goes, from its programs' own clocks (issue 2's 64-row
cells; NOTES.md, thirty-third session).

A cluster pick of the "loop" norm is launched with ``TRACE`` (``onetrip/ops/_stamp.py``): every
program stores its SM and four ``%globaltimer`` stamps,
    g0 start, g1 its partial sums known (pass 1's loads in), g2 the row's sums known (the
    cluster's exchange done), g3 its last store issued,
and this script times the same replay as the ops bench does (``calls`` launches back to back
over as many copies of the inputs, L2 flushed before each replay), untraced and traced (the
stamps' own cost), then reads the stamps of ``reps`` traced replays and reports, per call of
the median replay: its span (first start to last stamp), the gap to the next call's first
program, the phases' durations (pass 1, wait, pass 2: median and p90), the waves (programs
running at once), and how long the SMs sat with no program. A PNG per cell draws every
program as a bar on its SM (pass 1 / wait / pass 2 in three colours) over the programs
running in each phase.

    python benchmarks/norm_timeline.py --out DIR [--families rms_norm,...] [--rows 64,256]
                                         [--bias own|weight|none] [--set FIELD=VALUE ...] [--tag=-NAME]
(``--bias``: LayerNorm's bias as a tensor of its own, the weight tensor, or none; ``--set``: a
field of every pick replaced, e.g. ``--set wb_last=False``; a tag that starts with "-" takes
the "=" form, or argparse reads it as an option.)
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import gzip
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from onetrip.bench import harness  # noqa: E402
from onetrip.graphs import capture  # noqa: E402
from onetrip.ops import norm  # noqa: E402
from onetrip.ops._common import pdl_mode  # noqa: E402
from onetrip.ops._norm_picks import NormConfig, launch_segments  # noqa: E402
from onetrip.ops._stamp import STAMP_FIELDS  # noqa: E402

FAMILIES = {"rms_norm": (True, False), "layer_norm": (False, False), "add_rms_norm": (True, True),
            "add_layer_norm": (False, True)}
PHASES = ("pass 1", "wait", "pass 2")


def _sets(rows, width, residual, n, device):
    """``n`` copies of (x, r, y, h), bf16, N(0, 1)."""
    out = []
    for _ in range(n):
        x = torch.randn(rows, width, device=device, dtype=torch.bfloat16)
        r = torch.randn_like(x) if residual else None
        out.append((x, r, torch.empty_like(x), torch.empty_like(x) if residual else None))
    return out


def _calls(sets, w, b, is_rms, cfg, traces):
    """One replay's launches: call k on set k, stamps into traces[k] (None: untraced)."""
    def run():
        for k, (x, r, y, h) in enumerate(sets):
            norm._launch(x, r, w, b, y, h, 1e-6, is_rms, False, cfg, trace=traces[k] if traces else None)
    return run


def _pct(values, q):
    return harness.quantile(sorted(values), q) if values else None


def _idle(progs, start, end):
    """SM-microseconds with no program of this call between start and end, and the SMs used."""
    by_sm = {}
    for p in progs:
        by_sm.setdefault(p["smid"], []).append((p["g0"], p["g3"]))
    idle = 0.0
    for spans in by_sm.values():
        spans.sort()
        t, busy = start, 0.0
        for a, b in spans:
            a, b = max(a, t), max(b, t)
            busy += b - a
            t = max(t, b)
        idle += (end - start) - busy
    return idle, len(by_sm)


def call_stats(progs, next_start=None):
    """The figures of one call (programs as dicts of STAMP_FIELDS, times in us from the replay's start)."""
    start = min(p["g0"] for p in progs)
    end = max(p["g3"] for p in progs)
    rec = {"start_us": start, "span_us": end - start, "programs": len(progs),
           "gap_to_next_us": None if next_start is None else next_start - end}
    for name, a, b in (("pass1", "g0", "g1"), ("wait", "g1", "g2"), ("pass2", "g2", "g3")):
        d = [p[b] - p[a] for p in progs]
        rec[f"{name}_median_us"], rec[f"{name}_p90_us"] = _pct(d, 0.5), _pct(d, 0.9)
    events = sorted([(p["g0"], 1) for p in progs] + [(p["g3"], -1) for p in progs])
    live = peak = 0
    for _, e in events:
        live += e
        peak = max(peak, live)
    rec["peak_programs"] = peak
    first = sorted(p["g0"] for p in progs)
    rec["programs_started_first_us"] = sum(1 for t in first if t < start + 1.0)  # the first wave, roughly
    rec["last_start_us"] = first[-1] - start
    g1 = sorted(p["g1"] for p in progs)
    rec["first_sums_us"], rec["last_sums_us"] = g1[0] - start, g1[-1] - start
    g2 = sorted(p["g2"] for p in progs)
    rec["first_exchange_us"] = g2[0] - start
    idle, sms = _idle(progs, start, end)
    rec["sms"], rec["idle_sm_us"], rec["idle_fraction"] = sms, idle, idle / (sms * (end - start))
    return rec


def read_traces(traces):
    """Each call's programs as dicts, globaltimer in us from the replay's first stamp."""
    raw = [t.cpu().tolist() for t in traces]
    t0 = min(row[4] for calls in raw for row in calls if row[4] > 0)
    out = []
    for calls in raw:
        progs = []
        for row in calls:
            p = dict(zip(STAMP_FIELDS, row))
            for k in ("g0", "g1", "g2", "g3"):
                p[k] = (p[k] - t0) / 1000.0
            progs.append(p)
        out.append(progs)
    return out


def plot(cell, calls, path):
    """Every program a bar on its SM (sub-lanes for programs that overlap), coloured by phase,
    over the count of programs in each phase; one column of panels a call."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"pass 1": "#4c72b0", "wait": "#dd8452", "pass 2": "#55a868"}
    fig, axes = plt.subplots(2, 1, figsize=(14, 9), height_ratios=(3, 1), sharex=True)
    gantt, counts = axes
    sms = sorted({p["smid"] for progs in calls for p in progs})
    row_of = {s: i for i, s in enumerate(sms)}
    for progs in calls:
        lanes = {}  # smid -> end time of each sub-lane
        for p in sorted(progs, key=lambda p: p["g0"]):
            ends = lanes.setdefault(p["smid"], [])
            lane = next((i for i, e in enumerate(ends) if e <= p["g0"]), None)
            if lane is None:
                lane = len(ends)
                ends.append(0.0)
            ends[lane] = p["g3"]
            y = row_of[p["smid"]] + 0.12 * lane
            for name, a, b in zip(PHASES, ("g0", "g1", "g2"), ("g1", "g2", "g3")):
                gantt.plot([p[a], p[b]], [y, y], color=colors[name], lw=1.2, solid_capstyle="butt")
    end = max(p["g3"] for progs in calls for p in progs)
    grid = [end * i / 800 for i in range(801)]
    for name, a, b in zip(PHASES, ("g0", "g1", "g2"), ("g1", "g2", "g3")):
        n = [sum(1 for progs in calls for p in progs if p[a] <= t < p[b]) for t in grid]
        counts.plot(grid, n, color=colors[name], label=name)
    gantt.set_ylabel("SM (programs that overlap on an SM: sub-lanes)")
    gantt.set_title(cell)
    for name in PHASES:
        gantt.plot([], [], color=colors[name], label=name)
    gantt.legend(loc="upper right")
    counts.set_ylabel("programs")
    counts.set_xlabel("us from the replay's first program")
    counts.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_cell(family, rows, width, n_calls, reps, device, copy_gbs, bias="own", sets_=()):
    is_rms, residual = FAMILIES[family]
    cfg = norm.norm_config(rows, width, device, is_rms=is_rms, has_residual=residual, dense=True)
    cfg = dataclasses.replace(cfg, **dict(sets_))  # --set: the pick with these fields replaced
    split, _ = launch_segments(width, cfg)
    if not (cfg.mode == "loop" and cfg.cluster and split > 1):
        return {"family": family, "rows": rows, "width": width, "config": repr(cfg), "skipped": "not a cluster pick"}, None
    w = torch.randn(width, device=device, dtype=torch.bfloat16)
    b = None if is_rms else torch.randn(width, device=device, dtype=torch.bfloat16)
    b = {"weight": w, "none": None}.get(bias, b)  # LayerNorm's bias: its own, the weight tensor, or none
    sets = _sets(rows, width, residual, n_calls, device)
    traces = [torch.zeros(rows * split, len(STAMP_FIELDS), dtype=torch.int64, device=device) for _ in sets]
    nbytes = (4 if residual else 2) * rows * width * 2 + (1 if is_rms else 2) * width * 2
    plain = harness.per_call(harness.time_ms(_calls(sets, w, b, is_rms, cfg, None)), n_calls)
    traced_run = _calls(sets, w, b, is_rms, cfg, traces)
    traced = harness.per_call(harness.time_ms(traced_run), n_calls)
    # the stamps of `reps` replays, each after a flush, as time_ms replays them
    graph, _ = capture(traced_run)
    flush = harness.new_flush_buffer(device)
    sink = torch.empty((), dtype=flush.dtype, device=device)
    replays = []
    for _ in range(reps):
        for t in traces:
            t.zero_()
        torch.amax(flush, dim=0, out=sink)
        graph.replay()
        torch.cuda.synchronize()
        replays.append(read_traces(traces))
    spans = [max(p["g3"] for p in r[-1]) - min(p["g0"] for p in r[0]) for r in replays]
    median = replays[sorted(range(reps), key=lambda i: spans[i])[reps // 2]]
    starts = [min(p["g0"] for p in progs) for progs in median]
    calls = [call_stats(progs, starts[k + 1] if k + 1 < len(median) else None) for k, progs in enumerate(median)]
    gbs = nbytes / plain.median_ms / 1e6
    return {"family": family, "rows": rows, "width": width, "config": repr(cfg), "split": split,
            "bytes": nbytes, "ms": plain.median_ms, "gbs": gbs, "pct_copy": 100 * gbs / copy_gbs,
            "traced_ms": traced.median_ms, "replay_spans_us": spans, "calls": calls,
            # a call's programs, each its STAMP_FIELDS (g*: us from the replay's first stamp)
            "stamps": [[[round(p[k], 4) if isinstance(p[k], float) else p[k] for k in STAMP_FIELDS] for p in progs]
                       for progs in median]}, median


def _parse_set(ap, arg):
    """(field, value) of a ``--set FIELD=VALUE``; exits with argparse's error naming what is wrong."""
    field, eq, text = arg.partition("=")
    names = [f.name for f in dataclasses.fields(NormConfig)]
    if not eq or field not in names:
        ap.error(f"--set {arg!r}: expected FIELD=VALUE with FIELD one of {', '.join(names)}")
    try:
        return field, ast.literal_eval(text)
    except (ValueError, SyntaxError):
        ap.error(f"--set {arg!r}: the value must be a Python literal (e.g. 2, True, 'loop')")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--rows", default="64,256")
    ap.add_argument("--width", type=int, default=262144)
    ap.add_argument("--calls", type=int, default=4, help="launches a replay, over as many copies of the inputs")
    ap.add_argument("--reps", type=int, default=9, help="traced replays read; the median span's kept")
    ap.add_argument("--tag", default="", help="appended to the output files' names")
    ap.add_argument("--bias", choices=("own", "weight", "none"), default="own",
                    help="LayerNorm's bias: a tensor of its own, the weight tensor, or none (what the bias costs)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="a NormConfig field of every pick replaced (repeatable, e.g. wb_last=False)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sets_ = [_parse_set(ap, a) for a in args.set]
    if not torch.cuda.is_available():
        sys.exit("norm_timeline needs a GPU (the stamps are read from the SMs' clocks)")
    device = torch.device("cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    copy_gbs = harness.copy_bandwidth_gbs(device)
    info = harness.device_info(device)
    results = []
    for family in args.families.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            rec, median = run_cell(family, rows, args.width, args.calls, args.reps, device, copy_gbs, args.bias,
                                   sets_)
            results.append(rec)
            if median is None:
                print(f"{family} {rows} x {args.width}: {rec['skipped']}", flush=True)
                continue
            plot(f"{family} {rows} x {args.width}: {rec['pct_copy']:.1f}% of copy, {rec['config']}", median,
                 out / f"timeline-{family}-{rows}x{args.width}{args.tag}.png")
            c = rec["calls"][1] if len(rec["calls"]) > 1 else rec["calls"][0]
            print(f"{family} {rows} x {args.width}: {rec['ms'] * 1e3:.2f} us ({rec['pct_copy']:.1f}%), traced "
                  f"{rec['traced_ms'] * 1e3:.2f}; call 2: span {c['span_us']:.2f} us, gap {c['gap_to_next_us']}, "
                  f"pass1 {c['pass1_median_us']:.2f}/{c['pass1_p90_us']:.2f} wait {c['wait_median_us']:.2f}/"
                  f"{c['wait_p90_us']:.2f} pass2 {c['pass2_median_us']:.2f}/{c['pass2_p90_us']:.2f}, peak "
                  f"{c['peak_programs']}, idle {100 * c['idle_fraction']:.1f}%", flush=True)
    meta = {**info, "copy_gbs": copy_gbs, "date": harness.utc_now().isoformat(), "calls": args.calls,
            "reps": args.reps, "stamp_fields": STAMP_FIELDS, "pdl": bool(pdl_mode())}
    stamps = [{"family": r["family"], "rows": r["rows"], "stamps": r.pop("stamps", None)} for r in results]
    path = out / f"norm-timeline{args.tag}.json"
    path.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    with gzip.open(out / f"norm-timeline{args.tag}-stamps.json.gz", "wt") as f:  # every program's record: ~1 MB
        json.dump({"meta": meta, "stamps": stamps}, f)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
