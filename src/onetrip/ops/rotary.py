"""Rotary position embedding (RoPE) of q and k in one pass.

Each pair (x1, x2) of a head is rotated by the angle theta_i * position of its token:

    out1 = x1 cos - x2 sin,    out2 = x2 cos + x1 sin

The unfused Hugging Face form (``apply_rotary_ref``), ``q * cos + rotate_half(q) * sin``,
launches 5 kernels per tensor (neg, cat, mul, mul, add; a 6th cat re-attaches the
pass-through dims of partial rotary), so 10-12 for q and k, plus ~6 gathers, casts and
cats of the cos/sin rows. For a tensor of N elements it moves read N/2 + write N/2 (neg)
+ 2N (cat) + 2N + 2N (muls) + 3N (add) = 10N elements over HBM. The fused kernel reads
q and k once and writes them once (2N each), plus one compact cos and one sin row per
token (2 x rot/2 floats, shared by all of the token's heads): 5x less traffic, in one
launch instead of ~18. In place, the pass-through dims are not touched at all.

The backward is the rotation by -theta (``INVERSE``: the same kernel with sin negated),
dq1 = g1 cos + g2 sin, dq2 = g2 cos - g1 sin, the pass-through dims of the upstream
gradient copied: the forward's bytes, read the gradients of q_out and k_out, write dq and dk.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import (call_op, cdiv, check_dtype_match, check_no_out, check_same_device, check_shape, check_tensor,
                      empty_as, heads_view, needs_grad, next_pow2, output_like, pdl_kwargs, pdl_on, sm_count,
                      use_triton)
from ._jit import pdl_start
from ._launch import launch, meta_key
from ._rotary_jit import cos_sin_rows, head_rows, load_pair, load_tail, rotate_heads, store_pair, store_tail

POSITION_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr,  # (B, S, heads, D) and (B, S, kv_heads, D), unit stride along D
    cos_ptr, sin_ptr,  # (max_pos, half), unit column stride
    pos_ptr,  # (n_pos,) int32/int64 with n_pos = S or B * S; unused without HAS_POS
    n_tokens, seq, n_pos, q_heads, k_heads, half, tail,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_qob, stride_qos, stride_qoh, stride_kob, stride_kos, stride_koh,
    stride_cos, stride_sin,
    INTERLEAVED: tl.constexpr, HAS_POS: tl.constexpr, COPY_TAIL: tl.constexpr, MERGE_QK: tl.constexpr,
    TOK64: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr,
    INVERSE: tl.constexpr = False,  # rotate by -theta (sin negated): the backward
    PDL: tl.constexpr = 0,  # programmatic dependent launch (_common.pdl_mode says why)
):
    pdl_start(PDL)
    # Token indices in 32 bits unless n_tokens + BLOCK_T reaches 2**31 (TOK64): the 64-bit
    # divisions took the partial-rotary tile from 80 to 97 registers on sm_90a (3 -> 2
    # programs per SM). Offsets are 64-bit: b * stride exceeds 2**31 elements over 4 GiB.
    pid = tl.program_id(0)
    if TOK64:
        pid = pid.to(tl.int64)
    tok = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    tok_ok = tok < n_tokens
    b = (tok // seq).to(tl.int64)
    s = (tok % seq).to(tl.int64)
    if HAS_POS:
        pos = tl.load(pos_ptr + tok % n_pos, mask=tok_ok, other=0).to(tl.int64)
    else:
        pos = s
    q_src, q_dst = b * stride_qb + s * stride_qs, b * stride_qob + s * stride_qos
    k_src, k_dst = b * stride_kb + s * stride_ks, b * stride_kob + s * stride_kos
    if MERGE_QK:
        # One loop over chunks of BLOCK_H q heads and BLOCK_HK k heads, every load of a chunk
        # (q and k, rotated pairs and pass-through dims) issued before its first store: one
        # trip to memory per chunk, not one per tensor and part. Stores do not block, but a
        # load after a store that may alias it cannot be hoisted above it by the compiler.
        n_chunks = tl.maximum(tl.cdiv(q_heads, BLOCK_H), tl.cdiv(k_heads, BLOCK_HK))
        for c in range(0, n_chunks):
            qs, q_ok = head_rows(q_ptr, q_src, tok_ok, stride_qh, q_heads, c * BLOCK_H, BLOCK_H)
            ks, k_ok = head_rows(k_ptr, k_src, tok_ok, stride_kh, k_heads, c * BLOCK_HK, BLOCK_HK)
            qd, _ = head_rows(qo_ptr, q_dst, tok_ok, stride_qoh, q_heads, c * BLOCK_H, BLOCK_H)
            kd, _ = head_rows(ko_ptr, k_dst, tok_ok, stride_koh, k_heads, c * BLOCK_HK, BLOCK_HK)
            q1, q2 = load_pair(qs, q_ok, half, INTERLEAVED, BLOCK_HALF)
            k1, k2 = load_pair(ks, k_ok, half, INTERLEAVED, BLOCK_HALF)
            if COPY_TAIL:
                q_tail = load_tail(qs, q_ok, half, tail, BLOCK_TAIL)
                k_tail = load_tail(ks, k_ok, half, tail, BLOCK_TAIL)
            # The rows after q and k's loads: when their layout differs from the tiles' (Qwen-
            # 0.5B's 8 tokens x 32 pairs at 8 warps), a shared-memory exchange waits for them,
            # and issued first it held back q and k's loads by a whole trip to memory.
            cos, sin = cos_sin_rows(cos_ptr, sin_ptr, pos, tok_ok, half, stride_cos, stride_sin, BLOCK_HALF, INVERSE)
            store_pair(qd, q_ok, half, q1, q2, cos, sin, INTERLEAVED, BLOCK_HALF)
            store_pair(kd, k_ok, half, k1, k2, cos, sin, INTERLEAVED, BLOCK_HALF)
            if COPY_TAIL:
                store_tail(qd, q_ok, half, tail, q_tail, BLOCK_TAIL)
                store_tail(kd, k_ok, half, tail, k_tail, BLOCK_TAIL)
    else:  # q's chunks, then k's: two or more trips to memory (four with a tail, and one
        # more first for Qwen-0.5B's tile, whose cos/sin rows go through shared memory)
        cos, sin = cos_sin_rows(cos_ptr, sin_ptr, pos, tok_ok, half, stride_cos, stride_sin, BLOCK_HALF, INVERSE)
        rotate_heads(q_ptr, qo_ptr, q_src, q_dst, tok_ok, stride_qh, stride_qoh, q_heads, half, tail, cos, sin,
                     INTERLEAVED, COPY_TAIL, BLOCK_H, BLOCK_HALF, BLOCK_TAIL)
        rotate_heads(k_ptr, ko_ptr, k_src, k_dst, tok_ok, stride_kh, stride_koh, k_heads, half, tail, cos, sin,
                     INTERLEAVED, COPY_TAIL, BLOCK_HK, BLOCK_HALF, BLOCK_TAIL)


@dataclass(frozen=True)
class RotaryConfig:
    """Launch shape: ``block_t`` tokens per program; q's heads in chunks of ``block_h``, k's
    in chunks of ``block_hk`` (0: ``block_h``, the first layout, which pads 2 kv heads to 16
    lanes beside 14 q heads).

    ``merge_qk`` False: q's chunks, then k's, each chunk's rotated dims loaded and stored
    before its pass-through dims are copied: a program waits on memory twice (four times
    with partial rotary), the later trips with few bytes in flight (2 of 16 heads for
    Qwen-0.5B). True: one loop over (q chunk, k chunk) pairs that issues every load of a
    pair before its first store; with ``block_h`` >= heads and ``block_hk`` >= kv_heads,
    one trip per program."""

    block_t: int
    block_h: int
    num_warps: int
    block_hk: int = 0
    merge_qk: bool = False
    index64: bool = False  # token indices in 64 bits (forced past 2**31 tokens): 80 -> 97 registers, see the kernel


def rotary_config(tokens: int, heads: int, half: int, device: torch.device, *, tile: int = 4096) -> RotaryConfig:
    """About ``tile`` rotated pairs per program, but at least ~4 programs per SM when
    there are enough tokens (decode batches of a few tokens get one token per program)."""
    return _rotary_config(tokens, heads, half, sm_count(device), tile)


@functools.lru_cache(maxsize=4096)  # a launch asks at every call
def _rotary_config(tokens: int, heads: int, half: int, sms: int, tile: int) -> RotaryConfig:
    block_half = next_pow2(max(half, 1))
    block_h = min(next_pow2(max(heads, 1)), max(1, tile // block_half))
    per_token = block_h * block_half
    limit = max(1, tokens // (4 * sms))
    block_t = 1
    while 2 * block_t * per_token <= tile and 2 * block_t <= limit:
        block_t *= 2
    return RotaryConfig(block_t, block_h, max(1, min(8, block_t * per_token // 256)))


def merged_config(tokens: int, heads: int, kv_heads: int, half: int, tail: int, device: torch.device, *,
                  tile: int = 8192, per_thread: int = 32) -> RotaryConfig:
    """A ``merge_qk`` launch: a token's q and k heads in one chunk (each padded to a power of
    two; both halved until a token's lanes fit in ``tile``), about ``tile`` loaded lanes
    (rotated pairs and pass-through dims) per program, at least ~4 programs per SM when
    there are enough tokens, and warps for about ``per_thread`` lanes a thread, rounded
    down to a power of two (1 to 8). On an H200's three bench shapes: 1 x 32/8 heads at 4
    warps (llama-8b), 4 x 16/2 at 4 (qwen-0.5b), 1 x 32/32 at 8 (partial); compiled for
    sm_90a, 96, 96 and 53 registers, no spills. Measured there (H200, bf16,
    ``tools/tune_rotary.py``): 95.5% / 94.3% / 91.8% of copy against
    ``rotary_config``'s 95.0% / 83.6% / 90.4%; so ``apply_rotary`` launches this, and
    ``append_kv`` keeps ``rotary_config``."""
    return _merged_config(tokens, heads, kv_heads, half, tail, sm_count(device), tile, per_thread)


@functools.lru_cache(maxsize=4096)  # a launch asks at every call
def _merged_config(tokens: int, heads: int, kv_heads: int, half: int, tail: int, sms: int, tile: int,
                   per_thread: int) -> RotaryConfig:
    block_h, block_hk = next_pow2(max(heads, 1)), next_pow2(max(kv_heads, 1))
    cols = 2 * next_pow2(max(half, 1)) + (next_pow2(tail) if tail > 0 else 0)
    while (block_h + block_hk) * cols > tile and max(block_h, block_hk) > 1:
        block_h, block_hk = max(1, block_h // 2), max(1, block_hk // 2)
    per_token = (block_h + block_hk) * cols
    limit = max(1, tokens // (4 * sms))
    block_t = 1
    while 2 * block_t * per_token <= tile and 2 * block_t <= limit:
        block_t *= 2
    warps = max(1, block_t * per_token // (32 * per_thread))
    warps = min(8, 1 << (warps.bit_length() - 1))
    return RotaryConfig(block_t, block_h, warps, block_hk, merge_qk=True)


def _launch(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            positions: Optional[torch.Tensor], q_out: torch.Tensor, k_out: torch.Tensor, interleaved: bool,
            config: RotaryConfig | None = None, inverse: bool = False):
    """Launch on validated views: q, q_out (B, S, H, D); k, k_out (B, S, Hkv, D), unit stride
    along D (q_out may be q: in place); cos, sin (max_pos, half) with unit column stride;
    positions None or contiguous (S,) or (B * S,) integers; ``inverse``: rotate by -theta.
    Returns the compiled kernel (its ``n_regs``, ``n_spills``), or None when nothing ran."""
    B, S, H, D = q.shape
    Hkv = k.shape[2]
    half = cos.shape[1]
    n_tokens = B * S
    if n_tokens == 0 or H + Hkv == 0:
        return None
    tail = D - 2 * half
    cfg = config or merged_config(n_tokens, H, Hkv, half, tail, q.device)
    inplace = q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()
    args = (q, k, q_out, k_out, cos, sin, positions if positions is not None else cos,
            n_tokens, S, positions.numel() if positions is not None else S, H, Hkv, half, tail,
            *q.stride()[:3], *k.stride()[:3], *q_out.stride()[:3], *k_out.stride()[:3], cos.stride()[0],
            sin.stride()[0])
    # the config by its fields: a dataclass hashes in Python, ~0.5 us
    meta, key = _meta(cfg.block_t, cfg.block_h, cfg.block_hk or cfg.block_h, cfg.merge_qk, cfg.num_warps,
                      bool(interleaved), positions is not None, tail > 0 and not inplace,
                      cfg.index64 or n_tokens + cfg.block_t >= 2**31, half, tail, inverse, pdl_on(q))
    return launch(_rotary_kernel, (cdiv(n_tokens, cfg.block_t),), args, meta, key)


@functools.lru_cache(maxsize=4096)
def _meta(block_t: int, block_h: int, block_hk: int, merge_qk: bool, num_warps: int, interleaved: bool,
          has_pos: bool, copy_tail: bool, tok64: bool, half: int, tail: int, inverse: bool,
          pdl: bool) -> tuple[dict, int]:
    """The kernel's constexprs and options, and their ``meta_key``: kept, as a launch needs them at every call."""
    meta = dict(INTERLEAVED=interleaved, HAS_POS=has_pos, COPY_TAIL=copy_tail, MERGE_QK=merge_qk, TOK64=tok64,
                BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_HK=block_hk,
                BLOCK_HALF=next_pow2(half), BLOCK_TAIL=next_pow2(max(tail, 1)),
                INVERSE=inverse, num_warps=num_warps, **pdl_kwargs(pdl))
    return meta, meta_key(meta)


@torch.library.custom_op("onetrip::apply_rotary", mutates_args=("q_out", "k_out"))
def _rotary_op(q_out: torch.Tensor, k_out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               positions: Optional[torch.Tensor], q: Optional[torch.Tensor], k: Optional[torch.Tensor],
               interleaved: bool) -> None:
    """Rotate q, k into q_out, k_out; with q and k None, rotate q_out and k_out in place."""
    q = q_out if q is None else q
    k = k_out if k is None else k
    if use_triton(q):
        _launch(q, k, cos, sin, positions, q_out, k_out, interleaved)
    else:  # the reference in float32, rounded once like the kernel
        pos = None if positions is None else positions.view(-1, q.shape[1])
        q_ref, k_ref = apply_rotary_ref(q.float(), k.float(), cos.float(), sin.float(), pos, interleaved)
        q_out.copy_(q_ref)
        k_out.copy_(k_ref)


@_rotary_op.register_fake
def _(q_out, k_out, cos, sin, positions, q, k, interleaved):
    return None


@torch.library.custom_op("onetrip::apply_rotary_backward", mutates_args=("dq", "dk"))
def _rotary_backward_op(gq: torch.Tensor, gk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        positions: Optional[torch.Tensor], dq: torch.Tensor, dk: torch.Tensor,
                        interleaved: bool) -> None:
    """dq, dk: gq, gk (the gradients of q_out, k_out) rotated by -theta."""
    if use_triton(gq):
        _launch(gq, gk, cos, sin, positions, dq, dk, interleaved, inverse=True)
    else:  # the reference in float32 with sin negated, rounded once like the kernel
        pos = None if positions is None else positions.view(-1, gq.shape[1])
        dq_ref, dk_ref = apply_rotary_ref(gq.float(), gk.float(), cos.float(), -sin.float(), pos, interleaved)
        dq.copy_(dq_ref)
        dk.copy_(dk_ref)


@_rotary_backward_op.register_fake
def _(gq, gk, cos, sin, positions, dq, dk, interleaved):
    return None


class _RotaryFunction(torch.autograd.Function):
    """apply_rotary under autograd: the forward op (in place: q and k marked dirty), then the
    backward op on the saved tables and positions. Gradients flow to q and k only."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, positions, interleaved: bool, inplace: bool):
        q_out, k_out = _rotate(q, k, cos, sin, positions, interleaved, inplace, None)
        if inplace:
            ctx.mark_dirty(q, k)
        ctx.save_for_backward(cos, sin, positions)
        ctx.interleaved = interleaved
        return q_out, k_out

    @staticmethod
    def backward(ctx, gq: torch.Tensor, gk: torch.Tensor):
        cos, sin, positions = ctx.saved_tensors
        dq, dk = empty_as(gq), empty_as(gk)
        batch = math.prod(gq.shape[:-3])
        if batch * gq.shape[-3]:
            gqv, _ = heads_view(gq, batch, True)  # a contiguous copy when no such view exists
            gkv, _ = heads_view(gk, batch, True)
            dqv, _ = heads_view(dq, batch, False)
            dkv, _ = heads_view(dk, batch, False)
            call_op(_rotary_backward_op, gqv, gkv, cos, sin, positions, dqv, dkv, ctx.interleaved)
        needs = ctx.needs_input_grad
        return dq if needs[0] else None, dk if needs[1] else None, None, None, None, None, None


def _check_positions(positions: object, q: torch.Tensor) -> Optional[torch.Tensor]:
    """positions as a contiguous (S,) or (B * S,) tensor, or None."""
    if positions is None:
        return None
    lead, seq = tuple(q.shape[:-2]), q.shape[-3]
    if not isinstance(positions, torch.Tensor):
        raise TypeError(f"positions must be a torch.Tensor or None, got {type(positions).__name__}")
    if positions.dtype not in POSITION_DTYPES:
        raise TypeError(f"positions has dtype {positions.dtype}; allowed: torch.int32, torch.int64")
    check_same_device("q", q, positions=positions)
    try:
        ok = tuple(torch.broadcast_shapes(positions.shape, lead)) == lead
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"positions has shape {tuple(positions.shape)}; expected {lead} (q's shape without "
                         f"the heads and head_dim dims) or a shape that broadcasts to it, such as ({seq},)")
    if positions.dim() > 0 and positions.shape[-1] == seq and positions.numel() == seq:
        return positions.reshape(seq).contiguous()  # shared by every sequence of the batch
    return positions.expand(lead).reshape(-1).contiguous()


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
    interleaved: bool = False,
    *,
    inplace: bool = False,
    out: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of q and k, in float32 with one rounding, in one kernel launch.

    With theta = positions[token] * inv_freq (tabled as cos, sin) and rot = 2 * cos.shape[1]:
    NeoX (``interleaved=False``): x1 = x[..., :rot/2], x2 = x[..., rot/2:rot];
    GPT-J (``interleaved=True``): x1 = x[..., 0:rot:2], x2 = x[..., 1:rot:2]; then
    out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin. Dims rot..head_dim pass through.

    Args:
        q: (..., seq, heads, head_dim) or (tokens, heads, head_dim); float32, float16 or
            bfloat16. Any seq and heads strides, and leading dims that merge into one
            batch stride, are used as they are (views of a fused QKV output need no
            copy); other layouts, and a head_dim without unit stride, are copied once.
        k: (..., seq, kv_heads, head_dim) of q's dtype, leading dims as q's; kv_heads may
            differ from heads (GQA, MQA).
        cos, sin: (max_pos, rot // 2), float32 or q's dtype: the compact tables,
            cos[p, i] = cos(p * base ** (-2 i / rot)); rot <= head_dim.
        positions: None (the index along dim -3: the tables need seq rows, or ValueError),
            or int32/int64 of q's leading shape
            ((batch, seq), (tokens,)) or broadcastable to it ((seq,)), on q's device: each
            token's row of the tables. Not read on the host; values must lie in
            [0, max_pos) (they are not checked, which would need a host sync).
        inplace: rotate q and k in place and return them.
        out: optional (q_out, k_out) of q's and k's shapes and dtype to write into.

    Returns:
        (q_out, k_out). No host synchronisation and no data-dependent shapes, so the call
        can be captured in a CUDA graph (out-of-place outputs then come from the graph's pool).

    Differentiable with respect to q and k (in place too: q and k are then marked modified,
    as for any in-place op, so neither may be a leaf that requires a gradient, nor a view of
    another tensor, which autograd cannot record for two outputs: ValueError): dq and dk
    are the upstream gradients rotated by -theta, the pass-through dims copied; float32,
    rounded once. cos and sin are tables, not parameters: ValueError if they require a
    gradient. ``out`` must then be None.
    """
    check_tensor("q", q, min_ndim=3)
    check_tensor("k", k, min_ndim=3)
    check_dtype_match("k", k, "q", q)
    if k.dim() != q.dim() or k.shape[:-2] != q.shape[:-2]:
        raise ValueError(f"k has shape {tuple(k.shape)} but q has {tuple(q.shape)}; their leading dims "
                         f"(all but heads and head_dim) must match")
    D = q.shape[-1]
    if k.shape[-1] != D:
        raise ValueError(f"k has head_dim {k.shape[-1]} but q has {D}; they must match")
    table_dtypes = (torch.float32,) if q.dtype == torch.float32 else (torch.float32, q.dtype)
    check_tensor("cos", cos, dtypes=table_dtypes, min_ndim=2)
    if cos.dim() != 2 or cos.shape[1] == 0:
        raise ValueError(f"cos has shape {tuple(cos.shape)}; expected (max_pos, rot_dim // 2) with rot_dim >= 2")
    check_tensor("sin", sin, dtypes=table_dtypes)
    check_shape("sin", sin, cos.shape, "the shape of cos")
    check_dtype_match("sin", sin, "cos", cos)
    check_same_device("q", q, k=k, cos=cos, sin=sin)
    half = cos.shape[1]
    if 2 * half > D:
        raise ValueError(f"cos has shape {tuple(cos.shape)}, so rot_dim = {2 * half} > head_dim = {D}; cos and "
                         f"sin are the compact tables (max_pos, rot_dim // 2) with an even rot_dim <= head_dim")
    pos = _check_positions(positions, q)
    seq = q.shape[-3]
    if pos is None and cos.shape[0] < seq:  # the kernel would read past the tables' end
        raise ValueError(f"cos and sin have {cos.shape[0]} rows but q has seq {seq}: the default positions "
                         f"0..{seq - 1} need {seq} rows (pass longer tables, or positions)")
    if inplace and out is not None:
        raise ValueError("out must be None when inplace=True (the outputs are q and k)")
    cos = cos if cos.is_contiguous() or cos.stride()[-1] == 1 else cos.contiguous()
    sin = sin if sin.is_contiguous() or sin.stride()[-1] == 1 else sin.contiguous()
    if needs_grad(q, k, cos, sin):
        if needs_grad(cos, sin):
            raise ValueError("cos and sin require a gradient, but apply_rotary differentiates only with respect to "
                             "q and k (cos and sin are tables of fixed angles); pass cos.detach(), sin.detach()")
        check_no_out("out", out)
        for name, t in (("q", q), ("k", k)) if inplace else ():
            if t.is_leaf and t.requires_grad:
                raise ValueError(f"{name} is a leaf tensor that requires a gradient, which inplace=True cannot "
                                 f"modify (as for any in-place op); pass inplace=False, or a non-leaf {name}")
            if t._base is not None:  # autograd's rule: a Function that modifies a view in place returns one tensor
                raise ValueError(f"{name} is a view of another tensor (a slice of a fused QKV output, say); "
                                 f"autograd cannot record inplace=True on views of q and k in one call: pass "
                                 f"inplace=False (and copy the results back if the storage must hold them)")
        return _RotaryFunction.apply(q, k, cos, sin, pos, bool(interleaved), inplace)
    return _rotate(q, k, cos, sin, pos, bool(interleaved), inplace, out)


def _rotate(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: Optional[torch.Tensor],
            interleaved: bool, inplace: bool, out: Optional[tuple[torch.Tensor, torch.Tensor]]):
    """apply_rotary after its checks: cos, sin with unit column stride, pos from _check_positions."""
    seq = q.shape[-3]
    if inplace:
        q_out, k_out = q, k
    else:
        if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 2):
            raise TypeError(f"out must be a pair (q_out, k_out) or None, got {type(out).__name__}")
        q_out = output_like("out[0]", None if out is None else out[0], q)
        k_out = output_like("out[1]", None if out is None else out[1], k)
    batch = math.prod(q.shape[:-3])
    if batch * seq == 0:
        return q_out, k_out
    # Outputs that no (B, S, heads, D) view describes are written through a contiguous
    # scratch buffer (in place: a copy of the input itself) and copied back.
    qw, q_scratch = heads_view(q_out, batch, inplace)
    kw, k_scratch = heads_view(k_out, batch, inplace)
    if inplace:
        call_op(_rotary_op, qw, kw, cos, sin, pos, None, None, interleaved)
    else:
        qi, _ = heads_view(q, batch, True)
        ki, _ = heads_view(k, batch, True)
        call_op(_rotary_op, qw, kw, cos, sin, pos, qi, ki, interleaved)
    if q_scratch:
        q_out.copy_(qw.view(q_out.shape))
    if k_scratch:
        k_out.copy_(kw.view(k_out.shape))
    return q_out, k_out


def apply_rotary_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
    interleaved: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unfused, Hugging Face style: gather the rows, cast them to q's dtype, and compute
    ``x * cos + rotate_half(x) * sin`` in q's dtype, as eager PyTorch does (each product
    and the sum rounded to q's dtype); ~18 small kernels. Returns new tensors."""
    if positions is None:
        positions = torch.arange(q.shape[-3], device=q.device)
    cos = cos[positions].to(q.dtype).unsqueeze(-2)  # (..., seq, 1, rot/2)
    sin = sin[positions].to(q.dtype).unsqueeze(-2)
    if interleaved:
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    else:
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    return _rotate_ref(q, cos, sin, interleaved), _rotate_ref(k, cos, sin, interleaved)


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    if interleaved:
        rotated = torch.stack((-x_rot[..., 1::2], x_rot[..., 0::2]), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((-x_rot[..., rot // 2:], x_rot[..., : rot // 2]), dim=-1)
    return torch.cat((x_rot * cos + rotated * sin, x_pass), dim=-1)
