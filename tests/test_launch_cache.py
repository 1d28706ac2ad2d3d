"""onetrip.ops._launch: the launch cache's keys against Triton's own specialization, and its
logic on a fake kernel (the CPU run); the real launcher on a GPU (marked gpu)."""

import importlib
import itertools

import pytest
import torch
import triton
import triton.language as tl

from onetrip.ops import _launch
from onetrip.ops._common import is_interpreting

INTS = [0, 1, 2, 15, 16, 17, 32, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**32, 2**63 - 1, 2**63,
        2**64 - 1, -2**31, -2**31 - 16]


def _tensors():
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        base = torch.zeros(64, dtype=dtype)
        out += [base, base[1:], base[4:], base[8:], torch.nn.Parameter(base.float(), requires_grad=False)]
    return out


VALUES = INTS + [True, False, 0.5, 1.0, 0.0, None] + _tensors()


def test_spec_key_never_coarser_than_triton():
    """Two arguments with one ``spec_key`` have one Triton specialization (the CUDA
    backend's, which is the base backend's); ``exact_key`` is finer still."""
    libtriton = pytest.importorskip("triton._C.libtriton")
    backend = importlib.import_module("triton.backends.compiler").BaseBackend
    native = getattr(libtriton, "native_specialize_impl", None)
    if native is None:
        pytest.skip("this Triton specializes in Python")
    try:  # (backend, argument, is_const, specialize_value, align), as JITFunction's binder calls it
        spec = {i: native(backend, v, False, True, True) for i, v in enumerate(VALUES)}
    except TypeError:
        pytest.skip("this Triton's native_specialize_impl takes other arguments")
    for i, j in itertools.combinations(range(len(VALUES)), 2):
        a, b = (VALUES[i],), (VALUES[j],)
        if _launch.spec_key(a) == _launch.spec_key(b):
            assert spec[i] == spec[j], (VALUES[i], VALUES[j], spec[i], spec[j])
        if _launch.exact_key(a) == _launch.exact_key(b):
            assert _launch.spec_key(a) == _launch.spec_key(b), (VALUES[i], VALUES[j])


def test_keys_tell_apart_what_triton_does():
    """The distinctions the module docstring lists, one by one."""
    x = torch.zeros(64, dtype=torch.bfloat16)
    k = _launch.spec_key
    assert k((16,)) == k((32,)) != k((17,)) != k((1,)) != k((2,))
    assert k((17,)) == k((3,)) and k((2**31,)) != k((16,))  # int32 / int64
    assert k((x,)) == k((x[8:],)) != k((x[1:],)) != k((x.float(),))
    assert k((True,)) != k((1,)) and k((False,)) != k((0,)) and k((1.0,)) != k((1,)) and k((None,)) != k((0,))
    assert _launch.exact_key((16,)) != _launch.exact_key((32,))
    for args in ((x[1:], x, x[1:], 16, None, x[1:]), (7, x, 7, 1.5)):  # repeats of the first take its key
        assert _launch.exact_key(args) == tuple(_launch.exact_key((a,))[0] for a in args)
    with pytest.raises(KeyError):
        k(("ieee",))  # a type outside the key: the caller takes Triton's path


def test_meta_key():
    assert _launch.meta_key({"A": 1, "B": True}) == _launch.meta_key({"A": 1, "B": True})
    assert _launch.meta_key({"A": 1, "B": True}) != _launch.meta_key({"A": 2, "B": True})


class _Compiled:
    function, packed_metadata = 1234, ("packed",)

    def __init__(self, log):
        self.log = log

    def run(self, *args):
        self.log.append(("run", args))


class _Kernel:
    """A JITFunction's surface as ``launch`` uses it: ``fn``, ``[grid](...)``, ``warmup``."""

    def __init__(self):
        def fn(x_ptr, n, BLOCK: tl.constexpr, FLAG: tl.constexpr = False, PDL: tl.constexpr = 0):
            pass

        self.fn = fn
        self.log = []
        self.compiled = {}

    def __getitem__(self, grid):
        def call(*args, **meta):
            self.log.append(("triton", grid, args, meta))
            return self.compiled.setdefault(self.key(args, meta), _Compiled(self.log))
        return call

    def warmup(self, *args, grid, **meta):
        return self.compiled.get(self.key(args, meta))

    @staticmethod
    def key(args, meta):
        try:
            return _launch.spec_key(args), tuple(meta.items())
        except KeyError:
            return tuple(map(type, args)), tuple(meta.items())


@pytest.fixture
def fast(monkeypatch):
    """The fast path on for fake kernels: capable, on device 3's stream 77, no hook."""
    class Runtime:
        launch_enter_hook = launch_exit_hook = None

    monkeypatch.setattr(_launch, "_fast_capable", lambda kernel: True)
    monkeypatch.setattr(_launch, "_device_stream", lambda: (3, 77))
    monkeypatch.setattr(_launch, "_RUNTIME", Runtime)
    monkeypatch.delenv("ONETRIP_LAUNCH", raising=False)
    _launch.launch_mode.cache_clear()
    yield Runtime
    _launch.launch_mode.cache_clear()


def _kinds(log):
    return [entry[0] for entry in log]


def test_first_call_through_triton_then_the_launcher(fast):
    kernel = _Kernel()
    x = torch.zeros(64)
    meta = dict(BLOCK=16, num_warps=4)
    first = _launch.launch(kernel, (5,), (x, 32), meta)
    second = _launch.launch(kernel, (6, 2), (x, 48), meta)  # another int, the same specialization
    assert first is second and _kinds(kernel.log) == ["triton", "run"]
    # grid padded to 3-D, current stream, the compiled handles, no hooks, then every
    # parameter in order: the runtime arguments, BLOCK given, FLAG and PDL defaulted
    assert kernel.log[1][1] == (6, 2, 1, 77, 1234, ("packed",), None, None, None, x, 48, 16, False, 0)
    _launch.launch(kernel, (7, 1, 2), (x, 48), meta)
    assert _kinds(kernel.log) == ["triton", "run", "run"] and kernel.log[2][1][:3] == (7, 1, 2)


@pytest.mark.parametrize("change", ["misaligned", "dtype", "int 1", "int not / 16", "int64", "meta", "float"])
def test_a_new_specialization_goes_through_triton(fast, change):
    kernel = _Kernel()
    x = torch.zeros(64)
    args, meta = (x, 32), dict(BLOCK=16)
    _launch.launch(kernel, (1,), args, meta)
    other = {"misaligned": ((x[1:], 32), meta), "dtype": ((x.double(), 32), meta), "int 1": ((x, 1), meta),
             "int not / 16": ((x, 33), meta), "int64": ((x, 2**32), meta), "meta": (args, dict(BLOCK=32)),
             "float": ((x, 32.0), meta)}[change]
    _launch.launch(kernel, (1,), *other)
    assert _kinds(kernel.log) == ["triton", "triton"]


def test_hooks_and_unknown_types_take_tritons_path(fast):
    kernel = _Kernel()
    x = torch.zeros(64)
    _launch.launch(kernel, (1,), (x, 32), dict(BLOCK=16))
    fast.launch_enter_hook = lambda metadata: None  # Triton 3.6's form: a callable
    _launch.launch(kernel, (1,), (x, 32), dict(BLOCK=16))
    fast.launch_enter_hook = None

    class Chain:  # the newer form: a chain, empty unless a hook was added
        calls = []

    fast.launch_exit_hook = Chain()
    _launch.launch(kernel, (1,), (x, 32), dict(BLOCK=16))
    assert _kinds(kernel.log) == ["triton", "triton", "run"]
    _launch.launch(kernel, (1,), (x, 3 + 0j), dict(BLOCK=16))
    assert _kinds(kernel.log)[-1] == "triton"


def test_triton_mode_and_check_mode(fast, monkeypatch):
    kernel = _Kernel()
    x = torch.zeros(64)
    monkeypatch.setenv("ONETRIP_LAUNCH", "triton")
    _launch.launch_mode.cache_clear()
    for _ in range(2):
        _launch.launch(kernel, (1,), (x, 32), dict(BLOCK=16))
    assert _kinds(kernel.log) == ["triton", "triton"]

    kernel = _Kernel()
    monkeypatch.setenv("ONETRIP_LAUNCH", "check")
    _launch.launch_mode.cache_clear()
    for _ in range(2):
        _launch.launch(kernel, (1,), (x, 32), dict(BLOCK=16))
    assert _kinds(kernel.log) == ["triton", "run"]
    kernel.compiled.clear()  # Triton would now run another compiled kernel: a key that missed something
    with pytest.raises(RuntimeError, match="the key misses a specialization"):
        _launch.launch(kernel, (1,), (x, 32), dict(BLOCK=16))
    monkeypatch.setenv("ONETRIP_LAUNCH", "sometimes")
    _launch.launch_mode.cache_clear()
    with pytest.raises(ValueError, match="ONETRIP_LAUNCH must be one of"):
        _launch.launch(_Kernel(), (1,), (x, 32), dict(BLOCK=16))


@pytest.mark.skipif(not is_interpreting(), reason="the interpreter's kernels")
def test_interpreter_takes_tritons_path():
    """Under TRITON_INTERPRET=1 (CI) the kernels are the interpreter's: every launch is
    ``kernel[grid]``, so the tests run the ops through the fallback."""
    glu = importlib.import_module("onetrip.ops.glu")
    assert not _launch._fast_capable(glu._glu_kernel)


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr, SHIFT: tl.constexpr = 0.0):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * scale + SHIFT, mask=mask)


@pytest.mark.gpu
def test_gpu_launcher_matches_triton():
    """On a GPU: the second launch of a specialization goes to the compiled kernel's launcher
    and computes what Triton's path does, aligned and misaligned, and under graph capture."""
    from onetrip.graphs import capture

    base = torch.randn(4099, device="cuda")
    entry = None
    for x in (base[:4096], base[1:4097], base[3:4099]):  # aligned, and twice misaligned
        for n in (4096, 4000, 4095):
            y = torch.full_like(x, float("nan"))
            for _ in range(2):
                _launch.launch(_scale_kernel, (triton.cdiv(n, 256),), (x, y, n, 2.0), dict(BLOCK=256))
            torch.testing.assert_close(y[:n], x[:n] * 2.0, rtol=0, atol=0)
            entry = _launch._KERNELS[id(_scale_kernel)]
    assert entry.fast and len(entry.specs) >= 4  # aligned and not, n % 16 == 0 and not
    x, y = base[:4096], torch.zeros(4096, device="cuda")
    args = (x, y, 4096, 3.0)
    _launch.launch(_scale_kernel, (16,), args, dict(BLOCK=256, SHIFT=1.0))
    graph, _ = capture(lambda: _launch.launch(_scale_kernel, (16,), args, dict(BLOCK=256, SHIFT=1.0)))
    y.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x * 3.0 + 1.0)
