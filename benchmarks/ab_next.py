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
2. Decode attention at batch 64 x 1K (86% of copy, contiguous and paged; SDPA 92%): one
   program per (sequence, kv head) holds only 8 key tiles. Sweep 1-4 splits and the tile
   shapes. Prediction: 2 splits (two waves) reach ~90%.

Every variant is timed as one CUDA graph (median of 15 replays); writes ab-next.json.
``gemv_ab`` (round 3) and ``append_ab`` (round 2) stay callable for re-checks.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
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

# (name, N, K, form): form "residual" (o), "silu residual" (down, x is [gate | up]), "norm" (lm_head)
GEMV_CASES = (("1B o + residual", 2048, 2048, "residual"), ("1B down + SwiGLU + residual", 2048, 8192, "silu residual"),
              ("1B lm_head + norm", 128256, 2048, "norm"), ("8B o + residual", 4096, 4096, "residual"),
              ("8B down + SwiGLU + residual", 4096, 14336, "silu residual"), ("8B lm_head + norm", 128256, 4096, "norm"))
DECODE_CASES = ((4096, 4096, (2, 4, 6, 8, 12, 16, 24, 32)), (288, 2048, (1, 2, 3, 4, 8, 16)))  # length, slots, splits
APPEND_CASES = ((64, 64), (64, 1))  # sequences, new tokens
HEADS = (32, 8, 128)  # query heads, kv heads, head dim


def _best(d: dict) -> tuple:
    ok = [(v, k) for k, v in d.items() if v is not None]
    return min(ok) if ok else (float("nan"), None)


def gemv_ab(flush, copy, dev="cuda"):
    rows = []
    for name, n, k, form in GEMV_CASES:
        copies = max(1, min(32, -(-ROTATE // (n * k * 2))))
        ws = [torch.randn((n, k), device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn((1, 2 * k if form == "silu residual" else k), device=dev, dtype=torch.bfloat16)
        res = torch.randn((1, n), device=dev, dtype=torch.bfloat16)
        g = 1 + 0.1 * torch.randn(k, device=dev, dtype=torch.bfloat16)
        h, ss = gn.gemv_add_residual(torch.randn((1, 2048), device=dev, dtype=torch.bfloat16),
                                     torch.randn((k, 2048), device=dev, dtype=torch.bfloat16) * 0.02,
                                     torch.randn((1, k), device=dev, dtype=torch.bfloat16))
        if form == "norm":
            ref = gn.gemv_rms_norm_ref(h, g, 1e-5, ws[0]).float()
        else:
            ref = gn.gemv_add_residual_ref(x, ws[0], res, form == "silu residual").float()
        rule = sk.skinny_config(1, n, k, 132, fusion=form.replace(" ", "_"))
        row = {"shape": name, "N": n, "K": k, "floor_us": n * k * 2 / (copy * 1e3), "rule": rule.as_list()}

        def launch(w, y, part, c):
            if form == "norm":
                sk._launch(h, w, None, y, c, ss_in=ss, norm_weight=g, eps=1e-5)
            else:
                sk._launch(x, w, None, y, c, form == "silu residual", residual=res, ss_out=part)

        times = {}
        for bn, bk, warps, stages in [(rule.block_n, rule.block_k, rule.num_warps, rule.num_stages), *configs()]:
            if k % bk:
                continue
            cfg = sk.SkinnyConfig(1, bn, bk, 1, warps, False, stages)
            ys = [torch.empty((1, n), device=dev, dtype=torch.bfloat16) for _ in ws]
            parts = [torch.empty(-(-n // bn), device=dev, dtype=torch.float32) for _ in ws]
            try:
                launch(ws[0], ys[0], parts[0], cfg)
                err = ((ys[0].float() - ref).abs().max() / ref.abs().max()).item()
                assert err < 2e-2, f"{name} {cfg}: relative error {err}"
                us = 1e3 * time_per_call([lambda w=w, y=y, p=p: launch(w, y, p, cfg)
                                          for w, y, p in zip(ws, ys, parts)], flush)
            except Exception as exc:  # noqa: BLE001 - recorded
                print(f"  {name} {cfg.as_list()}: {str(exc)[:120]}")
                us = None
            times[str(cfg.as_list())] = us
        row["rule_us"] = times[str(rule.as_list())]
        row["best_us"], row["best_cfg"] = _best(times)
        row["all"] = times
        rows.append(row)
        print(f"{name:28s} floor {row['floor_us']:6.1f} us | rule {row['rule_us']:.1f} {rule.as_list()} | "
              f"best {row['best_us']:.1f} {row['best_cfg']}", flush=True)
        del ws
        torch.cuda.empty_cache()
    return rows


def _decode_calls(sets, lens, cfg, D):
    outs = [torch.empty_like(q) for q, _, _ in sets]
    return [lambda q=q, k=k, v=v, o=o: da._launch(q, k, v, lens, None, o, D ** -0.5, -1, 0.0, cfg)
            for (q, k, v), o in zip(sets, outs)], outs


PAGED_CELLS = ((64, 1024, "contiguous"), (64, 1024, "paged-64"))  # round 4 swept paged 16 x 8K ... 64 x 8K


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
    for name, fn in (("chain", chain_ab), ("decode_b64_1k", paged_ab)):
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
