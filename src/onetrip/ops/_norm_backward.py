"""Backward of the residual-add + RMSNorm / LayerNorm ops (``norm.py``).

    h = x + residual (or x), d = h - mean(h) (RMSNorm: d = h), D = mean(d^2) + eps
    rstd = 1 / sqrt(D), hn = d * rstd, g = dy * w        (Gemma: dy * (1 + w); no weight: dy)
    dh = rstd * (g - mean(g) - hn * mean(g * hn)) + dh_out   (RMSNorm: no mean(g) term)
    dx = dresidual = dh,   dw = sum over rows of dy * hn,   db = sum over rows of dy

Statistics are recomputed in float32 from the saved h (the row is read anyway). Bytes for
M rows of N elements of b bytes: dy, h (and dh_out) read once, dx written once, plus a
(programs, N) float32 partial of dw (and db) that ``_reduce.column_sum`` adds in a fixed
order (no atomics: the same bits run to run).

How rows are covered (``NormBackwardConfig``):
  * whole rows (N <= ``ROW_MAX``): a persistent grid of about 16 warps an SM; a program
    takes a band of rows, ``block_m`` whole rows a step in registers, and accumulates its
    dw / db partials in float32 registers across the band, stored once at the end.
  * wide rows: a statistics launch (a program a row, chunks combined with Chan's formula)
    writes (mean, rstd, mean(g * d) / D, mean(g)) a row, then a grid of (band, column segment)
    programs applies them: dy and h are read twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import pdl_args, sm_count
from ._jit import cast_out, pdl_start
from ._reduce import column_sum

# Whole rows held up to this width, 8 elements a thread (ptxas for sm_90a, bf16, with dh_out,
# dw, db): 8192 at 32 warps 64 registers, no spills; 16384 at 32 warps spills 136-232 bytes.
ROW_MAX = 8192
# Elements a whole-rows step (rows x padded width) and the columns of a wide-row program, at
# 8 warps: 64-103 registers, so two programs share an SM (16 elements a thread: 148-189, one).
_TILE = 2048
_SEGMENT = 2048


@dataclass(frozen=True)
class NormBackwardConfig:
    """Launch shape of the backward. ``wide`` False: ``block_n`` (>= N) is the padded row
    and a step covers ``block_m`` rows; True: ``block_n`` columns is a program's segment
    (``block_m`` rows a step) and a statistics launch runs first. ``warps_per_sm`` sizes
    the persistent grid: sm_count * max(1, warps_per_sm // num_warps) programs (fewer when
    there are fewer row steps)."""

    block_m: int
    block_n: int
    num_warps: int
    wide: bool = False
    warps_per_sm: int = 16

    def __post_init__(self):
        for name in ("block_m", "block_n", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"NormBackwardConfig.{name}={v} must be a power of two >= 1")
        if self.warps_per_sm < 1:
            raise ValueError(f"NormBackwardConfig.warps_per_sm={self.warps_per_sm} must be >= 1")


def backward_config(M: int, N: int, device: torch.device) -> NormBackwardConfig:
    """The launch shape for M rows of N: whole rows up to ``ROW_MAX`` (steps of ``_TILE``
    elements or one row, no more rows than a band has), segments of ``_SEGMENT`` above."""
    block_n = triton.next_power_of_2(max(N, 1))
    if block_n > ROW_MAX:
        return NormBackwardConfig(1, _SEGMENT, 8, wide=True)
    band = triton.next_power_of_2(triton.cdiv(max(M, 1), 2 * sm_count(device)))  # rows a band of ~2 programs an SM
    block_m = max(1, min(_TILE // block_n, band))
    return NormBackwardConfig(block_m, block_n, min(32, max(1, block_m * block_n // 256)))  # 8 elements a thread


@triton.jit
def _stats_kernel(
    dy_ptr, h_ptr, w_ptr,            # dy, h: (M, N) rows; w: (N,)
    stats_ptr,                       # (M, 4) float32: mean, rstd, mean(g * (h - mean)) / var, mean(g)
    N, stride_dym, stride_hm,
    eps,
    IS_RMS: tl.constexpr, GEMMA: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr = 0,           # programmatic dependent launch (_common.pdl_mode says why)
):
    """Wide rows: one program a row walks its chunks. RMSNorm sums h^2 and g * h; LayerNorm
    combines each chunk's mean, M2, sum(g) and co-moment sum(g * (h - mean)) with Chan's
    formula (no cancellation for rows far from zero)."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    n_a = 0.0
    mean = 0.0
    m2 = 0.0  # RMSNorm: sum h^2
    gsum = 0.0
    cgh = 0.0  # LayerNorm: sum g * (h - mean); RMSNorm: sum g * h
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        ok = cols < N
        dy = tl.load(dy_ptr + row * stride_dym + cols, mask=ok, other=0.0).to(tl.float32)
        h = tl.load(h_ptr + row * stride_hm + cols, mask=ok, other=0.0).to(tl.float32)
        g = dy
        if HAS_WEIGHT:
            w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
            if GEMMA:
                w += 1.0
            g = dy * w
        if IS_RMS:
            m2 += tl.sum(h * h)
            cgh += tl.sum(g * h)
        else:
            n_b = tl.minimum(N - start, BLOCK_N).to(tl.float32)
            mean_b = tl.sum(h) / n_b
            d = tl.where(ok, h - mean_b, 0.0)
            g_b = tl.sum(g)
            n = n_a + n_b
            delta = mean_b - mean
            new_mean = mean + delta * (n_b / n)
            m2 += tl.sum(d * d) + delta * delta * (n_a * n_b / n)
            cgh += tl.sum(g * d) + gsum * (mean - new_mean) + g_b * (mean_b - new_mean)
            gsum += g_b
            mean = new_mean
            n_a = n
    var = tl.div_rn(m2, N * 1.0) + eps  # correctly rounded: x / 1 stays x (width-1 rows)
    st = stats_ptr + row * 4
    tl.store(st, mean)
    tl.store(st + 1, tl.rsqrt(var))
    tl.store(st + 2, tl.div_rn(tl.div_rn(cgh, N * 1.0), var))  # mean(g * d) / D (_backward_kernel)
    tl.store(st + 3, tl.div_rn(gsum, N * 1.0))


@triton.jit
def _backward_kernel(
    dy_ptr, h_ptr, dho_ptr, w_ptr,   # dy, h, dh_out: (M, N) rows; w: (N,)
    dx_ptr,                          # (M, N) rows
    pw_ptr, pb_ptr,                  # dw, db partials: (bands, N) float32
    stats_ptr,                       # wide rows: (M, 4) float32 from _stats_kernel
    M, N, band_rows, n_segs,
    stride_dym, stride_hm, stride_dhom, stride_dxm,
    eps,
    IS_RMS: tl.constexpr, GEMMA: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_DH_OUT: tl.constexpr,
    STORE_DX: tl.constexpr, HAS_DW: tl.constexpr, HAS_DB: tl.constexpr,
    WIDE: tl.constexpr,              # statistics read from stats_ptr; else computed from the whole row held
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    """Program (band, segment): rows [band * band_rows, +band_rows) x columns of the segment,
    BLOCK_M rows a step. dx stored rounded once (dh_out added in float32); the dw / db
    partials kept in float32 registers across the band and stored once."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    band = pid // n_segs
    cols = (pid % n_segs) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    col_ok = cols < N
    w = 1.0
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if GEMMA:
            w += 1.0
    acc_w = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    start = band * band_rows
    end = tl.minimum(start + band_rows, M)
    for r0 in range(start, end, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        row_ok = rows < end
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)[:, None]  # rows * stride exceeds 2**31 for tensors over 4 GiB
        dy = tl.load(dy_ptr + rows64 * stride_dym + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        h = tl.load(h_ptr + rows64 * stride_hm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        g = dy
        if HAS_WEIGHT:
            g = dy * w
        # dh = rstd * (g - mean(g) - d * mean(g * d) / D), d = h - mean, D = mean(d^2) + eps: hn * mean(g * hn)
        # with 1 / D for rstd^2, fewer roundings before g and d * (...) cancel (width 1, h in 1e-3..3e-2:
        # mean relative error 5.8e-6, against 9.9e-6 with rstd^2 and PyTorch's 1.1e-5)
        if WIDE:
            st = stats_ptr + rows.to(tl.int64) * 4
            rstd = tl.load(st + 1, mask=row_ok, other=0.0)[:, None]
            c1 = tl.load(st + 2, mask=row_ok, other=0.0)[:, None]
            d = h
            c2 = 0.0
            if not IS_RMS:
                d = tl.where(mask, h - tl.load(st, mask=row_ok, other=0.0)[:, None], 0.0)
                c2 = tl.load(st + 3, mask=row_ok, other=0.0)[:, None]
        else:
            d = h
            c2 = 0.0
            if not IS_RMS:
                # correctly rounded means: on a GPU x / N is an approximate division, and at width 1
                # g - mean(g) must be exactly 0 (LayerNorm's dx there is 0)
                d = tl.where(mask, h - tl.div_rn(tl.sum(h, axis=1), N * 1.0)[:, None], 0.0)
                c2 = tl.div_rn(tl.sum(g, axis=1), N * 1.0)[:, None]
            var = tl.div_rn(tl.sum(d * d, axis=1), N * 1.0)[:, None] + eps  # (BLOCK_M, 1)
            rstd = tl.rsqrt(var)
            c1 = tl.div_rn(tl.sum(g * d, axis=1), N * 1.0)[:, None] / var
        dh = rstd * (g - c2 - d * c1)
        hn = tl.where(mask, d * rstd, 0.0)  # (rows past the band: 0, not 0 * inf at eps = 0)
        if STORE_DX:
            if HAS_DH_OUT:
                dh += tl.load(dho_ptr + rows64 * stride_dhom + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            tl.store(dx_ptr + rows64 * stride_dxm + cols[None, :], cast_out(dh, dx_ptr.dtype.element_ty), mask=mask)
        if HAS_DW:
            acc_w += dy * hn
        if HAS_DB:
            acc_b += dy
    part = band.to(tl.int64) * N + cols
    if HAS_DW:
        tl.store(pw_ptr + part, tl.sum(acc_w, axis=0), mask=col_ok)
    if HAS_DB:
        tl.store(pb_ptr + part, tl.sum(acc_b, axis=0), mask=col_ok)


def launch_backward(dy: torch.Tensor, h: torch.Tensor, dh_out: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                    dx: Optional[torch.Tensor], dweight: Optional[torch.Tensor], dbias: Optional[torch.Tensor],
                    eps: float, is_rms: bool, gemma: bool, config: NormBackwardConfig | None = None) -> None:
    """Write dx (M, N) and dweight, dbias (N,) (each optional) from 2-D row views (unit
    column stride) dy, h, dh_out and the contiguous weight. Two launches (three with a
    dweight or dbias of wide rows); no host synchronisation."""
    M, N = h.shape
    if N == 0:
        return
    if M == 0:
        for t in (dweight, dbias):
            if t is not None:
                t.zero_()
        return
    cfg = config or backward_config(M, N, h.device)
    if not cfg.wide and cfg.block_n < N:
        raise ValueError(f"NormBackwardConfig.block_n={cfg.block_n} holds no whole row of {N}; use wide=True")
    segs = triton.cdiv(N, cfg.block_n) if cfg.wide else 1
    programs = sm_count(h.device) * max(1, cfg.warps_per_sm // cfg.num_warps)
    bands = max(1, min(triton.cdiv(M, cfg.block_m), triton.cdiv(programs, segs)))
    band_rows = triton.cdiv(triton.cdiv(M, bands), cfg.block_m) * cfg.block_m  # whole steps a band
    bands = triton.cdiv(M, band_rows)
    w = weight if weight is not None else h
    pdl = pdl_args(h)
    stats = h
    if cfg.wide:
        stats = torch.empty((M, 4), dtype=torch.float32, device=h.device)
        _stats_kernel[(M,)](dy, h, w, stats, N, dy.stride(0), h.stride(0), eps, IS_RMS=is_rms, GEMMA=gemma,
                            HAS_WEIGHT=weight is not None, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, **pdl)
    pw = torch.empty((bands, N), dtype=torch.float32, device=h.device) if dweight is not None else h
    pb = torch.empty((bands, N), dtype=torch.float32, device=h.device) if dbias is not None else h
    _backward_kernel[(bands * segs,)](
        dy, h, dh_out if dh_out is not None else h, w, dx if dx is not None else h, pw, pb, stats,
        M, N, band_rows, segs,
        dy.stride(0), h.stride(0), dh_out.stride(0) if dh_out is not None else 0,
        dx.stride(0) if dx is not None else 0,
        eps,
        IS_RMS=is_rms, GEMMA=gemma, HAS_WEIGHT=weight is not None, HAS_DH_OUT=dh_out is not None,
        STORE_DX=dx is not None, HAS_DW=dweight is not None, HAS_DB=dbias is not None, WIDE=cfg.wide,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, **pdl)
    if dweight is not None:
        column_sum(pw, dweight.dtype, out=dweight)
    if dbias is not None:
        column_sum(pb, dbias.dtype, out=dbias)


def backward_unfused(dy: torch.Tensor, h: torch.Tensor, dh_out: Optional[torch.Tensor],
                     weight: Optional[torch.Tensor], eps: float, is_rms: bool, gemma: bool):
    """The same math op by op in float32 (the CPU fallback): (dh (M, N), dw (N,), db (N,))
    in float32, dh including dh_out."""
    hf, dyf = h.float(), dy.float()
    d = hf if is_rms else hf - hf.mean(-1, keepdim=True)
    var = d.pow(2).mean(-1, keepdim=True) + eps
    g = dyf
    if weight is not None:
        g = dyf * (weight.float() + 1.0 if gemma else weight.float())
    dh = g - d * ((g * d).mean(-1, keepdim=True) / var)  # as _backward_kernel: 1 / var, not rstd^2
    if not is_rms:
        dh = dh - g.mean(-1, keepdim=True)
    rstd = torch.rsqrt(var)
    dh = dh * rstd
    if dh_out is not None:
        dh = dh + dh_out.float()
    return dh, (dyf * (d * rstd)).sum(0), dyf.sum(0)
