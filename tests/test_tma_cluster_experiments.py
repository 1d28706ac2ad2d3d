"""benchmarks/read_tma.py (Gluon: every program's slice put in flight by TMA, Hopper only)
and benchmarks/norm_cluster.py (the thread-block-cluster norm's prototype): the read's sum
and copy exact, the prototype within the 2x-PyTorch-error rule. GPU only."""

import sys
from pathlib import Path

import pytest
import torch

from onetrip.ops.norm import layer_norm_ref, rms_norm_ref
from onetrip.testing import assert_close, poison_, upcast

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def _hopper():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA and clusters need Hopper")


@pytest.mark.gpu
@pytest.mark.parametrize("programs, box_rows, slots", [(1, 64, 2), (7, 128, 2), (132, 64, 17), (300, 32, 3)])
def test_tma_read_sums_and_copies(gen, programs, box_rows, slots):
    """Slices that fit the ring and slices that cycle it, a ragged split of 211 boxes."""
    _hopper()
    from read_tma import tma_read

    x = torch.randn(211 * box_rows * 64, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.zeros(4096, device="cuda")
    tma_read(x, out, programs, box_rows, slots)
    torch.testing.assert_close(out.sum(), x.double().sum().float(), rtol=1e-4, atol=1e-2)
    y = poison_(torch.empty_like(x))
    tma_read(x, out, programs, box_rows, slots, y=y)
    assert torch.equal(y, x)


@pytest.mark.gpu
@pytest.mark.parametrize("width, c, block, warps, held", [(131072, 8, 4096, 8, False), (262144, 16, 16384, 16, True)])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_norm_cluster_prototype(gen, width, c, block, warps, held, kind):
    _hopper()
    from norm_cluster import cluster_norm

    x = torch.randn(3, width, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.randn(width, device="cuda", generator=gen).to(torch.bfloat16)
    b = torch.randn(width, device="cuda", generator=gen).to(torch.bfloat16) if kind == "layer" else None
    y = poison_(torch.empty_like(x))
    cluster_norm(x, w, b, 1e-6, y, c, block, warps, held)
    if kind == "rms":
        assert_close("y", y, rms_norm_ref(*upcast(x, w), 1e-6, round_to=x.dtype), rms_norm_ref(x, w, 1e-6))
    else:
        assert_close("y", y, layer_norm_ref(*upcast(x, w, b), 1e-6), layer_norm_ref(x, w, b, 1e-6))
