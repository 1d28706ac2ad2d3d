"""What a kernel is, from its name (and the operator that launched it, when known).

The first matching row of ``CATEGORY_PATTERNS`` wins (case-insensitive regex search on the
kernel name). Memcpy/memset activities come from the trace's category, not the name.

    category    name patterns (examples)
    cast        cast, convert, _to_copy, to_dtype, fp8 quantize (also: see ``is_cast``)
    attention   flash, fmha, attention, attn, sdpa
    gemm        gemm, cublas, cutlass, xmma (sm80_xmma, sm90_xmma), nvjet, wgmma, matmul,
                triton_tem_ (Inductor matmul templates), standalone mm/bmm/addmm
    norm        reduce_kernel, norm, softmax, welford, reduction, triton_red_ / triton_per_
                (Inductor reductions)
    elementwise elementwise_kernel (PyTorch's vectorized_/unrolled_ variants), triton_poi_
                (Inductor pointwise), pointwise, gelu, silu, swiglu, act_and_mul, rotary, rope
    other       everything else

Names starting with Inductor's ``triton_poi_`` / ``triton_red_`` / ``triton_per_`` /
``triton_tem_`` are classified by that prefix alone (elementwise / norm / norm / gemm),
since the rest of the name lists every fused op.

A kernel is a cast when its name says so, or when the operator it was launched from is
``aten::_to_copy`` / ``aten::to``, or ``aten::copy_`` whose two recorded input types
differ (PyTorch runs all three as ``direct_copy_kernel_cuda``, an elementwise kernel).
"""

from __future__ import annotations

import re

from .trace import CpuOp, Kernel

CATEGORIES = ("elementwise", "norm", "cast", "gemm", "attention", "memcpy", "memset", "other")
FUSIBLE = frozenset({"elementwise", "norm", "cast"})  # memory-bound kernels a fused kernel can absorb

CATEGORY_PATTERNS = (  # Inductor's prefixes first: its fused names list every op ("..._to_copy_add_mean...")
    ("elementwise", re.compile(r"^triton_poi_")),
    ("norm", re.compile(r"^triton_(red|per)_")),
    ("gemm", re.compile(r"^triton_tem_")),
    ("cast", re.compile(r"cast|convert|_to_copy|to_dtype|quantize", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|cublas|cutlass|xmma|nvjet|wgmma|matmul|triton_tem_|(^|[^a-z])(b|add)?mm([^a-z]|$)",
                        re.I)),
    ("norm", re.compile(r"reduce_kernel|norm(?!al)|softmax|welford|reduction|triton_red_|triton_per_", re.I)),
    ("elementwise", re.compile(r"elementwise|triton_poi_|pointwise|gelu|silu|swiglu|act_and_mul|rotary|rope", re.I)),
)
CAST_OPS = frozenset({"aten::_to_copy", "aten::to"})


def category_of_name(name: str) -> str:
    """The category of a kernel from its name alone (``other`` when no pattern matches)."""
    for category, pattern in CATEGORY_PATTERNS:
        if pattern.search(name):
            return category
    return "other"


def is_cast(op: CpuOp | None) -> bool:
    """True when ``op`` converts between dtypes (see the module docstring)."""
    if op is None:
        return False
    if op.name in CAST_OPS:
        return True
    if op.name == "aten::copy_" and op.input_types and len(op.input_types) >= 2:
        a, b = op.input_types[0], op.input_types[1]
        return bool(a) and bool(b) and a != b
    return False


def classify(kernel: Kernel, op: CpuOp | None) -> str:
    """The category of ``kernel``, given the operator that launched it (or None)."""
    if kernel.kind != "kernel":
        return kernel.kind
    category = category_of_name(kernel.name)
    if category in ("elementwise", "other") and is_cast(op):
        return "cast"
    return category


FUNCTOR = re.compile(r"\w*(?:Functor|Ops|_kernel_cuda|KernelImpl)\w*")


def short_name(name: str, width: int = 60) -> str:
    """A readable kernel name: C++ template arguments, argument lists and ``at::native::``
    dropped; for PyTorch's templated kernels, the functor that says what they compute kept
    in brackets: ``vectorized_elementwise_kernel[CUDAFunctor_add]``."""
    if "<" not in name and "::" not in name:  # not a C++ signature ("Memcpy DtoD (Device -> Device)")
        return name if len(name) <= width else name[: width - 1] + "…"
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    s = "".join(out).replace("void ", "").replace("at::native::", "").strip().lstrip(":") or name
    functor = FUNCTOR.search(name) if "<" in name else None
    if functor:
        s += f"[{functor.group(0)}]"
    return s if len(s) <= width else s[: width - 1] + "…"
