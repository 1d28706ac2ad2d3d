"""The continuous-batching Scheduler on the tiny preset in float32 (eager on the CPU): greedy
tokens equal Engine.generate's with requests arriving between steps, several requests
prefill in one forward within the token budget and a budget below one prompt advances
chunk by chunk, preemption on a pool too small for every request recomputes without a
seam, 1,000 random requests with aborts leave the pool whole, a seeded request draws the
same tokens alone, in a mixed batch and through Engine, argument errors name the argument."""

import random

import pytest
import torch

from onetrip.engine import Engine, SamplingParams
from onetrip.engine.sampling import RowParams, row_mode, row_values, sample, sample_ref, sample_rows, hash_uniform
from onetrip.engine.scheduler import RequestOutput, Scheduler
from onetrip.models import Model

from conftest import DEVICE, ON_GPU
from test_models import TINY


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: these steps are tiny, and two threads on two shared cores spin
    against each other (1,000 requests: 9 s with one, 44-96 s with two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(backend="eager", seed=3, dtype=torch.float32):
    m = Model.random(TINY, dtype, DEVICE, seed=seed)
    m.backend = backend
    return m


def _prompts(gen, lens):
    return [torch.randint(1, TINY.vocab_size, (n,), generator=gen, device=DEVICE).tolist() for n in lens]


def _drain(sched, arrivals=None, steps=None):
    """Step until nothing is left; ``arrivals`` {step: [(id, prompt, params)]} are added
    before that step. Returns {id: (tokens, finish_reason)}; checks every output's stream.
    ``steps``: a list that gets each step's outputs."""
    arrivals, done, streamed, k = dict(arrivals or {}), {}, {}, 0
    while sched.has_unfinished() or arrivals:
        for args in arrivals.pop(k, []):
            sched.add_request(*args)
        outs = sched.step()
        if steps is not None:
            steps.append(outs)
        for out in outs:
            streamed.setdefault(out.request_id, []).extend(out.new_token_ids)
            assert streamed[out.request_id] == out.token_ids
            if out.finished:
                done[out.request_id] = (out.token_ids, out.finish_reason)
        k += 1
    return done


def test_greedy_matches_engine(gen):
    """Prompts of 5, 1, 19, 33, 7, 12 tokens (19 and 33 in chunks of 8) with 10, 6, 12, 3, 1,
    9 new tokens, the last three arriving after 3 steps, through 4 table rows of 4-token
    pages: each request's tokens are Engine.generate's (greedy, one ragged batch)."""
    model = _model()
    lens, news = [5, 1, 19, 33, 7, 12], [10, 6, 12, 3, 1, 9]
    prompts = _prompts(gen, lens)
    want = Engine(model, max_seq=64, max_batch=8, graphs=False).generate(prompts, max(news)).tokens
    sched = Scheduler(model, max_batch=4, max_seq=48, page_size=4, prefill_chunk=8)
    reqs = [(str(i), p, SamplingParams(max_tokens=n)) for i, (p, n) in enumerate(zip(prompts, news))]
    got = _drain(sched, {0: reqs[:3], 3: reqs[3:]})
    for i, n in enumerate(news):
        assert got[str(i)] == (want[i][:n], "length"), i
    assert sched.free_pages == sched.total_pages == 4 * 12 and sched.num_running == sched.num_waiting == 0


def _forwards(model):
    """Record (rows, width, prefill) of every Model.forward call (a prefill passes a logits_index)."""
    calls, forward = [], model.forward

    def recorded(tokens, cache_seqlens=None, logits_index=None, **kw):
        calls.append((*tokens.shape, logits_index is not None))
        # the host's starts must be the device's lengths (a wrong one shifts the causal diagonal)
        assert kw.get("starts") is None or kw["starts"] == cache_seqlens.tolist()
        return forward(tokens, cache_seqlens, logits_index, **kw)

    model.forward = recorded
    return calls


def test_padded_block_prefill_matches_engine(gen):
    """The graph prefill's padded forward for blocks of fresh whole prompts (run without
    graphs on the CPU): prompts of 5, 1, 19, then 33, 7, 70 tokens (the 70 in chunks of 64,
    which prefill eagerly) give Engine.generate's greedy tokens, and the two fresh blocks
    took the padded path (3 rows x 128, then 2 x 128)."""
    model = _model()
    lens, news = [5, 1, 19, 33, 7, 70], [6, 4, 5, 3, 2, 4]
    prompts = _prompts(gen, lens)
    want = Engine(model, max_seq=96, max_batch=8, graphs=False).generate(prompts, max(news)).tokens
    sched = Scheduler(model, max_batch=4, max_seq=96, page_size=4, prefill_chunk=64, prefill_graphs=True)
    reqs = [(str(i), p, SamplingParams(max_tokens=n)) for i, (p, n) in enumerate(zip(prompts, news))]
    got = _drain(sched, {0: reqs[:3], 3: reqs[3:]})
    for i, n in enumerate(news):
        assert got[str(i)] == (want[i][:n], "length"), i
    assert sorted(key[:2] for key in sched._prefill_graphs._entries) == [(2, 128), (3, 128)]
    assert sched.free_pages == sched.total_pages


def test_prefill_batches_requests(gen):
    """Six requests arriving together are prefilled in one forward (6 rows right-padded to
    the longest prompt, 33), and five of them decode in the same step (the sixth wants one
    token): two forwards give eleven tokens. With prefill_tokens=40 and chunks of 16, each
    prefill forward holds rows x width <= 40, the first the oldest request beside the
    oldest 16-token chunk. Both give Engine.generate's tokens."""
    model = _model()
    lens, news = [5, 1, 19, 33, 7, 12], [10, 6, 12, 3, 1, 9]
    prompts = _prompts(gen, lens)
    want = Engine(model, max_seq=64, max_batch=8, graphs=False).generate(prompts, max(news)).tokens
    reqs = [(str(i), p, SamplingParams(max_tokens=n)) for i, (p, n) in enumerate(zip(prompts, news))]
    for kwargs, first in [(dict(prefill_chunk=64), (6, 33)), (dict(prefill_chunk=16, prefill_tokens=40), (2, 16))]:
        sched = Scheduler(model, max_batch=8, max_seq=48, page_size=4, **kwargs)
        calls, steps = _forwards(model), []
        got = _drain(sched, {0: reqs}, steps)
        del model.forward
        prefills = [(r, w) for r, w, prefill in calls if prefill]
        assert prefills[0] == first and all(r * w <= sched.prefill_tokens for r, w in prefills)
        if first == (6, 33):
            assert calls[:3] == [(6, 33, True), (8, 1, False), (8, 1, False)]
            assert sum(len(o.new_token_ids) for o in steps[0]) == 11 and len(prefills) == 1
        for i, n in enumerate(news):
            assert got[str(i)] == (want[i][:n], "length"), i
        assert sched.free_pages == sched.total_pages


def test_small_budget_prefills_chunk_by_chunk(gen):
    """prefill_tokens=3, below every prompt: prompts of 20 and 7 tokens advance 3 tokens a
    forward. A 2-token last chunk beside a 6-token one at position 18 of max_seq 22 (pages
    of 1 token): its padding runs past max_seq onto the sink. Both give Engine.generate's
    tokens."""
    model = _model(seed=10)
    prompts = _prompts(gen, [20, 7, 6])
    want = Engine(model, max_seq=32, max_batch=4, graphs=False).generate(prompts, 4).tokens
    sched = Scheduler(model, max_batch=4, max_seq=32, page_size=4, prefill_chunk=8, prefill_tokens=3)
    calls = _forwards(model)
    got = _drain(sched, {0: [(str(i), p, SamplingParams(max_tokens=4)) for i, p in enumerate(prompts[:2])]})
    assert got == {str(i): (want[i], "length") for i in range(2)}
    prefills = [r * w for r, w, prefill in calls if prefill]
    assert max(prefills) <= 3 and len(prefills) >= 9  # 27 prompt tokens
    sched = Scheduler(model, max_batch=2, max_seq=22, page_size=1, prefill_chunk=6)
    calls.clear()
    got = _drain(sched, {0: [("a", prompts[0], SamplingParams(max_tokens=2))],
                         3: [("b", prompts[2], SamplingParams(max_tokens=3))]})
    del model.forward
    assert [(r, w) for r, w, prefill in calls if prefill] == [(1, 6)] * 3 + [(2, 6)]
    assert got == {"a": (want[0][:2], "length"), "b": (want[2][:3], "length")}


def test_stops():
    """EOS ends a request (included, reason "stop") unless ignore_eos; stop_token_ids too."""
    model = _model(seed=5)
    prompt = [7, 3, 9, 1]
    free = Engine(model, max_seq=32, graphs=False).generate([prompt], 12).tokens[0]
    eos, other = free[6], free[2]
    sched = Scheduler(model, max_batch=4, max_seq=32, page_size=8, eos_ids=(eos,))
    got = _drain(sched, {0: [("eos", prompt, SamplingParams(max_tokens=12)),
                             ("ignore", prompt, SamplingParams(max_tokens=12, ignore_eos=True)),
                             ("ids", prompt, SamplingParams(max_tokens=12, ignore_eos=True, stop_token_ids=[other]))]})
    assert got["eos"] == (free[: free.index(eos) + 1], "stop")
    assert got["ignore"] == (free, "length")
    assert got["ids"] == (free[: free.index(other) + 1], "stop")


def test_outputs_keep_their_tokens():
    """A step's token_ids is the tokens up to that step, read at any time later (it is
    copied on first read), and the output equals a plain RequestOutput of its fields."""
    sched = Scheduler(_model(), max_batch=2, max_seq=32, page_size=8)
    sched.add_request("a", [7, 3, 9], SamplingParams(max_tokens=5))
    outs = [out for _ in range(5) for out in sched.step()]
    assert [len(o.token_ids) for o in outs] == [2, 3, 4, 5] and outs[-1].finished  # 2: the prefill's and a decode's
    assert all(o.token_ids == outs[-1].token_ids[: len(o.token_ids)] for o in outs)
    plain = RequestOutput("a", 3, outs[1].new_token_ids, outs[1].token_ids, False, None)
    assert outs[1] == plain and plain == outs[1] and isinstance(outs[1], RequestOutput)


def test_preemption_recomputes_seamlessly(gen):
    """Six requests of up to 24 positions (6 pages of 4 each, 36 in all) on a pool of 10
    pages: the youngest are preempted and recomputed; every request (one of them sampled)
    gives the tokens it gives alone, and the pool ends whole."""
    model = _model(seed=4)
    prompts = _prompts(gen, [8, 6, 10, 7, 9, 6])
    params = [SamplingParams(max_tokens=14)] * 5 + [SamplingParams(temperature=0.9, top_k=30, seed=11, max_tokens=14)]
    alone = Scheduler(model, max_batch=1, max_seq=24, page_size=4)
    want = {str(i): _drain(alone, {0: [(str(i), p, s)]})[str(i)] for i, (p, s) in enumerate(zip(prompts, params))}
    sched = Scheduler(model, max_batch=6, max_seq=24, page_size=4, num_pages=11, prefill_chunk=4)
    got = _drain(sched, {0: [(str(i), p, s) for i, (p, s) in enumerate(zip(prompts, params))]})
    assert sched.num_preemptions > 0
    assert got == want
    assert sched.free_pages == sched.total_pages == 10


def test_thousand_requests_with_aborts():
    """1,000 requests, prompts of 1-20 tokens and 1-8 new tokens (a third sampled), arriving
    in waves, a tenth aborted while queued or running, 32 rows on a pool that forces
    preemptions: every other request finishes with its max_tokens ("length") or at an EOS
    ("stop"), and the pool ends whole."""
    _thousand_requests(_model(seed=6))


@pytest.mark.gpu
def test_gpu_thousand_requests_with_aborts():
    """The same on the GPU with the fused backend, its decode steps replayed from CUDA graphs
    and fresh prompts prefilled from them."""
    _thousand_requests(_model("fused", seed=6, dtype=torch.bfloat16))


def _thousand_requests(model):
    rng = random.Random(0)
    sched = Scheduler(model, max_batch=32, max_seq=28, page_size=4, num_pages=20, prefill_chunk=16, eos_ids=(5, 77))
    reqs = []
    for i in range(1000):
        prompt = [rng.randrange(TINY.vocab_size) for _ in range(rng.randint(1, 20))]
        sampled = dict(temperature=1.0, top_p=0.9, seed=i) if i % 3 == 0 else {}
        reqs.append((f"r{i}", prompt, SamplingParams(max_tokens=rng.randint(1, 8), **sampled)))
    to_abort = set(rng.sample(range(1000), 100))
    done, aborted, added = {}, set(), 0
    while added < len(reqs) or sched.has_unfinished():
        for _ in range(min(len(reqs) - added, rng.randint(0, 12))):
            sched.add_request(*reqs[added])
            added += 1
        for out in sched.step():
            if out.finished:
                done[out.request_id] = out
        live = [i for i in sorted(to_abort) if i < added and f"r{i}" not in done and f"r{i}" not in aborted]
        for i in rng.sample(live, min(len(live), rng.randint(0, 2))):
            out = sched.abort(f"r{i}")
            assert out.finished and out.finish_reason == "abort"
            aborted.add(f"r{i}")
    assert sched.abort("r0") is None and sched.num_preemptions > 0
    assert len(aborted) > 50
    for rid, _, params in reqs:
        if rid in aborted:
            continue
        out = done[rid]
        assert out.finish_reason in ("length", "stop")
        if out.finish_reason == "length":
            assert len(out.token_ids) == params.max_tokens
        else:
            assert len(out.token_ids) <= params.max_tokens and out.token_ids[-1] in (5, 77)
    assert sched.free_pages == sched.total_pages == 19 and not sched.has_unfinished()


MIXED = {
    "top_k": SamplingParams(temperature=0.9, top_k=20, seed=1, max_tokens=8),
    "top_p": SamplingParams(temperature=1.2, top_p=0.8, seed=2, max_tokens=8),
    "min_p": SamplingParams(temperature=0.7, min_p=0.1, seed=3, max_tokens=8),
    "temperature": SamplingParams(temperature=1.0, seed=4, max_tokens=8),
    "greedy": SamplingParams(max_tokens=8),
}


def test_per_row_sampling_is_independent_of_the_batch(gen):
    """Each seeded request draws the same tokens alone (the bucket of 1, the cheapest mode)
    as in a batch beside greedy and other sampled rows (the filtering mode, its row
    wherever it lands), and as Engine.generate with the same params alone."""
    model = _model(seed=7)
    prompts = dict(zip(MIXED, _prompts(gen, [4, 9, 2, 6, 5])))
    engine = Engine(model, max_seq=32, graphs=False)
    alone = Scheduler(model, max_batch=1, max_seq=32, page_size=4)
    wants = {}
    for name, params in MIXED.items():
        want = engine.generate([prompts[name]], 8, sampling=params).tokens[0]
        assert _drain(alone, {0: [(name, prompts[name], params)]})[name] == (want, "length"), name
        wants[name] = want
    mixed = Scheduler(model, max_batch=8, max_seq=32, page_size=4)
    arrivals = {0: [("greedy", prompts["greedy"], MIXED["greedy"])],
                1: [(n, prompts[n], MIXED[n]) for n in ("min_p", "top_k")],
                3: [(n, prompts[n], MIXED[n]) for n in ("temperature", "top_p")]}
    got = _drain(mixed, arrivals)
    assert {n: t for n, (t, _) in got.items()} == wants


def test_sample_rows_matches_sample():
    """sample_rows on a batch of mixed rows: each row equals ``sample`` of that row alone at
    its own step, in every mode that serves it; min_p in ``sample`` equals the reference."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 111, generator=gen) * 3
    params = list(MIXED.values())
    steps = [0, 3, 7, 1, 2]
    rows = RowParams.empty(5, "cpu")
    for i, (p, s) in enumerate(zip(params, steps)):
        for t, v in zip(rows.tensors(), (*row_values(p), s)):
            t[i] = v
    want = [int(sample(logits[i:i + 1], p, torch.tensor(s))) for i, (p, s) in enumerate(zip(params, steps))]
    assert row_mode(params) == "filter" and row_mode(params[3:]) == "sample" and row_mode(params[4:]) == "greedy"
    assert sample_rows(logits, rows, "filter").tolist() == want
    assert sample_rows(logits[3:], rows.rows(3, 5), "sample").tolist() == want[3:]
    assert sample_rows(logits[4:], rows.rows(4, 5), "greedy").tolist() == want[4:]
    p = SamplingParams(temperature=0.8, min_p=0.2, seed=9)
    u = hash_uniform(9, torch.tensor(4), torch.arange(5)[:, None], torch.arange(111)[None])
    assert torch.equal(sample(logits, p, torch.tensor(4)), sample_ref(logits, p, u))
    with pytest.raises(ValueError, match="mode must be one of greedy, sample, filter, got 'topk'"):
        sample_rows(logits, rows, "topk")


def test_argument_errors():
    model = _model()
    for kwargs, message in [
        (dict(max_batch=0), "max_batch must be an int >= 1, got 0"),
        (dict(page_size=2.0), "page_size must be an int >= 1, got 2.0"),
        (dict(prefill_chunk=0), "prefill_chunk must be an int >= 1, got 0"),
        (dict(prefill_tokens=True), "prefill_tokens must be an int >= 1, got True"),
        (dict(num_pages=1), r"num_pages must be an int >= 2 \(one page is the sink\) or None, got 1"),
        (dict(memory_fraction=0.0), r"memory_fraction must be in \(0, 1\], got 0.0"),
        (dict(max_seq=40, page_size=4, num_pages=10), "max_seq 40 needs 10 pages of 4 tokens but num_pages 10 "
                                                      "leaves 9"),
    ]:
        with pytest.raises(ValueError, match=message):
            Scheduler(model, **kwargs)
    with pytest.raises(TypeError, match="eos_ids must be a sequence of ints"):
        Scheduler(model, eos_ids=[1.5])
    sched = Scheduler(model, max_batch=2, max_seq=16, page_size=4)
    assert sched.max_seq == 16 and sched.total_pages == 8
    assert Scheduler(model, max_batch=2, page_size=64, num_pages=5).max_seq == 256  # capped by the pool
    sched.add_request("a", [1, 2], SamplingParams(max_tokens=4))
    for args, error, message in [
        (("b", [], SamplingParams()), ValueError, "prompt_ids of request 'b' is empty"),
        (("b", [1, 256], SamplingParams()), ValueError, r"prompt_ids must lie in \[0, 256\) .* got 256"),
        (("b", [1] * 10, SamplingParams(max_tokens=7)), ValueError, r"prompt_ids \(10 tokens\) \+ max_tokens \(7\) "
                                                                    "exceeds max_seq 16"),
        (("a", [1], SamplingParams()), ValueError, "request_id 'a' is already queued or running"),
        (("b", [1], {"temperature": 1}), TypeError, "params must be a SamplingParams, got dict"),
        (("b", [1.5], SamplingParams()), TypeError, "prompt_ids must be a sequence of int token ids"),
        ((3, [1], SamplingParams()), TypeError, "request_id must be a str, got int"),
    ]:
        with pytest.raises(error, match=message):
            sched.add_request(*args)
    assert sched.abort("nope") is None
    assert sched.abort("a").finish_reason == "abort" and not sched.has_unfinished()
    for kwargs, error, field in [
        (dict(min_p=1.5), ValueError, "min_p"), (dict(max_tokens=0), ValueError, "max_tokens"),
        (dict(stop=[""]), TypeError, "stop"), (dict(stop=3), TypeError, "stop"),
        (dict(stop_token_ids=[-1]), TypeError, "stop_token_ids"), (dict(ignore_eos="yes"), TypeError, "ignore_eos"),
    ]:
        with pytest.raises(error, match=rf"SamplingParams\.{field} must .* got"):
            SamplingParams(**kwargs)
    p = SamplingParams(stop=["a", "b"], stop_token_ids=[3])
    assert p.stop == ("a", "b") and p.stop_token_ids == (3,) and hash(p) == hash(SamplingParams(stop=("a", "b"),
                                                                                             stop_token_ids=(3,)))
    assert SamplingParams(stop="x").stop == ("x",)
    assert p.sampler_key() == SamplingParams(max_tokens=3).sampler_key()


def test_fused_backend_matches_eager(gen):
    """The fused backend (through Triton's interpreter on the CPU) gives the eager run's
    tokens, with a prefill block whose rows start at 8, 0 and 0 (a 12-token prompt's
    second chunk beside two new prompts)."""
    prompts = _prompts(gen, [12, 3, 6])
    reqs = [(str(i), p, SamplingParams(max_tokens=3)) for i, p in enumerate(prompts)]
    got = []
    for backend in ("eager", "fused"):
        sched = Scheduler(_model(backend, seed=8), max_batch=3, max_seq=16, page_size=4, prefill_chunk=8)
        got.append(_drain(sched, {0: reqs[:1], 1: reqs[1:]}))
    assert got[0] == got[1] and len(got[0]) == 3


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["eager", "fused"])
def test_graphs_give_identical_tokens(backend, gen):
    """bf16 on the GPU: CUDA-graph replays (a graph per bucket and mode) give exactly the
    eager steps' tokens, for requests of every sampling kind joining and leaving."""
    model = _model(backend, seed=9, dtype=torch.bfloat16)
    prompts = _prompts(gen, [9, 2, 30, 17, 5, 70, 1, 40])
    params = list(MIXED.values())
    reqs = [(str(i), p, params[i % len(params)]) for i, p in enumerate(prompts)]
    runs = []
    for graphs in (False, True):
        sched = Scheduler(model, max_batch=4, max_seq=128, page_size=16, prefill_chunk=32, graphs=graphs,
                          prefill_graphs=False)  # bf16 GEMMs of other row counts round otherwise: next test
        runs.append(_drain(sched, {0: reqs[:3], 2: reqs[3:6], 5: reqs[6:]}))
        assert sched.graphs == graphs and sched.free_pages == sched.total_pages
    assert runs[0] == runs[1]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["eager", "fused"])
def test_prefill_graphs_give_identical_tokens(backend, gen):
    """float32 on the GPU: blocks of fresh prompts prefilled from graphs (padded to 128)
    give the tokens of eager prefills, requests joining and leaving."""
    model = _model(backend, seed=9)
    prompts = _prompts(gen, [9, 2, 30, 17, 5, 70, 1, 40])
    reqs = [(str(i), p, SamplingParams(max_tokens=12)) for i, p in enumerate(prompts)]
    runs = []
    for prefill_graphs in (False, True):
        sched = Scheduler(model, max_batch=4, max_seq=128, page_size=16, prefill_chunk=64,
                          prefill_graphs=prefill_graphs)
        runs.append(_drain(sched, {0: reqs[:3], 2: reqs[3:6], 5: reqs[6:]}))
        assert sched.free_pages == sched.total_pages
    assert runs[0] == runs[1] and sched._prefill_graphs._entries



def test_warm_up(gen):
    """warm_up runs its two requests through the prefill paths (on the CPU: no graphs to
    capture) and leaves the scheduler idle with its pool whole; requests after it get
    Engine.generate's tokens. Refused while requests are unfinished, and for a bad mode."""
    model = _model()
    prompts = _prompts(gen, [5, 11])
    want = Engine(model, max_seq=48, max_batch=2, graphs=False).generate(prompts, 6).tokens
    sched = Scheduler(model, max_batch=2, max_seq=48, page_size=4, prefill_chunk=8)
    calls = []
    assert sched.warm_up(progress=lambda done, total: calls.append((done, total))) == 0
    assert calls == [(1, 2), (2, 2)] and not sched.has_unfinished() and sched.free_pages == sched.total_pages
    got = _drain(sched, {0: [(str(i), p, SamplingParams(max_tokens=6)) for i, p in enumerate(prompts)]})
    assert [got[str(i)][0] for i in range(2)] == want
    with pytest.raises(ValueError, match=r"modes must be among \('greedy', 'sample', 'filter'\), got \['beam'\]"):
        sched.warm_up(modes=("greedy", "beam"))
    sched.add_request("x", prompts[0], SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="warm_up runs on an idle scheduler; it has 1 unfinished requests"):
        sched.warm_up()


@pytest.mark.gpu
def test_warm_up_captures_every_bucket(gen):
    """On the GPU warm_up captures a graph a (bucket, mode), and the tokens after it are those
    of a scheduler that captures on first use (float32)."""
    model = _model("fused", seed=9)
    prompts = _prompts(gen, [9, 2, 30, 17, 5])
    reqs = [(str(i), p, SamplingParams(max_tokens=12)) for i, p in enumerate(prompts)]
    runs = []
    for warm in (False, True):
        sched = Scheduler(model, max_batch=4, max_seq=128, page_size=16, prefill_chunk=32)
        if warm:
            assert sched.warm_up() == len(sched._steps) == 3 * 3  # buckets 1, 2, 4 x three modes
        runs.append(_drain(sched, {0: reqs[:3], 2: reqs[3:]}))
        assert sched.free_pages == sched.total_pages
    assert runs[0] == runs[1]

@pytest.mark.skipif(ON_GPU, reason="the CPU's pool default")
def test_default_pool_on_the_cpu():
    sched = Scheduler(_model(), max_batch=3, page_size=64)
    assert sched.max_seq == TINY.max_position_embeddings and sched.total_pages == 3 * 8
