"""The norm kernel's L2 requests (``NormConfig.l2``, ``ops/_norm_l2.py``): each "loop" program
asks the L2 for its first chunks before the PDL wait (``first_chunks``) or, its pass-1 reads
in, for its segment of the row ``ahead_rows`` on. Hints: the results must be the same as
without them, rows past the end included."""

import dataclasses

import pytest
import torch

from onetrip.ops import norm as norm_mod
from onetrip.ops._norm_l2 import can_ask
from onetrip.ops.norm import CacheHints, L2Requests, LoadOrder, NormConfig, Reuse, Split
from onetrip.testing import poison_

from conftest import ON_GPU
from test_norm import KINDS, _check, _params

HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] >= 9
KEEP_DROP = CacheHints(keep_row=True, drop_y=True)


def _ahead(rows, min_rows=0):
    return L2Requests(ahead_rows=rows, ahead_min_rows=min_rows)


def _no_l2(cfg):
    return dataclasses.replace(cfg, l2=L2Requests())


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
    cfg = NormConfig("loop", 1, 1024, 4, const_n=True, split=Split(4), l2=_ahead(2))
    _run(x, r, w, b, "layer", cfg, taken=HOPPER)  # 2048-column segments: 4 KB of bf16
    assert not can_ask(3000, x)  # not whole requests
    odd = torch.empty(9 * 8192 + 1, dtype=torch.bfloat16, device=device)[1:].view(9, 8192)
    assert not can_ask(4096, x, odd)  # 2 bytes off 16
    _run(x, None, w, b, "layer", NormConfig("loop", 1, 512, 4, const_n=True, split=Split(8), l2=_ahead(2)), taken=False)


@pytest.mark.skipif(not HOPPER, reason="the bulk L2 prefetch is Hopper's inline PTX")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("cfg", [
    NormConfig("loop", 1, 4096, 16, const_n=True, split=Split(4), hints=KEEP_DROP, l2=_ahead(1)),  # waiting
    NormConfig("loop", 1, 4096, 16, const_n=True, split=Split(4, cluster=True), hints=CacheHints(keep_row=True),
               reuse=Reuse(held_chunks=1), l2=_ahead(3)),
    NormConfig("loop", 1, 4096, 8, const_n=True, affine_fma=True, split=Split(4, cluster=True),
               reuse=Reuse(store_h_early=True, smem_segment=True), l2=_ahead(32))],
    ids=["split", "cluster-held", "cluster-smem-h-early"])
def test_ahead_gpu(gen, kind, residual, cfg):
    """Rows of 64K in 4 segments of 32 KB (8 requests a program), 9 rows so that the last
    rows ask for rows past the end (nothing is issued for them), 1-32 rows ahead; eagerly
    and replayed from a CUDA graph with new inputs, level with the same config without it."""
    device = torch.device("cuda")
    width = 65536
    x = torch.randn(9, width, generator=gen, device=device).to(torch.bfloat16)
    r = torch.randn(9, width, generator=gen, device=device).to(torch.bfloat16) if residual else None
    w, b = _params(kind, width, torch.bfloat16, device, gen)
    y, h = _run(x, r, w, b, kind, cfg, taken=True)
    y0, h0 = _run(x, r, w, b, kind, _no_l2(cfg), taken=False)
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
    """``ahead_min_rows``: the read-ahead is compiled in from that many rows on and left out below
    them (a rule by the shape, so a captured graph keeps the launch it was captured with);
    the result is the same either way."""
    device = torch.device("cuda")
    cfg = NormConfig("loop", 1, 4096, 8, const_n=True, affine_fma=True, split=Split(4, cluster=True),
                     reuse=Reuse(smem_segment=True), l2=_ahead(4, 9))
    w, b = _params("layer", 65536, torch.bfloat16, device, gen)
    for rows in (8, 9, 17):
        x = torch.randn(rows, 65536, generator=gen, device=device).to(torch.bfloat16)
        _run(x, None, w, b, "layer", cfg, taken=rows >= 9)


@pytest.mark.parametrize("field, value", [("ahead_rows", -1), ("ahead_min_rows", -3), ("first_chunks", -2)])
def test_l2_fields_checked(field, value):
    """A negative request or row threshold is refused when the config is made, naming the field."""
    with pytest.raises(ValueError, match=f"L2Requests.{field}={value} must be >= 0"):
        L2Requests(**{field: value})


FIRST_CFGS = [
    NormConfig("loop", 1, 4096, 8, const_n=True, maxnreg=48, affine_fma=True, split=Split(4, cluster=True),
               reuse=Reuse(smem_segment=True), l2=L2Requests(first_chunks=4)),  # shared memory in a cluster
    NormConfig("loop", 1, 8192, 16, const_n=True, split=Split(4, cluster=True),
               reuse=Reuse(held_chunks=2, store_h_early=True),
               order=LoadOrder(early_weight_chunks=2, next_before_store=1),
               l2=L2Requests(first_chunks=1)),  # a cluster holding chunks (add_rms_norm's)
    NormConfig("loop", 1, 4096, 8, const_n=True, hints=CacheHints(keep_row=True),
               l2=L2Requests(first_chunks=2))]  # one program a row


def _first_taken(kernel) -> bool:
    """Whether ``kernel`` asks for its segment before ``griddepcontrol.wait`` (and asks at all)."""
    ptx = kernel.asm["ptx"]
    ask, wait = ptx.find("cp.async.bulk.prefetch.L2"), ptx.find("griddepcontrol.wait")
    return ask >= 0 and 0 <= wait and ask < wait


@pytest.mark.skipif(not HOPPER, reason="the bulk L2 prefetch and PDL are Hopper's")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("cfg", FIRST_CFGS, ids=["cluster-smem", "cluster-held", "row"])
def test_first_gpu(gen, kind, residual, cfg, monkeypatch):
    """``first_chunks``: each program asks the L2 for its first chunks (x, and r) before it waits
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
    y1, h1 = _run(x, r, w, b, kind, _no_l2(cfg), taken=False)
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
    _run(x, None, w, b, "rms", dataclasses.replace(FIRST_CFGS[1], split=Split(4)), taken=False)


def test_first_falls_back(device, gen):
    """Under the interpreter or on the CPU ``first_chunks`` asks for nothing, and the result is right."""
    x = torch.randn(5, 8192, generator=gen, device=device).to(torch.bfloat16)
    w, b = _params("layer", 8192, torch.bfloat16, device, gen)
    _run(x, None, w, b, "layer", NormConfig("loop", 1, 1024, 4, const_n=True, split=Split(4, cluster=True),
                                            l2=L2Requests(first_chunks=8)), taken=HOPPER)
