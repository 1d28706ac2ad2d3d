"""The decode step's bookkeeping in one launch (ops/advance.py) against the op-by-op
reference: every tensor it mutates, bit for bit, from poisoned and random states."""

import pytest
import torch

from conftest import DEVICE, ON_GPU
from onetrip.graphs import capture
from onetrip.ops.advance import advance_greedy, advance_ref, advance_tokens


def _state(gen, B, max_len, eos_ids, lens=True):
    dev = DEVICE
    step = int(torch.randint(0, max_len, (1,), generator=gen, device=dev))
    out = torch.full((B, max_len), -7, dtype=torch.int64, device=dev)  # poison: only column step changes
    return dict(
        done=torch.rand(B, generator=gen, device=dev) < 0.3,
        eos=torch.tensor(eos_ids, dtype=torch.int64, device=dev),
        out=out,
        tok=torch.full((B, 1), -9, dtype=torch.int64, device=dev),
        step=torch.tensor(step, dtype=torch.int64, device=dev),
        lens=torch.randint(0, 1000, (B,), generator=gen, device=dev).to(torch.int32) if lens else None,
    )


def _clone(state):
    return {k: (v.clone() if v is not None else None) for k, v in state.items()}


def _assert_same(got, want):
    for k in want:
        if want[k] is not None:
            assert torch.equal(got[k], want[k]), f"{k}: {got[k]} vs {want[k]}"


@pytest.mark.parametrize("B", [1, 3, 17, 300])
@pytest.mark.parametrize("eos_ids", [[-1], [5], [2, 7, 11]])
def test_tokens(gen, B, eos_ids):
    state = _state(gen, B, 23, eos_ids, lens=B != 3)
    nxt = torch.randint(0, 13, (B,), generator=gen, device=DEVICE)  # small ids: EOS hits happen
    want, got = _clone(state), _clone(state)
    advance_ref(nxt.clone(), **want)
    advance_tokens(nxt, **got)
    _assert_same(got, want)


@pytest.mark.parametrize("B", [1, 5, 40])
@pytest.mark.parametrize("V", [1, 17, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy(gen, B, V, dtype):
    """The argmax's final stage folded in; bf16 logits of few distinct values make ties
    (the first index wins, as torch.argmax)."""
    state = _state(gen, B, 9, [3, V - 1])
    logits = (torch.randn(B, V + 3, generator=gen, device=DEVICE) * 4).round().to(dtype)[:, 2:V + 2]  # offset view
    logits[logits == 0] = 0.5  # no -0.0 (ranked below +0.0 here, tied in torch)
    want, got = _clone(state), _clone(state)
    advance_ref(torch.argmax(logits, dim=-1), **want)
    advance_greedy(logits, **got)
    _assert_same(got, want)


def test_step_past_out_writes_nothing_there(gen):
    state = _state(gen, 4, 6, [1])
    state["step"].fill_(6)
    before = state["out"].clone()
    advance_tokens(torch.arange(4, device=DEVICE), **state)
    assert torch.equal(state["out"], before) and int(state["step"]) == 7


@pytest.mark.parametrize("change,err,words", [
    (lambda s, n: s.update(done=s["done"].int()), ValueError, ["done", "bool"]),
    (lambda s, n: s.update(lens=s["lens"].long()), ValueError, ["lens", "int32"]),
    (lambda s, n: s.update(tok=s["tok"][:, 0]), ValueError, ["tok", "(4, 1)"]),
    (lambda s, n: s.update(eos=s["eos"][:0]), ValueError, ["eos", "n >= 1"]),
    (lambda s, n: s.update(out=s["out"][:2]), ValueError, ["out", "(4, max_len)"]),
])
def test_bad_input(gen, change, err, words):
    state = _state(gen, 4, 6, [1])
    nxt = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    change(state, nxt)
    with pytest.raises(err) as info:
        advance_tokens(nxt, **state)
    for w in words:
        assert w in str(info.value)


def test_bad_picks(gen):
    state = _state(gen, 4, 6, [1])
    with pytest.raises(ValueError, match=r"nxt must be a \(4,\) int64"):
        advance_tokens(torch.zeros(4, dtype=torch.int32, device=DEVICE), **state)
    with pytest.raises(ValueError, match=r"logits must be a \(4, vocab\) float"):
        advance_greedy(torch.zeros(3, 10, device=DEVICE), **state)


def test_fullgraph_compile(gen):
    state = _state(gen, 3, 8, [2])
    logits = torch.randn(3, 100, generator=gen, device=DEVICE)
    want, got = _clone(state), _clone(state)
    advance_greedy(logits, **want)
    torch._dynamo.reset()
    fn = torch.compile(lambda s: advance_greedy(logits, **s), fullgraph=True,
                       backend="inductor" if ON_GPU else "aot_eager")
    fn(got)
    _assert_same(got, want)


@pytest.mark.gpu
def test_cuda_graph_replay(gen):
    """Captured once, replayed three times: the counter and the columns move each replay."""
    state = _state(gen, 2, 8, [5])
    state["step"].zero_()
    state["done"].zero_()
    logits = torch.randn(2, 300, device="cuda")
    want = _clone(state)
    for _ in range(3):
        advance_ref(torch.argmax(logits, -1), **want)
    start = _clone(state)
    graph, _ = capture(lambda: advance_greedy(logits, **state))  # its warm-up call moves state
    for k, v in start.items():
        if v is not None:
            state[k].copy_(v)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    _assert_same(state, want)
