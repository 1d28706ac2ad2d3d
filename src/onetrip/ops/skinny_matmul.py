"""Skinny matmuls: y = x @ weight.T (+ bias) for a few rows, as a decode step runs them.

At batch 1 every projection of a decoder is a matrix-vector product. Its traffic is
almost all weight: for the 8B model's gate_up (28672 x 4096, bf16) the weight is 224 MiB
and x and y together 64 KiB, while the arithmetic is 2 FLOP per weight element, far below
what the tensor cores could do in the time the weight takes to stream in. So the kernel's
only job is to read the weight exactly once, at the copy bandwidth:

    each program owns BLOCK_N output columns and walks K in BLOCK_K chunks; every
    (BLOCK_N, BLOCK_K) weight tile is loaded once and used for all M rows of x.

When N / BLOCK_N programs are too few to keep every SM streaming (o_proj of the 8B model,
4096 x 4096, gives 128 programs of 32 columns on 132 SMs), K is split over SPLIT_K
programs per column block: each writes float32 partials to a workspace of
(SPLIT_K, M, N) and a second, small kernel sums them, adds the bias and rounds once.

Rows M > 32 are left to ``torch.nn.functional.linear`` (cuBLAS): there the product is no
longer bandwidth-bound by a wide margin and tensor-core GEMMs are the right tool.

Here: the ops, their checks and reference. The kernels are in ``_gemv_jit.py``, their
launch and its pick (``SkinnyConfig``, ``skinny_config``) in ``_gemv_launch.py``, the
measured batch-1 launches (``GemvPicks``) in ``_gemv_picks.py``.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._common import (
    as_rows,
    call_op,
    check_dtype_match,
    check_same_device,
    check_shape,
    check_tensor,
    gpu_name,
    output,
    rows_out,
    sm_count,
    use_triton,
)
from ._gemv_launch import GEMV_FUSIONS, SkinnyConfig, launch_skinny, no_split, skinny_config
from ._gemv_picks import GEMV_PICKS, GemvPicks
from .glu import silu_mul as glu_silu_mul  # the unfused path of silu_mul_matmul

__all__ = ["GEMV_FUSIONS", "GEMV_PICKS", "GemvPicks", "MAX_ROWS", "SkinnyConfig", "silu_mul_matmul", "skinny_config",
           "skinny_matmul", "skinny_matmul_ref"]

MAX_ROWS = 32  # above this many rows, F.linear (cuBLAS) runs instead


@torch.library.custom_op("onetrip::skinny_matmul", mutates_args=("out",))
def _skinny_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], out: torch.Tensor,
               config: list[int], silu_mul: bool = False) -> None:
    """config: ``SkinnyConfig.as_list()``, picked on the host (``_config``)."""
    if not use_triton(x):
        out.copy_(skinny_matmul_ref(x, weight, bias, silu_mul))
        return
    launch_skinny(x, weight, bias, out, SkinnyConfig.from_list(config), silu_mul)


@_skinny_op.register_fake
def _(x, weight, bias, out, config, silu_mul=False):
    return None


def _check_args(name: str, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                per_column: int) -> tuple[int, int, Optional[torch.Tensor]]:
    """Checks shared by the GEMV entry points: x (..., per_column * K) against weight (N, K)
    and bias (N,). Returns N, K and the bias with unit stride (it is small)."""
    check_tensor(name, x)
    check_tensor("weight", weight)
    k = "K" if per_column == 1 else "F"
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (N, {k}) as nn.Linear stores it, got shape {tuple(weight.shape)}")
    N, K = weight.shape
    if x.shape[-1] != per_column * K:
        need = (f"K = {K}, the second dimension of weight {tuple(weight.shape)}" if per_column == 1 else
                f"{per_column} * F = {per_column * K} for weight {tuple(weight.shape)} (gate and up side by side)")
        raise ValueError(f"{name} has shape {tuple(x.shape)}; its last dimension must be {need}")
    check_dtype_match("weight", weight, name, x)
    if bias is not None:
        check_tensor("bias", bias)
        check_shape("bias", bias, (N,), "(N,): one per output column, N = weight.shape[0]")
        check_dtype_match("bias", bias, name, x)
        bias = bias.contiguous()
    check_same_device(name, x, weight=weight, bias=bias)
    return N, K, bias


def _check_config(config: Optional[SkinnyConfig], picks: GemvPicks) -> None:
    if config is not None and not isinstance(config, SkinnyConfig):
        raise TypeError(f"config must be a SkinnyConfig or None, got {type(config).__name__}")
    if not isinstance(picks, GemvPicks):
        raise TypeError(f"picks must be a GemvPicks, got {type(picks).__name__}")


def _pick(x: torch.Tensor, M: int, N: int, K: int, picks: GemvPicks) -> SkinnyConfig:
    """``skinny_config`` for x's dtype and device (picked on the host, passed to the op)."""
    return skinny_config(M, N, K, sm_count(x.device), x.dtype, gpu=gpu_name(x.device), picks=picks)


def _into_rows(out: torch.Tensor, n: int, run) -> torch.Tensor:
    """``run(y2)`` writes the (M, n) rows of ``out``: into out itself when one row stride
    describes it, else into a scratch copied back."""
    y2, scratch = rows_out(out, n)
    run(y2)
    if scratch:
        out.copy_(y2.view(out.shape))
    return out


def skinny_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
    config: Optional[SkinnyConfig] = None,
    picks: GemvPicks = GEMV_PICKS,
) -> torch.Tensor:
    """y = x @ weight.T + bias for few rows: float32 accumulation, rounded once.

    Args:
        x: (..., K) float32, float16 or bfloat16; M = the product of the leading dimensions.
            Any strides (a layout no single row stride describes is copied; x is small).
        weight: (N, K) of x's dtype and device, as ``nn.Linear`` stores it. Read exactly
            once; any strides, but a unit stride along K is what runs at full bandwidth.
        bias: None, or (N,) of x's dtype.
        out: optional (..., N) tensor of x's dtype to write into; any strides.
        config: a ``SkinnyConfig`` to force (tests, tuning); default ``skinny_config``.
        picks: the measured batch-1 launches ``skinny_config`` reads (``GEMV_PICKS``).

    Returns:
        (..., N) tensor of x's dtype (``out`` when given). For M <= 32 one Triton launch, or
        two with split-K (plus a float32 workspace of split_k * M * N, sized from the shapes
        alone); no host synchronisation, so the call can be captured in a CUDA graph. For
        M > 32 the call is ``torch.nn.functional.linear`` (cuBLAS), copied into ``out``.
    """
    N, K, bias = _check_args("x", x, weight, bias, 1)
    _check_config(config, picks)
    out = output("out", out, x.shape[:-1] + (N,), x.dtype, x.device)
    if out.numel() == 0:
        return out
    x2 = as_rows(x, K)
    if x2.shape[0] > MAX_ROWS:
        out.copy_(F.linear(x, weight, bias))
        return out
    cfg = config or _pick(x, x2.shape[0], N, K, picks)
    return _into_rows(out, N, lambda y2: call_op(_skinny_op, x2, weight, bias, y2, cfg.as_list()))


def silu_mul_matmul(
    gate_up: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
    config: Optional[SkinnyConfig] = None,
    picks: GemvPicks = GEMV_PICKS,
) -> torch.Tensor:
    """y = (silu(gate) * up) @ weight.T (+ bias): a SwiGLU MLP's down projection with the
    activation in the GEMV's prologue (one launch, no (.., F) intermediate in HBM).

    Args:
        gate_up: (..., 2F), the gate in ``[..., :F]`` and up in ``[..., F:]`` (as
            ``silu_mul`` takes it); float32, float16 or bfloat16.
        weight: (N, F) of gate_up's dtype. bias: None or (N,). out: optional (..., N).
        config: a ``SkinnyConfig`` to force (tests, tuning). picks: as ``skinny_matmul``.

    Returns:
        (..., N) of gate_up's dtype. With one row, one Triton launch that computes the
        activation in float32 (not rounded to the dtype first, unlike the unfused pair).
        With more rows: ``silu_mul`` then ``torch.nn.functional.linear``.
    """
    N, F_, bias = _check_args("gate_up", gate_up, weight, bias, 2)
    _check_config(config, picks)
    out = output("out", out, gate_up.shape[:-1] + (N,), gate_up.dtype, gate_up.device)
    if out.numel() == 0:
        return out
    x2 = as_rows(gate_up, 2 * F_)
    if x2.shape[0] != 1 or F_ == 0:
        out.copy_(F.linear(glu_silu_mul(gate_up), weight, bias))
        return out
    cfg = config or _pick(gate_up, 1, N, F_, picks)
    return _into_rows(out, N, lambda y2: call_op(_skinny_op, x2, weight, bias, y2,
                                                 no_split(cfg).as_list(), True))


def skinny_matmul_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                      silu_mul: bool = False) -> torch.Tensor:
    """What a user writes: ``torch.nn.functional.linear`` (cuBLAS on a GPU); with
    ``silu_mul``, x is [gate | up] and the input is F.silu(gate) * up first."""
    if silu_mul:
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    return F.linear(x, weight, bias)
