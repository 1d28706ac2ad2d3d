"""Shared plumbing for the fused ops: argument checks, 2-D row views, output buffers.

Every public op follows the same path:

    checks (errors that name the argument)  ->  2-D row views  ->  custom op  ->  Triton launch

The custom op receives views whose last dimension has unit stride; any other
leading layout is expressed by a row stride, or copied once when it cannot be."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(_DTYPE_NAMES.get(d, str(d)) for d in dtypes)


def check_tensor(
    name: str,
    t: object,
    *,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    min_ndim: int = 1,
) -> torch.Tensor:
    """Raise a TypeError/ValueError naming ``name`` unless ``t`` is a float tensor we accept."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; allowed: {dtype_names(dtypes)}")
    if t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(t.shape)}")
    return t


def check_same_device(ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    device = None  # read once: each read of .device builds a new object (~0.2 us)
    for name, t in others.items():
        if t is not None:
            if device is None:
                device = ref.device
            if t.device != device:
                raise ValueError(f"{name} is on {t.device} but {ref_name} is on {device}; all tensors must share a "
                                 f"device")


def check_shape(name: str, t: torch.Tensor, shape: Sequence[int], what: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {tuple(shape)} ({what})")


def check_dtype_match(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if t.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {t.dtype} but {ref_name} has {ref.dtype}; they must match")


def as_rows(t: torch.Tensor, width: int) -> torch.Tensor:
    """View ``t`` (..., width) as (rows, width) with unit stride along the width.

    Strided rows stay views (the kernels take a row stride); a layout that cannot be
    expressed by one row stride is copied once.
    """
    if t.dim() == 2 and (t.is_contiguous() or width <= 1 or t.stride()[1] == 1):
        return t  # already (rows, width): a reshape's view costs ~1.5 us
    if t.stride(-1) != 1 and width > 1:
        t = t.contiguous()
    return t.reshape(math.prod(t.shape[:-1]), width)  # not -1: ambiguous when width == 0


def heads_view(x: torch.Tensor, batch: int, keep_values: bool) -> tuple[torch.Tensor, bool]:
    """x (..., seq, heads, head_dim) as a (batch, seq, heads, head_dim) view with unit stride
    along head_dim, and False; or, when no such view exists, a contiguous copy
    (``keep_values``) or an empty buffer of that shape, and True (the caller copies back).
    The rotary and KV-cache ops take their q, k, v this way."""
    if x.dim() == 4 and (x.is_contiguous() or x.stride()[3] == 1 or x.shape[3] == 1):
        return x, False  # already (batch, seq, heads, head_dim): a view's call costs ~2.5 us
    shape = (batch, *x.shape[-3:])
    if x.stride(-1) == 1 or x.shape[-1] == 1:
        try:
            return x.view(shape), False
        except RuntimeError:
            pass
    if keep_values:
        return x.contiguous().view(shape), True
    return torch.empty(shape, dtype=x.dtype, device=x.device), True


def output(
    name: str,
    out: torch.Tensor | None,
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """Return ``out`` after checking it, or a new empty contiguous tensor of ``shape``
    (a caller whose result has an input's shape takes ``empty_as(input)``: cheaper)."""
    if out is None:
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(out).__name__}")
    check_shape(name, out, shape, "the shape of the result")
    if out.dtype != dtype:
        raise TypeError(f"{name} has dtype {out.dtype}; the result is {dtype}")
    if out.device != device:
        raise ValueError(f"{name} is on {out.device}; the inputs are on {device}")
    return out


def empty_as(t: torch.Tensor) -> torch.Tensor:
    """An empty contiguous tensor of ``t``'s shape, dtype and device: ``empty_like`` for a
    contiguous ``t`` (~1.5 us of host time; ``torch.empty`` parses its size: 2.5-4 us)."""
    return torch.empty_like(t) if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)


def output_like(name: str, out: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``output`` for a result of ``like``'s shape, dtype and device: ``out`` checked, or
    ``empty_as(like)``."""
    return empty_as(like) if out is None else output(name, out, like.shape, like.dtype, like.device)


def rows_out(out: torch.Tensor, width: int) -> tuple[torch.Tensor, bool]:
    """A (rows, width) view of ``out`` the kernel can write, and whether it is a scratch copy.

    When ``out`` cannot be viewed with one row stride and a unit column stride, the
    kernel writes a contiguous scratch buffer that the caller copies back.
    """
    if out.dim() == 2 and (out.is_contiguous() or width == 1 or out.stride()[1] == 1):
        return out, False  # already (rows, width): a view's call costs ~1.5 us
    rows = math.prod(out.shape[:-1])
    if out.stride(-1) == 1 or width == 1:
        try:
            return out.view(rows, width), False
        except RuntimeError:
            pass
    return torch.empty((rows, width), dtype=out.dtype, device=out.device), True


# The dict under os.environ, which its writes update (POSIX: bytes keys and values); else None.
_ENVIRON = os.environ._data if os.name == "posix" and type(getattr(os.environ, "_data", None)) is dict else None


def getenv(name: str, default: str) -> str:
    """``os.environ.get(name, default)`` at a dict lookup's cost: the Mapping layers of
    ``os.environ`` (encode the key, decode the value) take ~1 us, and a launch reads
    ONETRIP_PDL at every call. Reads the dict that ``os.environ`` writes, so a change made
    through it (``monkeypatch.setenv``) shows at once."""
    if _ENVIRON is None:
        return os.environ.get(name, default)
    value = _ENVIRON.get(name.encode())
    return default if value is None else value.decode("utf-8", "surrogateescape")


@functools.lru_cache(maxsize=1)
def dispatch_mode() -> str:
    """ONETRIP_DISPATCH, read on the first op call (not at import): "direct" (default) lets
    ``call_op`` call an eager op's implementation directly; "op" sends every call through
    the custom op's dispatcher (for A/B timing). Cached: ``dispatch_mode.cache_clear()``
    makes the next call read the environment again."""
    value = os.environ.get("ONETRIP_DISPATCH", "direct") or "direct"
    if value not in ("direct", "op"):
        raise ValueError(f"ONETRIP_DISPATCH must be 'direct' or 'op', got {value!r}")
    return value


_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter
_SCALARS = frozenset((int, float, bool, str, type(None)))  # argument types that are never tensors


def _direct_ok(args: tuple) -> bool:
    """True when calling a custom op's Python implementation directly does exactly what the
    dispatcher would: nothing traces (torch.compile, export, fake tensors, functorch), no
    mode intercepts calls, and autograd records nothing (no input requires a gradient)."""
    if torch.compiler.is_compiling() or dispatch_mode() != "direct" or torch._C._len_torch_dispatch_stack() \
            or torch._C._is_torch_function_mode_enabled() or torch._C._are_functorch_transforms_active():
        return False
    grad = torch.is_grad_enabled()
    for a in args:
        t = type(a)
        if t is _Tensor or t is _Parameter:
            if grad and a.requires_grad:
                return False
        elif t not in _SCALARS and isinstance(a, _Tensor):  # a subclass (a fake tensor, a functorch wrapper)
            return False
    return True


def call_op(op, *args):
    """Call the custom op ``op`` (a ``torch.library.custom_op``) with positional ``args``.

    Outside tracing this calls its implementation directly: the Python layers of a custom
    op's dispatch (autograd, ADInplaceOrView with its ``fill_defaults``, the backend
    wrapper) cost ~50 us a call on a CPU-only dev machine, as much as the kernel launch,
    and an eager model or a prefill pays it for every op. torch.compile, export, fake
    tensors and autograd still see the custom op. So does the profiler: a trace then names
    each call as a ``cpu_op`` that the kernels it launched link to (``onetrip.profile``
    reads them so), at the price of profiled runs without CUDA graphs showing the
    dispatch's host time that unprofiled ones do not pay. ``dispatch_mode`` "op"
    (ONETRIP_DISPATCH=op) sends every call through the dispatcher.
    """
    fn = getattr(op, "_init_fn", None)  # a private attribute: without it, the dispatcher
    if fn is not None and not torch.autograd.profiler._is_profiler_enabled and _direct_ok(args):
        return fn(*args)
    return op(*args)


def needs_grad(*tensors: torch.Tensor | None) -> bool:
    """True when autograd records a call on ``tensors``: grad mode is on and one of them
    requires a gradient. The ops then take their autograd path (an ``autograd.Function``
    over the custom ops), else the plain one."""
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return True
    return False


def check_no_out(name: str, out: torch.Tensor | None) -> None:
    """``out=`` buffers cannot take part in autograd (as in PyTorch): say so, naming ``name``."""
    if out is not None:
        raise ValueError(f"{name}= is not supported when an input requires a gradient "
                         f"(autograd needs the op to allocate its outputs); pass {name}=None")


def is_interpreting() -> bool:
    """True when Triton kernels run through Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return getenv("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def use_triton(t: torch.Tensor) -> bool:
    """Kernels run on CUDA tensors, and on CPU tensors only under Triton's interpreter.

    Elsewhere (CPU tensors, no interpreter) each op runs its PyTorch reference.
    """
    return t.is_cuda or (t.device.type == "cpu" and is_interpreting())


def pdl_mode() -> int:
    """ONETRIP_PDL: 1 (default) programmatic dependent launch on Hopper and later: the
    batch-1 GEMVs, their split-K reduce and the argmax may be scheduled while the previous
    kernel drains, and wait for it (``gdc_wait``) before reading what it wrote; 0 ordinary
    launches. Read at every launch. On an H200 over the whole batch-1 decode step in one
    CUDA graph: Llama-3.2-1B 0.911 -> 0.872 ms, Llama-3.1-8B 4.072 -> 3.999 ms, the same
    tokens. The attention kernels launch without it: with it the 8B step takes 4.175 ms
    (2.5% slower than with none). On an H100 the norm, bias_gelu, GLU and rotary kernels
    take it: the gap between back-to-back calls 1.2-1.8 -> 0.7-1.1 us, rms_norm 64 x 256K
    86 -> 88% of copy, the 4096 x 4096 norms +1-2.6 points."""
    value = getenv("ONETRIP_PDL", "1") or "1"
    if value not in ("0", "1"):
        raise ValueError(f"ONETRIP_PDL must be 0 or 1, got {value!r}")
    return int(value)


def pdl_args(t: torch.Tensor) -> dict:
    """Launch arguments for ``pdl_mode()``: none when it is off, on the CPU, or on a GPU
    older than sm_90; else the kernel's ``PDL`` constexpr and Triton's ``launch_pdl``."""
    return pdl_kwargs(pdl_on(t))


def pdl_on(t: torch.Tensor) -> bool:
    """Whether a launch on ``t``'s device takes ``pdl_args``' arguments (a launcher that
    keeps its arguments keys them by this, and builds them with ``pdl_kwargs``)."""
    return bool(pdl_mode()) and hopper_or_newer(t)


def pdl_kwargs(on: bool) -> dict:
    """``pdl_args``' arguments when ``on``, else none."""
    return {"PDL": 1, "launch_pdl": True} if on else {}


@functools.lru_cache(maxsize=None)
def _capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def hopper_or_newer(t: torch.Tensor) -> bool:
    """``t`` is on a CUDA GPU of compute capability 9 or more (TMA, programmatic dependent
    launch); cached per device, so launches can ask every time."""
    if not t.is_cuda:
        return False
    index = t.device.index
    return _capability_major(index if index is not None else torch.cuda.current_device()) >= 9


@functools.lru_cache(maxsize=None)
def _device_facts(index: int) -> tuple[int, str]:
    props = torch.cuda.get_device_properties(index)
    return props.multi_processor_count, props.name


# The device facts the launch picks read on the host, as constants to torch.compile (which
# does not trace torch.cuda.get_device_name): a traced call picks the launch an eager one does.
@torch.compiler.assume_constant_result
def _sm_count(index: int) -> int:
    return _device_facts(index)[0]


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``; a nominal 4 on the CPU (interpreter)."""
    if device_type(device) != "cuda":
        return 4
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@torch.compiler.assume_constant_result
def _gpu_name(index: int) -> str:
    return _device_facts(index)[1]


def gpu_name(device: torch.device) -> str:
    """The name of ``device`` ("NVIDIA H100 80GB HBM3"), for launch tables measured on one
    GPU model; "" off CUDA."""
    if device_type(device) != "cuda":
        return ""
    return _gpu_name(device.index if device.index is not None else torch.cuda.current_device())


_DEVICE_TYPES: dict = {}


def device_type(device: torch.device) -> str:
    """``device.type``, kept per device: the attribute builds a new string at every read
    (~0.5 us; a dict lookup by the device ~0.06), and each launch asks a few times."""
    if torch.compiler.is_compiling():  # traced code reads the attribute itself
        return device.type
    kind = _DEVICE_TYPES.get(device)
    if kind is None:
        kind = _DEVICE_TYPES[device] = device.type
    return kind


def gpu_table_entry(tables: dict, gpu: str, key):
    """``tables[family][key]`` for the first GPU family (a part of the device's name, e.g.
    "H100") that ``gpu`` contains and whose table has ``key``; None if none has. The
    launch tables measured on one GPU model (the GEMVs', the norms') are read this way."""
    for family, table in tables.items():
        if family in gpu and key in table:
            return table[key]
    return None


def acc_dtype(t: torch.Tensor) -> torch.dtype:
    """The accumulation dtype of the references: float32, or float64 for float64 inputs."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


@dataclass(frozen=True)
class TileConfig:
    """Launch shape of the 2-D element-wise kernels: a (block_m, block_n) tile per program."""

    block_m: int
    block_n: int
    num_warps: int


def tile_config(rows: int, width: int, *, tile: int = 2048, max_block_n: int = 2048, num_warps: int = 4,
                per_thread: int = 8) -> TileConfig:
    """A tile of about ``tile`` elements: several rows when they are narrow, a slice when wide.

    Measured on an H200: for bias_gelu and silu_mul at 2**26
    elements from 1K to 256K wide, 2048-element tiles with 4 warps (16 elements per thread,
    two 16-byte loads per input) came within 2.2% of the best of 13 configs at every width
    (mean 0.6%); no single other rule came closer. A tile's rows are at most ``tile`` and
    ``max_block_n`` wide; ``num_warps`` is capped so that a thread keeps at least
    ``per_thread`` elements where few or narrow rows leave a smaller tile. Memoized: a launch
    asks at every call.
    """
    if per_thread < 1:
        raise ValueError(f"per_thread={per_thread} must be >= 1 (elements a thread)")
    return _tile_config(rows, width, tile, max_block_n, num_warps, per_thread)


@functools.lru_cache(maxsize=4096)
def _tile_config(rows: int, width: int, tile: int, max_block_n: int, num_warps: int, per_thread: int) -> TileConfig:
    block_n = min(next_pow2(max(width, 1)), max_block_n, tile)
    block_m = max(1, min(next_pow2(max(rows, 1)), tile // block_n))
    warps = max(1, min(num_warps, (block_m * block_n) // (32 * per_thread)))
    return TileConfig(block_m, block_n, warps)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host ints. ``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr
    functions whose Python calls unwrap constexprs first: ~1 us each, several a launch."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The least power of two >= n, for n >= 1 (0 for 0, as ``triton.next_power_of_2``)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
