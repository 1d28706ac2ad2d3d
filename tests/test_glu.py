import functools

import pytest
import torch

from onetrip.ops._common import TileConfig, tile_config
from onetrip.ops.glu import (GLU_TILE, GLU_TILE_GPU, _glu_op, _launch, gelu_mul, gelu_mul_ref, glu_tile_config,
                             silu_mul, silu_mul_ref)
from onetrip.testing import assert_close, poison_, strided_like, upcast

from conftest import DTYPES, LAYOUTS, WIDE, WIDTHS

# (name, fused op, its reference), each taking (gate_up, up=None, *, out=None).
ACTIVATIONS = {
    "silu": (silu_mul, silu_mul_ref),
    "gelu_tanh": (functools.partial(gelu_mul, approximate="tanh"), functools.partial(gelu_mul_ref, approximate="tanh")),
    "gelu_none": (functools.partial(gelu_mul, approximate="none"), functools.partial(gelu_mul_ref, approximate="none")),
}
FORMS = ["concatenated", "two_tensors"]


def make_inputs(form, shape, dtype, device, gen, layout="contiguous", up_layout=None):
    """(gate_up, None) with gate_up of shape (..., 2F), or (gate, up) each of shape (..., F)."""
    if form == "concatenated":
        return strided_like(shape[:-1] + (2 * shape[-1],), dtype, device, layout, generator=gen), None
    return (
        strided_like(shape, dtype, device, layout, generator=gen),
        strided_like(shape, dtype, device, up_layout or layout, generator=gen),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS + [WIDE])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_matches_reference(device, gen, dtype, width, form, activation):
    op, ref = ACTIVATIONS[activation]
    rows = 3 if width > 5000 else 37
    inputs = make_inputs(form, (rows, width), dtype, device, gen)
    out = poison_(torch.empty(rows, width, dtype=dtype, device=device))
    y = op(*inputs, out=out)
    assert y is out
    assert_close(activation, y, ref(*upcast(*inputs)), ref(*inputs))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("form", FORMS)
def test_layouts_and_leading_dims(device, gen, form, layout):
    # Two tensors: gate in `layout`, up in the next one, so each has its own row stride.
    up_layout = LAYOUTS[(LAYOUTS.index(layout) + 1) % len(LAYOUTS)]
    inputs = make_inputs(form, (5, 7, 111), torch.bfloat16, device, gen, layout, up_layout)
    for name, (op, ref) in ACTIVATIONS.items():
        y = op(*inputs)
        assert y.shape == (5, 7, 111) and y.dtype == torch.bfloat16
        assert_close(name, y, ref(*upcast(*inputs)), ref(*inputs))


def test_halves_of_one_tensor_as_two(device, gen):
    gate_up = strided_like((6, 2, 2 * 45), torch.float16, device, "padded", generator=gen)
    gate, up = gate_up.chunk(2, -1)
    y = silu_mul(gate, up)
    assert_close("silu", y, silu_mul_ref(upcast(gate_up)), silu_mul_ref(gate_up))


@pytest.mark.parametrize("form", FORMS)
def test_strided_out(device, gen, form):
    inputs = make_inputs(form, (9, 33), torch.float16, device, gen)
    out = poison_(torch.empty(9, 40, dtype=torch.float16, device=device))[:, :33]
    y = gelu_mul(*inputs, approximate="none", out=out)
    assert y is out
    assert_close("gelu_none", out, gelu_mul_ref(*upcast(*inputs), "none"), gelu_mul_ref(*inputs, "none"))


def test_non_viewable_out_is_written(device, gen):
    gate_up = strided_like((4, 6, 16), torch.float32, device, generator=gen)
    out = poison_(torch.empty(6, 4, 8, device=device)).transpose(0, 1)  # no single row stride
    silu_mul(gate_up, out=out)
    assert_close("silu", out, silu_mul_ref(upcast(gate_up)), silu_mul_ref(gate_up))


@pytest.mark.parametrize("shape", [(0, 16), (3, 0)])
def test_empty(device, shape):
    gate_up = torch.empty(shape, device=device)
    assert silu_mul(gate_up).shape == shape[:-1] + (shape[-1] // 2,)
    assert gelu_mul(gate_up, torch.empty(shape, device=device)).shape == shape


def test_cpu_without_interpreter_runs_reference(monkeypatch):
    gate_up = strided_like((5, 22), torch.bfloat16, "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert torch.equal(silu_mul(gate_up), silu_mul_ref(gate_up))
    assert torch.equal(gelu_mul(gate_up), gelu_mul_ref(gate_up))


def test_custom_op_registration(device, gen):
    gate, up = make_inputs("two_tensors", (3, 17), torch.float32, device, gen)
    for activation in ("silu", "gelu_tanh", "gelu_erf"):
        torch.library.opcheck(_glu_op, (gate, up, torch.empty_like(gate), activation))


def test_bad_input(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(TypeError, match="gate_up must be a torch.Tensor, got list"):
        silu_mul([1.0, 2.0])
    with pytest.raises(TypeError, match="gate_up has dtype torch.int32"):
        silu_mul(x.int())
    with pytest.raises(ValueError, match=r"gate_up has shape \(4, 7\), an odd last dimension"):
        gelu_mul(torch.randn(4, 7, device=device))
    with pytest.raises(TypeError, match="up has dtype torch.int64"):
        silu_mul(x, torch.ones(4, 8, dtype=torch.long, device=device))
    with pytest.raises(ValueError, match=r"up has shape \(4, 7\); expected \(4, 8\)"):
        silu_mul(x, torch.randn(4, 7, device=device))
    with pytest.raises(TypeError, match="up has dtype torch.float16 but gate_up has torch.float32"):
        gelu_mul(x, x.half())
    if device != "cpu":
        with pytest.raises(ValueError, match="up is on cpu but gate_up is on cuda"):
            silu_mul(x, x.cpu())
    with pytest.raises(ValueError, match="approximate must be one of"):
        gelu_mul(x, approximate="erf")
    with pytest.raises(ValueError, match=r"out has shape \(4, 8\); expected \(4, 4\)"):
        silu_mul(x, out=torch.empty(4, 8, device=device))
    with pytest.raises(TypeError, match="out has dtype torch.float16; the result is torch.float32"):
        gelu_mul(x, x, out=torch.empty(4, 8, device=device).half())
    with pytest.raises(TypeError, match="out must be a torch.Tensor or None, got ndarray"):
        silu_mul(x, out=x.numpy(force=True))


@pytest.mark.parametrize("rows, width", [(1, 1), (17, 111), (4, 4096), (6, 2048), (5, 5000)])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_constant_shape_matches_runtime_shape(device, gen, rows, width, activation):
    """``_launch(const=True)`` (the width and row strides compiled in, no masks where the
    tiles cover the rows: the default) gives bitwise the runtime-shape kernel's y, for the
    halves of one tensor and for two tensors with their own row strides."""
    gate_up = torch.randn(rows, 2 * width, generator=gen, device=device).to(torch.bfloat16)
    up_wide = torch.randn(rows, width + 24, generator=gen, device=device).to(torch.bfloat16)[:, 8:8 + width]
    for gate, up in ((gate_up[:, :width], gate_up[:, width:]), (gate_up[:, :width], up_wide)):
        ys = []
        for const in (False, True):
            y = poison_(torch.empty(rows, width, dtype=torch.bfloat16, device=device))
            _launch(gate, up, y, activation, const=const)
            ys.append(y)
        assert torch.equal(ys[0], ys[1]) and not torch.isnan(ys[1]).any()


@pytest.mark.parametrize("rows, width", [(1, 1), (17, 111), (3, 1024), (5, 5000)])
def test_every_gpu_tile_matches_default(device, gen, rows, width):
    """Each GPU model's tile (GLU_TILE_GPU; off a GPU only GLU_TILE runs) gives bitwise the
    default tile's y: an element's arithmetic does not depend on the tile."""
    gate_up = torch.randn(rows, 2 * width, generator=gen, device=device).to(torch.bfloat16)
    ys = []
    for entry in [GLU_TILE] + [e["tile"] for e in GLU_TILE_GPU.values()]:
        y = poison_(torch.empty(rows, width, dtype=torch.bfloat16, device=device))
        _launch(gate_up[:, :width], gate_up[:, width:], y, "silu", config=glu_tile_config(rows, width, entry))
        ys.append(y)
    assert not torch.isnan(ys[0]).any() and all(torch.equal(ys[0], y) for y in ys[1:])


def test_tile_config_keeps_elements_a_thread():
    """A tile entry's elements a thread hold where few narrow rows shrink the tile (fewer warps)."""
    assert glu_tile_config(65536, 1024, (1024, 8)) == TileConfig(1, 1024, 8)  # 4 a thread
    assert glu_tile_config(4096, 4096, (1024, 8)) == TileConfig(1, 1024, 8)  # a tile no wider than its elements
    assert glu_tile_config(64, 262144, (4096, 16)) == TileConfig(2, 2048, 16)  # rows of at most 2048
    assert glu_tile_config(4, 17, (1024, 8)) == TileConfig(4, 32, 1)  # 128 elements: one warp
    assert glu_tile_config(64, 262144, (2048, 8)) == TileConfig(1, 2048, 8)  # 8 a thread
    with pytest.raises(ValueError, match="per_thread=0 must be >= 1"):
        tile_config(4, 17, per_thread=0)
