"""Round 16 (twelfth session): attention + o projection + residual add in one launch
(``ops/attention_o.py``) against the batch-1 engine's pair (append_attention, then
gemv_add_residual), at the kernel level and over the whole decode step.

    python benchmarks/attention_o_ab.py --out DIR      # on a GPU; ~5 min

kernels: Llama-3.2-1B and -3.1-8B attention shapes (32 / 8 heads, head dim 64 / 128, N 2048
/ 4096), bf16, contiguous cache, one token at context 300 (the engine bench's), 1K, 2K and
4K: the pair, the default config and (at 300) a sweep of rows a program, chunk, key tile,
warps and the early chunk; each timed as one CUDA graph over input copies enough to pass
256 MiB (so W_o and the cache come from HBM, as in the step), per call.
engine: the batch-1 step of both presets (ab_next.engine_ab) with attention_o off, on
(default), on with the PDL trigger at start / after the attention, and on with the sweep's
best config for the shape. Writes attention-o-ab.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import time
from pathlib import Path

import torch

import ab_next
from ab_next import engine_ab, time_per_call
from onetrip.bench import harness
from onetrip.ops.append_attention import append_attention
from onetrip.ops.gemv_norm import gemv_add_residual

ao = importlib.import_module("onetrip.ops.attention_o")
SHAPES = {"llama-3.2-1b": (32, 8, 64, 2048), "llama-3.1-8b": (32, 8, 128, 4096)}  # heads, kv heads, head dim, N
CONTEXTS = (300, 1024, 2048, 4096)


def _inputs(H, KVH, D, N, ctx, dev, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    rn = lambda *s: torch.randn(*s, device=dev, generator=g).to(torch.bfloat16)  # noqa: E731
    qkv = rn(1, 1, (H + 2 * KVH) * D)  # the qkv GEMV's row, split as the engine splits it
    q, k, v = (t.view(1, 1, -1, D) for t in qkv.split([H * D, KVH * D, KVH * D], dim=-1))
    max_seq = ctx + 16
    pos = torch.arange(max_seq, device=dev).float()
    freqs = torch.outer(pos, 500000.0 ** (-torch.arange(0, D, 2, device=dev).float() / D))
    return dict(q=q, k=k, v=v, kc=rn(1, max_seq, KVH, D), vc=rn(1, max_seq, KVH, D),
                lens=torch.tensor([ctx], dtype=torch.int32, device=dev), cos=freqs.cos(), sin=freqs.sin(),
                w=rn(N, H * D) * D ** -0.5, res=rn(1, N), o=torch.empty(1, 1, H, D, dtype=torch.bfloat16, device=dev),
                h=torch.empty(1, N, dtype=torch.bfloat16, device=dev))


def _pair(t):
    append_attention(t["q"], t["k"], t["v"], t["kc"], t["vc"], t["lens"], t["cos"], t["sin"], out=t["o"])
    gemv_add_residual(t["o"].view(1, -1), t["w"], t["res"])


def _fused(t, cfg):
    ss = t.setdefault(("ss", cfg.rows), torch.empty(-(-t["w"].shape[0] // cfg.rows), dtype=torch.float32,
                                                    device=t["w"].device))
    ao._launch(t["q"], t["k"], t["v"], t["kc"], t["vc"], t["lens"], t["cos"], t["sin"], t["w"], t["res"], t["h"], ss,
               None, False, t["q"].shape[-1] ** -0.5, cfg)


def _sweep_configs(default, head_dim):
    """8 warps (at 4 the early chunk takes 250+ registers: ptxas_report.py attention_o), and
    4 warps at the default's shape."""
    blocks = ((128, 128), (128, 64), (64, 64), (256, 128)) if head_dim <= 64 else \
        ((256, 64), (256, 32), (128, 64), (128, 32))
    out = [default, dataclasses.replace(default, num_warps=4), dataclasses.replace(default, early=False)]
    for rows, block_r in blocks:
        for block_n in (64, 128):
            for early in (True, False):
                cfg = ao.AttentionOConfig(rows, block_r, block_n, 8, early)
                if cfg not in out:
                    out.append(cfg)
    return out


def kernel_sweep(flush, copy, dev="cuda"):
    rows, best = [], {}
    for preset, (H, KVH, D, N) in SHAPES.items():
        default = ao.attention_o_config(N, KVH, H // KVH, D, torch.device(dev))
        for ctx in CONTEXTS:
            nbytes = N * H * D * 2 + 2 * ctx * KVH * D * 2  # W_o + the head's cached K/V, once
            n = max(2, min(64, -(-(256 << 20) // nbytes)))
            sets = [_inputs(H, KVH, D, N, ctx, dev, i) for i in range(n)]
            row = {"preset": preset, "ctx": ctx, "input_sets": n, "bytes": nbytes}
            variants = [("pair", _pair)]
            configs = _sweep_configs(default, D) if ctx == CONTEXTS[0] else [default] + (
                [best[preset]] if best.get(preset) not in (None, default) else [])
            variants += [(f"{c}", lambda t, c=c: _fused(t, c)) for c in configs]
            for label, f in variants:
                try:
                    us = 1e3 * time_per_call([lambda t=t, f=f: f(t) for t in sets], flush)
                    row[label] = {"us": us, "pct_of_copy": 100 * nbytes / (us * 1e3) / copy}
                except Exception as exc:  # noqa: BLE001 - recorded
                    row[label] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            timed = {k: v["us"] for k, v in row.items() if isinstance(v, dict) and "us" in v and k != "pair"}
            if ctx == CONTEXTS[0] and timed:
                name = min(timed, key=timed.get)
                best[preset] = next(c for c in configs if f"{c}" == name)
            rows.append(row)
            top = sorted(timed.items(), key=lambda kv: kv[1])[:3]
            print(f"{preset} ctx {ctx}: pair {row['pair'].get('us', float('nan')):.2f} us; default "
                  f"{row.get(f'{default}', {}).get('us', float('nan')):.2f} us; best "
                  + "; ".join(f"{k} {v:.2f}" for k, v in top), flush=True)
            del sets
            torch.cuda.empty_cache()
    return {"rows": rows, "best": {k: dataclasses.asdict(v) for k, v in best.items()}}


def engine(flush, copy, best):
    """The step with attention_o off / on (default) / trigger 1, 2 / the sweep's best config."""
    def with_config(preset_cfgs):
        def pick(n, kv_heads, group, head_dim, device):
            for preset, (H, KVH, D, N) in SHAPES.items():
                if (n, kv_heads, head_dim) == (N, KVH, D) and preset in preset_cfgs:
                    return preset_cfgs[preset]
            return default_rule(n, kv_heads, group, head_dim, device)
        return pick

    default_rule = ao.attention_o_config
    trig = lambda t: {p: dataclasses.replace(default_rule(N, KVH, H // KVH, D, torch.device("cuda")), trigger=t)  # noqa: E731
                      for p, (H, KVH, D, N) in SHAPES.items()}
    ab_next.ENGINE_VARIANTS = (
        ("attention_o off", {"ATTENTION_O": False}),
        ("attention_o", {"ATTENTION_O": True}),
        ("attention_o trigger 1", {"attention_o.attention_o_config": with_config(trig(1))}),
        ("attention_o trigger 2", {"attention_o.attention_o_config": with_config(trig(2))}),
        ("attention_o sweep best", {"attention_o.attention_o_config": with_config(best)}),
    )
    return engine_ab(flush, copy)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu-out"))
    ap.add_argument("--only", nargs="+", choices=("kernels", "engine"), default=None)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    copy = harness.copy_bandwidth_gbs("cuda")
    flush = harness.new_flush_buffer()
    t0 = time.time()
    result = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_gbs": copy,
                       "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d %H:%M")}}
    best = {}
    if not args.only or "kernels" in args.only:
        result["kernels"] = kernel_sweep(flush, copy)
        best = {k: ao.AttentionOConfig(**v) for k, v in result["kernels"]["best"].items()}
        (args.out / "attention-o-ab.json").write_text(json.dumps(result, indent=1, default=str))
    if not args.only or "engine" in args.only:
        result["engine"] = engine(flush, copy, best)
    (args.out / "attention-o-ab.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"copy {copy:.0f} GB/s; {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
