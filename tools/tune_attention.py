"""Sweep flash_attention's pruned launch configs on a GPU: TFLOP/s, registers, spills, shared memory.

    PYTHONPATH=src python3 tools/tune_attention.py --out benchmarks/results/tune-attention.json
        [--head-dims 64,128] [--seqs 1024,2048,4096,8192,16384] [--budget-s 270] [--write-cache]

For head dims 64 and 128 (bf16, 2048-wide model: 32 and 16 heads, no GQA), query = key
lengths 1K to 16K, causal and not, it times every candidate of ``attention_candidates``
(the same list the runtime tuner uses) with ``triton.testing.do_bench`` (median, ~20 ms
per config), and reports per config the compiler's registers per thread, spilled bytes
and shared memory. The batch keeps 16K tokens per shape, so each one runs long enough to
time and short enough for the sweep to stay under 5 minutes on an H100/H200; compiling
the ~48 tiles x 2 mask flags is most of that. ``--budget-s`` stops starting new
configs when spent (the JSON marks what was not measured).

FLOPs: 4 * batch * heads * head_dim * (visible (query, key) pairs): seq^2 without a mask,
seq * (seq + 1) / 2 causal. The table shows, per shape, the heuristic default, the best
config, and the best with no spills; ``--write-cache`` stores each best spill-free pick in
the runtime tuner's cache (``onetrip.ops.autotune``), so the op need not tune again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from triton.testing import do_bench

from onetrip.bench.harness import device_info
from onetrip.ops import autotune
from onetrip.ops.flash_attention import (AttentionConfig, _launch, attention_bucket, attention_candidates,
                                         attention_config)

DT = torch.bfloat16
TOKENS = 16384   # batch * seq per shape
MODEL_DIM = 2048  # heads = MODEL_DIM // head_dim


def flops(batch, heads, seq, head_dim, causal):
    pairs = seq * (seq + 1) // 2 if causal else seq * seq
    return 4 * batch * heads * head_dim * pairs


def run_shape(head_dim, seq, causal, deadline, gen):
    batch, heads = max(1, TOKENS // seq), MODEL_DIM // head_dim
    q, k, v = (torch.randn(batch, seq, heads, head_dim, device="cuda", dtype=DT, generator=gen) for _ in range(3))
    out = torch.empty_like(q)
    window = (-1, 0) if causal else (-1, -1)
    scale = head_dim ** -0.5
    work = flops(batch, heads, seq, head_dim, causal)
    default = attention_config(head_dim, seq)
    rows = []
    for cfg in attention_candidates(head_dim, DT, seq):
        rec = {"head_dim": head_dim, "seq": seq, "batch": batch, "heads": heads, "causal": causal,
               **asdict(cfg), "is_default": cfg == default}
        rows.append(rec)
        if time.monotonic() > deadline:
            rec["error"] = "not measured: time budget spent"
            continue
        launch = lambda: _launch(q, k, v, out, None, None, None, seq, scale, window, 0.0, cfg)
        try:
            rec.update(autotune.compiled_report(launch()))
            torch.cuda.synchronize()
            ms = do_bench(launch, warmup=5, rep=20, return_mode="median")
        except Exception as e:  # out of shared memory / registers: recorded, the sweep goes on
            rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            continue
        rec.update(ms=ms, tflops=work / ms / 1e9)
    del q, k, v, out
    return rows


def fmt(r):
    cfg = f"{r['block_m']:4d} {r['block_n']:4d} {r['num_warps']:2d} {r['num_stages']:2d} {'tma' if r.get('use_tma') else '   '}"
    if "ms" not in r:
        return f"{cfg}   {r.get('error', '')[:60]}"
    shared = r.get("shared")
    return (f"{cfg}  {r['tflops']:7.1f} "
            f"{r['ms']:8.3f}  {r.get('n_regs')!s:>4} {r.get('n_spills')!s:>6} "
            f"{(shared or 0) / 1024:6.0f}{'  (default)' if r['is_default'] else ''}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    ap.add_argument("--budget-s", type=float, default=270.0, help="stop starting configs after this many seconds")
    ap.add_argument("--write-cache", action="store_true", help="store each shape's best spill-free pick in the "
                    "runtime tuning cache ($ONETRIP_CACHE_DIR or ~/.cache/onetrip)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    info = device_info("cuda")
    print(f"{info['gpu']}  torch {info['torch']}  triton {info['triton']}  cuda {info['cuda']}", flush=True)
    start = time.monotonic()
    deadline = start + args.budget_s
    gen = torch.Generator(device="cuda").manual_seed(0)
    results, picks = [], []
    cache = autotune.TuneCache("flash_attention") if args.write_cache else None
    header = "  bm   bn  w st tma   TFLOP/s       ms  regs spills smemK"
    for head_dim in (int(d) for d in args.head_dims.split(",")):
        for seq in (int(s) for s in args.seqs.split(",")):
            for causal in (False, True):
                rows = run_shape(head_dim, seq, causal, deadline, gen)
                results += rows
                timed = [r for r in rows if "ms" in r]
                clean = [r for r in timed if not r.get("n_spills")]
                print(f"\nhead_dim {head_dim}  seq {seq}  {'causal' if causal else 'full'}  "
                      f"({len(timed)}/{len(rows)} timed, {time.monotonic() - start:.0f} s)\n{header}")
                for r in sorted(rows, key=lambda r: -r.get("tflops", -1.0)):
                    print(fmt(r))
                if not clean:
                    continue
                best = max(clean, key=lambda r: r["tflops"])
                dflt = next((r for r in timed if r["is_default"]), None)
                pick = {"head_dim": head_dim, "seq": seq, "causal": causal,
                        # every AttentionConfig field: a pick without use_tma would be stored
                        # as its pointer twin (the H200 run of 2026-11-21 lost its TMA picks so)
                        "best": {k: best[k] for k in AttentionConfig.__dataclass_fields__},
                        "best_tflops": best["tflops"], "default_tflops": dflt["tflops"] if dflt else None}
                picks.append(pick)
                if cache is not None:
                    bucket = attention_bucket(head_dim, causal, seq, 1, DT)
                    cache.put(autotune.tune_key("flash_attention", bucket, torch.device("cuda")), pick["best"])
    print("\nbest spill-free pick per shape (vs the heuristic default)")
    for p in picks:
        d = p["default_tflops"]
        print(f"  d={p['head_dim']:3d} seq={p['seq']:5d} {'causal' if p['causal'] else 'full  '}  "
              f"{p['best_tflops']:6.1f} TFLOP/s  {p['best']}  default {d if d is None else round(d, 1)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {**info, "dtype": str(DT), "tokens_per_shape": TOKENS, "model_dim": MODEL_DIM,
            "elapsed_s": time.monotonic() - start, "do_bench": {"warmup_ms": 5, "rep_ms": 20, "stat": "median"}}
    out.write_text(json.dumps({"meta": meta, "picks": picks, "results": results}, indent=1))
    print(f"wrote {out}")
    print(json.dumps({"picks": len(picks), "elapsed_s": round(meta["elapsed_s"], 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
