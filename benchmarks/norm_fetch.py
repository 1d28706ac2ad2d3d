"""Experiment: the split-row cluster norm with its segment copied straight from HBM into
shared memory (``cp.async``), the statistics and pass 2 read from there (issue 2's 64K-256K
rows; NOTES.md, twentieth session).

Why: the library's shelf (``NormConfig.shelf``) keeps the segment in shared memory by
storing each chunk from registers after its load; in-order issue then waits on every load
before the next is sent (SASS: LDG STS LDG STS), so a program has one chunk in flight and
rms_norm 256K fell 88 -> 66% of copy. ``cp.async`` needs no register round trip: every
chunk of the segment is requested at once, as the plain kernel's four LDGs are, and pass
2 reads nothing from L2 but the weight (with ``WB``, not even that: the weight and bias are
fetched the same way behind the row, into the same shared buffer).

How: the library's shelf pieces (``ops/_shelf.py``: ``shelf_fetch``'s 8-byte copies,
``shelf_quads`` / ``quad_lane`` for the statistics, ``shelf_load`` for pass 2), over a
static buffer of this experiment's own size (with ``wb``, room for w and b behind x), and
its own waits: ``cp.async.wait_group`` (1: x in, w and b may still be in flight) +
``bar.sync`` in one asm whose result the loads depend on.
bf16 dense rows, N = C x SEG, SEG a multiple of BLOCK, Llama convention (an experiment).
    python benchmarks/norm_fetch.py --out DIR      # on an H100/H200
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from onetrip.ops._cluster import launch_clusters  # noqa: E402
from cluster_barrier import cluster_arrive, share3  # noqa: E402
from onetrip.ops._jit import cast_out  # noqa: E402
from onetrip.ops._norm_jit import _split_combine, _sums_rstd  # noqa: E402
from onetrip.ops._shelf import quad_lane, shelf_fetch, shelf_load, shelf_quads  # noqa: E402

MAX_BYTES = 49152 - 256  # a CTA's static shared memory (48 KB, less the cluster exchange's 192 bytes)


def _base_asm(nbytes: int) -> str:
    return "{\n.shared .align 16 .b8 ofetch[" + str(nbytes) + "];\nmov.u32 $0, ofetch;\n}"


COMMIT = tl.constexpr("cp.async.commit_group;\nmov.u32 $0, $1;")
WAIT1 = tl.constexpr("cp.async.wait_group 1;\nbar.sync 0;\nmov.b32 $0, 0;")
WAIT0 = tl.constexpr("cp.async.wait_group 0;\nbar.sync 0;\nmov.b32 $0, 0;")


@triton.jit
def _asm_scalar(pid, ASM: tl.constexpr):
    """A side-effecting asm on a scalar; returns float32 0 (``WAIT*``) or pid (``COMMIT``)."""
    return tl.inline_asm_elementwise(ASM, "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _cluster_row(C: tl.constexpr, SEG: tl.constexpr):
    """(pid, row, lo): this program's id, its row and its segment's first column (C programs
    a row); with C > 1 it arrives on the cluster barrier first (``_cluster.share3``)."""
    pid = tl.program_id(0)
    if C > 1:
        cluster_arrive(pid)
    return pid, pid // C, (pid % C) * SEG


@triton.jit
def _seg_sums(base, qo, c, after, like_ptr, NCH: tl.constexpr, QB: tl.constexpr):
    """Sums of d = x - c and d^2 over a segment on the shelf at ``base``: NCH chunks of QB
    int64 quads (16-bit elements of ``like_ptr``'s type), read after ``after``. The
    library's ``_shelf.shelf_sums`` (and ``shelf_copy``) compute the same as loops; the
    experiments keep this unrolled form, which they were measured with: with the library's,
    offline sm_90a compiles give the ring 48 / 64 registers (rms / layer) instead of 80 /
    102, and ``norm_fetch_res`` 54 / 48 instead of 48 / 54."""
    a1 = tl.zeros([QB], tl.float32)
    a2 = tl.zeros([QB], tl.float32)
    for k in tl.static_range(NCH):
        q = shelf_quads(base + 8 * (k * QB + qo), after)
        for j in tl.static_range(4):
            d = quad_lane(q, j, like_ptr) - c
            a1 += d
            a2 += d * d
    return tl.sum(a1), tl.sum(a2)


@triton.jit
def _seg_y(h, rstd, c0, mean_lo, wv, bv, y_ptr, IS_RMS: tl.constexpr):
    """y of a chunk of a split row (float32 h, weight, bias) from the row's combined
    statistics, Llama convention (RMSNorm rounds h * rstd to y's dtype before the weight);
    the experiments' pass 2."""
    if IS_RMS:
        y = cast_out(h * rstd, y_ptr.dtype.element_ty).to(tl.float32) * wv
    else:
        y = ((h - c0) - mean_lo) * rstd * wv + bv
    return y


@triton.jit
def _param(ptr, ahead, k: tl.constexpr, lo, offs, shelf_at, after, BLOCK: tl.constexpr, WB: tl.constexpr,
           PF: tl.constexpr):
    """Chunk k of the weight (or bias) for pass 2, as float32: from the shelf at ``shelf_at``
    (WB), from the loads issued ahead (PF), or loaded now."""
    if WB:
        return shelf_load(shelf_at + 2 * (k * BLOCK + offs), after, ptr).to(tl.float32)
    elif PF > 0:
        return ahead[k].to(tl.float32)
    else:
        return tl.load(ptr + lo + k * BLOCK + offs).to(tl.float32)


@triton.jit
def _fetch_kernel(x_ptr, w_ptr, b_ptr, y_ptr, eps, N: tl.constexpr, SEG: tl.constexpr, BLOCK: tl.constexpr,
                  C: tl.constexpr, IS_RMS: tl.constexpr, WB: tl.constexpr, BASE: tl.constexpr,
                  PF: tl.constexpr = 0):
    # PF (without WB): pass 2's weight and bias loads issued PF chunks ahead of their use
    # (0: each chunk's own, after its store; NCH: all of them first)
    pid, row, lo = _cluster_row(C, SEG)
    BLOCK_S: tl.constexpr = 2 if C <= 2 else (4 if C <= 4 else (8 if C <= 8 else 16))
    NCH: tl.constexpr = SEG // BLOCK
    QB: tl.constexpr = BLOCK // 4
    xrow = x_ptr + row.to(tl.int64) * N + lo
    yrow = y_ptr + row.to(tl.int64) * N + lo
    base = tl.inline_asm_elementwise(BASE, "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)
    qo = tl.arange(0, QB)
    offs = tl.arange(0, BLOCK)
    c = 0.0
    if not IS_RMS:
        c = tl.load(xrow).to(tl.float32)
    xq = xrow.to(tl.pointer_type(tl.int64), bitcast=True)
    for k in tl.static_range(NCH):
        shelf_fetch(base + 8 * (k * QB + qo), xq + k * QB + qo, 8)
    _asm_scalar(pid, COMMIT)
    if WB:
        wq = (w_ptr + lo).to(tl.pointer_type(tl.int64), bitcast=True)
        for k in tl.static_range(NCH):
            shelf_fetch(base + 2 * SEG + 8 * (k * QB + qo), wq + k * QB + qo, 8)
        if not IS_RMS:
            bq = (b_ptr + lo).to(tl.pointer_type(tl.int64), bitcast=True)
            for k in tl.static_range(NCH):
                shelf_fetch(base + 4 * SEG + 8 * (k * QB + qo), bq + k * QB + qo, 8)
    _asm_scalar(pid, COMMIT)
    after = _asm_scalar(pid, WAIT1).to(tl.float32, bitcast=True)  # x in, every thread's copies visible
    a1, a2 = _seg_sums(base, qo, c, after, x_ptr, NCH, QB)
    c0, s1, s2 = _split_combine(share3(c, a1, a2, C), row, N, SEG, C, BLOCK_S, IS_RMS, True)
    mean_lo, rstd = _sums_rstd(s1, s2, N, eps, IS_RMS)
    after2 = rstd
    if WB:
        after2 = _asm_scalar(pid, WAIT0).to(tl.float32, bitcast=True) + rstd * 0.0  # w, b in
    wq = ()
    bq = ()
    for k in tl.static_range(PF):  # the first PF chunks' weight and bias in flight
        if k < NCH:
            wq = wq + (tl.load(w_ptr + lo + k * BLOCK + offs),)
            if not IS_RMS:
                bq = bq + (tl.load(b_ptr + lo + k * BLOCK + offs),)
    for k in tl.static_range(NCH):
        if PF > 0 and k + PF < NCH:  # the next one in flight before this chunk's math and store
            wq = wq + (tl.load(w_ptr + lo + (k + PF) * BLOCK + offs),)
            if not IS_RMS:
                bq = bq + (tl.load(b_ptr + lo + (k + PF) * BLOCK + offs),)
        h = shelf_load(base + 2 * (k * BLOCK + offs), after2, x_ptr).to(tl.float32)
        wv = _param(w_ptr, wq, k, lo, offs, base + 2 * SEG, after2, BLOCK, WB, PF)
        bv = 0.0
        if not IS_RMS:
            bv = _param(b_ptr, bq, k, lo, offs, base + 4 * SEG, after2, BLOCK, WB, PF)
        y = _seg_y(h, rstd, c0, mean_lo, wv, bv, y_ptr, IS_RMS)
        tl.store(yrow + k * BLOCK + offs, cast_out(y, y_ptr.dtype.element_ty), eviction_policy="evict_first")


def fetch_norm(x, weight, bias, eps, y, c: int, block: int, warps: int, wb: bool, pf: int = 0):
    """RMSNorm (bias None) or LayerNorm of dense bf16 rows x (M, N) into y: a cluster of c
    programs a row (c = 1: a program), each fetching its segment into shared memory."""
    M, N = x.shape
    seg = N // c
    is_rms = bias is None
    nbytes = 2 * seg * (3 if wb and not is_rms else (2 if wb else 1))
    if N % c or seg % block or block % 4 or not (c == 1 or 2 <= c <= 16) or nbytes > MAX_BYTES:
        raise ValueError(f"N={N} in {c} segments of whole {block}-wide chunks, {nbytes} bytes of shared memory")
    if x.dtype != torch.bfloat16 or any(t.data_ptr() % 16 for t in (x, weight, y)):
        raise ValueError("dense, 16-byte aligned bf16 rows")
    args = (x, weight, bias if bias is not None else weight, y, eps)
    meta = dict(N=N, SEG=seg, BLOCK=block, C=c, IS_RMS=is_rms, WB=wb, BASE=_base_asm(nbytes), PF=pf,
                num_warps=warps)
    if c == 1:
        _fetch_kernel[(M,)](*args, **meta)
    elif launch_clusters(_fetch_kernel, M, c, *args, **meta) is None:
        raise RuntimeError("this Triton's launcher takes no cluster size")
    return y


def ptx_report(N: int, c: int, block: int, warps: int, is_rms: bool, wb: bool, pf: int = 0) -> str:
    """Registers and spills at sm_90a (offline: Triton 3.6 + ptxas)."""
    from ptxas_report import bf16_report  # noqa: PLC0415
    nbytes = 2 * (N // c) * (3 if wb and not is_rms else (2 if wb else 1))
    return bf16_report(_fetch_kernel, dict(N=N, SEG=N // c, BLOCK=block, C=c, IS_RMS=is_rms, WB=wb,
                                           BASE=_base_asm(nbytes), PF=pf), warps)


def _lib(block: int, warps: int, split: int, hold: int):
    """The library's split-row cluster config at these knobs, timed beside the fetch."""
    from onetrip.ops.norm import NormConfig  # noqa: PLC0415
    return NormConfig("loop", 1, block, warps, hints=True, vec=True, const_n=True, split=split, hold=hold,
                      drop_y=True, cluster=True)


# (rows, width): fetch variants (c, block, warps, wb[, pf]), and library configs ("lib", block, warps, split, hold)
VARIANTS = {(512, 131072): [(8, 4096, 8, False), (8, 4096, 8, False, 1), (8, 4096, 8, False, 2),
                            (8, 4096, 8, False, 4), (8, 4096, 16, False, 1), (8, 4096, 16, False, 4)],
            (256, 262144): [(16, 4096, 8, False), (16, 4096, 8, False, 1), (16, 4096, 8, False, 2),
                            (16, 4096, 8, False, 4), (16, 4096, 16, False, 1), (16, 4096, 16, False, 4)],
            (64, 262144): [(16, 4096, 8, False), (16, 4096, 8, False, 1), (16, 4096, 8, False, 4)]}


def _variants(rows, width, is_rms, w, b, eps):
    from onetrip.ops import norm  # noqa: PLC0415
    out = []
    for v in VARIANTS[(rows, width)]:
        if v[0] == "lib":
            cfg = _lib(*v[1:])
            out.append((f"library {v[1]}x{v[2]}w split {v[3]} hold {v[4]}",
                        lambda x, y, cfg=cfg: norm._launch(x, None, w, b, y, None, eps, is_rms, False, cfg)))
            continue
        c, block, warps, wb = v[:4]
        if wb and 2 * (width // c) * (2 if is_rms else 3) > MAX_BYTES:
            continue
        pf = f" pf{v[4]}" if len(v) > 4 else ""
        out.append((f"fetch c{c} {block}x{warps}w{' wb' if wb else ''}{pf}",
                    lambda x, y, v=v: fetch_norm(x, w, b, eps, y, *v)))
    return out


def main() -> int:
    from norm_variants import rows_main
    return rows_main(list(VARIANTS), _variants, "norm-fetch.json")


if __name__ == "__main__":
    raise SystemExit(main())
