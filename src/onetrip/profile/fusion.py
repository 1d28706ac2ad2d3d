"""Memory traffic a fused kernel would not spend: element-wise chains, N x N
intermediates, dtype casts.

Byte estimates use the shapes and dtypes the profiler recorded for the operator that
launched a kernel (``record_shapes=True``); without them a byte count is ``None`` (unknown),
never a guess.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from .kinds import FUSIBLE
from .timeline import UNAVAILABLE, Thresholds, TraceIndex
from .trace import CpuOp

# Element sizes of the dtype names PyTorch's profiler writes in "Input type".
DTYPE_BYTES = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}
MATMUL_OPS = frozenset({"aten::matmul", "aten::bmm", "aten::baddbmm", "aten::einsum"})
SOFTMAX_OPS = frozenset({"aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::log_softmax",
                         "aten::_log_softmax"})


def output_bytes(op: CpuOp | None) -> int | None:
    """Estimated bytes of the tensor ``op`` writes: the largest recorded tensor input
    (numel x element size of its dtype). An element-wise op's output has the broadcast
    shape of its inputs, which is the largest input's unless every input is broadcast up;
    a norm's output equals its input; for a reduction this is an upper bound.
    None when the op is unknown or recorded no tensor shapes."""
    if op is None or not op.input_dims or not op.input_types:
        return None
    best = None
    for dims, dtype in zip(op.input_dims, op.input_types):
        size = DTYPE_BYTES.get(dtype)
        if size is None or not isinstance(dims, tuple) or not all(isinstance(d, int) for d in dims):
            continue
        n = math.prod(dims) * size
        best = n if best is None else max(best, n)
    return best


@dataclass(frozen=True)
class Chain:
    """A maximal run of consecutive fusible kernels (element-wise, norm, cast) on one stream.

    Consecutive: in start order on the stream, each starting at most ``chain_max_gap_us``
    after the previous one ended, with no other kernel, memcpy or memset between them; the run ignores
    operator boundaries, so ``add`` then ``rms_norm`` then ``mul`` form one chain. Length >= 2.

    ops: the launching operator per kernel; None when not in the trace, ``UNAVAILABLE`` for
    a kernel replayed from a CUDA graph.
    intermediates = kernels - 1: the tensors kernel i writes and kernel i+1 reads back.
    intermediate_sizes: bytes of each (``output_bytes`` of the operators of all kernels but
        the last; None where unknown); intermediate_bytes: their sum, None when any is unknown.
    saved_bytes = 2 x intermediate_bytes: the HBM write and the read-back one fused kernel
        avoids. saved_launches = intermediates.
    """

    step: str
    device: int
    stream: int
    names: tuple[str, ...]
    ops: tuple[str | None, ...]
    start_us: float
    kernel_us: float
    intermediates: int
    intermediate_sizes: tuple[int | None, ...]
    intermediate_bytes: int | None
    saved_bytes: int | None


def find_chains(index: TraceIndex, th: Thresholds = Thresholds()) -> list[Chain]:
    """All element-wise chains, per step, device and stream (see ``Chain``)."""
    kernels = index.trace.kernels
    streams: dict[tuple[int, int, int], list[int]] = {}
    for i, k in enumerate(kernels):
        if index.step_of[i] >= 0:  # memcpy/memset included: they break a chain
            streams.setdefault((index.step_of[i], k.device, k.stream), []).append(i)
    chains = []
    for (s, device, stream), idx in sorted(streams.items()):
        run: list[int] = []
        for i in idx + [-1]:
            ok = i >= 0 and index.category[i] in FUSIBLE
            if ok and run and kernels[i].ts - kernels[run[-1]].end > th.chain_max_gap_us:
                ok = False  # too far apart: close the run, start again at i
                _close(chains, run, index, s, device, stream)
                run = [i]
                continue
            if ok:
                run.append(i)
            else:
                _close(chains, run, index, s, device, stream)
                run = []
    return chains


def _close(chains: list, run: list[int], index: TraceIndex, s: int, device: int, stream: int) -> None:
    if len(run) < 2:
        return
    kernels = index.trace.kernels
    ops = [index.op(kernels[i], i) for i in run]
    sizes = [output_bytes(op) for op in ops[:-1]]
    inter = None if any(b is None for b in sizes) else sum(sizes)
    chains.append(Chain(
        step=index.steps[s].name, device=device, stream=stream, names=tuple(kernels[i].name for i in run),
        ops=tuple(op.name if op else (UNAVAILABLE if index.graph[i] else None) for i, op in zip(run, ops)),
        start_us=kernels[run[0]].ts,
        kernel_us=sum(kernels[i].dur for i in run), intermediates=len(run) - 1, intermediate_sizes=tuple(sizes),
        intermediate_bytes=inter, saved_bytes=None if inter is None else 2 * inter))


@dataclass(frozen=True)
class ChainPattern:
    """Chains with the same kernel-name sequence, summed over their occurrences.
    intermediate_sizes: per intermediate, its bytes when every occurrence agrees, else None.
    saved_bytes: total over occurrences; None when any occurrence's bytes are unknown."""

    names: tuple[str, ...]
    ops: tuple[str | None, ...]
    occurrences: int
    intermediate_sizes: tuple[int | None, ...]
    kernel_us: float
    saved_bytes: int | None
    saved_launches: int


def group_chains(chains: list[Chain]) -> list[ChainPattern]:
    """``ChainPattern`` per distinct name sequence, most kernel time first."""
    groups: dict[tuple, list[Chain]] = {}
    for c in chains:
        groups.setdefault(c.names, []).append(c)
    out = []
    for names, cs in groups.items():
        saved = None if any(c.saved_bytes is None for c in cs) else sum(c.saved_bytes for c in cs)
        sizes = tuple(b if all(c.intermediate_sizes[j] == b for c in cs) else None
                      for j, b in enumerate(cs[0].intermediate_sizes))
        out.append(ChainPattern(names, cs[0].ops, len(cs), sizes, sum(c.kernel_us for c in cs), saved,
                                sum(c.intermediates for c in cs)))
    return sorted(out, key=lambda p: -p.kernel_us)


@dataclass(frozen=True)
class SquareIntermediate:
    """Operators that materialize an N x N tensor, such as attention scores.

    Rule: an operator in ``MATMUL_OPS`` whose output, inferred from its last two inputs as
    (a[:-1] + b[-1:]), or in ``SOFTMAX_OPS`` whose first input, has rank >= 3 (a batch or
    head dimension: 2-D square weights are not intermediates) and last two dims equal and
    >= ``square_min``. An operator nested inside another match on the same thread (matmul
    calling bmm, softmax calling _softmax) is not counted again.
    bytes: N x N tensor size (numel x element size); traffic_bytes = 2 x bytes per
    occurrence: written once and read back at least once, which fused attention avoids.
    """

    op: str
    shape: tuple[int, ...]
    dtype: str
    occurrences: int
    bytes: int
    traffic_bytes: int


def _square_shape(op: CpuOp, n_min: int) -> tuple[tuple[int, ...], str] | None:
    dims, types = op.input_dims, op.input_types
    if not dims or not types:
        return None
    if op.name in MATMUL_OPS:
        tensors = [(d, t) for d, t in zip(dims, types) if isinstance(d, tuple) and len(d) >= 2]
        if len(tensors) < 2:
            return None
        (a, ta), (b, _) = tensors[-2], tensors[-1]
        shape = tuple(a[:-1]) + (b[-1],)
        dtype = ta
    elif op.name in SOFTMAX_OPS:
        if not isinstance(dims[0], tuple):
            return None
        shape, dtype = tuple(dims[0]), types[0]
    else:
        return None
    if len(shape) >= 3 and shape[-1] == shape[-2] >= n_min and all(isinstance(d, int) for d in shape):
        return shape, dtype
    return None


def square_ops(index: TraceIndex, th: Thresholds = Thresholds()) -> list[tuple[CpuOp, tuple[int, ...], str]]:
    """Every operator that materializes an N x N tensor (the rule on ``SquareIntermediate``),
    with the tensor's shape and dtype, in start order."""
    out = []
    outer_end: dict[int, float] = {}  # per thread: end of the last counted match
    for op in index.trace.cpu_ops:  # sorted by start
        found = _square_shape(op, th.square_min)
        if found is None or op.ts < outer_end.get(op.tid, -math.inf):
            continue
        outer_end[op.tid] = op.ts + op.dur
        out.append((op, found[0], found[1]))
    return out


def find_square_intermediates(index: TraceIndex, th: Thresholds = Thresholds()) -> list[SquareIntermediate]:
    """``SquareIntermediate`` per (op, shape, dtype), largest traffic first."""
    counts = Counter((op.name, shape, dtype) for op, shape, dtype in square_ops(index, th))
    out = []
    for (name, shape, dtype), n in counts.items():
        size = math.prod(shape) * DTYPE_BYTES.get(dtype, 0)
        out.append(SquareIntermediate(name, shape, dtype, n, size, 2 * size * n))
    return sorted(out, key=lambda s: -s.traffic_bytes)


@dataclass(frozen=True)
class CastGroup:
    """Cast kernels (category ``cast``, see ``kinds``) grouped by kernel name and operator;
    from_types: the dtypes recorded for the operator's tensor inputs (for ``copy_``: the
    destination's, then the source's), when known."""

    name: str
    op: str | None
    from_types: tuple[str, ...] | None
    count: int
    total_us: float
    bytes: int | None


def find_casts(index: TraceIndex) -> list[CastGroup]:
    """Cast kernels grouped, most time first. bytes: sum of ``output_bytes`` of the
    operator per kernel (the tensor read; None when any is unknown)."""
    groups: dict[tuple, list] = {}
    for i, k in enumerate(index.trace.kernels):
        if index.category[i] != "cast":
            continue
        op = index.op(k, i)
        key = (k.name, op.name if op else None, op.input_types if op else None)
        groups.setdefault(key, []).append((k.dur, output_bytes(op)))
    out = []
    for (name, op, types), items in groups.items():
        sizes = [b for _, b in items]
        out.append(CastGroup(name, op, tuple(t for t in types if t in DTYPE_BYTES) if types else None, len(items),
                             sum(d for d, _ in items), None if None in sizes else sum(sizes)))
    return sorted(out, key=lambda c: -c.total_us)


__all__ = ["Chain", "ChainPattern", "SquareIntermediate", "CastGroup", "find_chains", "group_chains",
           "find_square_intermediates", "square_ops", "find_casts", "output_bytes"]
