"""ops.l2_prefetch: a hint that changes nothing. Its arguments are checked everywhere; on a
GPU it runs (both modes, odd sizes, an unaligned view), on a side stream inside a CUDA
graph, and the engine's batch-1 step gives the same tokens with it beside the attention."""

import pytest
import torch

from onetrip.engine import Engine
from onetrip.models import fused
from onetrip.ops.l2_prefetch import l2_prefetch, l2_prefetch_ref

from conftest import DEVICE, ON_GPU
from test_engine import _model, _prompts


def test_bad_input():
    w = torch.zeros(8, 8)
    with pytest.raises(TypeError, match="t must be a torch.Tensor"):
        l2_prefetch([1.0, 2.0])
    with pytest.raises(ValueError, match="t must be contiguous"):
        l2_prefetch(w.t())
    with pytest.raises(ValueError, match="nbytes must be an int >= 0"):
        l2_prefetch(w, -1)
    with pytest.raises(ValueError, match="nbytes must be an int >= 0"):
        l2_prefetch(w, 1.5)
    with pytest.raises(ValueError, match="mode must be one of"):
        l2_prefetch(w, mode="all")


@pytest.mark.parametrize("mode", ["bulk", "line"])
@pytest.mark.parametrize("numel, nbytes", [(1, None), (17, 3), (5000, None), (1 << 20, 1 << 21), (1 << 20, 4097)])
def test_changes_nothing(mode, numel, nbytes, gen):
    t = torch.randn(numel, device=DEVICE, generator=gen).to(torch.bfloat16)
    before = t.clone()
    l2_prefetch(t, nbytes, mode=mode)
    l2_prefetch(t[1:], nbytes, mode=mode)  # a view 2 bytes past an aligned start
    assert l2_prefetch_ref(t, nbytes, mode=mode) is None
    if ON_GPU:
        torch.cuda.synchronize()
    assert torch.equal(t, before)


def test_compiles_without_graph_break():
    @torch.compile(fullgraph=True)
    def f(w, x):
        l2_prefetch(w, 4096)
        return x * 2

    x = torch.randn(4, device=DEVICE)
    torch.testing.assert_close(f(torch.zeros(4096, device=DEVICE), x), x * 2)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
def test_side_stream_in_a_graph(gen):
    w = torch.randn(1 << 22, device=DEVICE, generator=gen).to(torch.bfloat16)
    x = torch.randn(64, device=DEVICE, generator=gen)
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            l2_prefetch(w, 1 << 21)
            l2_prefetch(w, mode="line")
        y = x * 3
        main.wait_stream(side)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x * 3)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("setting, join", [({"o": -1}, "o"), ({"o": 1 << 20, "gate_up": 1 << 20}, "layer")])
def test_engine_prefetch_gives_identical_tokens(monkeypatch, setting, join):
    """The batch-1 step captured with prefetches beside the attention kernel
    (fused.L2_PREFETCH): they are launched (counted) and the greedy tokens are those
    without them."""
    model = _model("llama", "fused", seed=5, dtype=torch.bfloat16)
    prompt = _prompts(torch.Generator(device=DEVICE).manual_seed(1), [300])
    calls = []
    monkeypatch.setattr(fused, "l2_prefetch", lambda *a, **k: (calls.append(1), l2_prefetch(*a, **k)))
    monkeypatch.setattr(fused, "L2_PREFETCH_JOIN", join)
    runs = []
    for value in ({}, setting):
        monkeypatch.setattr(fused, "L2_PREFETCH", value)
        runs.append(Engine(model, max_seq=512, max_batch=1, graphs=True).generate(prompt, 24).tokens)
    assert calls, "no prefetch was captured"
    assert runs[0] == runs[1]
