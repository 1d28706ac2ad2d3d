"""onetrip.engine.sampling on the CPU: greedy paths, the top-k / top-p filters, determinism
of the counter-based noise, sampled frequencies against theory, and tracing without graph
breaks. Every draw comes from fixed seeds, so every test here is deterministic."""

import math

import pytest
import torch

from onetrip.engine.sampling import SamplingParams, _mix32, _mul32, hash_uniform, sample, sample_ref


def step_tensor(value: int) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.int64)


def noise_for(params: SamplingParams, step: int, batch: int, vocab: int) -> torch.Tensor:
    """The (batch, vocab) uniforms ``sample`` draws from, indexed by vocab id."""
    return hash_uniform(params.seed, step_tensor(step), torch.arange(batch)[:, None], torch.arange(vocab)[None])


# ---- params -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -0.1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"), ({"top_k": -1}, "top_k"), ({"top_k": 2.5}, "top_k"),
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_p": -0.2}, "top_p"), ({"seed": 1.0}, "seed"),
])
def test_params_validation(kwargs, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field} must .* got"):
        SamplingParams(**kwargs)


def test_params_defaults_are_greedy():
    assert SamplingParams().greedy and SamplingParams(temperature=2.0, top_k=1).greedy
    assert not SamplingParams(temperature=0.5).greedy


def test_argument_errors():
    logits = torch.randn(2, 10)
    with pytest.raises(ValueError, match="0-dim integer tensor"):
        sample(logits, SamplingParams(1.0), 3)
    with pytest.raises(ValueError, match="0-dim integer tensor"):
        sample(logits, SamplingParams(1.0), torch.tensor([3]))
    with pytest.raises(ValueError, match=r"\(batch, vocab\) float tensor"):
        sample(logits[0], SamplingParams(1.0), step_tensor(0))
    with pytest.raises(ValueError, match="device"):
        sample(logits, SamplingParams(1.0), torch.tensor(0, device="meta"))


# ---- greedy and filters -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_is_argmax(dtype):
    logits = torch.randn(17, 5000, generator=torch.Generator().manual_seed(0)).to(dtype)
    expected = torch.argmax(logits.float(), dim=-1)
    for params in (SamplingParams(), SamplingParams(temperature=5.0, top_k=1, seed=7),
                   SamplingParams(temperature=0.0, top_k=50, top_p=0.5)):
        tokens = sample(logits, params, step_tensor(3))
        assert tokens.dtype == torch.int64 and tokens.shape == (17,)
        assert torch.equal(tokens, expected), params


def test_top_k_stays_in_top_k_set():
    logits = 3 * torch.randn(64, 1000, generator=torch.Generator().manual_seed(1))
    allowed = torch.topk(logits, 20, dim=-1).indices                            # (64, 20)
    params = SamplingParams(temperature=2.0, top_k=20, seed=5)
    seen = set()
    for step in range(10):
        tokens = sample(logits, params, step_tensor(step))
        assert (allowed == tokens[:, None]).any(dim=-1).all()
        seen.update(tokens.tolist())
    assert len(seen) > 100  # not collapsed onto the argmax


def test_top_p_stays_in_nucleus():
    # Each row: probabilities 0.5, 0.3, 0.1, then 0.1 spread over 97 tokens, shuffled.
    # top_p=0.85 keeps exactly {0.5, 0.3, 0.1} (mass before them: 0, 0.5, 0.8 < 0.85).
    gen = torch.Generator().manual_seed(2)
    probs = torch.cat([torch.tensor([0.5, 0.3, 0.1]), torch.full((97,), 0.1 / 97)])
    order = torch.stack([torch.randperm(100, generator=gen) for _ in range(32)])   # (32, 100)
    logits = torch.log(probs)[order]
    nucleus = order.argsort(dim=-1)[:, :3]           # where tokens 0, 1, 2 of `probs` landed
    params = SamplingParams(temperature=1.0, top_p=0.85, seed=11)
    for step in range(20):
        tokens = sample(logits, params, step_tensor(step))
        assert (nucleus == tokens[:, None]).any(dim=-1).all()


def test_top_p_keeps_at_least_one_token():
    logits = torch.tensor([[0.0, 0.0, 0.0, 10.0]] * 8)
    tokens = sample(logits, SamplingParams(temperature=1.0, top_p=1e-9, seed=3), step_tensor(0))
    assert torch.equal(tokens, torch.full((8,), 3))


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=0.7, top_k=50, seed=2),
    SamplingParams(temperature=1.3, top_p=0.8, seed=3), SamplingParams(temperature=0.9, top_k=200, top_p=0.6, seed=4),
    SamplingParams(temperature=1.0, top_k=5000, seed=5),  # k above the vocab: clamped
], ids=["plain", "top_k", "top_p", "top_k+top_p", "k>vocab"])
def test_matches_reference(params):
    batch, vocab = 33, 1023
    logits = 2 * torch.randn(batch, vocab, generator=torch.Generator().manual_seed(4))
    for step in (0, 1, 2**33 + 5):
        expected = sample_ref(logits, params, noise_for(params, step, batch, vocab))
        assert torch.equal(sample(logits, params, step_tensor(step)), expected)


def test_noise_follows_the_vocab_id():
    # Filtering only removes candidates: rows whose unfiltered draw survives the filter keep it.
    logits = torch.randn(256, 300, generator=torch.Generator().manual_seed(5))
    free = sample(logits, SamplingParams(temperature=1.0, seed=9), step_tensor(4))
    limited = sample(logits, SamplingParams(temperature=1.0, top_k=40, seed=9), step_tensor(4))
    survives = (torch.topk(logits, 40, dim=-1).indices == free[:, None]).any(dim=-1)
    assert survives.sum() > 100
    assert torch.equal(limited[survives], free[survives])


# ---- determinism ------------------------------------------------------------------------------

def test_deterministic_per_seed_step_row():
    logits = torch.zeros(256, 1000)                          # uniform: every token equally likely
    params = SamplingParams(temperature=1.0, seed=42)
    first = sample(logits, params, step_tensor(0))
    assert torch.equal(first, sample(logits, params, step_tensor(0)))
    assert torch.equal(first, sample(logits.bfloat16(), params, step_tensor(0)))
    # The engine bumps the step in place between replays.
    step = step_tensor(0)
    step.add_(1)
    second = sample(logits, params, step)
    assert torch.equal(second, sample(logits, params, step_tensor(1)))
    # Collisions of two uniform draws over 1000 tokens: 1/1000 per row.
    assert (first != second).sum() >= 250
    assert (first != sample(logits, SamplingParams(temperature=1.0, seed=43), step_tensor(0))).sum() >= 250
    assert (first != sample(logits, SamplingParams(temperature=1.0, seed=42 + 2**32), step_tensor(0))).sum() >= 250
    assert len(set(first.tolist())) > 200                   # identical rows draw independently
    assert torch.equal(first[:10], sample(logits[:10], params, step_tensor(0)))  # a row's draw ignores the batch


# ---- frequencies ------------------------------------------------------------------------------

PROBS = torch.tensor([0.35, 0.25, 0.2, 0.1, 0.07, 0.03])


def _renorm(p: torch.Tensor, keep: int) -> torch.Tensor:
    out = torch.zeros_like(p)
    out[:keep] = p[:keep] / p[:keep].sum()
    return out


@pytest.mark.parametrize("params, expected", [
    (SamplingParams(temperature=1.0, seed=1), PROBS),
    (SamplingParams(temperature=2.0, seed=2), PROBS.sqrt() / PROBS.sqrt().sum()),
    (SamplingParams(temperature=1.0, top_k=3, seed=3), _renorm(PROBS, 3)),
    # mass before each token: 0, .35, .60, .80 -> the nucleus of 0.75 is 3 tokens
    (SamplingParams(temperature=1.0, top_p=0.75, seed=4), _renorm(PROBS, 3)),
    # top-p after top-k renormalizes: masses before are 0, .389, .667 -> 2 tokens
    # (on the unfiltered probabilities it would be 3, since .60 < .62)
    (SamplingParams(temperature=1.0, top_k=4, top_p=0.62, seed=5), _renorm(PROBS, 2)),
    # top-p after the temperature: p**2 renormalized is .509, .260, .166, ... -> 2 tokens
    (SamplingParams(temperature=0.5, top_p=0.7, seed=6), _renorm(PROBS**2 / (PROBS**2).sum(), 2)),
], ids=["t1", "t2", "top_k", "top_p", "top_k_then_top_p", "temperature_then_top_p"])
def test_frequencies(params, expected):
    # N = 4096 rows x 16 steps draws; each frequency has standard deviation sqrt(p(1-p)/N)
    # <= 0.002. A bound of 5 standard deviations (plus float32 slack) would fail a truly
    # random generator with probability ~6e-7 per token; with fixed seeds it is deterministic.
    batch, steps = 4096, 16
    order = torch.tensor([4, 0, 5, 2, 1, 3])                  # tokens not in probability order
    logits = torch.log(PROBS)[order.argsort()].expand(batch, -1)   # logits[:, order[i]] = log PROBS[i]
    counts = torch.zeros(len(PROBS), dtype=torch.float64)
    for step in range(steps):
        counts += torch.bincount(sample(logits, params, step_tensor(step)), minlength=len(PROBS)).double()
    n = batch * steps
    freq = counts[order] / n                                 # back to PROBS order
    expected = expected.double()
    bound = 5 * torch.sqrt(expected * (1 - expected) / n) + 1e-6
    assert ((freq - expected).abs() <= bound).all(), (freq, expected, bound)
    assert (freq[expected == 0] == 0).all()                  # filtered tokens never appear


# ---- the hash ---------------------------------------------------------------------------------

def test_mul32_matches_big_integers():
    gen = torch.Generator().manual_seed(6)
    x = torch.randint(0, 2**32, (10000,), dtype=torch.int64, generator=gen)
    x[:3] = torch.tensor([0, 2**32 - 1, 2**31])
    for c in (0x7FEB352D, 0x846CA68B, 2**32 - 1):
        expected = torch.tensor([(v * c) % 2**32 for v in x.tolist()])
        assert torch.equal(_mul32(x, c), expected)
        assert _mul32(int(x[1]), c) == expected[1]


def test_mix32_is_a_bijection_on_a_range():
    x = torch.arange(2**16, dtype=torch.int64) * 65537      # 65536 distinct 32-bit inputs
    assert torch.unique(_mix32(x)).numel() == x.numel()
    assert _mix32(12345) == int(_mix32(torch.tensor(12345)))


def test_uniform_has_no_obvious_bias():
    rows, cols = torch.arange(1000)[:, None], torch.arange(1000)[None]
    u = hash_uniform(1234, step_tensor(7), rows, cols).double()               # 1e6 draws
    n = u.numel()
    assert 0 < u.min() and u.max() < 1
    # mean: sd sqrt(1/12 / n) = 2.9e-4; 5 sd bound
    assert abs(u.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    # 16 equal bins: counts ~ Binomial(n, 1/16), sd sqrt(n p (1-p)) = 242
    counts = torch.histc(u, bins=16, min=0, max=1)
    assert ((counts - n / 16).abs() < 5 * math.sqrt(n / 16 * 15 / 16)).all(), counts
    # neighbours in vocab id, in row, and in step are uncorrelated: corr sd ~ 1/sqrt(n)
    u_next_step = hash_uniform(1234, step_tensor(8), rows, cols).double()
    for a, b in ((u[:, 1:], u[:, :-1]), (u[1:], u[:-1]), (u, u_next_step)):
        corr = torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].item()
        assert abs(corr) < 5 / math.sqrt(a.numel()), corr


# ---- tracing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=3),
                                    SamplingParams(temperature=1.0, top_p=0.9, seed=4)], ids=["top_k+top_p", "top_p"])
def test_compiles_without_graph_breaks(params):
    torch._dynamo.reset()
    logits = torch.randn(5, 111, generator=torch.Generator().manual_seed(7))
    compiled = torch.compile(sample, fullgraph=True, backend="aot_eager")    # raises on a graph break
    for step in (0, 1):
        assert torch.equal(compiled(logits, params, step_tensor(step)), sample(logits, params, step_tensor(step)))
