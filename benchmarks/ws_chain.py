"""Experiment: two dependent batch-1 GEMVs in one persistent, warp-specialized launch (Gluon,
Hopper): issue 5's 1B bar (NOTES.md, fifteenth session). With NORM_IN and RES_OUT the
kernel is the engine's whole MLP block (RMSNorm from the producer's partial sums in the
prologue, the residual add and the next norm's partials in the epilogue): the op and the
engine switch built on it measured slower than the engine's two launches and are kept in
``experiments/gemv-mlp.patch``.

    mid = W1 x                  (N1 = 2F, K1)   gate_up
    y   = W2 (silu(g) * u)      (N2, K2 = F)    down, mid = [g | u]

persist_chain.py measured a boundary inside a Triton kernel (a grid barrier) no cheaper
than the engine's two launches under PDL: the tail of phase 1 and the barrier leave the
HBM idle, and a program can have only a chunk of phase 2's weight in flight meanwhile.
What the published decode megakernels do instead is never stop the weight stream: warps
that only load keep streaming the next phase's weights into shared memory while the warps
that compute wait at the barrier. Here, one program an SM (grid = SMs, all resident):

    producer partition (1 warp)   TMA boxes (R rows x 256 columns of W, 8 KB) of this
                                  program's phase-1 row blocks, then of its phase-2 row
                                  blocks, into a ring of NSLOT slots; it never waits on the
                                  barrier, only for a free slot
    consumer partition (WARPS)    x staged in shared memory (float32); per box: wait for
                                  it, (R, 256) products with x's chunk summed into a
                                  float32 (R, 256) accumulator, free the slot; per row
                                  block the row sums stored; between the phases a grid
                                  barrier (release count, acquire spin); phase 2's x =
                                  silu(g) * u staged from mid (past L1) a chunk of CH at a
                                  time, the next chunk's loads in flight during the boxes

Row blocks go round-robin over the programs (phase 1: N1 / R blocks, phase 2: N2 / R).
With NSLOT x 8 KB of ring (up to 24 slots, 192 KB) a program has up to that much of phase
2's weight on chip when its consumer passes the barrier. PART 1 / 2 time one phase alone.

    python benchmarks/ws_chain.py --out DIR     # on an H100/H200 (Gluon needs Hopper)

The timing is persist_chain's: one CUDA graph of calls over weight copies past L2, beside
the engine's pair of launches.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from onetrip.ops._common import sm_count  # noqa: E402
from onetrip.ops.gemv_norm import gemv_add_residual, gemv_rms_norm  # noqa: E402

BOX = 256  # a box's columns: 512 bytes of a weight row, TMA's widest box dimension
BOX_K = gl.constexpr(BOX)


@dataclass(frozen=True)
class MlpConfig:
    """rows: R, a box's rows (and a row block's); slots: NSLOT, the ring; ch: CH, the chunk
    of phase 2's x staged per L2 round trip; warps: the consumer's."""

    rows: int = 16
    slots: int = 8
    ch: int = 1024
    warps: int = 4


# H200 (ws_chain.py, three runs, 2026-11-24): 1B best at 8 slots, chunks of 1024 (29.5 us;
# 16 slots 30.8-31.1, 24 slots 32.3); 8B at 16 slots, chunks of 2048 (86.0; 8 slots 88.0).
def mlp_config(n_down: int) -> MlpConfig:
    return MlpConfig(slots=8, ch=1024) if n_down <= 2048 else MlpConfig(slots=16, ch=2048)


@gluon.jit
def _stream(desc, bufs, ready, empty, i, pid, P, nb, kb, R: gl.constexpr, NSLOT: gl.constexpr):
    """This program's row blocks of one weight into the ring, from ring position ``i``;
    returns the position after them."""
    for b in range(pid, nb, P):
        for kc in range(kb):
            slot = i % NSLOT
            mbarrier.wait(empty.index(slot), ((i // NSLOT) & 1) ^ 1)
            mbarrier.expect(ready.index(slot), desc.block_type.nbytes)
            tma.async_copy_global_to_shared(desc, [b * R, kc * BOX_K], ready.index(slot), bufs.index(slot))
            i += 1
    return i


@gluon.jit
def _producer(w1_desc, w2_desc, bufs, ready, empty, pid, P, nb1, nb2, kb1, kb2, PART: gl.constexpr,
              R: gl.constexpr, NSLOT: gl.constexpr):
    """Stream this program's boxes: phase 1's row blocks, then phase 2's, through the ring."""
    i = 0
    if PART != 2:
        i = _stream(w1_desc, bufs, ready, empty, i, pid, P, nb1, kb1, R, NSLOT)
    if PART != 1:
        _stream(w2_desc, bufs, ready, empty, i, pid, P, nb2, kb2, R, NSLOT)


@gluon.jit
def _box(xs, bufs, ready, empty, acc, i, kc, NSLOT: gl.constexpr, layout: gl.constexpr):
    """One box into the accumulator: wait for ring slot i, multiply by x's chunk kc, free it."""
    x = xs.index(kc).load(gl.SliceLayout(0, layout))
    slot = i % NSLOT
    mbarrier.wait(ready.index(slot), (i // NSLOT) & 1)
    w = bufs.index(slot).load(layout).to(gl.float32)
    fence_async_shared()  # this read of the slot before the TMA's next write into it
    mbarrier.arrive(empty.index(slot), count=1)
    return acc + w * x[None, :]


@gluon.jit
def _stage_x1(x_ptr, xs, K, ss_ptr, n_ss, nw_ptr, eps, NORM_IN: gl.constexpr, CH: gl.constexpr,
              WARPS: gl.constexpr):
    """(CH divides K: the launch passes phase 1's own chunk, CH1.)"""
    """Phase 1's x into shared memory as float32; NORM_IN: h * g * rsqrt(mean(h^2) + eps),
    the statistic from the producer's n_ss partial sums in float64 (``_gemv_jit._rstd``'s
    order of operations, so x is what the engine's GEMV multiplies)."""
    lay: gl.constexpr = gl.BlockedLayout([CH // (32 * WARPS)], [32], [WARPS], [0])
    idx = gl.arange(0, CH, layout=lay)
    xv = xs._reinterpret(gl.float32, [xs.shape[0] * BOX_K // CH, CH], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    rstd = 1.0
    if NORM_IN:
        tot = gl.zeros([CH], gl.float64, lay)
        for j0 in range(0, n_ss, CH):
            tot += gl.load(ss_ptr + j0 + idx, mask=j0 + idx < n_ss, other=0.0).to(gl.float64)
        rstd = (1.0 / gl.sqrt(gl.sum(tot, axis=0) / K + eps)).to(gl.float32)
    for c in range(K // CH):
        v = gl.load(x_ptr + c * CH + idx).to(gl.float32)
        if NORM_IN:
            v = v * gl.load(nw_ptr + c * CH + idx).to(gl.float32) * rstd
        xv.index(c).store(v)
    gl.thread_barrier()  # every warp's chunk of x before any box reads it


@gluon.jit
def _phase1(xs, out_ptr, bufs, ready, empty, pid, P, nb, kb, R: gl.constexpr, NSLOT: gl.constexpr,
            layout: gl.constexpr):
    """Phase 1's boxes from ring position 0; returns the ring position after them."""
    rows = gl.arange(0, R, layout=gl.SliceLayout(1, layout))
    i = 0
    for b in range(pid, nb, P):
        acc = gl.zeros([R, BOX_K], gl.float32, layout)
        for kc in range(kb):
            acc = _box(xs, bufs, ready, empty, acc, i, kc, NSLOT, layout)
            i += 1
        gl.store(out_ptr + b * R + rows, gl.sum(acc, axis=1).to(out_ptr.dtype.element_ty))
    return i


@gluon.jit
def _grid_barrier(sync_ptr, P):
    """Every program's phase-1 stores before its release; all P in before any program reads.
    The last program past it re-arms both counters for the next launch."""
    gl.thread_barrier()
    gl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
    seen = gl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    while seen < P:
        seen = gl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    gl.thread_barrier()
    out = gl.atomic_add(sync_ptr + 1, 1, sem="relaxed", scope="gpu")
    if out == P - 1:
        gl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")
        gl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed", scope="gpu")


@gluon.jit
def _phase2(mid_ptr, y_ptr, res_ptr, ss_out_ptr, xs, bufs, ready, empty, i, pid, P, nb, K, R: gl.constexpr,
            NSLOT: gl.constexpr, layout: gl.constexpr, CH: gl.constexpr, WARPS: gl.constexpr,
            RES_OUT: gl.constexpr):
    """Phase 2: x = silu(g) * u staged a chunk at a time, the next chunk's loads in flight
    while the first row block uses this one's boxes (staging all of x first put K / CH L2
    round trips ahead of the first box: 1B 13.8 -> 12.2 us alone). RES_OUT: y += residual,
    and this program's sum of y^2 (as rounded) into ss_out[pid]."""
    BPC: gl.constexpr = CH // BOX_K
    lay: gl.constexpr = gl.BlockedLayout([CH // (32 * WARPS)], [32], [WARPS], [0])
    idx = gl.arange(0, CH, layout=lay)
    xv = xs._reinterpret(gl.float32, [xs.shape[0] * BOX_K // CH, CH], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    rows = gl.arange(0, R, layout=gl.SliceLayout(1, layout))
    nch = K // CH
    g = gl.load(mid_ptr + idx, cache_modifier=".cg").to(gl.float32)  # written by other programs: past L1
    u = gl.load(mid_ptr + K + idx, cache_modifier=".cg").to(gl.float32)
    acc = gl.zeros([R, BOX_K], gl.float32, layout)
    for c in range(nch):
        xv.index(c).store(g / (1.0 + gl.exp(-g)) * u)
        gl.thread_barrier()  # chunk c in shared memory for every warp
        more = idx < (nch - 1 - c) * CH
        nxt = (c + 1) * CH + idx
        g = gl.load(mid_ptr + nxt, mask=more, other=0.0, cache_modifier=".cg").to(gl.float32)
        u = gl.load(mid_ptr + K + nxt, mask=more, other=0.0, cache_modifier=".cg").to(gl.float32)
        if pid < nb:
            for j in range(BPC):
                acc = _box(xs, bufs, ready, empty, acc, i, c * BPC + j, NSLOT, layout)
                i += 1
    ss = gl.zeros([R], gl.float32, gl.SliceLayout(1, layout))
    kb = K // BOX_K
    for b in range(pid, nb, P):
        if b != pid:  # later row blocks: x is staged whole by now
            acc = gl.zeros([R, BOX_K], gl.float32, layout)
            for kc in range(kb):
                acc = _box(xs, bufs, ready, empty, acc, i, kc, NSLOT, layout)
                i += 1
        y = gl.sum(acc, axis=1)
        if RES_OUT:
            y += gl.load(res_ptr + b * R + rows).to(gl.float32)
        yr = y.to(y_ptr.dtype.element_ty)
        gl.store(y_ptr + b * R + rows, yr)
        if RES_OUT:
            yf = yr.to(gl.float32)
            ss += yf * yf
    if RES_OUT:
        gl.store(ss_out_ptr + pid, gl.sum(ss, axis=0))


@gluon.jit
def _consumer(x_ptr, mid_ptr, y_ptr, res_ptr, ss_in_ptr, n_ss, nw_ptr, eps, ss_out_ptr, sync_ptr, bufs, xs, ready,
              empty, pid, P, nb1, nb2, kb1, K1, K2, PART: gl.constexpr, R: gl.constexpr, NSLOT: gl.constexpr,
              WARPS: gl.constexpr, CH: gl.constexpr, CH1: gl.constexpr, NORM_IN: gl.constexpr,
              RES_OUT: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
    i = 0
    if PART != 2:
        _stage_x1(x_ptr, xs, K1, ss_in_ptr, n_ss, nw_ptr, eps, NORM_IN, CH1, WARPS)
        i = _phase1(xs, mid_ptr, bufs, ready, empty, pid, P, nb1, kb1, R, NSLOT, layout)
    if PART == 0:
        _grid_barrier(sync_ptr, P)
    if PART != 1:
        _phase2(mid_ptr, y_ptr, res_ptr, ss_out_ptr, xs, bufs, ready, empty, i, pid, P, nb2, K2, R, NSLOT, layout,
                CH, WARPS, RES_OUT)


@gluon.jit
def _gemv_mlp_kernel(w1_desc, w2_desc, x_ptr, mid_ptr, y_ptr, res_ptr, ss_in_ptr, n_ss, nw_ptr, eps, ss_out_ptr,
                     sync_ptr, N1, K1, N2, K2,
                     PART: gl.constexpr, R: gl.constexpr, NSLOT: gl.constexpr, WARPS: gl.constexpr,
                     KX: gl.constexpr, CH: gl.constexpr, CH1: gl.constexpr, NORM_IN: gl.constexpr,
                     RES_OUT: gl.constexpr):
    """PART 1 / 2: one phase alone (benchmarks/ws_chain.py times them), 0: the chain."""
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    bufs = gl.allocate_shared_memory(w1_desc.dtype, [NSLOT, R, BOX_K], w1_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NSLOT, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NSLOT, 1], mbarrier.MBarrierLayout())
    xs = gl.allocate_shared_memory(gl.float32, [KX // BOX_K, BOX_K], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    for s in gl.static_range(NSLOT):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    nb1 = N1 // R
    nb2 = N2 // R
    kb1 = K1 // BOX_K
    kb2 = K2 // BOX_K
    gl.warp_specialize([
        (_consumer, (x_ptr, mid_ptr, y_ptr, res_ptr, ss_in_ptr, n_ss, nw_ptr, eps, ss_out_ptr, sync_ptr, bufs, xs,
                     ready, empty, pid, P, nb1, nb2, kb1, K1, K2, PART, R, NSLOT, WARPS, CH, CH1, NORM_IN, RES_OUT)),
        (_producer, (w1_desc, w2_desc, bufs, ready, empty, pid, P, nb1, nb2, kb1, kb2, PART, R, NSLOT)),
    ], [1], [40])


@functools.lru_cache(maxsize=None)
def _box_layout():
    """An (R, 256) bf16 box without swizzle: a row of 512 bytes read by one warp, 16 bytes a
    thread, is free of bank conflicts."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)


_SYNC: dict = {}


def _sync(device: torch.device) -> torch.Tensor:
    """The grid barrier's two counters, zero between launches (each launch re-arms them):
    one buffer a device, as launches on one stream run one after another."""
    key = (device.type, device.index)
    if key not in _SYNC:
        _SYNC[key] = torch.zeros(2, dtype=torch.int32, device=device)
    return _SYNC[key]


def launch(x, w1, w2, mid, y, *, residual=None, ss_in=None, norm_weight=None, eps=0.0, ss_out=None, part=0,
           config: Optional[MlpConfig] = None, sync=None, sms=None):
    """The kernel on tensors as the engine has them (x, mid, y one row each; residual, ss_in,
    norm_weight: the MLP block's prologue and epilogue, ``experiments/gemv-mlp.patch``'s op)."""
    N1, K1 = w1.shape
    N2, K2 = w2.shape
    cfg = config or mlp_config(N2)
    layout = _box_layout()
    d1 = TensorDescriptor.from_tensor(w1, [cfg.rows, BOX], layout)
    d2 = TensorDescriptor.from_tensor(w2, [cfg.rows, BOX], layout)
    grid = (sms or sm_count(x.device),)
    _gemv_mlp_kernel[grid](
        d1, d2, x, mid, y, residual if residual is not None else y, ss_in if ss_in is not None else y,
        ss_in.numel() if ss_in is not None else 0, norm_weight if norm_weight is not None else y, eps,
        ss_out if ss_out is not None else y, sync if sync is not None else _sync(x.device), N1, K1, N2, K2,
        PART=part, R=cfg.rows, NSLOT=cfg.slots, WARPS=cfg.warps, KX=triton.next_power_of_2(max(K1, K2)), CH=cfg.ch,
        CH1=min(cfg.ch, K1 & -K1),
        NORM_IN=ss_in is not None, RES_OUT=residual is not None, num_warps=cfg.warps)




def ws_chain(x, w1, w2, mid, y, sync, part=0, R=16, nslot=16, warps=4, ch=2048, stream=True, sms=None, **kw):
    """mid = w1 @ x; y = w2 @ (silu(mid[:F]) * mid[F:]); one launch (``kw``: ``launch``'s
    norm and residual). ``stream`` is kept for the results' labels: the kernel now always
    streams phase 2's x (the first runs staged it whole first)."""
    launch(x, w1, w2, mid, y, part=part, config=MlpConfig(R, nslot, ch, warps), sync=sync, sms=sms, **kw)


def main() -> int:
    import importlib

    from gemv_chain import SHAPES, chain_setup, engine_variants, mlp_problem, run_variant  # noqa: PLC0415

    sm = importlib.import_module("onetrip.ops.skinny_matmul")
    args, copy, flush, result = chain_setup(presets=True)
    dev, dt = "cuda", torch.bfloat16
    for preset in args.presets:
        hidden, inter = SHAPES[preset]
        b1, b2 = 2 * 2 * inter * hidden, 2 * hidden * inter
        p = mlp_problem(hidden, inter, dev, dt)
        x, mid, y = p["x"], p["mid"], p["y"]
        x2 = x[None]
        sync = torch.zeros(2, dtype=torch.int32, device=dev)
        variants = engine_variants(p)
        nw = torch.ones(hidden, device=dev, dtype=dt)
        ss = x.float().square().sum().reshape(1)
        ss_out = torch.empty(sm_count(x.device), dtype=torch.float32, device=dev)
        y_res = torch.empty_like(y)
        variants["engine gemv_rms_norm + gemv_add_residual"] = lambda w1, w2: gemv_add_residual(
            gemv_rms_norm(x2, ss, nw, 1e-5, w1), w2, x2, silu_mul=True)
        variants["ws chain + norm + residual (the op)"] = lambda w1, w2: launch(
            x, w1, w2, mid, y_res, residual=x, ss_in=ss, norm_weight=nw, eps=1e-5, ss_out=ss_out, sync=sync,
            config=mlp_config(w2.shape[0]))
        for R, nslot, warps, ch, stream in ((16, 8, 4, 1024, True), (16, 8, 4, 2048, True), (16, 12, 4, 1024, True),
                                            (16, 16, 4, 2048, True)):
            tag = f"R{R} slots{nslot} w{warps} ch{ch}{' streamed' if stream else ''}"
            for part in (1, 2, 0):
                if part == 1 and ch != 1024:
                    continue  # phase 1 does not use ch
                name = {1: "phase 1 alone", 2: "phase 2 alone", 0: "chain"}[part]
                variants[f"ws {name} {tag}"] = (
                    lambda w1, w2, pt=part, r=R, ns=nslot, nw=warps, c=ch, st=stream: ws_chain(
                        x, w1, w2, mid, y, sync, pt, r, ns, nw, c, st))
        row = {"preset": preset, "floor_us": {"both": (b1 + b2) / copy / 1e3, "gate_up": b1 / copy / 1e3,
                                              "down": b2 / copy / 1e3}}
        for label, f in variants.items():
            def prepare(label=label, p=p):
                p["mid"].fill_(float("nan"))
                if "phase 2" in label:  # its input from the engine's phase 1
                    sm._launch(x2, p["ws"][0][0], None, mid[None], p["cfg1"])
            row[label] = run_variant(preset, label, f, p, flush, sync, prepare=prepare,
                                     check=not ("phase 1" in label or "gate_up" in label or "norm" in label))
        result["rows"].append(row)
        (args.out / "ws-chain.json").write_text(json.dumps(result, indent=1))
        del p
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
