"""The cluster exchange as the experiments of the eighteenth to twenty-eighth sessions measured
it (norm_cluster, norm_fetch, norm_fetch_res, norm_pair, norm_ring, norm_stream, norm_wbheld):
thread 0 of each CTA writes its three sums into every sibling's slot with
``st.shared::cluster``, then a cluster barrier, arrive.release / wait.acquire. The release
compiles to ``MEMBAR.ALL.GPU``; the library's ``_cluster.share3`` sends the sums by
``st.async`` onto each rank's mbarrier instead (NOTES.md, thirtieth session), whose
one-phase protocol the persistent experiments (a slot reused row after row, freed by
another arrive) do not follow. Kept here so that their figures stay reproducible.
"""

from __future__ import annotations

import triton
import triton.language as tl

from onetrip.ops._cluster import MAX_RANKS


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
