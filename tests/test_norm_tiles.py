"""benchmarks/norm_tiles.py (a few wide rows in two launches over 2-D tiles, the second under
PDL on Hopper): within the 2x-PyTorch-error rule, h = x + r exact; ragged tiles in both
directions; through the interpreter the two launches run in turn."""

import sys
from pathlib import Path

import pytest
import torch

from onetrip.testing import poison_

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from test_norm_stream_experiments import _check, _inputs  # noqa: E402


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("rows, width, bm, bn, bc", [(5, 111, 2, 64, 32), (1, 17, 1, 16, 8), (9, 1023, 4, 256, 128)])
def test_tiles(device, gen, kind, residual, rows, width, bm, bn, bc):
    """Ragged row blocks (5 rows in blocks of 2) and column blocks (111 = 64 + 47)."""
    from norm_tiles import tiles_norm

    x, r, w, b = _inputs(gen, device, rows, width, kind, residual)
    y = poison_(torch.empty_like(x))
    h = poison_(torch.empty_like(x)) if residual else None
    tiles_norm(x, r, w, b, 1e-5, y, h, bm, bn, bc, 4)
    _check(x, r, w, b, y, h, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("pdl", [False, True])
def test_tiles_gpu(gen, kind, residual, pdl):
    """64 rows of 65537 + 5 (the last tile ragged), several calls in a row (PDL's wait)."""
    from norm_tiles import tiles_norm

    x, r, w, b = _inputs(gen, "cuda", 64, 65542, kind, residual)
    for _ in range(3):
        y = poison_(torch.empty_like(x))
        h = poison_(torch.empty_like(x)) if residual else None
        tiles_norm(x, r, w, b, 1e-5, y, h, 8, 4096, 1024, 8, pdl=pdl)
        torch.cuda.synchronize()
        _check(x, r, w, b, y, h, 1e-5)


def test_bad_tiles():
    from norm_tiles import tiles_norm

    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="must divide bn"):
        tiles_norm(x, None, x[0], None, 1e-5, x.clone(), None, 2, 64, 48, 4)
