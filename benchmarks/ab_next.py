"""The next device session's A/B runs, prepared and checked on the CPU: one call, ~1-2 min.

    python benchmarks/ab_next.py --out DIR

The previous round (benchmarks/results/ab-norm-decode-configs-h200-20261121.json) showed:
the RMSNorm prologue costs 0.4-2.6 us per GEMV whether rsqrt comes first or late (8B qkv
16.1 -> 18.6 us), so the cost is the gain's load and multiply in every K chunk; and
decode attention wins with 128-key tiles, 8 warps and one wave of programs.

1. RMSNorm carried by the GEMV, three forms, each over the launch configs of
   ``sweep_gemv.py``: the plain GEMV (no norm), the engine's (rsqrt first, gain per chunk)
   and "gain upstream": the producer GEMV stores h * g (float32) beside h, so the consumer
   loads that row and multiplies one rsqrt after its K loop. Prediction: gain upstream
   within 0.3 us of the plain GEMV at its best config; 8B qkv's best config beats the
   rule's (14.8 vs 16.1 us in the sweep).
2. Decode attention at batch 1: 4K context over split counts (128-key tiles, 8 warps), and
   the engine's case, a 288-token sequence in a 2048-slot cache (what ``bench decode``
   reaches), where most of the heuristic's 16 splits are empty. Prediction: at 288 tokens
   1-2 splits beat 16 by the merge kernel's ~1.5 us.
3. append_kv's launch shape (tokens and heads per program, warps) at 64 sequences x 64
   new tokens and 64 x 1, contiguous and paged-64. Prediction: the heuristic is within 5%
   of the best; if not, the bar (80%) may be a config away.

Every variant is timed as one CUDA graph over enough input copies to pass 256 MiB (each
call reads HBM), median of 15, per call; prints tables and writes ab-next.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sweep_gemv import ROTATE, configs, time_per_call  # noqa: E402

from onetrip.bench import harness  # noqa: E402
from onetrip.bench.decode_attn import DecodeCell, append_bytes, make_inputs  # noqa: E402

gn = importlib.import_module("onetrip.ops.gemv_norm")
sk = importlib.import_module("onetrip.ops.skinny_matmul")
da = importlib.import_module("onetrip.ops.decode_attention")
ak = importlib.import_module("onetrip.ops.append_kv")
rot = importlib.import_module("onetrip.ops.rotary")

NORM_SHAPES = {"1B qkv": (3072, 2048), "1B gate_up": (16384, 2048), "8B qkv": (6144, 4096),
               "8B gate_up": (28672, 4096)}
DECODE_CASES = ((4096, 4096, (2, 4, 6, 8, 12, 16, 24, 32)), (288, 2048, (1, 2, 3, 4, 8, 16)))  # length, slots, splits
APPEND_CASES = ((64, 64), (64, 1))  # sequences, new tokens
HEADS = (32, 8, 128)  # query heads, kv heads, head dim


def _best(d: dict) -> tuple:
    ok = [(v, k) for k, v in d.items() if v is not None]
    return min(ok) if ok else (float("nan"), None)


def norm_ab(flush, copy, dev="cuda"):
    rows = []
    for name, (n, k) in NORM_SHAPES.items():
        copies = max(1, min(32, -(-ROTATE // (n * k * 2))))
        ws = [torch.randn((n, k), device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        wo = torch.randn((k, 2048), device=dev, dtype=torch.bfloat16) * 0.02
        h, ss = gn.gemv_add_residual(torch.randn((1, 2048), device=dev, dtype=torch.bfloat16), wo,
                                     torch.randn((1, k), device=dev, dtype=torch.bfloat16))
        g = 1 + 0.1 * torch.randn(k, device=dev, dtype=torch.bfloat16)
        hg = h.float() * g.float()  # what the producer would store beside h
        ref = gn.gemv_rms_norm_ref(h, g, 1e-5, ws[0]).float()
        rule = sk.skinny_config(1, n, k, 132)
        row = {"shape": name, "N": n, "K": k, "floor_us": n * k * 2 / (copy * 1e3), "rule": rule.as_list()}
        forms = {  # form -> (launch on weight w into out y with config c)
            "plain": lambda w, y, c: sk._launch(h, w, None, y, c),
            "norm first (engine)": lambda w, y, c: sk._launch(h, w, None, y, c, ss_in=ss, norm_weight=g, eps=1e-5),
            "gain upstream, rsqrt late": lambda w, y, c: sk._launch(hg, w, None, y, c, ss_in=ss, eps=1e-5,
                                                                    norm_late=True),
        }
        for form, launch in forms.items():
            times = {}
            for bn, bk, warps, stages in [(rule.block_n, rule.block_k, rule.num_warps, rule.num_stages),
                                          *configs()]:
                if k % bk:
                    continue
                cfg = sk.SkinnyConfig(1, bn, bk, 1, warps, False, stages)
                ys = [torch.empty((1, n), device=dev, dtype=torch.bfloat16) for _ in ws]
                try:
                    launch(ws[0], ys[0], cfg)
                    if form != "plain":
                        err = ((ys[0].float() - ref).abs().max() / ref.abs().max()).item()
                        assert err < 2e-2, f"{form} {cfg}: relative error {err}"
                    us = 1e3 * time_per_call([lambda w=w, y=y: launch(w, y, cfg) for w, y in zip(ws, ys)], flush)
                except Exception as exc:  # noqa: BLE001 - recorded
                    print(f"  {name} {form} {cfg.as_list()}: {str(exc)[:120]}")
                    us = None
                times[str(cfg.as_list())] = us
            rule_us = times[str(rule.as_list())]
            best_us, best_cfg = _best(times)
            row[form] = {"rule_us": rule_us, "best_us": best_us, "best_cfg": best_cfg, "all": times}
        rows.append(row)
        print(f"{name:11s} floor {row['floor_us']:6.1f} us | " + " | ".join(
            f"{form}: rule {row[form]['rule_us']:.1f}, best {row[form]['best_us']:.1f} {row[form]['best_cfg']}"
            for form in forms), flush=True)
        del ws
        torch.cuda.empty_cache()
    return rows


def _decode_calls(sets, lens, cfg, D):
    outs = [torch.empty_like(q) for q, _, _ in sets]
    return [lambda q=q, k=k, v=v, o=o: da._launch(q, k, v, lens, None, o, D ** -0.5, -1, 0.0, cfg)
            for (q, k, v), o in zip(sets, outs)], outs


def decode_ab(flush, copy, dev="cuda"):
    rows = []
    H, KVH, D = HEADS
    for length, slots, split_counts in DECODE_CASES:
        nbytes = 2 * length * KVH * D * 2
        copies = 16 if dev == "cuda" else 1
        sets = []
        for _ in range(copies):
            kc = torch.randn((1, slots, KVH, D), device=dev, dtype=torch.bfloat16)
            sets.append((torch.randn((1, 1, H, D), device=dev, dtype=torch.bfloat16), kc, torch.randn_like(kc)))
        lens = torch.full((1,), length, dtype=torch.int32, device=dev)
        heur = da.decode_config(1, KVH, slots, D, torch.device(dev), rows=H // KVH)
        ref = da.decode_attention(*sets[0], lens).float()
        row = {"length": length, "slots": slots, "heuristic": [heur.block_n, heur.num_warps, heur.num_splits],
               "configs": {}}
        for bn, warps, splits in [(128, 8, s) for s in split_counts] + [(64, 4, 16)]:
            calls, outs = _decode_calls(sets, lens, da.DecodeConfig(bn, warps, splits), D)
            calls[0]()
            err = (outs[0].float() - ref).abs().max().item()
            us = 1e3 * time_per_call(calls, flush)
            row["configs"][str([bn, warps, splits])] = {"us": us, "pct_of_copy": 100 * nbytes / (us * 1e3) / copy,
                                                        "max_diff": err}
        rows.append(row)
        print(f"decode B=1 length {length} in {slots} slots (heuristic {row['heuristic']}): " + ", ".join(
            f"{c} {r['us']:.1f} us" for c, r in row["configs"].items()), flush=True)
        del sets
        torch.cuda.empty_cache()
    return rows


def append_ab(flush, copy, dev="cuda"):
    rows = []
    gen = torch.Generator(device=dev).manual_seed(0)
    H, KVH, D = HEADS
    for layout, (b, new) in itertools.product(("contiguous", "paged-64"), APPEND_CASES):
        cell = DecodeCell("append_kv", layout, b, 4096 if dev == "cuda" else 128, q_len=new, heads=H, kv_heads=KVH,
                          head_dim=D)
        sets = [make_inputs(cell, torch.bfloat16, dev, gen) for _ in range(1 if dev != "cuda" else 4 if new > 1 else 16)]
        nbytes = append_bytes(cell)
        D, half = cell.head_dim, cell.head_dim // 2
        heur = rot.rotary_config(b * new, cell.heads, half, torch.device(dev))
        row = {"cell": f"{layout} B={b} new={new}", "heuristic": dataclasses.astuple(heur), "configs": {}}
        grid = [c for c in itertools.product((1, 2, 4, 8), (8, 16, 32), (2, 4, 8)) if c[0] <= max(1, new * b // 132)]
        for bt, bh, w in dict.fromkeys([dataclasses.astuple(heur), *grid]):
            cfg = rot.RotaryConfig(bt, bh, w)
            calls = [lambda t=t: ak._launch(t["q"], t["k"], t["v"], t["k_cache"], t["v_cache"], t["cache_seqlens"],
                                            t["cos"], t["sin"], t["block_table"], False, cfg) for t in sets]
            us = 1e3 * time_per_call(calls, flush)
            row["configs"][str([bt, bh, w])] = {"us": us, "pct_of_copy": 100 * nbytes / (us * 1e3) / copy}
        best = min(row["configs"].items(), key=lambda kv: kv[1]["us"])
        h = row["configs"].get(str(list(row["heuristic"])))
        row["best"] = best[0]
        rows.append(row)
        print(f"append {row['cell']}: heuristic {row['heuristic']} "
              f"{h['pct_of_copy'] if h else float('nan'):.0f}%, best {best[0]} {best[1]['pct_of_copy']:.0f}%",
              flush=True)
        del sets
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu-out"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    copy = harness.copy_bandwidth_gbs("cuda")
    flush = harness.new_flush_buffer()
    t0 = time.time()
    result = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_gbs": copy,
                       "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d")}}
    for name, fn in (("norm", norm_ab), ("decode", decode_ab), ("append", append_ab)):
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
