"""Experiment: wide-row RMSNorm / LayerNorm split over a thread-block cluster, the row's
partial sums exchanged through distributed shared memory (Hopper; issue 2's 128K-256K rows,
NOTES.md, eighteenth session).

Why: the library's split rows (``NormConfig.split``) exchange partial sums through global
memory: each program stores its partials, counts in with a GPU-scope atomic and polls the
row's counter until its siblings are in (an L2 round trip a poll). Every program of the grid
reaches that point at about the same time, and the HBM idles while they wait: held segments
(no L2 re-read at all) still lost to the loop on both GPUs, so the exchange, not the bytes,
is the cost. On Hopper the C programs of a row can be one cluster (co-scheduled on one
GPC): thread 0 of each writes its partials into a slot of every sibling's shared memory
(``st.shared::cluster``), one hardware cluster barrier (release / acquire) later every
program sums its C slots from its own shared memory. No atomics, no polling, no L2.

Triton has no cluster API: the kernel is compiled as an ordinary one-CTA program and
launched with a cluster dimension (the launcher's ``num_ctas`` field of the compiled
kernel's packed metadata, which makes Triton's own launcher pass
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION); the exchange is inline PTX (``mapa``,
``st.shared::cluster``, ``barrier.cluster``) over a static shared buffer. CTA k of the
launch is rank k % C of cluster k // C, so row = pid // C, segment = pid % C.

Per row (N = C * SEG, SEG a power of two <= BLOCK * chunks):
    pass 1: each program reads its segment (HELD: in one tile, kept in registers; else in
            chunks of BLOCK), sums (RMS: x^2; LayerNorm: d and d^2, d = x - x[row, 0])
    exchange: the C programs' sums through shared memory, as above
    pass 2: y from the held tile, or the segment re-read (from L2), stored

16-bit inputs, dense rows, no residual, Llama convention (an experiment).

    python benchmarks/norm_cluster.py --out DIR     # on an H100/H200: checks, then times beside the library
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

from onetrip.ops._cluster import MAX_RANKS as SLOTS, launch_clusters  # noqa: E402
from cluster_barrier import cluster_arrive  # noqa: E402


def xch_asm(c: int, n: int) -> str:
    """PTX for the exchange of n float32 sums among the c CTAs of a cluster; operands:
    outputs $0..$n-1 (the cluster's totals), inputs $n..$2n-1 (this CTA's sums). Value j
    of rank r lives at cxbuf[j * SLOTS + r]. The first cluster wait pairs with the arrive
    issued at the kernel's start (``_cluster.cluster_arrive``): every sibling has started,
    so its shared memory may be written."""
    lines = ["{", ".reg .b32 %cxb, %cxr, %cxt, %cxd;", ".reg .pred %cxp;", ".reg .f32 %cxs, %cxv;",
             f".shared .align 16 .f32 cxbuf[{n * SLOTS}];",
             "barrier.cluster.wait.aligned;",
             "mov.u32 %cxb, cxbuf;", "mov.u32 %cxr, %cluster_ctarank;", "mov.u32 %cxt, %tid.x;",
             "setp.eq.u32 %cxp, %cxt, 0;", "shl.b32 %cxr, %cxr, 2;", "add.u32 %cxr, %cxb, %cxr;"]
    for s in range(c):
        lines.append(f"mapa.shared::cluster.u32 %cxd, %cxr, {s};")
        for j in range(n):
            lines.append(f"@%cxp st.shared::cluster.f32 [%cxd+{4 * SLOTS * j}], ${n + j};")
    lines += ["barrier.cluster.arrive.release.aligned;", "barrier.cluster.wait.acquire.aligned;"]
    for j in range(n):
        lines.append(f"ld.shared.f32 %cxs, [cxbuf+{4 * SLOTS * j}];")
        for r in range(1, c):
            lines += [f"ld.shared.f32 %cxv, [cxbuf+{4 * (SLOTS * j + r)}];", "add.f32 %cxs, %cxs, %cxv;"]
        lines.append(f"mov.f32 ${j}, %cxs;")
    lines.append("}")
    return "\n".join(lines)


@triton.jit
def _cluster_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, eps, SEG: tl.constexpr, BLOCK: tl.constexpr,
                         C: tl.constexpr, IS_RMS: tl.constexpr, HELD: tl.constexpr, XCH: tl.constexpr):
    pid = tl.program_id(0)
    cluster_arrive(pid)
    row = pid // C
    lo = (pid % C) * SEG
    x_row = x_ptr + row.to(tl.int64) * N
    y_row = y_ptr + row.to(tl.int64) * N
    offs = tl.arange(0, BLOCK)
    shift = 0.0
    if not IS_RMS:
        shift = tl.load(x_row).to(tl.float32)
    s1 = 0.0
    s2 = 0.0
    if HELD:  # SEG == BLOCK: the segment stays in registers across the exchange
        v = tl.load(x_row + lo + offs, eviction_policy="evict_first")
        w_h = tl.load(w_ptr + lo + offs)  # before the exchange: its L2 round trip overlaps it
        b_h = w_h
        if not IS_RMS:
            b_h = tl.load(b_ptr + lo + offs)
        d = v.to(tl.float32) - shift
        s1 = tl.sum(d)
        s2 = tl.sum(d * d)
    else:
        a1 = tl.zeros([BLOCK], tl.float32)
        a2 = tl.zeros([BLOCK], tl.float32)
        for c0 in tl.range(0, SEG, BLOCK):
            d = tl.load(x_row + lo + c0 + offs, eviction_policy="evict_last").to(tl.float32) - shift
            a1 += d
            a2 += d * d
        s1 = tl.sum(a1)
        s2 = tl.sum(a2)
    if IS_RMS:
        t2 = tl.inline_asm_elementwise(XCH, "=f,f", [s2], dtype=tl.float32, is_pure=False, pack=1)
        mean = 0.0
        rstd = tl.rsqrt(t2 / N + eps)
    else:
        t1, t2 = tl.inline_asm_elementwise(XCH, "=f,=f,f,f", [s1, s2], dtype=(tl.float32, tl.float32),
                                           is_pure=False, pack=1)
        m1 = t1 / N
        mean = shift + m1
        rstd = tl.rsqrt(tl.maximum(t2 / N - m1 * m1, 0.0) + eps)
    for c0 in tl.range(0, SEG, BLOCK):
        if HELD:
            xv = v.to(tl.float32)
            w = w_h.to(tl.float32)
            bv = b_h.to(tl.float32)
        else:
            xv = tl.load(x_row + lo + c0 + offs, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + lo + c0 + offs).to(tl.float32)
            bv = w
            if not IS_RMS:
                bv = tl.load(b_ptr + lo + c0 + offs).to(tl.float32)
        if IS_RMS:
            y = (xv * rstd).to(y_ptr.dtype.element_ty).to(tl.float32) * w
        else:
            y = (xv - mean) * rstd * w + bv
        tl.store(y_row + lo + c0 + offs, y.to(y_ptr.dtype.element_ty), eviction_policy="evict_first")


def cluster_norm(x, weight, bias, eps, out, c: int, block: int, warps: int, held: bool):
    """RMSNorm (bias None) or LayerNorm of dense 16-bit rows x (M, N) into out, each row split
    over a cluster of c programs; N / c a power of two, a multiple of ``block``."""
    M, N = x.shape
    seg = N // c
    if N % c or seg & (seg - 1) or seg % block or (held and seg != block) or not 1 <= c <= SLOTS:
        raise ValueError(f"N={N} must split into {c} power-of-two segments of whole {block}-wide blocks")
    is_rms = bias is None
    args = (x, weight, bias if bias is not None else weight, out, N, eps)
    meta = dict(SEG=seg, BLOCK=block, C=c, IS_RMS=is_rms, HELD=held, XCH=xch_asm(c, 1 if is_rms else 2),
                num_warps=warps)
    if launch_clusters(_cluster_norm_kernel, M, c, *args, **meta) is None:
        raise RuntimeError("this Triton's launcher takes no cluster size")
    return out


VARIANTS = {  # width: (c, block, warps, held)
    131072: [(8, 16384, 16, True), (8, 16384, 32, True), (16, 8192, 8, True), (16, 8192, 16, True),
             (8, 4096, 8, False), (16, 4096, 8, False), (4, 8192, 16, False)],
    262144: [(16, 16384, 16, True), (16, 16384, 32, True), (8, 4096, 8, False), (16, 4096, 8, False),
             (16, 8192, 16, False), (8, 8192, 16, False)],
}


def main() -> int:
    from gemv_chain import chain_setup
    from norm_variants import graph_ms, run_variant

    from onetrip.ops import norm

    args, copy, flush, res = chain_setup()
    dev, dt = torch.device("cuda"), torch.bfloat16
    print(f"copy {copy:.0f} GB/s", flush=True)
    for (rows, width), is_rms in [(s, r) for s in ((512, 131072), (256, 262144), (64, 262144)) for r in (True, False)]:
        name = "rms_norm" if is_rms else "layer_norm"
        copies = max(1, min(4, (256 << 20) // (rows * width * 2)))
        xs = [torch.randn(rows, width, device=dev).mul_(2).add_(0.5).to(dt) for _ in range(copies)]
        w = torch.randn(width, device=dev).to(dt)
        b = None if is_rms else torch.randn(width, device=dev).to(dt)
        sets = [(x, torch.empty_like(x)) for x in xs]
        ref = norm.rms_norm(xs[0], w, 1e-6) if is_rms else norm.layer_norm(xs[0], w, b, 1e-5)
        variants = [("library pick", lambda x, y: norm.rms_norm(x, w, 1e-6, out=y) if is_rms
                     else norm.layer_norm(x, w, b, 1e-5, out=y))]
        for c, block, warps, held in VARIANTS[width]:
            variants.append((f"cluster {c} x {block}{' held' if held else ''}, {warps} warps",
                             lambda x, y, c=c, bl=block, wa=warps, h=held: cluster_norm(
                                 x, w, b, 1e-6 if is_rms else 1e-5, y, c, bl, wa, h)))
        for label, fn in variants:
            run_variant(res, {"op": name, "rows": rows, "width": width, "variant": label}, fn, sets, sets[0][1], ref,
                        2 * rows * width * 2, copy, lambda calls: graph_ms(calls, flush))
        del xs, sets
        torch.cuda.empty_cache()
        (args.out / "norm-cluster.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
