"""Experiment: wide-row RMSNorm / LayerNorm with each row staged in shared memory by TMA
(Gluon, Hopper), a persistent program an SM (issue 2's 64K rows; NOTES.md, fourteenth
session).

Why: the Triton kernel's pass 2 re-reads its row from L2 (which overflows at 64K+ for
layer_norm: 1.24x the bytes from DRAM), or holds chunks in registers, and one program
an SM idles across its row boundaries. Here a row of up to ~100K bf16 elements lives in
shared memory between the passes, in a ring of NSLOT chunk slots filled by TMA loads: a
slot is refilled (with the next row's chunk) as soon as pass 2 has read it, so the next
row streams in while this one is normalized and written, and every byte is read from
HBM once. Per row (x viewed as (M * N / 64, 64), a chunk = a (CHUNK / 64, 64) TMA box):

    pass 1: wait for each chunk's barrier, sum x^2 (LayerNorm: sum x, then sum (x - mean)^2,
            a second pass over shared memory)
    pass 2: y = norm(x) * w (+ b) from shared memory, stored to global; the slot goes back
            to the TMA for chunk g + NSLOT.

Rows a program: M / SMs (one program an SM: a 64K row is 128 KB of shared memory).
16-bit inputs, rows dense, N a multiple of CHUNK; no residual (an experiment).

    python benchmarks/norm_smem.py --out DIR    # on an H100/H200: checks, then times against the Triton kernel

Outcome on an H200 (NOTES.md, fourteenth session, four runs): correct (tests/test_norm_smem.py
on the GPU), but slower than the Triton kernel's picks: rms_norm 64K 86.5% against 89.7%, 32K
87.7 against 95.1%, layer_norm 64K 64-68% against 80%; TMA stores (``tma_store``) lower still.
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
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

norm = importlib.import_module("onetrip.ops.norm")

BOX_COLS = 64  # the TMA box's inner dimension: 64 bf16 = 128 bytes, the widest swizzle


@gluon.jit
def _chunk_load(x_desc, xs, bars, g, pid, P, T, RPC: gl.constexpr, CPR: gl.constexpr, NSLOT: gl.constexpr):
    """Put this program's chunk g (row pid + (g // CPR) * P, chunk g % CPR) in flight into
    slot g % NSLOT; nothing past its T chunks."""
    ok = g < T
    row = pid + (g // CPR) * P
    slot = g % NSLOT
    bar = bars.index(slot)
    mbarrier.expect(bar, x_desc.block_type.nbytes, pred=ok)
    tma.async_copy_global_to_shared(x_desc, [row * (CPR * RPC) + (g % CPR) * RPC, 0], bar, xs.index(slot), pred=ok)


@gluon.jit
def _norm_smem_kernel(x_desc, y_desc, y_ptr, w_ptr, b_ptr, M, eps,
                      N: gl.constexpr, CHUNK: gl.constexpr, NSLOT: gl.constexpr, IS_RMS: gl.constexpr,
                      WARPS: gl.constexpr, TMA_STORE: gl.constexpr = False):
    """TMA_STORE: y leaves through two staging slots of shared memory and TMA stores (one
    thread issues them) instead of every thread's global stores."""
    RPC: gl.constexpr = CHUNK // 64    # box rows a chunk
    CPR: gl.constexpr = N // CHUNK     # chunks a row
    gl.static_assert(CPR <= NSLOT, "a row must fit the ring")
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    rows_mine = (M - pid + P - 1) // P
    T = rows_mine * CPR
    xs = gl.allocate_shared_memory(x_desc.dtype, [NSLOT, RPC, 64], x_desc.layout)
    if TMA_STORE:
        ys = gl.allocate_shared_memory(y_desc.dtype, [2, RPC, 64], y_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NSLOT, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NSLOT):
        mbarrier.init(bars.index(i), count=1)
    for k in gl.static_range(NSLOT):
        _chunk_load(x_desc, xs, bars, k, pid, P, T, RPC, CPR, NSLOT)
    r_idx = gl.arange(0, RPC, layout=gl.SliceLayout(1, layout))
    c_idx = gl.arange(0, 64, layout=gl.SliceLayout(0, layout))
    offs = r_idx[:, None] * 64 + c_idx[None, :]  # (RPC, 64): element of the chunk
    # The weight (and bias) a chunk ahead, from L2: issued behind the chunk's barrier it would
    # stall every chunk (rms_norm 64K at 8192 x 8 warps 70.6 -> 82.0%, NOTES.md); the last
    # chunk's prefetch is the next row's chunk 0.
    w_nxt = gl.load(w_ptr + offs)
    b_nxt = w_nxt
    if not IS_RMS:
        b_nxt = gl.load(b_ptr + offs)
    for it in range(rows_mine):
        row = pid + it * P
        g0 = it * CPR
        # -- pass 1: the row's statistics from shared memory -------------------------------
        # (LayerNorm: sums of d = x - s around s = the row's first element, one pass; see
        # _norm_jit's shifted-data algorithm)
        shift = 0.0
        if not IS_RMS:
            mbarrier.wait(bars.index(g0 % NSLOT), (g0 // NSLOT) & 1)
            v0 = xs.index(g0 % NSLOT).load(layout).to(gl.float32)
            shift = gl.sum(gl.sum(gl.where(offs == 0, v0, 0.0), axis=1), axis=0)
        acc = gl.zeros([RPC, 64], gl.float32, layout)
        acc1 = gl.zeros([RPC, 64], gl.float32, layout)
        for c in range(CPR):
            g = g0 + c
            mbarrier.wait(bars.index(g % NSLOT), (g // NSLOT) & 1)
            v = xs.index(g % NSLOT).load(layout).to(gl.float32)
            if IS_RMS:
                acc += v * v
            else:
                d = v - shift
                acc1 += d
                acc += d * d
        total = gl.sum(gl.sum(acc, axis=1), axis=0)
        if IS_RMS:
            mean = 0.0
            rstd = gl.rsqrt(total / N + eps)
        else:
            m1 = gl.sum(gl.sum(acc1, axis=1), axis=0) / N
            mean = shift + m1
            rstd = gl.rsqrt(gl.maximum(total / N - m1 * m1, 0.0) + eps)
        # -- pass 2: normalize, store, hand each slot back to the TMA ------------------------
        y_row = y_ptr + row.to(gl.int64) * N
        for c in range(CPR):
            g = g0 + c
            w = w_nxt.to(gl.float32)
            b = b_nxt.to(gl.float32)
            nxt = ((c + 1) % CPR) * CHUNK
            w_nxt = gl.load(w_ptr + nxt + offs)
            if not IS_RMS:
                b_nxt = gl.load(b_ptr + nxt + offs)
            v = xs.index(g % NSLOT).load(layout).to(gl.float32)
            if IS_RMS:  # Llama: round to x's dtype, then multiply by the weight
                y = (v * rstd).to(y_ptr.dtype.element_ty).to(gl.float32) * w
            else:
                y = (v - mean) * rstd * w + b
            if TMA_STORE:
                tma.store_wait(pendings=1)  # the staging slot's store of two chunks ago has read it
                gl.thread_barrier()
                ys.index(c % 2).store(y.to(y_desc.dtype))
                fence_async_shared()  # the threads' writes of the slot, before the TMA reads it
                gl.thread_barrier()  # ... and every warp's, and every warp has read the x slot
                tma.async_copy_shared_to_global(y_desc, [row * (CPR * RPC) + c * RPC, 0], ys.index(c % 2))
            else:
                gl.store(y_row + c * CHUNK + offs, y.to(y_ptr.dtype.element_ty))
                gl.thread_barrier()  # every warp has read the slot ...
                fence_async_shared()  # ... before the TMA (the async proxy) writes it again
            _chunk_load(x_desc, xs, bars, g + NSLOT, pid, P, T, RPC, CPR, NSLOT)
    if TMA_STORE:
        tma.store_wait(pendings=0)
    for i in gl.static_range(NSLOT):
        mbarrier.invalidate(bars.index(i))


def norm_smem(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, out: torch.Tensor,
              chunk: int = 8192, nslot: int | None = None, num_warps: int = 8, tma_store: bool = False) -> torch.Tensor:
    """RMSNorm (bias None) or LayerNorm of dense 16-bit rows x (M, N) into out, N a multiple
    of ``chunk``; ``nslot`` chunk slots of shared memory (default: the row's chunks + 8,
    up to 216 KB)."""
    M, N = x.shape
    if x.dtype not in (torch.bfloat16, torch.float16) or N % chunk or chunk % BOX_COLS or not x.is_contiguous():
        raise ValueError(f"x must be dense 16-bit rows with a width that is a multiple of chunk={chunk}, "
                         f"got {tuple(x.shape)} {x.dtype}")
    if out.shape != x.shape or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a dense {tuple(x.shape)} {x.dtype} tensor")
    cpr = N // chunk
    nslot = nslot or min(cpr + 8, (216 << 10) // (2 * chunk) - (2 if tma_store else 0))
    if nslot < cpr:
        raise ValueError(f"a row of {N} needs {cpr} slots of {chunk}; shared memory holds {nslot}")
    gdt = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for([chunk // BOX_COLS, BOX_COLS], gdt)
    x2 = x.view(M * N // BOX_COLS, BOX_COLS)
    desc = TensorDescriptor(x2, list(x2.shape), list(x2.stride()), [chunk // BOX_COLS, BOX_COLS], layout)
    y2 = out.view(M * N // BOX_COLS, BOX_COLS)
    y_desc = TensorDescriptor(y2, list(y2.shape), list(y2.stride()), [chunk // BOX_COLS, BOX_COLS], layout)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    _norm_smem_kernel[(min(M, sms),)](desc, y_desc, out, weight, bias if bias is not None else weight, M, eps,
                                      N=N, CHUNK=chunk, NSLOT=nslot, IS_RMS=bias is None, WARPS=num_warps,
                                      TMA_STORE=tma_store, num_warps=num_warps)
    return out


def main() -> int:
    from onetrip.bench import harness

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu-out"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev, dt = torch.device("cuda"), torch.bfloat16
    copy = harness.copy_bandwidth_gbs(dev)
    flush = harness.new_flush_buffer(dev)
    out = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                    "copy_gbs": copy, "date": time.strftime("%Y-%m-%d %H:%M")}, "rows": []}
    print(f"copy {copy:.0f} GB/s", flush=True)
    for rows, width in ((2048, 32768), (1024, 65536), (1536, 49152), (4096, 16384)):
        for is_rms in (True, False):
            g = torch.Generator(device=dev).manual_seed(0)
            sets = [(torch.randn(rows, width, device=dev, generator=g).to(dt), torch.empty(rows, width, device=dev,
                                                                                         dtype=dt))
                    for _ in range(2)]
            w = torch.randn(width, device=dev, generator=g).to(dt)
            b = None if is_rms else torch.randn(width, device=dev, generator=g).to(dt)
            nbytes = 2 * rows * width * 2 + (1 if is_rms else 2) * width * 2
            x0, y0 = sets[0]
            ref = torch.empty_like(y0)
            norm._launch(x0, None, w, b, ref, None, 1e-6, is_rms, False)
            variants = {"triton (pick)": lambda x, y: norm._launch(x, None, w, b, y, None, 1e-6, is_rms, False)}
            for chunk, warps, tst in ((8192, 8, False), (8192, 8, True), (8192, 16, True), (16384, 16, False),
                                      (16384, 16, True)):
                if width % chunk == 0 and width // chunk <= (216 << 10) // (2 * chunk) - (2 if tst else 0):
                    variants[f"smem {chunk} x {warps}w{' tma-st' if tst else ''}"] = \
                        lambda x, y, c=chunk, nw=warps, t=tst: norm_smem(x, w, b, 1e-6, y, c, None, nw, t)
            for label, f in variants.items():
                rec = {"family": "rms_norm" if is_rms else "layer_norm", "rows": rows, "width": width,
                       "variant": label}
                try:
                    y0.fill_(float("nan"))
                    f(x0, y0)
                    torch.cuda.synchronize()
                    rec["max_diff_vs_pick"] = (y0.float() - ref.float()).abs().max().item()
                    n_calls = 4

                    def replay(f=f, sets=sets):
                        for i in range(n_calls):
                            f(*sets[i % 2])
                    t = harness.per_call(harness.time_ms(replay, flush=flush), n_calls)
                    rec["us"] = 1e3 * t.median_ms
                    rec["pct_of_copy"] = 100 * nbytes / (t.median_ms * 1e6) / copy
                except Exception as exc:  # noqa: BLE001 - recorded
                    rec["error"] = f"{type(exc).__name__}: {exc}"[:400]
                out["rows"].append(rec)
                print(f"{rec['family']:10s} {rows}x{width:6d} {label:18s} "
                      + (f"{rec['us']:8.2f} us {rec['pct_of_copy']:5.1f}%  diff {rec['max_diff_vs_pick']:.2e}"
                         if "us" in rec else rec["error"]), flush=True)
            del sets
            torch.cuda.empty_cache()
    (args.out / "norm-smem.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
