"""Prefill attention without the (seq_q x seq_k) score matrix: FlashAttention-style forward
and backward.

    S = softmax_scale * Q K^T                      (per batch, per head)
    S = softcap * tanh(S / softcap)                (when softcap > 0)
    S[i, j] = -inf where key j is masked for query i (causal / sliding window / padding)
    O = softmax(S) V,     lse[i] = log sum_j exp(S[i, j])

The kernel (``_attention_jit.py``) keeps one block of query rows in registers and streams
K and V tiles through an online softmax, so its extra memory is the output and the
optional lse: O(seq). Differentiable in q, k and v: autograd saves q, k, v, O and lse,
and the backward (``_attention_backward.py``) recomputes P tile by tile from them. The
unfused reference (``attention_ref``) materializes batch x heads x seq_q x seq_k scores
and moves them through HBM about 8 times (matmul writes S; scale, softcap, mask and
softmax each read and write it; the second matmul reads P): at 8192 tokens and 32 heads,
4 GiB of bf16 per pass, where the kernel reads Q and writes O once and reads K and V once
per query block (seq_q / block_m times, partly from L2).

Causal and window masks are aligned to the bottom-right corner (as FlashAttention >= 2.1):
with diag = seq_k - seq_q, query i sees key j when  i + diag - left <= j <= i + diag + right,
and causal is right = 0. The last query always sits on the last key, which is what decode
and chunked prefill with a KV cache need::

    seq_q = 3, seq_k = 5 (diag = 2), causal      seq_q = 5, seq_k = 3 (diag = -2), causal
            k0 k1 k2 k3 k4                              k0 k1 k2
        q0   x  x  x  .  .                          q0   .  .  .    <- sees no key: zeros,
        q1   x  x  x  x  .                          q1   .  .  .       lse = -inf
        q2   x  x  x  x  x                          q2   x  .  .
                                                    q3   x  x  .
                                                    q4   x  x  x
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict
from typing import Optional

import torch

from . import autotune
from ._attention_backward import launch_backward
from ._attention_jit import LOG2E, _attn_fwd_kernel
from ._attention_picks import AttentionConfig, attention_bucket, attention_candidates, attention_config
from ._attention_tma import descriptors, tma_supported
from ._common import (call_op, cdiv, check_dtype_match, check_no_out, check_same_device, check_tensor, empty_as,
                      needs_grad, next_pow2, output_like, use_triton)
from ._launch import launch, meta_key

MAX_HEAD_DIM = 256
# flash_attention's backward mode by default: True runs a dQ kernel of its own (7 tile
# matmuls a visible block pair, the same bits every run), False adds dQ with float32 atomics
# (5 matmuls, dQ's last bits vary). Tuned, the deterministic mode is as fast (H200, bf16, 16K
# tokens: head dim 128 271-361 TFLOP/s against 273-365) or faster (64: 276-331 against 267-320)
# and needs no float32 dQ buffer.
DETERMINISTIC_BACKWARD = True


@functools.lru_cache(maxsize=None)
def _tune_cache() -> autotune.TuneCache:
    # One per process, created on first GPU use so ONETRIP_CACHE_DIR can be set before.
    return autotune.TuneCache("flash_attention")


def _tuned_config(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, window,
                  softcap) -> Optional[AttentionConfig]:
    """The config for this call's bucket on a CUDA device: cached, or tuned now (first use of
    the bucket, outside CUDA-graph capture), or None (= the heuristic) where tuning is off.
    Tuning launches the kernel on these very tensors, so out and lse are overwritten by the
    caller's final launch."""
    if not autotune.autotune_enabled() or max_seqlen_q == 0 or q.numel() == 0 or k.numel() == 0:
        return None
    head_dim, group = q.shape[-1], q.shape[-2] // k.shape[-2]
    causal = window[1] == 0 and window[0] < 0
    cache = _tune_cache()
    # a pick the cache holds stays the bucket's for this process: found again without building
    # the key (a JSON string) a call; the cache object itself in the key (a new one, a new pick)
    bucket = attention_bucket(head_dim, causal, max_seqlen_q, group, q.dtype)
    memo = (cache, bucket, q.device)
    picked = _PICKED.get(memo)
    if picked is not None:
        return picked
    key = autotune.tune_key("flash_attention", bucket, q.device)

    def bench(cfg: dict):
        return _launch(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, window,
                       softcap, AttentionConfig(**cfg))

    def candidates():  # built only on a cache miss: ~0.2 ms of host time a call otherwise (H200 host)
        for c in attention_candidates(head_dim, q.dtype, max_seqlen_q):
            yield asdict(c)

    picked = autotune.tune(key, candidates(), bench, cache=cache,
                           default=asdict(attention_config(head_dim, max_seqlen_q)))
    try:
        config = AttentionConfig(**picked)
    except TypeError:  # a hand-edited cache entry with other fields: the heuristic, not a crash
        return None
    if cache.get(key) is not None:  # not the heuristic of an untuned bucket (under capture)
        _PICKED[memo] = config
    return config


_PICKED: dict = {}  # _tuned_config's memo


def _launch(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, softmax_scale: float,
            window: tuple[int, int], softcap: float, config: AttentionConfig | None = None):
    """Launch on validated tensors (unit stride along head_dim). Dense: q, out (B, Sq, H, D),
    k, v (B, Sk, Hkv, D), lse (B, H, Sq) or None. Varlen: the same without B, cu_seqlens
    (B + 1,) int32, lse (H, Tq). ``window`` already holds causal (right = 0). A config with
    ``use_tma`` runs its tile on the pointer path where ``tma_supported`` says no.

    Returns the compiled kernel (its ``n_regs``, ``n_spills``) or None when there is no work.
    """
    varlen = cu_seqlens_q is not None
    sq, sk, sv, so = q.stride(), k.stride(), v.stride(), out.stride()  # one call each: stride(i) parses its argument
    if varlen:
        batch, seqlen_q, seqlen_k = cu_seqlens_q.shape[0] - 1, max_seqlen_q, 0
        qb = kb = vb = ob = lb = 0  # packed tokens: the sequence's start comes from cu_seqlens
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        qb, kb, vb, ob = sq[0], sk[0], sv[0], so[0]
        lb = lse.stride(0) if lse is not None else 0
    heads, head_dim, kv_heads = q.shape[-2], q.shape[-1], k.shape[-2]
    if batch == 0 or heads == 0 or seqlen_q == 0 or q.numel() == 0:
        return None
    # TMA's checks (~6 us of host time) only where the config would take it: the heuristic's
    # TMA tile (a Hopper GPU, long queries), or a config that asks for it
    wants = config.use_tma if config is not None else q.is_cuda and attention_config(head_dim, seqlen_q, tma=True).use_tma
    tma_ok = wants and tma_supported(q, k, v, out, varlen)
    cfg = config or attention_config(head_dim, seqlen_q, tma=tma_ok)
    block_d = max(16, next_pow2(head_dim))
    use_tma = cfg.use_tma and tma_ok
    descs = descriptors(q, k, v, out, cfg.block_m, cfg.block_n, block_d) if use_tma else (None,) * 4
    left, right = window
    cap = float(softcap)
    grid = (cdiv(seqlen_q, cfg.block_m), heads, batch)
    dummy = cu_seqlens_q if varlen else q
    args = (q, k, v, out, lse if lse is not None else out, *descs, dummy, cu_seqlens_k if varlen else dummy,
            seqlen_q, seqlen_k, heads // kv_heads,  # then per tensor its (batch,) token and head strides
            qb, sq[-3], sq[-2], kb, sk[-3], sk[-2], vb, sv[-3], sv[-2], ob, so[-3], so[-2],
            lb, lse.stride(-2) if lse is not None else 0,
            softmax_scale * LOG2E, softmax_scale / cap if cap > 0 else 0.0, cap * LOG2E, left, right)
    # the config by its fields: a dataclass hashes in Python, ~0.5 us
    meta, key = _meta(cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, head_dim, varlen, left >= 0,
                      right >= 0, cap > 0, lse is not None, use_tma, q.dtype == torch.float32)
    return launch(_attn_fwd_kernel, grid, args, meta, key)


@functools.lru_cache(maxsize=4096)
def _meta(block_m: int, block_n: int, num_warps: int, num_stages: int, head_dim: int, varlen: bool, has_left: bool,
          has_right: bool, has_softcap: bool, store_lse: bool, use_tma: bool, fp32: bool) -> tuple[dict, int]:
    """The forward's constexprs and options, and their ``meta_key``: kept, as a launch needs them at every call."""
    meta = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, next_pow2(head_dim)),
                IS_VARLEN=varlen, HAS_LEFT=has_left, HAS_RIGHT=has_right, HAS_SOFTCAP=has_softcap,
                STORE_LSE=store_lse, USE_TMA=use_tma,
                # float32 inputs: full-precision products (the GPU default would round them to tf32).
                DOT_PRECISION="ieee" if fp32 else "tf32",
                num_warps=num_warps, num_stages=num_stages)
    return meta, meta_key(meta)


@torch.library.custom_op("onetrip::flash_attention", mutates_args=("out", "lse"))
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: Optional[torch.Tensor],
                  cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int,
                  softmax_scale: float, window_left: int, window_right: int, softcap: float) -> None:
    if use_triton(q):
        window = (window_left, window_right)
        config = None
        if q.is_cuda:  # first use of a shape bucket tunes (see attention_candidates, autotune.py)
            config = _tuned_config(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale,
                                   window, softcap)
        _launch(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, window, softcap,
                config)
        return
    o, l = attention_ref(q, k, v, False, softmax_scale, (window_left, window_right), softcap,
                         cu_seqlens_q, cu_seqlens_k, return_lse=True)
    out.copy_(o)
    if lse is not None:
        lse.copy_(l)


@_attention_op.register_fake
def _(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, window_left, window_right, softcap):
    return None


@torch.library.custom_op("onetrip::flash_attention_backward", mutates_args=("dq", "dk", "dv"))
def _attention_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                           lse: torch.Tensor, dlse: Optional[torch.Tensor], dq: torch.Tensor, dk: torch.Tensor,
                           dv: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
                           cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                           softmax_scale: float, window_left: int, window_right: int, softcap: float,
                           deterministic: bool) -> None:
    if use_triton(q):
        launch_backward(dout, q, k, v, out, lse, dlse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, softmax_scale, (window_left, window_right), softcap, deterministic)
        return
    with torch.enable_grad():  # the CPU fallback: autograd through the reference, in float32
        leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
        o, l = attention_ref(*leaves, False, softmax_scale, (window_left, window_right), softcap,
                             cu_seqlens_q, cu_seqlens_k, return_lse=True)
        # Varlen tokens past cu_seqlens_q[-1] belong to no sequence: the reference drops them.
        outs, grads = [o], [dout[:o.shape[0]].float()]
        if dlse is not None:
            outs.append(l)
            grads.append(dlse[..., :l.shape[-1]].float())
        got = torch.autograd.grad(outs, leaves, grads, allow_unused=True) if o.requires_grad else (None,) * 3
    for buf, g in zip((dq, dk, dv), got):
        if g is None:  # no sequence: nothing depends on the inputs
            buf.zero_()
        else:
            buf.copy_(g)


@_attention_backward_op.register_fake
def _(dout, q, k, v, out, lse, dlse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      softmax_scale, window_left, window_right, softcap, deterministic):
    return None


class _FlashAttentionFunction(torch.autograd.Function):
    """The autograd path: the forward op with lse always requested, saving q, k, v, out and
    lse (never the scores); the backward op writes dq, dk, dv in q's, k's, v's dtypes."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, left, right,
                softcap, return_lse, deterministic):
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        varlen = cu_seqlens_q is not None
        out = empty_as(q)
        lse_shape = (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
        call_op(_attention_op, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, left,
                right, softcap)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, left, right, softcap, deterministic)
        return (out, lse) if return_lse else out

    @staticmethod
    def backward(ctx, dout, dlse=None):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        # dout of a sum is an expand (stride 0): the kernels need a unit stride along head_dim.
        dout = dout if dout.stride(-1) == 1 else dout.contiguous()
        dq, dk, dv = empty_as(q), empty_as(k), empty_as(v)
        call_op(_attention_backward_op, dout, q, k, v, out, lse, dlse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    softmax_scale: Optional[float] = None, window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    cu_seqlens_q: Optional[torch.Tensor] = None, cu_seqlens_k: Optional[torch.Tensor] = None,
                    max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                    return_lse: bool = False, deterministic: bool = DETERMINISTIC_BACKWARD,
                    out: Optional[torch.Tensor] = None):
    """softmax(mask(softcap(scale * Q K^T))) V in one kernel; differentiable in q, k and v
    (and through lse with return_lse); the backward is in ``_attention_backward.py`` and
    docs/attention.md.

    Args:
        q: (batch, seq_q, heads, head_dim), or packed (total_q, heads, head_dim) with
            cu_seqlens_q. float16, bfloat16 or float32; any strides with a unit stride
            along head_dim (others are copied once). head_dim 1..256 (32, 64, 80, 96, 128,
            192, 256 tested; padded to a power of two inside, with masks).
        k, v: (batch, seq_k, kv_heads, head_dim) or (total_k, kv_heads, head_dim), q's
            dtype; heads % kv_heads == 0 (GQA/MQA: query head h reads kv head
            h // (heads // kv_heads), K and V are not repeated).
        causal: mask key j for query i when j > i + seq_k - seq_q (bottom-right, see the
            module docstring); same as window right = 0.
        softmax_scale: default 1 / sqrt(head_dim).
        window: (left, right) sliding window, -1 = unbounded: query i sees keys
            i + diag - left <= j <= i + diag + right, diag = seq_k - seq_q.
        softcap: > 0 applies softcap * tanh(s / softcap) to the scaled scores, before the mask.
        cu_seqlens_q, cu_seqlens_k: (batch + 1,) int32 prefix sums of the sequence lengths
            (varlen); both or neither. Lengths may be 0.
        max_seqlen_q: required with cu_seqlens_q: the grid covers this many queries per
            sequence, so it must be >= every length (read from the host by the caller, not
            here: no device->host synchronisation, so the call is CUDA-graph capturable).
        max_seqlen_k: the forward does not use it (the key loop reads each sequence's own
            length); the backward's grid covers this many keys per sequence, so when given
            it must be >= every key length (default: total_k, which always is). Varlen
            tokens past cu_seqlens_q[-1] are not written (their gradients are zero).
        return_lse: also return the natural-log logsumexp of each row's masked scores,
            float32 (batch, heads, seq_q), or (heads, total_q) for varlen.
        deterministic: the backward's mode (default ``DETERMINISTIC_BACKWARD``). True: dq,
            dk and dv are the same bits every run (dq from a kernel of its own, no atomics).
            False: each key block adds its share of dq with float32 atomics, so dq's last
            bits vary run to run (dk and dv do not); 5 tile matmuls a block pair instead of
            7, plus a float32 buffer of q's shape. No effect without a gradient.
        out: optional output of q's shape and dtype, written in place; not allowed when q,
            k or v requires a gradient.

    Returns:
        out of q's shape and dtype, or (out, lse). A query that sees no key (masked
        entirely, or a sequence with no keys) gets zeros and lse = -inf, never NaN.
        Softmax statistics and P @ V accumulate in float32. No allocation depends on
        tensor values: works under torch.compile(fullgraph=True) and CUDA-graph capture.
        Gradients have their inputs' dtypes (float32 accumulation); dk and dv sum over the
        query heads that share a kv head, and rows that see no key contribute zero.
    """
    check_tensor("q", q, min_ndim=3)
    check_tensor("k", k, min_ndim=3)
    check_tensor("v", v, min_ndim=3)
    check_dtype_match("k", k, "q", q)
    check_dtype_match("v", v, "q", q)
    check_same_device("q", q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    ndim = 3 if varlen else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != ndim:
            layout = "(total_tokens, heads, head_dim) with cu_seqlens" if varlen else "(batch, seq, heads, head_dim)"
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {layout}")
    if k.shape != v.shape:
        raise ValueError(f"v has shape {tuple(v.shape)} but k has {tuple(k.shape)}; they must match")
    heads, head_dim, kv_heads = q.shape[-2], q.shape[-1], k.shape[-2]
    if k.shape[-1] != head_dim:
        raise ValueError(f"k has head_dim {k.shape[-1]} but q has {head_dim}; they must match")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim is {head_dim}; supported: 1 to {MAX_HEAD_DIM}")
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(f"q has {heads} heads and k has {kv_heads}; heads must be a multiple of kv_heads")
    if varlen:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
        for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] < 1:
                what = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a 1-D int32 tensor of batch + 1 offsets, got {what}")
        if cu_seqlens_q.shape != cu_seqlens_k.shape:
            raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries and cu_seqlens_k "
                             f"{cu_seqlens_k.shape[0]}; both are batch + 1")
        if max_seqlen_q is None:
            raise ValueError("max_seqlen_q is required with cu_seqlens_q (the longest query length, an int: "
                             "reading it from cu_seqlens here would synchronise with the device)")
        _check_int("max_seqlen_q", max_seqlen_q, 0)
        if max_seqlen_k is not None:
            _check_int("max_seqlen_k", max_seqlen_k, 0)
    elif k.shape[0] != q.shape[0]:
        raise ValueError(f"k has batch {k.shape[0]} but q has {q.shape[0]}; they must match")
    if not (isinstance(window, (tuple, list)) and len(window) == 2):
        raise ValueError(f"window must be a (left, right) pair of ints, -1 = unbounded; got {window!r}")
    _check_int("window[0]", window[0], -1)
    _check_int("window[1]", window[1], -1)
    if not isinstance(softcap, (int, float)) or softcap < 0 or not math.isfinite(softcap):
        raise ValueError(f"softcap must be a finite float >= 0 (0 = off), got {softcap!r}")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    left, right = int(window[0]), int(window[1])
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    if needs_grad(q, k, v):
        check_no_out("out", out)
        max_q = int(max_seqlen_q) if varlen else q.shape[1]
        max_k = (k.shape[0] if max_seqlen_k is None else int(max_seqlen_k)) if varlen else k.shape[1]
        tensors = [q, k, v, cu_seqlens_q, cu_seqlens_k]
        for i, t in enumerate(tensors):  # torch.compile rejects a tensor passed twice to an autograd.Function
            if t is not None and any(t is u for u in tensors[:i]):
                tensors[i] = t.view_as(t)
        return _FlashAttentionFunction.apply(*tensors, max_q, max_k, float(softmax_scale), left, right,
                                             float(softcap), return_lse, bool(deterministic))

    out = output_like("out", out, q)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    o = out if out.stride(-1) == 1 else torch.empty_like(out, memory_format=torch.contiguous_format)
    lse = None
    if return_lse:
        lse_shape = (heads, q.shape[0]) if varlen else (q.shape[0], heads, q.shape[1])
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    call_op(_attention_op, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q if varlen else q.shape[1]),
            float(softmax_scale), left, right, float(softcap))
    if o is not out:
        out.copy_(o)
    return (out, lse) if return_lse else out


# -- reference: op by op, as a user would write it ------------------------------------------

def _visible(seq_q, seq_k, window, device):
    """(seq_q, seq_k) bool: key j visible to query i (bottom-right aligned band)."""
    i = torch.arange(seq_q, device=device)[:, None]
    j = torch.arange(seq_k, device=device)[None, :]
    diag = seq_k - seq_q
    ok = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    if window[0] >= 0:
        ok &= j >= i + diag - window[0]
    if window[1] >= 0:
        ok &= j <= i + diag + window[1]
    return ok


def _dense_ref(q, k, v, scale, window, softcap):
    """(B, Sq, H, D) -> ((B, Sq, H, D), lse (B, H, Sq) float32), scores materialized."""
    group = q.shape[2] // k.shape[2]
    qt = q.transpose(1, 2)                                      # (B, H, Sq, D)
    kt = k.transpose(1, 2).repeat_interleave(group, dim=1)      # (B, H, Sk, D): a copy, unlike the kernel
    vt = v.transpose(1, 2).repeat_interleave(group, dim=1)
    s = torch.matmul(qt, kt.transpose(-1, -2)) * scale          # (B, H, Sq, Sk): the quadratic tensor
    if softcap > 0:
        s = torch.tanh(s / softcap) * softcap
    ok = _visible(q.shape[1], k.shape[1], window, q.device)
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s.float() if s.dtype != torch.float64 else s, dim=-1)
    # A row with no visible key is softmax(all -inf) = NaN; the defined result is zeros.
    p = torch.softmax(s, dim=-1).masked_fill(~ok.any(-1, keepdim=True), 0.0)
    o = torch.matmul(p, vt).transpose(1, 2)                     # (B, Sq, H, D)
    if lse.dtype != torch.float64:
        lse = lse.float()
    return o, lse


def attention_ref(q, k, v, causal=False, softmax_scale=None, window=(-1, -1), softcap=0.0,
                  cu_seqlens_q=None, cu_seqlens_k=None, *, return_lse=False):
    """Unfused attention in q's dtype op by op: matmul, scale, softcap, mask, softmax, matmul.

    Same shapes and masking as ``flash_attention``; rows that see no key give zeros (and
    lse -inf). On float64 copies (``onetrip.testing.upcast``) it is the exact reference.
    Varlen reads the lengths on the host (a synchronisation: reference use only).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if cu_seqlens_q is None:
        o, lse = _dense_ref(q, k, v, scale, (left, right), softcap)
    else:
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        outs, lses = [], []
        for b in range(len(cq) - 1):
            o_b, l_b = _dense_ref(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]],
                                  scale, (left, right), softcap)
            outs.append(o_b[0])
            lses.append(l_b[0])
        o = torch.cat(outs, 0) if outs else q.new_zeros(q.shape)
        lse = torch.cat(lses, -1) if lses else torch.zeros(q.shape[1], 0, dtype=torch.float32, device=q.device)
    return (o, lse) if return_lse else o
