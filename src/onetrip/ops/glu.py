"""Gated linear units in one pass: y = act(gate) * up, with act SiLU (SwiGLU) or GELU (GeGLU).

The MLP of a Llama-family block computes ``down(act(gate) * up)``, with ``gate`` and
``up`` the two halves of one (..., 2F) projection. Unfused (``silu_mul_ref``), eager
PyTorch launches two kernels and moves, per output element,

    act: read gate, write t      2 passes
    mul: read t, read up, write y 3 passes

5 passes over HBM (10 bytes per element in bf16; ``chunk`` is a free view). The fused
kernel reads gate and up and writes y: 3 passes (6 bytes in bf16), 40% less traffic, and
t never rounds to bf16.

The backward (``_glu_backward_kernel``) reads dy, gate and up and writes
dgate = dy * up * act'(gate) and dup = dy * act(gate): 5 passes (10 bytes in bf16), with
act recomputed from the saved gate; for a packed gate_up both halves of its (..., 2F)
gradient are written by the one kernel.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._jit import cast_out, gelu, gelu_and_grad, pdl_start, row_tile, silu, silu_and_grad
from ._common import (
    TileConfig,
    as_rows,
    call_op,
    cdiv,
    check_dtype_match,
    check_no_out,
    check_same_device,
    check_shape,
    check_tensor,
    empty_as,
    gpu_name,
    gpu_table_entry,
    needs_grad,
    output,
    pdl_kwargs,
    pdl_on,
    rows_out,
    tile_config,
    use_triton,
)
from ._launch import launch, meta_key

APPROXIMATIONS = ("tanh", "none")
# The custom op's ``activation`` argument, and the kernel's ACTIVATION constexpr for it.
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1, "gelu_erf": 2}
_GELU = {"tanh": "gelu_tanh", "none": "gelu_erf"}


@triton.jit
def _glu_kernel(
    gate_ptr, up_ptr, y_ptr,  # each (M, N) with unit column stride and its own row stride (PACKED: see below)
    M, N,
    stride_gm, stride_um, stride_ym,
    ACTIVATION: tl.constexpr,  # 0 silu, 1 gelu (tanh), 2 gelu (erf)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    # C_N > 0: N and the three row strides (C_SG, C_SU, C_SY) as compile-time constants, as
    # torch.compile's static-shape kernels have them, so the tile's index math folds.
    C_N: tl.constexpr = 0,
    C_SG: tl.constexpr = 0,
    C_SU: tl.constexpr = 0,
    C_SY: tl.constexpr = 0,
    EVEN: tl.constexpr = False,  # the tiles cover M x N exactly: no masks
    PDL: tl.constexpr = 0,  # programmatic dependent launch (_common.pdl_mode says why)
    # gate_ptr holds (M, 2N) rows, up their right half (up_ptr unused, stride_um = stride_gm):
    # the launcher then passes one tensor, not two views of it (~2.5 us of host time each)
    PACKED: tl.constexpr = False,
):
    pdl_start(PDL)
    # ACTIVATION is constexpr so that each variant compiles to straight-line code holding
    # only its own exp or erf: no per-element branch, one kernel body for all three.
    if C_N > 0:
        N = C_N
        stride_gm = C_SG
        stride_um = C_SU
        stride_ym = C_SY
    if PACKED:
        up_ptr = gate_ptr + N
    rows64, cols, mask = row_tile(M, N, BLOCK_M, BLOCK_N, EVEN)
    g = tl.load(gate_ptr + rows64[:, None] * stride_gm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + rows64[:, None] * stride_um + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == 0:
        a = silu(g)
    else:
        a = gelu(g, ACTIVATION == 1)
    tl.store(y_ptr + rows64[:, None] * stride_ym + cols[None, :], cast_out(a * u, y_ptr.dtype.element_ty), mask=mask)


# A program's tile, (elements, warps): GLU_TILE unless GLU_TILE_GPU has one for the GPU model
# (a part of the device's name); a smaller tile (few narrow rows) keeps the tile's elements a
# thread with fewer warps. H200: 8 elements a thread (one 16-byte load of each input), +0.3-0.6%
# of copy at 2**26 elements and +0.8% at 4096 x 4096 against bias_gelu's 16. H100: 4 a thread,
# silu_mul 1.010-1.013x torch.compile at the 2**26-element shapes against 0.998-1.000x at (2048, 8).
GLU_TILE = (2048, 8)
GLU_TILE_GPU = {"H100": {"tile": (1024, 8)}}


def glu_tile_config(M: int, N: int, tile_warps: tuple[int, int]) -> TileConfig:
    """The (M, N) problem's tile for a table entry (elements, warps): its elements a thread
    kept where few narrow rows leave a smaller tile."""
    tile, warps = tile_warps
    return tile_config(M, N, tile=tile, num_warps=warps, per_thread=tile // (32 * warps))


@functools.lru_cache(maxsize=4096)  # a launch asks at every call: the GPU table lookup costs ~0.8 us
def _default_tile(M: int, N: int, device: torch.device) -> TileConfig:
    """The forward's tile for (M, N) on ``device`` (GLU_TILE_GPU for this GPU model, else
    GLU_TILE); the backward takes the same."""
    return glu_tile_config(M, N, gpu_table_entry(GLU_TILE_GPU, gpu_name(device), "tile") or GLU_TILE)


def _launch(gate: torch.Tensor, up: Optional[torch.Tensor], y: torch.Tensor, activation: str,
            config: TileConfig | None = None, const: bool = True):
    """Launch on 2-D views: gate, up, y (M, N), each with unit column stride; or, with
    ``up`` None, gate the (M, 2N) rows whose halves are the gate and up.

    ``up`` may be ``gate`` shifted by N columns (the halves of one (M, 2N) tensor).
    ``config``: default the GPU model's tile (GLU_TILE_GPU, else GLU_TILE).
    ``const`` (default True): N and the row strides compiled in (a kernel per width and
    layout; M stays a runtime value), and no masks where the tiles cover the rows exactly,
    as torch.compile's static-shape kernels have them. H100: silu_mul at the 32 MiB shapes
    0.994-0.995 -> 0.998x torch.compile. False: one kernel for every width.
    Returns the compiled kernel (its ``n_regs``, ``n_spills``), or None when nothing ran.
    """
    M, N = y.shape
    if M == 0 or N == 0:
        return None
    config = config or _default_tile(M, N, gate.device)
    grid = (cdiv(M, config.block_m) * cdiv(N, config.block_n),)
    sg, sy = gate.stride()[0], y.stride()[0]  # stride(0) parses its argument: twice stride()'s cost
    su = sg if up is None else up.stride()[0]
    even = const and M % config.block_m == 0 and N % config.block_n == 0
    meta, key = _meta(activation, config.block_m, config.block_n, config.num_warps, even, up is None, pdl_on(gate),
                      (N, sg, su, sy) if const else None)
    return launch(_glu_kernel, grid, (gate, gate if up is None else up, y, M, N, sg, su, sy), meta, key)


@functools.lru_cache(maxsize=4096)
def _meta(activation: str, block_m: int, block_n: int, num_warps: int, even: bool, packed: bool, pdl: bool,
          const: Optional[tuple]) -> tuple[dict, int]:
    """The forward's constexprs and options (``const``: the width and row strides compiled
    in), and their ``meta_key``: kept, as a launch needs them at every call."""
    meta = dict(ACTIVATION=ACTIVATIONS[activation], BLOCK_M=block_m, BLOCK_N=block_n, EVEN=even, PACKED=packed,
                num_warps=num_warps, **pdl_kwargs(pdl))
    if const is not None:
        meta.update(C_N=const[0], C_SG=const[1], C_SU=const[2], C_SY=const[3])
    return meta, meta_key(meta)


@torch.library.custom_op("onetrip::glu", mutates_args=("out",))
def _glu_op(gate: torch.Tensor, up: Optional[torch.Tensor], out: torch.Tensor, activation: str) -> None:
    """out (M, N) from gate, up (M, N); with up None, gate is the (M, 2N) packed rows."""
    if use_triton(gate):
        _launch(gate, up, out, activation)
    elif activation == "silu":
        out.copy_(silu_mul_ref(gate, up))
    else:
        out.copy_(gelu_mul_ref(gate, up, "tanh" if activation == "gelu_tanh" else "none"))


@_glu_op.register_fake
def _(gate, up, out, activation):
    return None


def _glu(gate_up: torch.Tensor, up: Optional[torch.Tensor], activation: str,
         out: Optional[torch.Tensor]) -> torch.Tensor:
    """Checks, 2-D row views and the custom op, shared by ``silu_mul`` and ``gelu_mul``."""
    check_tensor("gate_up", gate_up)
    if up is None:
        width = gate_up.shape[-1]
        if width % 2:
            raise ValueError(
                f"gate_up has shape {tuple(gate_up.shape)}, an odd last dimension; without up it must be "
                f"(..., 2*F), the gate then the up projection (or pass gate and up as two tensors)"
            )
        N = width // 2
    else:
        check_tensor("up", up)
        N = gate_up.shape[-1]
        check_shape("up", up, gate_up.shape, "the shape of the gate, gate_up, when up is given")
        check_dtype_match("up", up, "gate_up", gate_up)
        check_same_device("gate_up", gate_up, up=up)
    if needs_grad(gate_up, up):
        check_no_out("out", out)
        return _GluFunction.apply(gate_up, up, activation)
    out = output("out", out, gate_up.shape[:-1] + (N,), gate_up.dtype, gate_up.device)
    if out.numel() == 0:
        return out
    gate2, up2, _ = _rows(gate_up, up)
    y2, scratch = rows_out(out, N)
    call_op(_glu_op, gate2, up2, y2, activation)
    if scratch:
        out.copy_(y2.view(out.shape))
    return out


def _rows(gate_up: torch.Tensor, up: Optional[torch.Tensor]) -> tuple[torch.Tensor, Optional[torch.Tensor], int]:
    """(gate, up, N) for the custom ops: (M, N) row views of the gate and up (copies where no
    single row stride describes them), or without ``up`` the (M, 2N) rows of gate_up and None."""
    if up is None:
        N = gate_up.shape[-1] // 2
        return as_rows(gate_up, 2 * N), None, N  # (M, 2N): up is gate + N columns, same row stride
    N = gate_up.shape[-1]
    return as_rows(gate_up, N), as_rows(up, N), N


@triton.jit
def _glu_backward_kernel(
    dy_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr,  # each (M, N) with unit column stride and its own row stride
    M, N,
    stride_dym, stride_gm, stride_um, stride_dgm, stride_dum,
    ACTIVATION: tl.constexpr,  # 0 silu, 1 gelu (tanh), 2 gelu (erf), as the forward's
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr = 0,  # programmatic dependent launch (_common.pdl_mode says why)
    PACKED: tl.constexpr = False,  # gate_ptr holds (M, 2N) rows, up their right half (as the forward's)
    PACKED_GRAD: tl.constexpr = False,  # dgate_ptr holds (M, 2N) rows, dup their right half
):
    pdl_start(PDL)
    if PACKED:
        up_ptr = gate_ptr + N
    if PACKED_GRAD:
        dup_ptr = dgate_ptr + N
    rows64, cols, mask = row_tile(M, N, BLOCK_M, BLOCK_N)
    dy = tl.load(dy_ptr + rows64[:, None] * stride_dym + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + rows64[:, None] * stride_gm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + rows64[:, None] * stride_um + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == 0:
        a, da = silu_and_grad(g)
    else:
        a, da = gelu_and_grad(g, ACTIVATION == 1)
    tl.store(dgate_ptr + rows64[:, None] * stride_dgm + cols[None, :],
             cast_out(dy * u * da, dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + rows64[:, None] * stride_dum + cols[None, :],
             cast_out(dy * a, dup_ptr.dtype.element_ty), mask=mask)


def _launch_backward(dy: torch.Tensor, gate: torch.Tensor, up: Optional[torch.Tensor], dgate: torch.Tensor,
                     dup: Optional[torch.Tensor], activation: str, config: TileConfig | None = None):
    """Launch on 2-D views: dy, gate, up, dgate, dup (M, N), each with unit column stride
    (dup may be dgate shifted by N columns); up None: gate is the (M, 2N) packed rows; dup
    None: dgate is the (M, 2N) packed gradient. ``config``: default the forward's tile."""
    M, N = dy.shape
    if M == 0 or N == 0:
        return None
    config = config or _default_tile(M, N, gate.device)
    grid = (cdiv(M, config.block_m) * cdiv(N, config.block_n),)
    sg, sdg = gate.stride()[0], dgate.stride()[0]
    args = (dy, gate, gate if up is None else up, dgate, dgate if dup is None else dup, M, N,
            dy.stride()[0], sg, sg if up is None else up.stride()[0], sdg, sdg if dup is None else dup.stride()[0])
    return launch(_glu_backward_kernel, grid, args,
                  dict(ACTIVATION=ACTIVATIONS[activation], BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                       PACKED=up is None, PACKED_GRAD=dup is None, num_warps=config.num_warps,
                       **pdl_kwargs(pdl_on(gate))))


@torch.library.custom_op("onetrip::glu_backward", mutates_args=("dgate", "dup"))
def _glu_backward_op(dy: torch.Tensor, gate: torch.Tensor, up: Optional[torch.Tensor], dgate: torch.Tensor,
                     dup: Optional[torch.Tensor], activation: str) -> None:
    """dgate, dup (M, N) from dy, gate, up (M, N); with up None, gate is the packed (M, 2N)
    rows; with dup None, dgate is the packed (M, 2N) gradient and takes dup in its right half
    (one mutated tensor: its halves never alias)."""
    if use_triton(gate):
        _launch_backward(dy, gate, up, dgate, dup, activation)
        return
    N = dy.shape[1]
    if up is None:
        gate, up = gate[:, :N], gate[:, N:]
    if dup is None:
        dgate, dup = dgate[:, :N], dgate[:, N:]
    d, g, u = dy.float(), gate.float(), up.float()  # unfused, in float32
    if activation == "silu":
        s = torch.sigmoid(g)
        a, da = g * s, s * (1 + g * (1 - s))
    else:
        approximate = "tanh" if activation == "gelu_tanh" else "none"
        a = F.gelu(g, approximate=approximate)
        da = torch.ops.aten.gelu_backward(torch.ones_like(g), g, approximate=approximate)
    dgate.copy_(d * u * da)
    dup.copy_(d * a)


@_glu_backward_op.register_fake
def _(dy, gate, up, dgate, dup, activation):
    return None


class _GluFunction(torch.autograd.Function):
    """silu_mul / gelu_mul under autograd: the forward op, then the backward op on the saved
    inputs (gate_up, and up when separate)."""

    @staticmethod
    def forward(ctx, gate_up: torch.Tensor, up: Optional[torch.Tensor], activation: str) -> torch.Tensor:
        gate2, up2, N = _rows(gate_up, up)
        y = torch.empty((*gate_up.shape[:-1], N), dtype=gate_up.dtype, device=gate_up.device)
        if y.numel():
            call_op(_glu_op, gate2, up2, as_rows(y, N), activation)
        ctx.save_for_backward(gate_up, up)
        ctx.activation = activation
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        gate_up, up = ctx.saved_tensors
        gate2, up2, N = _rows(gate_up, up)
        dgate = empty_as(gate_up)
        dup = None if up is None else empty_as(up)
        if dgate.numel():
            call_op(_glu_backward_op, as_rows(dy, N), gate2, up2, as_rows(dgate, dgate.shape[-1]),
                    None if dup is None else as_rows(dup, N), ctx.activation)
        needs = ctx.needs_input_grad
        return dgate if needs[0] else None, dup if needs[1] else None, None


def silu_mul(
    gate_up: torch.Tensor,
    up: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """SwiGLU: y = SiLU(gate) * up = gate * sigmoid(gate) * up, in float32 and rounded once.

    Args:
        gate_up: (..., 2F) float32, float16 or bfloat16, the gate in ``[..., :F]`` and up in
            ``[..., F:]``; or, when ``up`` is given, the gate itself, (..., F). Any strides.
        up: None, or (..., F) of gate_up's shape, dtype and device; any strides.
        out: optional (..., F) tensor of the inputs' dtype to write into; any strides.

    Returns:
        (..., F) tensor of the inputs' dtype (``out`` when given). One kernel launch (plus
        one copy per input, or of ``out``, whose layout no single row stride describes);
        no host synchronisation, so the call can be captured in a CUDA graph.

    Differentiable with respect to gate_up and up: with s = sigmoid(gate),
    dgate = dy * up * s (1 + gate (1 - s)) and dup = dy * SiLU(gate), in float32 and
    rounded once; for a packed gate_up its gradient is one (..., 2F) tensor. gate_up (and
    up) are saved, not y. ``out`` must then be None.
    """
    return _glu(gate_up, up, "silu", out)


def gelu_mul(
    gate_up: torch.Tensor,
    up: Optional[torch.Tensor] = None,
    approximate: str = "tanh",
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """GeGLU: y = GELU(gate) * up, in float32 and rounded once.

    Args:
        gate_up: (..., 2F) float32, float16 or bfloat16, the gate in ``[..., :F]`` and up in
            ``[..., F:]``; or, when ``up`` is given, the gate itself, (..., F). Any strides.
        up: None, or (..., F) of gate_up's shape, dtype and device; any strides.
        approximate: "tanh" (GELU(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))) or
            "none" (0.5 x (1 + erf(x / sqrt(2)))), as in ``torch.nn.functional.gelu``.
        out: optional (..., F) tensor of the inputs' dtype to write into; any strides.

    Returns:
        (..., F) tensor of the inputs' dtype (``out`` when given). One kernel launch (plus
        one copy per input, or of ``out``, whose layout no single row stride describes);
        no host synchronisation, so the call can be captured in a CUDA graph.

    Differentiable with respect to gate_up and up: dgate = dy * up * GELU'(gate) and
    dup = dy * GELU(gate), in float32 and rounded once (GELU' of the chosen form); for a
    packed gate_up its gradient is one (..., 2F) tensor. gate_up (and up) are saved, not y.
    ``out`` must then be None.
    """
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate must be one of {APPROXIMATIONS}, got {approximate!r}")
    return _glu(gate_up, up, _GELU[approximate], out)


def _split(gate_up: torch.Tensor, up: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return gate_up.chunk(2, -1) if up is None else (gate_up, up)


def silu_mul_ref(gate_up: torch.Tensor, up: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Unfused: two kernels, SiLU(gate) rounded to the inputs' dtype in between."""
    gate, up = _split(gate_up, up)
    return F.silu(gate) * up


def gelu_mul_ref(gate_up: torch.Tensor, up: Optional[torch.Tensor] = None, approximate: str = "tanh") -> torch.Tensor:
    """Unfused: two kernels, GELU(gate) rounded to the inputs' dtype in between."""
    gate, up = _split(gate_up, up)
    return F.gelu(gate, approximate=approximate) * up
