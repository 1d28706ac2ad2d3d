"""Experiment: the residual norms (add_rms_norm, add_layer_norm) with x and r copied into
shared memory (``cp.async``), h = x + r stored once to HBM and kept in shared memory for
pass 2 (issue 2's 128K-256K rows with a residual; NOTES.md, twentieth session).

Why: the library's residual picks stash h in pass 1 and re-read it from L2 in pass 2 (as
``norm_fetch.py`` found for LayerNorm, that re-read costs where pass 2 also reads w and b
from L2). x and r of a 16K-column bf16 segment take 64 KB, past the 48 KB of static shared
memory a kernel may declare, so the buffer is dynamic: the kernel is compiled, then its
launch metadata asks for Triton's own shared memory plus the buffer (``_launch``), and the
kernel finds the buffer at ``global_smem + SH_OFF`` (Triton's dynamic array; SH_OFF is
Triton's own size, rounded up, passed at run time).
bf16 dense rows, N = C x SEG, SEG a multiple of BLOCK, Llama convention (an experiment).
    python benchmarks/norm_fetch_res.py --out DIR      # on an H100/H200
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from norm_fetch import COMMIT, WAIT1, _asm_scalar, _cluster_row, _seg_y  # noqa: E402
from cluster_barrier import share3  # noqa: E402
from onetrip.ops._jit import cast_out  # noqa: E402
from onetrip.ops._norm_jit import _split_combine, _sums_rstd  # noqa: E402
from onetrip.ops._shelf import quad_lane, shelf_fetch, shelf_load, shelf_quads  # noqa: E402

DYN_BASE = tl.constexpr("mov.u32 $0, global_smem;\nadd.u32 $0, $0, $1;")
STS64 = tl.constexpr("st.shared.b64 [$1], $2;\nmov.u32 $0, 0;")


@triton.jit
def _res_kernel(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, eps, SH_OFF, N: tl.constexpr, SEG: tl.constexpr,
                BLOCK: tl.constexpr, C: tl.constexpr, IS_RMS: tl.constexpr):
    pid, row, lo = _cluster_row(C, SEG)
    BLOCK_S: tl.constexpr = 2 if C <= 2 else (4 if C <= 4 else (8 if C <= 8 else 16))
    NCH: tl.constexpr = SEG // BLOCK
    QB: tl.constexpr = BLOCK // 4
    off = row.to(tl.int64) * N + lo
    base = tl.inline_asm_elementwise(DYN_BASE, "=r,r", [SH_OFF], dtype=tl.int32, is_pure=False, pack=1)
    qo = tl.arange(0, QB)
    offs = tl.arange(0, BLOCK)
    xq = (x_ptr + off).to(tl.pointer_type(tl.int64), bitcast=True)
    rq = (r_ptr + off).to(tl.pointer_type(tl.int64), bitcast=True)
    hq = (h_ptr + off).to(tl.pointer_type(tl.int64), bitcast=True)
    for k in tl.static_range(NCH):  # x at base, r at base + 2 SEG
        shelf_fetch(base + 8 * (k * QB + qo), xq + k * QB + qo, 8)
        shelf_fetch(base + 2 * SEG + 8 * (k * QB + qo), rq + k * QB + qo, 8)
    _asm_scalar(pid, COMMIT)
    _asm_scalar(pid, COMMIT)
    after = _asm_scalar(pid, WAIT1).to(tl.float32, bitcast=True)
    c = 0.0
    if not IS_RMS:  # the segment's first h, as rounded
        q0 = shelf_quads(base + tl.zeros([1], tl.int32), after)
        r0 = shelf_quads(base + 2 * SEG + tl.zeros([1], tl.int32), after)
        c = tl.sum(cast_out(quad_lane(q0, 0, x_ptr) + quad_lane(r0, 0, x_ptr), tl.bfloat16).to(tl.float32))
    a1 = tl.zeros([QB], tl.float32)
    a2 = tl.zeros([QB], tl.float32)
    for k in tl.static_range(NCH):
        saddr = base + 8 * (k * QB + qo)
        qx = shelf_quads(saddr, after)
        qr = shelf_quads(base + 2 * SEG + 8 * (k * QB + qo), after)
        packed = tl.zeros([QB], tl.uint64)
        for j in tl.static_range(4):
            hb = cast_out(quad_lane(qx, j, x_ptr) + quad_lane(qr, j, x_ptr), tl.bfloat16)
            packed = packed | (hb.to(tl.uint16, bitcast=True).to(tl.uint64) << (16 * j))
            d = hb.to(tl.float32) - c
            a1 += d
            a2 += d * d
        hv = packed.to(tl.int64, bitcast=True)
        tl.store(hq + k * QB + qo, hv, eviction_policy="evict_first")
        tl.inline_asm_elementwise(STS64, "=r,r,l", [saddr, hv], dtype=tl.int32, is_pure=False, pack=1)  # h over x
    tl.debug_barrier()  # pass 2 reads h as every thread of the CTA stored it
    c0, s1, s2 = _split_combine(share3(c, tl.sum(a1), tl.sum(a2), C), row, N, SEG, C, BLOCK_S, IS_RMS, True)
    mean_lo, rstd = _sums_rstd(s1, s2, N, eps, IS_RMS)
    for k in tl.static_range(NCH):
        h = shelf_load(base + 2 * (k * BLOCK + offs), rstd, x_ptr).to(tl.float32)
        wv = tl.load(w_ptr + lo + k * BLOCK + offs).to(tl.float32)
        bv = 0.0
        if not IS_RMS:
            bv = tl.load(b_ptr + lo + k * BLOCK + offs).to(tl.float32)
        y = _seg_y(h, rstd, c0, mean_lo, wv, bv, y_ptr, IS_RMS)
        tl.store(y_ptr + off + k * BLOCK + offs, cast_out(y, y_ptr.dtype.element_ty), eviction_policy="evict_first")


_OFFSETS: dict = {}  # id(compiled kernel) -> Triton's own shared memory, rounded up (the buffer's offset)


def _launch(kernel, clusters: int, ranks: int, nbytes: int, *args, **meta):
    """Launch as ``clusters`` clusters of ``ranks`` CTAs (1: plain CTAs), each with ``nbytes``
    of dynamic shared memory beyond Triton's own; the kernel's last runtime argument is
    the buffer's offset. The compiled kernel's metadata is patched before its first launch
    (its loader then raises the function's dynamic shared-memory limit past 48 KB)."""
    compiled = kernel.warmup(*args, 0, grid=(clusters * ranks,), **meta)
    key = id(compiled)
    if key not in _OFFSETS:
        if compiled.module is not None:
            raise RuntimeError("the kernel was loaded before its shared memory could be set")
        off = -(-compiled.metadata.shared // 128) * 128
        compiled.metadata = compiled.metadata._replace(shared=off + nbytes)
        warps, _, _ = compiled.packed_metadata
        compiled.packed_metadata = (warps, ranks, off + nbytes)
        _OFFSETS[key] = off
    kernel[(clusters,)](*args, _OFFSETS[key], **meta)
    return compiled


def res_norm(x, r, weight, bias, eps, y, h, c: int, block: int, warps: int):
    """add_rms_norm (bias None) or add_layer_norm of dense bf16 rows: h = x + r, y = norm(h)."""
    M, N = x.shape
    seg = N // c
    if N % c or seg % block or not 2 <= c <= 16:
        raise ValueError(f"N={N} in {c} (2-16, a cluster) segments of whole {block}-wide chunks")
    if x.dtype != torch.bfloat16 or any(t.data_ptr() % 16 for t in (x, r, weight, y, h)):
        raise ValueError("dense, 16-byte aligned bf16 rows")
    args = (x, r, weight, bias if bias is not None else weight, y, h, eps)
    meta = dict(N=N, SEG=seg, BLOCK=block, C=c, IS_RMS=bias is None, num_warps=warps)
    _launch(_res_kernel, M, c, 4 * seg, *args, **meta)
    return y, h


# (rows, width): (c, block, warps)
VARIANTS = {(512, 131072): [(8, 4096, 8), (16, 2048, 8), (16, 4096, 16), (8, 4096, 16)],
            (256, 262144): [(16, 4096, 8), (16, 4096, 16), (16, 8192, 16)],
            (64, 262144): [(16, 4096, 8), (16, 4096, 16)]}


def main() -> int:
    from norm_variants import rows_main
    return rows_main(list(VARIANTS), lambda rows, width, is_rms, w, b, eps: [
        (f"fetch x, r c{c} {block}x{warps}w",
         lambda x, r, y, h, v=(c, block, warps): res_norm(x, r, w, b, eps, y, h, *v))
        for c, block, warps in VARIANTS[(rows, width)]], "norm-fetch-res.json", residual=True)


if __name__ == "__main__":
    raise SystemExit(main())
