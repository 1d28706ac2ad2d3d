"""Batch-1 GEMVs that carry a pre-norm decoder's residual add and RMSNorm between them.

At batch 1 a Llama layer is GEMV, attention, GEMV, ... with an ``add_rms_norm`` between
the output projections and the next input projections:

    h      = x @ Wo^T + residual                  (o_proj, or down_proj of the MLP)
    normed = h * rsqrt(mean(h^2) + eps) * g       (RMSNorm, Llama convention)
    y      = normed @ Wqkv^T                      (qkv, or gate_up)

Unfused, the norm is its own launch (~1.5 us on an H200 for a 4-8 KB row: launch,
ramp-up and tail, not bytes), twice per layer: 65 launches a step for the 8B model. Here
it dissolves into the two GEMVs:

    gemv_add_residual   epilogue: h = x @ W^T + residual, stored once, and each program's
                        sum of h^2 over its columns (one float32 per program)
    gemv_rms_norm       prologue: mean(h^2) from those partials (summed in a fixed order:
                        deterministic, no atomics, nothing to zero between steps), then
                        each weight chunk multiplies h * rstd * g

The partials are ``cdiv(N, block_n)`` floats (256-512 for 1B/8B), which every program of
the consumer reads from L2 (2 KB): cheap against the 16-32 KB of weight each streams.
Accumulation is float32 throughout; h is rounded once to the dtype (it is the residual
stream) and its statistic is taken of the rounded values, as the unfused norm sees them.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import triton

from ._common import (call_op, check_dtype_match, check_same_device, check_shape, check_tensor, gpu_name, pdl_args,
                      sm_count, use_triton)
from ._gemv_launch import SkinnyConfig, launch_skinny, no_split, skinny_config
from ._gemv_picks import GEMV_PICKS, GemvPicks


def _one_row(name: str, t: torch.Tensor, width: int) -> torch.Tensor:
    if t.numel() != width or t.shape[-1] != width:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected one row of {width} values "
                         f"(..., {width}) with every leading dimension 1")
    return t.reshape(1, width) if t.stride(-1) == 1 else t.reshape(1, width).contiguous()


def _check_weight(weight: torch.Tensor, x: torch.Tensor, k: int) -> tuple[int, int]:
    check_tensor("weight", weight)
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"weight has shape {tuple(weight.shape)}; expected (N, {k}) as nn.Linear stores it")
    check_dtype_match("weight", weight, "x", x)
    return weight.shape


def _config(n: int, k: int, device: torch.device, dtype: torch.dtype, fusion: str, picks: GemvPicks) -> SkinnyConfig:
    """The one-row launch of an (n, k) weight carrying ``fusion``: ``skinny_config``, no split."""
    if not isinstance(picks, GemvPicks):
        raise TypeError(f"picks must be a GemvPicks, got {type(picks).__name__}")
    cfg = skinny_config(1, n, k, sm_count(device), dtype, fusion=fusion, gpu=gpu_name(device), picks=picks)
    return no_split(cfg)


def _residual_config(n: int, k: int, device: torch.device, dtype: torch.dtype, silu_mul: bool,
                     picks: GemvPicks) -> SkinnyConfig:
    return _config(n, k, device, dtype, "silu_residual" if silu_mul else "residual", picks)


def partials(n: int, k: int, device: torch.device, dtype: torch.dtype, silu_mul: bool = False, *,
             picks: GemvPicks = GEMV_PICKS) -> int:
    """How many sums of squares ``gemv_add_residual`` writes for an (n, k) weight: its grid."""
    return triton.cdiv(n, _residual_config(n, k, device, dtype, silu_mul, picks).block_n)


def loads_weight_early(weight: torch.Tensor, silu_mul: bool = False, *, picks: GemvPicks = GEMV_PICKS) -> bool:
    """Whether ``gemv_add_residual`` with this (n, k) weight, launched under PDL, loads its
    whole weight before it waits for the previous kernel (its launch's early chunks cover
    k): then the kernel before it gains by triggering it early (``append_attention``'s
    ``trigger_next``), since only x and the residual are waited for."""
    if not (weight.is_cuda and pdl_args(weight)):
        return False
    n, k = weight.shape
    cfg = _residual_config(n, k, weight.device, weight.dtype, silu_mul, picks)
    return cfg.block_m == 1 and cfg.early * cfg.block_k >= k


@torch.library.custom_op("onetrip::gemv_add_residual", mutates_args=("h", "ss"))
def _residual_op(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, h: torch.Tensor,
                 ss: torch.Tensor, silu_mul: bool, config: list[int]) -> None:
    """config: ``SkinnyConfig.as_list()``, picked on the host (``_residual_config``)."""
    if not use_triton(x):
        hv = gemv_add_residual_ref(x, weight, residual, silu_mul)
        h.copy_(hv)
        ss.zero_()
        ss[0] = hv.float().square().sum()
        return
    launch_skinny(x, weight, None, h, SkinnyConfig.from_list(config), silu_mul, residual=residual, ss_out=ss)


@_residual_op.register_fake
def _(x, weight, residual, h, ss, silu_mul, config):
    return None


@torch.library.custom_op("onetrip::gemv_rms_norm", mutates_args=("out",))
def _norm_op(h: torch.Tensor, ss: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
             bias: Optional[torch.Tensor], out: torch.Tensor, config: list[int]) -> None:
    """config: ``SkinnyConfig.as_list()``, picked on the host (``_config``, fusion "norm")."""
    k = weight.shape[1]
    if not use_triton(h):
        rstd = torch.rsqrt(ss.sum() / k + eps)
        out.copy_(F.linear((h.float() * rstd * norm_weight.float()).to(h.dtype), weight, bias))
        return
    launch_skinny(h, weight, bias, out, SkinnyConfig.from_list(config), ss_in=ss, norm_weight=norm_weight, eps=eps)


@_norm_op.register_fake
def _(h, ss, norm_weight, eps, weight, bias, out, config):
    return None


def gemv_add_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, *,
                      silu_mul: bool = False, picks: GemvPicks = GEMV_PICKS) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x @ weight^T + residual for one row, with h's sum of squares in partials.

    Args:
        x: one row (..., K) (or (..., 2K) = [gate | up] with ``silu_mul``: the input is then
            silu(gate) * up, computed in the prologue); float32, float16 or bfloat16.
        weight: (N, K) of x's dtype. residual: one row of N values, x's dtype.
        silu_mul: SwiGLU in the prologue (the MLP's down projection).
        picks: the measured batch-1 launches (``skinny_matmul.GEMV_PICKS``).

    Returns:
        (h (1, N) of x's dtype, ss (P,) float32): P = ``partials(N, K, silu_mul=silu_mul,
        picks=picks)`` sums of h^2, which only ``gemv_rms_norm`` reads. One launch; capturable.
    """
    check_tensor("x", x)
    k = x.shape[-1] // 2 if silu_mul else x.shape[-1]
    n, _ = _check_weight(weight, x, k)
    x2 = _one_row("x", x, 2 * k if silu_mul else k)
    check_tensor("residual", residual)
    check_dtype_match("residual", residual, "x", x)
    r2 = _one_row("residual", residual, n)
    check_same_device("x", x, weight=weight, residual=residual)
    cfg = _residual_config(n, k, x.device, x.dtype, silu_mul, picks)
    h = torch.empty((1, n), dtype=x.dtype, device=x.device)
    ss = torch.empty((triton.cdiv(n, cfg.block_n),), dtype=torch.float32, device=x.device)
    call_op(_residual_op, x2, weight, r2, h, ss, silu_mul, cfg.as_list())
    return h, ss


def gemv_rms_norm(h: torch.Tensor, ss: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                  weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                  picks: GemvPicks = GEMV_PICKS) -> torch.Tensor:
    """y = rms_norm(h) @ weight^T (+ bias) for one row, with the norm in the prologue.

    Args:
        h, ss: as ``gemv_add_residual`` returned them (h one row of K values).
        norm_weight: (K,) RMSNorm gain of h's dtype (Llama: applied after normalising).
        eps: RMSNorm's epsilon. weight: (N, K); bias: None or (N,).
        picks: the measured batch-1 launches (``skinny_matmul.GEMV_PICKS``).

    Returns:
        (1, N) of h's dtype. One launch; capturable.
    """
    check_tensor("h", h)
    k = h.shape[-1]
    n, _ = _check_weight(weight, h, k)
    h2 = _one_row("h", h, k)
    if not isinstance(ss, torch.Tensor) or ss.dtype != torch.float32 or ss.dim() != 1:
        raise TypeError("ss must be the float32 partials that gemv_add_residual returned with h")
    check_tensor("norm_weight", norm_weight)
    check_shape("norm_weight", norm_weight, (k,), "(K,): one gain per input column")
    check_dtype_match("norm_weight", norm_weight, "h", h)
    if bias is not None:
        check_shape("bias", bias, (n,), "(N,)")
        check_dtype_match("bias", bias, "h", h)
    check_same_device("h", h, ss=ss, norm_weight=norm_weight, weight=weight, bias=bias)
    cfg = _config(n, k, h.device, h.dtype, "norm", picks)
    out = torch.empty((1, n), dtype=h.dtype, device=h.device)
    call_op(_norm_op, h2, ss, norm_weight.contiguous(), float(eps), weight,
            bias.contiguous() if bias is not None else None, out, cfg.as_list())
    return out


def gemv_add_residual_ref(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor,
                          silu_mul: bool = False) -> torch.Tensor:
    """Op by op: (silu(gate) * up if silu_mul), linear, then the residual add."""
    if silu_mul:
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    return F.linear(x, weight).reshape(1, -1) + residual.reshape(1, -1)


def gemv_rms_norm_ref(h: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                      bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Op by op: HF's LlamaRMSNorm (float32 statistic, cast, gain), then linear."""
    var = h.float().pow(2).mean(-1, keepdim=True)
    normed = (h.float() * torch.rsqrt(var + eps)).to(h.dtype) * norm_weight
    return F.linear(normed, weight, bias).reshape(1, -1)
