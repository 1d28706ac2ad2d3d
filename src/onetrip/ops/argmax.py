"""Row-wise argmax over a wide last dimension (the vocabulary), split across many programs.

    argmax(x)[r] = min { i : x[r, i] = max_j x[r, j] }      (first index among ties)

Why a kernel for this: greedy decoding takes the argmax of one (batch, vocab) row of logits
per step, and PyTorch's reduction gives a single row to one block: 36 us per step for a
128256-wide bfloat16 row on an H200 (measured in the decode trace, 2026-11-21), 3% of a
1B model's whole step, for 256 KB that HBM delivers in 0.06 us. Here each row is cut into
tiles of ``BLOCK`` values, one program per (row, tile), and a second tiny kernel reduces
the tiles' winners: two launches of a few microseconds.

Both stages compare one 64-bit key per element, so (value, index) pairs reduce with a
plain ``max``:

    key = (order32(x) << 32) | (2^31 - 1 - i)

``order32`` maps a float32's bits to an int32 with the same order (negative floats have
their magnitude bits flipped), and the low word makes the smaller index win a tie. Like
``torch.argmax``, NaN counts as the largest value; unlike it, -0.0 ranks below +0.0.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._common import call_op, cdiv, check_tensor, next_pow2, pdl_kwargs, pdl_on, use_triton
from ._jit import pdl_start
from ._launch import launch, meta_key

# 2048 values per program: a 128256-wide row is 63 programs, about half an H200's SMs at
# batch 1, each reading 4 KB (bf16); more rows fill the rest.
BLOCK = 2048


@triton.jit
def _key_min():
    # int64 minimum, built from int32 so no literal overflows: no element maps to it.
    return tl.full((1,), -2147483648, tl.int64) << 32


@triton.jit
def _argmax_tiles_kernel(
    x_ptr, ws_ptr,           # x (rows, V) with row stride; ws (rows, n_tiles) int64 keys
    V, stride_xr, n_tiles,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,   # programmatic dependent launch (_common.pdl_mode)
):
    pdl_start(PDL)
    r = tl.program_id(0)
    t = tl.program_id(1)
    i = t * BLOCK + tl.arange(0, BLOCK)
    ok = i < V
    x = tl.load(x_ptr + r.to(tl.int64) * stride_xr + i, mask=ok, other=0.0).to(tl.float32)
    bits = x.to(tl.int32, bitcast=True)
    order = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    order = tl.where(ok, order, -2147483648)            # masked lanes: the int64 minimum
    low = tl.where(ok, 0x7FFFFFFF - i, 0)
    key = (order.to(tl.int64) << 32) | low.to(tl.int64)
    tl.store(ws_ptr + r.to(tl.int64) * n_tiles + t, tl.max(key, axis=0))


@triton.jit
def pick_from_keys(ws_ptr, rows, row_ok, n_tiles, BLOCK_T: tl.constexpr):
    """The second stage for ``rows`` (R,): each row's largest tile key in ws (rows, n_tiles)
    int64 (``tile_keys``), decoded to its index: (R,) int64. Public: ``advance``'s kernel
    folds this stage into a decode step's bookkeeping."""
    t = tl.arange(0, BLOCK_T)
    t_ok = t < n_tiles
    key = tl.load(ws_ptr + rows.to(tl.int64)[:, None] * n_tiles + t[None, :], mask=row_ok[:, None] & t_ok[None, :],
                  other=0)
    key = tl.where(t_ok[None, :], key, _key_min())  # (R, BLOCK_T)
    return 0x7FFFFFFF - (tl.max(key, axis=1) & 0xFFFFFFFF)


@triton.jit
def _argmax_final_kernel(
    ws_ptr, out_ptr,         # ws (rows, n_tiles) int64 keys; out (rows,) int64
    n_tiles,
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    pdl_start(PDL)
    r = tl.program_id(0) + tl.arange(0, 1)
    tl.store(out_ptr + r, pick_from_keys(ws_ptr, r, r >= 0, n_tiles, BLOCK_T))


def tile_keys(x: torch.Tensor) -> torch.Tensor:
    """The first stage alone (x: (rows, V), unit stride along V, on a device the kernels
    run on): the (rows, ceil(V / BLOCK)) int64 winners' keys, for a second stage to reduce
    (``_argmax_final_kernel``, or ``advance.py``'s, which folds it into the step's
    bookkeeping). The workspace depends on shapes alone: capturable in a CUDA graph."""
    rows, V = x.shape
    n_tiles = cdiv(V, BLOCK)
    ws = torch.empty((rows, n_tiles), dtype=torch.int64, device=x.device)
    meta, key = _tiles_meta(pdl_on(x))
    launch(_argmax_tiles_kernel, (rows, n_tiles), (x, ws, V, x.stride()[0], n_tiles), meta, key)
    return ws


@functools.lru_cache(maxsize=4)
def _tiles_meta(pdl: bool) -> tuple[dict, int]:
    """The tiles kernel's constexprs and options, and their ``meta_key``: kept, as a launch needs them at every call."""
    meta = dict(BLOCK=BLOCK, num_warps=4, **pdl_kwargs(pdl))
    return meta, meta_key(meta)


@functools.lru_cache(maxsize=4096)
def _final_meta(block_t: int, pdl: bool) -> tuple[dict, int]:
    """The final kernel's constexprs and options, and their ``meta_key``."""
    meta = dict(BLOCK_T=block_t, num_warps=4, **pdl_kwargs(pdl))
    return meta, meta_key(meta)


@torch.library.custom_op("onetrip::argmax", mutates_args=())
def _argmax_op(x: torch.Tensor) -> torch.Tensor:
    """x: (rows, V) with unit stride along V. Returns (rows,) int64."""
    rows, V = x.shape
    out = torch.empty((rows,), dtype=torch.int64, device=x.device)
    if rows == 0:
        return out
    if not use_triton(x):
        return torch.argmax(x, dim=-1)
    ws = tile_keys(x)
    n_tiles = ws.shape[1]
    meta, key = _final_meta(max(16, next_pow2(n_tiles)), pdl_on(x))
    launch(_argmax_final_kernel, (rows,), (ws, out, n_tiles), meta, key)
    return out


@_argmax_op.register_fake
def _(x):
    return x.new_empty((x.shape[0],), dtype=torch.int64)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """Index of the largest value along the last dimension (the first one among ties).

    Args:
        x: (..., V) float32, float16 or bfloat16, V >= 1 and below 2^31; any strides
            (copied once unless the last dimension has unit stride).

    Returns:
        (...) int64. Matches ``torch.argmax(x, dim=-1)`` except that -0.0 ranks below
        +0.0. Two launches, a workspace sized from the shape: CUDA-graph capturable.
    """
    check_tensor("x", x)
    V = x.shape[-1]
    if V == 0:
        raise ValueError(f"x has shape {tuple(x.shape)}; argmax needs a last dimension of at least 1")
    if V >= 2**31 - 1:
        raise ValueError(f"x's last dimension is {V}; argmax supports fewer than 2^31 - 1 values per row")
    lead = x.shape[:-1]
    rows = x.reshape(-1, V)
    if rows.stride(-1) != 1 and V > 1:
        rows = rows.contiguous()
    return call_op(_argmax_op, rows).reshape(lead)


def argmax_ref(x: torch.Tensor) -> torch.Tensor:
    """The unfused reference: PyTorch's own reduction."""
    return torch.argmax(x, dim=-1)
