"""The next device session's A/B runs, prepared and checked on the CPU: one call, ~1 min.

    python benchmarks/ab_next.py --out DIR

Rounds 1-6 (benchmarks/results/ab-round{1..6}*-h200-20261121.json, NOTES.md) set the batch-1
GEMV launch table, the decode split rule and tile shapes, append_kv's launch, and which
kernels launch with programmatic dependent launch.

Rounds 8-10 (ab-round{8,9,10}-h200-20261121.json; their scripts are in git history) timed
the split merge inside the attention kernel, append_attention against append_kv +
decode_attention, paged tiles with the block table a tile ahead, an L2 prefetch of the next
GEMV's weight beside each kernel (removed), and what one kernel reads of 4-64 MB
(``read_floor``, kept for reference). Round 11, prepared:
- ``engine``: the batch-1 step as it stands (1B, 8B), the baseline of the session.
- ``tma_sweep``: decode_attention with its K/V tiles through tensor descriptors
  (``DecodeConfig.use_tma``, ``ops/_decode_tma.py``) on contiguous caches, 64- and 128-key
  tiles at 8 warps, 2/3/4 stages, at the heuristic's split count and twice it, beside pointer
  twins. Compiled for sm_90a the pointer path as launched (head dim 128) already double-buffers
  through cp.async at Triton's default 3 stages, with the same buffers as TMA at 3 stages
  (benchmarks/ptxas_report.py), so TMA changes who issues the copies, not how many are in
  flight, until 4 stages. Prediction: 3 stages within +-5% of its pointer twin; 4 stages
  +5-15% at batch 1 x 4K / 8K (29% of copy -> ~33%); nothing at batch 16-64 (one tile ahead
  already covers the latency when every SM is busy).

Round 24 (H100, seventeenth session: the split merge launched under PDL, with the
``profile_b1_4k`` and ``read_floor`` parts; ab-round24-merge-pdl-h100-20261125.json) ran here;
its part (decode_sweep variants carrying module flags, set while a graph was captured) is
in git history at 8775e86.

Every variant is timed as one CUDA graph (median of 15 replays) over enough input copies
to pass 256 MiB; writes ab-next.json. Earlier rounds' code is in git history beside their
results files.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
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

from ab_engine import engine_ab, engine_traces  # noqa: E402  (the batch-1 step's A/Bs)
from onetrip.bench import harness  # noqa: E402
from onetrip.bench.decode_attn import DecodeCell, make_inputs  # noqa: E402
from onetrip.ops.decode_attention import decode_attention  # noqa: E402

da = importlib.import_module("onetrip.ops.decode_attention")
HEADS = (32, 8, 128)  # query heads, kv heads, head dim
# (batch, context, layout): cells short of the bars or of SDPA in the final bench
CELLS = ((1, 4096, "contiguous"), (1, 8192, "contiguous"), (1, 32768, "contiguous"), (4, 8192, "contiguous"),
         (16, 1024, "contiguous"), (1, 4096, "paged-64"), (1, 131072, "paged-64"), (4, 8192, "paged-64"),
         (64, 1024, "paged-64"))
def _cell_calls(b, ctx, layout, dev):
    """Input copies enough to pass 256 MiB (L2 never serves a call), their refs, bytes."""
    H, KVH, D = HEADS
    cell = DecodeCell("decode", layout, b, ctx, heads=H, kv_heads=KVH, head_dim=D)
    nbytes = 2 * b * ctx * KVH * D * 2
    n = max(1, min(16, -(-(256 << 20) // nbytes)))
    sets = [make_inputs(cell, torch.bfloat16, dev, torch.Generator(device=dev).manual_seed(i)) for i in range(n)]
    return sets, nbytes


def _decode_variants(heur, layout):
    """decode_sweep's configs: split counts and tiles around the heuristic; paged, the
    block-table entries one tile ahead."""
    S = heur.num_splits
    variants = [heur, dataclasses.replace(heur, num_splits=2 * S), dataclasses.replace(heur, num_splits=4 * S)]
    variants += [da.DecodeConfig(64, 8, S), da.DecodeConfig(64, 8, 2 * S)]
    if layout != "contiguous":  # the block-table entries one tile ahead
        variants += [dataclasses.replace(heur, table_ahead=True), da.DecodeConfig(64, 8, S, True),
                     da.DecodeConfig(64, 8, 2 * S, True), da.DecodeConfig(32, 4, 2 * S, True)]
    return variants


# The TMA experiment's cells: contiguous caches from batch 1 (bytes in flight per program
# bound the read) to batch 64 (every SM busy).
TMA_CELLS = ((1, 4096, "contiguous"), (1, 8192, "contiguous"), (1, 32768, "contiguous"), (4, 1024, "contiguous"),
             (4, 8192, "contiguous"), (16, 1024, "contiguous"), (64, 1024, "contiguous"))
SHARED_LIMIT = 227 << 10  # shared memory one CTA may take on an H100 / H200


def _tma_variants(heur, layout):
    """The heuristic; use_tma with 64- and 128-key tiles at 8 warps, 2/3/4 stages, at the
    heuristic's split count S and at 2S, each tile and split count beside its pointer twin
    (Triton's default 3 stages: the num_stages field, 1 in its key, is for TMA only). Left out: configs whose K/V buffers, (stages - 1) x 2 tiles
    plus ~8 KiB (ptxas_report.py: 128-key, 4 stages, 200 KiB), would pass SHARED_LIMIT."""
    S, D = heur.num_splits, HEADS[2]
    variants = [heur]
    for block_n, splits in itertools.product((64, 128), (S, 2 * S)):
        variants.append(da.DecodeConfig(block_n, 8, splits))
        variants += [da.DecodeConfig(block_n, 8, splits, use_tma=True, num_stages=st) for st in (2, 3, 4)
                     if 2 * (st - 1) * block_n * D * 2 + (8 << 10) <= SHARED_LIMIT]
    return variants


def decode_sweep(flush, copy, dev="cuda", cells=CELLS, variants_of=_decode_variants):
    rows = []
    D = HEADS[2]
    for b, ctx, layout in cells:
        sets, nbytes = _cell_calls(b, ctx, layout, dev)
        t0 = sets[0]
        heur = da._default_config(t0["q"], t0["k_cache"], t0["block_table"])
        ref = da.decode_attention(t0["q"], t0["k_cache"], t0["v_cache"], t0["cache_seqlens"],
                                  block_table=t0["block_table"]).float()
        row = {"cell": f"B={b} ctx={ctx} {layout}", "input_sets": len(sets),
               "heuristic": dataclasses.astuple(heur), "configs": {}}
        for cfg in dict.fromkeys(variants_of(heur, layout)):
            key = str(list(dataclasses.astuple(cfg)))
            outs = [torch.empty_like(t["q"]) for t in sets]
            calls = [lambda t=t, o=o: da._launch(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"],  # noqa: E731
                                                 t["block_table"], o, D ** -0.5, -1, 0.0, cfg)
                     for t, o in zip(sets, outs)]
            try:
                us = 1e3 * time_per_call(calls, flush)  # already per call
            except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
                row["configs"][key] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                continue
            err = (outs[0].float() - ref).abs().max().item()
            row["configs"][key] = {"us": us, "pct_of_copy": 100 * nbytes / (us * 1e3) / copy, "max_diff": err}
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


# Round 12: batch 64 x 1K, the one cell >= 64K tokens under 90% (paged-64 89.9%, paged-256
# 90.1%): 512 programs at 64-key tiles, 8 warps, 80 registers -> 3 CTAs an SM by registers,
# 396 slots: 1.3 waves. Smaller programs fit one wave.
PAGED_SHORT_CELLS = ((64, 1024, "paged-64"), (64, 1024, "paged-256"), (64, 1024, "contiguous"),
                     (32, 2048, "paged-64"))


def _paged_short_variants(heur, layout):
    S = heur.num_splits
    paged = layout != "contiguous"
    out = [heur]
    for block_n, warps, splits in ((64, 4, S), (32, 4, S), (32, 8, S), (64, 8, S), (128, 8, S), (64, 4, 2 * S),
                                   (32, 4, 2 * S)):
        out.append(da.DecodeConfig(block_n, warps, splits, table_ahead=paged))
    return out


def paged_short(flush, copy, dev="cuda"):
    """decode_sweep over PAGED_SHORT_CELLS with _paged_short_variants."""
    return decode_sweep(flush, copy, dev, PAGED_SHORT_CELLS, _paged_short_variants)


# Round 12b: batch 1 x 128K paged, 91.0-91.4% at 19:48 UTC and 89.5-89.7% at 20:01 (the
# heuristic: 64-key tiles, 8 warps, 33 splits = 264 programs, 3 CTAs an SM fit: 396 slots).
PAGED_LONG_CELLS = ((1, 131072, "paged-64"), (1, 131072, "paged-256"), (4, 32768, "paged-64"))


def _paged_long_variants(heur, layout):
    S = heur.num_splits
    out = [heur]
    for block_n, warps, splits in ((64, 8, 3 * S // 2), (64, 8, 2 * S), (64, 4, S), (64, 4, 2 * S), (32, 4, 2 * S),
                                   (128, 8, S)):
        out.append(da.DecodeConfig(block_n, warps, max(1, splits), table_ahead=True))
    return out


def paged_long(flush, copy, dev="cuda"):
    """decode_sweep over PAGED_LONG_CELLS with _paged_long_variants."""
    return decode_sweep(flush, copy, dev, PAGED_LONG_CELLS, _paged_long_variants)


def tma_sweep(flush, copy, dev="cuda"):
    """decode_sweep over TMA_CELLS with _tma_variants (DecodeConfig.use_tma, contiguous)."""
    return decode_sweep(flush, copy, dev, TMA_CELLS, _tma_variants)


def profile_small(flush, copy, dev="cuda"):
    """The kernels of one graph replay of 16 batch-1 x 4K calls, durations and gaps, at the
    heuristic's split count, twice it, and PyTorch SDPA's (FlashAttention-2 split-KV) on
    the same cache: what its kernels take where it reads 34% of copy and we read 29%."""
    import torch.nn.functional as F

    sets, nbytes = _cell_calls(1, 4096, "contiguous", dev)
    t0 = sets[0]
    heur = da._default_config(t0["q"], t0["k_cache"], None)
    out = {"bytes_per_call": nbytes}

    def ours(cfg):
        outs = [torch.empty_like(t["q"]) for t in sets]
        return [lambda t=t, o=o: da._launch(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"], None,  # noqa: E731
                                            o, 128 ** -0.5, -1, 0.0, cfg) for t, o in zip(sets, outs)]

    sdpa = [lambda t=t: F.scaled_dot_product_attention(  # noqa: E731
        t["q"].transpose(1, 2), t["k_cache"].transpose(1, 2), t["v_cache"].transpose(1, 2), enable_gqa=True)
        for t in sets]
    variants = (("heuristic", heur, ours(heur)),
                ("2x splits", dataclasses.replace(heur, num_splits=2 * heur.num_splits),
                 ours(dataclasses.replace(heur, num_splits=2 * heur.num_splits))),
                ("sdpa", None, sdpa))
    for label, cfg, calls in variants:
        try:
            for c in calls:
                c()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for c in calls:
                    c()
            g.replay()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    flush.sum()
                    g.replay()
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - recorded, the others still run
            out[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                         and "reduce" not in e.name), key=lambda e: e.time_range.start)  # not the flush
        kinds = {}
        for e in events:
            kinds.setdefault(e.name[:60], []).append(e.time_range.elapsed_us())
        gaps = [b.time_range.start - a.time_range.end for a, b in zip(events, events[1:])]
        gaps = [x for x in gaps if x < 50]  # within one replay
        out[label] = {"config": dataclasses.astuple(cfg) if cfg else None,
                      "kernels": {k: {"n": len(v), "median_us": sorted(v)[len(v) // 2]} for k, v in kinds.items()},
                      "median_gap_us": sorted(gaps)[len(gaps) // 2] if gaps else None}
        print(f"batch 1 x 4K, {label}: " + ", ".join(
            f"{k} x{v['n']} median {v['median_us']:.1f} us" for k, v in out[label]["kernels"].items())
            + f"; median gap {out[label]['median_gap_us']} us", flush=True)
    return out


READ_SIZES = (4 << 20, 16 * 1024 * 1024 + 786432, 64 << 20)  # bytes; the middle one is batch 1 x 4K's K + V
READ_GRIDS = (132, 264, 528, 1056, 2112)


def read_floor(flush, copy, dev="cuda"):
    """How much of the copy bandwidth one kernel reaches when it only has N bytes to read
    (the decode cells' timing: one graph over 16 input copies, per call)."""
    from read_tma import _sum_kernel  # noqa: PLC0415 - Gluon, imported when this part runs

    rows = []
    for nbytes in READ_SIZES:
        n = nbytes // 2
        xs = [torch.randn(n, device=dev).to(torch.bfloat16) for _ in range(16)]
        outs = [torch.empty(max(READ_GRIDS), device=dev) for _ in xs]
        row = {"bytes": nbytes, "floor_us": nbytes / copy / 1e3}
        for grid in READ_GRIDS:
            per = -(-n // grid)
            per = -(-per // 4096) * 4096
            calls = [lambda x=x, o=o, g=grid, p=per: _sum_kernel[(g,)](
                x, o, n, p, BLOCK=4096, EVICT="", num_warps=8) for x, o in zip(xs, outs)]
            us = 1e3 * time_per_call(calls, flush)
            row[f"sum {grid} programs"] = {"us": us, "pct_of_copy": 100 * nbytes / (us * 1e3) / copy}
        dsts = [torch.empty(n // 2, device=dev, dtype=torch.bfloat16) for _ in xs]
        calls = [lambda x=x, d=d: d.copy_(x[: n // 2]) for x, d in zip(xs, dsts)]  # nbytes moved: half read, half written
        us = 1e3 * time_per_call(calls, flush)
        row["torch copy"] = {"us": us, "pct_of_copy": 100 * nbytes / (us * 1e3) / copy}
        rows.append(row)
        print(f"read {nbytes / 2**20:.1f} MiB (floor {row['floor_us']:.2f} us): " + ", ".join(
            f"{k} {v['us']:.2f} us {v['pct_of_copy']:.0f}%" for k, v in row.items() if isinstance(v, dict)), flush=True)
        del xs, outs, dsts
        torch.cuda.empty_cache()
    return rows


APPEND_CELLS = ((1, 1024, 64), (8, 1024, 64), (64, 1024, 64), (1, 4096, 128), (1, 32768, 128), (8, 1024, 128))


def append_ab(flush, copy, dev="cuda"):
    """append_kv + decode_attention (two launches) against append_attention (one), one new
    token a sequence, as one CUDA graph over input copies enough to pass 256 MiB."""
    from onetrip.ops.append_attention import append_attention
    from onetrip.ops.append_kv import append_kv

    rows = []
    for (b, ctx, head_dim), layout in itertools.product(APPEND_CELLS, ("contiguous", "paged-64")):
        H, KVH = (32, 8)
        cell = DecodeCell("append_kv", layout, b, ctx, heads=H, kv_heads=KVH, head_dim=head_dim)
        nbytes = 2 * b * ctx * KVH * head_dim * 2
        n = max(1, min(16, -(-(256 << 20) // nbytes)))
        sets = [make_inputs(cell, torch.bfloat16, dev, torch.Generator(device=dev).manual_seed(i)) for i in range(n)]
        for t in sets:
            t["after"] = t["cache_seqlens"] + 1  # the pair's second launch counts the new token
            t["out"] = torch.empty_like(t["q"])

        def pair(t):
            append_kv(t["q"], t["k"], t["v"], t["k_cache"], t["v_cache"], t["cache_seqlens"], t["cos"], t["sin"],
                      block_table=t["block_table"])
            decode_attention(t["q"], t["k_cache"], t["v_cache"], t["after"], block_table=t["block_table"], out=t["out"])

        def fused(t):
            append_attention(t["q"], t["k"], t["v"], t["k_cache"], t["v_cache"], t["cache_seqlens"], t["cos"],
                             t["sin"], block_table=t["block_table"], out=t["out"])

        row = {"cell": f"B={b} ctx={ctx} D={head_dim} {layout}", "input_sets": n}
        for label, f in (("append_kv + decode_attention", pair), ("append_attention", fused)):
            try:
                us = 1e3 * time_per_call([lambda t=t, f=f: f(t) for t in sets], flush)
                row[label] = {"us": us, "pct_of_copy": 100 * nbytes / (us * 1e3) / copy}
            except Exception as exc:  # noqa: BLE001 - recorded
                row[label] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        rows.append(row)
        print(f"{row['cell']:32s} " + ", ".join(
            f"{k}: {v['us']:.2f} us" if "us" in v else f"{k}: {v['error']}" for k, v in row.items()
            if isinstance(v, dict)), flush=True)
        del sets
        torch.cuda.empty_cache()
    return rows


# Round 14 (eleventh session): Nsight Compute at batch 1 x 4K (``diag_decode_ncu.py``) gave
# the attention kernel 13.5 us at 8, 16 and 32 splits alike: MIN_TILES = 4 leaves at most
# 8 splits with keys, so the extra ones were empty, and the merge grew 4.9 -> 7.6 us. Each
# SM runs one 8-warp program (136 KiB of shared memory), 2 warps a scheduler. Here splits
# of 1-2 tiles (``DecodeConfig.min_tiles``), smaller tiles (more programs an SM), and the
# merge in slices of head_dim past MERGE_WHOLE splits.
SPLIT_CELLS = ((1, 4096, "contiguous"), (1, 8192, "contiguous"), (1, 32768, "contiguous"), (4, 8192, "contiguous"),
               (1, 4096, "paged-64"))


def _many_split_variants(heur, layout):
    S = heur.num_splits
    variants = [heur]
    for (block_n, warps), min_tiles, k in itertools.product(((128, 8), (64, 4), (64, 8), (32, 4)), (1, 2), (2, 4, 8)):
        variants.append(da.DecodeConfig(block_n, warps, k * S, table_ahead=layout != "contiguous",
                                        min_tiles=min_tiles))
    return variants


def splits_merge(flush, copy, dev="cuda"):
    return decode_sweep(flush, copy, dev, cells=SPLIT_CELLS, variants_of=_many_split_variants)


def _jsonable(o):
    return sorted(o) if isinstance(o, (set, frozenset)) else str(o)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu-out"))
    ap.add_argument("--only", nargs="+", choices=("engine", "read_floor", "append", "decode_sweep", "tma_sweep",
                                                  "profile_b1_4k", "paged_short", "paged_long", "engine_traces",
                                                  "splits_merge"),
                    default=os.environ.get("AB_ONLY", "").split() or None, help="parts to run (env AB_ONLY)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    copy = harness.copy_bandwidth_gbs("cuda")
    flush = harness.new_flush_buffer()
    t0 = time.time()
    result = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_gbs": copy,
                       "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d")}}
    parts = (("engine", engine_ab), ("read_floor", read_floor), ("append", append_ab), ("decode_sweep", decode_sweep),
             ("tma_sweep", tma_sweep), ("profile_b1_4k", profile_small), ("paged_short", paged_short),
             ("paged_long", paged_long), ("engine_traces", functools.partial(engine_traces, out_dir=args.out)),
             ("splits_merge", splits_merge))
    for name, fn in parts:
        if args.only and name not in args.only:
            continue
        try:
            result[name] = fn(flush, copy)
        except Exception as exc:  # noqa: BLE001 - the other parts still report
            import traceback
            traceback.print_exc()
            result[name] = {"error": repr(exc)}
        (args.out / "ab-next.json").write_text(json.dumps(result, indent=1, default=_jsonable))
    print(f"copy {copy:.0f} GB/s; {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
