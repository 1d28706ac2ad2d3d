"""@triton.jit helpers shared by the kernels: activations in float32, tanh, the attention
kernels' tensor-core product, and the final cast."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

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
def pdl_start(PDL: tl.constexpr):
    """With programmatic dependent launch (``PDL`` > 0, see ``_common.pdl_mode``) a kernel
    may be scheduled while the previous one drains: wait for that kernel's writes before
    the first dependent load, then let the next kernel's programs be scheduled as this
    grid's last wave frees the SMs. A no-op at PDL = 0 (compiled out)."""
    if PDL > 0:
        gdc_wait()
        gdc_launch_dependents()


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
def row_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr = False):
    """This program's (BLOCK_M, BLOCK_N) tile of an (M, N) problem on a 1-D grid.

    Returns (rows as int64 (BLOCK_M,), cols (BLOCK_N,), mask (BLOCK_M, BLOCK_N)); EVEN (the
    tiles cover M x N exactly): the mask is a constant, which the compiler drops. Column
    blocks vary fastest, so programs that run together stream neighbouring bytes of a row:
    with row blocks fastest, a 16K-wide silu_mul ran 3-5% slower on an H200. Rows are
    64-bit because rows * row stride exceeds 2**31 elements for tensors over 4 GiB.
    """
    pid = tl.program_id(0)
    n_col_blocks = tl.cdiv(N, BLOCK_N)
    rows = (pid // n_col_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (pid % n_col_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    if EVEN:
        mask = tl.full((BLOCK_M, BLOCK_N), 1, tl.int1)
    else:
        mask = (rows < M)[:, None] & (cols < N)[None, :]
    return rows.to(tl.int64), cols, mask


# Triton's interpreter multiplies bfloat16 tiles wrongly in tl.dot (it stores them as
# uint16: errors of 1e10 on unit-normal inputs), so under it the operands are widened to
# float32 first: exact products accumulated in float32, which is what the tensor cores do.
_INTERPRETED_DOT = tl.constexpr(is_interpreting())


@triton.jit
def dot_f32(a, b, PRECISION: tl.constexpr):
    """a @ b accumulated in float32 (``PRECISION``: "ieee" for float32 operands, else "tf32")."""
    if _INTERPRETED_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def tanh(x):
    """tanh of float32 ``x`` from exp (libdevice's tanh is not in the interpreter).

    (1 - e) / (1 + e) with e = exp(-2|x|) loses relative accuracy as |x| -> 0 (1 - e
    cancels), so below 0.25 an odd Taylor polynomial is used; its first omitted term is
    below 1e-10 there.
    """
    a = tl.abs(x)
    e = tl.exp(-2.0 * a)
    big = (1.0 - e) / (1.0 + e)
    x2 = x * x
    poly = -17.0 / 315 + x2 * (62.0 / 2835 + x2 * (-1382.0 / 155925))
    small = a * (1.0 + x2 * (-1.0 / 3 + x2 * (2.0 / 15 + x2 * poly)))
    t = tl.where(a < 0.25, small, big)
    return tl.where(x < 0, -t, t)


@triton.jit
def sigmoid_pair(z):
    """sigmoid(z) and 1 - sigmoid(z) = sigmoid(-z) of float32 ``z``, both to full relative
    accuracy from one exp(-|z|): 1 - s computed by subtraction loses it as s -> 1, which
    took a tanh-GELU derivative at 37 x 1023 float32 from 0.8e-6 (PyTorch's error) to 4.3e-6."""
    e = tl.exp(-tl.abs(z))
    r = 1.0 / (1.0 + e)
    pos = z >= 0
    return tl.where(pos, r, e * r), tl.where(pos, e * r, r)


@triton.jit
def gelu_and_grad(x, APPROX_TANH: tl.constexpr):
    """GELU(x) and its derivative of float32 ``x`` (the backward of bias_gelu and gelu_mul).

    tanh: GELU = x s with s = sigmoid(z), z = 2 sqrt(2/pi) (x + 0.044715 x^3), so
    GELU' = s + x s (1 - s) z', z' = 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2).
    erf: GELU = x Phi(x), GELU' = Phi(x) + x phi(x), phi the standard normal density.
    """
    if APPROX_TANH:
        s, s_neg = sigmoid_pair(1.5957691216057308 * (x + 0.044715 * x * x * x))  # 2 * sqrt(2 / pi)
        dz = 1.5957691216057308 + 0.21406444881780076 * x * x  # 2 sqrt(2/pi) * 3 * 0.044715
        return x * s, s + x * s * s_neg * dz
    else:
        cdf = 0.5 * (1.0 + tl.erf(x * 0.7071067811865476))  # 1 / sqrt(2)
        return x * cdf, cdf + x * 0.3989422804014327 * tl.exp(-0.5 * x * x)  # 1 / sqrt(2 pi)


@triton.jit
def silu_and_grad(x):
    """SiLU(x) = x s and its derivative s (1 + x (1 - s)) of float32 ``x``, s = sigmoid(x)."""
    s, s_neg = sigmoid_pair(x)
    return x * s, s * (1.0 + x * s_neg)
