"""bias_gelu's backward: dx and dbias against PyTorch's autograd of the reference (the 2x
rule), dbias the same bits run to run, the one-wave layouts (several bands and column
slices, each way of keeping loads in flight), torch.compile and CUDA-graph capture of fwd + bwd."""

import pytest
import torch

import onetrip
from onetrip.ops.bias_gelu import (BACKWARD_PICKS, BackwardConfig, BackwardPlan, _bias_gelu_backward_op,
                                   _launch_backward, backward_plan, bias_gelu_ref)
from onetrip.testing import assert_grads_close, strided_like

from conftest import ON_GPU, WIDE, assert_replay_matches


def leaf(shape, dtype, device, gen, kind="contiguous"):
    return strided_like(shape, dtype, device, kind, generator=gen).requires_grad_()


# (dtype, approximate, rows, width): each width and both forms at least once, not the full cross.
CASES = [
    (torch.float32, "tanh", 37, 1023),
    (torch.bfloat16, "none", 37, 111),
    (torch.bfloat16, "tanh", 1, 17),
    (torch.float32, "none", 37, 1),
    (torch.bfloat16, "tanh", 1, 1),
]


@pytest.mark.parametrize("dtype, approximate, rows, width", CASES)
def test_grads_match_reference(device, gen, dtype, approximate, rows, width):
    x, bias = leaf((rows, width), dtype, device, gen), leaf((width,), dtype, device, gen)
    dy = strided_like((rows, width), dtype, device, generator=gen)
    assert_grads_close("bias_gelu", onetrip.bias_gelu, bias_gelu_ref,
                       dict(x=x, bias=bias, approximate=approximate), dy)


@pytest.mark.parametrize("which", ["x", "bias", "no_bias"])
def test_one_input_requires_grad(device, gen, which):
    x = strided_like((3, 5, 111), torch.bfloat16, device, generator=gen).requires_grad_(which != "bias")
    bias = None if which == "no_bias" else leaf((111,), torch.bfloat16, device, gen).requires_grad_(which == "bias")
    dy = strided_like((3, 5, 111), torch.bfloat16, device, generator=gen)
    reports = assert_grads_close("bias_gelu", onetrip.bias_gelu, bias_gelu_ref, dict(x=x, bias=bias), dy)
    assert set(reports) == ({"bias"} if which == "bias" else {"x"})


def test_non_contiguous(device, gen):
    x = leaf((5, 7, 111), torch.float32, device, gen, "transposed")  # no single row stride: copied
    bias = leaf((111,), torch.float32, device, gen, "rows")
    inputs = dict(x=x, bias=bias, approximate="none")
    dy = strided_like((5, 7, 111), torch.float32, device, "padded", generator=gen)
    assert_grads_close("bias_gelu", onetrip.bias_gelu, bias_gelu_ref, inputs, dy)
    # rows of stride 0, in bf16: in float32, dbias sums 35 equal rows to ~50, where PyTorch's own
    # float32 sum can land exactly and leave no room for an ulp of order
    x16, b16 = leaf((5, 7, 111), torch.bfloat16, device, gen), leaf((111,), torch.bfloat16, device, gen)
    dy = strided_like((111,), torch.bfloat16, device, generator=gen).expand(5, 7, 111)
    assert_grads_close("bias_gelu", onetrip.bias_gelu, bias_gelu_ref, dict(x=x16, bias=b16, approximate="none"), dy)


def test_dbias_is_deterministic(device, gen):
    # 37 x 1023: one band (bands hold >= 128 rows) walked in a loop; test_layouts has several
    x, bias = leaf((37, 1023), torch.bfloat16, device, gen), leaf((1023,), torch.bfloat16, device, gen)
    dy = strided_like((37, 1023), torch.bfloat16, device, generator=gen)
    y = onetrip.bias_gelu(x, bias)
    runs = [torch.autograd.grad(y, bias, dy, retain_graph=True)[0] for _ in range(2)]
    assert torch.equal(*runs)


# Bands of >= 4 rows at the CPU's nominal 4 SMs: 37 x 111 float32 in 64-column slices (the
# second ragged), 7 bands of 6 rows (the last of 1) walked 2 rows a step.
SMALL = dict(tile=256, programs_per_sm=4, max_partials=4, min_band=4)


@pytest.mark.parametrize("config", [BackwardConfig(**SMALL), BackwardConfig(**SMALL, prefetch=False, stages=2)],
                         ids=["prefetch", "stages"])
def test_layouts(device, gen, config):
    x, dy = (strided_like((37, 111), torch.float32, device, generator=gen) for _ in range(2))
    bias = strided_like((111,), torch.float32, device, generator=gen)
    assert backward_plan(37, 111, config, 4, itemsize=4) == BackwardPlan(2, 64, 6, 7, 2)
    dx, dbias = torch.full_like(x, float("nan")), torch.full_like(bias, float("nan"))
    _launch_backward(dy, x, bias, dx, dbias, "tanh", config)
    t = (x + bias).double()
    want = torch.ops.aten.gelu_backward(dy.double(), t, approximate="tanh")
    # a tile or band written twice, skipped or summed into the wrong row errs by O(1); GELU''s
    # approximations (~2**-22 on a GPU) by ~1e-6
    torch.testing.assert_close(dx, want.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dbias, want.sum(0).float(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", sorted(BACKWARD_PICKS))
def test_plan_is_one_wave(name):
    """Each pick on an H200 (132 SMs) at the bench's widths: at most one wave, at least 90%
    of it, whole tiles a band, partial rows <= 1.1% of the row pass's bf16 bytes."""
    cfg = BACKWARD_PICKS[name]
    target = cfg.programs_per_sm * 132
    for width in (1024, 4096, 16384, 65536, 262144):
        rows = 2**26 // width
        plan = backward_plan(rows, width, cfg, 132)
        programs = plan.bands * plan.col_blocks
        assert 0.9 * target <= programs <= target, (width, plan)
        assert plan.band % plan.block_m == 0 and plan.bands * plan.band >= rows > (plan.bands - 1) * plan.band
        assert 8 * plan.bands * width <= 0.011 * 6 * rows * width, (width, plan)


def test_config_checks():
    with pytest.raises(ValueError, match="prefetch and stages=3"):
        BackwardConfig(stages=3)
    with pytest.raises(ValueError, match="tile=96"):
        BackwardConfig(tile=96)
    assert BackwardConfig().maxnreg == 64 and BackwardConfig(programs_per_sm=1, num_warps=1).maxnreg == 255


def test_out_with_grad_raises(device, gen):
    x = leaf((4, 8), torch.float32, device, gen)
    with pytest.raises(ValueError, match="out= is not supported when an input requires a gradient"):
        onetrip.bias_gelu(x, out=torch.empty(4, 8, device=device))
    with torch.no_grad():  # nothing recorded: out= as before
        onetrip.bias_gelu(x, out=torch.empty(4, 8, device=device))


def test_cpu_without_interpreter_runs_fallback(monkeypatch, gen):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, bias = leaf((37, 17), torch.bfloat16, "cpu", None), leaf((17,), torch.bfloat16, "cpu", None)
    dy = strided_like((37, 17), torch.bfloat16, "cpu")
    assert_grads_close("bias_gelu", onetrip.bias_gelu, bias_gelu_ref, dict(x=x, bias=bias, approximate="none"), dy)


def test_custom_op_registration(device, gen):
    # without bias (None for an optional mutated argument); test_compile_fwd_bwd traces it with one
    x, dy = strided_like((3, 17), torch.float32, device, generator=gen), strided_like((3, 17), torch.float32, device)
    torch.library.opcheck(_bias_gelu_backward_op, (dy, x, None, torch.empty_like(x), None, "none"))


def test_compile_fwd_bwd(device, gen):
    """The forward traced whole (fullgraph), its backward graph (AOTAutograd's) holding the
    backward op: both equal to eager bit for bit."""
    x, bias = leaf((5, 111), torch.bfloat16, device, gen), leaf((111,), torch.bfloat16, device, gen)
    dy = strided_like((5, 111), torch.bfloat16, device, generator=gen)

    def step(fn):
        y = fn(x, bias)
        return (y, *torch.autograd.grad(y, (x, bias), dy))

    eager = step(onetrip.bias_gelu)
    torch._dynamo.reset()
    # aot_eager on the CPU: the question is whether the graph traces without a break (test_compile.py)
    got = step(torch.compile(onetrip.bias_gelu, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager"))
    for a, e in zip(got, eager):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("rows, width", [(4096, 5000), (3, WIDE), (65536, 64), (1, 4096)])
def test_gpu_wide(gen, dtype, approximate, rows, width):
    x, bias = leaf((rows, width), dtype, "cuda", gen), leaf((width,), dtype, "cuda", gen)
    dy = strided_like((rows, width), dtype, "cuda", generator=gen)
    assert_grads_close("bias_gelu", onetrip.bias_gelu, bias_gelu_ref, dict(x=x, bias=bias, approximate=approximate), dy)
    runs = [torch.autograd.grad(onetrip.bias_gelu(x, bias, approximate), bias, dy)[0] for _ in range(2)]
    assert torch.equal(*runs)


@pytest.mark.gpu
def test_gpu_graph_capture(gen):
    x, bias = leaf((1000, 3000), torch.bfloat16, "cuda", gen), leaf((3000,), torch.bfloat16, "cuda", gen)
    dy = strided_like((1000, 3000), torch.bfloat16, "cuda", generator=gen)

    def step():
        y = onetrip.bias_gelu(x, bias)
        return (y, *torch.autograd.grad(y, (x, bias), dy))

    assert_replay_matches(step)
