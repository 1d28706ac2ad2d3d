"""Achieved memory bandwidth per operator, against a device's peak.

    report = analyze_trace("trace.json.gz", bandwidth_gbs=3350)   # or found from the device name
    for o in report.op_bandwidth:
        o.op, o.input_dims, o.achieved_gbs, o.peak_fraction, o.unreliable

For every operator that launched GPU work, grouped by (name, recorded input shapes, input
dtypes), the bytes it must move at the least (``op_bytes``: its tensor inputs read once
and its output written once) are divided by the GPU time of the kernels attributed to it.
For a memory-bound op (element-wise, norm, cast, decode attention) the ratio to the peak
says how far the kernels are from the hardware's limit; for a GEMM or prefill attention,
which is compute-bound, a low ratio is expected.

The peak is ``bandwidth_gbs`` when given, otherwise looked up by the device name the trace
records in its top-level ``deviceProperties`` (``PEAK_HBM_GBS``). Those figures are the
vendors' nominal datasheet peaks: a copy kernel reaches about 85-92% of them, so a ratio
near 100% is already the ceiling, and one above 100% means the estimate is wrong (L2 hits,
an output smaller than the largest input, kernels overlapping on other streams) and is
flagged ``unreliable``. GB is 10^9 bytes, as on datasheets.
"""

from __future__ import annotations

import math
import numbers
import re
from collections import Counter
from dataclasses import dataclass

from .fusion import DTYPE_BYTES, output_bytes
from .timeline import UNAVAILABLE, UNLINKED, TraceIndex
from .trace import CpuOp, Trace

# Nominal peak HBM/GDDR bandwidth in GB/s from the vendors' datasheets, matched in order
# (case-insensitive regex search) against the device name in deviceProperties.
PEAK_HBM_GBS = (
    (r"H200", "H200", 4800.0),
    (r"H100.*PCIe", "H100 PCIe", 2000.0),
    (r"H100.*NVL", "H100 NVL", 3900.0),
    (r"H100", "H100 SXM", 3350.0),
    (r"A100.*80GB.*PCIe", "A100 80GB PCIe", 1935.0),
    (r"A100.*80GB", "A100 80GB SXM", 2039.0),
    (r"A100", "A100 40GB", 1555.0),
    (r"\bL4\b", "L4", 300.0),
    (r"RTX 4090", "RTX 4090", 1008.0),
)

MATMUL_OUT = frozenset({"aten::mm", "aten::bmm", "aten::matmul", "aten::addmm", "aten::baddbmm", "aten::addbmm",
                        "aten::_scaled_mm"})
ATTENTION_OUT = frozenset({"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
                           "aten::_scaled_dot_product_efficient_attention",
                           "aten::_scaled_dot_product_cudnn_attention", "aten::_flash_attention_forward",
                           "aten::_efficient_attention_forward"})
WRITE_ONLY_FIRST = frozenset({"aten::copy_", "aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_",
                              "aten::random_", "aten::bernoulli_", "aten::exponential_"})


def datasheet_bandwidth(device: str | None) -> tuple[str, float] | None:
    """(table label, nominal peak GB/s) of the first ``PEAK_HBM_GBS`` row matching
    ``device``; None when no row does."""
    if not device:
        return None
    for pattern, label, gbs in PEAK_HBM_GBS:
        if re.search(pattern, device, re.I):
            return label, gbs
    return None


@dataclass(frozen=True)
class PeakBandwidth:
    """The figure achieved bandwidths are compared with.

    device: the GPU's name from the trace's ``deviceProperties`` (the device running the most
        kernels when there are several); None when the trace records none.
    gbs: GB/s (10^9 bytes/s); None when neither given nor found in ``PEAK_HBM_GBS``.
    source: "argument" (``bandwidth_gbs`` was given), "datasheet: <row>" (a nominal
        datasheet peak, see the module doc) or "unknown".
    """

    device: str | None
    gbs: float | None
    source: str


def check_bandwidth(bandwidth_gbs: float | None) -> float | None:
    """``bandwidth_gbs`` as a float (None stays None); ValueError unless it is a finite number > 0."""
    if bandwidth_gbs is None:
        return None
    if (isinstance(bandwidth_gbs, bool) or not isinstance(bandwidth_gbs, numbers.Real)
            or not math.isfinite(bandwidth_gbs) or bandwidth_gbs <= 0):
        raise ValueError(f"bandwidth_gbs must be a finite number of GB/s (10^9 bytes/s) above 0, got {bandwidth_gbs!r}")
    return float(bandwidth_gbs)


def trace_bandwidth(trace: Trace, bandwidth_gbs: float | None = None) -> PeakBandwidth:
    """The ``PeakBandwidth`` of ``trace``: ``bandwidth_gbs`` when given, else the datasheet
    peak of the recorded device. Raises ValueError for a ``bandwidth_gbs`` that is not > 0."""
    props = trace.metadata.get("deviceProperties")
    names = {}
    if isinstance(props, list):
        for i, p in enumerate(props):
            if isinstance(p, dict) and isinstance(p.get("name"), str):
                names.setdefault(p.get("id", i), p["name"])
    busiest = Counter(k.device for k in trace.kernels).most_common()
    device = next((names[d] for d, _ in busiest if d in names), next(iter(names.values()), None))
    if check_bandwidth(bandwidth_gbs) is not None:
        return PeakBandwidth(device, float(bandwidth_gbs), "argument")
    found = datasheet_bandwidth(device)
    if found is None:
        return PeakBandwidth(device, None, "unknown")
    return PeakBandwidth(device, found[1], f"datasheet: {found[0]}")


def _tensor_bytes(dims, dtype) -> int | None:
    """Bytes of one recorded tensor input; None when it is not a tensor; -1 when it is one
    (or a list of them) whose size cannot be known."""
    size = DTYPE_BYTES.get(dtype)
    if size is not None and isinstance(dims, tuple) and all(isinstance(d, int) for d in dims):
        return math.prod(dims) * size
    if "Tensor" in str(dtype) or (isinstance(dims, tuple) and dims and size is None):
        return -1  # a TensorList, or a shape with an unknown dtype
    return None  # Scalar, ScalarList, None ("") and other non-tensor arguments


def op_bytes(op: CpuOp | None) -> int | None:
    """Bytes one call of ``op`` must move at the least: each tensor input read once plus
    its output written once, from the recorded shapes and dtypes. The output is:

        mm / bmm / matmul / addmm / baddbmm   a[:-1] + b[-1:] of the last two tensor inputs
        aten::linear                          x[:-1] + (weight[0],)
        scaled-dot-product attention          q[:-1] + v[-1:]
        in-place ``op_`` (add_, mul_...)      its first input (read and written)
        copy_ / fill_ / zero_ / random fills  its first input, written and not read
        anything else                         the largest tensor input (``output_bytes``):
                                              exact for element-wise ops and norms; an
                                              upper bound for reductions and narrowing casts

    in the dtype of the first tensor input. None when the op recorded no shapes, no tensor
    input, or a tensor whose size is unknown (a TensorList).
    """
    if op is None or not op.input_dims or not op.input_types:
        return None
    tensors = []  # (dims, dtype, bytes)
    for dims, dtype in zip(op.input_dims, op.input_types):
        b = _tensor_bytes(dims, dtype)
        if b == -1:
            return None
        if b is not None:
            tensors.append((dims, dtype, b))
    if not tensors:
        return None
    read = sum(b for _, _, b in tensors)
    size = DTYPE_BYTES[tensors[0][1]]
    shape = None
    if op.name in MATMUL_OUT and len(tensors) >= 2 and min(len(tensors[-2][0]), len(tensors[-1][0])) >= 2:
        shape = tensors[-2][0][:-1] + tensors[-1][0][-1:]
    elif op.name == "aten::linear" and len(tensors) >= 2 and tensors[0][0] and len(tensors[1][0]) == 2:
        shape = tensors[0][0][:-1] + tensors[1][0][:1]
    elif op.name in ATTENTION_OUT and len(tensors) >= 3 and tensors[0][0] and tensors[2][0]:
        shape = tensors[0][0][:-1] + tensors[2][0][-1:]
    if shape is not None:
        return read + math.prod(shape) * size
    if op.name in WRITE_ONLY_FIRST:
        return read
    if op.name.endswith("_"):
        return read + tensors[0][2]
    return read + output_bytes(op)


@dataclass(frozen=True)
class OpBandwidth:
    """GPU work of one operator with one set of input shapes, summed over its calls.

    op: the cpu_op's name; ``UNAVAILABLE`` for kernels replayed from a CUDA graph (which
        operator they belong to is not in the trace, so bytes and GB/s are None) and
        ``UNLINKED`` for kernels whose operator is not in the trace.
    input_dims / input_types: as recorded (None for those two rows or without shapes).
    category: the kernel category (``kinds``) holding most of the op's GPU time.
    calls: operator invocations that launched GPU work; kernels: GPU activities launched.
    gpu_us: summed duration of those activities (not their union: overlap counts twice).
    bytes_per_call: ``op_bytes``; bytes = calls x bytes_per_call; None when unknown.
    achieved_gbs = bytes / gpu_us, in GB/s (10^9 bytes/s); None when bytes are unknown.
    peak_fraction = achieved_gbs / the ``PeakBandwidth``'s gbs; None without a peak.
    unreliable: peak_fraction > 1: no kernel beats the peak, so the byte model or the
        timing does not hold for this op (see the module doc).
    attributed: False for the ``UNAVAILABLE`` and ``UNLINKED`` rows.
    """

    op: str
    input_dims: tuple | None
    input_types: tuple | None
    category: str
    calls: int
    kernels: int
    gpu_us: float
    bytes_per_call: int | None
    bytes: int | None
    achieved_gbs: float | None
    peak_fraction: float | None
    unreliable: bool
    attributed: bool


def op_bandwidth(index: TraceIndex, peak: PeakBandwidth, n: int = 15) -> list[OpBandwidth]:
    """The ``n`` (operator, input shapes) groups with the most GPU time, most first, with
    their achieved bandwidth (see ``OpBandwidth``); memcpy/memset count as GPU work."""
    groups: dict[tuple, dict] = {}
    for i, k in enumerate(index.trace.kernels):
        op = index.op(k, i)
        if op is not None:
            key = (op.name, op.input_dims, op.input_types)
        else:
            key = (UNAVAILABLE if index.graph[i] else UNLINKED, None, None)
        g = groups.setdefault(key, {"op": op, "calls": set(), "kernels": 0, "us": 0.0, "cat": Counter()})
        if op is not None:
            g["calls"].add((op.tid, op.ts, op.external_id))
        g["kernels"] += 1
        g["us"] += k.dur
        g["cat"][index.category[i]] += k.dur
    out = []
    for (name, dims, types), g in groups.items():
        attributed = g["op"] is not None
        calls = len(g["calls"])
        per_call = op_bytes(g["op"]) if attributed else None
        total = None if per_call is None else calls * per_call
        gbs = total / g["us"] / 1e3 if total is not None and g["us"] > 0 else None
        frac = gbs / peak.gbs if gbs is not None and peak.gbs else None
        out.append(OpBandwidth(name, dims, types, g["cat"].most_common(1)[0][0], calls, g["kernels"], g["us"],
                               per_call, total, gbs, frac, frac is not None and frac > 1.0, attributed))
    return sorted(out, key=lambda o: -o.gpu_us)[:n]


__all__ = ["PEAK_HBM_GBS", "PeakBandwidth", "OpBandwidth", "datasheet_bandwidth", "check_bandwidth",
           "trace_bandwidth", "op_bytes", "op_bandwidth"]
