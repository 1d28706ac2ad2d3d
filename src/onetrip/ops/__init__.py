"""onetrip's fused ops: one file per op, each with its Triton kernel, launcher,
torch custom-op registration and an unfused PyTorch reference (``*_ref``). The element-wise
ops, the norms, rotary and attention are differentiable; the losses compute their gradient
in the forward."""

from .allreduce_norm import allreduce_add_rms_norm, allreduce_add_rms_norm_ref
from .append_attention import append_attention, append_attention_ref
from .append_kv import append_kv, append_kv_ref
from .argmax import argmax, argmax_ref
from .bias_gelu import bias_gelu, bias_gelu_ref
from .cross_entropy import cross_entropy, cross_entropy_ref
from .decode_attention import decode_attention, decode_attention_ref
from .flash_attention import attention_ref, flash_attention
from .glu import gelu_mul, gelu_mul_ref, silu_mul, silu_mul_ref
from .linear_cross_entropy import linear_cross_entropy, linear_cross_entropy_ref
from .rotary import apply_rotary, apply_rotary_ref
from .norm import (
    add_layer_norm,
    add_layer_norm_ref,
    add_rms_norm,
    add_rms_norm_ref,
    layer_norm,
    layer_norm_ref,
    rms_norm,
    rms_norm_ref,
)

__all__ = [
    "bias_gelu", "bias_gelu_ref",
    "silu_mul", "silu_mul_ref", "gelu_mul", "gelu_mul_ref",
    "apply_rotary", "apply_rotary_ref",
    "decode_attention", "decode_attention_ref", "append_kv", "append_kv_ref",
    "append_attention", "append_attention_ref",
    "flash_attention", "attention_ref",
    "argmax", "argmax_ref",
    "cross_entropy", "cross_entropy_ref", "linear_cross_entropy", "linear_cross_entropy_ref",
    "add_rms_norm", "add_rms_norm_ref", "rms_norm", "rms_norm_ref",
    "add_layer_norm", "add_layer_norm_ref", "layer_norm", "layer_norm_ref",
    "allreduce_add_rms_norm", "allreduce_add_rms_norm_ref",
]
