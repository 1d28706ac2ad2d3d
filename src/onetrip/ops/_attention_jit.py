"""The Triton kernel behind ``flash_attention``: one program per (query block, head, batch).

A program holds BLOCK_M query rows in registers and streams the keys and values of its
(sequence, kv head) in tiles of BLOCK_N, keeping the softmax online (Milakov & Gimelshein):

    m_new = max(m, rowmax(s))             running maximum, in log2 units
    p     = 2^(s - m_new)                 (BLOCK_M, BLOCK_N) float32, never written to memory
    l     = l * 2^(m - m_new) + rowsum(p)
    acc   = acc * 2^(m - m_new) + p @ v   (BLOCK_M, BLOCK_D) float32
    out   = acc / l,    lse = (m + log2 l) * ln 2

``s`` is the score already multiplied by softmax_scale * log2(e), so the exponentials are
exp2 (one MUFU instruction on a GPU, where exp is exp2 plus a multiply).

The key tiles a query block visits are split in three ranges (see ``_key_ranges``):

    [lo, full_lo)        left edge of a sliding window: masked tiles
    [full_lo, full_hi)   every (row, key) pair visible: no mask is built at all
    [full_hi, hi)        the causal diagonal / right window edge / ragged end: masked

Tiles outside [lo, hi) are masked for every row of the block and never loaded. The tile
body is one @triton.jit function specialized by the constexpr MASKED, so the unmasked
range compiles without the index comparisons and `where`s.

With USE_TMA (Hopper, dense layout; the launcher decides, see ``_attention_tma.py``) Q, K
and V arrive through 4-D tensor descriptors over (batch, seq, heads, head_dim) and O
leaves through one. The copy engine clips each dimension on its own: rows past the
sequence's end and head dims past HEAD_DIM read as zeros and are not written, exactly
what the pointer path's masks give, so masking and the results do not change.
"""

import triton
import triton.language as tl

from ._jit import cast_out, dot_f32, tanh

LOG2E = 1.4426950408889634  # folded into the scale on the host


@triton.jit
def _load_rows(base, desc, b, n0, head, offs_n, offs_d, stride_s, n_rows,
               HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, USE_TMA: tl.constexpr):
    """The (len(offs_n), BLOCK_D) tile of rows n0 + offs_n of one (batch, head) whose
    sequence has n_rows rows: through the descriptor (out-of-range rows and head dims are
    zeros) or masked pointer loads from ``base``, that sequence's row 0 of that head."""
    if USE_TMA:
        t = desc.load([b, n0, head, 0])  # (1, rows, 1, BLOCK_D)
        return t.reshape(t.shape[1], t.shape[3])
    else:
        mask = (offs_d < HEAD_DIM)[None, :]  # head dims padded to a power of two read zeros
        if MASKED:
            mask = mask & (n0 + offs_n < n_rows)[:, None]
        rows = (n0 + offs_n).to(tl.int64)[:, None]
        return tl.load(base + rows * stride_s + offs_d[None, :], mask=mask, other=0.0)


@triton.jit
def _key_ranges(m0, q_len, k_len, window_left, window_right,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """(lo, left_end, full_lo, full_hi, hi) of the query rows [m0, min(m0 + BLOCK_M, q_len)).

    Row i sees key j when  i + diag - left <= j <= i + diag + right,  diag = k_len - q_len
    (bottom-right alignment; an unbounded side has no test). lo, full_lo, full_hi are
    multiples of BLOCK_N; hi is the first key no row of the block sees (or k_len);
    left_end = min(full_lo, hi) ends the left range when the band is narrower than a tile.
    Every quantity is clamped to >= 0 before a division: integer division of a negative
    number rounds differently on a GPU (toward zero) and in the interpreter (numpy, down).
    """
    diag = k_len - q_len
    first = m0
    last = tl.minimum(m0 + BLOCK_M, q_len) - 1  # last real row; < first when the block is past the end
    lo = 0
    hi = k_len
    full_lo = 0
    full_hi = (k_len // BLOCK_N) * BLOCK_N
    if HAS_LEFT:
        lo = (tl.maximum(first + diag - window_left, 0) // BLOCK_N) * BLOCK_N
        full_lo = tl.cdiv(tl.maximum(last + diag - window_left, 0), BLOCK_N) * BLOCK_N
    if HAS_RIGHT:
        hi = tl.minimum(k_len, tl.maximum(last + diag + window_right + 1, 0))
        full_hi = (tl.minimum(k_len, tl.maximum(first + diag + window_right + 1, 0)) // BLOCK_N) * BLOCK_N
    hi = tl.where(last >= first, hi, 0)  # a block wholly past this sequence's end does nothing
    full_lo = tl.maximum(full_lo, lo)
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
    return lo, tl.minimum(full_lo, hi), full_lo, full_hi, hi


@triton.jit
def _attn_tile(acc, m_i, l_i, q, k_base, v_base, k_desc, v_desc, b, kh, n0, offs_m, offs_n, offs_d,
               k_len, diag, stride_ks, stride_vs, qk_scale, cap_in, cap_out, window_left, window_right,
               HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr):
    """One (BLOCK_N keys) step of the online softmax; returns the updated (acc, m_i, l_i)."""
    n = n0 + offs_n  # (BLOCK_N,) key index within the sequence
    k = _load_rows(k_base, k_desc, b, n0, kh, offs_n, offs_d, stride_ks, k_len, HEAD_DIM, MASKED, USE_TMA)
    v = _load_rows(v_base, v_desc, b, n0, kh, offs_n, offs_d, stride_vs, k_len, HEAD_DIM, MASKED, USE_TMA)
    s = dot_f32(q, tl.trans(k), DOT_PRECISION)  # (BLOCK_M, BLOCK_N) float32
    if HAS_SOFTCAP:  # cap * tanh(scale * qk / cap), in log2 units: cap_in = scale / cap, cap_out = cap * log2(e)
        s = cap_out * tanh(s * cap_in)
    else:
        s = s * qk_scale
    if MASKED:  # the softcap comes first: masking is applied to the capped scores
        ok = (n < k_len)[None, :]
        if HAS_RIGHT:
            ok = ok & (n[None, :] <= offs_m[:, None] + diag + window_right)
        if HAS_LEFT:
            ok = ok & (n[None, :] >= offs_m[:, None] + diag - window_left)
        s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row with no visible key yet has m_new = -inf; subtracting it would give
    # -inf - (-inf) = NaN. Subtracting 0 instead keeps p = 2^-inf = 0 and alpha = 0.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    # p is rounded to v's dtype for the tensor-core product (values in [0, 1]; the row sum
    # l above uses the unrounded p). cast_out: the interpreter's own bf16 cast truncates.
    # Triton folds the add into the MMA's accumulator: the PTX is the same as that of
    # tl.dot(p, v, acc * alpha) (Triton 3.6, sm_90a, both paths), which the interpreter lacks.
    acc = acc * alpha[:, None] + dot_f32(cast_out(p, v.dtype), v, DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q, o: (B, Sq, H, D) or (Tq, H, D); k, v: kv heads; lse: fp32
    q_desc, k_desc, v_desc, o_desc,       # USE_TMA: descriptors of the same tensors (else None)
    cu_q_ptr, cu_k_ptr,                   # (B + 1,) int32 prefix sums of the lengths (varlen only)
    seqlen_q, seqlen_k, group,            # dense lengths; group = H // kv_heads
    stride_qb, stride_qs, stride_qh,      # batch strides are 0 for varlen (tokens are packed)
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,                 # lse: (B, H, Sq) or (H, Tq), unit stride along tokens
    qk_scale, cap_in, cap_out, window_left, window_right,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    # Constexpr so that the dense path has no cu_seqlens loads, an unbounded window side no
    # comparisons, and no softcap no tanh: each combination compiles to its own lean kernel.
    IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, STORE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,  # Q, K, V and O through tensor descriptors (the launcher checks it may)
):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    if IS_VARLEN:
        q_start = tl.load(cu_q_ptr + b).to(tl.int64)  # a token's offset passes 2**31 elements
        q_len = (tl.load(cu_q_ptr + b + 1) - tl.load(cu_q_ptr + b))
        k_start = tl.load(cu_k_ptr + b).to(tl.int64)
        k_len = (tl.load(cu_k_ptr + b + 1) - tl.load(cu_k_ptr + b))
    else:
        q_start = 0
        q_len = seqlen_q
        k_start = 0
        k_len = seqlen_k
    diag = k_len - q_len
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    # 64-bit offsets: batch * stride and token * stride pass 2**31 elements past 4 GiB.
    b64 = b.to(tl.int64)
    kh = (h // group).to(tl.int64)  # GQA/MQA: query head h reads kv head h // group, no copy
    q_base = q_ptr + b64 * stride_qb + h.to(tl.int64) * stride_qh + q_start * stride_qs
    o_base = o_ptr + b64 * stride_ob + h.to(tl.int64) * stride_oh + q_start * stride_os
    k_base = k_ptr + b64 * stride_kb + kh * stride_kh + k_start * stride_ks
    v_base = v_ptr + b64 * stride_vb + kh * stride_vh + k_start * stride_vs
    row_ok = offs_m < q_len
    qo_mask = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    m64 = offs_m.to(tl.int64)[:, None]
    kh32 = h // group  # the descriptors' coordinates are int32
    q = _load_rows(q_base, q_desc, b, m0, h, tl.arange(0, BLOCK_M), offs_d, stride_qs, q_len,
                   HEAD_DIM, True, USE_TMA)  # (BLOCK_M, BLOCK_D)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    lo, left_end, full_lo, full_hi, hi = _key_ranges(m0, q_len, k_len, window_left, window_right,
                                                     BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    for n0 in range(lo, left_end, BLOCK_N):  # left window edge
        acc, m_i, l_i = _attn_tile(acc, m_i, l_i, q, k_base, v_base, k_desc, v_desc, b, kh32, n0, offs_m, offs_n,
                                   offs_d, k_len, diag, stride_ks, stride_vs, qk_scale, cap_in, cap_out,
                                   window_left, window_right, HEAD_DIM, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                                   DOT_PRECISION, USE_TMA)
    for n0 in range(full_lo, full_hi, BLOCK_N):  # interior: no mask
        acc, m_i, l_i = _attn_tile(acc, m_i, l_i, q, k_base, v_base, k_desc, v_desc, b, kh32, n0, offs_m, offs_n,
                                   offs_d, k_len, diag, stride_ks, stride_vs, qk_scale, cap_in, cap_out,
                                   window_left, window_right, HEAD_DIM, False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                                   DOT_PRECISION, USE_TMA)
    for n0 in range(full_hi, hi, BLOCK_N):  # diagonal, right window edge, ragged last tile
        acc, m_i, l_i = _attn_tile(acc, m_i, l_i, q, k_base, v_base, k_desc, v_desc, b, kh32, n0, offs_m, offs_n,
                                   offs_d, k_len, diag, stride_ks, stride_vs, qk_scale, cap_in, cap_out,
                                   window_left, window_right, HEAD_DIM, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                                   DOT_PRECISION, USE_TMA)

    # A row that saw no key has l = 0 and acc = 0: it stores zeros and lse = -inf, not NaN.
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    if USE_TMA:  # rows past seq_q and head dims past HEAD_DIM are clipped by the copy engine
        o_desc.store([b, m0, h, 0], cast_out(out, o_ptr.dtype.element_ty).reshape(1, BLOCK_M, 1, BLOCK_D))
    else:
        tl.store(o_base + m64 * stride_os + offs_d[None, :], cast_out(out, o_ptr.dtype.element_ty), mask=qo_mask)
    if STORE_LSE:
        lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        lse_ptrs = lse_ptr + b64 * stride_lb + h.to(tl.int64) * stride_lh + q_start + offs_m
        tl.store(lse_ptrs, lse, mask=row_ok)
