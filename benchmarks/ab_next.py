"""The next device session's A/B runs, prepared and checked on the CPU: one call, ~2 min.

    python benchmarks/ab_next.py --out DIR

1. RMSNorm carried by the GEMV (``gemv_rms_norm``): rsqrt in the prologue (what the
   engine runs, measured 2026-11-21: qkv 5.0 -> 5.5 us, gate_up 20.0 -> 21.0 us against
   the plain GEMV) against rsqrt after the K loop (``rstd_late``). Prediction: late within
   0.2 us of the plain GEMV, because the partials' load no longer gates the first FMA.
2. decode_attention launch configs against SDPA (enable_gqa) on the cells where it trails:
   batch 1 x 4K, 4 x 32K, 64 x 8K (contiguous, 32/8 heads, head dim 128): block_n 32/64/
   128, 4/8 warps, the heuristic split count and half / twice it, and each launch with
   the merge inside the attention kernel (``DecodeConfig.fused_merge``). Prediction:
   batch 1 x 4K stays under 30% with two launches and gains ~2 us (of ~19) fused; the
   large cells gain from 128-key tiles and 8 warps (207 registers, no spills).

Every variant is timed as one CUDA graph over enough input copies to pass 256 MiB (each
call reads HBM), median of 15, per call; prints tables and writes ab-next.json.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sweep_gemv import ROTATE, time_per_call  # noqa: E402

from onetrip.bench import harness  # noqa: E402

gn = importlib.import_module("onetrip.ops.gemv_norm")
sk = importlib.import_module("onetrip.ops.skinny_matmul")
da = importlib.import_module("onetrip.ops.decode_attention")

NORM_SHAPES = {"1B qkv": (3072, 2048), "1B gate_up": (16384, 2048), "1B lm_head": (128256, 2048),
               "8B qkv": (6144, 4096), "8B gate_up": (28672, 4096)}
DECODE_CELLS = ((1, 4096), (4, 32768), (64, 8192))


def norm_ab(flush, copy, dev="cuda"):
    rows = []
    for name, (n, k) in NORM_SHAPES.items():
        copies = max(1, min(32, -(-ROTATE // (n * k * 2))))
        ws = [torch.randn((n, k), device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn((1, 2048), device=dev, dtype=torch.bfloat16)
        wo = torch.randn((k, 2048), device=dev, dtype=torch.bfloat16) * 0.02
        h, ss = gn.gemv_add_residual(x, wo, torch.randn((1, k), device=dev, dtype=torch.bfloat16))
        g = torch.ones(k, device=dev, dtype=torch.bfloat16)
        ref = gn.gemv_rms_norm_ref(h, g, 1e-5, ws[0])
        row = {"shape": name, "N": n, "K": k, "floor_us": n * k * 2 / (copy * 1e3)}
        variants = {"plain GEMV": lambda w: sk.skinny_matmul(h, w),
                    "norm, rsqrt first": lambda w: gn.gemv_rms_norm(h, ss, g, 1e-5, w),
                    "norm, rsqrt late": lambda w: gn.gemv_rms_norm(h, ss, g, 1e-5, w, rstd_late=True)}
        for label, fn in variants.items():
            if label != "plain GEMV":
                err = ((fn(ws[0]).float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                row[f"{label} rel_err"] = err
            row[label] = 1e3 * time_per_call([lambda w=w, fn=fn: fn(w) for w in ws], flush)
        rows.append(row)
        print(f"{name:12s} floor {row['floor_us']:6.1f} us | " + " | ".join(
            f"{lab} {row[lab]:6.1f}" for lab in variants), flush=True)
        del ws
        torch.cuda.empty_cache()
    return rows


def decode_ab(flush, copy, dev="cuda"):
    rows = []
    H, KVH, D = 32, 8, 128
    for b, ctx in DECODE_CELLS:
        nbytes = 2 * b * ctx * KVH * D * 2
        copies = max(1, min(16, -(-ROTATE // nbytes)))
        sets = []
        for _ in range(copies):
            k = torch.randn((b, ctx, KVH, D), device=dev, dtype=torch.bfloat16)
            sets.append((torch.randn((b, 1, H, D), device=dev, dtype=torch.bfloat16), k, torch.randn_like(k)))
        lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
        base = da.decode_config(b, KVH, ctx, D, torch.device(dev), rows=H // KVH)
        row = {"batch": b, "context": ctx, "heuristic": [base.block_n, base.num_warps, base.num_splits]}
        sdpa = [lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                     v.transpose(1, 2), enable_gqa=True)
                for q, k, v in sets]
        row["sdpa_us"] = 1e3 * time_per_call(sdpa, flush)
        ref = da.decode_attention(*sets[0], lens)
        results = []

        def timed(cfg, label):
            """One launch config on every input set: its record (time per call or the error)."""
            outs = [torch.empty_like(q) for q, _, _ in sets]
            calls = [lambda q=q, k=k, v=v, o=o: da._launch(q, k, v, lens, None, o, D ** -0.5, -1, 0.0, cfg)
                     for (q, k, v), o in zip(sets, outs)]
            try:
                calls[0]()
                err = (outs[0].float() - ref.float()).abs().max().item()
                us = 1e3 * time_per_call(calls, flush)
            except Exception as exc:  # noqa: BLE001 - recorded
                return {"cfg": label, "error": str(exc)[:160]}
            return {"cfg": label, "us": us, "pct_of_copy": 100 * nbytes / (us * 1e3) / copy, "max_diff": err}

        for bn, w, mult in itertools.product((32, 64, 128), (4, 8), (0.5, 1, 2)):
            splits = max(1, min(int(base.num_splits * mult), -(-ctx // bn)))
            results.append(timed(da.DecodeConfig(bn, w, splits), [bn, w, splits]))
            if mult == 1:  # the same launch with the merge inside the attention kernel
                results.append(timed(da.DecodeConfig(bn, w, splits, fused_merge=True), [bn, w, splits, "fused-merge"]))
        ok = sorted((r for r in results if "us" in r), key=lambda r: r["us"])
        row["configs"] = results
        rows.append(row)
        sd = 100 * nbytes / (row["sdpa_us"] * 1e3) / copy
        print(f"B={b} ctx={ctx}: SDPA {row['sdpa_us']:.1f} us ({sd:.0f}%), heuristic {row['heuristic']}; best "
              + ", ".join(f"{r['cfg']} {r['us']:.1f} us ({r['pct_of_copy']:.0f}%)" for r in ok[:3]), flush=True)
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
                       "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d")},
              "norm": norm_ab(flush, copy), "decode": decode_ab(flush, copy)}
    (args.out / "ab-next.json").write_text(json.dumps(result, indent=1))
    print(f"copy {copy:.0f} GB/s; {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
