"""Thread-block clusters from Triton (Hopper): a few partial sums shared among the CTAs of a
cluster through distributed shared memory, and the launch that makes a grid of clusters.

Why: a row split over SPLIT programs (norm's ``split``) needs each program's partial sums
before any can normalize. Through global memory that is a store, a GPU-scope atomic and a
poll of a counter until the siblings are in: L2 round trips while the HBM idles, and every
program of the grid reaches that point at about the same time. Launched as a cluster, the
SPLIT programs are co-scheduled on one GPC; thread 0 of each writes its sums into a slot of
every sibling's shared memory (``st.shared::cluster``) and one hardware barrier later each
reads all of them from its own. On an H100 (ops bench, bf16, % of copy; NOTES.md,
eighteenth session): rms_norm 256 x 256K 84.3 -> 88%, 64 x 256K 72.6 -> 77%, 512 x 128K
89.0 -> 93%; layer_norm 75.0 -> 81%, 67.5 -> 70%, 84.8 -> 89%; add_layer_norm 85.0 ->
87%, 82.5 -> 87%, 89.6 -> 91%.

Triton (3.6) has no cluster API, so:
  * the exchange is inline PTX over a static shared buffer (48 floats: 3 values x 16
    ranks), its address handed back so that later loads (``smem_load``) can read it;
  * the kernel is compiled as usual, and its compiled form launched with a cluster
    dimension: ``launch_clusters`` sets the ``num_ctas`` field of the compiled kernel's
    packed launch metadata, from which Triton's launcher passes
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION (it also multiplies the grid by it). CTA k of
    the launch is then rank k % SPLIT of cluster k // SPLIT.
A kernel built with the exchange but launched without the matching cluster size traps
(``share3`` checks ``%cluster_nctarank``): a loud error, never a row normalized by a part
of its sums. ``cluster_arrive`` must run at the kernel's start: ``share3``'s first wait
pairs with it, so no CTA writes into a sibling that has not started.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import is_interpreting

MAX_RANKS = 16  # cluster sizes 2-8 are portable; 16 is allowed on H100 / H200 (Triton's launcher opts in)


def _share_asm() -> str:
    """PTX: outputs $0 (the buffer's shared address); inputs $1-$3 (this CTA's three values),
    $4 (the cluster size the kernel was built for). Value k of rank r at buf[k * 16 + r]."""
    lines = ["{", ".reg .b32 %qb, %qr, %qt, %qn, %qd;", ".reg .pred %qp, %qs;",
             f".shared .align 16 .f32 qbuf[{3 * MAX_RANKS}];",
             "mov.u32 %qn, %cluster_nctarank;", "setp.ne.u32 %qp, %qn, $4;", "@%qp trap;",
             "barrier.cluster.wait.aligned;",  # pairs with cluster_arrive: every sibling has started
             "mov.u32 %qb, qbuf;", "mov.u32 %qr, %cluster_ctarank;", "mov.u32 %qt, %tid.x;",
             "setp.eq.u32 %qp, %qt, 0;", "shl.b32 %qr, %qr, 2;", "add.u32 %qr, %qb, %qr;"]
    for s in range(MAX_RANKS):
        lines += [f"setp.gt.and.u32 %qs, %qn, {s}, %qp;", f"@%qs mapa.shared::cluster.u32 %qd, %qr, {s};"]
        lines += [f"@%qs st.shared::cluster.f32 [%qd+{4 * MAX_RANKS * k}], ${1 + k};" for k in range(3)]
    lines += ["barrier.cluster.arrive.release.aligned;", "barrier.cluster.wait.acquire.aligned;",
              "mov.u32 $0, %qb;", "}"]
    return "\n".join(lines)


SHARE_ASM = tl.constexpr(_share_asm())
ARRIVE_ASM = tl.constexpr("barrier.cluster.arrive.relaxed.aligned;\nmov.u32 $0, $1;")


@triton.jit
def cluster_arrive(pid):
    """Arrive (relaxed) on the cluster barrier; ``share3`` waits on it. Call first thing."""
    tl.inline_asm_elementwise(ARRIVE_ASM, "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def share3(a, b, c, ranks: tl.constexpr):
    """Every CTA of the cluster gets every CTA's (a, b, c) (float32 scalars): returns the
    shared address of the (3, 16) float32 buffer (value k of rank r at 4 * (16 k + r))."""
    return tl.inline_asm_elementwise(SHARE_ASM, "=r,f,f,f,r", [a, b, c, ranks], dtype=tl.int32, is_pure=False,
                                     pack=1)


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
