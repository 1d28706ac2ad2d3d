"""Bias + GELU in one pass: y = GELU(x + bias).

The unfused version (``bias_gelu_ref``) launches two kernels and moves
read x + write t + read t + write y = 4 bytes-per-element passes over HBM
(8 per element in bf16, plus the bias); the fused kernel moves 2 (read x, write y).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._jit import cast_out, gelu, pdl_start, row_tile
from ._common import (
    TileConfig,
    as_rows,
    call_op,
    check_dtype_match,
    check_same_device,
    check_shape,
    check_tensor,
    output,
    pdl_args,
    rows_out,
    tile_config,
    use_triton,
)

APPROXIMATIONS = ("tanh", "none")


@triton.jit
def _bias_gelu_kernel(
    x_ptr, bias_ptr, y_ptr,  # x, y: (M, N) with unit column stride; bias: (N,)
    M, N,
    stride_xm, stride_ym,
    HAS_BIAS: tl.constexpr,
    APPROX_TANH: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr = 0,  # programmatic dependent launch (_common.pdl_mode says why)
):
    pdl_start(PDL)
    rows64, cols, mask = row_tile(M, N, BLOCK_M, BLOCK_N)
    x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    y = gelu(x, APPROX_TANH)
    tl.store(y_ptr + rows64[:, None] * stride_ym + cols[None, :], cast_out(y, y_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, bias: Optional[torch.Tensor], y: torch.Tensor, approximate: str,
            config: TileConfig | None = None):
    """Launch on 2-D views: x, y (M, N) with unit column stride; bias (N,) contiguous or None.

    Returns the compiled kernel (its ``n_regs``, ``n_spills``), or None when nothing ran.
    """
    M, N = x.shape
    if M == 0 or N == 0:
        return None
    cfg = config or tile_config(M, N)
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
    return _bias_gelu_kernel[grid](
        x, bias if bias is not None else x, y,
        M, N,
        x.stride(0), y.stride(0),
        HAS_BIAS=bias is not None,
        APPROX_TANH=approximate == "tanh",
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        num_warps=cfg.num_warps, **pdl_args(x),
    )


@torch.library.custom_op("onetrip::bias_gelu", mutates_args=("out",))
def _bias_gelu_op(x: torch.Tensor, bias: Optional[torch.Tensor], out: torch.Tensor, approximate: str) -> None:
    if use_triton(x):
        _launch(x, bias, out, approximate)
    else:
        out.copy_(bias_gelu_ref(x, bias, approximate))


@_bias_gelu_op.register_fake
def _(x, bias, out, approximate):
    return None


def bias_gelu(
    x: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    approximate: str = "tanh",
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """y = GELU(x + bias), computed in float32 and rounded once.

    Args:
        x: (..., N) float32, float16 or bfloat16; any strides.
        bias: (N,) of x's dtype, or None for plain GELU.
        approximate: "tanh" (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))) or
            "none" (0.5 x (1 + erf(x / sqrt(2)))), as in ``torch.nn.functional.gelu``.
        out: optional (..., N) tensor of x's dtype to write into.

    Returns:
        (..., N) tensor of x's dtype. One kernel launch; no host synchronisation, so the
        call can be captured in a CUDA graph.
    """
    check_tensor("x", x)
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate must be one of {APPROXIMATIONS}, got {approximate!r}")
    N = x.shape[-1]
    if bias is not None:
        check_tensor("bias", bias)
        check_shape("bias", bias, (N,), "the last dimension of x")
        check_dtype_match("bias", bias, "x", x)
        check_same_device("x", x, bias=bias)
        bias = bias.contiguous()
    out = output("out", out, x.shape, x.dtype, x.device)
    y2, scratch = rows_out(out, N)
    call_op(_bias_gelu_op, as_rows(x, N), bias, y2, approximate)
    if scratch:
        out.copy_(y2.view(out.shape))
    return out


def bias_gelu_ref(x: torch.Tensor, bias: Optional[torch.Tensor] = None, approximate: str = "tanh") -> torch.Tensor:
    """Unfused: two kernels, the sum rounded to x's dtype in between (as eager PyTorch does)."""
    if bias is not None:
        x = x + bias
    return F.gelu(x, approximate=approximate)
