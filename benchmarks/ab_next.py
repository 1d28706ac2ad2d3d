"""The next device session's A/B runs, prepared and checked on the CPU: one call, ~1-2 min.

    python benchmarks/ab_next.py --out DIR

Rounds 1-4 (benchmarks/results/ab-round{1..4}-h200-20261121.json, NOTES.md) set the batch-1
GEMV launch table, the decode split rule and append_kv's launch.

Round 5:
1. Programmatic dependent launch (``ONETRIP_PDL``, skinny_matmul): the batch-1 GEMV chain
   of a decoder without its attention (per layer qkv + RMSNorm, o + residual, gate_up +
   RMSNorm, down + SwiGLU + residual; 16 layers of 1B shapes, 32 of 8B, distinct weights,
   so every call reads HBM), one CUDA graph per step, PDL off / wait first / prefetch the
   first weight chunk to L2 then wait. Outputs must match bit for bit. Prediction: the
   1B step's GEMVs (64 launches, ~0.68 ms) lose ~1 us per launch with PDL (~-10%), more
   with the prefetch; 8B (128 launches, ~3.6 ms) ~-3%.
2. The same switch over the whole engine step (onetrip-graphs, batch 1, 32-token prompt,
   128 new tokens, 1B and 8B presets, random weights): every decode-step kernel (GEMVs,
   append_kv, decode attention and its merge, argmax) launched with PDL. Greedy tokens
   must equal PDL off. Prediction: 1B 0.91 -> ~0.80 ms a step (7 launches a layer, ~1 us
   each), 8B 4.1 -> ~3.9 ms.
3. Decode attention at batch 64 x 1K (86% of copy, contiguous and paged; SDPA 92%): one
   program per (sequence, kv head) holds only 8 key tiles. Sweep 1-4 splits and the tile
   shapes. Prediction: 2 splits (two waves) reach ~90%.

Every variant is timed as one CUDA graph (median of 15 replays); writes ab-next.json.
Earlier rounds' sweeps are in git history beside their results files.
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

gn = importlib.import_module("onetrip.ops.gemv_norm")
da = importlib.import_module("onetrip.ops.decode_attention")

HEADS = (32, 8, 128)  # query heads, kv heads, head dim


# round 4 swept paged 16 x 8K ... 64 x 8K; batch 1 x 128K paged reads 87% of copy (2 waves)
PAGED_CELLS = ((64, 1024, "contiguous"), (64, 1024, "paged-64"), (1, 131072, "paged-64"))


def paged_ab(flush, copy, dev="cuda"):
    rows = []
    gen = torch.Generator(device=dev).manual_seed(0)
    H, KVH, D = HEADS
    for b, ctx, layout in PAGED_CELLS:
        cell = DecodeCell("decode", layout, b, ctx, heads=H, kv_heads=KVH, head_dim=D)
        t = make_inputs(cell, torch.bfloat16, dev, gen)
        nbytes = 2 * b * ctx * KVH * D * 2
        heur = da._default_config(t["q"], t["k_cache"], t["block_table"])
        ref = da.decode_attention(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"],
                                  block_table=t["block_table"]).float()
        row = {"cell": f"B={b} ctx={ctx} {layout}", "heuristic": dataclasses.astuple(heur), "configs": {}}
        for (bn, warps), mult in itertools.product(((128, 8), (64, 4), (64, 8), (32, 4)), (1, 2, 4)):
            splits = heur.num_splits * mult
            out = torch.empty_like(t["q"])
            call = lambda cfg=da.DecodeConfig(bn, warps, splits): da._launch(  # noqa: E731
                t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"], t["block_table"], out, D ** -0.5, -1, 0.0, cfg)
            call()
            err = (out.float() - ref).abs().max().item()
            us = 1e3 * time_per_call([call], flush)
            row["configs"][str([bn, warps, splits])] = {"us": us, "pct_of_copy": 100 * nbytes / (us * 1e3) / copy,
                                                        "max_diff": err}
        rows.append(row)
        top = sorted(row["configs"].items(), key=lambda kv: kv[1]["us"])
        print(f"{row['cell']:28s} heuristic {row['heuristic']}: " + ", ".join(
            f"{c} {r['pct_of_copy']:.0f}%" for c, r in top[:4]) + f" ... worst {top[-1][0]} "
            f"{top[-1][1]['pct_of_copy']:.0f}%", flush=True)
        del t
        torch.cuda.empty_cache()
    return rows


# hidden, qkv rows, intermediate, layers
CHAIN_SHAPES = {"1B": (2048, 3072, 8192, 16), "8B": (4096, 6144, 14336, 32)}


def _chain_step(layers, x0, res0, g, eps=1e-5):
    """The batch-1 GEMV chain of ``layers`` (Wqkv, Wo, Wgu, Wd) as the engine runs it, with
    qkv's first H columns standing in for attention's output. Returns the last h."""
    hidden = x0.shape[-1]
    h, ss = gn.gemv_add_residual(x0, layers[0][1], res0)
    for wqkv, wo, wgu, wd in layers:
        qkv = gn.gemv_rms_norm(h, ss, g, eps, wqkv)
        h, ss = gn.gemv_add_residual(qkv[:, :hidden], wo, h)
        gu = gn.gemv_rms_norm(h, ss, g, eps, wgu)
        h, ss = gn.gemv_add_residual(gu, wd, h, silu_mul=True)
    return h


def chain_ab(flush, copy, dev="cuda"):
    rows = []
    for name, (hidden, nqkv, inter, n_layers) in CHAIN_SHAPES.items():
        gen = torch.Generator(device=dev).manual_seed(0)
        rnd = lambda *shape: torch.randn(shape, generator=gen, device=dev, dtype=torch.bfloat16) * 0.02  # noqa: E731
        layers = [(rnd(nqkv, hidden), rnd(hidden, hidden), rnd(2 * inter, hidden), rnd(hidden, inter))
                  for _ in range(n_layers)]
        nbytes = sum(w.numel() * 2 for layer in layers for w in layer)
        x0, res0 = rnd(1, hidden) * 50, rnd(1, hidden) * 50
        g = (1 + 0.1 * torch.randn(hidden, generator=gen, device=dev)).to(torch.bfloat16)
        row = {"model": name, "layers": n_layers, "launches": 1 + 4 * n_layers, "weight_bytes": nbytes,
               "floor_us": nbytes / (copy * 1e3)}
        ref = None
        for mode in (0, 1, 2):
            os.environ["ONETRIP_PDL"] = str(mode)
            try:
                out = {}
                us = 1e3 * time_per_call([lambda: out.__setitem__("h", _chain_step(layers, x0, res0, g))], flush)
                h = out["h"].clone()
                same = ref is None or torch.equal(h, ref)
                ref = h if ref is None else ref
                row[f"pdl{mode}"] = {"us": us, "pct_of_copy": 100 * nbytes / (us * 1e3) / copy, "same_as_off": same}
            except Exception as exc:  # noqa: BLE001 - recorded (a driver without PDL in capture)
                row[f"pdl{mode}"] = {"error": str(exc)[:300]}
        os.environ["ONETRIP_PDL"] = "0"
        rows.append(row)
        print(f"GEMV chain {name} ({row['launches']} launches, floor {row['floor_us']:.0f} us): " + ", ".join(
            f"PDL {m}: " + (f"{row[f'pdl{m}']['us']:.0f} us ({row[f'pdl{m}']['pct_of_copy']:.0f}%, same "
                            f"{row[f'pdl{m}']['same_as_off']})" if "us" in row[f"pdl{m}"] else row[f"pdl{m}"]["error"])
            for m in (0, 1, 2)), flush=True)
        del layers
        torch.cuda.empty_cache()
    return rows


ENGINE_PRESETS = ("llama-3.2-1b", "llama-3.1-8b")


def engine_ab(flush, copy, dev="cuda", new_tokens=128, prompt=32):
    from onetrip.bench.decode import _prompts, build, run_engine
    from onetrip.engine.budget import decode_budget

    rows = []
    for preset in ENGINE_PRESETS:
        model, _ = build(preset, torch.bfloat16, dev, False)
        prompts = _prompts(1, prompt, model.config.vocab_size)
        steps = new_tokens - 1
        budget = decode_budget(model.config, model.dtype, 1, [prompt], steps, copy)
        row = {"preset": preset, "limit_tok_s": budget.limit_tok_s}
        ref = None
        for mode in (0, 1, 2):
            os.environ["ONETRIP_PDL"] = str(mode)
            try:
                best = None
                for _ in range(2):  # two timed runs, the faster kept (the first may still warm clocks)
                    toks, _, decode, _ = run_engine(model, prompts, new_tokens, graphs=True)
                    best = decode if best is None else min(best, decode)
                ms = best * 1e3 / steps
                ref = toks if ref is None else ref
                row[f"pdl{mode}"] = {"ms_per_step": ms, "tok_s": 1e3 / ms, "pct_of_limit": budget.pct_of_limit(ms),
                                     "same_tokens_as_off": toks == ref}
            except Exception as exc:  # noqa: BLE001 - recorded
                row[f"pdl{mode}"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        os.environ["ONETRIP_PDL"] = "0"
        rows.append(row)
        print(f"engine {preset}: " + ", ".join(
            f"PDL {m}: " + (f"{row[f'pdl{m}']['ms_per_step']:.3f} ms ({row[f'pdl{m}']['pct_of_limit']:.0f}%, same "
                            f"{row[f'pdl{m}']['same_tokens_as_off']})" if "ms_per_step" in row[f"pdl{m}"]
                            else row[f"pdl{m}"]["error"]) for m in (0, 1, 2)), flush=True)
        del model
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
    for name, fn in (("chain", chain_ab), ("engine", engine_ab), ("decode_splits", paged_ab)):
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
