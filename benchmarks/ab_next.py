"""The next device session's A/B runs, prepared and checked on the CPU: one call, ~2-3 min.

    python benchmarks/ab_next.py --out DIR

Rounds 1-5 (benchmarks/results/ab-round{1..5}-h200-20261121.json, NOTES.md) set the batch-1
GEMV launch table, the decode split rule, append_kv's launch, and measured programmatic
dependent launch (PDL) on the GEMV chain and over the whole engine step.

Round 6:
1. Which kernels PDL helps (round 5: all of them, 1B -4%, 8B +2.6%): the engine step
   (onetrip-graphs, batch 1, 32-token prompt, 128 new tokens) with PDL off, on for every
   kernel, on for the GEMVs only, and on for all but the attention kernels (append_kv,
   decode attention, merge). Greedy tokens must equal PDL off. Prediction: GEMV-only keeps
   the 1B gain and loses nothing on 8B.
2. Decode attention tiles x splits x pipeline stages on the cells under 90% of copy (or
   under SDPA): batch 64 x 1K (round 5: 32-key tiles at 4 warps 94% vs 87%), batch 16 x 1K,
   4 x 8K, 1 x 32K, 1 x 4K contiguous, 64 x 1K and 1 x 128K paged. Prediction: small tiles
   win only where every program has under ~16 tiles and the grid passes one wave.
3. Where batch 1 x 4K's 14 us goes: the kernels of one graph of 16 calls, profiled.

Every variant is timed as one CUDA graph (median of 15 replays) over enough input copies
to pass 256 MiB; writes ab-next.json. Earlier rounds' sweeps are in git history beside
their results files.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sweep_gemv import time_per_call  # noqa: E402

from onetrip.bench import harness  # noqa: E402
from onetrip.bench.decode_attn import DecodeCell, make_inputs  # noqa: E402

da = importlib.import_module("onetrip.ops.decode_attention")
# the modules whose kernels take the PDL switch (each imported _common.pdl_args by name)
PDL_MODULES = {name: importlib.import_module(f"onetrip.ops.{name}")
               for name in ("skinny_matmul", "append_kv", "decode_attention", "argmax")}

HEADS = (32, 8, 128)  # query heads, kv heads, head dim
# (batch, context, layout): the cells under 90% of copy or under SDPA in the final bench
CELLS = ((64, 1024, "contiguous"), (16, 1024, "contiguous"), (4, 8192, "contiguous"), (1, 32768, "contiguous"),
         (1, 4096, "contiguous"), (64, 1024, "paged-64"), (1, 131072, "paged-64"))
TILES = ((128, 8), (64, 4), (64, 8), (32, 4))   # (block_n, num_warps)
STAGED = ((128, 8), (32, 4))                   # also timed at 2 and 4 pipeline stages


def _cell_calls(b, ctx, layout, dev):
    """Input copies enough to pass 256 MiB (L2 never serves a call), their refs, bytes."""
    H, KVH, D = HEADS
    cell = DecodeCell("decode", layout, b, ctx, heads=H, kv_heads=KVH, head_dim=D)
    nbytes = 2 * b * ctx * KVH * D * 2
    n = max(1, min(16, -(-(256 << 20) // nbytes)))
    sets = [make_inputs(cell, torch.bfloat16, dev, torch.Generator(device=dev).manual_seed(i)) for i in range(n)]
    return sets, nbytes


def decode_sweep(flush, copy, dev="cuda"):
    rows = []
    D = HEADS[2]
    for b, ctx, layout in CELLS:
        sets, nbytes = _cell_calls(b, ctx, layout, dev)
        t0 = sets[0]
        heur = da._default_config(t0["q"], t0["k_cache"], t0["block_table"])
        ref = da.decode_attention(t0["q"], t0["k_cache"], t0["v_cache"], t0["cache_seqlens"],
                                  block_table=t0["block_table"]).float()
        row = {"cell": f"B={b} ctx={ctx} {layout}", "input_sets": len(sets),
               "heuristic": dataclasses.astuple(heur), "configs": {}}
        variants = [(bn, w, heur.num_splits * m, 3) for (bn, w), m in itertools.product(TILES, (1, 2, 4))]
        variants += [(bn, w, heur.num_splits * m, st) for (bn, w), m, st in itertools.product(STAGED, (1, 2, 4), (2, 4))]
        for bn, w, splits, st in variants:
            cfg = da.DecodeConfig(bn, w, splits)  # round 6a; num_stages was a field then
            outs = [torch.empty_like(t["q"]) for t in sets]
            calls = [lambda t=t, o=o: da._launch(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"],  # noqa: E731
                                                 t["block_table"], o, D ** -0.5, -1, 0.0, cfg)
                     for t, o in zip(sets, outs)]
            try:
                us = 1e3 * time_per_call(calls, flush) / len(calls)
            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory at 4 stages
                row["configs"][str([bn, w, splits, st])] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                continue
            err = (outs[0].float() - ref).abs().max().item()
            row["configs"][str([bn, w, splits, st])] = {"us": us, "pct_of_copy": 100 * nbytes / (us * 1e3) / copy,
                                                        "max_diff": err}
        rows.append(row)
        top = sorted(((c, r) for c, r in row["configs"].items() if "us" in r), key=lambda kv: kv[1]["us"])
        heur_key = str(list(dataclasses.astuple(heur)))
        heur_pct = row["configs"].get(heur_key, {}).get("pct_of_copy", float("nan"))
        print(f"{row['cell']:28s} heuristic {heur_key} {heur_pct:.0f}%: " + ", ".join(
            f"{c} {r['pct_of_copy']:.0f}%" for c, r in top[:4]) + f" ... worst {top[-1][0]} "
            f"{top[-1][1]['pct_of_copy']:.0f}%", flush=True)
        del sets
        torch.cuda.empty_cache()
    return rows


def profile_small(flush, copy, dev="cuda"):
    """The kernels of one graph replay of 16 batch-1 x 4K calls: durations and the gaps."""
    sets, nbytes = _cell_calls(1, 4096, "contiguous", dev)
    outs = [torch.empty_like(t["q"]) for t in sets]
    g = torch.cuda.CUDAGraph()
    for t, o in zip(sets, outs):
        da.decode_attention(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"], out=o)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for t, o in zip(sets, outs):
            da.decode_attention(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"], out=o)
    g.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            flush.sum()
            g.replay()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                     and ("decode" in e.name or "merge" in e.name)), key=lambda e: e.time_range.start)
    kinds = {}
    for e in events:
        kinds.setdefault(e.name[:40], []).append(e.time_range.elapsed_us())
    gaps = [b.time_range.start - a.time_range.end for a, b in zip(events, events[1:])]
    gaps = [x for x in gaps if x < 50]  # within one replay
    out = {"kernels": {k: {"n": len(v), "median_us": sorted(v)[len(v) // 2]} for k, v in kinds.items()},
           "median_gap_us": sorted(gaps)[len(gaps) // 2] if gaps else None, "bytes_per_call": nbytes}
    print("batch 1 x 4K, one graph of 16 calls: " + ", ".join(
        f"{k} x{v['n']} median {v['median_us']:.1f} us" for k, v in out["kernels"].items())
        + f"; median gap {out['median_gap_us']} us", flush=True)
    return out


ENGINE_PRESETS = ("llama-3.2-1b", "llama-3.1-8b")
# PDL variants: the modules whose kernels launch without PDL (None: PDL off everywhere)
PDL_VARIANTS = {"off": None, "all": (), "gemv only": ("append_kv", "decode_attention", "argmax"),
                "all but attention": ("append_kv", "decode_attention")}


def engine_ab(flush, copy, dev="cuda", new_tokens=128, prompt=32):
    from onetrip.bench.decode import _prompts, build, run_engine
    from onetrip.engine.budget import decode_budget

    rows = []
    saved = {name: mod.pdl_args for name, mod in PDL_MODULES.items()}
    for preset in ENGINE_PRESETS:
        model, _ = build(preset, torch.bfloat16, dev, False)
        prompts = _prompts(1, prompt, model.config.vocab_size)
        steps = new_tokens - 1
        budget = decode_budget(model.config, model.dtype, 1, [prompt], steps, copy)
        row = {"preset": preset, "limit_tok_s": budget.limit_tok_s}
        ref = None
        for label, plain in PDL_VARIANTS.items():
            os.environ["ONETRIP_PDL"] = "0" if plain is None else "1"
            for name in plain or ():
                PDL_MODULES[name].pdl_args = lambda t: {}
            try:
                best = None
                for _ in range(2):  # two timed runs, the faster kept
                    toks, _, decode, _ = run_engine(model, prompts, new_tokens, graphs=True)
                    best = decode if best is None else min(best, decode)
                ms = best * 1e3 / steps
                ref = toks if ref is None else ref
                row[label] = {"ms_per_step": ms, "tok_s": 1e3 / ms, "pct_of_limit": budget.pct_of_limit(ms),
                              "same_tokens_as_off": toks == ref}
            except Exception as exc:  # noqa: BLE001 - recorded
                row[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            finally:
                for name, fn in saved.items():
                    PDL_MODULES[name].pdl_args = fn
        os.environ["ONETRIP_PDL"] = "0"
        rows.append(row)
        print(f"engine {preset}: " + ", ".join(
            f"{v}: " + (f"{row[v]['ms_per_step']:.3f} ms ({row[v]['pct_of_limit']:.1f}%, same "
                        f"{row[v]['same_tokens_as_off']})" if "ms_per_step" in row[v] else row[v]["error"])
            for v in PDL_VARIANTS), flush=True)
        del model
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu-out"))
    ap.add_argument("--only", nargs="+", choices=("engine", "decode_sweep", "profile_b1_4k"),
                    default=os.environ.get("AB_ONLY", "").split() or None, help="parts to run (env AB_ONLY)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    copy = harness.copy_bandwidth_gbs("cuda")
    flush = harness.new_flush_buffer()
    t0 = time.time()
    result = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_gbs": copy,
                       "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d")}}
    for name, fn in (("engine", engine_ab), ("decode_sweep", decode_sweep), ("profile_b1_4k", profile_small)):
        if args.only and name not in args.only:
            continue
        try:
            result[name] = fn(flush, copy)
        except Exception as exc:  # noqa: BLE001 - the other parts still report
            import traceback
            traceback.print_exc()
            result[name] = {"error": repr(exc)}
        (args.out / "ab-next.json").write_text(json.dumps(result, indent=1))
    print(f"copy {copy:.0f} GB/s; {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
