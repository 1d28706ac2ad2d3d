"""append_attention + the output projection + the residual add, one launch (batch 1, one token).

For the one new token of one sequence with L tokens cached before it, at position L:

    q <- rope(q, L);  k_cache[L] <- rope(k, L);  v_cache[L] <- v
    o = attention of q over keys 0..L                  (heads, head_dim); GQA
    h = o.flatten() @ W_o^T + residual                 (N,), rounded once to the dtype
    ss[r] = sum of h^2 over program row r's columns    for the next GEMV's RMSNorm

which is ``append_attention`` then ``gemv_add_residual`` (the pair the batch-1 engine step
runs, ``models.fused``), with ``ss`` as gemv_add_residual's partials so that
``gemv_rms_norm`` takes them as they are.

Why: at a batch-1 decode step the attention kernel is a chain of dependent loads (length
-> q, k, v and the rotary tables -> the cached tiles) on 8 programs (Llama-3.2-1B: 5.1 us a
layer on an H200 for ~0.3 MB), and the o GEMV after it reads 8.4 MB in 4.5 us where the
bytes alone take 2.0. Here the o weight is read by the same programs, and its first chunk
is put in flight before anything else (the weight does not depend on the previous
kernel): the chain of the attention runs while the weight arrives, and a kernel boundary
is gone.

How: a program per (block of ``rows`` output columns, kv head): cdiv(N, rows) x kv_heads
programs. Each computes its kv head's attention in full (the others of its column blocks
compute the same: the cached K/V of one head is read cdiv(N, rows) times, from L2 after
the first), multiplies the head group's (group x head_dim) slice of o into its (rows,
group x head_dim) block of W_o, and writes that float32 partial to a workspace. The
kv_heads programs of a column block take a ticket when done; the last sums the partials
in head order (so the result does not depend on which finished last), adds the residual,
stores h and its sum of squares, and re-arms the ticket. Nobody waits. Only column block
0 writes the new k, v into the cache; the cached range read is [0, L), so no program reads
a slot that another writes.

The redundancy bounds it to short caches: the engine takes it where the cache holds at
most ``ATTENTION_O_MAX_SEQ`` slots (``models.fused``). The unfused reference is the pair,
op by op: ``append_attention_o_ref``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._common import call_op, check_dtype_match, check_same_device, check_tensor, pdl_args, \
    sm_count, use_triton
from ._decode_append import _cache_slot, _new_kv, _rope_rows
from ._jit import cast_out, gdc_launch_dependents, gdc_wait
from ._kv_checks import _check_args
from .append_attention import append_attention_ref
from .append_kv import _check_new_kv
from .decode_attention import LOG2E, _attend_tile, _kv_tile

# Caches up to this many slots take attention_o in the batch-1 engine step (models.fused).
ATTENTION_O_MAX_SEQ = 2048


@triton.jit
def _w_chunk(w_ptr, row0, row_end, rr, cols, col_ok, stride_wn):
    """The (BLOCK_R, BLOCK_G, BLOCK_D) block of W_o: output rows row0 + rr (below row_end),
    the head group's columns ``cols`` (BLOCK_G, BLOCK_D)."""
    rows = row0 + rr
    ok = rows < row_end
    ptr = w_ptr + rows.to(tl.int64)[:, None, None] * stride_wn + cols[None, :, :]
    return tl.load(ptr, mask=ok[:, None, None] & col_ok[None, :, :], other=0.0)


@triton.jit
def _attention_o_kernel(
    q_ptr, kn_ptr, vn_ptr,              # the new token: q (H, D), k, v (KVH, D) rows (batch 1, q_len 1)
    k_ptr, v_ptr, seqlens_ptr, table_ptr,  # caches (blocks, block_size, KVH, D); (1,) int32; (1, max_blocks) paged
    cos_ptr, sin_ptr,                   # rotary tables (max_pos, half)
    w_ptr, res_ptr, h_ptr, ss_ptr,      # W_o (N, H * D); residual, h (N,); ss (grid rows,) float32
    ws_ptr, sync_ptr,                   # partials (KVH, N) of ACC; tickets (grid rows,) int32, zero between launches
    N, kv_heads, head_dim, half,
    stride_qh, stride_knh, stride_vnh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_tb,
    stride_cos, stride_sin, stride_wn,
    qk_scale,
    GROUP: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, INTERLEAVED: tl.constexpr,
    PRECISION: tl.constexpr,            # "ieee" for float32 (no TF32), else "tf32"
    BLOCK_M: tl.constexpr,              # query rows: GROUP padded to 16 for tl.dot
    BLOCK_N: tl.constexpr,              # keys a tile
    BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_H: tl.constexpr,
    ROWS: tl.constexpr,                 # W_o rows (output columns) a program
    BLOCK_R: tl.constexpr,              # W_o rows a chunk; ROWS // BLOCK_R chunks
    EARLY: tl.constexpr,                # the first chunk loaded before the attention (and the PDL wait)
    ACC: tl.constexpr,                  # the products' dtype: float32, float64 for float32 inputs
    PDL: tl.constexpr = 0,              # programmatic dependent launch (_common.pdl_mode)
    TRIGGER: tl.constexpr = 0,          # PDL: let the next kernel be placed 0 at exit, 1 at start, 2 after attention
):
    r = tl.program_id(0)
    kvh = tl.program_id(1)
    row0 = r * ROWS
    row_end = tl.minimum(row0 + ROWS, N)
    rr = tl.arange(0, BLOCK_R)
    gi = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    cols = (kvh * GROUP + gi)[:, None] * head_dim + d[None, :]  # (BLOCK_G, BLOCK_D): head group's o columns
    col_ok = (gi < GROUP)[:, None] & d_ok[None, :]
    if PDL > 0 and TRIGGER == 1:
        gdc_launch_dependents()
    if EARLY:  # W_o never depends on the previous kernel: in flight before its wait
        w_first = _w_chunk(w_ptr, row0, row_end, rr, cols, col_ok, stride_wn)
    if PDL > 0:
        gdc_wait()

    # -- attention of this kv head (decode_attention._decode_kernel, one split, q_len 1)
    L_cached = tl.load(seqlens_ptr)
    L = L_cached + 1
    m = tl.arange(0, BLOCK_M)  # query row = head kvh * GROUP + m
    row_ok = m < GROUP
    qpos = L_cached + m * 0
    q = cast_out(_rope_rows(q_ptr, (kvh * GROUP + m) * stride_qh, row_ok, qpos, d, head_dim, cos_ptr, sin_ptr, half,
                            stride_cos, stride_sin, INTERLEAVED), q_ptr.dtype.element_ty)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    zero = r * 0
    k, v, j, j_ok = _new_kv(kn_ptr, vn_ptr, k_ptr, v_ptr, table_ptr, zero, kvh, L, d, cos_ptr, sin_ptr, half,
                            stride_cos, stride_sin, 0, 0, stride_knh, 0, 0, stride_vnh, stride_kb, stride_ks, stride_kh,
                            stride_vb, stride_vs, stride_vh, stride_tb, head_dim, (r == 0).to(tl.int32), 1,
                            INTERLEAVED, PAGED, PAGE_SIZE, 16)
    m_i, l_i, acc = _attend_tile(q, k, v, j, j_ok, qpos, m_i, l_i, acc, qk_scale, 0.0, 0, False, False, PRECISION)
    for n0 in range(0, L_cached, BLOCK_N):
        jc = n0 + tl.arange(0, BLOCK_N)
        jc_ok = jc < L_cached
        blk, slot = _cache_slot(table_ptr, zero, jc, jc_ok, stride_tb, PAGED, PAGE_SIZE)
        kt, vt = _kv_tile(k_ptr, v_ptr, blk, slot, jc_ok, kvh, d, d_ok, stride_kb, stride_ks, stride_kh,
                          stride_vb, stride_vs, stride_vh)
        m_i, l_i, acc = _attend_tile(q, kt, vt, jc, jc_ok, qpos, m_i, l_i, acc, qk_scale, 0.0, 0, False, False,
                                     PRECISION)
    o = tl.where(row_ok[:, None], acc / l_i[:, None], 0.0)  # l_i >= 1: the new key is always visible
    # rows past GROUP are 0, so folding BLOCK_M rows onto BLOCK_G keeps rows 0..GROUP-1 as they are
    o_g = tl.sum(tl.reshape(o, (BLOCK_M // BLOCK_G, BLOCK_G, BLOCK_D)), axis=0).to(ACC)  # (BLOCK_G, BLOCK_D)
    if PDL > 0 and TRIGGER == 2:
        gdc_launch_dependents()

    # -- this program's partial of o @ W_o^T over its head group's columns
    for c in tl.static_range(ROWS // BLOCK_R):
        if c == 0 and EARLY:
            w = w_first
        else:
            w = _w_chunk(w_ptr, row0 + c * BLOCK_R, row_end, rr, cols, col_ok, stride_wn)
        part = tl.sum(tl.sum(w.to(ACC) * o_g[None, :, :], axis=2), axis=1)  # (BLOCK_R,)
        rows = row0 + c * BLOCK_R + rr
        tl.store(ws_ptr + kvh.to(tl.int64) * N + rows, part, mask=rows < row_end)

    # -- the last of the column block's kv_heads programs: sum in head order, residual, h, ss
    tl.debug_barrier()  # every thread's partials stored before the ticket releases them
    ticket = tl.atomic_add(sync_ptr + r, 1, sem="acq_rel")
    if ticket == kv_heads - 1:
        tl.debug_barrier()
        hh = tl.arange(0, BLOCK_H)
        ss = 0.0
        for c in tl.static_range(ROWS // BLOCK_R):
            rows = row0 + c * BLOCK_R + rr
            ok = rows < row_end
            parts = tl.load(ws_ptr + hh.to(tl.int64)[:, None] * N + rows[None, :],
                            mask=(hh < kv_heads)[:, None] & ok[None, :], other=0.0, cache_modifier=".cg")
            y = tl.sum(parts, axis=0) + tl.load(res_ptr + rows, mask=ok, other=0.0).to(ACC)
            if ACC == tl.float64:  # float32 h: one rounding from the float64 sum
                h = y.to(h_ptr.dtype.element_ty)
            else:
                h = cast_out(y, h_ptr.dtype.element_ty)
            tl.store(h_ptr + rows, h, mask=ok)
            hf = tl.where(ok, h.to(tl.float32), 0.0)  # of the rounded h, as the unfused norm sees it
            ss += tl.sum(hf * hf, axis=0)
        tl.store(ss_ptr + r, ss)
        tl.atomic_xchg(sync_ptr + r, 0)  # re-armed for the next launch


@dataclass(frozen=True)
class AttentionOConfig:
    """Launch shape: ``rows`` W_o rows (output columns) a program, in chunks of ``block_r``
    (the first loaded before the attention when ``early``); keys in tiles of ``block_n``;
    ``trigger``: under PDL, when the next kernel may be placed (0 at exit, 1 at start, 2
    after the attention)."""

    rows: int
    block_r: int
    block_n: int = 64
    num_warps: int = 8
    early: bool = True
    trigger: int = 0


def attention_o_config(n: int, kv_heads: int, group: int, head_dim: int, device: torch.device) -> AttentionOConfig:
    """About one program an SM (cdiv(N, rows) x kv_heads), and chunks of at most 32K weight
    elements (64 registers a thread at 8 warps in 16-bit): Llama-3.2-1B (N 2048, 8 kv heads,
    group 4 x 64) 16 x 8 programs of 128 rows in one chunk; Llama-3.1-8B (4096, 8, 4 x 128)
    16 x 8 of 256 rows in 4 chunks."""
    rows = max(1, triton.next_power_of_2(triton.cdiv(n * kv_heads, sm_count(device))))
    rows = min(rows, triton.next_power_of_2(n))
    block_gd = triton.next_power_of_2(group) * max(16, triton.next_power_of_2(head_dim))
    block_r = max(1, min(rows, 32768 // block_gd))
    return AttentionOConfig(rows, block_r)


def _sync(device: torch.device, n: int) -> torch.Tensor:
    """The tickets: int32 zeros that the kernel re-arms, kept per device. Created outside
    a graph capture where it can be (an engine warms up first); inside one, a captured
    zeros for this call."""
    buf = _SYNC.get(device)
    if buf is None or buf.numel() < n:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return torch.zeros(n, dtype=torch.int32, device=device)
        buf = _SYNC[device] = torch.zeros(max(n, 256), dtype=torch.int32, device=device)
    return buf


_SYNC: dict = {}


def _launch(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, weight, residual, h, ss, block_table,
            interleaved: bool, softmax_scale: float, config: Optional[AttentionOConfig] = None):
    """Launch on checked tensors: q (1, 1, H, D), k, v (1, 1, KVH, D) with unit stride along
    D; weight (N, H * D); residual, h (1, N); ss (cdiv(N, rows),) float32. Returns the
    compiled kernel."""
    _, _, H, D = q.shape
    KVH = k_cache.shape[2]
    group = H // KVH
    N = weight.shape[0]
    cfg = config or attention_o_config(N, KVH, group, D, q.device)
    grid_rows = triton.cdiv(N, cfg.rows)
    if ss.numel() != grid_rows:
        raise ValueError(f"ss has {ss.numel()} partials; this config writes {grid_rows}")
    if cfg.rows % cfg.block_r:
        raise ValueError(f"config.rows={cfg.rows} must be a multiple of config.block_r={cfg.block_r}")
    paged = block_table is not None
    acc = tl.float64 if q.dtype == torch.float32 else tl.float32
    ws = torch.empty((KVH, N), dtype=torch.float64 if acc == tl.float64 else torch.float32, device=q.device)
    sync = _sync(q.device, grid_rows)
    block_d = max(16, triton.next_power_of_2(D))
    pdl = pdl_args(q)
    if pdl:
        pdl["TRIGGER"] = cfg.trigger
    return _attention_o_kernel[(grid_rows, KVH)](
        q, k, v, k_cache, v_cache, cache_seqlens, block_table if paged else cache_seqlens, cos, sin,
        weight, residual, h, ss, ws, sync,
        N, KVH, D, cos.shape[1],
        q.stride(2), k.stride(2), v.stride(2),
        *k_cache.stride()[:3], *v_cache.stride()[:3], block_table.stride(0) if paged else 0,
        cos.stride(0), sin.stride(0), weight.stride(0),
        softmax_scale * LOG2E,
        GROUP=group, PAGED=paged, PAGE_SIZE=k_cache.shape[1] if paged else 1, INTERLEAVED=interleaved,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_N=cfg.block_n, BLOCK_D=block_d,
        BLOCK_G=triton.next_power_of_2(group), BLOCK_H=triton.next_power_of_2(KVH),
        ROWS=cfg.rows, BLOCK_R=cfg.block_r, EARLY=cfg.early, ACC=acc,
        num_warps=cfg.num_warps, **pdl,
    )


@torch.library.custom_op("onetrip::append_attention_o", mutates_args=("k_cache", "v_cache", "h", "ss"))
def _attention_o_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    cache_seqlens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, weight: torch.Tensor,
                    residual: torch.Tensor, block_table: Optional[torch.Tensor], h: torch.Tensor, ss: torch.Tensor,
                    interleaved: bool, softmax_scale: float) -> None:
    if use_triton(q):
        _launch(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, weight, residual, h, ss, block_table, interleaved,
                softmax_scale)
        return
    # CPU without the interpreter: the pair in float32, h rounded once; ss as one partial.
    hv, kc, vc = append_attention_o_ref(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, weight, residual,
                                        block_table, interleaved, softmax_scale, acc=torch.float32)
    k_cache.copy_(kc)
    v_cache.copy_(vc)
    h.copy_(hv)
    ss.zero_()
    ss[0] = h.float().square().sum()


@_attention_o_op.register_fake
def _(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, weight, residual, block_table, h, ss, interleaved,
      softmax_scale):
    return None


def partials(n: int, kv_heads: int, group: int, head_dim: int, device: torch.device) -> int:
    """How many sums of squares ``append_attention_o`` writes for N output columns."""
    return triton.cdiv(n, attention_o_config(n, kv_heads, group, head_dim, device).rows)


def append_attention_o(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    *,
    block_table: Optional[torch.Tensor] = None,
    interleaved: bool = False,
    softmax_scale: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode token of one sequence: rope + cache append + attention + o projection +
    residual add, in one launch (module docstring).

    Args:
        q: (1, 1, heads, head_dim) float16, bfloat16 or float32 (read only: rotated in
            registers). k, v: (1, 1, kv_heads, head_dim) of q's dtype, not yet rotated.
        k_cache, v_cache, block_table, cache_seqlens (length BEFORE this token), cos, sin,
            interleaved, softmax_scale: as ``append_attention`` (no window, no softcap).
        weight: W_o (N, heads * head_dim) of q's dtype, as nn.Linear stores it (no bias).
        residual: one row of N values, q's dtype.

    Returns:
        (h (1, N), ss (P,) float32): h = attention @ weight^T + residual, and P partial sums
        of h^2 that ``gemv_rms_norm`` reads (P = ``partials(...)``). cache_seqlens is not
        updated. No host synchronisation, a workspace sized from shapes: capturable.
    """
    softmax_scale = _check_args(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, (-1, -1), 0.0, None)
    B, Q, H, D = q.shape
    if B != 1 or Q != 1:
        raise ValueError(f"q has shape {tuple(q.shape)}; append_attention_o takes one token of one sequence "
                         f"(1, 1, heads, head_dim)")
    cos, sin = _check_new_kv(q, k, v, k_cache, cos, sin)
    check_tensor("weight", weight)
    if weight.dim() != 2 or weight.shape[1] != H * D or weight.stride(1) != 1:
        raise ValueError(f"weight has shape {tuple(weight.shape)} (strides {weight.stride()}); expected "
                         f"(N, {H * D}) = (N, heads * head_dim) with unit column stride, as nn.Linear stores it")
    check_dtype_match("weight", weight, "q", q)
    n = weight.shape[0]
    check_tensor("residual", residual)
    check_dtype_match("residual", residual, "q", q)
    if residual.numel() != n:
        raise ValueError(f"residual has shape {tuple(residual.shape)}; expected one row of {n} values")
    check_same_device("q", q, weight=weight, residual=residual)
    res = residual.reshape(1, n).contiguous()
    rows = [t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v)]
    kvh = k_cache.shape[2]
    h = torch.empty((1, n), dtype=q.dtype, device=q.device)
    ss = torch.empty((partials(n, kvh, H // kvh, D, q.device),), dtype=torch.float32, device=q.device)
    call_op(_attention_o_op, *rows, k_cache, v_cache, cache_seqlens, cos, sin, weight, res, block_table, h, ss,
            bool(interleaved), float(softmax_scale))
    return h, ss


def append_attention_o_ref(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, weight, residual, block_table=None,
                           interleaved=False, softmax_scale=None, acc: Optional[torch.dtype] = None):
    """Unfused, op by op: ``append_attention_ref``, then the output projection and the
    residual add. ``acc``: compute in that dtype (rounding h once to q's) instead of q's.
    Returns (h (1, N), k_cache, v_cache), new tensors; the inputs are not modified."""
    dt = q.dtype
    if acc is not None:
        q, k, v, k_cache, v_cache, cos, sin, weight, residual = (
            t.to(acc) for t in (q, k, v, k_cache, v_cache, cos, sin, weight, residual))
    o, kc, vc = append_attention_ref(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, block_table, interleaved,
                                     softmax_scale)
    h = F.linear(o.reshape(1, -1), weight) + residual.reshape(1, -1)
    return h.to(dt), kc.to(dt), vc.to(dt)
