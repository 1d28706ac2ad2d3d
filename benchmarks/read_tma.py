"""Experiment: what one kernel reaches when every program puts its bytes in flight by TMA
(Gluon, Hopper). Two bars rest on it (NOTES.md, eighteenth session):

- issue 4, batch 1 x 4K: K + V are 16.8 MB. The read floors measured so far (a grid-stride
  sum with pointer loads: 70% of copy at 1,056 programs on the H100, 34% at 132) issue their
  loads a few KB at a time from every thread. Here each program issues its whole slice
  (<= ~200 KB, one CTA an SM) as a handful of TMA boxes before it waits on any: the ramp is
  one HBM round trip and the slices are equal, so the tail is short. If this stays under
  75% of copy, no single kernel that must read those bytes (decode attention, before its
  merge) can pass the bar on this GPU.
- issue 2, the wide norms: the warp-specialized norm (a loader streaming a row through a
  ring of shared-memory slots at one CTA an SM) is worth building only if a ring of TMA
  loads alone, at one CTA an SM, reads 64 MiB at >= 92% of copy, and copies it (the loaded
  box stored back from registers, as a norm's pass 2 would) near the copy bandwidth.

The kernel: program p of P takes boxes [p * T // P, (p + 1) * T // P) of x viewed as (rows,
64) bf16, a box = (R, 64) = R * 128 bytes; NSLOT slots, all issued up front, each refilled
as soon as it has been read (when a slice fits NSLOT, every byte is in flight from the start). Each box is
summed into a float32 accumulator (a read must be consumed), or, with STORE, written to y.

    python benchmarks/read_tma.py --out DIR     # on an H100/H200

Timing as everywhere in these A/Bs: one CUDA graph of calls over input copies past L2
(16 for the 16.8 MB cell, 4 at 64 MiB), median of 15 replays, per call.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sweep_gemv import time_per_call  # noqa: E402

NCOL = 64  # a box row: 64 bf16 = 128 bytes, the widest swizzle
COLS = gl.constexpr(NCOL)


@gluon.jit
def _issue(x_desc, xs, bars, i, first, n, R: gl.constexpr, NSLOT: gl.constexpr):
    """Box first + i into slot i % NSLOT, if i < n."""
    ok = i < n
    bar = bars.index(i % NSLOT)
    mbarrier.expect(bar, x_desc.block_type.nbytes, pred=ok)
    tma.async_copy_global_to_shared(x_desc, [(first + i) * R, 0], bar, xs.index(i % NSLOT), pred=ok)


@gluon.jit
def _read_kernel(x_desc, y_ptr, out_ptr, total, R: gl.constexpr, NSLOT: gl.constexpr, WARPS: gl.constexpr,
                 STORE: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    pid = gl.program_id(0).to(gl.int64)
    P = gl.num_programs(0)
    first = (pid * total // P).to(gl.int32)  # equal slices to a box
    n = ((pid + 1) * total // P).to(gl.int32) - first
    xs = gl.allocate_shared_memory(x_desc.dtype, [NSLOT, R, COLS], x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NSLOT, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NSLOT):
        mbarrier.init(bars.index(s), count=1)
    for s in gl.static_range(NSLOT):
        _issue(x_desc, xs, bars, s, first, n, R, NSLOT)
    r_idx = gl.arange(0, R, layout=gl.SliceLayout(1, layout))
    c_idx = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    offs = r_idx[:, None] * COLS + c_idx[None, :]
    acc = gl.zeros([R, COLS], gl.float32, layout)
    for i in range(n):
        mbarrier.wait(bars.index(i % NSLOT), (i // NSLOT) & 1)
        v = xs.index(i % NSLOT).load(layout)
        if STORE:
            gl.store(y_ptr + (first + i).to(gl.int64) * (R * COLS) + offs, v)
        else:
            acc += v.to(gl.float32)
        gl.thread_barrier()  # every warp has read the slot ...
        fence_async_shared()  # ... before the TMA writes it again
        _issue(x_desc, xs, bars, i + NSLOT, first, n, R, NSLOT)
    gl.store(out_ptr + pid, gl.sum(gl.sum(acc, axis=1), axis=0))
    for s in gl.static_range(NSLOT):
        mbarrier.invalidate(bars.index(s))


@triton.jit
def _sum_kernel(x_ptr, out_ptr, n, per_prog, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    """Each program sums its contiguous slice of n elements with pointer loads, with eviction
    hint EVICT ("" for none); also ab_next's read floor."""
    lo = tl.program_id(0) * per_prog
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(lo, tl.minimum(lo + per_prog, n), BLOCK):
        i = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + i, mask=i < n, other=0.0, eviction_policy=EVICT).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def tma_read(x: torch.Tensor, out: torch.Tensor, programs: int, box_rows: int, nslot: int, warps: int = 4,
             y: torch.Tensor | None = None) -> None:
    """Read (or, with y, copy to y) dense bf16 x over ``programs`` programs of equal slices."""
    rows = x.numel() // NCOL
    if x.dtype != torch.bfloat16 or x.numel() % (NCOL * box_rows) or not x.is_contiguous():
        raise ValueError(f"x must be dense bf16 with a multiple of {NCOL * box_rows} elements")
    if nslot * box_rows * NCOL * 2 > (220 << 10):
        raise ValueError(f"{nslot} slots of {box_rows} x {NCOL} bf16 pass shared memory")
    total = rows // box_rows
    if triton.cdiv(total, programs) > nslot and nslot < 2:
        raise ValueError("a ring needs two slots at least")
    layout = gl.NVMMASharedLayout.get_default_for([box_rows, NCOL], gl.bfloat16)
    x2 = x.view(rows, NCOL)
    desc = TensorDescriptor(x2, list(x2.shape), list(x2.stride()), [box_rows, NCOL], layout)
    _read_kernel[(min(programs, total),)](desc, y if y is not None else x, out, total, R=box_rows,
                                             NSLOT=nslot, WARPS=warps, STORE=y is not None, num_warps=warps)


def _check(dev) -> None:
    x = torch.randn(128 * 64 * 37, device=dev).to(torch.bfloat16)
    out = torch.zeros(64, device=dev)
    tma_read(x, out, programs=5, box_rows=64, nslot=3)
    ref = x.float().sum()
    assert torch.allclose(out.sum(), ref, rtol=1e-4, atol=1e-2), (out.sum().item(), ref.item())
    y = torch.full_like(x, float("nan"))
    tma_read(x, out, programs=7, box_rows=128, nslot=2, y=y)
    assert torch.equal(y, x)


# (bytes, copies, variants: (programs, box rows, slots, warps, store))
CELL_4K = 16 * 1024 * 1024 + 786432  # batch 1 x 4K's K + V
PLANS = (
    (CELL_4K, 16, [(p, r, s, w, False) for p, r, s, w in (
        (132, 64, 17, 4), (128, 64, 17, 4), (132, 32, 33, 4), (132, 128, 9, 4), (132, 256, 5, 4), (132, 64, 17, 8),
        (264, 64, 9, 4), (264, 128, 5, 4), (396, 64, 6, 4), (528, 64, 5, 4), (1056, 64, 3, 4),
        (132, 64, 4, 4), (132, 64, 8, 4))]),
    (64 << 20, 4, [(p, r, s, w, st) for st in (False, True) for p, r, s, w in (
        (132, 64, 8, 4), (132, 64, 16, 4), (132, 64, 24, 4), (132, 128, 8, 4), (132, 128, 12, 4),
        (264, 64, 8, 4), (264, 64, 12, 4), (264, 128, 6, 4), (528, 64, 6, 4))]),
)


POINTER_SUMS = {
    CELL_4K: [(1056, 4096, 8, ""), (2112, 4096, 8, ""), (1056, 4096, 8, "evict_first"), (1056, 2048, 4, ""),
              (2112, 2048, 4, ""), (4224, 2048, 4, ""), (528, 8192, 8, ""), (792, 4096, 8, ""), (1584, 4096, 8, ""),
              (1056, 8192, 16, ""), (2112, 1024, 4, ""), (4288, 2048, 8, "")],
    64 << 20: [(1056, 4096, 8, ""), (2112, 4096, 8, "")],
}


def main() -> int:
    from gemv_chain import chain_setup

    args, copy, flush, res = chain_setup()
    dev = torch.device("cuda")
    _check(dev)
    print(f"copy {copy:.0f} GB/s", flush=True)
    for nbytes, copies, variants in PLANS:
        n = nbytes // 2
        xs = [torch.randn(n, device=dev).to(torch.bfloat16) for _ in range(copies)]
        outs = [torch.empty(8192, device=dev) for _ in xs]

        def record(label, calls, moved):
            us = 1e3 * time_per_call(calls, flush)
            row = {"bytes": nbytes, "variant": label, "us": us, "pct_of_copy": 100 * moved / (us * 1e3) / copy}
            res["rows"].append(row)
            print(f"{nbytes / 2**20:6.1f} MiB {label:44s} {us:8.2f} us {row['pct_of_copy']:5.1f}%", flush=True)

        # the pointer-load floor of earlier sessions (1056 x 4096 at 8 warps), and around it
        for grid, block, warps, evict in POINTER_SUMS[nbytes]:
            per = -(-n // grid)
            per = -(-per // block) * block
            record(f"pointer sum, {grid} x {block} at {warps} warps{', ' + evict if evict else ''}",
                   [lambda x=x, o=o, g=grid, p=per, b=block, w=warps, e=evict: _sum_kernel[(g,)](
                       x, o, n, p, BLOCK=b, EVICT=e, num_warps=w) for x, o in zip(xs, outs)], nbytes)
        dsts = [torch.empty(n, device=dev, dtype=torch.bfloat16) for _ in xs]
        record("torch copy (moves 2x the bytes)", [lambda x=x, d=d: d.copy_(x) for x, d in zip(xs, dsts)],
               2 * nbytes)
        for p, r, s, w, st in variants:
            label = f"TMA {'copy' if st else 'read'} {p} x {r}-row boxes, {s} slots, {w} warps"
            try:
                record(label, [lambda x=x, o=o, d=d: tma_read(x, o, p, r, s, w, y=d if st else None)
                               for x, o, d in zip(xs, outs, dsts)], 2 * nbytes if st else nbytes)
            except Exception as exc:  # noqa: BLE001 - recorded, the rest still run
                res["rows"].append({"bytes": nbytes, "variant": label, "error": repr(exc)[:300]})
                print(f"{label}: {exc!r}"[:300], flush=True)
        del xs, outs, dsts
        torch.cuda.empty_cache()
        (args.out / "read-tma.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
