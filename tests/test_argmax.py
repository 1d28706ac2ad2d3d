"""argmax over the vocabulary: the same index as torch.argmax, ties to the first index."""

import importlib

import pytest
import torch

from conftest import DEVICE, ON_GPU, capture

argmax_mod = importlib.import_module("onetrip.ops.argmax")
argmax = argmax_mod.argmax


@pytest.mark.parametrize("V", [1, 17, 2048, 2049, 5000, 128256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matches_torch(V, dtype, gen):
    x = torch.randn((3, V), generator=gen, device=DEVICE).to(dtype)
    assert torch.equal(argmax(x), torch.argmax(x, dim=-1))


@pytest.mark.parametrize("V", [17, 5000])
def test_ties_take_the_first_index(V, gen):
    # small integers: many exact ties for the maximum, none at zero (-0.0 vs +0.0)
    x = torch.randint(1, 4, (5, V), generator=gen, device=DEVICE).to(torch.bfloat16)
    x[1] = -torch.randint(1, 4, (V,), generator=gen, device=DEVICE).to(torch.bfloat16)  # all negative
    x[2] = float("-inf")
    x[3, -1] = float("inf")
    assert torch.equal(argmax(x), torch.argmax(x, dim=-1))


def test_nan_counts_as_largest(gen):
    x = torch.randn((2, 5000), generator=gen, device=DEVICE)
    x[0, 4321] = float("nan")
    assert argmax(x)[0].item() == 4321


def test_strided_and_leading_dims(gen):
    base = torch.randn((4, 3, 2 * 5000 + 3), generator=gen, device=DEVICE)
    x = base[..., 1:2 * 5000 + 1:2]                       # non-unit stride along V
    assert torch.equal(argmax(x), torch.argmax(x, dim=-1))
    y = base.transpose(0, 1)[..., :1023]                  # permuted leading dims
    assert torch.equal(argmax(y), torch.argmax(y, dim=-1))
    assert argmax(torch.randn((0, 7), device=DEVICE)).shape == (0,)


def test_bad_input():
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        argmax(torch.zeros((2, 3), dtype=torch.int64))
    with pytest.raises(ValueError, match="last dimension of at least 1"):
        argmax(torch.zeros((2, 0)))


def test_compile_no_graph_break(gen):
    x = torch.randn((2, 3000), generator=gen, device=DEVICE)
    f = torch.compile(lambda t: argmax(t * 2.0), fullgraph=True)
    assert torch.equal(f(x), torch.argmax(x, dim=-1))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
def test_graph_capture(gen):
    x = torch.randn((4, 128256), generator=gen, device=DEVICE, dtype=torch.bfloat16)
    graph, out = capture(lambda: argmax(x))
    x.copy_(torch.randn(x.shape, generator=gen, device=DEVICE))
    graph.replay()
    assert torch.equal(out, torch.argmax(x, dim=-1))
