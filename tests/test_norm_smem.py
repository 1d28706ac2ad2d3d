"""benchmarks/norm_smem.py (Gluon: rows staged in shared memory by TMA, Hopper only) against
the op-by-op references with the 2x-PyTorch-error rule. GPU only: Gluon kernels do not
run under Triton's interpreter."""

import sys
from pathlib import Path

import pytest
import torch

from onetrip.ops.norm import layer_norm_ref, rms_norm_ref
from onetrip.testing import assert_close, upcast

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.mark.gpu
@pytest.mark.parametrize("rows, width, chunk", [(1, 8192, 4096), (5, 16384, 8192), (133, 16384, 4096),
                                                (300, 65536, 8192), (17, 49152, 8192)])
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_norm_smem_matches_reference(gen, rows, width, chunk, kind, dtype):
    """Fewer rows than SMs, a ragged last round of rows (133, 300 over 132 programs), rows
    that fill the ring and rows that leave slots to prefetch the next."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs Hopper")
    from norm_smem import norm_smem

    x = torch.randn(rows, width, device="cuda", generator=gen).to(dtype)
    w = torch.randn(width, device="cuda", generator=gen).to(dtype)
    b = torch.randn(width, device="cuda", generator=gen).to(dtype) if kind == "layer" else None
    y = torch.full_like(x, float("nan"))
    for _ in range(2):  # a second call over the same output
        norm_smem(x, w, b, 1e-6, y, chunk=chunk)
        if kind == "rms":
            assert_close("y", y, rms_norm_ref(*upcast(x, w), 1e-6), rms_norm_ref(x, w, 1e-6))
        else:
            assert_close("y", y, layer_norm_ref(*upcast(x, w, b), 1e-6), layer_norm_ref(x, w, b, 1e-6))


@pytest.mark.gpu
def test_norm_smem_rejects_what_it_cannot_stage():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs Hopper")
    from norm_smem import norm_smem

    x = torch.zeros(4, 5000, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of chunk"):
        norm_smem(x, x[0], None, 1e-6, torch.empty_like(x))
    x = torch.zeros(4, 262144, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="slots"):
        norm_smem(x, x[0], None, 1e-6, torch.empty_like(x))
