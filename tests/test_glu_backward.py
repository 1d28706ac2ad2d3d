"""silu_mul / gelu_mul backward: dgate and dup against PyTorch's autograd of the reference
(the 2x rule), packed and separate inputs, torch.compile and CUDA-graph capture of fwd + bwd."""

import functools

import pytest
import torch

from onetrip.ops.glu import _glu_backward_op, gelu_mul, gelu_mul_ref, silu_mul, silu_mul_ref
from onetrip.testing import assert_grads_close, strided_like

from conftest import ON_GPU, WIDE, assert_replay_matches

ACTIVATIONS = {
    "silu": (silu_mul, silu_mul_ref),
    "gelu_tanh": (functools.partial(gelu_mul, approximate="tanh"), functools.partial(gelu_mul_ref, approximate="tanh")),
    "gelu_none": (functools.partial(gelu_mul, approximate="none"), functools.partial(gelu_mul_ref, approximate="none")),
}


def inputs(packed, shape, dtype, device, gen, layout="contiguous"):
    """{gate_up: (..., 2F)} or {gate_up: gate (..., F), up: (..., F)}, requiring gradients;
    the gate scaled by 3 so the activations' tails are reached."""
    def leaf(s):
        return strided_like(s, dtype, device, layout, generator=gen).requires_grad_()

    if packed:
        gate_up = leaf(shape[:-1] + (2 * shape[-1],))
        with torch.no_grad():
            gate_up[..., : shape[-1]] *= 3
        return dict(gate_up=gate_up)
    gate, up = leaf(shape), leaf(shape)
    with torch.no_grad():
        gate *= 3
    return dict(gate_up=gate, up=up)


# (activation, dtype, packed, rows, width): each activation, dtype, form and width at least once.
CASES = [
    ("silu", torch.float32, True, 37, 1023),
    ("silu", torch.bfloat16, False, 1, 17),
    ("gelu_tanh", torch.float32, True, 37, 111),
    ("gelu_tanh", torch.bfloat16, False, 37, 1),
    ("gelu_none", torch.bfloat16, True, 1, 17),
    ("gelu_none", torch.float32, False, 37, 111),
]


@pytest.mark.parametrize("activation, dtype, packed, rows, width", CASES)
def test_grads_match_reference(device, gen, activation, dtype, packed, rows, width):
    op, ref = ACTIVATIONS[activation]
    dy = strided_like((rows, width), dtype, device, generator=gen)
    reports = assert_grads_close(activation, op, ref, inputs(packed, (rows, width), dtype, device, gen), dy)
    assert set(reports) == ({"gate_up"} if packed else {"gate_up", "up"})


def test_packed_gradient_is_one_tensor(device, gen):
    x = inputs(True, (3, 17), torch.float32, device, gen)
    (g,) = torch.autograd.grad(silu_mul(**x), x["gate_up"], torch.ones(3, 17, device=device))
    assert g.shape == (3, 34) and g.is_contiguous()


@pytest.mark.parametrize("packed", [True, False])
def test_non_contiguous(device, gen, packed):
    # no single row stride: the inputs are copied; the upstream gradient padded rows
    x = inputs(packed, (5, 7, 111), torch.bfloat16, device, gen, "transposed")
    dy = strided_like((5, 7, 111), torch.bfloat16, device, "padded", generator=gen)
    assert_grads_close("gelu_tanh", *ACTIVATIONS["gelu_tanh"], x, dy)


def test_only_up_requires_grad(device, gen):
    x = inputs(False, (4, 17), torch.bfloat16, device, gen)
    x["gate_up"].requires_grad_(False)
    reports = assert_grads_close("silu", silu_mul, silu_mul_ref, x, strided_like((4, 17), torch.bfloat16, device))
    assert set(reports) == {"up"}


def test_out_with_grad_raises(device, gen):
    x = inputs(True, (4, 8), torch.float32, device, gen)
    with pytest.raises(ValueError, match="out= is not supported when an input requires a gradient"):
        gelu_mul(**x, out=torch.empty(4, 8, device=device))


def test_cpu_without_interpreter_runs_fallback(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for name, (op, ref) in ACTIVATIONS.items():
        for packed in (True, False):
            x = inputs(packed, (37, 17), torch.bfloat16, "cpu", None)
            assert_grads_close(name, op, ref, x, strided_like((37, 17), torch.bfloat16, "cpu"))


def test_custom_op_registration(device, gen):
    gate_up = strided_like((3, 34), torch.float32, device, generator=gen)
    dy = strided_like((3, 17), torch.float32, device, generator=gen)
    # packed: dup None, dgate the (M, 2N) gradient
    torch.library.opcheck(_glu_backward_op, (dy, gate_up[:, :17], gate_up[:, 17:], torch.empty_like(gate_up), None,
                                             "gelu_erf"))


def test_compile_fwd_bwd(device, gen):
    """The forward traced whole (fullgraph), its backward graph (AOTAutograd's) holding the
    backward op: both equal to eager bit for bit, packed and separate."""
    packed, separate = inputs(True, (5, 111), torch.bfloat16, device, gen), inputs(False, (5, 111), torch.bfloat16,
                                                                                    device, gen)
    dy = strided_like((5, 111), torch.bfloat16, device, generator=gen)

    def both(gate_up, gate, up):
        return silu_mul(gate_up), gelu_mul(gate, up)

    def step(fn):
        y1, y2 = fn(packed["gate_up"], separate["gate_up"], separate["up"])
        leaves = (packed["gate_up"], separate["gate_up"], separate["up"])
        return (y1, y2, *torch.autograd.grad((y1, y2), leaves, (dy, dy)))

    eager = step(both)
    torch._dynamo.reset()
    # aot_eager on the CPU: the question is whether the graph traces without a break (test_compile.py)
    got = step(torch.compile(both, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager"))
    for a, e in zip(got, eager):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("rows, width", [(4096, 5000), (3, WIDE), (1, 14336)])
def test_gpu_wide(gen, activation, dtype, packed, rows, width):
    op, ref = ACTIVATIONS[activation]
    dy = strided_like((rows, width), dtype, "cuda", generator=gen)
    assert_grads_close(activation, op, ref, inputs(packed, (rows, width), dtype, "cuda", gen), dy)


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [True, False])
def test_gpu_graph_capture(gen, packed):
    x = inputs(packed, (1000, 3000), torch.bfloat16, "cuda", gen)
    dy = strided_like((1000, 3000), torch.bfloat16, "cuda", generator=gen)

    def step():
        y = silu_mul(**x)
        return (y, *torch.autograd.grad(y, list(x.values()), dy))

    assert_replay_matches(step)
