"""The split-KV merge of decode attention (flash-decoding's second step), in its own file
beside ``decode_attention.py``, which launches it.

Each (sequence, kv head) was cut into ``num_splits`` runs of keys; split s left a partial
output O_s (normalized over its own keys) and lse_s, the log2 of its sum of exponentials
(scores kept in base 2). The merged row is

    O = sum_s 2^(lse_s - m) O_s / sum_s 2^(lse_s - m),    m = max_s lse_s

where a split that saw no key has lse_s = -inf and weighs 0 (its O_s is never read).
"""

import triton
import triton.language as tl

from ._jit import cast_out


@triton.jit
def _merge_rows(ws_o_ptr, ws_lse_ptr, base, r, r_ok, num_splits, head_dim,
                GQ: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                CHUNK_S: tl.constexpr):
    """Rows r of one (b, kvh)'s split partials merged: (BLOCK_R, BLOCK_D) float32.

    The splits' log-sum-exps load as one (BLOCK_S, BLOCK_R) tile, then their partial outputs
    CHUNK_S splits at a time as a (CHUNK_S, BLOCK_R, D) tile. One split per iteration made
    the loop a chain of dependent L2 round trips: 33 splits (batch 1, 4K context, 8 kv
    heads) took ~15 us, for 70 KB.
    """
    sp = tl.arange(0, BLOCK_S)
    lse = tl.load(ws_lse_ptr + base + sp[:, None] * GQ + r[None, :], mask=(sp < num_splits)[:, None] & r_ok[None, :],
                  other=float("-inf"))
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)  # rows no split saw: weights all 0, output 0
    den = tl.sum(tl.exp2(lse - m[None, :]), axis=0)
    d = tl.arange(0, BLOCK_D)
    acc = tl.zeros((BLOCK_R, BLOCK_D), tl.float32)
    c = tl.arange(0, CHUNK_S)
    for s0 in range(0, num_splits, CHUNK_S):
        sc_ok = (s0 + c) < num_splits
        rows = base + (s0 + c)[:, None] * GQ + r[None, :]                      # (CHUNK_S, BLOCK_R)
        ok = sc_ok[:, None] & r_ok[None, :]
        lse_c = tl.load(ws_lse_ptr + rows, mask=ok, other=float("-inf"))
        w = tl.exp2(lse_c - m[None, :])
        # a row of a split that saw no key (lse = -inf) weighs 0, and its output is not read
        seen = ok & (lse_c > float("-inf"))
        o = tl.load(ws_o_ptr + rows[:, :, None] * head_dim + d[None, None, :],
                    mask=seen[:, :, None] & (d < head_dim)[None, None, :], other=0.0)  # (CHUNK_S, BLOCK_R, D)
        acc += tl.sum(w[:, :, None] * o, axis=0)
    return acc / tl.where(den > 0.0, den, 1.0)[:, None]


@triton.jit
def _merge_kernel(
    ws_o_ptr, ws_lse_ptr, o_ptr,       # workspace as written by _decode_kernel; out (B, Q_LEN, H, D)
    kv_heads, num_splits, head_dim,
    stride_ob, stride_os, stride_oh,
    GROUP: tl.constexpr, Q_LEN: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    CHUNK_S: tl.constexpr,             # splits whose partial outputs load as one tile
):
    # One program per BLOCK_R output rows of one (b, kvh).
    GQ: tl.constexpr = GROUP * Q_LEN
    n_rblocks: tl.constexpr = (GQ + BLOCK_R - 1) // BLOCK_R
    pid = tl.program_id(0)
    bk = pid // n_rblocks
    r = (pid % n_rblocks) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < GQ
    b = bk // kv_heads
    kvh = bk % kv_heads
    base = bk.to(tl.int64) * num_splits * GQ
    y = _merge_rows(ws_o_ptr, ws_lse_ptr, base, r, r_ok, num_splits, head_dim, GQ, BLOCK_S, BLOCK_R, BLOCK_D,
                    CHUNK_S)
    d = tl.arange(0, BLOCK_D)
    mask = r_ok[:, None] & (d < head_dim)[None, :]
    o_off = b.to(tl.int64) * stride_ob + (r // GROUP) * stride_os + (kvh * GROUP + r % GROUP) * stride_oh
    tl.store(o_ptr + o_off[:, None] + d[None, :], cast_out(y, o_ptr.dtype.element_ty), mask=mask)
