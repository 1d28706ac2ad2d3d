"""The norm kernel's read-ahead into the L2 (``NormConfig.pf``, ``ops/_l2_ahead.py``): each
"loop" program, its pass-1 reads in, asks the L2 for its segment of the row ``pf`` rows on.
A hint: the results must be the same as without it, rows past the end included."""

import dataclasses

import pytest
import torch

from onetrip.ops import norm as norm_mod
from onetrip.ops._l2_ahead import ahead_ok
from onetrip.ops.norm import NormConfig
from onetrip.testing import poison_

from conftest import ON_GPU
from test_norm import KINDS, _check, _params

HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] >= 9


def _run(x, r, w, b, kind, cfg, taken):
    """Launch ``cfg`` on poisoned outputs; check whether the requests were compiled in, and the result."""
    y = poison_(torch.empty_like(x))
    h = poison_(torch.empty_like(x)) if r is not None else None
    kernel = norm_mod._launch(x, r, w, b, y, h, 1e-6, kind != "layer", kind == "gemma", cfg)
    if kernel is not None:
        assert ("cp.async.bulk.prefetch.L2" in kernel.asm["ptx"]) == taken
    _check(kind, x, r, w, b, 1e-6, y, h)
    return y, h


def test_ahead_falls_back(device, gen):
    """Where no request can be made (the interpreter or the CPU, a segment not of whole 4 KB
    requests, a tensor off 16 bytes), the config runs as without it, and right."""
    x = torch.randn(9, 8192, generator=gen, device=device).to(torch.bfloat16)
    r = torch.randn(9, 8192, generator=gen, device=device).to(torch.bfloat16)
    w, b = _params("layer", 8192, torch.bfloat16, device, gen)
    cfg = NormConfig("loop", 1, 1024, 4, vec=True, const_n=True, split=4, pf=2)
    _run(x, r, w, b, "layer", cfg, taken=HOPPER)  # 2048-column segments: 4 KB of bf16
    assert not ahead_ok(3000, x)  # not whole requests
    odd = torch.empty(9 * 8192 + 1, dtype=torch.bfloat16, device=device)[1:].view(9, 8192)
    assert not ahead_ok(4096, x, odd)  # 2 bytes off 16
    _run(x, None, w, b, "layer", NormConfig("loop", 1, 512, 4, vec=True, const_n=True, split=8, pf=2), taken=False)


@pytest.mark.skipif(not HOPPER, reason="the bulk L2 prefetch is Hopper's inline PTX")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("cfg", [
    NormConfig("loop", 1, 4096, 16, hints=True, vec=True, const_n=True, split=4, drop_y=True, pf=1),  # waiting
    NormConfig("loop", 1, 4096, 16, hints=True, vec=True, const_n=True, split=4, hold=1, cluster=True, pf=3),
    NormConfig("loop", 1, 4096, 8, vec=True, const_n=True, split=4, stash=True, shelf=True, fold=True,
               cluster=True, pf=32)], ids=["split", "cluster-hold", "cluster-shelf-stash"])
def test_ahead_gpu(gen, kind, residual, cfg):
    """Rows of 64K in 4 segments of 32 KB (8 requests a program), 9 rows so that the last
    rows ask for rows past the end (nothing is issued for them), pf of 1-32 rows; eagerly
    and replayed from a CUDA graph with new inputs, level with the same config without it."""
    device = torch.device("cuda")
    width = 65536
    x = torch.randn(9, width, generator=gen, device=device).to(torch.bfloat16)
    r = torch.randn(9, width, generator=gen, device=device).to(torch.bfloat16) if residual else None
    w, b = _params(kind, width, torch.bfloat16, device, gen)
    y, h = _run(x, r, w, b, kind, cfg, taken=True)
    y0, h0 = _run(x, r, w, b, kind, dataclasses.replace(cfg, pf=0), taken=False)
    assert torch.equal(y, y0) and (h is None or torch.equal(h, h0))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        norm_mod._launch(x, r, w, b, y, h, 1e-6, kind != "layer", kind == "gemma", cfg)
    x.copy_(torch.randn(9, width, generator=gen, device=device))
    poison_(y)
    if h is not None:
        poison_(h)
    graph.replay()
    torch.cuda.synchronize()
    _check(kind, x, r, w, b, 1e-6, y, h)


@pytest.mark.skipif(not HOPPER, reason="the bulk L2 prefetch is Hopper's inline PTX")
def test_ahead_from_rows(gen):
    """``pf_rows``: the read-ahead is compiled in from that many rows on and left out below
    them (a rule by the shape, so a captured graph keeps the launch it was captured with);
    the result is the same either way."""
    device = torch.device("cuda")
    cfg = NormConfig("loop", 1, 4096, 8, vec=True, const_n=True, split=4, shelf=True, fold=True, cluster=True,
                     pf=4, pf_rows=9)
    w, b = _params("layer", 65536, torch.bfloat16, device, gen)
    for rows in (8, 9, 17):
        x = torch.randn(rows, 65536, generator=gen, device=device).to(torch.bfloat16)
        _run(x, None, w, b, "layer", cfg, taken=rows >= 9)


@pytest.mark.parametrize("field, value", [("pf", -1), ("pf_rows", -3), ("wb_first", -2)])
def test_ahead_fields_checked(field, value):
    """A negative read-ahead or row threshold is refused when the config is made, naming the field."""
    with pytest.raises(ValueError, match=field):
        NormConfig("loop", 1, 4096, 8, **{field: value})


FIRST_CFGS = [
    NormConfig("loop", 1, 4096, 8, vec=True, const_n=True, split=4, shelf=True, fold=True, cluster=True, maxnreg=48,
               l2_first=4),  # the shelf in a cluster (rms_norm's and layer_norm's 256K picks)
    NormConfig("loop", 1, 8192, 16, vec=True, const_n=True, split=4, stash=True, hold=2, wb_pre=2, pipe=1,
               cluster=True, l2_first=1),  # a cluster holding chunks (add_rms_norm's)
    NormConfig("loop", 1, 4096, 8, hints=True, vec=True, const_n=True, l2_first=2)]  # one program a row


def _first_taken(kernel) -> bool:
    """Whether ``kernel`` asks for its segment before ``griddepcontrol.wait`` (and asks at all)."""
    ptx = kernel.asm["ptx"]
    ask, wait = ptx.find("cp.async.bulk.prefetch.L2"), ptx.find("griddepcontrol.wait")
    return ask >= 0 and 0 <= wait and ask < wait


@pytest.mark.skipif(not HOPPER, reason="the bulk L2 prefetch and PDL are Hopper's")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("cfg", FIRST_CFGS, ids=["cluster-shelf", "cluster-hold", "row"])
def test_first_gpu(gen, kind, residual, cfg, monkeypatch):
    """``l2_first``: each program asks the L2 for its first chunks (x, and r) before it waits
    for the previous kernel, here the same launch writing that x (9 rows of 64K): the
    outputs are bitwise those without it, eagerly and replayed from a CUDA graph with new
    inputs."""
    monkeypatch.setenv("ONETRIP_PDL", "1")
    device = torch.device("cuda")
    width = 65536
    rms, gemma = kind != "layer", kind == "gemma"
    x0 = torch.randn(9, width, generator=gen, device=device).to(torch.bfloat16)
    r = torch.randn(9, width, generator=gen, device=device).to(torch.bfloat16) if residual else None
    w, b = _params(kind, width, torch.bfloat16, device, gen)
    x, y = poison_(torch.empty_like(x0)), poison_(torch.empty_like(x0))
    h0, h = (poison_(torch.empty_like(x0)), poison_(torch.empty_like(x0))) if residual else (None, None)

    def chain():  # the first call writes x, the second (PDL) asks for x before it waits
        norm_mod._launch(x0, r, w, b, x, h0, 1e-6, rms, gemma, cfg)
        return norm_mod._launch(x, r, w, b, y, h, 1e-6, rms, gemma, cfg)

    assert _first_taken(chain())
    torch.cuda.synchronize()
    _check(kind, x, r, w, b, 1e-6, y, h)
    y1, h1 = _run(x, r, w, b, kind, dataclasses.replace(cfg, l2_first=0), taken=False)
    assert torch.equal(y, y1) and (h is None or torch.equal(h, h1))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    x0.copy_(torch.randn(9, width, generator=gen, device=device))
    for t in (x, y, h0, h):
        if t is not None:
            poison_(t)
    graph.replay()
    torch.cuda.synchronize()
    _check(kind, x0, r, w, b, 1e-6, x, h0)
    _check(kind, x, r, w, b, 1e-6, y, h)


@pytest.mark.skipif(not HOPPER, reason="the bulk L2 prefetch and PDL are Hopper's")
def test_first_needs_pdl(gen, monkeypatch):
    """Without PDL (``ONETRIP_PDL=0``) a program's own loads follow at once: nothing is asked
    first. A split row that takes tickets (no cluster) runs rows in start order, so it asks
    for nothing either."""
    device = torch.device("cuda")
    x = torch.randn(9, 65536, generator=gen, device=device).to(torch.bfloat16)
    w, b = _params("rms", 65536, torch.bfloat16, device, gen)
    monkeypatch.setenv("ONETRIP_PDL", "0")
    _run(x, None, w, b, "rms", FIRST_CFGS[0], taken=False)
    monkeypatch.setenv("ONETRIP_PDL", "1")
    _run(x, None, w, b, "rms", dataclasses.replace(FIRST_CFGS[1], cluster=False), taken=False)


def test_first_falls_back(device, gen):
    """Under the interpreter or on the CPU ``l2_first`` and ``wb_first`` ask for nothing, and
    the result is right."""
    x = torch.randn(5, 8192, generator=gen, device=device).to(torch.bfloat16)
    w, b = _params("layer", 8192, torch.bfloat16, device, gen)
    _run(x, None, w, b, "layer", NormConfig("loop", 1, 1024, 4, vec=True, const_n=True, split=4, cluster=True,
                                            l2_first=8), taken=HOPPER)
    _run(x, None, w, b, "layer", NormConfig("loop", 1, 1024, 4, vec=True, const_n=True, split=4, cluster=True,
                                            wb_first=2), taken=HOPPER)


@pytest.mark.skipif(not HOPPER, reason="the bulk L2 prefetch and PDL are Hopper's")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("cfg", FIRST_CFGS, ids=["cluster-shelf", "cluster-hold", "row"])
def test_wb_first_gpu(gen, kind, residual, cfg, monkeypatch):
    """``wb_first``: the first rows' programs ask the L2 for their segment's weight (and bias)
    before they wait for the previous kernel, here the one writing that weight (a norm of
    one row into it; 9 rows of 64K, the first 2 asking): the outputs are bitwise those
    without it, eagerly and replayed from a CUDA graph with a new weight. Without a weight
    nothing is asked."""
    monkeypatch.setenv("ONETRIP_PDL", "1")
    device = torch.device("cuda")
    width = 65536
    rms, gemma = kind != "layer", kind == "gemma"
    cfg = dataclasses.replace(cfg, l2_first=0, wb_first=2)
    x = torch.randn(9, width, generator=gen, device=device).to(torch.bfloat16)
    r = torch.randn(9, width, generator=gen, device=device).to(torch.bfloat16) if residual else None
    w0, b = _params(kind, width, torch.bfloat16, device, gen)
    src = torch.randn(1, width, generator=gen, device=device).to(torch.bfloat16)
    w = poison_(torch.empty(1, width, dtype=torch.bfloat16, device=device))
    y, h = poison_(torch.empty_like(x)), poison_(torch.empty_like(x)) if residual else None

    def chain():  # the first call writes the weight, the second (PDL) asks for it before it waits
        norm_mod._launch(src, None, w0, None, w, None, 1e-6, True, False, None)
        return norm_mod._launch(x, r, w[0], b, y, h, 1e-6, rms, gemma, cfg)

    assert _first_taken(chain())
    torch.cuda.synchronize()
    _check(kind, x, r, w[0], b, 1e-6, y, h)
    y1, h1 = _run(x, r, w[0], b, kind, dataclasses.replace(cfg, wb_first=0), taken=False)
    assert torch.equal(y, y1) and (h is None or torch.equal(h, h1))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    src.copy_(torch.randn(1, width, generator=gen, device=device))
    for t in (w, y, h):
        if t is not None:
            poison_(t)
    graph.replay()
    torch.cuda.synchronize()
    _check(kind, x, r, w[0], b, 1e-6, y, h)
    if kind == "layer":  # no weight: nothing to ask for
        _run(x, r, None, b, kind, cfg, taken=False)
