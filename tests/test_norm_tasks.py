"""Mode "tasks" of the norm kernel (``ops/_norm_tasks.py``): persistent programs taking
(row, chunk) tasks by ticket, a row's pass 2 ``lag`` rows behind its pass 1. Under the
interpreter the first program takes every task; on a GPU every program races for them.
Either way each call must be right, and leave its counters at zero for the next."""

import pytest
import torch

from onetrip.ops import _norm_tasks
from onetrip.ops import norm as norm_mod
from onetrip.ops.norm import NormConfig
from onetrip.testing import poison_, strided_like

from conftest import ON_GPU
from test_norm import KINDS, _check, _params


def _call(kind, x, r, w, b, cfg):
    y = poison_(torch.empty_like(x))
    h = poison_(torch.empty_like(x)) if r is not None else None
    norm_mod._launch(x, r, w, b, y, h, 1e-6, kind != "layer", kind == "gemma", cfg)
    return y, h


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows, width, block_n, lag, grab", [
    (1, 1, 16, 1, 1), (3, 17, 16, 1, 2), (5, 111, 32, 2, 1), (2, 1023, 256, 9, 2), (7, 5000, 1024, 3, 1)])
def test_tasks_match_reference(device, gen, kind, residual, dtype, rows, width, block_n, lag, grab):
    """Odd widths cut into chunks with a ragged last one, lags under and over the row count,
    one or two tickets an atomic, strided rows; two calls in a row, both right."""
    x = strided_like((rows, width), dtype, device, generator=gen)
    r = strided_like((rows, width), dtype, device, generator=gen) + (3.0 if kind == "layer" else 0.0) \
        if residual else None
    w, b = _params(kind, width, dtype, device, gen)
    cfg = NormConfig("tasks", 1, block_n, 4, per_sm=2, lag=lag, unroll=grab)
    for _ in range(2):
        y, h = _call(kind, x, r, w, b, cfg)
        _check(kind, x, r, w, b, 1e-6, y, h)
    if x.is_cuda:
        torch.cuda.synchronize()
    assert not _norm_tasks.counters(x.device, rows).any()


@pytest.mark.parametrize("field, value", [("per_sm", 0), ("lag", 0)])
def test_tasks_fields_checked(field, value):
    """No programs, or a lag of 0 (a row's pass 2 would take tickets before its pass 1's
    and could wait on a task no program has yet), is refused naming the field."""
    with pytest.raises(ValueError, match=field):
        NormConfig("tasks", 1, 1024, 4, **{field: value})


@pytest.mark.skipif(not ON_GPU, reason="programs racing for tickets need a GPU")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("cfg", [
    NormConfig("tasks", 1, 4096, 8, hints=True, per_sm=4, lag=8),
    NormConfig("tasks", 1, 8192, 16, hints=True, per_sm=2, lag=2, unroll=2),
    NormConfig("tasks", 1, 2048, 4, per_sm=16, lag=1)], ids=["4096x8", "8192x16-grab2", "2048x4-lag1"])
def test_tasks_gpu(gen, kind, residual, cfg):
    """64 rows of 64K (more programs than tasks at 2048 x 16 an SM), eagerly and from a
    CUDA graph replayed three times on new inputs, bf16; the counters back at zero after."""
    device = torch.device("cuda")
    rows, width = 64, 65536
    x = torch.randn(rows, width, generator=gen, device=device).to(torch.bfloat16)
    r = torch.randn(rows, width, generator=gen, device=device).to(torch.bfloat16) if residual else None
    w, b = _params(kind, width, torch.bfloat16, device, gen)
    y, h = _call(kind, x, r, w, b, cfg)
    _check(kind, x, r, w, b, 1e-6, y, h)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        norm_mod._launch(x, r, w, b, y, h, 1e-6, kind != "layer", kind == "gemma", cfg)
    for _ in range(3):
        x.copy_(torch.randn(rows, width, generator=gen, device=device))
        poison_(y)
        if h is not None:
            poison_(h)
        graph.replay()
        torch.cuda.synchronize()
        _check(kind, x, r, w, b, 1e-6, y, h)
    assert not _norm_tasks.counters(device, rows).any()
