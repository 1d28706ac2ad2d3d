"""Experiment: the split-row cluster norm with its weight and bias held in registers over
several rows (issue 2's 128K-256K rows; NOTES.md, nineteenth session).

Why: dropping the weight and bias from the library's picks (``norm_wb.py``, H100) raised
layer_norm 88.2 -> 92.2% of copy at 128K and 80.5 -> 89.9% at 256K, rms_norm 87.9 -> 91.2%
at 256K: in pass 2 every row re-reads its weight (and bias) from L2 beside the row itself,
2 (4) of the ~6-8 bytes an element that L2 sends an SM. Here each program of a row's
cluster loads its segment's weight (and bias) once, as a tuple of chunks in registers, and
normalizes R rows one after the other with them (R = 1: the library's design, the weight
re-read; HELD_WB False: re-read for every row, R only batching rows). Pass 1 reads the
segment's chunks from HBM (the first HOLD kept in registers), the sums go through the
cluster (``_cluster.share3``), pass 2 re-reads the rest from L2.

16-bit dense rows, N = C x SEG, SEG a multiple of BLOCK, Llama convention (an experiment).

    python benchmarks/norm_wbheld.py --out DIR      # on an H100/H200
"""

from __future__ import annotations

import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from onetrip.ops._cluster import launch_clusters  # noqa: E402
from cluster_barrier import cluster_arrive, share3  # noqa: E402
from onetrip.ops._jit import cast_out  # noqa: E402
from onetrip.ops._norm_jit import _split_combine, _sums_rstd  # noqa: E402
from norm_fetch import _seg_y  # noqa: E402
from norm_stream import _opaque  # noqa: E402


@triton.jit
def _wb_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, eps, N: tl.constexpr, SEG: tl.constexpr, BLOCK: tl.constexpr,
               C: tl.constexpr, R: tl.constexpr, IS_RMS: tl.constexpr, HELD_WB: tl.constexpr, HOLD: tl.constexpr):
    pid = tl.program_id(0)
    cluster_arrive(pid)
    BLOCK_S: tl.constexpr = 2 if C <= 2 else (4 if C <= 4 else (8 if C <= 8 else 16))
    NCH: tl.constexpr = SEG // BLOCK
    lo = (pid % C) * SEG
    first = (pid // C) * R
    offs = tl.arange(0, BLOCK)
    ws = ()
    bs = ()
    if HELD_WB:
        for k in tl.static_range(NCH):
            ws = ws + (tl.load(w_ptr + lo + k * BLOCK + offs),)
            if not IS_RMS:
                bs = bs + (tl.load(b_ptr + lo + k * BLOCK + offs),)
    for i in tl.range(0, R):
        row = first + i
        if row < M:  # the same for the whole cluster
            xrow = x_ptr + row.to(tl.int64) * N + lo
            yrow = y_ptr + row.to(tl.int64) * N + lo
            c = 0.0
            if not IS_RMS:
                c = tl.load(xrow).to(tl.float32)
            a1 = tl.zeros([BLOCK], tl.float32)
            a2 = tl.zeros([BLOCK], tl.float32)
            held = ()
            for k in tl.static_range(NCH):
                if k < HOLD:
                    v = tl.load(xrow + k * BLOCK + offs, eviction_policy="evict_first")
                    held = held + (v,)
                else:
                    v = tl.load(xrow + k * BLOCK + offs, eviction_policy="evict_last")
                d = v.to(tl.float32) - c
                a1 += d
                a2 += d * d
            c0, s1, s2 = _split_combine(share3(c, tl.sum(a1), tl.sum(a2), C), row, N, SEG, C, BLOCK_S, IS_RMS, True)
            if i + 1 < R and row + 1 < M:
                cluster_arrive(pid)  # slots read: the siblings may write the next row's
            mean_lo, rstd = _sums_rstd(s1, s2, N, eps, IS_RMS)
            for k in tl.static_range(NCH):
                if k < HOLD:
                    h = held[k].to(tl.float32)
                else:
                    h = tl.load(xrow + k * BLOCK + offs, eviction_policy="evict_first").to(tl.float32)
                if HELD_WB:  # (_opaque: widened here, each row; hoisted, the float32 copies took 128 registers)
                    wv = _opaque(ws[k], True).to(tl.float32)
                else:
                    wv = tl.load(w_ptr + lo + k * BLOCK + offs).to(tl.float32)
                bv = 0.0
                if not IS_RMS:
                    if HELD_WB:
                        bv = _opaque(bs[k], True).to(tl.float32)
                    else:
                        bv = tl.load(b_ptr + lo + k * BLOCK + offs).to(tl.float32)
                y = _seg_y(h, rstd, c0, mean_lo, wv, bv, y_ptr, IS_RMS)
                tl.store(yrow + k * BLOCK + offs, cast_out(y, y_ptr.dtype.element_ty), eviction_policy="evict_first")


def wb_norm(x, weight, bias, eps, y, c: int, block: int, warps: int, r: int, held_wb: bool, hold: int):
    """RMSNorm (bias None) or LayerNorm of dense 16-bit rows x (M, N) into y: clusters of c
    programs a row, each cluster over r rows in turn."""
    M, N = x.shape
    seg = N // c
    if N % c or seg % block or not 2 <= c <= 16:
        raise ValueError(f"N={N} must split into {c} segments of whole {block}-wide chunks")
    is_rms = bias is None
    args = (x, weight, bias if bias is not None else weight, y, M, eps)
    meta = dict(N=N, SEG=seg, BLOCK=block, C=c, R=r, IS_RMS=is_rms, HELD_WB=held_wb, HOLD=hold, num_warps=warps)
    if launch_clusters(_wb_kernel, triton.cdiv(M, r), c, *args, **meta) is None:
        raise RuntimeError("this Triton's launcher takes no cluster size")
    return y


def ptx_report(N: int, c: int, block: int, warps: int, is_rms: bool, r: int, held_wb: bool, hold: int) -> str:
    """Registers and spills at sm_90a (offline: Triton 3.6 + ptxas)."""
    from ptxas_report import bf16_report  # noqa: PLC0415

    return bf16_report(_wb_kernel, dict(N=N, SEG=N // c, BLOCK=block, C=c, R=r, IS_RMS=is_rms, HELD_WB=held_wb,
                                        HOLD=hold), warps)


# (rows, width): [(c, block, warps, r, held_wb, hold)]
VARIANTS = {(512, 131072): [(8, 4096, 16, r, h, hold) for r in (1, 2, 4) for h in (True, False) for hold in (0, 1)],
            (256, 262144): [(16, 4096, 16, r, h, hold) for r in (1, 2, 4) for h in (True, False) for hold in (0, 1)],
            (64, 262144): [(16, 4096, 16, r, h, 1) for r in (1, 2) for h in (True, False)]}


def main() -> int:
    from norm_variants import rows_main
    return rows_main(list(VARIANTS), lambda rows, width, is_rms, w, b, eps: [
        (f"c{c} {block}x{warps}w r{r} {'wb held' if held_wb else 'wb re-read'} hold{hold}",
         lambda x, y, v=(c, block, warps, r, held_wb, hold): wb_norm(x, w, b, eps, y, *v))
        for c, block, warps, r, held_wb, hold in VARIANTS[(rows, width)]], "norm-wbheld.json")


if __name__ == "__main__":
    raise SystemExit(main())
