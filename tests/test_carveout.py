"""``NormConfig.carveout`` / ``_common.prefer_carveout``: the shared-memory share of the SM's
L1 / shared array a kernel asks the driver for. A hint that changes no result."""

import ctypes

import pytest
import torch

from onetrip.ops import norm as norm_mod
from onetrip.ops._common import _CARVEOUT_ATTRIBUTE, _libcuda, prefer_carveout
from onetrip.ops.norm import NormConfig
from onetrip.testing import poison_

from conftest import ON_GPU
from test_norm import _check, _params


def test_carveout_no_op_without_a_kernel(device, gen):
    """No kernel (the interpreter's launch, a CPU reference) or no driver handle: nothing to set,
    no error; the config runs and is right."""
    prefer_carveout(None, 50)
    prefer_carveout(object(), 50)  # no ``function`` handle
    x = torch.randn(5, 1024, generator=gen, device=device).to(torch.bfloat16)
    w, b = _params("layer", 1024, torch.bfloat16, device, gen)
    y = poison_(torch.empty_like(x))
    norm_mod._launch(x, None, w, b, y, None, 1e-6, False, False, NormConfig("rows", 2, 1024, 4, carveout=50))
    _check("layer", x, None, w, b, 1e-6, y, None)


@pytest.mark.skipif(not ON_GPU, reason="a driver attribute of a compiled kernel: a GPU")
def test_carveout_gpu(gen):
    """The compiled kernel carries the asked carveout from its first launch on (the driver's
    attribute reads it back), -1 gives the choice back, and the results do not move."""
    device = torch.device("cuda")
    x = torch.randn(7, 8192, generator=gen, device=device).to(torch.bfloat16)
    w, b = _params("layer", 8192, torch.bfloat16, device, gen)
    lib = _libcuda()

    def attr(kernel):
        v = ctypes.c_int(-7)
        assert lib.cuFuncGetAttribute(ctypes.byref(v), ctypes.c_int(_CARVEOUT_ATTRIBUTE),
                                      ctypes.c_void_p(kernel.function)) == 0
        return v.value

    outs = []
    for carveout in (72, 0, -1):
        cfg = NormConfig("loop", 1, 1024, 4, vec=True, const_n=True, split=4, carveout=carveout)
        y = poison_(torch.empty_like(x))
        kernel = norm_mod._launch(x, None, w, b, y, None, 1e-6, False, False, cfg)
        assert attr(kernel) == carveout
        _check("layer", x, None, w, b, 1e-6, y, None)
        outs.append(y)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
