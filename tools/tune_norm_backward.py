"""Tune the RMSNorm / LayerNorm backward (``_norm_backward.NormBackwardConfig``): GB/s on the
GPU, or registers offline.

    # on the GPU (meant for < 120 s on an H200): the tables, the picks to paste, every record as JSON at OUT
    PYTHONPATH=src python tools/tune_norm_backward.py OUT.json
    # any machine with triton and no GPU: registers, spills, shared memory and the loop's SASS
    # instructions an element of every candidate, for sm_90a
    python tools/tune_norm_backward.py --offline [--ops rms_norm,add_layer_norm] [OUT.json]

Ops rms_norm, add_rms_norm (with dh_out, the gradient of the returned h), layer_norm and
add_layer_norm, each with dweight (and dbias); widths 1K, 2K, 4K, 8K, 16K, 64K, rows = 2**26 //
width, bf16. Each candidate's launches (``_norm_backward.launch_backward``: the row kernel, the
statistics launch of wide rows, ``column_sum``) are timed alone by ``onetrip.device.time_ms``
(CUDA graph, L2 flushed by a read before each of 100 replays, median). Bytes as ``bench ops
--backward`` counts them: dy, h (and dh_out) read, dx written, the weight read, dweight (and
dbias) written; the float32 partials are not counted. GB/s = bytes / median / 1e9, also as a %
of ``copy_bandwidth_gbs()`` measured in the same run. dx, dweight (and dbias) of each candidate
are checked against float64 (autograd through the op's reference on h, once an op and width)
by ``onetrip.testing``'s rule (<= 2 x PyTorch's bf16 error + atol). Candidates compile first in
spawned worker processes (Triton's disk cache then serves the timing process); one that fails
is recorded and the sweep goes on. A candidate giving the config of another at a width is
timed once there.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import re
import sys
import time
from pathlib import Path

if "--offline" in sys.argv:  # compile for a GPU that is not here: never the interpreter
    os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import triton  # noqa: E402

from tune_bias_gelu_backward import loop_per_element  # noqa: E402

nb = importlib.import_module("onetrip.ops._norm_backward")

WIDTHS = (1024, 2048, 4096, 8192, 16384, 65536)
ELEMENTS = 2**26
DT = torch.bfloat16
# op -> (RMSNorm, dh_out read, dbias written): what launch_backward gets from the autograd Function
OPS = {"rms_norm": (True, False, False), "add_rms_norm": (True, True, False),
       "layer_norm": (False, False, True), "add_layer_norm": (False, True, True)}
EPS = {True: 1e-6, False: 1e-5}
C = nb.NormBackwardConfig
WHOLE_MAX = 16384  # whole-row candidates run to here (at 16K they spill 184-672 bytes: shown, the GPU decides)


def _whole(**kw):
    return lambda width: nb.whole_rows(width, **kw) if width <= WHOLE_MAX else None


def _wide(cfg):
    return lambda width: cfg if width >= 8192 else None


def _rows_old(width):
    """The layout before the one wave: 2048-element steps, 8 elements a thread, ~16 warps an
    SM, no loads in flight."""
    if width > nb.ROW_MAX:
        return None
    rows = max(1, 2048 // width)
    warps = min(32, max(1, rows * width // 256))
    return C(rows=rows, num_warps=warps, programs_per_sm=max(1, 16 // warps), prefetch=False)


# name -> width -> config (None: not run at that width). Registers: --offline (Triton 3.9, sm_90a).
CANDIDATES = {
    "pick": lambda width: nb.backward_config(ELEMENTS // width, width, torch.device("cpu")),
    "e16_w16": _whole(),  # the picks' rule: 16 elements a thread, 16 warps an SM, the next row prefetched
    "e16_w12": _whole(warps_per_sm=12),  # up to 168 registers: add_layer_norm unspilled at 1K-4K (148-168)
    "e8_w16": _whole(per_thread=8),  # half the bytes in flight a thread, 80-105 registers
    "e8_w24": _whole(per_thread=8, warps_per_sm=24),  # at most 80 registers
    "e16_w16_plain": _whole(prefetch=False),  # no loads in flight while computing: other warps only
    "e16_w16_stages3": _whole(prefetch=False, stages=3),  # Triton's pipeliner, through shared memory
    "rows_old": _rows_old,
    "wide": _wide(nb.WIDE_PICK),  # statistics launch, then 2048-column segments
    "wide_prefetch": _wide(dataclasses.replace(nb.WIDE_PICK, prefetch=True)),
}


def short(cfg) -> str:
    """The config as code, the fields at their defaults left out."""
    diff = [f"{f.name}={getattr(cfg, f.name)!r}" for f in dataclasses.fields(cfg)
            if getattr(cfg, f.name) != f.default]
    return f"NormBackwardConfig({', '.join(diff)})"


def problem(op: str, width: int, device, fill: bool = True) -> dict:
    is_rms, with_dh, with_db = OPS[op]
    rows = ELEMENTS // width
    gen = torch.Generator(device=device).manual_seed(0)
    new = (lambda *s: torch.randn(s, device=device, dtype=DT, generator=gen)) if fill else \
        (lambda *s: torch.empty(s, device=device, dtype=DT))
    return dict(dy=new(rows, width), h=new(rows, width), dh_out=new(rows, width) if with_dh else None,
                weight=new(width), dx=new(rows, width), dweight=new(width), dbias=new(width) if with_db else None)


def launch(op: str, p: dict, cfg):
    """A zero-argument call of the backward's launches; it returns the row kernel."""
    is_rms = OPS[op][0]
    return lambda: nb.launch_backward(p["dy"], p["h"], p["dh_out"], p["weight"], p["dx"], p["dweight"], p["dbias"],
                                      EPS[is_rms], is_rms, False, cfg)


def grad_names(op: str) -> tuple[str, ...]:
    return ("dx", "dweight", "dbias") if OPS[op][2] else ("dx", "dweight")


def nbytes(op: str, width: int) -> int:
    """dy, h (dh_out) read and dx written a row; the weight read, dweight (dbias) written."""
    _, with_dh, with_db = OPS[op]
    return ((3 + with_dh) * (ELEMENTS // width) * width + (2 + with_db) * width) * DT.itemsize


# -- precompile in worker processes --------------------------------------------------------

_WORKER: dict = {}


def compile_task(task: tuple) -> dict:
    """In a worker: launch (op, width, config) once on uninitialised tensors of the timed shape
    (the same specialization), so that Triton's disk cache holds the kernels."""
    op, width, cfg = task
    try:
        if _WORKER.get("key") != (op, width):
            _WORKER.clear()
            _WORKER.update(key=(op, width), p=problem(op, width, "cuda", fill=False))
        kernel = launch(op, _WORKER["p"], cfg)()
        torch.cuda.synchronize()
        return {"n_regs": kernel.n_regs, "n_spills": kernel.n_spills}
    except Exception as e:  # noqa: BLE001 - the timing loop records it again
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def distinct(op: str, width: int) -> dict:
    """{config: [candidate names]} of an op and width, in candidate order."""
    out: dict = {}
    for name, rule in CANDIDATES.items():
        cfg = rule(width)
        if cfg is not None:
            out.setdefault(cfg, []).append(name)
    return out


def precompile(workers: int, deadline: float) -> None:
    import concurrent.futures as cf
    import multiprocessing as mp

    if workers < 2:
        return
    tasks = [(op, w, cfg) for op in OPS for w in WIDTHS for cfg in distinct(op, w)]
    tasks.sort(key=lambda t: -t[2].num_warps)  # the 16- and 32-warp kernels compile longest: first
    pool = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
    try:
        futures = [pool.submit(compile_task, t) for t in tasks]
        cf.wait(futures, timeout=max(1.0, deadline - time.monotonic()))
    finally:  # waits for the tasks running (no worker may launch while the sweep times)
        pool.shutdown(wait=True, cancel_futures=True)


# -- the GPU sweep -------------------------------------------------------------------------

def reference_grads(op: str, p: dict, dtype: torch.dtype) -> dict:
    """dx (dh_out added), dweight (dbias) by autograd through the op's reference on h in
    ``dtype``: float64 is exact, bf16 is PyTorch's."""
    from onetrip.ops.norm import layer_norm_ref, rms_norm_ref

    is_rms, with_dh, with_db = OPS[op]
    h = p["h"].to(dtype).requires_grad_()
    w = p["weight"].to(dtype).requires_grad_()
    b = torch.zeros_like(w).requires_grad_() if with_db else None
    y = rms_norm_ref(h, w, EPS[True]) if is_rms else layer_norm_ref(h, w, b, EPS[False])
    grads = torch.autograd.grad(y, [t for t in (h, w, b) if t is not None], p["dy"].to(dtype))
    dx = grads[0] + p["dh_out"].to(dtype) if with_dh else grads[0]
    return dict(zip(grad_names(op), (dx, *grads[1:])))


def exact_and_torch(op: str, p: dict) -> dict:
    exact = reference_grads(op, p, torch.float64)
    theirs = reference_grads(op, p, DT)
    exact["torch_err"] = {k: float((theirs[k].double() - exact[k]).abs().max()) for k in theirs}
    return exact


def check(op: str, p: dict, exact: dict) -> tuple[bool, dict]:
    from onetrip.testing import DEFAULT_ATOL

    errs, ok = {}, True
    for k in grad_names(op):
        errs[k] = float((p[k].double() - exact[k]).abs().nan_to_num(nan=float("inf")).max())
        ok &= errs[k] <= 2 * exact["torch_err"][k] + DEFAULT_ATOL[DT]
    return ok, errs


def sweep_one(op: str, width: int, copy_gbs: float, flush, sms: int) -> list[dict]:
    """Every distinct config of (op, width), timed and checked; a record a candidate name."""
    from onetrip.device import time_ms

    p = problem(op, width, "cuda")
    exact = exact_and_torch(op, p)
    rows, size = ELEMENTS // width, nbytes(op, width)
    records = []
    for cfg, names in distinct(op, width).items():
        rec = dict(op=op, width=width, rows=rows, bytes=size, config=dataclasses.asdict(cfg),
                   plan=dataclasses.asdict(nb.backward_plan(rows, width, cfg, sms)))
        try:
            fn = launch(op, p, cfg)
            for k in grad_names(op):
                p[k].fill_(float("nan"))
            kernel = fn()
            rec["ok"], rec["max_err"] = check(op, p, exact)
            t = time_ms(fn, flush=flush)
            gbs = size / (t.median_ms * 1e-3) / 1e9
            rec.update(median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms, graph=t.graph, gbs=gbs,
                       pct_of_copy=100 * gbs / copy_gbs, n_regs=getattr(kernel, "n_regs", None),
                       n_spills=getattr(kernel, "n_spills", None))
        except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
            rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        records += [{"name": n, **rec} for n in names]
    del p, exact
    torch.cuda.empty_cache()
    return records


def gpu_main(out: Path, workers: int) -> int:
    from onetrip.bench.harness import device_info, width_label, write_sweep
    from onetrip.device import copy_bandwidth_gbs, new_flush_buffer

    start = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    info = device_info("cuda")
    precompile(workers, start + 70)
    copy_gbs = copy_bandwidth_gbs("cuda")
    print(f"{info['gpu']}: copy {copy_gbs:.0f} GB/s; torch {info['torch']}, triton {info['triton']}; "
          f"compiled in {time.monotonic() - start:.0f} s", flush=True)
    flush, records = new_flush_buffer(), []
    for op in OPS:
        for width in WIDTHS:
            records += sweep_one(op, width, copy_gbs, flush, info["sm_count"])
            write_sweep(out, info, copy_gbs, records)
        print(f"{op} done ({time.monotonic() - start:.0f} s)", flush=True)
    report(records, width_label)
    print(f"wrote {out} ({time.monotonic() - start:.0f} s)")
    return 0


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def report(records: list[dict], width_label) -> None:
    """A table an op (GB/s and % of copy a width, ! where a check failed), then the best
    config a width (geomean of % of copy over the ops, every check passed) as the code to
    paste: BACKWARD_PICKS for the whole-row widths up to the first a wide config wins,
    ROW_MAX, and WIDE_PICK (the best wide config over the widths past it)."""
    at = {(r["op"], r["name"], r["width"]): r for r in records}
    for op in OPS:
        print(f"\n{op + ' GB/s  % of copy':30s}" + "".join(f"{width_label(w):>14s}" for w in WIDTHS)
              + "  registers (spilled bytes)")
        for name in CANDIDATES:
            cells, regs = [], []
            for w in WIDTHS:
                r = at.get((op, name, w), {})
                if r.get("pct_of_copy") is None:
                    cells.append(f"{'error' if r.get('error') else '-':>14s}")
                    continue
                cells.append(f"{r['gbs']:8.0f} {r['pct_of_copy']:4.1f}{' ' if r['ok'] else '!'}")
                regs.append(f"{r['n_regs']}({r['n_spills']})" if r.get("n_spills") else str(r.get("n_regs")))
            print(f"{name:30s}" + "".join(cells) + "  " + " ".join(regs))
    for r in [r for r in records if r.get("error")][:5]:
        print(f"  {r['op']} {r['name']} {width_label(r['width'])}: {r['error'][:160]}")
    best = {}  # width -> (geomean over the ops, name, config)
    for w in WIDTHS:
        for name in CANDIDATES:
            rs = [at.get((op, name, w), {}) for op in OPS]
            if all(r.get("pct_of_copy") and r["ok"] for r in rs):
                gm = _geomean([r["pct_of_copy"] for r in rs])
                if w not in best or gm > best[w][0]:
                    best[w] = (gm, name, C(**rs[0]["config"]))
    if not best:
        print("no candidate ran and passed its checks for every op at any width")
        return
    print("\nbest a width (geomean over the ops): " + ", ".join(
        f"{width_label(w)} {name} {gm:.1f}%" for w, (gm, name, _) in best.items()))
    whole = []
    for w in WIDTHS:
        if w not in best or best[w][2].wide:
            break
        whole.append(w)
    per_op = lambda w, name: " ".join(f"{at[(op, name, w)]['pct_of_copy']:.1f}" for op in OPS)  # noqa: E731
    print("\nfor src/onetrip/ops/_norm_backward.py (% of copy: " + ", ".join(OPS) + "):")
    print("BACKWARD_PICKS = {")
    for w in whole:
        gm, name, cfg = best[w]
        print(f"    {w}: {short(cfg)},  # {name}: {per_op(w, name)}")
    print("}")
    if whole:
        print(f"ROW_MAX = {whole[-1]}")
    rest = [w for w in WIDTHS if w not in whole]
    wide_scores = {}
    for name in CANDIDATES:
        rs = [at.get((op, name, w), {}) for op in OPS for w in rest]
        if rest and all(r.get("pct_of_copy") and r["ok"] and r["config"]["segment"] for r in rs):
            wide_scores[name] = (_geomean([r["pct_of_copy"] for r in rs]), C(**rs[0]["config"]))
    if wide_scores:
        name = max(wide_scores, key=lambda n: wide_scores[n][0])
        gm, cfg = wide_scores[name]
        print(f"WIDE_PICK = {short(cfg)}  # {name}: {gm:.1f}% geomean over {', '.join(map(width_label, rest))}")
    print(json.dumps({"bench": "tune-norm-backward", "best": {width_label(w): {"name": n, "geomean_pct_of_copy":
                      round(gm, 2)} for w, (gm, n, _) in best.items()},
                      "pct_of_copy": {op: {width_label(w): round(at[(op, best[w][1], w)]["pct_of_copy"], 2)
                                           for w in best} for op in OPS}}))


# -- offline: compile for sm_90a -----------------------------------------------------------

def offline_kernel(op: str, rows: int, width: int, cfg, sms: int = 132) -> dict:
    """Registers, spills, shared memory and loop instructions an element of the row kernel as
    ``launch_backward`` launches it on dense bf16 (rows, width) with PDL (Hopper): ints that
    are 1 become constants and multiples of 16 get the divisibility mark, as at a launch."""
    import subprocess
    import tempfile

    from ptxas_report import PTXAS, _compile_marked

    is_rms, with_dh, with_db = OPS[op]
    plan = nb.backward_plan(rows, width, cfg, sms)
    fn = nb._backward_kernel
    const = dict(IS_RMS=is_rms, GEMMA=False, HAS_WEIGHT=True, HAS_DH_OUT=with_dh, STORE_DX=True, HAS_DW=True,
                 HAS_DB=with_db, WIDE=cfg.wide, EVEN=width % plan.block_n == 0, BLOCK_M=cfg.rows,
                 BLOCK_N=plan.block_n, PREFETCH=cfg.prefetch, STAGES=cfg.stages, PDL=1)
    ints = dict(M=rows, N=width, band_rows=plan.band_rows, n_segs=plan.segs, stride_dym=width, stride_hm=width,
                stride_dhom=width if with_dh else 0, stride_dxm=width)
    const.update({k: 1 for k, v in ints.items() if v == 1})
    f32 = {"pw_ptr", "stats_ptr"} | ({"pb_ptr"} if with_db else set())
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        sig[n] = "constexpr" if n in const else ("*fp32" if n in f32 else "*bf16") if n.endswith("_ptr") \
            else "fp32" if n == "eps" else "i32"
        if n.endswith("_ptr") or (sig[n] == "i32" and ints[n] % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = _compile_marked(fn, sig, const, attrs, cfg.num_warps, None, cfg.maxnreg)
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = Path(d) / "k.ptx", Path(d) / "k.cubin"
        ptx.write_text(k.asm["ptx"])
        err = subprocess.run([PTXAS, "--gpu-name", "sm_90a", "-v", str(ptx), "-o", str(cubin)],
                             capture_output=True, text=True).stderr
        sass = subprocess.run([str(Path(PTXAS).parent / "cuobjdump"), "-sass", str(cubin)], capture_output=True,
                              text=True).stdout
    regs, spill = re.search(r"Used (\d+) registers", err), re.search(r"(\d+) bytes spill stores", err)
    per_thread = cfg.rows * plan.block_n // (32 * cfg.num_warps)
    return {"block_n": plan.block_n, "maxnreg": cfg.maxnreg, "n_regs": int(regs.group(1)) if regs else None,
            "n_spills": int(spill.group(1)) if spill else None, "shared": k.metadata.shared,
            "loop_per_element": loop_per_element(sass, max(1, per_thread))}


def offline_main(out: str | None, ops: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    print(f"triton {triton.__version__}, sm_90a, 132 SMs, bf16 rows = 2**26 // width: "
          f"registers (cap), spilled bytes, shared KiB, loop SASS instructions an element")
    records = []
    for op in ops:
        print(f"\n{op}")
        seen = {}
        for name in CANDIDATES:
            cells = []
            for width in WIDTHS:
                cfg = CANDIDATES[name](width)
                if cfg is None:
                    cells.append("-")
                    continue
                if (cfg, width) not in seen:
                    try:
                        seen[(cfg, width)] = offline_kernel(op, ELEMENTS // width, width, cfg)
                    except Exception as e:  # noqa: BLE001 - recorded, the report goes on
                        seen[(cfg, width)] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
                r = seen[(cfg, width)]
                records.append({"op": op, "name": name, "width": width, "config": dataclasses.asdict(cfg), **r})
                cells.append(r["error"][:40] if "error" in r else
                             f"{r['n_regs']}({r['maxnreg']}) {r['n_spills']}B {r['shared'] // 1024}K "
                             f"{r['loop_per_element']}")
            print(f"{name:16s} " + " | ".join(cells), flush=True)
    if out:
        Path(out).write_text(json.dumps({"triton": triton.__version__, "records": records}, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="JSON path for the records")
    parser.add_argument("--offline", action="store_true", help="registers for sm_90a, no GPU")
    parser.add_argument("--ops", default=",".join(OPS), help="offline: the ops, comma-separated")
    parser.add_argument("--workers", type=int, default=max(2, min(14, (os.cpu_count() or 2) - 2)),
                        help="processes that compile the candidates first (0: compile as timed)")
    args = parser.parse_args()
    if args.offline:
        ops = args.ops.split(",")
        if unknown := [o for o in ops if o not in OPS]:
            parser.error(f"--ops: unknown {unknown}; choose from {list(OPS)}")
        return offline_main(args.out, ops)
    if not args.out:
        parser.error("the GPU sweep needs OUT, the JSON path for its records")
    if not torch.cuda.is_available():
        parser.error("no CUDA GPU here; --offline compiles the candidates for sm_90a without one")
    return gpu_main(Path(args.out), args.workers)


if __name__ == "__main__":
    raise SystemExit(main())
