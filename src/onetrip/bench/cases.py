"""What ``onetrip bench ops`` measures: the ops, their shapes, inputs, bytes and providers.

bytes_moved counts what an ideal kernel must move: each input read once and each output
written once (intermediates of an unfused version are not counted; they are the waste a
fused kernel removes). In elements of the input dtype, for a (rows, width) problem:

    bias_gelu       x, bias -> y                      2 rows*width + width
    rms_norm        x, weight -> y                    2 rows*width + width
    add_rms_norm    x, residual, weight -> y, h       4 rows*width + width
    layer_norm      x, weight, bias -> y              2 rows*width + 2 width
    add_layer_norm  x, residual, weight, bias -> y, h 4 rows*width + 2 width
    silu_mul        gate_up (rows, 2 width) -> y      3 rows*width
    gelu_mul        gate_up (rows, 2 width) -> y      3 rows*width
    rotary          q, k -> q_out, k_out              2 tokens*(heads + kv_heads)*head_dim,
                    plus cos and sin rows: 2 tokens*(rot_dim / 2) float32

Row shapes sweep widths 1K..256K with rows = 2**26 // width (one bf16 tensor = 128 MiB,
so every shape moves >= 256 MiB and a kernel runs >= 60 us on an H200, where launch ramp
and tail cost a few percent at most). Two smaller shapes that ``../shared/ANCHORS.md``
also measured are added off the sweep: 4096 x 4096 and 64 x 262144 (32 MiB per tensor);
its third norm shape, 8192 x 8192, is the sweep's own 8K cell. Nothing here touches a GPU
or imports onetrip's ops at import time, so the CLI can choose Triton's interpreter first.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
PROVIDERS = ("eager", "torch.compile", "liger", "onetrip")
RMS_EPS, LN_EPS = 1e-6, 1e-5
SWEEP_ELEMENTS = 1 << 26  # rows * width: one (rows, width) bf16 tensor is 128 MiB
WIDTHS = tuple(1 << k for k in range(10, 19))  # 1K .. 256K
QUICK_WIDTHS = (1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18)
CHECK_WIDTHS = (1, 17, 1023, 5000)
MIN_BYTES = 64 << 20  # every shape moves at least this much (the floor)
ROTARY_BYTES = 256 << 20  # rotary shapes move at least this much, like the row sweep


@dataclass(frozen=True)
class RowShape:
    """A (rows, width) problem; width is the output's last dimension. ``sweep``: on the width sweep."""

    rows: int
    width: int
    sweep: bool = True

    @property
    def label(self) -> str:
        return f"{self.rows}x{self.width}"

    def fields(self) -> dict:
        return {"shape": self.label, "rows": self.rows, "width": self.width, "sweep": self.sweep}


@dataclass(frozen=True)
class RotaryShape:
    """q (1, tokens, heads, head_dim), k (1, tokens, kv_heads, head_dim); the first rot_dim rotate."""

    name: str
    tokens: int
    heads: int
    kv_heads: int
    head_dim: int
    rot_dim: int

    @property
    def label(self) -> str:
        return f"{self.name} T={self.tokens} H={self.heads}/{self.kv_heads} D={self.head_dim} R={self.rot_dim}"

    def fields(self) -> dict:
        return {"shape": self.label, "rows": self.tokens, "width": None, "sweep": False}


Shape = RowShape | RotaryShape


def row_shapes(quick: bool = False) -> list[RowShape]:
    """The width sweep (rows = 2**26 // width); in a full run also the anchors' 4096 x 4096
    and 64 x 262144 (their third norm shape, 8192 x 8192, is the sweep's 8K cell)."""
    shapes = [RowShape(SWEEP_ELEMENTS // w, w) for w in (QUICK_WIDTHS if quick else WIDTHS)]
    if quick:
        return shapes
    extra = [RowShape(4096, 4096, sweep=False), RowShape(64, 262144, sweep=False)]
    return shapes + extra


def rotary_bytes(s: RotaryShape, dtype: torch.dtype) -> int:
    """q and k read and written; cos and sin (tokens, rot_dim / 2) float32 read."""
    return 2 * s.tokens * (s.heads + s.kv_heads) * s.head_dim * dtype.itemsize + 2 * s.tokens * (s.rot_dim // 2) * 4


ROTARY_CONFIGS = (  # name, heads, kv_heads, head_dim, rot_dim
    ("llama-8b", 32, 8, 128, 128),
    ("qwen-0.5b", 14, 2, 64, 64),
    ("partial", 32, 32, 128, 64),
)


def rotary_shapes(quick: bool = False) -> list[RotaryShape]:
    """Model-like configs, tokens the smallest power of two moving >= 256 MiB in bf16."""
    shapes = []
    for name, h, kv, hd, rot in ROTARY_CONFIGS:
        tokens = 1
        while rotary_bytes(RotaryShape(name, tokens, h, kv, hd, rot), torch.bfloat16) < ROTARY_BYTES:
            tokens *= 2
        shapes.append(RotaryShape(name, tokens, h, kv, hd, rot))
    return shapes


CHECK_ROW_SHAPES = tuple(RowShape(3, w, sweep=False) for w in CHECK_WIDTHS)
CHECK_ROTARY_SHAPES = (RotaryShape("tiny-partial", 5, 4, 2, 16, 8), RotaryShape("tiny", 7, 3, 1, 8, 8))


# ---------------------------------------------------------------------------- inputs and bytes


def _randn(shape, dtype, device, gen, scale=1.0, shift=0.0) -> torch.Tensor:
    return (torch.randn(shape, device=device, generator=gen) * scale + shift).to(dtype)


def _row_inputs(n_rows: int, n_vectors: int, row_mult: int = 1):
    """Inputs: ``n_rows`` tensors of (rows, row_mult * width), then ``n_vectors`` of (width,)."""

    def make(s: RowShape, dtype, device, gen):
        rows = [_randn((s.rows, row_mult * s.width), dtype, device, gen) for _ in range(n_rows)]
        vecs = [_randn((s.width,), dtype, device, gen, 0.1, 1.0 if i == 0 else 0.0) for i in range(n_vectors)]
        return tuple(rows + vecs)

    return make


def _row_bytes(rows_in: int, rows_out: int, vectors: int):
    """Bytes = (row tensors read + row tensors written) * rows * width + vectors * width, in elements."""

    def count(s: RowShape, dtype: torch.dtype) -> int:
        return ((rows_in + rows_out) * s.rows * s.width + vectors * s.width) * dtype.itemsize

    return count


def _rotary_inputs(s: RotaryShape, dtype, device, gen):
    q = _randn((s.tokens, s.heads, s.head_dim), dtype, device, gen).view(1, s.tokens, s.heads, s.head_dim)
    k = _randn((s.tokens, s.kv_heads, s.head_dim), dtype, device, gen).view(1, s.tokens, s.kv_heads, s.head_dim)
    inv_freq = 10000.0 ** (-torch.arange(0, s.rot_dim, 2, device=device, dtype=torch.float32) / s.rot_dim)
    angles = torch.arange(s.tokens, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return q, k, angles.cos(), angles.sin()  # cos, sin: (tokens, rot_dim / 2) float32


def _head_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    return t[:n] if t.dim() >= 2 else t


def _head_tokens(t: torch.Tensor, n: int) -> torch.Tensor:
    return t[:, :n] if t.dim() == 4 else t[:n]


# ---------------------------------------------------------------------------- providers


def _ref(module: str, name: str, *args):
    """Factory of ``onetrip.ops.<module>.<name>(*inputs, *args)``, imported when called."""

    def make():
        fn = getattr(importlib.import_module(f"onetrip.ops.{module}"), name)
        return lambda *inputs: fn(*inputs, *args)

    return make


def _fused(name: str, **kwargs):
    def call(*inputs):
        import onetrip

        return getattr(onetrip, name)(*inputs, **kwargs)

    return call


def _liger(module: str, cls: str, *args, split: bool = False):
    """Builder of a zero-argument call of ``liger_kernel.ops.<module>.<cls>.apply``.

    split: pass gate_up's halves as two contiguous (rows, width) tensors, as Liger takes
    them (made here, outside the timed call; the same bytes are counted).
    """

    def build(inputs):
        fn = getattr(importlib.import_module(f"liger_kernel.ops.{module}"), cls).apply
        if split:
            inputs = tuple(h.contiguous() for h in inputs[0].chunk(2, dim=-1))
        return lambda: fn(*inputs, *args)

    return build


@dataclass(frozen=True)
class OpCase:
    """One op of the suite.

    make_inputs(shape, dtype, device, generator): the op's tensor arguments.
    bytes_moved(shape, dtype): each input read once + each output written once.
    ref(): the unfused reference taking only the tensors (eager; torch.compile compiles it).
    fused(*inputs): onetrip's op. liger(inputs): a zero-argument call of Liger's kernel, or None.
    shapes(quick): the timed shapes; check_shapes: small awkward shapes for the CPU check.
    head(t, n): the first n rows (tokens) of an input or output, to check accuracy on.
    """

    name: str
    make_inputs: Callable
    bytes_moved: Callable
    ref: Callable
    fused: Callable
    liger: Callable | None
    shapes: Callable
    check_shapes: tuple = CHECK_ROW_SHAPES
    head: Callable = _head_rows


CASES = (
    OpCase("bias_gelu", _row_inputs(1, 1), _row_bytes(1, 1, 1), _ref("bias_gelu", "bias_gelu_ref", "tanh"),
           _fused("bias_gelu", approximate="tanh"), None, row_shapes),
    OpCase("rms_norm", _row_inputs(1, 1), _row_bytes(1, 1, 1), _ref("norm", "rms_norm_ref", RMS_EPS),
           _fused("rms_norm", eps=RMS_EPS), _liger("rms_norm", "LigerRMSNormFunction", RMS_EPS, 0.0, "llama", False),
           row_shapes),
    OpCase("add_rms_norm", _row_inputs(2, 1), _row_bytes(2, 2, 1), _ref("norm", "add_rms_norm_ref", RMS_EPS),
           _fused("add_rms_norm", eps=RMS_EPS),
           _liger("fused_add_rms_norm", "LigerFusedAddRMSNormFunction", RMS_EPS, 0.0, "llama", False), row_shapes),
    OpCase("layer_norm", _row_inputs(1, 2), _row_bytes(1, 1, 2), _ref("norm", "layer_norm_ref", LN_EPS),
           _fused("layer_norm", eps=LN_EPS), _liger("layer_norm", "LigerLayerNormFunction", LN_EPS), row_shapes),
    OpCase("add_layer_norm", _row_inputs(2, 2), _row_bytes(2, 2, 2), _ref("norm", "add_layer_norm_ref", LN_EPS),
           _fused("add_layer_norm", eps=LN_EPS), None, row_shapes),
    OpCase("silu_mul", _row_inputs(1, 0, row_mult=2), _row_bytes(2, 1, 0), _ref("glu", "silu_mul_ref"),
           _fused("silu_mul"), _liger("swiglu", "LigerSiLUMulFunction", split=True), row_shapes),
    OpCase("gelu_mul", _row_inputs(1, 0, row_mult=2), _row_bytes(2, 1, 0), _ref("glu", "gelu_mul_ref", None, "tanh"),
           _fused("gelu_mul", approximate="tanh"), _liger("geglu", "LigerGELUMulFunction", split=True), row_shapes),
    OpCase("rotary", _rotary_inputs, rotary_bytes, _ref("rotary", "apply_rotary_ref"),
           _fused("apply_rotary", inplace=False), None, rotary_shapes, CHECK_ROTARY_SHAPES, _head_tokens),
)
OPS = {case.name: case for case in CASES}
OP_NAMES = tuple(OPS)


def onetrip_has(case: OpCase) -> bool:
    """Whether onetrip's op exists yet (its function is exported by onetrip.ops)."""
    import onetrip.ops

    return hasattr(onetrip.ops, "apply_rotary" if case.name == "rotary" else case.name)


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None
