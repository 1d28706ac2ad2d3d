"""Thread-block clusters from Triton (Hopper): a few partial sums shared among the CTAs of a
cluster through distributed shared memory, and the launch that makes a grid of clusters.

Why: a row split over SPLIT programs (norm's ``split``) needs each program's partial sums
before any can normalize. Through global memory that is a store, a GPU-scope atomic and a
poll of a counter until the siblings are in: L2 round trips while the HBM idles, and every
program of the grid reaches that point at about the same time. Launched as a cluster, the
SPLIT programs are co-scheduled on one GPC and send their sums straight into each other's
shared memory. On an H100 (ops bench, bf16, % of copy; NOTES.md, eighteenth session), with
thread 0 of each writing every sibling's slot (``st.shared::cluster``) and a cluster barrier
after: rms_norm 256 x 256K 84.3 -> 88%, 64 x 256K 72.6 -> 77%, 512 x 128K 89.0 -> 93%;
layer_norm 75.0 -> 81%, 67.5 -> 70%, 84.8 -> 89%; add_layer_norm 85.0 -> 87%, 82.5 -> 87%,
89.6 -> 91%.

That barrier's ``arrive.release`` compiles to ``MEMBAR.ALL.GPU``: every thread of the 16 CTAs
waits until its memory operations are visible GPU-wide, holding no bytes in flight. Now
thread r < SPLIT of each CTA sends its sums to rank r by ``st.async``, whose bytes complete
rank r's mbarrier (armed for 12 bytes a rank at the kernel's start), and each CTA waits on
its own mbarrier: no fence, no second barrier. Thirtieth session (tune_ops, two interleaved
rounds of the H100 picks, % of copy): rms_norm 256 x 256K 87.6-87.9 -> 94.1-94.2, 64 x
256K 76.0-76.3 -> 82.1-82.5, 512 x 128K 92.2-92.3 -> 96.2-96.3; layer_norm 84.2-84.5 ->
91.0, 70.2-70.5 -> 78.3-79.0, 90.9-91.0 -> 94.0-94.2; add_rms_norm 128K 95.7-95.8 ->
97.6-97.7; add_layer_norm 128K 93.5-93.6 -> 96.6-96.7.

Triton (3.6) has no cluster API, so:
  * the exchange is inline PTX over a static shared buffer (an mbarrier, then 48 floats: 3
    values x 16 ranks), declared by ``cluster_arrive``, whose address ``share3`` takes and
    hands back so that later loads (``smem_load``) can read the values;
  * the kernel is compiled as usual, and its compiled form launched with a cluster
    dimension: ``launch_clusters`` sets the ``num_ctas`` field of the compiled kernel's
    packed launch metadata, from which Triton's launcher passes
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION (it also multiplies the grid by it). CTA k of
    the launch is then rank k % SPLIT of cluster k // SPLIT.
A kernel built with the exchange but launched without the matching cluster size traps
(``share3`` checks ``%cluster_nctarank``): a loud error, never a row normalized by a part
of its sums. ``cluster_arrive`` must run at the kernel's start: ``share3``'s cluster wait
pairs with its arrive, so no CTA writes into a sibling whose mbarrier is not yet armed. The
mbarrier has one phase: one exchange a CTA (a kernel that exchanged again, row after row,
would need a phase bit and re-arming; ``benchmarks/cluster_barrier.py`` keeps the barrier
form for the persistent experiments).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import is_interpreting

MAX_RANKS = 16  # cluster sizes 2-8 are portable; 16 is allowed on H100 / H200 (Triton's launcher opts in)
XBUF_VALUES = 16  # the exchange buffer: the mbarrier (8 bytes), padding, then the values (3 x 16 floats)


def _arm_asm() -> str:
    """PTX: output $0 (the exchange buffer's shared address); input $1 unused. Thread 0 arms
    this CTA's mbarrier for 12 bytes from every rank; every thread arrives (relaxed) on the
    cluster barrier, which ``share3`` waits on before it writes into any sibling."""
    return "\n".join(["{", ".reg .b32 %xb, %xn;", ".reg .pred %xp;",
                      f".shared .align 16 .b8 xbuf[{XBUF_VALUES + 12 * MAX_RANKS}];",
                      "mov.u32 %xb, xbuf;", "mov.u32 %xn, %tid.x;", "setp.eq.u32 %xp, %xn, 0;",
                      "mov.u32 %xn, %cluster_nctarank;", "mul.lo.u32 %xn, %xn, 12;",
                      "@%xp mbarrier.init.shared::cta.b64 [%xb], 1;",
                      "@%xp mbarrier.arrive.expect_tx.shared::cta.b64 _, [%xb], %xn;",
                      "@%xp fence.mbarrier_init.release.cluster;",
                      "barrier.cluster.arrive.relaxed.aligned;", "mov.u32 $0, %xb;", "}"])


def _share_asm() -> str:
    """PTX: outputs $0 (the address of value 0 of rank 0); inputs $1-$3 (this CTA's three
    values), $4 (the cluster size the kernel was built for), $5 (``cluster_arrive``'s buffer).
    Value k of rank r at values[k * 16 + r]. Thread r < ranks sends this CTA's three values
    to rank r by ``st.async``, whose bytes complete rank r's mbarrier; then every thread
    waits on its own CTA's mbarrier (phase 0): no cluster-wide release fence. Once a CTA:
    a second call would find phase 0 complete and read the first call's values."""
    lines = ["{", ".reg .b32 %qv, %qr, %qt, %qn, %qd, %qm;", ".reg .pred %qp, %qs;",
             "mov.u32 %qn, %cluster_nctarank;", "setp.ne.u32 %qp, %qn, $4;", "@%qp trap;",
             "barrier.cluster.wait.aligned;",  # pairs with cluster_arrive: every sibling's mbarrier is armed
             f"add.u32 %qv, $5, {XBUF_VALUES};", "mov.u32 %qr, %cluster_ctarank;", "mov.u32 %qt, %tid.x;",
             "setp.lt.u32 %qs, %qt, %qn;", "shl.b32 %qr, %qr, 2;", "add.u32 %qr, %qv, %qr;",
             "@%qs mapa.shared::cluster.u32 %qm, $5, %qt;", "@%qs mapa.shared::cluster.u32 %qd, %qr, %qt;"]
    for k in range(3):
        lines += [f"@%qs st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%qd+{4 * MAX_RANKS * k}], "
                  f"${1 + k}, [%qm];"]
    lines += ["ONETRIP_XWAIT:", "mbarrier.try_wait.parity.shared::cta.b64 %qp, [$5], 0;",
              "@!%qp bra ONETRIP_XWAIT;", "mov.u32 $0, %qv;", "}"]
    return "\n".join(lines)


SHARE_ASM = tl.constexpr(_share_asm())
ARM_ASM = tl.constexpr(_arm_asm())


@triton.jit
def cluster_arrive(pid):
    """Arm this CTA's exchange (its mbarrier) and arrive (relaxed) on the cluster barrier;
    ``share3`` waits on it. Call first thing. Returns the exchange buffer's shared address."""
    return tl.inline_asm_elementwise(ARM_ASM, "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def share3(a, b, c, ranks: tl.constexpr, xbuf):
    """Every CTA of the cluster gets every CTA's (a, b, c) (float32 scalars); ``xbuf``:
    ``cluster_arrive``'s buffer. Returns the shared address of the (3, 16) float32 values
    (value k of rank r at 4 * (16 k + r))."""
    return tl.inline_asm_elementwise(SHARE_ASM, "=r,f,f,f,r,r", [a, b, c, ranks, xbuf], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def smem_load(addr):
    """float32 at each shared address of ``addr`` (int32, any shape)."""
    return tl.inline_asm_elementwise("ld.shared.f32 $0, [$1];", "=f,r", [addr], dtype=tl.float32, is_pure=False,
                                     pack=1)


def cluster_ok(device: torch.device, ranks: int) -> bool:
    """A cluster of ``ranks`` can be launched here: a Hopper-or-newer GPU (not Triton's
    interpreter), 2-8 ranks or 16. (Whether this Triton's launcher takes a cluster size is
    known at the launch: ``launch_clusters`` returns None when it does not.)"""
    if device.type != "cuda" or not (2 <= ranks <= 8 or ranks == MAX_RANKS):
        return False
    return not is_interpreting() and torch.cuda.get_device_capability(device)[0] >= 9


def launch_clusters(kernel, clusters: int, ranks: int, *args, **kwargs):
    """Launch ``kernel`` (a ``triton.jit`` function) as ``clusters`` clusters of ``ranks``
    CTAs each (program ids 0 .. clusters * ranks - 1). The compiled kernel that this call
    will run is fetched (compiled if new) first, its launch metadata patched once; it is
    the one in Triton's cache, so the launch below runs it. Returns it, or None without
    launching when this Triton's compiled kernels do not carry (num_warps, num_ctas, shared)
    launch metadata (the caller then launches without clusters)."""
    compiled = kernel.warmup(*args, grid=(clusters * ranks,), **kwargs)
    meta = getattr(compiled, "packed_metadata", None)
    if not (isinstance(meta, tuple) and len(meta) == 3 and meta[1] in (1, ranks)):
        return None
    if meta[1] != ranks:
        compiled.packed_metadata = (meta[0], ranks, meta[2])  # (num_warps, cluster size, shared memory)
    kernel[(clusters,)](*args, **kwargs)
    return compiled
