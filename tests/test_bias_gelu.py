import pytest
import torch

import onetrip
from onetrip.ops.bias_gelu import bias_gelu_ref
from onetrip.testing import assert_close, poison_, strided_like, upcast

from conftest import DTYPES, LAYOUTS, WIDE, WIDTHS


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS + [WIDE])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_matches_reference(device, gen, dtype, width, approximate):
    rows = 3 if width > 5000 else 37
    x = strided_like((rows, width), dtype, device, generator=gen)
    bias = strided_like((width,), dtype, device, generator=gen)
    out = poison_(torch.empty_like(x))
    y = onetrip.bias_gelu(x, bias, approximate, out=out)
    assert y is out
    assert_close("bias_gelu", y, bias_gelu_ref(*upcast(x, bias), approximate), bias_gelu_ref(x, bias, approximate))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_and_leading_dims(device, gen, layout):
    x = strided_like((5, 7, 111), torch.bfloat16, device, layout, generator=gen)
    bias = strided_like((111,), torch.bfloat16, device, "rows", generator=gen)  # non-contiguous bias
    y = onetrip.bias_gelu(x, bias)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert_close("bias_gelu", y, bias_gelu_ref(*upcast(x, bias)), bias_gelu_ref(x, bias))


def test_no_bias_and_strided_out(device, gen):
    x = strided_like((9, 33), torch.float16, device, generator=gen)
    out = poison_(torch.empty(9, 40, dtype=torch.float16, device=device))[:, :33]
    y = onetrip.bias_gelu(x, None, "none", out=out)
    assert y is out
    assert_close("bias_gelu", out, bias_gelu_ref(upcast(x), None, "none"), bias_gelu_ref(x, None, "none"))


def test_non_viewable_out_is_written(device, gen):
    x = strided_like((4, 6, 8), torch.float32, device, generator=gen)
    out = poison_(torch.empty(6, 4, 8, device=device)).transpose(0, 1)  # no single row stride
    onetrip.bias_gelu(x, out=out)
    assert_close("bias_gelu", out, bias_gelu_ref(upcast(x)), bias_gelu_ref(x))


def test_empty(device):
    for shape in [(0, 16), (3, 0)]:
        assert onetrip.bias_gelu(torch.empty(shape, device=device)).shape == shape


def test_bad_input(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(TypeError, match="x has dtype torch.int32"):
        onetrip.bias_gelu(x.int())
    with pytest.raises(ValueError, match=r"bias has shape \(7,\)"):
        onetrip.bias_gelu(x, torch.randn(7, device=device))
    with pytest.raises(TypeError, match="bias has dtype torch.float16 but x has torch.float32"):
        onetrip.bias_gelu(x, torch.randn(8, device=device).half())
    with pytest.raises(ValueError, match="approximate must be one of"):
        onetrip.bias_gelu(x, approximate="erf")
    with pytest.raises(ValueError, match=r"out has shape \(4, 9\)"):
        onetrip.bias_gelu(x, out=torch.empty(4, 9, device=device))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        onetrip.bias_gelu([1.0, 2.0])
