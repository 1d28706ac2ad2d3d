"""Every inline-PTX instruction of the norm kernel (Hopper, sm_90), each behind one
``@triton.jit`` wrapper. Triton has no API for shared-memory arrays, cluster exchange or L2
prefetch, so these few instructions are written by hand; everything else is Triton.

Shared-memory segment (a "loop" program's row segment copied into shared memory, so that
both passes read it there instead of pass 2 re-reading it from L2; ``_norm_smem.py``):
  * ``smem_base``: declares the static ``.shared`` array (SMEM_BYTES) and returns its address.
  * ``smem_fetch16``: ``cp.async.ca`` of 16 bytes global -> shared, one asm per copy (pack=1),
    so it is right whatever elements Triton gives a thread; all copies are issued before any
    wait (SASS: LDGSTS back to back). 16 bytes against 8: +2.2 points of copy on an H100 at
    64 x 256K (layer_norm). No ``L2::cache_hint``: with one the copy raised an illegal
    instruction on an H100.
  * ``smem_commit``: ``cp.async.commit_group``: the copies so far become one group.
  * ``smem_wait_all`` / ``smem_wait_groups``: ``cp.async.wait_all`` (or ``wait_group P``)
    and a CTA barrier in one asm, whose result the reads take as an input, so that the reads
    (declared pure) cannot be scheduled above it.
  * ``smem_quads``: ``ld.shared.b64``, the statistics' reads (any layout).
  * ``smem_load8``: ``ld.shared.v4.b32``, 8 16-bit values a thread in the layout of y's
    coalesced store (a pure asm takes its users' layout); it traps unless its 8 addresses
    span 16 aligned bytes: a loud error, never a wrong row.

Cluster exchange (a split row's programs as one thread-block cluster send each other their
partial sums through distributed shared memory, no global atomics; ``_cluster.py``):
  * ``cluster_arrive``: declares the exchange buffer (an mbarrier and 3 x 16 floats); thread 0
    arms the mbarrier for 12 bytes a rank; every thread arrives (relaxed) on the cluster
    barrier. Must run first in the kernel.
  * ``cluster_share3``: waits on the cluster barrier (every sibling's mbarrier armed), thread
    r < ranks sends this CTA's three floats to rank r by ``st.async`` (its bytes complete rank
    r's mbarrier), then waits on its own mbarrier: no cluster-wide fence (``arrive.release``
    compiles to ``MEMBAR.ALL.GPU``). Traps when launched without the cluster size it was built
    for. On an H100 the ``st.async`` form over a barrier-and-fence form: rms_norm 64 x 256K
    76.0 -> 82.1% of copy.
  * ``smem_load_f32``: ``ld.shared.f32``, the exchanged values.

L2 requests (``_norm_l2.py``):
  * ``l2_prefetch_4k``: ``cp.async.bulk.prefetch.L2`` of 4 KB (served by the TMA unit: no
    register, shared memory or slot held), predicated on a lane index below a count.
"""

from __future__ import annotations

import triton
import triton.language as tl

SMEM_BYTES = 32768  # a 16384-column bf16 segment: a 256K row in 16 programs, 128K in 8
MAX_RANKS = 16  # cluster sizes 2-8 are portable; 16 is allowed on H100 / H200 (Triton's launcher opts in)
_XBUF_HEAD = 16  # the exchange buffer: the mbarrier (8 bytes), padding, then the values (3 x 16 floats)


def _load8_asm() -> str:
    """$0-$3: the packed pairs at the 8 addresses $4-$11; traps unless they span 16 aligned bytes."""
    return "\n".join(["{", ".reg .pred %sv;", ".reg .b32 %sd;", "and.b32 %sd, $4, 15;", "setp.ne.u32 %sv, %sd, 0;",
                      "sub.u32 %sd, $11, $4;", "setp.ne.or.u32 %sv, %sd, 14, %sv;", "@%sv trap;",
                      "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "}"])


def _arm_asm() -> str:
    """$0: the exchange buffer's shared address ($1 unused)."""
    return "\n".join(["{", ".reg .b32 %xb, %xn;", ".reg .pred %xp;",
                      f".shared .align 16 .b8 xbuf[{_XBUF_HEAD + 12 * MAX_RANKS}];",
                      "mov.u32 %xb, xbuf;", "mov.u32 %xn, %tid.x;", "setp.eq.u32 %xp, %xn, 0;",
                      "mov.u32 %xn, %cluster_nctarank;", "mul.lo.u32 %xn, %xn, 12;",
                      "@%xp mbarrier.init.shared::cta.b64 [%xb], 1;",
                      "@%xp mbarrier.arrive.expect_tx.shared::cta.b64 _, [%xb], %xn;",
                      "@%xp fence.mbarrier_init.release.cluster;",
                      "barrier.cluster.arrive.relaxed.aligned;", "mov.u32 $0, %xb;", "}"])


def _share_asm() -> str:
    """$0: the address of value 0 of rank 0; $1-$3 this CTA's values, $4 the cluster size the
    kernel was built for, $5 the exchange buffer. Value k of rank r at values[16 k + r]."""
    lines = ["{", ".reg .b32 %qv, %qr, %qt, %qn, %qd, %qm;", ".reg .pred %qp, %qs;",
             "mov.u32 %qn, %cluster_nctarank;", "setp.ne.u32 %qp, %qn, $4;", "@%qp trap;",
             "barrier.cluster.wait.aligned;",
             f"add.u32 %qv, $5, {_XBUF_HEAD};", "mov.u32 %qr, %cluster_ctarank;", "mov.u32 %qt, %tid.x;",
             "setp.lt.u32 %qs, %qt, %qn;", "shl.b32 %qr, %qr, 2;", "add.u32 %qr, %qv, %qr;",
             "@%qs mapa.shared::cluster.u32 %qm, $5, %qt;", "@%qs mapa.shared::cluster.u32 %qd, %qr, %qt;"]
    for k in range(3):
        lines += [f"@%qs st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%qd+{4 * MAX_RANKS * k}], "
                  f"${1 + k}, [%qm];"]
    lines += ["ONETRIP_XWAIT:", "mbarrier.try_wait.parity.shared::cta.b64 %qp, [$5], 0;",
              "@!%qp bra ONETRIP_XWAIT;", "mov.u32 $0, %qv;", "}"]
    return "\n".join(lines)


_BASE_ASM = tl.constexpr("{\n.shared .align 16 .b8 onorm_segment[" + str(SMEM_BYTES) + "];\n"
                        "mov.u32 $0, onorm_segment;\n}")
_FETCH16_ASM = tl.constexpr("cp.async.ca.shared.global [$1], [$2], 16;\nmov.u32 $0, 0;")
_COMMIT_ASM = tl.constexpr("cp.async.commit_group;\nmov.u32 $0, 0;")
_WAIT_ALL_ASM = tl.constexpr("cp.async.wait_all;\nbar.sync 0;\nmov.b32 $0, 0;")
# at most P of this thread's groups pending, then the CTA's barrier (the count is an immediate)
_WAIT0, _WAIT1, _WAIT2, _WAIT3 = (tl.constexpr(f"cp.async.wait_group {p};\nbar.sync 0;\nmov.b32 $0, 0;")
                                  for p in range(4))
_LOAD8_ASM = tl.constexpr(_load8_asm())
_LOAD8_CONSTRAINTS = tl.constexpr("=r,=r,=r,=r," + ",".join(["r"] * 8 + ["f"] * 8))  # values; addresses; after
_ARM_ASM = tl.constexpr(_arm_asm())
_SHARE_ASM = tl.constexpr(_share_asm())
_L2_4K_ASM = tl.constexpr("{\n.reg .pred %sp;\nsetp.lt.s32 %sp, $2, $3;\n"
                          "@%sp cp.async.bulk.prefetch.L2.global [$1], 4096;\nmov.u32 $0, 0;\n}")
L2_REQUEST = tl.constexpr(4096)  # bytes one ``l2_prefetch_4k`` asks for


@triton.jit
def smem_base(pid):
    """The shared address (int32) of this CTA's SMEM_BYTES segment buffer; ``pid``: any int32 scalar."""
    return tl.inline_asm_elementwise(_BASE_ASM, "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def smem_fetch16(addr, quad_ptrs):
    """Start copying 16 bytes from each global int64 pointer ``quad_ptrs`` to shared ``addr``."""
    tl.inline_asm_elementwise(_FETCH16_ASM, "=r,r,l", [addr, quad_ptrs.to(tl.int64, bitcast=True)], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def smem_commit(i):
    """Close this thread's copies issued so far into one group; ``i``: any int32 scalar."""
    tl.inline_asm_elementwise(_COMMIT_ASM, "=r,r", [i], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def smem_wait_all(pid):
    """Wait for this thread's copies, then the CTA's; returns float32 0.0 for the reads' ``after``."""
    return tl.inline_asm_elementwise(_WAIT_ALL_ASM, "=r,r", [pid], dtype=tl.int32, is_pure=False,
                                     pack=1).to(tl.float32, bitcast=True)


@triton.jit
def smem_wait_groups(pid, PENDING: tl.constexpr):
    """Wait until at most PENDING (0-3; more waits as 3) of this thread's copy groups are
    pending, then for the CTA; returns float32 0.0 for the reads' ``after``."""
    ASM: tl.constexpr = _WAIT0 if PENDING == 0 else (_WAIT1 if PENDING == 1 else (_WAIT2 if PENDING == 2 else _WAIT3))
    g = tl.inline_asm_elementwise(ASM, "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)
    return g.to(tl.float32, bitcast=True)


@triton.jit
def smem_quads(addr, after):
    """The int64 at each shared ``addr`` (int32, any shape), read after ``after``."""
    return tl.inline_asm_elementwise("ld.shared.b64 $0, [$1];", "=l,r,f", [addr, after], dtype=tl.int64,
                                     is_pure=True, pack=1)


@triton.jit
def smem_load8(addr, after, like_ptr):
    """The 16-bit floats (``like_ptr``'s type) at shared ``addr`` (int32, any shape; a thread's
    8 contiguous and 16-byte aligned), read after ``after``."""
    return tl.inline_asm_elementwise(_LOAD8_ASM, _LOAD8_CONSTRAINTS, [addr, after], dtype=like_ptr.dtype.element_ty,
                                     is_pure=True, pack=8)


@triton.jit
def cluster_arrive(pid):
    """Arm this CTA's exchange and arrive on the cluster barrier; returns the buffer's address."""
    return tl.inline_asm_elementwise(_ARM_ASM, "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def cluster_share3(a, b, c, ranks: tl.constexpr, xbuf):
    """Every CTA of the cluster gets every CTA's (a, b, c) (float32 scalars); returns the shared
    address of the (3, 16) float32 values (value k of rank r at 4 * (16 k + r))."""
    return tl.inline_asm_elementwise(_SHARE_ASM, "=r,f,f,f,r,r", [a, b, c, ranks, xbuf], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def smem_load_f32(addr):
    """float32 at each shared address of ``addr`` (int32, any shape)."""
    return tl.inline_asm_elementwise("ld.shared.f32 $0, [$1];", "=f,r", [addr], dtype=tl.float32, is_pure=False,
                                     pack=1)


@triton.jit
def l2_prefetch_4k(ptrs, lane, count):
    """Ask the L2 for the 4 KB at each of ``ptrs`` (16-byte aligned) whose ``lane`` < ``count``."""
    tl.inline_asm_elementwise(_L2_4K_ASM, "=r,l,r,r", [ptrs, lane, count], dtype=tl.int32, is_pure=False, pack=1)
