"""``call_op``: eager calls skip the custom op's Python dispatch; everything that traces,
intercepts or records autograd still goes through the dispatcher."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import onetrip
from onetrip.ops import _common
from onetrip.ops import norm as norm_mod

from conftest import DEVICE


def _inputs():
    g = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(3, 40, generator=g, device=DEVICE)
    r = torch.randn(3, 40, generator=g, device=DEVICE)
    w = torch.randn(40, generator=g, device=DEVICE)
    return x, r, w


class _Spy:
    """Counts the calls that reach the custom op's dispatcher entry (``op(*args)``)."""

    def __init__(self, op):
        self.op, self.calls = op, 0

    def __call__(self, *args):
        self.calls += 1
        return self.op(*args)

    def __getattr__(self, name):
        return getattr(self.op, name)


@pytest.fixture
def spy(monkeypatch):
    s = _Spy(norm_mod._norm_op)
    monkeypatch.setattr(norm_mod, "_norm_op", s)
    return s


def test_private_attributes_exist():
    """call_op relies on ``_init_fn`` and ``_qualname`` of a custom op; if a torch release
    drops them it falls back to the dispatcher, which this test would flag."""
    assert callable(norm_mod._norm_op._init_fn)
    assert norm_mod._norm_op._qualname == "onetrip::norm"


def test_eager_call_is_direct_and_exact(spy):
    x, r, w = _inputs()
    y, h = onetrip.add_rms_norm(x, r, w, 1e-6)
    assert spy.calls == 0
    torch.testing.assert_close(y, norm_mod.add_rms_norm_ref(x, r, w, 1e-6)[0], rtol=1e-5, atol=1e-5)


@pytest.fixture
def dispatch_env(monkeypatch):
    """Sets ONETRIP_DISPATCH for one test: ``dispatch_mode`` reads it again, before and after."""
    def set_mode(value):
        monkeypatch.setenv("ONETRIP_DISPATCH", value)
        _common.dispatch_mode.cache_clear()
    yield set_mode
    _common.dispatch_mode.cache_clear()


def test_dispatch_env_sends_calls_to_the_op(spy, dispatch_env):
    dispatch_env("op")
    onetrip.add_rms_norm(*_inputs(), 1e-6)
    assert spy.calls == 1
    dispatch_env("direct")
    onetrip.add_rms_norm(*_inputs(), 1e-6)
    assert spy.calls == 1


def test_dispatch_env_is_read_on_first_call(dispatch_env):
    """Set before import or after, ONETRIP_DISPATCH is read when an op first needs it; a
    value other than 'direct' or 'op' is refused then, naming the variable."""
    dispatch_env("sometimes")
    with pytest.raises(ValueError, match="ONETRIP_DISPATCH must be 'direct' or 'op', got 'sometimes'"):
        onetrip.add_rms_norm(*_inputs(), 1e-6)


def test_autograd_records_the_ops_function(spy):
    x, r, w = _inputs()
    x.requires_grad_(True)
    y, h = onetrip.add_rms_norm(x, r, w, 1e-6)
    assert y.grad_fn is not None and h.grad_fn is not None  # a node of the op's autograd.Function
    assert spy.calls == 0  # inside it nothing records, so the kernel is called directly
    torch.autograd.grad((y.float().sum() + h.float().sum()), x)


def test_fake_tensors_go_through_the_op(spy):
    with FakeTensorMode():
        x = torch.empty(3, 40, device=DEVICE)
        y, h = onetrip.add_rms_norm(x, torch.empty_like(x), torch.empty(40, device=DEVICE), 1e-6)
    assert spy.calls == 1 and y.shape == (3, 40)


def test_compile_still_sees_the_op():
    x, r, w = _inputs()
    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    f = torch.compile(lambda a, b, c: onetrip.add_rms_norm(a, b, c, 1e-6), backend=backend, fullgraph=True)
    y, _ = f(x, r, w)
    assert any("onetrip.norm" in s for s in seen), seen
    torch.testing.assert_close(y, onetrip.add_rms_norm(x, r, w, 1e-6)[0])


def test_profiler_records_the_op_name():
    x, r, w = _inputs()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        onetrip.add_rms_norm(x, r, w, 1e-6)
    assert any(e.name == "onetrip::norm" for e in prof.events())
