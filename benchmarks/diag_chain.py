"""Where a "rotate" replay's time goes: each kernel's own duration and the gaps between
kernels, as CUPTI records them (NOTES.md, twenty-sixth session).

The ops bench times a CUDA graph of ``calls`` back-to-back calls over ``sets`` copies of the
inputs, after a flush, and divides by ``calls``. Here the same graph is replayed under
torch.profiler, and for each replay this reports the kernels' durations by position in
the chain, the gaps from one kernel's end to the next one's start, and the span (first
start to last end) per call, beside the bench's own per-call time; for onetrip's norm
picks and for a plain element-wise kernel moving the same bytes (torch.neg, as the bench's
"copy, same bytes" column).

    PYTHONPATH=src python benchmarks/diag_chain.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from torch.autograd import DeviceType

from onetrip.bench import harness
from onetrip.bench import ops as bench_ops
from onetrip.bench.cases import RowShape


def chain_profile(fns, n_calls: int, flush: torch.Tensor, reps: int = 10) -> dict:
    """Profile ``reps`` replays of a graph of n_calls calls (fns cycled); a flush before each."""
    def replay():
        for i in range(n_calls):
            fns[i % len(fns)]()
    bench = harness.per_call(harness.time_ms(replay, flush=flush), n_calls).median_ms * 1e3
    graph, err = harness._capture(replay)
    if graph is None:
        raise RuntimeError(err)
    sink = torch.empty((), device=flush.device, dtype=flush.dtype)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            torch.amax(flush, dim=0, out=sink)
            graph.replay()
        torch.cuda.synchronize()
    kernels = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                      if e.device_type == DeviceType.CUDA and "reduce_kernel" not in e.name
                      and "Memset" not in e.name), key=lambda k: k[0])  # the flush: a memset and a reduction
    per_rep = [kernels[i * n_calls:(i + 1) * n_calls] for i in range(len(kernels) // n_calls)]
    durs = [[k[1] - k[0] for k in rep] for rep in per_rep]
    gaps = [[rep[i + 1][0] - rep[i][1] for i in range(len(rep) - 1)] for rep in per_rep]
    spans = [(rep[-1][1] - rep[0][0]) / n_calls for rep in per_rep]
    med = statistics.median
    return {"bench_us": round(bench, 2), "span_per_call_us": round(med(spans), 2),
            "dur_by_position_us": [round(med(d[i] for d in durs), 2) for i in range(n_calls)],
            "gap_by_position_us": [round(med(g[i] for g in gaps), 2) for i in range(n_calls - 1)],
            "kernel": per_rep[0][0][2][:60] if per_rep else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".", help="folder for the JSON")
    ap.add_argument("--cases", default="layer_norm:512x131072,layer_norm:256x262144,rms_norm:512x131072,"
                    "rms_norm:256x262144,layer_norm:64x262144,rms_norm:64x262144")
    args = ap.parse_args()
    dev = torch.device("cuda")
    copy = harness.copy_bandwidth_gbs(dev)
    flush = harness.new_flush_buffer(dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    log = {"device": harness.device_info(dev), "copy_gbs": copy, "cases": []}
    with torch.inference_mode():
        for item in args.cases.split(","):
            op, shape_s = item.split(":")
            rows, width = (int(v) for v in shape_s.split("x"))
            case = next(iter(bench_ops.select([op])))
            shape = RowShape(rows, width)
            nbytes = case.bytes_moved(shape, torch.bfloat16)
            n_sets, n_calls = bench_ops.timing_plan(nbytes)
            sets = [case.make_inputs(shape, torch.bfloat16, dev, gen) for _ in range(n_sets)]
            row = {"op": op, "shape": shape.label, "sets": n_sets, "calls": n_calls, "bytes": nbytes}
            row["onetrip"] = chain_profile([(lambda t=t: case.fused(*t)) for t in sets], n_calls, flush)
            del sets
            srcs = [torch.empty(nbytes // 4, device=dev, dtype=torch.bfloat16).normal_() for _ in range(n_sets)]
            dsts = [torch.empty_like(s) for s in srcs]
            row["neg"] = chain_profile([(lambda s=s, d=d: torch.neg(s, out=d)) for s, d in zip(srcs, dsts)],
                                       n_calls, flush)
            del srcs, dsts
            for k in ("onetrip", "neg"):
                row[k]["bench_pct"] = round(100 * harness.gbs(nbytes, row[k]["bench_us"] / 1e3) / copy, 1)
            log["cases"].append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "diag-chain.json").write_text(json.dumps(log, indent=1))


if __name__ == "__main__":
    main()
