"""Tune flash_attention's backward: registers offline, then backward TFLOP/s on the GPU.

    # any machine with triton (3.6 = the GPU image's) and no GPU: registers and spills of
    # every candidate, compiled for sm_90a with the launch's divisibility marks
    python tools/tune_attention_backward.py --offline [--out offline.json]
    # on the GPU (2-4 minutes on an H200; --budget-s stops starting timings when spent):
    python tools/tune_attention_backward.py --out tune-attention-backward.json

Cells: head dim 64 and 128 (2048 / head_dim heads, no GQA), seq 2048 and 8192, causal and
not, 16K tokens each, bf16. Every candidate of ``CANDIDATES`` (the tiles that compiled
without spills offline; a launch that spills anyway is recorded and not timed) is timed
as a whole backward (``launch_backward``: preprocess, gradient kernels, and in the atomic
mode the zeroing and cast of the float32 dQ) with ``triton.testing.do_bench`` (median, L2
cleared between runs):

    deterministic  each dK/dV tile with the dQ kernel at its pick, and each dQ tile with the
                   dK/dV kernel at its pick (the kernels run one after the other, so the
                   best of each adds up), then the best pair
    atomic         each dK/dV + dQ tile, adding dQ by pointer atomics (atomic) or by TMA
                   bulk reductions (atomic_tma)

SDPA's FlashAttention-2 and cuDNN backward of the same cell are timed beside (autograd of
a recorded forward, ``retain_graph``). TFLOP/s count the backward as 2.5x the forward:
10 * batch * heads * head_dim * seq^2, halved when causal. Candidates compile first in
parallel worker processes (Triton's disk cache then serves the timing process); any
failure (compile error, out of shared memory) is recorded and the sweep goes on.

Output: a table per cell, then per (mode, head dim) the candidate with the best geomean
over the four cells as a ``BACKWARD_PICKS`` line to paste into
``onetrip/ops/_attention_backward_picks.py``, and the JSON of every record at ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

if "--offline" in sys.argv:  # compile for a GPU that is not here: never the interpreter
    os.environ.pop("TRITON_INTERPRET", None)
os.environ["ONETRIP_AUTOTUNE"] = "0"  # the forward that makes out and lse: its heuristic, no tuning sweep
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import triton  # noqa: E402

from onetrip.ops._attention_backward import _bwd_dkdv_kernel, _bwd_dq_kernel, launch_backward  # noqa: E402
from onetrip.ops._attention_backward_picks import AttentionBackwardConfig, BackwardTile, backward_config  # noqa: E402

T = BackwardTile
# (block_m query rows, block_n keys, warps, stages) by padded head dim, for the dK/dV kernel
# (dkdv), the dQ kernel (dq) and the atomic mode's dK/dV + dQ kernel with pointer (atomic)
# or TMA (atomic_tma) adds. Registers per thread from --offline (Triton 3.6, sm_90a, bf16,
# seq 2048, causal / not), none spilling; the tiles left out spill (bytes, causal):
#   dkdv d64: 32x128 4w 168, 128x128 8w 532; d128: 64x128 8w 24, 32x64 4w 48, 64x64 4w 172
#   dq d64: 128x64 4w 216; atomic d64: 32x128 4w 312 (tma 652), 64x64 4w 24 (tma none),
#   128x128 8w tma 780; atomic d128: 64x128 8w 192 (tma 288), 64x64 8w 48 (tma 40),
#   64x64 4w 1180 (tma 464), 32x64 4w 340
CANDIDATES = {
    ("dkdv", 64): [T(32, 128, 8, 2), T(32, 128, 8, 3), T(64, 128, 8, 2), T(64, 128, 8, 3), T(64, 64, 4, 2),
                   T(32, 64, 4, 2)],
    ("dq", 64): [T(128, 32, 8, 2), T(128, 64, 8, 2), T(128, 64, 8, 3), T(64, 64, 4, 2), T(128, 128, 8, 2)],
    ("atomic", 64): [T(32, 128, 8, 2), T(32, 128, 8, 3), T(64, 128, 8, 2), T(64, 128, 8, 3)],
    ("atomic_tma", 64): [T(32, 128, 8, 2), T(32, 128, 8, 3), T(64, 128, 8, 2), T(64, 128, 8, 3), T(64, 64, 4, 2)],
    ("dkdv", 128): [T(32, 128, 8, 2), T(32, 128, 8, 3), T(16, 128, 8, 2), T(64, 64, 8, 2), T(32, 64, 8, 2),
                    T(16, 64, 8, 2)],
    ("dq", 128): [T(128, 32, 8, 2), T(128, 32, 8, 3), T(128, 64, 8, 2), T(128, 64, 8, 3), T(64, 64, 4, 2),
                  T(64, 32, 4, 2), T(64, 32, 8, 2)],
    ("atomic", 128): [T(32, 128, 8, 2), T(32, 128, 8, 3), T(16, 128, 8, 2), T(32, 64, 8, 2)],
    ("atomic_tma", 128): [T(32, 128, 8, 2), T(32, 128, 8, 3), T(16, 128, 8, 2), T(32, 64, 8, 2)],
}
HEAD_DIMS, SEQS, TOKENS, WIDTH = (128, 64), (2048, 8192), 16384, 2048  # 128 first: the wider gap to FA2
DT = torch.bfloat16


def configs(kind: str, head_dim: int) -> list[AttentionBackwardConfig]:
    """The whole-backward configs that time each candidate of ``kind``: a dK/dV tile beside
    the dQ pick, a dQ tile beside the dK/dV pick, an atomic tile with its kind of adds."""
    pick = backward_config(head_dim, dtype=DT, deterministic=True)
    tiles = CANDIDATES[(kind, head_dim)]
    if kind == "dkdv":
        return [AttentionBackwardConfig(t, pick.dq) for t in tiles]
    if kind == "dq":
        return [AttentionBackwardConfig(pick.dkdv, t) for t in tiles]
    return [AttentionBackwardConfig(t, None, kind == "atomic_tma") for t in tiles]


def label(cfg: AttentionBackwardConfig) -> str:
    tile = lambda t: f"{t.block_m}x{t.block_n} {t.num_warps}w {t.num_stages}s"
    if cfg.dq is None:
        return f"atomic {'tma' if cfg.dq_tma else 'ptr'}  {tile(cfg.dkdv)}"
    return f"dkdv {tile(cfg.dkdv)} | dq {tile(cfg.dq)}"


# -- offline: compile for sm_90a without a GPU -----------------------------------------------

def offline_report(kernel: str, tile: BackwardTile, head_dim: int, causal: bool, seq: int = 2048,
                   dtype: str = "bf16") -> dict:
    """Registers, spilled bytes and shared memory of one kernel as ``launch_backward`` launches
    it on dense ``dtype`` (bf16 or fp32) tensors of (B, seq, 2048 / head_dim, head_dim): the
    ints Triton marks divisible by 16 at a launch get the mark, group = 1 is a constant."""
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _bwd_dq_kernel if kernel == "dq" else _bwd_dkdv_kernel
    heads, bd = WIDTH // head_dim, max(16, triton.next_power_of_2(head_dim))
    const = dict(HEAD_DIM=head_dim, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_D=bd, IS_VARLEN=False,
                 HAS_LEFT=False, HAS_RIGHT=causal, HAS_SOFTCAP=False, group=1,
                 DOT_PRECISION="ieee" if dtype == "fp32" else "tf32",
                 ATOMIC_DQ=kernel.startswith("atomic"), DQ_TMA=kernel == "atomic_tma")
    const = {k: v for k, v in const.items() if k in fn.arg_names}
    ints = dict(seqlen_q=seq, seqlen_k=seq, window_left=-1, window_right=0 if causal else -1,
                stride_lb=heads * seq, stride_lh=seq)
    for t in ("q", "k", "v", "do", "dk", "dv", "dq"):
        ints.update({f"stride_{t}b": seq * WIDTH, f"stride_{t}s": WIDTH, f"stride_{t}h": head_dim})
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n == "dq_desc" and const.get("DQ_TMA"):
            sig[n] = f"tensordesc<fp32[1,{tile.block_m},1,{bd}]>"
        elif n == "dq_desc":
            sig[n], const[n] = "constexpr", None
        elif n in const:
            sig[n] = "constexpr"
        elif n.endswith("_ptr"):
            fp32 = n in ("lse_ptr", "delta_ptr") or (n == "dq_ptr" and kernel.startswith("atomic"))
            sig[n] = "*i32" if n.startswith("cu_") else "*fp32" if fp32 else f"*{dtype}"
        else:
            sig[n] = "fp32" if n in ("qk_scale", "cap_in", "cap_out", "softmax_scale") else "i32"
        if n.endswith("_ptr") or (sig[n] == "i32" and ints[n] % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
                    attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": tile.num_warps, "num_stages": tile.num_stages})
    # the ptxas Triton ships that reads the PTX version this Triton writes (a system CUDA's may not)
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    ptxas_bin = bin_dir / "ptxas-blackwell" if (bin_dir / "ptxas-blackwell").exists() else bin_dir / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(compiled.asm["ptx"])
    err = subprocess.run([os.environ.get("PTXAS", str(ptxas_bin)), "--gpu-name", "sm_90a", "-v", f.name, "-o",
                          os.devnull], capture_output=True, text=True).stderr
    os.unlink(f.name)
    regs, spill = re.search(r"Used (\d+) registers", err), re.search(r"(\d+) bytes spill stores", err)
    return {"n_regs": int(regs.group(1)) if regs else None, "n_spills": int(spill.group(1)) if spill else None,
            "shared": compiled.metadata.shared}


def offline_main(out: str | None) -> int:
    print(f"triton {triton.__version__}, sm_90a, bf16, seq 2048: registers causal / not (spilled bytes), "
          f"shared memory causal")
    records = []
    for (kind, head_dim), tiles in CANDIDATES.items():
        for tile in tiles:
            recs = []
            for causal in (True, False):
                rec = {"kernel": kind, "head_dim": head_dim, "causal": causal, **asdict(tile)}
                try:
                    rec.update(offline_report(kind, tile, head_dim, causal))
                except Exception as e:  # noqa: BLE001 - recorded, the report goes on
                    rec["error"] = f"{type(e).__name__}: {str(e)[:160]}"
                recs.append(rec)
            records += recs
            name = f"{kind} d{head_dim} {tile.block_m}x{tile.block_n} {tile.num_warps}w {tile.num_stages}s"
            cells = " / ".join(f"{r['n_regs']} ({r['n_spills']})" if "error" not in r else r["error"][:60]
                               for r in recs)
            print(f"{name:30s} {cells:20s} {(recs[0].get('shared') or 0) // 1024:4d} KiB", flush=True)
    if out:
        Path(out).write_text(json.dumps({"triton": triton.__version__, "records": records}, indent=1))
        print(f"wrote {out}")
    return 0


# -- on the GPU ---------------------------------------------------------------------------------

def cell_tensors(head_dim: int, seq: int, batch: int, causal: bool, gen=None, forward: bool = True) -> dict:
    """q, k, v, dout (batch, seq, 2048 / head_dim, head_dim) bf16, the forward's out and lse
    (``forward``; else random out and zero lse: enough to compile)."""
    from onetrip.ops import flash_attention

    shape = (batch, seq, WIDTH // head_dim, head_dim)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=DT, generator=gen) for _ in range(4))
    if forward:
        out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
    else:
        out, lse = torch.randn_like(q), torch.zeros(shape[0], shape[2], seq, device="cuda")
    grads = [torch.empty_like(q) for _ in range(3)]
    return dict(q=q, k=k, v=v, dout=dout, out=out, lse=lse, grads=grads, causal=causal, seq=seq)


def backward_call(t: dict, cfg: AttentionBackwardConfig):
    """A zero-argument launch of the whole backward at ``cfg``; it returns the compiled kernels."""
    head_dim, seq = t["q"].shape[-1], t["seq"]
    window = (-1, 0) if t["causal"] else (-1, -1)
    return lambda: launch_backward(t["dout"], t["q"], t["k"], t["v"], t["out"], t["lse"], None, *t["grads"], None,
                                   None, seq, seq, head_dim ** -0.5, window, 0.0, cfg.dq is not None, cfg)


def compiled_report(kernels) -> dict:
    """The worst registers and spills over the launch's gradient kernels."""
    regs = [getattr(k, "n_regs", None) for k in kernels]
    spills = [getattr(k, "n_spills", None) for k in kernels]
    return {"n_regs": regs, "n_spills": max((s or 0) for s in spills) if spills else None}


_WORKER_CELLS: dict = {}


def compile_task(task: tuple) -> dict:
    """In a worker process: launch one (head_dim, causal, config) once at seq 2048, batch 1
    (the same specialization as every timed cell), so that Triton's disk cache holds it."""
    head_dim, causal, cfg = task
    try:
        if (head_dim, causal) not in _WORKER_CELLS:
            _WORKER_CELLS[(head_dim, causal)] = cell_tensors(head_dim, 2048, 1, causal, forward=False)
        report = compiled_report(backward_call(_WORKER_CELLS[(head_dim, causal)], cfg)())
        torch.cuda.synchronize()
        return report
    except Exception as e:  # noqa: BLE001 - recorded by the caller, the sweep goes on
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def precompile(tasks: list[tuple], workers: int, deadline: float) -> dict:
    """{task: report} from ``workers`` spawned processes; {} when the pool cannot start (the
    timing process then compiles as it goes)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    if workers < 2:
        return {}
    done = {}
    pool = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
    try:
        futures = {pool.submit(compile_task, t): t for t in tasks}
        for f in cf.as_completed(futures, timeout=max(1.0, deadline - time.monotonic())):
            done[futures[f]] = f.result()
    except Exception as e:  # noqa: BLE001 - a broken pool or the deadline: compile in the timing loop
        print(f"precompile stopped ({type(e).__name__}: {str(e)[:120]}); the rest compiles as timed", flush=True)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return done


def time_ms(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def peer_ms(t: dict, backend: str) -> float:
    """SDPA's backward alone: autograd of one recorded forward, on (batch, heads, seq, dim) copies."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    leaves = [x.transpose(1, 2).contiguous().requires_grad_() for x in (t["q"], t["k"], t["v"])]
    with sdpa_kernel(getattr(SDPBackend, backend)):
        out = F.scaled_dot_product_attention(*leaves, is_causal=t["causal"])
    dout = t["dout"].transpose(1, 2).contiguous()
    return time_ms(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True))


def bwd_flops(head_dim: int, seq: int, batch: int, causal: bool) -> float:
    return 10 * batch * (WIDTH // head_dim) * head_dim * seq * seq / (2 if causal else 1)


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def gpu_main(args) -> int:
    from onetrip.bench.harness import device_info

    info = device_info("cuda")
    print(f"{info['gpu']}  torch {info['torch']}  triton {info['triton']}  cuda {info['cuda']}", flush=True)
    start = time.monotonic()
    deadline = start + args.budget_s
    kinds = ("dkdv", "dq", "atomic", "atomic_tma")
    cells = [(d, s, c) for d in args.head_dims for s in SEQS for c in (True, False)]
    tasks = [(d, c, cfg) for d in args.head_dims for c in (True, False) for kind in kinds for cfg in configs(kind, d)]
    tasks = list(dict.fromkeys(tasks))
    compiled = precompile(tasks, args.workers, start + 0.5 * args.budget_s)
    print(f"compiled {len(compiled)}/{len(tasks)} configs in {time.monotonic() - start:.0f} s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    records, peers = [], []

    def measure(t, cfg, rec):
        if time.monotonic() > deadline:
            rec["error"] = "not measured: time budget spent"
            return
        pre = compiled.get((rec["head_dim"], rec["causal"], cfg), {})
        if "error" in pre:  # tried again here: a worker may fail for reasons of its own
            rec["precompile_error"] = pre["error"]
        try:
            call = backward_call(t, cfg)
            rec.update(compiled_report(call()))
            if rec["n_spills"]:  # the offline report said none: a newer compiler may differ
                rec["error"] = f"spills {rec['n_spills']} bytes: not timed"
                return
            rec["ms"] = time_ms(call)
        except Exception as e:  # noqa: BLE001 - out of resources, compile error: recorded, the sweep goes on
            rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            return
        rec["tflops"] = rec["flops"] / rec["ms"] / 1e9

    for head_dim, seq, causal in cells:
        batch = TOKENS // seq
        t = cell_tensors(head_dim, seq, batch, causal, gen)
        flops = bwd_flops(head_dim, seq, batch, causal)
        base = {"head_dim": head_dim, "seq": seq, "batch": batch, "heads": WIDTH // head_dim, "causal": causal,
                "flops": flops}
        peer = {**base}
        for name, backend in (("fa2", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION")):
            try:
                peer[f"{name}_tflops"] = flops / peer_ms(t, backend) / 1e9
            except Exception as e:  # noqa: BLE001 - a backend refusing the cell
                peer[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:120]}"
        peers.append(peer)
        rows = []
        for kind in kinds:
            for cfg in configs(kind, head_dim):
                rec = {**base, "kind": kind, "config": label(cfg), "dkdv": asdict(cfg.dkdv),
                       "dq": cfg.dq and asdict(cfg.dq), "dq_tma": cfg.dq_tma}
                measure(t, cfg, rec)
                rows.append(rec)
        records += rows
        vs = "  ".join(f"{p} {peer[f'{p}_tflops']:.0f}" if f"{p}_tflops" in peer else f"{p} failed"
                       for p in ("fa2", "cudnn"))
        print(f"\nhead_dim {head_dim}  seq {seq}  batch {batch}  {'causal' if causal else 'full'}  {vs} TFLOP/s  "
              f"({time.monotonic() - start:.0f} s)")
        for r in sorted(rows, key=lambda r: -r.get("tflops", -1.0)):
            print(fmt(r, peer))
        del t
        torch.cuda.empty_cache()

    picks = pick_lines(records, args.head_dims)
    # the picked pairs, timed whole (the deterministic pick's two kernels were timed apart)
    for head_dim, seq, causal in cells:
        if time.monotonic() > deadline or head_dim not in picks:
            continue
        batch = TOKENS // seq
        t = cell_tensors(head_dim, seq, batch, causal, gen)
        peer = next(p for p in peers if (p["head_dim"], p["seq"], p["causal"]) == (head_dim, seq, causal))
        for mode, cfg in picks[head_dim].items():
            rec = {"head_dim": head_dim, "seq": seq, "batch": batch, "causal": causal, "kind": f"pick {mode}",
                   "config": label(cfg), "flops": bwd_flops(head_dim, seq, batch, causal)}
            measure(t, cfg, rec)
            records.append(rec)
            print(f"pick d{head_dim} s{seq} {'causal' if causal else 'full  '} {fmt(rec, peer)}")
        del t
    print("\nBACKWARD_PICKS lines (best geomean over the head dim's cells):")
    for head_dim, by_mode in picks.items():
        for mode, cfg in by_mode.items():
            print(f"    ({mode == 'deterministic'}, {head_dim}): {cfg!r},")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {**info, "dtype": str(DT), "tokens_per_cell": TOKENS, "width": WIDTH,
            "elapsed_s": time.monotonic() - start, "timing": "triton do_bench median, warmup 10 ms, rep 60 ms",
            "flops": "backward = 2.5 x forward = 10 * batch * heads * head_dim * seq^2, halved when causal"}
    picks_json = {str(d): {m: {"dkdv": asdict(c.dkdv), "dq": c.dq and asdict(c.dq), "dq_tma": c.dq_tma}
                           for m, c in by.items()} for d, by in picks.items()}
    out.write_text(json.dumps({"meta": meta, "peers": peers, "picks": picks_json, "records": records}, indent=1))
    print(f"wrote {out}")
    print(json.dumps({"records": len(records), "elapsed_s": round(meta["elapsed_s"], 1)}))
    return 0


def fmt(r: dict, peer: dict) -> str:
    if "tflops" not in r:
        return f"  {r['config']:44s}  {r.get('error', '')[:70]}"
    vs = "  ".join(f"{r['tflops'] / peer[f'{p}_tflops']:.2f}x {p}" for p in ("fa2", "cudnn")
                   if peer.get(f"{p}_tflops"))
    return f"  {r['config']:44s} {r['tflops']:6.1f} TFLOP/s {r['ms']:7.3f} ms  regs {r['n_regs']}  {vs}"


def pick_lines(records: list[dict], head_dims) -> dict:
    """{head_dim: {"deterministic": config, "atomic": config}}: per kind the tile with the
    best geomean TFLOP/s over the cells where it was timed in every one."""
    best = {}
    for head_dim in head_dims:
        ncells = len({(r["seq"], r["causal"]) for r in records if r["head_dim"] == head_dim})
        for kind in ("dkdv", "dq", "atomic", "atomic_tma"):
            by = {}
            for r in records:
                if r["head_dim"] == head_dim and r["kind"] == kind and "tflops" in r:
                    by.setdefault(r["config"], []).append(r)
            full = {c: rs for c, rs in by.items() if len(rs) == ncells}
            if full:
                c, rs = max(full.items(), key=lambda kv: geomean([r["tflops"] for r in kv[1]]))
                best[(head_dim, kind)] = (geomean([r["tflops"] for r in rs]), rs[0])
    picks = {}
    for head_dim in head_dims:
        by_mode = {}
        if (head_dim, "dkdv") in best and (head_dim, "dq") in best:
            by_mode["deterministic"] = AttentionBackwardConfig(
                BackwardTile(**best[(head_dim, "dkdv")][1]["dkdv"]), BackwardTile(**best[(head_dim, "dq")][1]["dq"]))
        atomic = [best[(head_dim, k)] for k in ("atomic", "atomic_tma") if (head_dim, k) in best]
        if atomic:
            r = max(atomic, key=lambda x: x[0])[1]
            by_mode["atomic"] = AttentionBackwardConfig(BackwardTile(**r["dkdv"]), None, r["dq_tma"])
        if by_mode:
            picks[head_dim] = by_mode
    return picks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--offline", action="store_true", help="compile every candidate for sm_90a here (no GPU): "
                    "registers, spills, shared memory")
    ap.add_argument("--out", help="JSON file to write (required on the GPU)")
    ap.add_argument("--head-dims", default=list(HEAD_DIMS), type=lambda s: [int(d) for d in s.split(",")])
    ap.add_argument("--budget-s", type=float, default=210.0, help="stop starting timings after this many seconds")
    ap.add_argument("--workers", type=int, default=min(8, max(1, (os.cpu_count() or 2) // 2)),
                    help="processes that compile the candidates first (1: compile while timing)")
    args = ap.parse_args()
    if args.offline:
        return offline_main(args.out)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (or --offline)", file=sys.stderr)
        return 2
    if not args.out:
        ap.error("--out is required on the GPU")
    return gpu_main(args)


if __name__ == "__main__":
    sys.exit(main())
