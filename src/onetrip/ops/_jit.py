"""@triton.jit helpers shared by the kernels: activations in float32 and the final cast."""

import triton
import triton.language as tl

from ._common import is_interpreting

# Triton's CPU interpreter rounds float32 -> bfloat16 by truncation (and its "rtne" mode
# drops the carry into the exponent), so under the interpreter the cast is done by hand.
# On a GPU the hardware conversion (round to nearest even) is used.
_INTERPRETED_BF16_CAST = tl.constexpr(is_interpreting())


@triton.jit
def cast_out(y, DTYPE: tl.constexpr):
    """Round float32 ``y`` to the output dtype, to nearest even."""
    if _INTERPRETED_BF16_CAST and DTYPE == tl.bfloat16:
        bits = y.to(tl.uint32, bitcast=True)
        bits += ((bits >> 16) & 1) + 0x7FFF
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return y.to(DTYPE)



@triton.jit
def gelu(x, APPROX_TANH: tl.constexpr):
    """GELU of float32 ``x``: the tanh approximation, or the exact erf form."""
    if APPROX_TANH:
        # 0.5 x (1 + tanh(u)) == x * sigmoid(2u): one exp and one reciprocal instead of a
        # tanh, which not every Triton's core language has. 1.5957... = 2 * sqrt(2 / pi).
        return x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
    else:
        return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))  # 1 / sqrt(2)


@triton.jit
def silu(x):
    """x * sigmoid(x) of float32 ``x``."""
    return x * tl.sigmoid(x)


@triton.jit
def row_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's (BLOCK_M, BLOCK_N) tile of an (M, N) problem on a 1-D grid.

    Returns (rows as int64 (BLOCK_M,), cols (BLOCK_N,), mask (BLOCK_M, BLOCK_N)). Column
    blocks vary fastest, so programs that run together stream neighbouring bytes of a row:
    with row blocks fastest, a 16K-wide silu_mul ran 3-5% slower on an H200. Rows are
    64-bit because rows * row stride exceeds 2**31 elements for tensors over 4 GiB.
    """
    pid = tl.program_id(0)
    n_col_blocks = tl.cdiv(N, BLOCK_N)
    rows = (pid // n_col_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (pid % n_col_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    return rows.to(tl.int64), cols, mask
