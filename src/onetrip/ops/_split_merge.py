"""The split-KV merge of decode attention (flash-decoding's second step), launched by
``_decode_launch.launch`` after the attention kernel. A second launch, because merging
inside the attention kernel (by the last split of each (sequence, kv head) to finish) is
slower on an H200, and launching this merge under PDL while the attention kernel runs
times the same as launching it after.

Each (sequence, kv head) is cut into ``num_splits`` runs of keys; split s leaves a partial
output O_s (normalized over its own keys) and lse_s, the log2 of its sum of exponentials
(scores kept in base 2). The merged row is

    O = sum_s 2^(lse_s - m) O_s / sum_s 2^(lse_s - m),    m = max_s lse_s

where a split that saw no key has lse_s = -inf and weighs 0 (its O_s is not written and
never read).
"""

import triton
import triton.language as tl

from ._jit import cast_out


@triton.jit
def _merge_rows(ws_o_ptr, ws_lse_ptr, base, r, r_ok, d, num_splits, head_dim,
                GQ: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_DS: tl.constexpr, CHUNK_S: tl.constexpr):
    """Rows r, dims d (a slice of head_dim, (BLOCK_DS,)) of one (b, kvh)'s split partials
    merged: (BLOCK_R, BLOCK_DS) float32.

    CHUNK_S splits at a time, as an online softmax over splits: each chunk's lse_s
    (CHUNK_S, BLOCK_R) and O_s (CHUNK_S, BLOCK_R, D) load together, so a merge of up to
    CHUNK_S splits is one L2 round trip. On an H200 (batch 1 x 4K, 8 kv heads, 8 splits)
    the merge takes 2.8 us so, 3.4 us in two round trips (the lse first, for m, then the
    outputs); one split per iteration, a chain of round trips, took ~15 us for 33 splits.
    """
    c = tl.arange(0, CHUNK_S)
    m = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    den = tl.zeros((BLOCK_R,), tl.float32)
    acc = tl.zeros((BLOCK_R, BLOCK_DS), tl.float32)
    for s0 in range(0, num_splits, CHUNK_S):
        rows = base + (s0 + c)[:, None] * GQ + r[None, :]                       # (CHUNK_S, BLOCK_R)
        ok = ((s0 + c) < num_splits)[:, None] & r_ok[None, :]
        lse = tl.load(ws_lse_ptr + rows, mask=ok, other=float("-inf"))
        # Loaded whatever lse says (in bounds: the workspace holds every split's rows), so
        # it need not wait for lse; an unwritten O_s may be anything, NaN included, and is
        # dropped by the tl.where below, never multiplied.
        o = tl.load(ws_o_ptr + rows[:, :, None] * head_dim + d[None, None, :],
                    mask=ok[:, :, None] & (d < head_dim)[None, None, :], other=0.0)  # (CHUNK_S, BLOCK_R, D)
        m_new = tl.maximum(m, tl.max(lse, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows no split saw yet
        alpha = tl.exp2(m - m_safe)
        w = tl.exp2(lse - m_safe[None, :])                     # 0 where lse = -inf
        den = den * alpha + tl.sum(w, axis=0)
        wo = tl.where((lse > float("-inf"))[:, :, None], w[:, :, None] * o, 0.0)
        acc = acc * alpha[:, None] + tl.sum(wo, axis=0)
        m = m_new
    return acc / tl.where(den > 0.0, den, 1.0)[:, None]      # rows no split saw: 0


@triton.jit
def _store_rows(o_ptr, y, b, kvh, r, r_ok, d, head_dim, stride_ob, stride_os, stride_oh, GROUP: tl.constexpr):
    """Merged rows r = (query i, head kvh * GROUP + g), dims d, of sequence b into out (B, Q_LEN, H, D)."""
    mask = r_ok[:, None] & (d < head_dim)[None, :]
    o_off = b.to(tl.int64) * stride_ob + (r // GROUP) * stride_os + (kvh * GROUP + r % GROUP) * stride_oh
    tl.store(o_ptr + o_off[:, None] + d[None, :], cast_out(y, o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _merge_kernel(
    ws_o_ptr, ws_lse_ptr, o_ptr,       # workspace as written by _decode_kernel; out (B, Q_LEN, H, D)
    kv_heads, num_splits, head_dim,
    stride_ob, stride_os, stride_oh,
    GROUP: tl.constexpr, Q_LEN: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    CHUNK_S: tl.constexpr,             # splits whose partial outputs load as one tile
    BLOCK_DS: tl.constexpr = 0,        # head_dim in slices of this many (0: whole), a program each
):
    # One program per BLOCK_R output rows of one (b, kvh), and per slice of head_dim: many
    # splits (tens, each a few key tiles) merge in more programs, each in one L2 round trip.
    GQ: tl.constexpr = GROUP * Q_LEN
    DS: tl.constexpr = BLOCK_D if BLOCK_DS == 0 else BLOCK_DS
    n_rblocks: tl.constexpr = (GQ + BLOCK_R - 1) // BLOCK_R
    n_dslices: tl.constexpr = BLOCK_D // DS
    pid = tl.program_id(0)
    dsl = pid % n_dslices
    bk = pid // (n_rblocks * n_dslices)
    r = (pid // n_dslices % n_rblocks) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < GQ
    d = dsl * DS + tl.arange(0, DS)
    base = bk.to(tl.int64) * num_splits * GQ
    y = _merge_rows(ws_o_ptr, ws_lse_ptr, base, r, r_ok, d, num_splits, head_dim, GQ, BLOCK_R, DS, CHUNK_S)
    _store_rows(o_ptr, y, bk // kv_heads, bk % kv_heads, r, r_ok, d, head_dim, stride_ob, stride_os, stride_oh,
                GROUP)
