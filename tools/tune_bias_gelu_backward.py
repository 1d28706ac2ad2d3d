"""Tune bias_gelu's backward with dbias (``bias_gelu.BackwardConfig``): GB/s on the GPU, or
registers offline.

    # on the GPU (meant for < 60 s on an H200): the table, the picks, every record as JSON at OUT
    PYTHONPATH=src python tools/tune_bias_gelu_backward.py OUT.json
    # any machine with triton and no GPU: registers, spills, shared memory and the loop's SASS
    # instructions an element of every candidate at each width's plan, for sm_90a
    python tools/tune_bias_gelu_backward.py --offline [OUT.json]

Widths 1K, 4K, 16K, 64K, 256K, rows = 2**26 // width, bf16, tanh GELU. Each candidate's
launch pair (the row kernel and ``column_sum``: ``bias_gelu._launch_backward``) is timed
alone by ``onetrip.device.time_ms`` (CUDA graph, L2 flushed by a read before each of 100
replays, median). Bytes: dy and x read, dx written, bias read, dbias written (3 rows x width
+ 2 width elements); the float32 partials are not counted. GB/s = bytes / median / 1e9, also
as a % of ``copy_bandwidth_gbs()`` measured in the same run. dx and dbias of each candidate
are checked against float64 by ``onetrip.testing``'s rule (<= 2 x PyTorch's bf16 error +
atol). Candidates compile first in spawned worker processes (Triton's disk cache then serves
the timing process); a candidate that fails is recorded and the sweep goes on. ``no_dbias``
is the row pass alone (the forward's grid, no partials): the ceiling of the layout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

if "--offline" in sys.argv:  # compile for a GPU that is not here: never the interpreter
    os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import triton  # noqa: E402

bg = importlib.import_module("onetrip.ops.bias_gelu")  # the module: onetrip.ops.bias_gelu is the function

WIDTHS = (1024, 4096, 16384, 65536, 262144)
ELEMENTS = 2**26
DT = torch.bfloat16
C = bg.BackwardConfig
# name -> config; None is the row pass without dbias. Registers from --offline (Triton 3.9).
CANDIDATES = {
    **bg.BACKWARD_PICKS,
    "wave8x4_plain": C(prefetch=False),  # no loads in flight while computing: other warps only
    "wave8x4_p32": C(max_partials=32),  # slices half as wide at <= 16K, fewer partial rows
    "wave8x4_p128": C(max_partials=128),  # slices twice as wide at <= 16K
    "wave16x2": C(tile=512, num_warps=2, programs_per_sm=16),
    "wave4x4_t2048": C(tile=2048, programs_per_sm=4),  # 16 a thread in registers, <= 128 registers
    "wave8x4_stages2": C(tile=2048, prefetch=False, stages=2),
    "wave4x8_stages3": C(tile=4096, num_warps=8, programs_per_sm=4, prefetch=False, stages=3),
    # like the layout before the one wave: ~4 programs an SM, bands of 2048-element tiles, no loads in flight
    "band4_plain": C(tile=2048, programs_per_sm=4, prefetch=False, max_partials=1 << 20, min_band=1),
    "no_dbias": None,
}


def problem(width: int, device, fill: bool = True) -> dict:
    rows = ELEMENTS // width
    gen = torch.Generator(device=device).manual_seed(0)
    new = (lambda *s: torch.randn(s, device=device, dtype=DT, generator=gen)) if fill else \
        (lambda *s: torch.empty(s, device=device, dtype=DT))
    return dict(dy=new(rows, width), x=new(rows, width), bias=new(width), dx=new(rows, width), dbias=new(width))


def launch(p: dict, cfg: bg.BackwardConfig | None):
    """A zero-argument call of the launch pair; it returns the row kernel."""
    dbias = None if cfg is None else p["dbias"]
    return lambda: bg._launch_backward(p["dy"], p["x"], p["bias"], p["dx"], dbias, "tanh", cfg)


# -- precompile in worker processes --------------------------------------------------------

_WORKER: dict = {}


def compile_task(task: tuple) -> dict:
    """In a worker: launch (width, name) once on uninitialised tensors of the timed shape (the
    same specialization), so that Triton's disk cache holds the kernels."""
    width, name = task
    try:
        if _WORKER.get("width") != width:
            _WORKER.clear()
            _WORKER.update(width=width, p=problem(width, "cuda", fill=False))
        kernel = launch(_WORKER["p"], CANDIDATES[name])()
        torch.cuda.synchronize()
        return {"n_regs": kernel.n_regs, "n_spills": kernel.n_spills}
    except Exception as e:  # noqa: BLE001 - the timing loop records it again
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def precompile(workers: int, deadline: float) -> None:
    import concurrent.futures as cf
    import multiprocessing as mp

    if workers < 2:
        return
    tasks = [(w, n) for w in WIDTHS for n in CANDIDATES]
    pool = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
    try:
        futures = [pool.submit(compile_task, t) for t in tasks]
        cf.wait(futures, timeout=max(1.0, deadline - time.monotonic()))
    finally:  # waits for the tasks running (no worker may launch while the sweep times)
        pool.shutdown(wait=True, cancel_futures=True)


# -- the GPU sweep -------------------------------------------------------------------------

def exact_and_torch(p: dict) -> dict:
    """float64 dx and dbias, and PyTorch's bf16 errors against them (the ref under autograd:
    dbias is the bf16 dx summed)."""
    t = p["x"].double() + p["bias"].double()
    dx = torch.ops.aten.gelu_backward(p["dy"].double(), t, approximate="tanh")
    theirs = torch.ops.aten.gelu_backward(p["dy"], p["x"] + p["bias"], approximate="tanh")
    exact = dict(dx=dx, dbias=dx.sum(0))
    exact["torch_err"] = dict(dx=float((theirs.double() - dx).abs().max()),
                              dbias=float((theirs.sum(0).double() - exact["dbias"]).abs().max()))
    return exact


def check(p: dict, exact: dict, with_dbias: bool) -> tuple[bool, dict]:
    from onetrip.testing import DEFAULT_ATOL

    errs, ok = {}, True
    for k in ("dx", "dbias") if with_dbias else ("dx",):
        err = (p[k].double() - exact[k]).abs().nan_to_num(nan=float("inf"))
        errs[k] = float(err.max())
        ok &= errs[k] <= 2 * exact["torch_err"][k] + DEFAULT_ATOL[DT]
    return ok, errs


def gpu_main(out: Path, workers: int) -> int:
    from onetrip.bench.harness import device_info, width_label, write_sweep
    from onetrip.device import copy_bandwidth_gbs, new_flush_buffer, time_ms

    start = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    info = device_info("cuda")
    precompile(workers, start + 40)
    copy_gbs = copy_bandwidth_gbs("cuda")
    print(f"{info['gpu']}: copy {copy_gbs:.0f} GB/s; torch {info['torch']}, triton {info['triton']}; "
          f"compiled in {time.monotonic() - start:.0f} s", flush=True)
    flush, records = new_flush_buffer(), []
    for width in WIDTHS:
        p = problem(width, "cuda")
        exact = exact_and_torch(p)
        rows = ELEMENTS // width
        nbytes = (3 * rows * width + 2 * width) * DT.itemsize
        for name, cfg in CANDIDATES.items():
            rec = dict(name=name, width=width, rows=rows, bytes=nbytes, config=asdict(cfg) if cfg else None,
                       plan=asdict(bg.backward_plan(rows, width, cfg, info["sm_count"])) if cfg else None)
            try:
                fn = launch(p, cfg)
                for k in ("dx", "dbias"):
                    p[k].fill_(float("nan"))
                kernel = fn()
                rec["ok"], rec["max_err"] = check(p, exact, cfg is not None)
                t = time_ms(fn, flush=flush)
                gbs = nbytes / (t.median_ms * 1e-3) / 1e9
                rec.update(median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms, graph=t.graph, gbs=gbs,
                           pct_of_copy=100 * gbs / copy_gbs, n_regs=getattr(kernel, "n_regs", None),
                           n_spills=getattr(kernel, "n_spills", None))
            except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
                rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            records.append(rec)
            write_sweep(out, info, copy_gbs, records)
        del p, exact
        torch.cuda.empty_cache()
    report(records, width_label)
    print(f"wrote {out} ({time.monotonic() - start:.0f} s)")
    return 0


def report(records: list[dict], width_label) -> None:
    """The table (GB/s and % of copy a width, ! where a check failed), then the best candidate
    over the widths (geomean of % of copy, every check passed) and per width."""
    at = {(r["name"], r["width"]): r for r in records}
    print(f"\n{'GB/s  % of copy':18s}" + "".join(f"{width_label(w):>13s}" for w in WIDTHS) + "  geomean  registers")
    scores = {}
    for name in CANDIDATES:
        cells, vals = [], []
        for w in WIDTHS:
            r = at.get((name, w), {})
            if r.get("pct_of_copy") is None:
                cells.append(f"{'error' if r.get('error') else '-':>13s}")
                continue
            vals.append(r["pct_of_copy"])
            cells.append(f"{r['gbs']:7.0f} {r['pct_of_copy']:5.1f}{' ' if r['ok'] else '!'}")
        regs = sorted({r["n_regs"] for (n, _), r in at.items() if n == name and r.get("n_regs")})
        ok = len(vals) == len(WIDTHS) and all(at[(name, w)]["ok"] for w in WIDTHS)
        gm = math.exp(sum(map(math.log, vals)) / len(vals)) if ok else None
        if ok and CANDIDATES[name] is not None:
            scores[name] = gm
        print(f"{name:18s}" + "".join(cells) + (f"{gm:9.1f}" if gm else f"{'-':>9s}") + f"  {regs}")
    for r in [r for r in records if r.get("error")][:5]:
        print(f"  {r['name']} {width_label(r['width'])}: {r['error'][:160]}")
    if not scores:
        print("no candidate ran and passed its checks at every width")
        return
    best = max(scores, key=scores.get)
    print(f"\nbest over the widths (geomean): {best} {scores[best]:.1f}% of copy; per width: " + ", ".join(
        f"{width_label(w)} {max(scores, key=lambda n: at[(n, w)]['pct_of_copy'])}" for w in WIDTHS))
    line = f'BACKWARD_PICK = "{best}"' if best in bg.BACKWARD_PICKS else f'"{best}": {CANDIDATES[best]!r}'
    print(f"for src/onetrip/ops/bias_gelu.py: {line}")
    print(json.dumps({"bench": "tune-bias-gelu-backward", "best": best, "geomean_pct_of_copy": round(scores[best], 2),
                      "pct_of_copy": {width_label(w): round(at[(best, w)]["pct_of_copy"], 2) for w in WIDTHS}}))


# -- offline: compile for sm_90a -----------------------------------------------------------

def offline_kernel(rows: int, width: int, cfg: bg.BackwardConfig | None, sms: int = 132) -> dict:
    """Registers, spills, shared memory and loop instructions an element of the row kernel as
    ``_launch_backward`` launches it on dense bf16 (rows, width) with PDL (Hopper): the ints a
    launch marks divisible by 16 get the mark."""
    import subprocess
    import tempfile

    from ptxas_report import PTXAS, _compile_marked

    fn = bg._bias_gelu_backward_kernel
    if cfg is None:
        tile = bg.tile_config(rows, width)
        block_m, block_n, band, warps = tile.block_m, tile.block_n, tile.block_m, tile.num_warps
        extra, maxnreg = dict(PREFETCH=False, STAGES=1), 0
    else:
        plan = bg.backward_plan(rows, width, cfg, sms)
        block_m, block_n, band, warps = plan.block_m, plan.block_n, plan.band, cfg.num_warps
        extra, maxnreg = dict(PREFETCH=cfg.prefetch, STAGES=cfg.stages), cfg.maxnreg
    const = dict(HAS_BIAS=True, HAS_DBIAS=cfg is not None, APPROX_TANH=True, BLOCK_M=block_m, BLOCK_N=block_n,
                 PDL=1, **extra)
    ints = dict(M=rows, N=width, band=band, stride_dym=width, stride_xm=width, stride_dxm=width)
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        sig[n] = "constexpr" if n in const else ("*fp32" if n == "part_ptr" else "*bf16") if n.endswith("_ptr") \
            else "i32"
        if n.endswith("_ptr") or (sig[n] == "i32" and ints[n] % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = _compile_marked(fn, sig, const, attrs, warps, None, maxnreg)
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = Path(d) / "k.ptx", Path(d) / "k.cubin"
        ptx.write_text(k.asm["ptx"])
        err = subprocess.run([PTXAS, "--gpu-name", "sm_90a", "-v", str(ptx), "-o", str(cubin)],
                             capture_output=True, text=True).stderr
        sass = subprocess.run([str(Path(PTXAS).parent / "cuobjdump"), "-sass", str(cubin)], capture_output=True,
                              text=True).stdout
    regs, spill = re.search(r"Used (\d+) registers", err), re.search(r"(\d+) bytes spill stores", err)
    return {"block_m": block_m, "block_n": block_n, "warps": warps, "maxnreg": maxnreg,
            "n_regs": int(regs.group(1)) if regs else None, "n_spills": int(spill.group(1)) if spill else None,
            "shared": k.metadata.shared, "loop_per_element": loop_per_element(sass, block_m * block_n // (32 * warps))}


def loop_per_element(sass: str, per_thread: int) -> float | None:
    """SASS instructions between the longest backward branch and its target, per element a thread."""
    addr = [(int(m.group(1), 16), line) for line in sass.splitlines()
            if (m := re.match(r"\s+/\*([0-9a-f]{4,})\*/", line))]
    loops = [(int(m.group(1), 16), a) for a, line in addr if (m := re.search(r"BRA (0x[0-9a-f]+)", line))
             and int(m.group(1), 16) < a]
    if not loops:
        return None
    lo, hi = max(loops, key=lambda t: t[1] - t[0])
    return round(sum(lo <= a <= hi for a, _ in addr) / per_thread, 1)


def offline_main(out: str | None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    print(f"triton {triton.__version__}, sm_90a, 132 SMs, bf16 rows = 2**26 // width: "
          f"registers (cap), spilled bytes, shared KiB, loop SASS instructions an element")
    seen, records = {}, []
    for name, cfg in CANDIDATES.items():
        cells = []
        for width in WIDTHS:
            rows = ELEMENTS // width
            plan = bg.backward_plan(rows, width, cfg, 132) if cfg else None
            key = (cfg, rows % 16 == 0, plan and (plan.block_m, plan.block_n, plan.band % 16 == 0))
            if key not in seen:
                try:
                    seen[key] = offline_kernel(rows, width, cfg)
                except Exception as e:  # noqa: BLE001 - recorded, the report goes on
                    seen[key] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
            r = seen[key]
            records.append({"name": name, "width": width, **r})
            cells.append(r["error"][:40] if "error" in r else
                         f"{r['n_regs']}({r['maxnreg'] or '-'}) {r['n_spills']}B {r['shared'] // 1024}K "
                         f"{r['loop_per_element']}")
        print(f"{name:16s} " + " | ".join(cells), flush=True)
    if out:
        Path(out).write_text(json.dumps({"triton": triton.__version__, "records": records}, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="JSON path for the records")
    parser.add_argument("--offline", action="store_true", help="registers for sm_90a, no GPU")
    parser.add_argument("--workers", type=int, default=min(8, (os.cpu_count() or 2) // 2),
                        help="processes that compile the candidates first (0: compile as timed)")
    args = parser.parse_args()
    if args.offline:
        return offline_main(args.out)
    if not args.out:
        parser.error("the GPU sweep needs OUT, the JSON path for its records")
    if not torch.cuda.is_available():
        parser.error("no CUDA GPU here; --offline compiles the candidates for sm_90a without one")
    return gpu_main(Path(args.out), args.workers)


if __name__ == "__main__":
    raise SystemExit(main())
