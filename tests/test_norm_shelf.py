"""The norm kernel's shared-memory shelf (``NormConfig.shelf``, ``ops/_shelf.py``): pass 2
takes a "loop" program's chunks from shared memory instead of the L2."""

import dataclasses

import pytest
import torch

from onetrip.ops import norm as norm_mod
from onetrip.ops._shelf import SHELF_BYTES, shelf_fits
from onetrip.ops.norm import NormConfig
from onetrip.testing import poison_, strided_like

from conftest import ON_GPU
from test_norm import KINDS, _check, _params

HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] >= 9


def test_shelf_fits():
    """16-bit elements only, whole runs of 8 a thread, the segment (in whole chunks) <= 32 KB."""
    assert shelf_fits(16384, 4096, 16, 2)  # the 256K row in 16: 8 a thread, 32 KB
    assert shelf_fits(5000, 1024, 4, 2)  # 5 chunks, the last ragged: 10 KB
    assert not shelf_fits(16384, 4096, 16, 4)  # float32
    assert not shelf_fits(16385, 4096, 16, 2)  # 5 chunks: 40 KB
    assert not shelf_fits(1023, 128, 4, 2)  # one element a thread
    assert not shelf_fits(2048, 1024, 8, 2)  # four elements a thread
    assert shelf_fits(8192, 4096, 8, 2)  # 16 a thread: two runs of 8
    assert SHELF_BYTES == 32768


def test_shelf_falls_back(device, gen):
    """Where the shelf cannot serve (the interpreter, a chunk of one element a thread), the
    config runs as without it, and right."""
    x = strided_like((5, 1023), torch.bfloat16, device, generator=gen)
    r = strided_like((5, 1023), torch.bfloat16, device, generator=gen)
    w, b = _params("layer", 1023, torch.bfloat16, device, gen)
    y, h = poison_(torch.empty_like(x)), poison_(torch.empty_like(x))
    kernel = norm_mod._launch(x, r, w, b, y, h, 1e-6, False, False,
                              NormConfig("loop", 1, 128, 4, hints=True, stash=True, vec=True, split=3, shelf=True))
    _check("layer", x, r, w, b, 1e-6, y, h)
    if kernel is not None:
        assert "oshelf" not in kernel.asm["ptx"]


@pytest.mark.skipif(not ON_GPU, reason="the shelf is inline PTX: a GPU")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width, chunk, warps, split, hold, cluster", [
    (5000, 1024, 4, 1, 0, False),  # a row a program: 5 chunks, the last ragged
    (5000, 1024, 4, 3, 1, False),  # 3 programs a row (2, 2 and 1 chunks), waiting on each other; first held
    (70001, 1024, 4, 8, 0, True),  # a cluster of 8 segments of 9 chunks, the last ragged
    (262144, 4096, 16, 16, 1, True)])  # the H100's 256K picks' form
def test_shelf_gpu(gen, kind, dtype, width, chunk, warps, split, hold, cluster):
    """The shelf is taken (its buffer is in the kernel) and right: dense rows (the width a
    constant) and strided ones, with a stashed residual and without one, eagerly and
    replayed from a CUDA graph with new inputs; with a residual not stashed (pass 2 needs
    x and r) and in float32 it is not taken, and the result is right still."""
    device = torch.device("cuda")
    cfg = NormConfig("loop", 1, chunk, warps, hints=True, stash=True, vec=True, const_n=True, split=split, hold=hold,
                     drop_y=True, cluster=cluster and HOPPER, shelf=True)
    w, b = _params(kind, width, dtype, device, gen)
    is_rms, gemma = kind != "layer", kind == "gemma"
    for x in (torch.randn(5, width, generator=gen, device=device).to(dtype),
              strided_like((5, width), dtype, device, generator=gen)):
        r = torch.randn(5, width, generator=gen, device=device).to(dtype)
        for res in (r, None):
            y = poison_(torch.empty_like(r))
            h = poison_(torch.empty_like(r)) if res is not None else None
            kernel = norm_mod._launch(x, res, w, b, y, h, 1e-6, is_rms, gemma, cfg)
            assert "oshelf" in kernel.asm["ptx"]
            _check(kind, x, res, w, b, 1e-6, y, h)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        norm_mod._launch(x, r, w, b, y, h, 1e-6, is_rms, gemma, cfg)
    x.copy_(torch.randn(5, width, generator=gen, device=device))
    poison_(y)
    poison_(h)
    graph.replay()
    torch.cuda.synchronize()
    _check(kind, x, r, w, b, 1e-6, y, h)
    # Not taken: a residual without the stash, float32.
    y, h = poison_(torch.empty_like(r)), poison_(torch.empty_like(r))
    kernel = norm_mod._launch(x, r, w, b, y, h, 1e-6, is_rms, gemma, dataclasses.replace(cfg, stash=False))
    assert "oshelf" not in kernel.asm["ptx"]
    _check(kind, x, r, w, b, 1e-6, y, h)
    x32, r32 = x.float(), r.float()
    w32, b32 = w.float(), (b.float() if b is not None else None)
    y, h = poison_(torch.empty_like(x32)), poison_(torch.empty_like(x32))
    kernel = norm_mod._launch(x32, r32, w32, b32, y, h, 1e-6, is_rms, gemma, cfg)
    assert "oshelf" not in kernel.asm["ptx"]
    _check(kind, x32, r32, w32, b32, 1e-6, y, h)
