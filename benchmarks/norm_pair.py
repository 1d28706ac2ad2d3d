"""Experiment: two rows a program in the split-row cluster RMSNorm, so that each chunk of
the weight is loaded once for both (issue 2's 256K rows; NOTES.md, twenty-second session).

Why: the library's rms_norm 256K pick (a row over a cluster of 16 programs, pass 2 reading
the segment again from L2) has its SMs read 2.6x a copy's bytes from L2, a third of them
the weight, once for every row; without the weight it reads 91.2% of copy against 87.9%
(norm_wb). The L1 does not keep it (5-9% hits in every kernel tried). Here a cluster of
SPLIT programs takes R rows (R = 1 or 2): program ``seg`` sums its segment of each row in
pass 1 (the R rows' chunks loaded together), the cluster exchanges the R sums in one
``share3`` (RMSNorm needs one value a row: three slots hold two rows), and pass 2 loads
each weight chunk once and writes R rows from it. R = 1 is the same kernel without the
sharing: the A/B that isolates it.

bf16 dense rows of a constant width cut into SPLIT segments of whole chunks; Llama
convention (y = cast(x * rstd) * w); no residual; a Hopper GPU (clusters).
    python benchmarks/norm_pair.py --out DIR      # on an H100
"""

from __future__ import annotations

import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from norm_fetch import _cluster_row  # noqa: E402
from onetrip.ops._cluster import launch_clusters, smem_load  # noqa: E402
from cluster_barrier import share3  # noqa: E402
from onetrip.ops._jit import cast_out  # noqa: E402


@triton.jit
def _pair_kernel(x_ptr, w_ptr, y_ptr, eps, N: tl.constexpr, SEG: tl.constexpr, SPLIT: tl.constexpr,
                 R: tl.constexpr, BLOCK_N: tl.constexpr):
    _, cluster, col0 = _cluster_row(SPLIT, SEG)
    r = tl.arange(0, R)
    rows = cluster * R + r  # (R,)
    x_row = x_ptr + rows.to(tl.int64)[:, None] * N + col0  # (R, 1)
    y_row = y_ptr + rows.to(tl.int64)[:, None] * N + col0
    v2 = tl.zeros((R, BLOCK_N), tl.float32)
    for i in tl.range(0, SEG, BLOCK_N):  # pass 1: kept in L2 for pass 2
        x = tl.load(x_row + (i + tl.arange(0, BLOCK_N))[None, :], eviction_policy="evict_last").to(tl.float32)
        v2 += x * x
    s2 = tl.sum(v2, axis=1)  # (R,)
    addr = share3(tl.sum(tl.where(r == 0, s2, 0.0)), tl.sum(tl.where(r == R - 1, s2, 0.0)), 0.0, SPLIT)
    ranks = tl.arange(0, SPLIT)
    rstd0 = tl.rsqrt(tl.sum(smem_load(addr + 4 * ranks)) / N + eps)
    rstd1 = tl.rsqrt(tl.sum(smem_load(addr + 64 + 4 * ranks)) / N + eps)
    rstd = tl.where(r == 0, rstd0, rstd1)[:, None]  # (R, 1)
    for i in tl.range(0, SEG, BLOCK_N):  # pass 2: each weight chunk once for the R rows
        cols = i + tl.arange(0, BLOCK_N)
        w = tl.load(w_ptr + col0 + cols).to(tl.float32)
        x = tl.load(x_row + cols[None, :], eviction_policy="evict_first").to(tl.float32)
        y = cast_out(x * rstd, y_ptr.dtype.element_ty).to(tl.float32) * w[None, :]
        tl.store(y_row + cols[None, :], cast_out(y, y_ptr.dtype.element_ty), eviction_policy="evict_first")


def pair_rms_norm(x, w, eps, y, rows_a_program: int, split: int = 16, block_n: int = 4096, warps: int = 16):
    """y = RMSNorm(x) * w of (M, N) bf16 rows, ``rows_a_program`` (1 or 2) rows a cluster of ``split``."""
    M, N = x.shape
    seg = N // split
    if (rows_a_program not in (1, 2) or M % rows_a_program or N % split or seg % block_n
            or x.stride(0) != N or y.stride(0) != N):
        raise ValueError(f"rows_a_program={rows_a_program} must be 1 or 2 and divide the {M} rows; {N} columns must "
                         f"cut into {split} segments of whole {block_n}-column chunks; dense rows")
    if launch_clusters(_pair_kernel, M // rows_a_program, split, x, w, y, eps, N=N, SEG=seg, SPLIT=split,
                       R=rows_a_program, BLOCK_N=block_n, num_warps=warps) is None:
        raise RuntimeError("this Triton's kernels carry no cluster launch metadata")
    return y


def ptx_report(N: int, split: int, r: int, block_n: int, warps: int) -> str:
    """sm_90a registers and spills (``ptxas_report.bf16_report``)."""
    from ptxas_report import bf16_report  # noqa: PLC0415
    return bf16_report(_pair_kernel, dict(N=N, SEG=N // split, SPLIT=split, R=r, BLOCK_N=block_n), warps)


# (rows, width): (rows a program, split, block_n, warps)
VARIANTS = {(256, 262144): [(1, 16, 4096, 16), (2, 16, 4096, 16), (2, 16, 2048, 16), (2, 16, 4096, 8),
                            (1, 16, 4096, 8)],
            (64, 262144): [(1, 16, 4096, 16), (2, 16, 4096, 16), (2, 16, 2048, 16)],
            (512, 131072): [(1, 8, 4096, 16), (2, 8, 4096, 16), (2, 8, 2048, 16)]}


def _variants(rows, width, is_rms, w, b, eps):
    if not is_rms:
        return []
    return [(f"pair R{v[0]} split {v[1]} {v[2]}x{v[3]}w", lambda x, y, v=v: pair_rms_norm(x, w, eps, y, *v))
            for v in VARIANTS[(rows, width)]]


def main() -> int:
    from norm_variants import rows_main  # noqa: PLC0415
    return rows_main(list(VARIANTS), _variants, "norm-pair.json")


if __name__ == "__main__":
    raise SystemExit(main())
