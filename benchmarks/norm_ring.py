"""Experiment: persistent clusters streaming rows through a ring of shared-memory shelves
(issue 2's 128K-256K rows, and 64 rows of 256K above all; NOTES.md, twenty-first session).

Why (the hypothesis): in the library's split-row cluster norm every program reads its
segment, waits for its cluster's sums, then writes: a program's loads and its stores never
overlap, and the programs of a wave reach the exchange at about the same time, so the grid
might go through phases of loads only and stores only, with a bubble at every turn (64
rows of 256K: 76% of copy where a copy of the same bytes reaches 93%). Here a
grid of G clusters of C programs stays resident; cluster g takes rows g, g + G, ...; each
program copies its segment of the next DEPTH - 1 rows into shared memory (``cp.async``,
no registers) while it normalizes this one, so its loads of row i + 1 are in flight
during row i's exchange and stores. With ``WSM`` the weight (and bias) of the segment is
fetched once into shared memory for all the program's rows.

Measured on an H100 (``results/norm-ring-h100-20261126*.json``): lost to the library's
picks by 10-45 points, and as much with one row a cluster (nothing streamed): 80-102
registers at 8 warps and the 64 KB ring leave 2-3 programs an SM where the picks run 4-6,
and at equal occupancy streaming gained nothing. The bubbles are not what limits.

How: the library's shelf pieces (``ops/_shelf.py``), a dynamic shared-memory ring (the
launch of ``norm_fetch_res.py``: DEPTH x 2 SEG bytes, plus 2 SEG for each of w and b with
WSM) and the library's cluster exchange (``_cluster.share3``) once a row. share3 starts
with a cluster-barrier wait paired with the previous arrive: the kernel's first arrive,
then for each row an arrive (release) after the program has read its siblings' sums, so no
sibling overwrites them before they are read. Per row: ``cp.async.wait_group DEPTH - 1``
+ ``bar.sync`` (this row in), the sums from the shelf, the exchange, pass 2 from the
shelf, then ``bar.sync`` (every thread done with the slot) and the copy of row i + DEPTH
into it. Every row commits one copy group (empty past the last row) so the count holds.
bf16 dense rows, N = C x SEG, SEG a multiple of BLOCK, Llama convention (an experiment).
    python benchmarks/norm_ring.py --out DIR      # on an H100/H200
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_room import max_clusters  # noqa: E402
from norm_fetch import COMMIT, _asm_scalar, _seg_sums, _seg_y  # noqa: E402
from norm_fetch_res import DYN_BASE, _launch  # noqa: E402
from cluster_barrier import cluster_arrive, share3  # noqa: E402
from onetrip.ops._jit import cast_out  # noqa: E402
from onetrip.ops._norm_jit import _split_combine, _sums_rstd  # noqa: E402
from onetrip.ops._shelf import quad_lane, shelf_fetch, shelf_load, shelf_quads  # noqa: E402

ARRIVE_REL = tl.constexpr("barrier.cluster.arrive.release.aligned;\nmov.b32 $0, $1;")
WAIT_CLUSTER = tl.constexpr("barrier.cluster.wait.aligned;\nmov.u32 $0, $1;")
BAR = tl.constexpr("bar.sync 0;\nmov.u32 $0, $1;")


def _wait_asm(depth: int) -> str:
    """This thread's copies but the newest depth - 1 groups done, then the CTA's (bar.sync)."""
    return f"cp.async.wait_group {depth - 1};\nbar.sync 0;\nmov.b32 $0, 0;"


@triton.jit
def _fetch_seg(src_ptr, dst, qo, NCH: tl.constexpr, QB: tl.constexpr):
    """Start copying NCH chunks of QB int64 quads from ``src_ptr`` (16-bit elements) to the
    shared address ``dst``."""
    q = src_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
    for k in tl.static_range(NCH):
        shelf_fetch(dst + 8 * (k * QB + qo), q + k * QB + qo, 8)


@triton.jit
def _ring_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, G, eps, SH_OFF, N: tl.constexpr, SEG: tl.constexpr,
                 BLOCK: tl.constexpr, C: tl.constexpr, IS_RMS: tl.constexpr, DEPTH: tl.constexpr,
                 WSM: tl.constexpr, WAITN: tl.constexpr):
    pid = tl.program_id(0)
    cluster_arrive(pid)  # paired with the first exchange's opening wait
    g = pid // C
    lo = (pid % C) * SEG
    BLOCK_S: tl.constexpr = 2 if C <= 2 else (4 if C <= 4 else (8 if C <= 8 else 16))
    NCH: tl.constexpr = SEG // BLOCK
    QB: tl.constexpr = BLOCK // 4
    SLOT: tl.constexpr = 2 * SEG  # bytes of one row's segment
    base = tl.inline_asm_elementwise(DYN_BASE, "=r,r", [SH_OFF], dtype=tl.int32, is_pure=False, pack=1)
    wsm = base + DEPTH * SLOT  # WSM: w at wsm, b at wsm + SLOT
    qo = tl.arange(0, QB)
    offs = tl.arange(0, BLOCK)
    if WSM:  # its own group, committed first: complete by the first row's wait
        _fetch_seg(w_ptr + lo, wsm, qo, NCH, QB)
        if not IS_RMS:
            _fetch_seg(b_ptr + lo, wsm + SLOT, qo, NCH, QB)
        _asm_scalar(pid, COMMIT)
    for d in tl.static_range(DEPTH):
        r = g + d * G
        if r < M:
            _fetch_seg(x_ptr + r.to(tl.int64) * N + lo, base + d * SLOT, qo, NCH, QB)
        _asm_scalar(pid, COMMIT)
    n_mine = (M - g + G - 1) // G
    for i in range(n_mine):
        row = g + i * G
        buf = base + (i % DEPTH) * SLOT
        after = _asm_scalar(pid, WAITN).to(tl.float32, bitcast=True)  # this row's segment in
        c = 0.0
        if not IS_RMS:  # the segment's first value: the shift of its sums
            c = tl.sum(quad_lane(shelf_quads(buf + tl.zeros([1], tl.int32), after), 0, x_ptr))
        a1, a2 = _seg_sums(buf, qo, c, after, x_ptr, NCH, QB)
        c0, s1, s2 = _split_combine(share3(c, a1, a2, C), row, N, SEG, C, BLOCK_S, IS_RMS, True)
        mean_lo, rstd = _sums_rstd(s1, s2, N, eps, IS_RMS)
        # the siblings' sums are read (rstd depends on them): they may overwrite them now
        tl.inline_asm_elementwise(ARRIVE_REL, "=r,f", [rstd], dtype=tl.int32, is_pure=False, pack=1)
        yrow = y_ptr + row.to(tl.int64) * N + lo
        for k in tl.static_range(NCH):
            h = shelf_load(buf + 2 * (k * BLOCK + offs), rstd, x_ptr).to(tl.float32)
            if WSM:
                wv = shelf_load(wsm + 2 * (k * BLOCK + offs), rstd, w_ptr).to(tl.float32)
            else:
                wv = tl.load(w_ptr + lo + k * BLOCK + offs).to(tl.float32)
            bv = 0.0
            if not IS_RMS:
                if WSM:
                    bv = shelf_load(wsm + SLOT + 2 * (k * BLOCK + offs), rstd, b_ptr).to(tl.float32)
                else:
                    bv = tl.load(b_ptr + lo + k * BLOCK + offs).to(tl.float32)
            y = _seg_y(h, rstd, c0, mean_lo, wv, bv, y_ptr, IS_RMS)
            tl.store(yrow + k * BLOCK + offs, cast_out(y, y_ptr.dtype.element_ty), eviction_policy="evict_first")
        _asm_scalar(pid, BAR)  # every thread is done with the slot (the stores above read it)
        nxt = row + DEPTH * G
        if nxt < M:
            _fetch_seg(x_ptr + nxt.to(tl.int64) * N + lo, buf, qo, NCH, QB)
        _asm_scalar(pid, COMMIT)
    _asm_scalar(pid, WAIT_CLUSTER)  # paired with the last arrive


def ring_bytes(seg: int, depth: int, wsm: bool, is_rms: bool) -> int:
    """Dynamic shared memory a program: DEPTH segments, plus w (and b) with WSM."""
    return 2 * seg * (depth + ((1 if is_rms else 2) if wsm else 0))


def ring_norm(x, weight, bias, eps, y, c: int, block: int, warps: int, clusters: int, depth: int = 2,
              wsm: bool = False):
    """RMSNorm (bias None) or LayerNorm of dense bf16 rows x (M, N) into y by ``clusters``
    persistent clusters of c programs (a row's segments), a ring of ``depth`` rows each."""
    M, N = x.shape
    seg = N // c
    is_rms = bias is None
    nbytes = ring_bytes(seg, depth, wsm, is_rms)
    if N % c or seg % block or block % (32 * warps * 8) or not 2 <= c <= 16 or nbytes > 200 * 1024:
        raise ValueError(f"N={N} in {c} segments of whole {block}-wide chunks at {warps} warps, {nbytes} B")
    if x.dtype != torch.bfloat16 or any(t.data_ptr() % 16 for t in (x, weight, y)):
        raise ValueError("dense, 16-byte aligned bf16 rows")
    args = (x, weight, bias if bias is not None else weight, y, M, clusters, eps)
    meta = dict(N=N, SEG=seg, BLOCK=block, C=c, IS_RMS=is_rms, DEPTH=depth, WSM=wsm, WAITN=_wait_asm(depth),
                num_warps=warps)
    return _launch(_ring_kernel, clusters, c, nbytes, *args, **meta)


def ptx_report(N: int, c: int, block: int, warps: int, is_rms: bool, depth: int = 2, wsm: bool = False) -> str:
    """Registers and spills at sm_90a (offline: Triton 3.6 + ptxas)."""
    from ptxas_report import bf16_report  # noqa: PLC0415
    return bf16_report(_ring_kernel, dict(N=N, SEG=N // c, BLOCK=block, C=c, IS_RMS=is_rms, DEPTH=depth, WSM=wsm,
                                          WAITN=_wait_asm(depth)), warps)


# (rows, width): (c, block, warps, clusters, depth, wsm); clusters "fit": as many as fit at once,
# "M/k": a k-th of the rows (k rows a cluster; clusters past the GPU's room wait their turn)
VARIANTS = {(256, 262144): [(16, 4096, 8, g, 2, wsm) for g in ("M/1", "M/2", "M/4", "fit") for wsm in (False, True)],
            (64, 262144): [(16, 4096, 8, g, 2, wsm) for g in ("M/1", "M/2", "M/4", "fit") for wsm in (False, True)],
            (512, 131072): [(8, 4096, 8, g, 2, wsm) for g in ("M/1", "M/2", "M/4") for wsm in (False, True)]}


def _variants(rows, width, is_rms, w, b, eps):
    out = []
    for c, block, warps, g, depth, wsm in VARIANTS[(rows, width)]:
        nbytes = ring_bytes(width // c, depth, wsm, is_rms)
        if nbytes > 200 * 1024:
            continue
        if g == "fit":  # the GPU's room, from a first launch's compiled kernel
            x = torch.empty(c, width, device="cuda", dtype=torch.bfloat16)
            compiled = ring_norm(x, w, b, eps, torch.empty_like(x), c, block, warps, 1, depth, wsm)
            clusters = max_clusters(compiled, c, warps, nbytes + _shared_of(compiled))
            print(f"  c{c} {block}x{warps}w depth {depth} wsm {wsm}: {clusters} clusters fit", flush=True)
            if not clusters:
                continue
        else:
            clusters = rows // int(g.split("/")[1])
        out.append((f"ring c{c} {block}x{warps}w G{clusters} d{depth}{' wsm' if wsm else ''}",
                    lambda x, y, v=(c, block, warps, clusters, depth, wsm): ring_norm(x, w, b, eps, y, *v)))
    return out


def _shared_of(compiled) -> int:
    """Triton's own shared memory of the compiled kernel (before the ring)."""
    from norm_fetch_res import _OFFSETS  # noqa: PLC0415
    return _OFFSETS.get(id(compiled), 0)


def main() -> int:
    from norm_variants import rows_main
    return rows_main(list(VARIANTS), _variants, "norm-ring.json")


if __name__ == "__main__":
    raise SystemExit(main())
