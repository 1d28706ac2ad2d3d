"""Experiment: two dependent batch-1 GEMVs in ONE launch, the second's programs streaming
their weights while they wait for the first's output (issue 5's 1B bar; NOTES.md).

    mid = W1 x                  (N1 = 2F,  K1)   gate_up
    y   = W2 (silu(g) * u)      (N2, K2 = F)     down, SwiGLU of mid = [g | u] in its prologue

Today these are two launches (``skinny_matmul`` then ``silu_mul_matmul``, with programmatic
dependent launch): every kernel boundary of a 1B decode step costs ~2.6 us on an H200 (the
GEMV chain takes 622 us for 455 us of weights, 64 launches), 167 us of the step's 870.

Here one grid holds both: programs take tickets in the order they start (one atomic), the
first n1 tickets compute mid and count themselves done (release); the next n2 wait on
that count (acquire) and then compute y. A waiting program only waits on lower tickets,
which have started, so the grid cannot deadlock at any occupancy. With ``preload`` each
second-phase program issues its first weight chunk before it waits: the bytes the
boundary leaves idle on HBM are the next GEMV's weights. The last program to finish
resets the three counters (one int32 buffer, zeroed once): graph replays need no memset.

    python benchmarks/gemv_chain.py --out DIR     # on a GPU: 1B and 8B MLP shapes, ~20 s

Times (a) the two launches as the engine runs them, (b) the chain, (c) the chain with
preload, each as one CUDA graph of calls over weight copies that pass L2. The CPU test
(tests/test_gemv_chain.py) checks the chain against ``gemv_chain_ref`` through the
interpreter, where programs run one after another in ticket order.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from onetrip.ops._jit import cast_out  # noqa: E402

sm = importlib.import_module("onetrip.ops.skinny_matmul")


@triton.jit
def _act(x_ptr, k, SILU_MUL: tl.constexpr, K_HALF):
    """A GEMV's activation chunk x[k] in float32; SILU_MUL: silu(x[k]) * x[K_HALF + k]. Loads
    bypass L1 (``.cg``): in phase 2 they read what other programs of the launch wrote."""
    a = tl.load(x_ptr + k, cache_modifier=".cg").to(tl.float32)
    if SILU_MUL:
        u = tl.load(x_ptr + K_HALF + k, cache_modifier=".cg").to(tl.float32)
        a = a / (1.0 + tl.exp(-a)) * u
    return a


@triton.jit
def _phase1(x_ptr, w1_ptr, mid_ptr, sync_ptr, t, K1, N1, stride_w1,
            BLOCK_N1: tl.constexpr, BLOCK_K1: tl.constexpr):
    """mid[cols] = W1[cols] . x for ticket t's columns, then count this program done."""
    cols = t * BLOCK_N1 + tl.arange(0, BLOCK_N1)
    rows = w1_ptr + cols.to(tl.int64)[:, None] * stride_w1
    acc = tl.zeros((BLOCK_N1, BLOCK_K1), tl.float32)
    for k0 in range(0, K1, BLOCK_K1):
        k = k0 + tl.arange(0, BLOCK_K1)
        acc += tl.load(rows + k[None, :]).to(tl.float32) * _act(x_ptr, k, False, 0)[None, :]
    tl.store(mid_ptr + cols, cast_out(tl.sum(acc, axis=1), mid_ptr.dtype.element_ty), mask=cols < N1)
    tl.debug_barrier()  # every thread's stores issued before the count releases them
    tl.atomic_add(sync_ptr + 1, 1, sem="release")


@triton.jit
def _phase2(w2_ptr, mid_ptr, y_ptr, sync_ptr, p, K2, N2, n1, n2, stride_w2,
            BLOCK_N2: tl.constexpr, BLOCK_K2: tl.constexpr, PRELOAD: tl.constexpr):
    """y[cols] = W2[cols] . (silu(g) * u) once all n1 first-phase programs are done; the
    last of the n2 to finish re-arms the counters for the next call."""
    cols = p * BLOCK_N2 + tl.arange(0, BLOCK_N2)
    rows = w2_ptr + cols.to(tl.int64)[:, None] * stride_w2
    k = tl.arange(0, BLOCK_K2)
    if PRELOAD:  # weights never depend on phase 1: in flight during the wait
        w0 = tl.load(rows + k[None, :])
    done = tl.atomic_add(sync_ptr + 1, 0, sem="acquire")
    while done < n1:
        done = tl.atomic_add(sync_ptr + 1, 0, sem="acquire")
    tl.debug_barrier()
    if not PRELOAD:
        w0 = tl.load(rows + k[None, :])
    acc = w0.to(tl.float32) * _act(mid_ptr, k, True, K2)[None, :]
    for k0 in range(BLOCK_K2, K2, BLOCK_K2):
        acc += tl.load(rows + (k0 + k)[None, :]).to(tl.float32) * _act(mid_ptr, k0 + k, True, K2)[None, :]
    tl.store(y_ptr + cols, cast_out(tl.sum(acc, axis=1), y_ptr.dtype.element_ty), mask=cols < N2)
    finished = tl.atomic_add(sync_ptr + 2, 1, sem="acq_rel")
    if finished == n2 - 1:
        tl.atomic_xchg(sync_ptr, 0)
        tl.atomic_xchg(sync_ptr + 1, 0)
        tl.atomic_xchg(sync_ptr + 2, 0)


@triton.jit
def _chain_kernel(
    x_ptr, w1_ptr, w2_ptr, mid_ptr, y_ptr,   # x (K1,), W1 (N1, K1), W2 (N2, K2), mid (N1,), y (N2,)
    sync_ptr,                                # int32 [ticket, phase-1 done, phase-2 done], 0 between calls
    K1, N1, K2, N2, n1, n2,                  # n1, n2: programs of each phase
    stride_w1, stride_w2,
    BLOCK_N1: tl.constexpr, BLOCK_K1: tl.constexpr, BLOCK_N2: tl.constexpr, BLOCK_K2: tl.constexpr,
    PRELOAD: tl.constexpr,
):
    t = tl.atomic_add(sync_ptr, 1)  # ticket in start order
    if t < n1:
        _phase1(x_ptr, w1_ptr, mid_ptr, sync_ptr, t, K1, N1, stride_w1, BLOCK_N1, BLOCK_K1)
    else:
        _phase2(w2_ptr, mid_ptr, y_ptr, sync_ptr, t - n1, K2, N2, n1, n2, stride_w2, BLOCK_N2, BLOCK_K2, PRELOAD)


def gemv_chain(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, mid: torch.Tensor, y: torch.Tensor,
               sync: torch.Tensor, tiles=((16, 256), (4, 1024)), num_warps: int = 8, preload: bool = True):
    """y = W2 (silu(g) * u) with [g | u] = W1 x, one launch. x (K1,), w1 (2F, K1), w2 (N2, F),
    mid (2F,) and y (N2,) of one 16-bit dtype, unit column strides; sync: (3,) int32 zeros,
    kept between calls (the kernel leaves it at zero). tiles: (BLOCK_N, BLOCK_K) of each
    phase; BLOCK_N must divide its N and BLOCK_K its K (no masks in this experiment)."""
    (bn1, bk1), (bn2, bk2) = tiles
    N1, K1 = w1.shape
    N2, K2 = w2.shape
    if N1 != 2 * K2 or N1 % bn1 or K1 % bk1 or N2 % bn2 or K2 % bk2:
        raise ValueError(f"shapes W1 {tuple(w1.shape)}, W2 {tuple(w2.shape)} do not fit tiles {tiles}")
    n1, n2 = N1 // bn1, N2 // bn2
    _chain_kernel[(n1 + n2,)](x, w1, w2, mid, y, sync, K1, N1, K2, N2, n1, n2, w1.stride(0), w2.stride(0),
                              BLOCK_N1=bn1, BLOCK_K1=bk1, BLOCK_N2=bn2, BLOCK_K2=bk2, PRELOAD=preload,
                              num_warps=num_warps)
    return y


def gemv_chain_ref(x, w1, w2):
    """Op by op in x's dtype: the GEMV, silu(g) * u, the GEMV."""
    mid = w1 @ x
    g, u = mid.chunk(2)
    return w2 @ (torch.nn.functional.silu(g) * u)


SHAPES = {"llama-3.2-1b": (2048, 8192), "llama-3.1-8b": (4096, 14336)}  # hidden, intermediate
DEVICE = "cuda"  # the CPU smoke run (interpreter, tiny SHAPES) sets "cpu"
MIN_BYTES = 256 << 20  # weight copies per graph: enough that no call finds its weights in L2


def mlp_problem(hidden: int, inter: int, dev, dt=torch.bfloat16) -> dict:
    """One MLP shape's inputs for the chain experiments: weight copies ``ws`` [(W1, W2)] that
    together pass MIN_BYTES (so no call finds its weights in L2), x, the outputs mid and y,
    the float32 reference, and the engine's GEMV configs ``cfg1`` / ``cfg2`` of each phase."""
    sets = max(2, -(-MIN_BYTES // (2 * 3 * inter * hidden)))
    ws = [(torch.randn(2 * inter, hidden, device=dev, dtype=dt) * 0.02,
           torch.randn(hidden, inter, device=dev, dtype=dt) * 0.02) for _ in range(sets)]
    x = torch.randn(hidden, device=dev, dtype=dt)
    return {"ws": ws, "x": x, "mid": torch.empty(2 * inter, device=dev, dtype=dt),
            "y": torch.empty(hidden, device=dev, dtype=dt),
            "ref": gemv_chain_ref(x.float(), ws[0][0].float(), ws[0][1].float()),
            "cfg1": sm._gemv_config(2 * inter, hidden, "plain"), "cfg2": sm._gemv_config(hidden, inter, "plain")}


def chain_setup(presets: bool = False, extra=None):
    """The GPU experiments' start (the chains, read_tma, the norm experiments): the command
    line (--out; --presets with ``presets``; ``extra(parser)`` adds an experiment's own), the
    copy bandwidth, an L2 flush buffer and the results' meta. Returns (args, copy, flush,
    result) with result = {"meta": ..., "rows": []}."""
    from onetrip.bench import harness  # noqa: PLC0415

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu-out"))
    if presets:
        ap.add_argument("--presets", nargs="+", default=list(SHAPES))
    if extra is not None:
        extra(ap)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    copy = harness.copy_bandwidth_gbs("cuda")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "copy_gbs": copy, "sms": torch.cuda.get_device_properties(0).multi_processor_count,
            "date": time.strftime("%Y-%m-%d %H:%M")}
    return args, copy, harness.new_flush_buffer(), {"meta": meta, "rows": []}


def engine_variants(p: dict) -> dict:
    """The engine's launches on an ``mlp_problem``: the pair (gate_up, then down with SwiGLU
    in its prologue, under PDL as the engine launches them) and each kernel alone."""
    x2, mid2, y2, cfg1, cfg2 = p["x"][None], p["mid"][None], p["y"][None], p["cfg1"], p["cfg2"]
    return {"engine pair": lambda w1, w2: (sm._launch(x2, w1, None, mid2, cfg1),
                                           sm._launch(mid2, w2, None, y2, cfg2, silu_mul=True)),
            "engine gate_up alone": lambda w1, w2: sm._launch(x2, w1, None, mid2, cfg1),
            "engine down alone": lambda w1, w2: sm._launch(mid2, w2, None, y2, cfg2, silu_mul=True)}


def run_variant(preset: str, label: str, f, p: dict, flush, sync, calls: int = 1, check: bool = True,
                prepare=None) -> dict:
    """One variant of a chain experiment: the time per call of one CUDA graph of calls over
    the weight copies (``sweep_gemv.time_per_call``), then ``calls`` more on the first copy
    (after ``prepare``) with y poisoned, y's max error relative to the float32 reference
    (NaN unchecked), and the barrier's counters after. Errors are recorded, not raised."""
    from sweep_gemv import time_per_call  # noqa: PLC0415 - GPU runs only

    ws, y, ref = p["ws"], p["y"], p["ref"]
    try:
        us = 1e3 * time_per_call([lambda w=w: f(*w) for w in ws], flush)
        y.fill_(float("nan"))
        if prepare is not None:
            prepare()
        for _ in range(calls):
            f(*ws[0])
        torch.cuda.synchronize()
        err = (y.float() - ref).abs().max().item() / ref.abs().max().item() if check else float("nan")
        row = {"us": us, "rel_err": err, "sync_after": sync.tolist()}
    except Exception as exc:  # noqa: BLE001 - recorded
        row = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    print(f"{preset:13s} {label:36s} " + (f"{row['us']:7.2f} us  err {row['rel_err']:.1e}  sync {row['sync_after']}"
                                          if "us" in row else row["error"]), flush=True)
    return row


def main() -> int:
    from sweep_gemv import time_per_call  # noqa: PLC0415 - GPU runs only

    from onetrip.bench import harness

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu-out"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev, dt = DEVICE, torch.bfloat16
    copy = harness.copy_bandwidth_gbs(dev)
    flush = harness.new_flush_buffer()
    result = {"meta": {"gpu": torch.cuda.get_device_name() if dev == "cuda" else dev, "torch": torch.__version__, "triton": triton.__version__,
                       "copy_gbs": copy, "date": time.strftime("%Y-%m-%d")}, "rows": []}
    for preset, (hidden, inter) in SHAPES.items():
        nbytes = 2 * (2 * inter * hidden + hidden * inter)
        p = mlp_problem(hidden, inter, dev, dt)
        ws, x, mid, y, ref, cfg1, cfg2 = (p[k] for k in ("ws", "x", "mid", "y", "ref", "cfg1", "cfg2"))
        sync = torch.zeros(3, dtype=torch.int32, device=dev)
        x2, mid2, y2 = x[None], mid[None], y[None]

        def pair(w1, w2):
            sm._launch(x2, w1, None, mid2, cfg1)
            sm._launch(mid2, w2, None, y2, cfg2, silu_mul=True)

        row = {"preset": preset, "floor_us": nbytes / copy / 1e3}
        variants = {"two launches (engine)": pair,
                    "chain": lambda w1, w2: gemv_chain(x, w1, w2, mid, y, sync, preload=False),
                    "chain + preload": lambda w1, w2: gemv_chain(x, w1, w2, mid, y, sync, preload=True)}
        for label, f in variants.items():
            try:
                us = 1e3 * time_per_call([lambda w=w, f=f: f(*w) for w in ws], flush)
                f(*ws[0])
                err = (y.float() - ref).abs().max().item() / ref.abs().max().item()
                row[label] = {"us": us, "pct_of_copy": 100 * nbytes / (us * 1e3) / copy, "rel_err": err,
                              "sync_after": sync.tolist()}
            except Exception as exc:  # noqa: BLE001 - recorded
                row[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        result["rows"].append(row)
        print(f"{preset}: floor {row['floor_us']:.1f} us; " + "; ".join(
            f"{k} {v['us']:.1f} us ({v['pct_of_copy']:.0f}%, err {v['rel_err']:.1e}, sync {v['sync_after']})"
            if "us" in v else f"{k} {v['error']}" for k, v in row.items() if isinstance(v, dict)), flush=True)
        del ws
    (args.out / "gemv-chain.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())
