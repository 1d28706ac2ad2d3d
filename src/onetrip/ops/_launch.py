"""Kernel launches at a fraction of Triton's host cost: ``launch(kernel, grid, args, meta)``
does what ``kernel[grid](*args, **meta)`` does.

``kernel[grid](...)`` runs Triton's ``JITFunction.run`` at every call: it binds the
arguments to the signature, specializes each one, builds its cache key as a string, reads
its knobs and then calls the compiled kernel's launcher: 50-70 us of host time a call on an
H200 host, where the launcher itself takes a few. ``launch`` takes that path once per
specialization, keeps the compiled kernel it returns, and sends later calls of the same
specialization to the compiled kernel's launcher directly, on the current device's current
stream (so CUDA-graph capture records them as it records Triton's own launches).

The specialization key (``spec_key``) holds everything Triton specializes a compiled
kernel on that can differ between two calls of one launcher, and is never coarser than
Triton's (it may be finer: one compiled kernel under several keys):
  * ``meta``: every constexpr is compiled in, every option (num_warps, ...) too;
  * the current device: Triton loads a compiled kernel per device;
  * a tensor: its dtype (the pointer's type) and whether its address is a multiple of 16
    (Triton marks such pointers aligned, and the compiler vectorizes on it);
  * an int: whether it is 1 (compiled in as a constant), whether it is a multiple of 16
    (marked divisible), and its range (value >> 31: the int32 / int64 / uint64 parameter);
  * a float, a bool, None: the type alone (a float32 or int1 parameter; None a constant).
A call is first looked up by a finer key that takes ints by value (``exact_key``: half the
work, and shapes repeat); a new one is placed by its specialization.
Any other argument (a tensor descriptor, a tensor subclass, a numpy int) takes
``kernel[grid]``, as does every call while a launch hook is installed (Triton's profiler)
and, for good, a kernel that is not a compiled CUDA ``JITFunction``: always under Triton's
interpreter (TRITON_INTERPRET=1, whose kernels are ``InterpretedFunction``), and on a
Triton whose compiled kernels lack the launcher interface this uses (checked at a kernel's
first launch). ``ONETRIP_LAUNCH`` (read once; ``launch_mode.cache_clear()`` reads it again):
"fast" (default); "triton": every call through ``kernel[grid]`` (A/B timing); "check":
fast, and each cached launch first asks Triton which compiled kernel it would run and
raises if it is not the cached one (slow: a test run on a GPU).
"""

from __future__ import annotations

import functools
import inspect
import os

import torch

# Past this many keys a kernel's table starts over: shapes vary (rows), so exact keys do.
MAX_KEYS = 4096
MODES = ("fast", "triton", "check")


@functools.lru_cache(maxsize=1)
def launch_mode() -> str:
    """ONETRIP_LAUNCH, read on the first launch (the module docstring says what each does)."""
    value = os.environ.get("ONETRIP_LAUNCH", "fast") or "fast"
    if value not in MODES:
        raise ValueError(f"ONETRIP_LAUNCH must be one of {MODES}, got {value!r}")
    return value


_Tensor = torch.Tensor
# The fixed types' keys are strings: a bool's must not equal an int's (False == 0).
_OTHER = {torch.nn.Parameter: lambda a: a.dtype if not a.data_ptr() & 15 else (a.dtype,),
          bool: lambda a: "u1", float: lambda a: "fp32", type(None): lambda a: None}


def spec_key(args: tuple) -> tuple:
    """What Triton specializes on in the runtime arguments ``args`` (the module docstring
    lists it); KeyError for an argument of a type it does not know. Inline, not a call an
    argument: ~0.2 us an argument, where a call each would double it."""
    return tuple([
        # int: (value >> 31) << 2 | (value == 1) << 1 | (value % 16 == 0), one int that keeps all three
        (((a >> 31) << 2) | ((a == 1) << 1) | (not a & 15)) if type(a) is int
        # tensor: its dtype, wrapped in a tuple when the address is not a multiple of 16
        else (a.dtype if not a.data_ptr() & 15 else (a.dtype,)) if type(a) is _Tensor
        else _OTHER[type(a)](a)
        for a in args])


def exact_key(args: tuple) -> tuple:
    """``spec_key`` with ints by value: finer, and cheaper (~50 ns an int against ~0.15 us).
    The first argument's key serves its repeats: launchers pass it for the pointers a call
    does not use, and a tensor's key costs two attribute reads (~0.2 us)."""
    if not args:
        return ()
    first = args[0]
    head = first if type(first) is int else \
        (first.dtype if not first.data_ptr() & 15 else (first.dtype,)) if type(first) is _Tensor \
        else _OTHER[type(first)](first)
    return tuple([
        head if a is first
        else a if type(a) is int
        else (a.dtype if not a.data_ptr() & 15 else (a.dtype,)) if type(a) is _Tensor
        else _OTHER[type(a)](a)
        for a in args])


def meta_key(meta: dict) -> int:
    """A small int that stands for ``meta`` in launch keys (equal metas, equal ints): a
    caller that keeps a meta dict passes it as ``key``, since a tuple recomputes its hash at
    every lookup (~0.6 us for the norm's 33 items)."""
    return _META_KEYS.setdefault(tuple(meta.items()), len(_META_KEYS))


_META_KEYS: dict[tuple, int] = {}


@functools.lru_cache(maxsize=1024)
def cached_meta(**meta) -> tuple[dict, int]:
    """``(meta, meta_key(meta))``, kept: a launcher whose constexprs are plain values passes
    them here at every call (~0.4 us a hit) instead of building both; a call site passes its
    names in one order (the cache keys by it)."""
    return meta, meta_key(meta)


class _Kernel:
    """One kernel's launches: specialization key -> (compiled kernel, the values of its
    parameters past the runtime arguments, in order), and exact key -> the same pair. It
    holds the kernel, so no other object takes its id."""

    __slots__ = ("kernel", "fast", "check", "names", "defaults", "specs", "exact")

    def __init__(self, kernel, mode: str):
        self.kernel = kernel
        self.fast = mode != "triton" and _fast_capable(kernel)
        self.check = mode == "check"
        self.specs: dict = {}
        self.exact: dict = {}
        self.names: tuple = ()
        self.defaults: dict = {}
        if self.fast:
            params = inspect.signature(kernel.fn).parameters.values()
            self.names = tuple(p.name for p in params)
            self.defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}

    def place(self, exact: tuple, key, device: int, grid, args, meta):
        """(the (compiled, tail) pair, None) of a call not seen by its exact key, found by its
        specialization; or (None, compiled) when it took Triton's path (the call has run)."""
        spec = (key, device, spec_key(args))
        hit = self.specs.get(spec)
        compiled = None
        if hit is None:
            compiled = self.kernel[grid](*args, **meta)
            self._add(spec, compiled, meta, len(args))
        placed = self.specs.get(spec)
        if placed is not None:
            if len(self.exact) >= MAX_KEYS:
                self.exact.clear()
            self.exact[exact] = placed
        return hit, compiled

    def _add(self, spec, compiled, meta: dict, n_args: int) -> None:
        """Keep ``compiled`` for ``spec``; a compiled kernel without the launcher interface
        turns this kernel's fast path off."""
        if not all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
            self.fast = False
            return
        try:
            tail = tuple(meta[n] if n in meta else self.defaults[n] for n in self.names[n_args:])
        except KeyError:  # a parameter neither given nor defaulted: Triton raised, or will
            return
        if len(self.specs) >= MAX_KEYS:
            self.specs.clear()
        self.specs[spec] = (compiled, tail)


_KERNELS: dict[int, _Kernel] = {}
_RUNTIME = None  # triton.knobs.runtime, once a kernel has the fast path


def _fast_capable(kernel) -> bool:
    """A compiled CUDA ``JITFunction`` (not the interpreter's, not an autotuner) on a Triton
    with launch knobs and a torch with the current-stream query Triton itself uses."""
    global _RUNTIME
    try:
        from triton import knobs
        from triton.runtime import driver
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    if type(kernel) is not JITFunction or not hasattr(torch._C, "_cuda_getCurrentRawStream"):
        return False
    if driver.active.get_current_target().backend != "cuda":  # AMD's also specializes pointers' ranges
        return False
    _RUNTIME = knobs.runtime
    return True


def _device_stream() -> tuple[int, int]:
    """(current device index, its current stream's handle), as Triton's launch reads them."""
    device = torch._C._cuda_getDevice()
    return device, torch._C._cuda_getCurrentRawStream(device)


def _hooked() -> bool:
    """A launch hook is installed (Triton's profiler): the hook takes launch metadata that
    only Triton's own path builds. Triton 3.6 holds None or a callable, newer ones a chain."""
    enter, leave = _RUNTIME.launch_enter_hook, _RUNTIME.launch_exit_hook
    return (enter is not None and bool(getattr(enter, "calls", True))) or \
        (leave is not None and bool(getattr(leave, "calls", True)))


def launch(kernel, grid: tuple, args: tuple, meta: dict, key=None):
    """``kernel[grid](*args, **meta)`` (returns the compiled kernel, or None under the
    interpreter), through the compiled kernel's launcher once its specialization has run.

    ``grid``: 1 to 3 ints. ``args``: the kernel's leading parameters, in order (the runtime
    arguments); ``meta``: the rest by name (constexprs, unless defaulted) and launch options,
    each value of one type from call to call (True and 1 make one key, as 1.0 and 1 do).
    ``key``: ``meta_key(meta)``, kept by a caller that keeps ``meta``; default
    ``tuple(meta.items())``.
    """
    entry = _KERNELS.get(id(kernel))
    if entry is None:
        entry = _KERNELS[id(kernel)] = _Kernel(kernel, launch_mode())
    if not entry.fast or _hooked():
        return kernel[grid](*args, **meta)
    if key is None:
        key = tuple(meta.items())
    device, stream = _device_stream()
    try:
        exact = (key, device, exact_key(args))
    except KeyError:  # an argument of a type outside the key
        return kernel[grid](*args, **meta)
    hit = entry.exact.get(exact)
    if hit is None:
        hit, compiled = entry.place(exact, key, device, grid, args, meta)
        if hit is None:
            return compiled
    compiled, tail = hit
    if entry.check:
        _check(kernel, grid, args, meta, compiled)
    n = len(grid)
    compiled.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream, compiled.function,
                 compiled.packed_metadata, None, None, None, *args, *tail)
    return compiled


def _check(kernel, grid, args, meta, compiled) -> None:
    """ONETRIP_LAUNCH=check: Triton's own choice for this call must be the cached kernel."""
    own = kernel.warmup(*args, grid=grid, **meta)
    if own is not compiled:
        raise RuntimeError(f"onetrip launch cache: {kernel} would run another compiled kernel than the cached "
                           f"one for these arguments: the key misses a specialization (args {args!r})")
