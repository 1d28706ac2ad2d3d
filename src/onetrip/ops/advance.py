"""A decode step's bookkeeping after the sampler, in one launch.

For each row r of a batch, given the token the sampler picked (or, greedy, the argmax of
the row's logits):

    nxt_r          = max(eos_0, 0) if done_r else pick_r     (finished rows repeat EOS)
    out[r, step]   = nxt_r                                   (the generated ids so far)
    tok[r, 0]      = nxt_r                                   (the next step's input)
    done_r        |= any_j (nxt_r == eos_j)
    lens_r        += 1                                       (the cache lengths)
    step          += 1                                       (one counter for the batch)

Why a kernel for this: written op by op (``advance_ref``) it is a where, a scatter, an
equality, an any, an or, a copy and two increments: nine launches of ~1.2-1.6 us each on
an H200 for a few hundred bytes, about 14 us of a Llama-3.2-1B step of 0.86 ms (the fused +
graphs trace, 2026-11-21), where the step's floor is 0.59 ms. Greedy, the argmax's second
stage (the tiles' winners reduced) moves in here too, so the tail of a step after the LM
head is two launches: the argmax tiles and this.

One program walks the whole batch in blocks of rows (a bucket is at most a few hundred):
``step`` is read by every row and written once, which one program does without a
grid-wide order.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import call_op, check_same_device, next_pow2, pdl_kwargs, pdl_on, use_triton
from ._jit import pdl_start
from ._launch import launch, meta_key
from .argmax import pick_from_keys, tile_keys


@triton.jit
def _advance_kernel(
    src_ptr,                  # picks (B,) int64, or FROM_KEYS: the argmax tile keys (B, n_tiles) int64
    n_tiles,
    done_ptr, eos_ptr, n_eos,  # done (B,) bool; eos (n_eos,) int64, -1 for none
    out_ptr, stride_out, max_out,  # out (B, max_out) int64
    tok_ptr, stride_tok,      # tok (B, 1) int64
    lens_ptr, step_ptr,       # lens (B,) int32 (HAS_LENS); step () int64
    B,
    FROM_KEYS: tl.constexpr,
    HAS_LENS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    PDL: tl.constexpr = 0,    # programmatic dependent launch (_common.pdl_mode)
):
    pdl_start(PDL)
    step = tl.load(step_ptr)
    eos0 = tl.maximum(tl.load(eos_ptr), 0)
    e = tl.arange(0, BLOCK_E)
    eos = tl.load(eos_ptr + e, mask=e < n_eos, other=-1)      # -1 matches no token
    for r0 in range(0, B, BLOCK_B):  # rows in blocks: (BLOCK_B, BLOCK_T) keys stay in registers
        r = r0 + tl.arange(0, BLOCK_B)
        ok = r < B
        if FROM_KEYS:  # argmax's second stage: the largest 64-bit key of the row's tiles
            pick = pick_from_keys(src_ptr, r, ok, n_tiles, BLOCK_T)  # (BLOCK_B,) int64
        else:
            pick = tl.load(src_ptr + r, mask=ok, other=0)
        done = tl.load(done_ptr + r, mask=ok, other=0) != 0
        nxt = tl.where(done, eos0, pick)
        hit = tl.max((nxt[:, None] == eos[None, :]).to(tl.int32), axis=1) > 0
        col = step + tl.zeros((BLOCK_B,), dtype=tl.int64)      # step broadcast: a (BLOCK_B,) mask
        tl.store(out_ptr + r.to(tl.int64) * stride_out + col, nxt, mask=ok & (col < max_out))
        tl.store(tok_ptr + r.to(tl.int64) * stride_tok, nxt, mask=ok)
        tl.store(done_ptr + r, done | hit, mask=ok)
        if HAS_LENS:
            tl.store(lens_ptr + r, tl.load(lens_ptr + r, mask=ok, other=0) + 1, mask=ok)
    tl.store(step_ptr, step + 1)


def _launch(src: torch.Tensor, from_keys: bool, done: torch.Tensor, eos: torch.Tensor, out: torch.Tensor,
            tok: torch.Tensor, step: torch.Tensor, lens: Optional[torch.Tensor]) -> None:
    B = done.shape[0]
    n_tiles = src.shape[1] if from_keys else 1
    meta, key = _meta(B, n_tiles, eos.shape[0], from_keys, lens is not None, pdl_on(done))
    launch(_advance_kernel, (1,),
           (src, n_tiles, done, eos, eos.shape[0], out, out.stride()[0], out.shape[1], tok, tok.stride()[0],
            lens if lens is not None else done, step, B),
           meta, key)


@functools.lru_cache(maxsize=4096)
def _meta(B: int, n_tiles: int, n_eos: int, from_keys: bool, has_lens: bool, pdl: bool) -> tuple[dict, int]:
    """The kernel's constexprs and options, and their ``meta_key``: kept, as a launch needs them at every call."""
    block_t = max(16, next_pow2(n_tiles))
    # At most 2048 keys a block (16 a thread at 4 warps); a 128K vocabulary has 63 tiles.
    block_b = min(max(16, next_pow2(B)), 256)
    if from_keys:
        block_b = min(block_b, max(1, 2048 // block_t))
    meta = dict(FROM_KEYS=from_keys, HAS_LENS=has_lens, BLOCK_B=block_b, BLOCK_T=block_t,
                BLOCK_E=max(16, next_pow2(n_eos)), num_warps=4, **pdl_kwargs(pdl))
    return meta, meta_key(meta)


@torch.library.custom_op("onetrip::advance_tokens", mutates_args=("done", "out", "tok", "step", "lens"))
def _advance_op(src: torch.Tensor, greedy: bool, done: torch.Tensor, eos: torch.Tensor, out: torch.Tensor,
                tok: torch.Tensor, step: torch.Tensor, lens: Optional[torch.Tensor]) -> None:
    """src: logits (B, V) when greedy, else the picks (B,) int64."""
    if not use_triton(done):
        pick = torch.argmax(src, dim=-1) if greedy else src
        advance_ref(pick, done, eos, out, tok, step, lens)
        return
    _launch(tile_keys(src) if greedy else src, greedy, done, eos, out, tok, step, lens)


@_advance_op.register_fake
def _(src, greedy, done, eos, out, tok, step, lens):
    return None


def _check(src: torch.Tensor, greedy: bool, done, eos, out, tok, step, lens) -> None:
    if not isinstance(done, torch.Tensor) or done.dtype != torch.bool or done.dim() != 1:
        raise ValueError(f"done must be a (batch,) bool tensor, got "
                         f"{(tuple(done.shape), done.dtype) if isinstance(done, torch.Tensor) else type(done).__name__}")
    B = done.shape[0]
    if B < 1:
        raise ValueError("done has no rows; advance needs a batch of at least 1")
    if greedy:
        if not isinstance(src, torch.Tensor) or src.dim() != 2 or src.shape[0] != B or not src.is_floating_point() \
                or src.shape[1] < 1 or src.stride(-1) != 1:
            raise ValueError(f"logits must be a ({B}, vocab) float tensor with unit stride along vocab, got "
                             f"{(tuple(src.shape), src.dtype, src.stride()) if isinstance(src, torch.Tensor) else src!r}")
    elif not isinstance(src, torch.Tensor) or src.shape != (B,) or src.dtype != torch.int64:
        raise ValueError(f"nxt must be a ({B},) int64 tensor of token ids, got "
                         f"{(tuple(src.shape), src.dtype) if isinstance(src, torch.Tensor) else src!r}")
    for name, t, shape, dtype in (("eos", eos, None, torch.int64), ("out", out, None, torch.int64),
                                  ("tok", tok, (B, 1), torch.int64), ("step", step, (), torch.int64),
                                  ("lens", lens, (B,), torch.int32)):
        if t is None and name == "lens":
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or (shape is not None and tuple(t.shape) != shape):
            want = f"shape {shape} " if shape is not None else ""
            raise ValueError(f"{name} must be a {want}{dtype} tensor, got "
                             f"{(tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if eos.dim() != 1 or eos.shape[0] < 1:
        raise ValueError(f"eos must be a (n,) int64 tensor with n >= 1 (-1 for none), got shape {tuple(eos.shape)}")
    if out.dim() != 2 or out.shape[0] != B or out.stride(1) != 1:
        raise ValueError(f"out must be a ({B}, max_len) int64 tensor with unit column stride, got shape "
                         f"{tuple(out.shape)} strides {out.stride()}")
    if (lens is not None and lens.stride(0) != 1) or done.stride(0) != 1 or (not greedy and src.stride(0) != 1):
        raise ValueError("done, lens and nxt must be contiguous")
    check_same_device("done", done, src=src, eos=eos, out=out, tok=tok, step=step, lens=lens)


def advance_tokens(nxt: torch.Tensor, done: torch.Tensor, eos: torch.Tensor, out: torch.Tensor, tok: torch.Tensor,
                   step: torch.Tensor, lens: Optional[torch.Tensor] = None) -> None:
    """Record the sampled tokens and move the decode state one step, in place.

    Args:
        nxt: (B,) int64, the sampler's picks.
        done: (B,) bool, rows that already emitted an EOS (updated).
        eos: (n,) int64 end-of-sequence ids, ``[-1]`` for none.
        out: (B, max_len) int64 generated ids; column ``step`` is written. The engine keeps
            ``step < max_len``; past it the kernel writes nothing (the reference's scatter
            fails).
        tok: (B, 1) int64, the next step's input ids (written).
        step: () int64, incremented.
        lens: optional (B,) int32 cache lengths, incremented.

    One launch, no host synchronisation: CUDA-graph capturable. Equals ``advance_ref``.
    """
    _check(nxt, False, done, eos, out, tok, step, lens)
    call_op(_advance_op, nxt, False, done, eos, out, tok, step, lens)


def advance_greedy(logits: torch.Tensor, done: torch.Tensor, eos: torch.Tensor, out: torch.Tensor,
                   tok: torch.Tensor, step: torch.Tensor, lens: Optional[torch.Tensor] = None) -> None:
    """``advance_tokens`` with the picks the argmax of ``logits`` (B, vocab), float, unit
    stride along vocab: two launches (argmax's tiles, then this op with its final stage)."""
    _check(logits, True, done, eos, out, tok, step, lens)
    call_op(_advance_op, logits, True, done, eos, out, tok, step, lens)


def advance_ref(nxt: torch.Tensor, done: torch.Tensor, eos: torch.Tensor, out: torch.Tensor, tok: torch.Tensor,
                step: torch.Tensor, lens: Optional[torch.Tensor] = None) -> None:
    """Op by op, as the engine wrote it before this kernel."""
    nxt = torch.where(done, eos[0].clamp(min=0), nxt)                   # finished rows repeat EOS
    out.scatter_(1, step.view(1, 1).expand(nxt.shape[0], 1), nxt[:, None])  # step < max_len here
    done |= (nxt[:, None] == eos[None, :]).any(-1)
    tok.copy_(nxt[:, None])
    if lens is not None:
        lens += 1
    step += 1
