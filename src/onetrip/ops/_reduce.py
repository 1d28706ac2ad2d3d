"""Deterministic second pass of the backward kernels' weight and bias gradients.

A backward kernel that owns a band of rows writes its partial sum of ``dweight`` (or
``dbias``) over that band as one float32 row of ``partials`` (programs, N); this pass adds
the rows in a fixed order and rounds once. No float atomics, so the result is the same bits
run to run (PyTorch's own LayerNorm backward reduces the same way).

Bytes: partials read once (programs x N x 4) plus the (N,) result; with a few hundred
programs that is a few MB against the GB the row pass itself moves.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, next_pow2, use_triton
from ._jit import cast_out
from ._launch import cached_meta, launch


@triton.jit
def _column_sum_kernel(
    p_ptr, y_ptr,  # p: (P, N) float32, unit column stride; y: (N,)
    P, N, stride_p,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for start in range(0, P, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows[:, None] < P) & (cols[None, :] < N)
        acc += tl.load(p_ptr + rows[:, None].to(tl.int64) * stride_p + cols[None, :], mask=mask, other=0.0)
    tl.store(y_ptr + cols, cast_out(tl.sum(acc, axis=0), y_ptr.dtype.element_ty), mask=cols < N)


def column_sum(partials: torch.Tensor, dtype: torch.dtype, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """sum(partials, dim=0) in float32, rounded once to ``dtype``, in a fixed order.

    Args:
        partials: (P, N) float32 with unit column stride (the backward kernels' per-program
            partial sums).
        dtype: the result's dtype (the weight's or bias's).
        out: optional (N,) contiguous tensor of ``dtype`` to write into.

    Returns:
        (N,) tensor of ``dtype``. One launch; bit-identical run to run; graph capturable.
    """
    if partials.dtype != torch.float32 or partials.dim() != 2 or partials.stride(-1) != 1:
        raise ValueError(f"partials must be a (P, N) float32 tensor with unit column stride, got "
                         f"{partials.dtype} of shape {tuple(partials.shape)}, strides {partials.stride()}")
    P, N = partials.shape
    if out is None:
        out = torch.empty(N, dtype=dtype, device=partials.device)
    if N == 0:
        return out
    if P == 0:
        return out.zero_()
    if not use_triton(partials):
        return out.copy_(partials.sum(0))
    block_n = min(next_pow2(N), 256)
    meta, key = cached_meta(BLOCK_P=min(next_pow2(P), 32), BLOCK_N=block_n, num_warps=4)
    launch(_column_sum_kernel, (cdiv(N, block_n),), (partials, out, P, N, partials.stride(0)), meta, key)
    return out
