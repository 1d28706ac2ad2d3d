"""Sweep skinny_matmul's launch configs at batch 1 against cuBLAS, on the decode shapes.

    python tools/sweep_gemv.py --out DIR [--presets llama-3.2-1b,llama-3.1-8b] [--budget-s 240]

Why: at batch 1 a decode step is ~90% matrix-vector products, and cuBLAS reads the small
ones well under the copy bandwidth (1B's o_proj, 8 MiB: ~50%; 8B's down_proj: 80%).
Each shape's floor is weight bytes / copy bandwidth. Every provider is timed alike: one
CUDA graph of n calls, each on its own copy of the weight (n * weight >= 256 MiB, so each
call reads HBM, as each layer does in a model), after an L2 flush; time / n, median of
15 replays. The graph keeps the launch cost of one kernel inside a graph (what the engine
pays) and drops the graph's own launch (paid once per step).

Prints per shape: cuBLAS, the heuristic config, the best config (GB/s, % of copy) and the
top 3, with registers and spills; writes gemv-sweep.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from onetrip.bench import harness  # noqa: E402
from onetrip.bench.gemv import projections  # noqa: E402
import importlib  # noqa: E402

skm = importlib.import_module("onetrip.ops.skinny_matmul")

ROTATE = 256 * 2**20


def time_per_call(calls, flush, reps=15):
    """calls: n zero-arg callables; median time of one graph of all of them / n, in ms."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    times = []
    for _ in range(reps):
        flush.sum()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times) / len(calls)


def configs():
    for bn, bk, w, st in itertools.product((4, 8, 16, 32), (256, 512, 1024), (4, 8), (1, 3)):
        if bn * bk > 16384 or bn * bk < 32 * w * 8:
            continue
        yield bn, bk, w, st


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu-out"))
    ap.add_argument("--presets", default="llama-3.2-1b,llama-3.1-8b")
    ap.add_argument("--budget-s", type=float, default=240)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = "cuda"
    copy = harness.copy_bandwidth_gbs(dev)
    flush = harness.new_flush_buffer()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device=dev).manual_seed(0)
    t0 = time.time()
    results = []
    for proj in projections(args.presets.split(",")):
        N, K = proj.n, proj.k
        wbytes = N * K * 2
        n = max(1, min(32, -(-ROTATE // wbytes)))
        ws = [torch.randn((N, K), generator=gen, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(n)]
        x = torch.randn((1, K), generator=gen, device=dev, dtype=torch.bfloat16)
        ys = [torch.empty((1, N), device=dev, dtype=torch.bfloat16) for _ in range(n)]
        ref = F.linear(x.float(), ws[0].float())
        row = {"preset": proj.preset, "proj": proj.name, "N": N, "K": K, "weight_mib": wbytes / 2**20, "copies": n,
               "floor_us": wbytes / (copy * 1e3), "configs": []}
        ms = time_per_call([lambda w=w, y=y: torch.mm(x, w.t(), out=y) for w, y in zip(ws, ys)], flush)
        row["cublas_us"] = ms * 1e3
        heur = skm.skinny_config(1, N, K, sms)
        for (bn, bk, w, st), split in itertools.product(list(configs()), (1, 2, 4, 8)):
            if time.time() - t0 > args.budget_s:
                break
            if bk * split * 2 > K and split > 1:
                continue
            cfg = skm.SkinnyConfig(1, bn, bk, split, w, False, st)
            try:
                skm.skinny_matmul(x, ws[0], out=ys[0], config=cfg)
                err = (ys[0].float() - ref).abs().max().item() / ref.abs().max().item()
                ms = time_per_call([lambda w_=w_, y=y: skm.skinny_matmul(x, w_, out=y, config=cfg)
                                    for w_, y in zip(ws, ys)], flush)
            except Exception as exc:  # noqa: BLE001
                row["configs"].append({"cfg": cfg.as_list(), "error": str(exc)[:200]})
                continue
            row["configs"].append({"cfg": cfg.as_list(), "us": ms * 1e3, "rel_err": err})
        ok = [c for c in row["configs"] if "us" in c and c["rel_err"] < 2e-2]
        ok.sort(key=lambda c: c["us"])
        row["best"] = ok[:3]
        h = [c for c in ok if c["cfg"][1:3] == [heur.block_n, heur.block_k] and c["cfg"][3] == heur.split_k
             and c["cfg"][4] == heur.num_warps]
        row["heuristic"] = h[0] if h else None
        results.append(row)
        del ws, ys
        torch.cuda.empty_cache()
        b = ok[0] if ok else None
        gb = lambda us: wbytes / (us * 1e3)  # noqa: E731
        print(f"{proj.preset:13s} {proj.name:8s} {N:6d}x{K:<6d} {wbytes / 2**20:7.1f} MiB  floor {row['floor_us']:6.1f} us  "
              f"cublas {row['cublas_us']:6.1f} us ({100 * gb(row['cublas_us']) / copy:3.0f}%)  "
              + (f"best {b['us']:6.1f} us ({100 * gb(b['us']) / copy:3.0f}%) {b['cfg']}" if b else "none"), flush=True)
        for c in ok[1:3]:
            print(f"{'':60s} next {c['us']:6.1f} us ({100 * gb(c['us']) / copy:3.0f}%) {c['cfg']}")
    # registers / spills of the winners (compiled kernels are cached by Triton)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_gbs": copy,
            "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d")}
    (args.out / "gemv-sweep.json").write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    print(f"copy {copy:.0f} GB/s; {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
