"""Experiment: a few wide rows normalized by two launches over 2-D tiles, the second under
programmatic dependent launch, re-reading its tiles from L2 (issue 2's 64 x 256K anchors;
NOTES.md, twenty-second session).

Why: 64 rows of 256K are 64 rows for 132 SMs. Every one-launch design splits a row over a
cluster of 16 programs that read their segment, wait at the exchange and only then write;
the wave's programs alternate between load-only and store-only and the grid runs in 2.3
waves of 28 clusters (rms_norm 76.5% of copy, where a copy of the same bytes reaches 93%).
Here the whole grid reads before anything waits:

    launch 1 (statistics)  tile (BM rows, BN columns): h = x (+ r, stored as the residual
                           output), per row the shift c (the tile's first h) and the sums
                           s1 = sum(h - c), s2 = sum((h - c)^2)  ->  part (M, NCB, 3) float32
    launch 2 (apply, PDL)  waits for launch 1, combines the row's NCB partials in a fixed
                           order (deterministic: no atomics), re-reads its tile of h, writes y

x of 64 x 256K bf16 is 32 MiB against the H100's 50 MB L2, so launch 2 should find its
tiles there (launch 1 reads with ``evict_last``, launch 2 with ``evict_first``); HBM then
sees each byte once, as in a copy, with one kernel boundary (~1-1.5 us under PDL) in place
of the phase turns. Launch 1 lets the dependent grid be placed at its start; launch 2
loads its weight (and bias) chunk before the wait. With a residual, launch 2 reads h, the
residual output launch 1 wrote (each tile shifts by its own first value, so h written over
r or x never feeds another tile's statistics).

bf16 rows of unit column stride, Llama convention; under the interpreter the two launches
run one after the other (no PDL).
    python benchmarks/norm_tiles.py --out DIR      # on an H100/H200

Outcome on an H100 (NOTES.md, twenty-second session): lost everywhere, rms_norm 64 x 256K
61.7% at best against the pick's 76-77%. Nsight Compute: the L2 kept only a quarter of
the 33.5 MB x across the boundary (at 16.8 MB it kept most), and each launch alone was
slow (a one-wave grid with one 16 KB chunk a program in flight).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from onetrip.ops._common import hopper_or_newer  # noqa: E402
from onetrip.ops._jit import cast_out, gdc_launch_dependents, gdc_wait  # noqa: E402
from onetrip.ops._norm_chunk import _load_h, _load_wb, _store_y  # noqa: E402
from onetrip.ops._norm_jit import _sums_rstd  # noqa: E402


@triton.jit
def _tile_rows(M, NCB, BM: tl.constexpr):
    """This program's (row block, column block) and its rows; column blocks vary fastest."""
    pid = tl.program_id(0)
    rows = (pid // NCB) * BM + tl.arange(0, BM)
    return pid % NCB, rows, rows < M


@triton.jit
def _stats_kernel(x_ptr, r_ptr, h_ptr, part_ptr, M, N, sx, sr, sh, NCB,
                  BM: tl.constexpr, BN: tl.constexpr, BC: tl.constexpr, IS_RMS: tl.constexpr,
                  HAS_RESIDUAL: tl.constexpr, PDL: tl.constexpr, EVICT: tl.constexpr, EVICT_H: tl.constexpr):
    """part[row, cb] = (c, s1, s2) of the tile's h (rounded to its dtype with a residual)."""
    if PDL:
        gdc_launch_dependents()  # the apply grid may be placed now: it waits for all of this one
    cb, rows, row_ok = _tile_rows(M, NCB, BM)
    col0 = cb * BN
    c = tl.zeros((BM, 1), tl.float32)
    if not IS_RMS:  # the tile's first h: |h - c| stays of the order of the row's spread
        first = col0 + tl.arange(0, 1)
        c = _load_h(x_ptr, r_ptr, h_ptr, rows, first, row_ok[:, None], sx, sr, sh, HAS_RESIDUAL, False)
        if HAS_RESIDUAL:
            c = cast_out(c, h_ptr.dtype.element_ty).to(tl.float32)
            tl.debug_barrier()  # h may be stored over r: every thread's load of c comes first
    s1 = tl.zeros((BM, 1), tl.float32)
    s2 = tl.zeros((BM, 1), tl.float32)
    for i in range(0, BN, BC):  # a loop, not unrolled: the chunks' loads are not all hoisted
        cols = col0 + i + tl.arange(0, BC)
        mask = row_ok[:, None] & (cols < N)[None, :]
        h = _load_h(x_ptr, r_ptr, h_ptr, rows, cols, mask, sx, sr, sh, HAS_RESIDUAL, True, EVICT, EVICT_H)
        if HAS_RESIDUAL:  # the statistics of h as stored (the unfused add rounds it)
            h = cast_out(h, h_ptr.dtype.element_ty).to(tl.float32)
        d = tl.where(mask, h - c, 0.0)
        s1 += tl.sum(d, axis=1, keep_dims=True)
        s2 += tl.sum(d * d, axis=1, keep_dims=True)
    pp = part_ptr + (rows.to(tl.int64) * NCB + cb) * 3
    tl.store(pp, tl.sum(c, axis=1), mask=row_ok)
    tl.store(pp + 1, tl.sum(s1, axis=1), mask=row_ok)
    tl.store(pp + 2, tl.sum(s2, axis=1), mask=row_ok)


@triton.jit
def _combine(part_ptr, rows, row_ok, N, NCB, BN: tl.constexpr, BS: tl.constexpr, IS_RMS: tl.constexpr):
    """(c0, S1, S2) of each row, (BM, 1) columns: its NCB tiles' sums moved to the first tile's
    shift (``_norm_jit._split_combine``'s formula, over a block of rows)."""
    j = tl.arange(0, BS)
    ok = row_ok[:, None] & (j < NCB)[None, :]
    pp = part_ptr + (rows.to(tl.int64)[:, None] * NCB + j[None, :]) * 3
    s2 = tl.load(pp + 2, mask=ok, other=0.0)
    if IS_RMS:
        zero = tl.zeros((rows.shape[0], 1), tl.float32)
        return zero, zero, tl.sum(s2, axis=1, keep_dims=True)
    cj = tl.load(pp, mask=ok, other=0.0)
    s1 = tl.load(pp + 1, mask=ok, other=0.0)
    nj = tl.minimum(tl.maximum(N - j * BN, 0), BN).to(tl.float32)[None, :]
    c0 = tl.sum(tl.where(j[None, :] == 0, cj, 0.0), axis=1, keep_dims=True)
    dc = tl.where(ok, cj - c0, 0.0)
    return c0, tl.sum(s1 + nj * dc, axis=1, keep_dims=True), tl.sum(s2 + dc * (2.0 * s1 + nj * dc), axis=1,
                                                                     keep_dims=True)


@triton.jit
def _apply_kernel(h_ptr, w_ptr, b_ptr, y_ptr, part_ptr, M, N, sh, sy, NCB, eps,
                  BM: tl.constexpr, BN: tl.constexpr, BC: tl.constexpr, BS: tl.constexpr, IS_RMS: tl.constexpr,
                  PDL: tl.constexpr, EVICT: tl.constexpr, EVICT_Y: tl.constexpr, FOLD: tl.constexpr):
    """y of the tile from the row's combined statistics and h re-read (from L2, if it held)."""
    cb, rows, row_ok = _tile_rows(M, NCB, BM)
    col0 = cb * BN
    cols = col0 + tl.arange(0, BC)
    w, b = _load_wb(w_ptr, b_ptr, cols, cols < N, True, not IS_RMS)  # nothing launch 1 writes
    if PDL:
        gdc_wait()
    c0, s1, s2 = _combine(part_ptr, rows, row_ok, N, NCB, BN, BS, IS_RMS)
    mean_lo, rstd = _sums_rstd(s1, s2, N, eps, IS_RMS)
    for i in range(0, BN, BC):
        cols = col0 + i + tl.arange(0, BC)
        col_ok = cols < N
        mask = row_ok[:, None] & col_ok[None, :]
        if i > 0:
            w, b = _load_wb(w_ptr, b_ptr, cols, col_ok, True, not IS_RMS)
        h = tl.load(h_ptr + rows.to(tl.int64)[:, None] * sh + cols[None, :], mask=mask, other=0.0,
                    eviction_policy=EVICT).to(tl.float32)
        _store_y(y_ptr, h, c0, rstd, w, b, rows, cols, mask, sy, IS_RMS, False, True, not IS_RMS, mean_lo,
                 True, EVICT_Y, FOLD)


def tiles_norm(x, r, w, b, eps, y, h, bm: int, bn: int, bc: int, warps: int, pdl: bool = True,
               hints: bool = True, fold: bool = False, part: torch.Tensor | None = None):
    """y = norm(x + r) (RMSNorm without a bias ``b``, LayerNorm with one) of (M, N) bf16 rows in
    two launches over (bm, bn) tiles in chunks of bc columns; h (with r): x + r, written.
    ``part``: (M, cdiv(N, bn), 3) float32 scratch (allocated when None)."""
    M, N = x.shape
    if bn % bc or bc & (bc - 1) or bm & (bm - 1):
        raise ValueError(f"bc ({bc}) and bm ({bm}) must be powers of two and bc must divide bn ({bn})")
    ncb = triton.cdiv(N, bn)
    if part is None:
        part = torch.empty((M, ncb, 3), device=x.device, dtype=torch.float32)
    is_rms = b is None
    pdl = pdl and hopper_or_newer(x)
    grid = (triton.cdiv(M, bm) * ncb,)
    src = h if r is not None else x
    _stats_kernel[grid](x, r if r is not None else x, src, part, M, N, x.stride(0),
                        r.stride(0) if r is not None else 0, src.stride(0), ncb, BM=bm, BN=bn, BC=bc,
                        IS_RMS=is_rms, HAS_RESIDUAL=r is not None, PDL=pdl,
                        # what launch 2 re-reads stays (x, or h with a residual); x and r then go
                        EVICT=("evict_first" if r is not None else "evict_last") if hints else "",
                        EVICT_H="evict_last" if hints else "",
                        num_warps=warps)
    _apply_kernel[grid](src, w, b if b is not None else w, y, part, M, N, src.stride(0), y.stride(0), ncb, eps,
                        BM=bm, BN=bn, BC=bc, BS=triton.next_power_of_2(ncb), IS_RMS=is_rms, PDL=pdl,
                        EVICT="evict_first" if hints else "", EVICT_Y="", FOLD=fold, num_warps=warps,
                        **({"launch_pdl": True} if pdl else {}))
    return y


def ptx_report(N: int, bm: int, bn: int, bc: int, warps: int, is_rms: bool, residual: bool) -> str:
    """sm_90a registers and spills of both kernels (``ptxas_report.bf16_report``)."""
    from ptxas_report import bf16_report  # noqa: PLC0415
    ncb = triton.cdiv(N, bn)
    common = dict(BM=bm, BN=bn, BC=bc, IS_RMS=is_rms, PDL=True)
    return "\n".join([
        bf16_report(_stats_kernel, dict(common, HAS_RESIDUAL=residual, EVICT="evict_last", EVICT_H="evict_last"),
                    warps, {"part_ptr": "*fp32"}),
        bf16_report(_apply_kernel, dict(common, BS=triton.next_power_of_2(ncb), EVICT="evict_first", EVICT_Y="",
                                        FOLD=False), warps, {"part_ptr": "*fp32"})])


# (rows, width): (bm, bn, bc, warps[, pdl, hints]); sm_90a registers of (stats, apply), rms_norm:
# 4x8192/1024 8 warps 40 / 56 (layer_norm 48 / 73; with a residual 64-80 / 56-73), 8x4096/1024
# 71 / 109, no spills
VARIANTS = {(64, 262144): [(4, 8192, 1024, 8), (4, 8192, 2048, 8), (8, 4096, 1024, 8), (2, 16384, 2048, 8),
                           (4, 4096, 1024, 8), (4, 8192, 1024, 4), (4, 8192, 2048, 8, False),
                           (4, 8192, 2048, 8, True, False)]}


def _variants(rows, width, is_rms, w, b, eps, residual=False):
    out = []
    for v in VARIANTS[(rows, width)]:
        bm, bn, bc, warps = v[:4]
        pdl, hints = (v[4] if len(v) > 4 else True), (v[5] if len(v) > 5 else True)
        label = f"tiles {bm}x{bn}/{bc} {warps}w{'' if pdl else ' no-pdl'}{'' if hints else ' no-hints'}"
        p = torch.empty((rows, triton.cdiv(width, bn), 3), device="cuda", dtype=torch.float32)
        if residual:
            fn = (lambda x, r, y, h, v=v, pdl=pdl, hints=hints, p=p:
                  tiles_norm(x, r, w, b, eps, y, h, *v[:4], pdl=pdl, hints=hints, part=p))
        else:
            fn = (lambda x, y, v=v, pdl=pdl, hints=hints, p=p:
                  tiles_norm(x, None, w, b, eps, y, None, *v[:4], pdl=pdl, hints=hints, part=p))
        out.append((label, fn))
    return out


def main() -> int:
    from norm_variants import rows_main  # noqa: PLC0415
    residual = "--residual" in sys.argv
    if residual:
        sys.argv.remove("--residual")
    return rows_main(list(VARIANTS), lambda *a: _variants(*a, residual=residual),
                     "norm-tiles-res.json" if residual else "norm-tiles.json", residual=residual)


if __name__ == "__main__":
    raise SystemExit(main())
