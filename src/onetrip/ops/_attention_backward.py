"""The Triton kernels behind ``flash_attention``'s backward (FlashAttention-2's split).

With P = exp(S - lse) recomputed tile by tile from the saved lse (S after scale, softcap
and mask, as in the forward) and dO the gradient of O:

    delta_i = sum_d dO[i, d] O[i, d]  -  dlse_i        (preprocess: one float32 per row)
    dV      = P^T dO
    dP      = dO V^T
    dS      = P * (dP - delta)                          (softmax backward, in registers)
    dS_raw  = dS * scale * (1 - tanh^2)                 (softcap; dS * scale without it)
    dQ      = dS_raw K,     dK = dS_raw^T Q

Two modes (``deterministic``), both after the preprocess:

    _bwd_preprocess_kernel   (query block, head, batch)   delta
    _bwd_dkdv_kernel         (key block, kv head, batch)  dK, dV: the key block stays
                             resident; the program loops over the query heads of its GQA
                             group and their query blocks, summing in a fixed order.
                             ATOMIC_DQ: also each tile's share of dQ, added into a float32
                             (B, S, H, D) buffer by atomics (pointer or TMA bulk reductions)
    _bwd_dq_kernel           (query block, head, batch)   deterministic: dQ over key blocks

Deterministic: every output element has one program that writes it once (the same bits
run to run), at the cost of the dQ kernel recomputing S and dP: 7 tile matmuls a (query
block, key block) pair. Atomic: 5, but the order of the key blocks' adds into dQ varies
run to run, and so do dQ's last bits; plus the float32 buffer, its zeroing and a cast.

Both loops skip the blocks the mask hides entirely and split the rest in three ranges
(a masked edge, the unmasked interior, the other masked edge) as the forward does: the
dQ kernel uses the forward's ``_key_ranges``, the dK/dV kernel its mirror
``_query_ranges``. Rows that see no key have lse = -inf in the forward; here they get
P = 0, so zero gradients, never NaN.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ._attention_backward_picks import AttentionBackwardConfig, backward_config
from ._attention_jit import LOG2E, _key_ranges, _load_rows
from ._common import cdiv, hopper_or_newer, next_pow2
from ._jit import cast_out, dot_f32, tanh
from ._launch import launch, meta_key

_LOG2E = tl.constexpr(LOG2E)


@triton.jit
def _seq_bounds(cu_q_ptr, cu_k_ptr, b, seqlen_q, seqlen_k, IS_VARLEN: tl.constexpr):
    """(q_start, q_len, k_start, k_len) of sequence ``b``: packed offsets or the dense lengths."""
    if IS_VARLEN:
        q_start = tl.load(cu_q_ptr + b).to(tl.int64)  # a token's offset passes 2**31 elements
        q_len = tl.load(cu_q_ptr + b + 1) - tl.load(cu_q_ptr + b)
        k_start = tl.load(cu_k_ptr + b).to(tl.int64)
        k_len = tl.load(cu_k_ptr + b + 1) - tl.load(cu_k_ptr + b)
    else:
        q_start = 0
        q_len = seqlen_q
        k_start = 0
        k_len = seqlen_k
    return q_start, q_len, k_start, k_len


@triton.jit
def _query_ranges(n0, q_len, k_len, window_left, window_right,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """(lo, left_end, full_lo, full_hi, hi): ``_key_ranges`` seen from the keys. Query rows
    of the key block [n0, min(n0 + BLOCK_N, k_len)): row i sees key j when
    j - diag - right <= i <= j - diag + left, so [lo, full_lo) is the masked diagonal (rows
    that see only some of the block's keys, below the causal edge), [full_lo, full_hi) rows
    that see every key of the block (and are all < q_len), [full_hi, hi) the masked left
    window edge and the ragged last query block. Clamped to >= 0 before each division."""
    diag = k_len - q_len
    first = n0
    last = tl.minimum(n0 + BLOCK_N, k_len) - 1  # last real key; < first when the block is past the end
    lo = 0
    hi = q_len
    full_lo = 0
    full_hi = (q_len // BLOCK_M) * BLOCK_M
    if HAS_RIGHT:
        lo = (tl.maximum(first - diag - window_right, 0) // BLOCK_M) * BLOCK_M
        full_lo = tl.cdiv(tl.maximum(last - diag - window_right, 0), BLOCK_M) * BLOCK_M
    if HAS_LEFT:
        hi = tl.minimum(q_len, tl.maximum(last - diag + window_left + 1, 0))
        full_hi = (tl.minimum(q_len, tl.maximum(first - diag + window_left + 1, 0)) // BLOCK_M) * BLOCK_M
    hi = tl.where(last >= first, hi, 0)  # a key block wholly past this sequence's end does nothing
    full_lo = tl.maximum(full_lo, lo)
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
    return lo, tl.minimum(full_lo, hi), full_lo, full_hi, hi


@triton.jit
def _scores(s, qk_scale, cap_in, cap_out, HAS_SOFTCAP: tl.constexpr):
    """Raw q.k products -> the forward's scores in log2 units, and the softcap's tanh (or s)."""
    if HAS_SOFTCAP:
        t = tanh(s * cap_in)
        return cap_out * t, t
    else:
        return s * qk_scale, s


@triton.jit
def _row_stats(lse_base, delta_base, m, q_len, MASKED: tl.constexpr):
    """lse in log2 units and delta of rows ``m``. A row that sees no key (lse = -inf) or lies
    past the sequence reads lse = +inf, so its P = 2^(s - inf) = 0 even where s = -inf."""
    if MASKED:
        lse = tl.load(lse_base + m, mask=m < q_len, other=float("inf"))
        delta = tl.load(delta_base + m, mask=m < q_len, other=0.0)
    else:
        lse = tl.load(lse_base + m)
        delta = tl.load(delta_base + m)
    return tl.where(lse == float("-inf"), float("inf"), lse * _LOG2E), delta


@triton.jit
def _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, dq_desc, b, h, m0, offs_n, offs_mb,
               offs_d, q_len, k_len, diag, stride_qs, stride_dos, stride_dqs, qk_scale, cap_in, cap_out,
               softmax_scale, window_left, window_right,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr,
               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
               DOT_PRECISION: tl.constexpr, ATOMIC_DQ: tl.constexpr, DQ_TMA: tl.constexpr):
    """One block of BLOCK_M query rows against the resident keys, transposed (keys along
    rows) so that no (BLOCK_N, BLOCK_M) tile needs a transpose; returns (dk, dv). With
    ATOMIC_DQ it also adds the block's dQ share, (dS^T K) * scale, into the float32 dQ."""
    m = m0 + offs_mb
    q = _load_rows(q_base, None, 0, m0, 0, offs_mb, offs_d, stride_qs, q_len, HEAD_DIM, MASKED, False)
    do = _load_rows(do_base, None, 0, m0, 0, offs_mb, offs_d, stride_dos, q_len, HEAD_DIM, MASKED, False)
    lse2, delta = _row_stats(lse_base, delta_base, m, q_len, MASKED)
    st, t = _scores(dot_f32(k, tl.trans(q), DOT_PRECISION), qk_scale, cap_in, cap_out, HAS_SOFTCAP)
    if MASKED:
        ok = tl.full(st.shape, 1, tl.int1)
        if ATOMIC_DQ:  # keys past k_len (zero rows of K) reach dQ: P = 0 there keeps inf * 0 out
            ok = ok & (offs_n < k_len)[:, None]  # (without atomics their dK, dV rows are not stored)
        if HAS_RIGHT:
            ok = ok & (offs_n[:, None] <= m[None, :] + diag + window_right)
        if HAS_LEFT:
            ok = ok & (offs_n[:, None] >= m[None, :] + diag - window_left)
        st = tl.where(ok, st, float("-inf"))
    pt = tl.math.exp2(st - lse2[None, :])  # (BLOCK_N, BLOCK_M) float32
    dv += dot_f32(cast_out(pt, do.dtype), do, DOT_PRECISION)
    dpt = dot_f32(v, tl.trans(do), DOT_PRECISION)
    dst = pt * (dpt - delta[None, :])
    if HAS_SOFTCAP:
        dst = dst * (1.0 - t * t)
    ds = cast_out(dst, q.dtype)
    dk += dot_f32(ds, q, DOT_PRECISION)
    if ATOMIC_DQ:  # (BLOCK_M, BLOCK_D) float32
        if DQ_TMA:  # dense: rows past seq_q and dims past HEAD_DIM are clipped by the copy engine
            # (K^T dS)^T: M = head dim keeps this product on wgmma (M = BLOCK_M = 32 falls back
            # to mma.sync); its pointer twin spills (56 bytes at 32 x 128, head dim 128).
            dq = tl.trans(dot_f32(tl.trans(k), ds, DOT_PRECISION)) * softmax_scale
            dq_desc.atomic_add([b, m0, h, 0], dq.reshape(1, BLOCK_M, 1, BLOCK_D))
        else:  # this layout reaches the atomics as 16-byte vectors (atom.add.v4.f32)
            dq = dot_f32(tl.trans(ds), k, DOT_PRECISION) * softmax_scale
            ptrs = dq_base + m.to(tl.int64)[:, None] * stride_dqs + offs_d[None, :]
            if MASKED:
                tl.atomic_add(ptrs, dq, mask=(m < q_len)[:, None] & (offs_d < HEAD_DIM)[None, :], sem="relaxed")
            elif HEAD_DIM == BLOCK_D:
                tl.atomic_add(ptrs, dq, sem="relaxed")
            else:
                tl.atomic_add(ptrs, dq, mask=(offs_d < HEAD_DIM)[None, :], sem="relaxed")
    return dk, dv


@triton.jit
def _dq_tile(dq, q, do, lse2, delta, k_base, v_base, n0, offs_m, offs_n, offs_d, k_len, diag,
             stride_ks, stride_vs, qk_scale, cap_in, cap_out, window_left, window_right,
             HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
             HAS_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One tile of BLOCK_N keys against the resident query rows; returns dq."""
    n = n0 + offs_n
    k = _load_rows(k_base, None, 0, n0, 0, offs_n, offs_d, stride_ks, k_len, HEAD_DIM, MASKED, False)
    v = _load_rows(v_base, None, 0, n0, 0, offs_n, offs_d, stride_vs, k_len, HEAD_DIM, MASKED, False)
    s, t = _scores(dot_f32(q, tl.trans(k), DOT_PRECISION), qk_scale, cap_in, cap_out, HAS_SOFTCAP)
    if MASKED:
        ok = (n < k_len)[None, :]
        if HAS_RIGHT:
            ok = ok & (n[None, :] <= offs_m[:, None] + diag + window_right)
        if HAS_LEFT:
            ok = ok & (n[None, :] >= offs_m[:, None] + diag - window_left)
        s = tl.where(ok, s, float("-inf"))
    p = tl.math.exp2(s - lse2[:, None])  # (BLOCK_M, BLOCK_N) float32
    dp = dot_f32(do, tl.trans(v), DOT_PRECISION)
    ds = p * (dp - delta[:, None])
    if HAS_SOFTCAP:
        ds = ds * (1.0 - t * t)
    return dq + dot_f32(cast_out(ds, k.dtype), k, DOT_PRECISION)


@triton.jit
def _bwd_preprocess_kernel(
    o_ptr, do_ptr, dlse_ptr, delta_ptr,   # o, do: (B, Sq, H, D) or (Tq, H, D); dlse, delta: lse's layout, fp32
    cu_q_ptr, seqlen_q,
    stride_ob, stride_os, stride_oh,
    stride_dob, stride_dos, stride_doh,
    stride_lb, stride_lh,                 # lse / dlse / delta: (B, H, Sq) or (H, Tq), unit token stride
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_DLSE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2)
    q_start, q_len, _, _ = _seq_bounds(cu_q_ptr, cu_q_ptr, b, seqlen_q, 0, IS_VARLEN)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    b64 = b.to(tl.int64)
    row_ok = offs_m < q_len
    mask = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    rows = (q_start + offs_m.to(tl.int64))[:, None]
    o = tl.load(o_ptr + b64 * stride_ob + h * stride_oh + rows * stride_os + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(do_ptr + b64 * stride_dob + h * stride_doh + rows * stride_dos + offs_d[None, :], mask=mask,
                 other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    l_off = b64 * stride_lb + h * stride_lh + q_start + offs_m
    if HAS_DLSE:  # lse's own gradient g adds g * P to dS: the same as delta - g
        delta -= tl.load(dlse_ptr + l_off, mask=row_ok, other=0.0)
    tl.store(delta_ptr + l_off, delta, mask=row_ok)


@triton.jit
def _bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    dq_ptr, dq_desc,                      # ATOMIC_DQ: float32 dQ (pointer; the descriptor with DQ_TMA)
    cu_q_ptr, cu_k_ptr,                   # (B + 1,) int32 (varlen only)
    seqlen_q, seqlen_k, group,            # dense lengths; group = H // kv_heads
    stride_qb, stride_qs, stride_qh,      # (batch, token, head) strides; batch is 0 for varlen
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dkb, stride_dks, stride_dkh,
    stride_dvb, stride_dvs, stride_dvh,
    stride_dqb, stride_dqs, stride_dqh,
    stride_lb, stride_lh,                 # lse and delta: (B, H, Sq) or (H, Tq), unit token stride
    qk_scale, cap_in, cap_out, softmax_scale, window_left, window_right,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ATOMIC_DQ: tl.constexpr, DQ_TMA: tl.constexpr,  # the atomic mode; its adds as TMA bulk reductions
):
    pid_n = tl.program_id(0)
    kh = tl.program_id(1)
    b = tl.program_id(2)
    q_start, q_len, k_start, k_len = _seq_bounds(cu_q_ptr, cu_k_ptr, b, seqlen_q, seqlen_k, IS_VARLEN)
    diag = k_len - q_len
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_mb = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    b64 = b.to(tl.int64)
    kh64 = kh.to(tl.int64)
    n64 = offs_n.to(tl.int64)[:, None]
    kv_mask = (offs_n < k_len)[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(k_ptr + b64 * stride_kb + kh64 * stride_kh + (k_start + n64) * stride_ks + offs_d[None, :],
                mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D), resident
    v = tl.load(v_ptr + b64 * stride_vb + kh64 * stride_vh + (k_start + n64) * stride_vs + offs_d[None, :],
                mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    lo, left_end, full_lo, full_hi, hi = _query_ranges(n0, q_len, k_len, window_left, window_right,
                                                       BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    if ATOMIC_DQ:  # a ragged last key block runs masked throughout (P = 0 past k_len)
        full_hi = tl.where(n0 + BLOCK_N > k_len, full_lo, full_hi)
    for g in range(group):  # the query heads of this kv head, summed in a fixed order
        h32 = kh * group + g
        h = h32.to(tl.int64)
        q_base = q_ptr + b64 * stride_qb + h * stride_qh + q_start * stride_qs
        do_base = do_ptr + b64 * stride_dob + h * stride_doh + q_start * stride_dos
        dq_base = dq_ptr + b64 * stride_dqb + h * stride_dqh + q_start * stride_dqs
        lse_base = lse_ptr + b64 * stride_lb + h * stride_lh + q_start
        delta_base = delta_ptr + b64 * stride_lb + h * stride_lh + q_start
        for m0 in range(lo, left_end, BLOCK_M):  # causal diagonal / right window edge
            dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, dq_desc, b, h32, m0,
                                offs_n, offs_mb, offs_d, q_len, k_len, diag, stride_qs, stride_dos, stride_dqs,
                                qk_scale, cap_in, cap_out, softmax_scale, window_left, window_right, HEAD_DIM,
                                BLOCK_M, BLOCK_D, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, DOT_PRECISION, ATOMIC_DQ,
                                DQ_TMA)
        for m0 in range(full_lo, full_hi, BLOCK_M):  # interior: no mask
            dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, dq_desc, b, h32, m0,
                                offs_n, offs_mb, offs_d, q_len, k_len, diag, stride_qs, stride_dos, stride_dqs,
                                qk_scale, cap_in, cap_out, softmax_scale, window_left, window_right, HEAD_DIM,
                                BLOCK_M, BLOCK_D, False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, DOT_PRECISION, ATOMIC_DQ,
                                DQ_TMA)
        for m0 in range(full_hi, hi, BLOCK_M):  # left window edge, ragged last query block
            dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, dq_desc, b, h32, m0,
                                offs_n, offs_mb, offs_d, q_len, k_len, diag, stride_qs, stride_dos, stride_dqs,
                                qk_scale, cap_in, cap_out, softmax_scale, window_left, window_right, HEAD_DIM,
                                BLOCK_M, BLOCK_D, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, DOT_PRECISION, ATOMIC_DQ,
                                DQ_TMA)
    dk = dk * softmax_scale
    tl.store(dk_ptr + b64 * stride_dkb + kh64 * stride_dkh + (k_start + n64) * stride_dks + offs_d[None, :],
             cast_out(dk, dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + b64 * stride_dvb + kh64 * stride_dvh + (k_start + n64) * stride_dvs + offs_d[None, :],
             cast_out(dv, dv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def _bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    cu_q_ptr, cu_k_ptr,
    seqlen_q, seqlen_k, group,
    stride_qb, stride_qs, stride_qh,      # (batch, token, head) strides; batch is 0 for varlen
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dqb, stride_dqs, stride_dqh,
    stride_lb, stride_lh,
    qk_scale, cap_in, cap_out, softmax_scale, window_left, window_right,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    q_start, q_len, k_start, k_len = _seq_bounds(cu_q_ptr, cu_k_ptr, b, seqlen_q, seqlen_k, IS_VARLEN)
    diag = k_len - q_len
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    kh = (h // group).to(tl.int64)
    m64 = q_start + offs_m.to(tl.int64)[:, None]
    q_mask = (offs_m < q_len)[:, None] & (offs_d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + b64 * stride_qb + h64 * stride_qh + m64 * stride_qs + offs_d[None, :],
                mask=q_mask, other=0.0)  # (BLOCK_M, BLOCK_D), resident
    do = tl.load(do_ptr + b64 * stride_dob + h64 * stride_doh + m64 * stride_dos + offs_d[None, :],
                 mask=q_mask, other=0.0)
    l_off = b64 * stride_lb + h64 * stride_lh + q_start
    lse2, delta = _row_stats(lse_ptr + l_off, delta_ptr + l_off, offs_m, q_len, True)
    k_base = k_ptr + b64 * stride_kb + kh * stride_kh + k_start * stride_ks
    v_base = v_ptr + b64 * stride_vb + kh * stride_vh + k_start * stride_vs
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, left_end, full_lo, full_hi, hi = _key_ranges(m0, q_len, k_len, window_left, window_right,
                                                     BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    for n0 in range(lo, left_end, BLOCK_N):  # left window edge
        dq = _dq_tile(dq, q, do, lse2, delta, k_base, v_base, n0, offs_m, offs_n, offs_d, k_len, diag,
                      stride_ks, stride_vs, qk_scale, cap_in, cap_out, window_left, window_right,
                      HEAD_DIM, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, DOT_PRECISION)
    for n0 in range(full_lo, full_hi, BLOCK_N):  # interior: no mask
        dq = _dq_tile(dq, q, do, lse2, delta, k_base, v_base, n0, offs_m, offs_n, offs_d, k_len, diag,
                      stride_ks, stride_vs, qk_scale, cap_in, cap_out, window_left, window_right,
                      HEAD_DIM, False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, DOT_PRECISION)
    for n0 in range(full_hi, hi, BLOCK_N):  # causal diagonal, right window edge, ragged last tile
        dq = _dq_tile(dq, q, do, lse2, delta, k_base, v_base, n0, offs_m, offs_n, offs_d, k_len, diag,
                      stride_ks, stride_vs, qk_scale, cap_in, cap_out, window_left, window_right,
                      HEAD_DIM, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, DOT_PRECISION)
    dq = dq * softmax_scale
    tl.store(dq_ptr + b64 * stride_dqb + h64 * stride_dqh + m64 * stride_dqs + offs_d[None, :],
             cast_out(dq, dq_ptr.dtype.element_ty), mask=q_mask)


def dq_tma_allowed(q: torch.Tensor, varlen: bool) -> bool:
    """dQ may be added through a descriptor: dense 16-bit inputs on sm_90+ (the interpreter
    has no descriptor reductions), head_dim % 4 == 0 (16-byte strides of the float32 buffer)."""
    return (not varlen and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] % 4 == 0
            and hopper_or_newer(q))


def launch_backward(dout, q, k, v, out, lse, dlse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                    max_seqlen_k: int, softmax_scale: float, window: tuple[int, int], softcap: float,
                    deterministic: bool = True, config: AttentionBackwardConfig | None = None) -> tuple:
    """Write dq, dk, dv (q's, k's, v's shapes and dtypes) from the forward's q, k, v, out and
    lse (float32, -inf on rows that see no key) and the upstream dout (out's shape) and dlse
    (lse's shape, or None). Any strides with a unit stride along head_dim; lse and dlse are
    made contiguous. ``window`` already holds causal (right = 0). ``deterministic``: the dQ
    kernel, else dQ by atomics into a zeroed float32 buffer (dq itself when dq is a
    contiguous float32 tensor) and a cast into dq.

    Varlen (cu_seqlens): the grids cover ``max_seqlen_q`` queries and ``max_seqlen_k`` keys
    per sequence, which must bound every length; dq, dk and dv are zeroed first, since
    tokens past cu_seqlens[-1] belong to no sequence and no program writes them. Returns
    the compiled gradient kernels (``n_regs``, ``n_spills``): (dK/dV, dQ), (dK/dV,) or ().
    """
    varlen = cu_seqlens_q is not None
    if varlen:
        batch, seqlen_q, seqlen_k = cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    heads, head_dim, kv_heads = q.shape[-2], q.shape[-1], k.shape[-2]
    if batch == 0 or heads == 0 or seqlen_q == 0 or seqlen_k == 0 or q.numel() == 0 or k.numel() == 0:
        for t in (dq, dk, dv):  # no (query, key) pair: every gradient is zero
            t.zero_()
        return ()
    if varlen:
        for t in (dq, dk, dv) if deterministic else (dk, dv):
            t.zero_()
    lse = lse.contiguous()
    delta = torch.empty_like(lse)
    dlse = dlse.contiguous() if dlse is not None else None
    cfg = config or backward_config(head_dim, seqlen_q, seqlen_k, q.dtype, deterministic)
    left, right = window
    cap = float(softcap)
    def s(t):  # (batch, token, head) strides, batch 0 for varlen; one stride() call a tensor
        st = t.stride()
        return (0 if varlen else st[0]), st[-3], st[-2]
    lse_strides = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
    cu_q = cu_seqlens_q if varlen else q
    cu_k = cu_seqlens_k if varlen else q
    pre_block = min(64, max(16, next_pow2(seqlen_q)))
    meta, key = _preprocess_meta(head_dim, pre_block, varlen, dlse is not None)
    launch(_bwd_preprocess_kernel, (cdiv(seqlen_q, pre_block), heads, batch),
           (out, dout, dlse if dlse is not None else delta, delta, cu_q, seqlen_q, *s(out), *s(dout), *lse_strides),
           meta, key)
    scalars = (softmax_scale * LOG2E, softmax_scale / cap if cap > 0 else 0.0, cap * LOG2E, softmax_scale, left,
               right)
    flags = (head_dim, varlen, left >= 0, right >= 0, cap > 0, q.dtype == torch.float32)
    if deterministic:
        dq_acc, dq_desc, use_tma = dq, None, False  # dq_acc: an unused argument
    else:
        dq_acc = dq if dq.dtype == torch.float32 and dq.is_contiguous() else torch.empty(
            dq.shape, dtype=torch.float32, device=dq.device)
        dq_acc.zero_()
        use_tma = cfg.dq_tma and dq_tma_allowed(q, varlen)
        dq_desc = TensorDescriptor(dq_acc, list(dq_acc.shape), list(dq_acc.stride()),
                                   [1, cfg.dkdv.block_m, 1, max(16, next_pow2(head_dim))]) if use_tma else None
    t = cfg.dkdv
    meta, key = _gradient_meta(t.block_m, t.block_n, t.num_warps, t.num_stages, *flags, not deterministic, use_tma)
    dkdv_kernel = launch(
        _bwd_dkdv_kernel, (cdiv(seqlen_k, t.block_n), kv_heads, batch),
        (q, k, v, dout, lse, delta, dk, dv, dq_acc, dq_desc, cu_q, cu_k, seqlen_q, seqlen_k, heads // kv_heads,
         *s(q), *s(k), *s(v), *s(dout), *s(dk), *s(dv), *s(dq_acc), *lse_strides, *scalars),
        meta, key)
    if not deterministic:
        if dq_acc is not dq:
            dq.copy_(dq_acc)
        return (dkdv_kernel,)
    t = cfg.dq
    meta, key = _gradient_meta(t.block_m, t.block_n, t.num_warps, t.num_stages, *flags)
    dq_kernel = launch(
        _bwd_dq_kernel, (cdiv(seqlen_q, t.block_m), heads, batch),
        (q, k, v, dout, lse, delta, dq, cu_q, cu_k, seqlen_q, seqlen_k, heads // kv_heads,
         *s(q), *s(k), *s(v), *s(dout), *s(dq), *lse_strides, *scalars),
        meta, key)
    return dkdv_kernel, dq_kernel


@functools.lru_cache(maxsize=4096)
def _preprocess_meta(head_dim: int, block_m: int, varlen: bool, has_dlse: bool) -> tuple[dict, int]:
    """The preprocess kernel's constexprs and options, and their ``meta_key``: kept, as a launch needs them at
    every call."""
    meta = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_D=max(16, next_pow2(head_dim)), IS_VARLEN=varlen,
                HAS_DLSE=has_dlse)
    return meta, meta_key(meta)


@functools.lru_cache(maxsize=4096)
def _gradient_meta(block_m: int, block_n: int, num_warps: int, num_stages: int, head_dim: int, varlen: bool,
                   has_left: bool, has_right: bool, has_softcap: bool, fp32: bool, atomic_dq: bool | None = None,
                   dq_tma: bool = False) -> tuple[dict, int]:
    """A gradient kernel's constexprs and options (the dK/dV kernel's with ``atomic_dq`` not
    None, else the dQ kernel's), and their ``meta_key``."""
    meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, BLOCK_D=max(16, next_pow2(head_dim)),
                IS_VARLEN=varlen, HAS_LEFT=has_left, HAS_RIGHT=has_right, HAS_SOFTCAP=has_softcap,
                # float32 inputs: full-precision products (the GPU default would round them to tf32).
                DOT_PRECISION="ieee" if fp32 else "tf32", num_warps=num_warps, num_stages=num_stages)
    if atomic_dq is not None:
        meta.update(ATOMIC_DQ=atomic_dq, DQ_TMA=dq_tma)
    return meta, meta_key(meta)
