"""Experiment: persistent "streaming" norms. Each row is split over a cluster of C programs
(C = 1: a program a row) that hold their segment in registers, and every cluster walks rows
with the next row's loads issued before this row's statistics, exchange and stores
(issue 2's 64K-256K rows and 64 x 256K, NOTES.md, nineteenth session).

Why: the library's loop reads a wide row twice (pass 2 from L2) and its split programs are
one row each, so an SM's loads stop while its programs exchange sums and store: between a
row's last load and the next program's first, nothing of the SM's is in flight. Held
segments (one read of each byte) lost in the eighteenth session's prototype because they
had no next row to load meanwhile (one row a program). Here a program holds two rows' worth
of its segment (this one, and the next one in flight), loads its weight (and bias) once for
all its rows, and never re-reads. With a residual it stores h = x + r as soon as it is
summed.

Per row (SEG = N / C columns a program, a power of two; C programs one cluster):
    next row's segment (and shift) loaded into registers        (PREFETCH)
    this row's sums: RMS sum(h^2); LayerNorm sum(d), sum(d^2), d = h - h[row, lo]
    exchange (C > 1: _cluster.share3, then an arrive so the slots are free again)
    y from the registers, stored

16-bit inputs, dense rows, Llama convention (an experiment).

    python benchmarks/norm_stream.py --out DIR      # on an H100/H200: checks, then times beside the library
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from onetrip.ops._common import is_interpreting  # noqa: E402
from onetrip.ops._cluster import launch_clusters  # noqa: E402
from cluster_barrier import cluster_arrive, share3  # noqa: E402
from onetrip.ops._jit import cast_out  # noqa: E402
from onetrip.ops._norm_jit import _split_combine  # noqa: E402


@triton.jit
def _seg_load(x_ptr, r_ptr, row, M, N: tl.constexpr, lo, cols, ok, HAS_RESIDUAL: tl.constexpr):
    """Row ``row``'s segment (SEG,) in x's dtype (with a residual h = x + r, rounded to it)
    and its shift h[row, lo] (float32); zeros past the last row."""
    inside = row < M
    seg_ok = ok & ((cols * 0 + row) < M)  # (the interpreter takes no scalar mask broadcast into a block)
    base = row.to(tl.int64) * N
    v = tl.load(x_ptr + base + cols, mask=seg_ok, other=0.0, eviction_policy="evict_first")
    c = tl.load(x_ptr + base + lo, mask=inside & (lo < N), other=0.0)
    if HAS_RESIDUAL:
        v = cast_out(v.to(tl.float32) + tl.load(r_ptr + base + cols, mask=seg_ok, other=0.0,
                                                 eviction_policy="evict_first").to(tl.float32),
                     x_ptr.dtype.element_ty)
        c = cast_out(c.to(tl.float32) + tl.load(r_ptr + base + lo, mask=inside & (lo < N), other=0.0).to(tl.float32),
                     x_ptr.dtype.element_ty)
    return v, c.to(tl.float32)


@triton.jit
def _opaque(v, ASM: tl.constexpr):
    """v (16-bit), through an identity the compiler cannot see through or move (ASM: not
    under the interpreter, which runs no inline assembly)."""
    if not ASM:
        return v
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [v], dtype=v.dtype, is_pure=False, pack=2)


@triton.jit
def _stream_kernel(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, M, eps, N: tl.constexpr, SEG: tl.constexpr,
                   C: tl.constexpr, IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PREFETCH: tl.constexpr,
                   ASM: tl.constexpr = True):
    pid = tl.program_id(0)
    if C > 1:
        cluster_arrive(pid)
    G = tl.num_programs(0) // C  # clusters; cluster g walks rows g, g + G, ...
    BLOCK_S: tl.constexpr = 2 if C <= 2 else (4 if C <= 4 else (8 if C <= 8 else 16))
    rank = pid % C
    lo = rank * SEG
    cols = lo + tl.arange(0, SEG)
    ok = cols < N
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)  # held for every row
    b = w
    if not IS_RMS:
        b = tl.load(b_ptr + cols, mask=ok, other=0.0)
    first = pid // C
    v, c = _seg_load(x_ptr, r_ptr, first, M, N, lo, cols, ok, HAS_RESIDUAL)
    for i in tl.range(0, tl.cdiv(M - first, G)):
        row = first + i * G  # (a tensor, also under the interpreter, whose loop indices are ints)
        nxt = row + G
        if PREFETCH:
            vn, cn = _seg_load(x_ptr, r_ptr, nxt, M, N, lo, cols, ok, HAS_RESIDUAL)
        base = row.to(tl.int64) * N
        if HAS_RESIDUAL:
            tl.store(h_ptr + base + cols, v, mask=ok, eviction_policy="evict_first")
        hf = v.to(tl.float32)
        if IS_RMS:
            s1 = 0.0
            s2 = tl.sum(hf * hf)
        else:
            d = tl.where(ok, hf - c, 0.0)
            s1 = tl.sum(d)
            s2 = tl.sum(d * d)
        c0 = c
        if C > 1:
            c0, s1, s2 = _split_combine(share3(c, s1, s2, C), row, N, SEG, C, BLOCK_S, IS_RMS, True)
            if nxt < M:
                cluster_arrive(pid)  # this CTA has read its slots: siblings may write the next row's
        # y widens the held segment, weight and bias again after the exchange (``_opaque``
        # keeps the compiler from reusing the sums' widened copy or hoisting the weight's out
        # of the loop): float32 copies live across the exchange took 2-3 x 32 registers a
        # thread more and LayerNorm to 128-191 registers (ptxas, sm_90a).
        hy = _opaque(v, ASM).to(tl.float32)
        wf = _opaque(w, ASM).to(tl.float32)
        if IS_RMS:
            y = cast_out(hy * tl.rsqrt(s2 / N + eps), y_ptr.dtype.element_ty).to(tl.float32) * wf
        else:
            mean_lo = s1 / N
            rstd = tl.rsqrt(tl.maximum(s2 / N - mean_lo * mean_lo, 0.0) + eps)
            y = ((hy - c0) - mean_lo) * rstd * wf + _opaque(b, ASM).to(tl.float32)
        tl.store(y_ptr + base + cols, cast_out(y, y_ptr.dtype.element_ty), mask=ok, eviction_policy="evict_first")
        if PREFETCH:
            v = vn
            c = cn
        else:
            v, c = _seg_load(x_ptr, r_ptr, nxt, M, N, lo, cols, ok, HAS_RESIDUAL)


def stream_norm(x, res, weight, bias, eps, y, h, c: int, warps: int, clusters: int, prefetch: bool = True):
    """RMSNorm (bias None) or LayerNorm of dense 16-bit rows x (+ res) (M, N) into y (and h),
    each row over c programs (one cluster), ``clusters`` clusters walking the rows."""
    M, N = x.shape
    seg = triton.next_power_of_2(triton.cdiv(N, c))
    is_rms = bias is None
    args = (x, res if res is not None else x, weight, bias if bias is not None else weight, y,
            h if h is not None else y, M, eps)
    meta = dict(N=N, SEG=seg, C=c, IS_RMS=is_rms, HAS_RESIDUAL=res is not None, PREFETCH=prefetch,
                ASM=not is_interpreting(), num_warps=warps)
    if c == 1:
        _stream_kernel[(clusters,)](*args, **meta)
    elif launch_clusters(_stream_kernel, clusters, c, *args, **meta) is None:
        raise RuntimeError("this Triton's launcher takes no cluster size")
    return y


def ptx_report(N: int, c: int, warps: int, is_rms: bool, residual: bool, prefetch: bool = True) -> str:
    """Registers and spills at sm_90a (offline: Triton 3.6 + ptxas)."""
    from ptxas_report import bf16_report  # noqa: PLC0415

    return bf16_report(_stream_kernel, dict(N=N, SEG=triton.next_power_of_2(triton.cdiv(N, c)), C=c, IS_RMS=is_rms,
                                            HAS_RESIDUAL=residual, PREFETCH=prefetch, ASM=True), warps)


# (rows, width): [(c, warps)]; clusters: a few around SMs // c, and one a row (no prefetch)
SHAPES = {(4096, 4096): [(1, 4), (1, 8), (2, 4)],
          (1024, 65536): [(4, 16), (4, 32), (8, 8), (8, 16)],
          (512, 131072): [(8, 16), (8, 32), (16, 8), (16, 16)],
          (256, 262144): [(16, 16), (16, 32)],
          (64, 262144): [(16, 16), (16, 32)]}


def main() -> int:
    from gemv_chain import chain_setup
    from norm_variants import graph_ms, run_variant

    from onetrip.ops import norm

    args, copy, flush, res = chain_setup()
    dev, dt = torch.device("cuda"), torch.bfloat16
    sms = res["meta"]["sms"]
    print(f"copy {copy:.0f} GB/s, {sms} SMs", flush=True)
    for (rows, width), kind in [(s, k) for s in SHAPES for k in ("rms", "layer", "add_rms", "add_layer")]:
        is_rms, residual = kind.endswith("rms"), kind.startswith("add")
        if residual and width < 262144:
            continue
        copies = max(1, min(4, (256 << 20) // (rows * width * 2 * (2 if residual else 1))))
        xs = [torch.randn(rows, width, device=dev).mul_(2).add_(0.5).to(dt) for _ in range(copies)]
        sets = [(x, torch.randn_like(x) if residual else None, torch.empty_like(x),
                 torch.empty_like(x) if residual else None) for x in xs]  # (x, r, y, h)
        w = torch.randn(width, device=dev).to(dt)
        b = None if is_rms else torch.randn(width, device=dev).to(dt)
        eps = 1e-6 if is_rms else 1e-5
        ref = (norm.add_rms_norm(xs[0], sets[0][1], w, eps)[0] if is_rms else
               norm.add_layer_norm(xs[0], sets[0][1], w, b, eps)[0])

        def lib(x, r, y, h):
            if is_rms:
                return norm.add_rms_norm(x, r, w, eps, out=y, residual_out=h) if residual else \
                    norm.rms_norm(x, w, eps, out=y)
            return norm.add_layer_norm(x, r, w, b, eps, out=y, residual_out=h) if residual else \
                norm.layer_norm(x, w, b, eps, out=y)
        variants = [("library pick", lib)]
        for c, warps in SHAPES[(rows, width)]:
            full = sms // c  # clusters, one CTA an SM (if the GPCs place them all)
            for g in ([full, 2 * full, 4 * full] if c <= 2 else [full - 1, full, 2 * full]):
                variants.append((f"stream c{c} {warps}w {g} clusters", lambda x, r, y, h, c=c, wa=warps, g=g:
                                 stream_norm(x, r, w, b, eps, y, h, c, wa, g)))
            variants.append((f"held c{c} {warps}w one row a cluster", lambda x, r, y, h, c=c, wa=warps:
                             stream_norm(x, r, w, b, eps, y, h, c, wa, rows, prefetch=False)))
        for label, fn in variants:
            run_variant(res, {"op": kind, "rows": rows, "width": width, "variant": label}, fn, sets, sets[0][2], ref,
                        (4 if residual else 2) * rows * width * 2, copy, lambda calls: graph_ms(calls, flush))
        del xs, sets
        torch.cuda.empty_cache()
        (args.out / "norm-stream.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
