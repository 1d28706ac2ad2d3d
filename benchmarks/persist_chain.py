"""Experiment: two dependent batch-1 GEMVs in one PERSISTENT launch (issue 5's 1B bar;
NOTES.md, fourteenth session). The question a megakernel decode step stands on: does a
boundary inside a kernel (a grid-wide barrier) cost less than a boundary between two
kernels (PDL, weight chunks in flight before the wait, as the engine runs them)?

    mid = W1 x                  (N1 = 2F, K1)   gate_up
    y   = W2 (silu(g) * u)      (N2, K2 = F)    down, SwiGLU of mid = [g | u] in its prologue

``gemv_chain.py`` answered "no, ~5 us more" with a program per tile (1,536 programs, the
second phase's spinning on SM slots) and its own GEMV loop, so its phase 1 alone was never
timed against the engine's kernel. Here P = SMs x ``occ`` programs stay resident: each
walks phase-1 tiles (t = pid, pid + P, ...) with the engine's own tile loop and launch
shapes (``skinny_matmul._gemv_config``), counts itself in (release), optionally puts its
first phase-2 weight chunk in flight (``preload``), spins until all P are in (acquire),
then walks phase-2 tiles. All P programs must be resident at once (else the barrier
never opens): ``persist_chain`` checks occupancy from the compiled kernel's registers and
shared memory before the first launch. The last program out re-arms the counters.

    python benchmarks/persist_chain.py --out DIR     # on a GPU: 1B and 8B MLP shapes

Times, per shape, one CUDA graph of calls over weight copies past L2 (``sweep_gemv``'s
``time_per_call``): the engine's two launches; each engine kernel alone; the persistent
kernel's phase 1 alone and phase 2 alone (PART 1 / 2: no barrier); and the chain for each
occupancy and preload. Under the interpreter (programs run one at a time, so none could
wait on another) the phases run as PART 1 then PART 2 (tests/test_persist_chain.py).

Outcome on an H200 (NOTES.md, fourteenth session): on the 1B MLP the chain ran 32.5 us
against the engine pair's 30.9; the barrier saved 1.1-1.3 us of a boundary, PDL 1.5.
"""

from __future__ import annotations

import importlib
import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemv_chain import SHAPES, chain_setup, engine_variants, mlp_problem, run_variant  # noqa: E402  (the same MLP shapes, weight copies, configs and timing)
from gemv_chain import gemv_chain_ref  # noqa: E402
from onetrip.ops._common import is_interpreting, sm_count  # noqa: E402
from onetrip.ops._gemv_jit import _row_weights  # noqa: E402
from onetrip.ops._jit import cast_out  # noqa: E402

sm = importlib.import_module("onetrip.ops.skinny_matmul")


persist_chain_ref = gemv_chain_ref  # the same op-by-op reference: the GEMV, silu(g) * u, the GEMV


@triton.jit
def _x_chunk(x_ptr, k, K, SILU_MUL: tl.constexpr):
    """x[k] in float32 (SILU_MUL: silu(x[k]) * x[K + k]), past L1 (``.cg``): in phase 2
    other SMs of this launch wrote it."""
    x = tl.load(x_ptr + k, cache_modifier=".cg").to(tl.float32)
    if SILU_MUL:
        x = x / (1.0 + tl.exp(-x)) * tl.load(x_ptr + K + k, cache_modifier=".cg").to(tl.float32)
    return x


@triton.jit
def _tile(x_ptr, w_ptr, y_ptr, t, N, K, stride_w, w0, SILU_MUL: tl.constexpr, HAVE_W0: tl.constexpr,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[cols] = W[cols] . x (SILU_MUL: x = silu(x[:K]) * x[K:]) for tile t's BLOCK_N columns,
    the engine's one-row loop: a (BLOCK_N, BLOCK_K) float32 accumulator summed once.
    HAVE_W0: the first chunk's weights ``w0`` were loaded before the barrier."""
    cols = t * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_w
    ks = tl.arange(0, BLOCK_K)
    if HAVE_W0:
        w = w0
    else:
        w = _row_weights(w_rows, ks, K, col_ok, 1, True, "")
    acc = w.to(tl.float32) * _x_chunk(x_ptr, ks, K, SILU_MUL)[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + ks
        w = _row_weights(w_rows, k, K, col_ok, 1, True, "")
        acc += w.to(tl.float32) * _x_chunk(x_ptr, k, K, SILU_MUL)[None, :]
    tl.store(y_ptr + cols, cast_out(tl.sum(acc, axis=1), y_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _persist_chain_kernel(
    x_ptr, w1_ptr, w2_ptr, mid_ptr, y_ptr,   # x (K1,), W1 (N1, K1), W2 (N2, K2), mid (N1,), y (N2,)
    sync_ptr,                                # int32 [arrived, finished], 0 between calls
    K1, N1, K2, N2, P,                       # P: programs (the grid), all resident
    stride_w1, stride_w2,
    BN1: tl.constexpr, BK1: tl.constexpr, BN2: tl.constexpr, BK2: tl.constexpr,
    PART: tl.constexpr,     # 0 both phases with the barrier, 1 phase 1 alone, 2 phase 2 alone
    PRELOAD: tl.constexpr,  # PART 0: the first phase-2 chunk in flight before the barrier
    POLL: tl.constexpr = 0,  # the spin: 0 acquire atomics, 1 volatile loads then one acquire atomic
):
    pid = tl.program_id(0)
    if PART != 2:
        for t in range(pid, tl.cdiv(N1, BN1), P):
            _tile(x_ptr, w1_ptr, mid_ptr, t, N1, K1, stride_w1, 0.0, False, False, BN1, BK1)
    if PART == 0:
        w0 = tl.zeros((BN2, BK2), w2_ptr.dtype.element_ty)
        if PRELOAD:  # the weights never depend on phase 1
            cols = pid * BN2 + tl.arange(0, BN2)
            w0 = _row_weights(w2_ptr + cols.to(tl.int64)[:, None] * stride_w2, tl.arange(0, BK2), K2,
                              cols < N2, 1, True, "")
        tl.debug_barrier()  # every thread's stores of mid issued before the count releases them
        arrived = tl.atomic_add(sync_ptr, 1, sem="release") + 1
        while arrived < P:
            if POLL == 1:
                arrived = tl.load(sync_ptr, volatile=True)
            else:
                arrived = tl.atomic_add(sync_ptr, 0, sem="acquire")
        if POLL == 1:
            tl.atomic_add(sync_ptr, 0, sem="acquire")  # mid's loads ordered after the count
        tl.debug_barrier()
        if pid < tl.cdiv(N2, BN2):
            _tile(mid_ptr, w2_ptr, y_ptr, pid, N2, K2, stride_w2, w0, True, PRELOAD, BN2, BK2)
        for t in range(pid + P, tl.cdiv(N2, BN2), P):
            _tile(mid_ptr, w2_ptr, y_ptr, t, N2, K2, stride_w2, w0, True, False, BN2, BK2)
        finished = tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel")
        if finished == P - 1:  # every program is past the spin: re-arm for the next call
            tl.atomic_xchg(sync_ptr, 0)
            tl.atomic_xchg(sync_ptr + 1, 0)
    if PART == 2:
        for t in range(pid, tl.cdiv(N2, BN2), P):
            _tile(mid_ptr, w2_ptr, y_ptr, t, N2, K2, stride_w2, 0.0, True, False, BN2, BK2)


def _resident(kernel, num_warps: int) -> int:
    """Programs of ``kernel`` an SM holds at once (registers, shared memory, warps; H100/H200)."""
    regs = max(1, kernel.n_regs) * 32 * num_warps
    by_regs = 65536 // regs
    shared = kernel.metadata.shared
    by_shared = (228 * 1024) // shared if shared else 32
    return min(by_regs, by_shared, 64 // num_warps, 32)


def persist_chain(x, w1, w2, mid, y, sync, tiles, num_warps=8, occ=2, preload=True, part=0, num_stages=3,
                  poll=0):
    """y = W2 (silu(g) * u) with [g | u] = W1 x. x (K1,), w1 (2F, K1), w2 (N2, F), mid (2F,),
    y (N2,) of one 16-bit dtype, unit column strides; sync: (2,) int32 zeros (left at zero).
    tiles: ((BN1, BK1), (BN2, BK2)), each BK dividing its K. occ: programs an SM (grid =
    SMs x occ, all resident); part 1 / 2: one phase alone, no barrier; poll: how the
    barrier spins (0 acquire atomics, 1 volatile loads). Under the interpreter part 0 runs
    as part 1 then part 2."""
    (bn1, bk1), (bn2, bk2) = tiles
    N1, K1 = w1.shape
    N2, K2 = w2.shape
    if N1 != 2 * K2 or K1 % bk1 or K2 % bk2:
        raise ValueError(f"shapes W1 {tuple(w1.shape)}, W2 {tuple(w2.shape)} do not fit tiles {tiles}")
    P = sm_count(x.device) * occ
    if part == 0 and is_interpreting():
        for p in (1, 2):
            persist_chain(x, w1, w2, mid, y, sync, tiles, num_warps, occ, preload, p, num_stages, poll)
        return y
    args = (x, w1, w2, mid, y, sync, K1, N1, K2, N2, P, w1.stride(0), w2.stride(0))
    meta = dict(BN1=bn1, BK1=bk1, BN2=bn2, BK2=bk2, PART=part, PRELOAD=preload and part == 0,
                num_warps=num_warps, num_stages=num_stages, POLL=poll)
    if part == 0:
        k = _persist_chain_kernel.warmup(*args, grid=(P,), **meta)
        k._init_handles()  # loads the binary: its register count is known from here
        if _resident(k, num_warps) < occ:
            raise ValueError(f"occ={occ}: the kernel ({k.n_regs} registers, {k.metadata.shared} B shared, "
                             f"{num_warps} warps) fits {_resident(k, num_warps)} programs an SM")
    _persist_chain_kernel[(P,)](*args, **meta)
    return y


def main() -> int:
    args, copy, flush, result = chain_setup()
    dev, dt = "cuda", torch.bfloat16
    for preset, (hidden, inter) in SHAPES.items():
        b1, b2 = 2 * 2 * inter * hidden, 2 * hidden * inter
        p = mlp_problem(hidden, inter, dev, dt)
        x, mid, y, cfg1, cfg2 = (p[k] for k in ("x", "mid", "y", "cfg1", "cfg2"))
        sync = torch.zeros(2, dtype=torch.int32, device=dev)
        tiles = ((cfg1.block_n, cfg1.block_k), (cfg2.block_n, cfg2.block_k))
        variants = engine_variants(p)
        # (4 warps: 155 registers, 3 programs an SM at most; the engine's GEMVs run unpipelined)
        for warps, occ, stages in ((4, 1, 3), (4, 2, 3), (8, 1, 3), (8, 2, 3), (8, 3, 3), (8, 2, 1), (8, 3, 1),
                                   (8, 4, 1)):
            tag = f"w{warps} occ{occ} st{stages}"
            for part in (1, 2):
                variants[f"persist part {part} {tag}"] = \
                    lambda w1, w2, p=part, o=occ, nw=warps, ns=stages: persist_chain(x, w1, w2, mid, y, sync, tiles,
                                                                                     nw, o, False, p, ns)
            for preload in (False, True):
                variants[f"persist chain {tag}{' preload' if preload else ''}"] = \
                    lambda w1, w2, o=occ, pl=preload, nw=warps, ns=stages: persist_chain(x, w1, w2, mid, y, sync,
                                                                                         tiles, nw, o, pl, 0, ns)
        # Phase-2 tiles twice as wide: 256 tiles (1B) for 264 programs at occ 2, one round
        wide = (tiles[0], (2 * tiles[1][0], tiles[1][1]))
        for part in (1, 2):
            variants[f"persist part {part} w8 occ2 st1 wide2"] = \
                lambda w1, w2, p=part: persist_chain(x, w1, w2, mid, y, sync, wide, 8, 2, False, p, 1)
        for preload, poll in itertools.product((False, True), (0, 1)):
            variants[f"persist chain w8 occ2 st1 wide2{' preload' if preload else ''}{' volatile' if poll else ''}"] = \
                lambda w1, w2, pl=preload, po=poll: persist_chain(x, w1, w2, mid, y, sync, wide, 8, 2, pl, 0, 1, po)
        row = {"preset": preset, "tiles": tiles, "floor_us": {"both": (b1 + b2) / copy / 1e3,
                                                              "gate_up": b1 / copy / 1e3, "down": b2 / copy / 1e3}}
        for label, f in variants.items():
            row[label] = run_variant(preset, label, f, p, flush, sync, calls=2)
        result["rows"].append(row)
        del p
        torch.cuda.empty_cache()
    (args.out / "persist-chain.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
