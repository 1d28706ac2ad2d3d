"""Sweep launch configurations of the memory-bound kernels on a GPU; print the best per width.

    PYTHONPATH=src python3 tools/tune_ops.py [--out DIR] [--quick]

For each kernel family and width (rows = 2**26 / width, bf16: 128 MiB per tensor) it times every candidate
config (CUDA graph replay, L2 flushed before each rep, median; --rotate N: N calls back to
back over N copies of the buffers, as the ops bench times with 4-6 (the last call's writes
still in the L2 at the end are not paid, so small N flatters small shapes); --repeat R: R
interleaved rounds over the candidates, their median), and records GB/s, % of the copy
bandwidth, and the compiler's report of the kernel (registers, spills, shared memory). The
ops' launch tables come from these sweeps.

NormConfig fields are named as the config names them; a group's field as ``group.field``
(``--flip hints.drop_y``, ``--vary l2.ahead_rows=8,16``, ``--set reuse.store_h_early=True``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import sys

import torch
import triton

from onetrip.bench.harness import copy_bandwidth_gbs, device_info, per_call, sweep_path, time_ms, write_sweep
import importlib

bg = importlib.import_module("onetrip.ops.bias_gelu")  # the package re-exports a function of that name
glu = importlib.import_module("onetrip.ops.glu")
norm = importlib.import_module("onetrip.ops.norm")
from onetrip.ops._common import TileConfig
from onetrip.ops._norm_smem import smem_fits

WIDTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
DT = torch.bfloat16
ELEMS = 2**26


def get_field(cfg, name: str):
    """``cfg``'s field ``name``: a NormConfig field, or a group's as 'group.field'."""
    obj = cfg
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def replace_field(cfg, name: str, value):
    """``cfg`` with field ``name`` (a NormConfig field, or a group's as 'group.field') set to ``value``."""
    if "." in name:
        group, field = name.split(".", 1)
        return dataclasses.replace(cfg, **{group: dataclasses.replace(getattr(cfg, group), **{field: value})})
    return dataclasses.replace(cfg, **{name: value})


def _loop(chunk, warps, residual, block_m=1, split=1, held=0, drop_y=False, cluster=False, smem=False, **fields):
    """A "loop" candidate with the L2 hints (h stored early with a residual), the width a constant."""
    return norm.NormConfig("loop", block_m, chunk, warps, const_n=True, split=norm.Split(split, cluster),
                           hints=norm.CacheHints(keep_row=True, drop_y=drop_y),
                           reuse=norm.Reuse(held_chunks=held, store_h_early=residual, smem_segment=smem), **fields)


def tile_candidates(width):
    seen = set()
    for tile, max_bn, warps in itertools.product([1024, 2048, 4096], [1024, 4096], [2, 4, 8]):
        bn = min(triton.next_power_of_2(width), max_bn, tile)
        bm = max(1, tile // bn)
        per_thread = bm * bn // (warps * 32)
        if not 4 <= per_thread <= 32 or (bm, bn, warps) in seen:
            continue
        seen.add((bm, bn, warps))
        yield TileConfig(bm, bn, warps)


def norm_candidates(width):
    bn = triton.next_power_of_2(width)
    if bn <= 65536:
        for tile, warps in itertools.product([1, 4096, 8192, 2 * bn, 4 * bn], [4, 8, 16, 32]):
            bm = max(1, tile // bn)
            per_thread = bm * bn // (warps * 32)
            if 4 <= per_thread <= 64 and bm * bn <= 65536:
                yield norm.NormConfig("rows", bm, bn, warps)
    if width >= 8192:
        for chunk, warps in itertools.product([4096, 8192, 16384], [4, 8, 16]):
            per_thread = chunk // (warps * 32)
            if chunk < width and 8 <= per_thread <= 64:
                yield norm.NormConfig("coop", 1, chunk, warps)
                # statistics then apply, two launches: the second re-reads the row, from L2
                # when the tensor fits it (the bench's 32 MiB inputs do; --elems 16777216)
                yield norm.NormConfig("two_pass", 1, chunk, warps)
        for chunk, warps in itertools.product([2048, 4096, 8192, 16384], [4, 8, 16]):
            if chunk < width and 4 <= chunk // (warps * 32) <= 64:
                # a program per row, two passes over its chunks: the second from L2
                yield norm.NormConfig("loop", 1, chunk, warps)


def focus_candidates(width, rows, is_rms, residual, splits=(), block_ms=(), unrolls=(), holds=(), picks=False,
                     held=False, cluster=False, smem=False):
    """--focus: today's pick (and it with the width as a constant), the coop split, and
    "loop" with its L2 hints (a residual: h stored early) at six chunk / warp pairs
    (torch.compile's own reductions run a program of 16-32 warps per row, with the shapes as
    constants), with the width a runtime value or a constant.
    ``splits`` (--split): instead of that grid, "loop" with each of these programs a row
    (per-lane sums, constant width) at three chunk / warp pairs; ``block_ms`` (--block-m):
    "loop" over that many rows a program, at up to 16 elements a thread; ``unrolls``
    (--unroll): "loop" with that many chunks an iteration; ``holds`` (--hold): "loop" with
    that many chunks held in registers between the passes, a row a program and split as
    the pick is (no 32-warp programs with a residual: they spill). ``picks`` (--picks): the
    pick alone (an A/B of two builds of the kernel, one process each); ``held`` (--held):
    rows split so that each program's whole segment stays in registers between the passes;
    ``cluster`` (--cluster): split rows whose programs are one thread-block cluster (sums
    through shared memory, Hopper), 4-16 programs a row, 0-1 chunks held; with ``smem``
    (--smem) each of those without a residual whose segment fits shared memory also with
    the segment copied there, right after."""
    pick = norm.norm_config(rows, width, torch.device("cuda"), is_rms=is_rms, has_residual=residual)
    yield pick
    if picks:
        return
    if pick.mode == "loop":
        yield dataclasses.replace(pick, const_n=True)
    if cluster:
        for split, (chunk, warps), hold in itertools.product((4, 8, 16), ((2048, 8), (4096, 8), (4096, 16),
                                                                          (8192, 16)), (0, 1)):
            if chunk * split * (hold + 1) <= width:
                cfg = _loop(chunk, warps, residual, split=split, held=hold, drop_y=not residual, cluster=True)
                yield cfg
                if smem and not residual and hold == 0 and smem_fits(width // split, chunk, warps, 2):
                    yield replace_field(cfg, "reuse.smem_segment", True)
        return
    if held:
        for chunk, warps, hold in ((4096, 8, 2), (8192, 16, 1), (8192, 16, 2), (16384, 32, 2)):
            split = width // (chunk * hold)
            if 2 <= split <= 16 and not (residual and warps == 32):
                yield _loop(chunk, warps, residual, split=split, held=hold, drop_y=True)
        return
    if splits:
        for split, (chunk, warps) in itertools.product(splits, ((8192, 16), (8192, 32), (16384, 32))):
            if chunk * split <= width:
                yield _loop(chunk, warps, residual, split=split)
    for bm, (chunk, warps) in itertools.product(block_ms, ((4096, 16), (4096, 32), (8192, 16), (8192, 32),
                                                           (16384, 32))):
        if chunk < width and bm * chunk // (32 * warps) <= 16:
            yield _loop(chunk, warps, residual, block_m=bm)
    for unroll, (chunk, warps) in itertools.product(unrolls, ((4096, 16), (4096, 32), (8192, 16), (8192, 32),
                                                              (16384, 32))):
        if chunk * unroll <= width:
            yield _loop(chunk, warps, residual, unroll=unroll)
    for hold, (chunk, warps), split in itertools.product(holds, ((8192, 16), (8192, 32), (16384, 32)),
                                                         sorted({1, pick.split.programs})):
        if chunk * split * (hold + 1) <= width and not (residual and warps == 32):
            yield _loop(chunk, warps, residual, split=split, held=hold)
    if splits or block_ms or unrolls or holds:
        return
    coop = norm.NormConfig("coop", 1, 8192, 4)
    if width > 8192 and coop != pick:
        yield coop
    for chunk, warps in ((1024, 8), (2048, 8), (2048, 16), (4096, 16), (8192, 16), (8192, 32), (16384, 16),
                         (16384, 32)):
        if chunk >= width:
            continue
        for const_n in (False, True):
            cfg = replace_field(_loop(chunk, warps, residual), "const_n", const_n)
            if cfg != pick and cfg != dataclasses.replace(pick, const_n=True):
                yield cfg


def near_candidates(width, rows, is_rms, residual):
    """--near: today's pick and its neighbours one step away in each knob (split halved and
    doubled, a chunk held more or fewer, the other chunk / warp pairs, drop_y and unroll
    flipped), for re-sweeping on another GPU model the picks an H200's sweeps chose."""
    pick = norm.norm_config(rows, width, torch.device("cuda"), is_rms=is_rms, has_residual=residual)
    yield pick
    if pick.mode != "loop":
        return
    seen = {pick}

    def ok(c):
        split, hold = c.split.programs, c.reuse.held_chunks
        return (split * c.block_n * (hold + 1) <= width and c not in seen
                and not (residual and c.num_warps == 32 and hold > 0)  # spills
                and c.block_n // (32 * c.num_warps) <= 64)
    split, hold = pick.split.programs, pick.reuse.held_chunks
    steps = [("split.programs", min(16, split * 2)), ("split.programs", max(1, split // 2)),
             ("reuse.held_chunks", min(2, hold + 1)), ("reuse.held_chunks", max(0, hold - 1)),
             ("hints.drop_y", not pick.hints.drop_y), ("unroll", 1 if pick.unroll > 1 else 2)]
    variants = [replace_field(pick, name, value) for name, value in steps]
    variants += [dataclasses.replace(pick, block_n=chunk, num_warps=warps)
                 for chunk, warps in ((4096, 16), (8192, 16), (8192, 32), (16384, 32))]
    for c in variants:
        if ok(c):
            seen.add(c)
            yield c


def report(kernel):
    if kernel is None:
        return {}
    meta = getattr(kernel, "metadata", None)
    return {"n_regs": getattr(kernel, "n_regs", None), "n_spills": getattr(kernel, "n_spills", None),
            "shared": getattr(meta, "shared", None)}


def sweep_family(name, width, make, candidates, nbytes, copy_gbs, results, rows, rotate=1, repeat=1):
    """Time each candidate; ``rotate``: calls a timed replay runs back to back, each on the next
    of ``rotate`` copies of the buffers (``make`` cycles them), the time per call; ``repeat``:
    rounds over the whole list in turn (A B A B: drift hits every candidate alike), the
    median of the rounds kept."""
    runs, kernels = {}, {}
    candidates = list(candidates)  # a generator would be spent after the first round
    for _ in range(repeat):
        for cfg in candidates:
            if cfg in kernels and kernels[cfg] is None:
                continue  # failed to compile in an earlier round
            fn, launch = make(cfg)
            try:
                k = launch()
                torch.cuda.synchronize()
                t = per_call(time_ms(lambda: [fn() for _ in range(rotate)]), rotate)
            except Exception as e:  # a config that fails to compile (too many registers, shared memory)
                results.append({"family": name, "width": width, "config": repr(cfg), "error": repr(e)[:300]})
                kernels[cfg] = None
                continue
            kernels[cfg] = k
            runs.setdefault(cfg, []).append(t.median_ms)
    best = None
    for cfg, ms_runs in runs.items():
        ms = statistics.median(ms_runs)
        gbs = nbytes / ms / 1e6
        rec = {"family": name, "width": width, "rows": rows, "config": repr(cfg), "ms": ms,
               "gbs": gbs, "pct_copy": 100 * gbs / copy_gbs, "runs_ms": ms_runs, **report(kernels[cfg])}
        results.append(rec)
        if best is None or rec["ms"] < best["ms"]:
            best = rec
    if best:
        print(f"{name:14s} {width:7d}  {best['gbs']:7.0f} GB/s {best['pct_copy']:5.1f}%  regs={best.get('n_regs')} "
              f"spills={best.get('n_spills')}  {best['config']}", flush=True)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--families", default="bias_gelu,silu_mul,add_rms_norm,rms_norm,add_layer_norm")
    ap.add_argument("--widths", default=None, help="comma-separated widths (default: all, or the quick five)")
    ap.add_argument("--modes", default=None, help="norm modes to sweep, comma-separated (default: all of "
                    "rows,coop,two_pass,loop)")
    ap.add_argument("--focus", action="store_true", help="norms: only today's pick, coop and the loop variants "
                    "(focus_candidates)")
    ap.add_argument("--split", default="", help="with --focus: programs a row to sweep in mode loop, "
                    "comma-separated (e.g. 2,4,8), in place of the single-program grid")
    ap.add_argument("--block-m", default="", help="with --focus: rows a program to sweep in mode loop, "
                    "comma-separated (e.g. 2,4), in place of the single-row grid")
    ap.add_argument("--unroll", default="", help="with --focus: chunks an iteration to sweep in mode loop, "
                    "comma-separated (e.g. 2,4), in place of the single-row grid")
    ap.add_argument("--hold", default="", help="with --focus: chunks held in registers to sweep in mode loop, "
                    "comma-separated (e.g. 1,2), in place of the single-row grid")
    ap.add_argument("--config", action="append", default=[], help="with --focus: a NormConfig(...) repr to time "
                    "beside the pick (repeatable), in place of the single-row grid")
    ap.add_argument("--held", action="store_true", help="with --focus: rows split so that every program holds "
                    "its whole segment in registers (hold = its chunks), in place of the single-row grid")
    ap.add_argument("--cluster", action="store_true", help="with --focus: split rows launched as thread-block "
                    "clusters (4-16 programs a row, sums through shared memory), in place of the single-row grid")
    ap.add_argument("--smem", action="store_true", help="with --focus --cluster: each cluster candidate without a "
                    "residual whose segment fits also with the segment in shared memory, timed beside it")
    ap.add_argument("--near", action="store_true", help="norms: today's pick and its neighbours one step away "
                    "in each knob (near_candidates), to re-sweep the picks on another GPU model")
    ap.add_argument("--picks", action="store_true", help="with --focus: time today's pick alone (A/B runs of "
                    "two builds, e.g. with a change applied in between)")
    ap.add_argument("--flip", action="append", default=[], help="with --focus --picks: also time the pick with "
                    "this boolean NormConfig field negated (repeatable, e.g. hints.drop_y)")
    ap.add_argument("--vary", action="append", default=[], metavar="FIELD=V1,V2", help="with --focus --picks: "
                    "also time the pick with this NormConfig field at each value (repeatable, e.g. l2.ahead_rows=8,16)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="with --focus: set a "
                    "NormConfig field on every candidate but the pick (repeatable, e.g. hints.drop_y=True)")
    ap.add_argument("--rotate", type=int, default=1, help="calls a timed replay runs back to back, each on the "
                    "next of as many copies of the inputs and outputs, time per call (the ops bench's 'rotate' "
                    "timing, which runs 4-6; fewer leave more of each call's writes unpaid when the timer stops: "
                    "on 64 x 256K --rotate 2 read 1-3 points over the bench, so use 4 there)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds over each list of candidates in turn, the "
                    "median kept (interleaved A/B of --flip)")
    ap.add_argument("--elems", type=int, default=ELEMS, help=f"elements per tensor (default {ELEMS}; the "
                    "bench's shapes have 2**24)")
    args = ap.parse_args()
    rotate = max(1, args.rotate)
    dev = torch.device("cuda")
    info = device_info(dev)
    copy = copy_bandwidth_gbs(dev)
    print(f"{info.get('gpu')}  copy {copy:.0f} GB/s", flush=True)
    widths = [1024, 4096, 16384, 65536, 262144] if args.quick else WIDTHS
    if args.widths:
        widths = [int(w) for w in args.widths.split(",")]
    fams = args.families.split(",")
    modes = set(args.modes.split(",")) if args.modes else None
    path = sweep_path(args.out, info, "tune")
    results, best = [], {}
    g = torch.Generator(device=dev).manual_seed(0)
    for width in widths:
        rows = args.elems // width
        w = torch.randn(width, device=dev, generator=g).to(DT)
        # LayerNorm's bias: a tensor of its own, as in the ops bench (w for both halves the
        # weight-and-bias traffic and reads 0.6-1 point high).
        bias = torch.randn(width, device=dev, generator=g).to(DT)
        sets = []  # a call's inputs and outputs, one copy a call of a --rotate replay
        for _ in range(rotate):
            x = torch.randn(rows, width, device=dev, generator=g).to(DT)
            r = torch.randn(rows, width, device=dev, generator=g).to(DT)
            sets.append((x, r, torch.empty_like(x), torch.empty_like(x)))
        x, r, y, h = sets[0]
        E = x.element_size() * rows * width
        W = w.element_size() * width
        if "bias_gelu" in fams:
            def mk(cfg, sets=sets):
                it = itertools.cycle(sets)
                def f():
                    x, _, y, _ = next(it)
                    return bg._launch(x, w, y, "tanh", cfg)
                return f, f
            best[("bias_gelu", width)] = sweep_family("bias_gelu", width, mk, tile_candidates(width), 2 * E + W, copy,
                                                       results, rows, rotate, args.repeat)
        if "silu_mul" in fams:
            gus = [(torch.cat([x, r], 1), y) for x, r, y, _ in sets]
            def mk(cfg, gus=gus):
                it = itertools.cycle(gus)
                def f():
                    gu, y = next(it)
                    return glu._launch(gu[:, :width], gu[:, width:], y, "silu", cfg)
                return f, f
            best[("silu_mul", width)] = sweep_family("silu_mul", width, mk, tile_candidates(width), 3 * E, copy,
                                                      results, rows, rotate, args.repeat)
            del gus
        for fam, res, is_rms in [("add_rms_norm", True, True), ("rms_norm", False, True),
                                 ("add_layer_norm", True, False), ("layer_norm", False, False)]:
            if fam not in fams:
                continue
            def mk(cfg, res=res, is_rms=is_rms, sets=sets):
                it = itertools.cycle(sets)
                def f():
                    x, r, y, h = next(it)
                    return norm._launch(x, r if res else None, w, None if is_rms else bias, y, h if res else None,
                                        1e-6, is_rms, False, cfg)
                return f, f
            nbytes = (4 if res else 2) * E + (1 if is_rms else 2) * W
            splits = [int(k) for k in args.split.split(",") if k]
            block_ms = [int(k) for k in args.block_m.split(",") if k]
            unrolls = [int(k) for k in args.unroll.split(",") if k]
            holds = [int(k) for k in args.hold.split(",") if k]
            if args.near:
                cands = list(near_candidates(width, rows, is_rms, res))
            elif args.focus:
                cands = list(focus_candidates(width, rows, is_rms, res, splits, block_ms, unrolls, holds, args.picks,
                                              args.held, args.cluster, args.smem))
            else:
                cands = list(norm_candidates(width))
            if args.picks:  # the pick against itself with a flag flipped
                cands += [replace_field(cands[0], f, not get_field(cands[0], f)) for f in args.flip]
                for f, vals in (a.split("=", 1) for a in args.vary):
                    cands += [replace_field(cands[0], f, eval(v)) for v in vals.split(",")]
            if args.set:  # e.g. hints.drop_y=True on every candidate but the pick (flipped and varied ones too)
                for k, v in (a.split("=", 1) for a in args.set):
                    cands = [cands[0]] + [replace_field(c, k, eval(v)) for c in cands[1:]]
            if args.config:  # today's pick against the given configs
                names = {n: getattr(norm, n) for n in ("NormConfig", "Split", "CacheHints", "Reuse", "LoadOrder",
                                                        "L2Requests")}
                cands = [cands[0]] + [eval(c, names) for c in args.config]
            cands = [c for c in cands if modes is None or c.mode in modes]
            best[(fam, width)] = sweep_family(fam, width, mk, cands, nbytes, copy, results, rows, rotate,
                                              args.repeat)
        del x, r, y, h, sets
        torch.cuda.empty_cache()
        write_sweep(path, info, copy, results)  # after every step: a cut-off run keeps what it measured
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
