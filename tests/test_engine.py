"""The decode engine on tiny configs: greedy tokens match transformers' greedy generate and
the model's own greedy loop, for both backends; ragged batches, on a paged cache too; EOS,
streaming, errors; on a GPU, graphs on and off give identical tokens."""

import pytest
import torch

from onetrip.engine import Engine, SamplingParams
from onetrip.engine.generate import bucket_for
from onetrip.models import FusedOptions, Model, greedy_generate, save_model
from onetrip.ops.skinny_matmul import GEMV_PICKS

from conftest import DEVICE, ON_GPU
from test_models import TINY, VARIANTS


def _model(variant="llama", backend="eager", seed=3, dtype=torch.float32):
    m = Model.random(VARIANTS[variant], dtype, DEVICE, seed=seed)
    m.backend = backend
    return m


def _prompts(gen, lens):
    return [torch.randint(1, TINY.vocab_size, (n,), generator=gen, device=DEVICE).tolist() for n in lens]


@pytest.mark.parametrize("backend", ["eager", "fused"])
@pytest.mark.parametrize("variant", [v if v in ("llama", "qwen3") else pytest.param(v, marks=pytest.mark.slow)
                                     for v in VARIANTS])  # the others' fused paths: test_models_fused, make test-all
def test_greedy_matches_transformers(tmp_path, variant, backend, gen):
    """Greedy tokens (32 on a GPU, 16 through the interpreter), fp32: the same as
    transformers' generate on the same checkpoint."""
    transformers = pytest.importorskip("transformers")
    model = _model(variant, backend, seed=11)
    save_model(model, tmp_path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32).eval().to(DEVICE)
    prompt = _prompts(gen, [7])
    n = 32 if ON_GPU else 16
    with torch.no_grad():
        want = ref.generate(torch.tensor(prompt, device=DEVICE), max_new_tokens=n, do_sample=False,
                            min_new_tokens=n, eos_token_id=None, pad_token_id=0)[0, 7:].tolist()
    got = Engine(model, max_seq=64, graphs=False).generate(prompt, n)
    assert got.tokens == [want]
    assert got.decode_steps == n - 1


@pytest.mark.parametrize("backend", ["eager", "fused"])
def test_ragged_batch_matches_one_by_one(backend, gen):
    """Three prompts of lengths 5, 1 and 19 (bucket 4, right-padded, the 19 prefilled in
    chunks of 8): each sequence's tokens equal its own single-sequence greedy run."""
    model = _model("qwen2", backend, seed=4)
    prompts = _prompts(gen, [5, 1, 19])
    engine = Engine(model, max_seq=48, max_batch=4, graphs=False, prefill_chunk=8)
    got = engine.generate(prompts, 4)
    assert got.batch_bucket == 4 and got.prompt_lens == [5, 1, 19]
    for p, toks in zip(prompts, got.tokens):
        want = greedy_generate(model, torch.tensor([p], device=DEVICE), 4)[0].tolist()
        assert toks == want


# fused on the CPU: test_paged.py::test_paged_matches_contiguous_logits (the same kernels, one batch)
@pytest.mark.parametrize("backend", ["eager", "fused"] if ON_GPU else ["eager"])
def test_paged_ragged_batch_matches_contiguous(backend, gen):
    """Prompts of 5, 1 and 19 tokens (bucket 4: the padding row writes into the sink page)
    prefilled in chunks of 17 (flash_attention over gathered pages, then a 2-token chunk),
    on a pool of exactly the pages they need: ceil((prompt + 4) / 8) = 2, 1 and 3, where
    the contiguous cache holds 4 x 48 slots (24 pages). The same greedy tokens."""
    model = _model("qwen2", backend, seed=4)
    prompts = _prompts(gen, [5, 1, 19])
    kw = dict(max_seq=48, max_batch=4, graphs=False, prefill_chunk=17)
    want = Engine(model, **kw).generate(prompts, 4)
    engine = Engine(model, **kw, paged=True, page_size=8, num_pages=2 + 1 + 3 + 1)
    got = engine.generate(prompts, 4)
    assert got.tokens == want.tokens
    assert [len(p) for p in engine.plan.pages] == [2, 1, 3] and engine.plan.pages_used == 6


@pytest.mark.parametrize("backend, paged", [("eager", False), ("eager", True), ("fused", False)])
def test_padded_prefill_matches_eager(backend, paged, gen):
    """The graph prefill's padded forward (run without graphs on the CPU): prompts of 5, 1
    and 17 tokens (the fused run: 1 and 17) (past decode attention's 16: flash_attention over the cache) right-padded to
    one static length (the fused run at 32 to keep the interpreter quick; the default 128
    eagerly, with the padding's pages on the sink), told their starts on the host: the same
    greedy tokens as the chunked eager prefill."""
    model = _model("qwen2", backend, seed=4)
    prompts = _prompts(gen, [1, 17] if backend == "fused" else [5, 1, 17])
    paging = dict(paged=True, page_size=8) if paged else {}
    kw = dict(max_seq=160, max_batch=4, graphs=False, **paging)
    new = 1 if backend == "fused" else 6  # fused: the prefill's own token (the interpreter is slow)
    want = Engine(model, **kw).generate(prompts, new)
    engine = Engine(model, **kw, prefill_graphs=True)
    if backend == "fused":
        engine._prefill.step = 32
    assert engine._prefill.length_for(len(prompts), 17, 160) == (32 if backend == "fused" else 128)
    assert engine.generate(prompts, new).tokens == want.tokens


def test_paged_new_plan_each_batch(gen):
    """One pool, batches of other sizes and lengths in turn: each run gets a new plan
    written into the same table over the previous run's stale pages, and gives the tokens
    of a fresh contiguous engine (eager: fast; the fused kernels never read a slot before
    it is written, which test_paged.py checks with pools full of NaN)."""
    model = _model("llama", "eager", seed=7)
    engine = Engine(model, max_seq=40, max_batch=4, paged=True, page_size=4, num_pages=24)
    for lens, new in (([9, 30], 6), ([3, 1, 12], 9), ([17], 5)):
        prompts = _prompts(gen, lens)
        want = Engine(model, max_seq=40, max_batch=4).generate(prompts, new).tokens
        assert engine.generate(prompts, new).tokens == want
        assert [len(p) for p in engine.plan.pages] == [-(-(n + new) // 4) for n in lens]


def test_paged_errors():
    model = _model()
    with pytest.raises(TypeError, match="paged must be a bool .*, got 'yes'"):
        Engine(model, paged="yes")
    with pytest.raises(ValueError, match="page_size=16 applies to a paged KV cache; pass paged=True with it"):
        Engine(model, page_size=16)
    with pytest.raises(ValueError, match="num_pages=4 applies to a paged KV cache"):
        Engine(model, num_pages=4)
    with pytest.raises(ValueError, match=r"page_size must be an int >= 1 \(tokens per page\), got 0"):
        Engine(model, paged=True, page_size=0)
    with pytest.raises(ValueError, match=r"num_pages must be an int >= 2 \(one page is the sink\), got 1"):
        Engine(model, paged=True, num_pages=1)
    assert Engine(model, max_seq=30, max_batch=3, paged=True, page_size=8).num_pages == 4 * 4 + 1
    engine = Engine(model, max_seq=32, max_batch=2, graphs=False, paged=True, page_size=8, num_pages=4)
    with pytest.raises(ValueError, match=r"the batch needs 4 pages of 8 tokens \(\[2, 2\] per sequence\) but "
                                         r"the pool has 3"):
        engine.generate([[1] * 10, [2] * 3], 6)
    assert engine.plan is None and engine._full is None  # refused before allocating anything


def test_eos_stops_and_streams(gen):
    model = _model("llama", "eager", seed=5)
    prompt = _prompts(gen, [4])
    engine = Engine(model, max_seq=64, graphs=False, check_every=4)
    free = engine.generate(prompt, 20).tokens[0]
    eos = free[6]
    stop = free.index(eos)  # the first occurrence
    seen = []
    got = engine.generate(prompt, 20, eos_ids=(eos,), on_token=lambda i, toks: seen.append((i, toks)))
    assert got.tokens[0] == free[: stop + 1]
    assert [i for i, _ in seen] == list(range(stop + 1))
    assert [t[0] for _, t in seen] == free[: stop + 1]


def test_sampling_is_seeded(gen):
    model = _model("llama", "eager", seed=6)
    prompt = _prompts(gen, [3, 3])
    engine = Engine(model, max_seq=40, max_batch=2, graphs=False)
    s = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=123)
    a = engine.generate(prompt, 16, sampling=s).tokens
    assert engine.generate(prompt, 16, sampling=s).tokens == a
    assert engine.generate(prompt, 16, sampling=SamplingParams(temperature=1.0, seed=124)).tokens != a


def test_advance_kernel_matches_op_by_op(gen):
    """The fused backend's step bookkeeping in one ``ops.advance`` launch (the default) or op
    by op (``FusedOptions(advance_kernel=False)``): the same sampled tokens for a batch of 3
    (bucket 4) where one sequence stops at an EOS (greedy steps take the launch in every
    fused test against transformers)."""
    sampling = SamplingParams(temperature=0.8, top_k=20, seed=2)
    model = _model("llama", "fused", seed=12)
    prompts = _prompts(gen, [4, 2, 6])
    engine = Engine(model, max_seq=24, max_batch=4, graphs=False, check_every=2)
    free = engine.generate(prompts, 5, sampling=sampling).tokens
    eos = (free[1][3],)
    runs = []
    for options in (FusedOptions(), FusedOptions(advance_kernel=False)):
        model.fused_options = options
        runs.append(engine.generate(prompts, 5, sampling=sampling, eos_ids=eos).tokens)
    assert runs[0] == runs[1]
    assert runs[0][1] == free[1][: free[1].index(eos[0]) + 1]


def test_bucket_for():
    assert [bucket_for(b) for b in (1, 2, 3, 4, 5, 8, 9, 33)] == [1, 2, 4, 4, 8, 8, 16, 64]
    with pytest.raises(ValueError, match="batch must be >= 1, got 0"):
        bucket_for(0)


def test_errors():
    engine = Engine(_model(), max_seq=16, max_batch=2, graphs=False)
    with pytest.raises(ValueError, match="exceeds the engine's max_seq 16"):
        engine.generate([[1] * 10], 7)
    with pytest.raises(ValueError, match="3 prompts exceed the engine's max_batch 2"):
        engine.generate([[1], [2], [3]], 2)
    with pytest.raises(ValueError, match="every prompt needs at least one token"):
        engine.generate([[1], []], 2)
    with pytest.raises(ValueError, match=r"prompt token ids must lie in \[0, 256\)"):
        engine.generate([[256]], 2)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1, got 0"):
        engine.generate([[1]], 0)
    with pytest.raises(ValueError, match="max_seq must be an int >= 1, got 0"):
        Engine(_model(), max_seq=0)


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("backend", ["eager", "fused"])
def test_graphs_give_identical_tokens(backend, paged):
    """bf16 on the GPU: one graph replay per token gives exactly the tokens of the same
    steps run eagerly, greedy and sampled, for a ragged batch of 3 (bucket 4), with a
    contiguous and a paged cache (16-token pages)."""
    model = _model("qwen3", backend, seed=8, dtype=torch.bfloat16)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    prompts = _prompts(gen, [9, 2, 30])
    for sampling in (SamplingParams(), SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=3)):
        paging = dict(paged=True, page_size=16) if paged else {}
        runs = [Engine(model, max_seq=96, max_batch=4, graphs=g, prefill_graphs=False, **paging)
                .generate(prompts, 40, sampling=sampling) for g in (False, True)]  # bf16: prefills alike
        assert runs[1].graphs and not runs[0].graphs
        assert runs[0].tokens == runs[1].tokens


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("backend", ["eager", "fused"])
def test_prefill_graphs_give_identical_tokens(backend, paged):
    """float32 on the GPU: prefills replayed from graphs (padded to 128, one graph a bucket and
    length, captured on first use and replayed after) give the tokens of eager prefills, for
    a ragged batch of 3 and then one prompt, twice each."""
    model = _model("qwen3", backend, seed=8)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    batches = [_prompts(gen, [9, 2, 30]), _prompts(gen, [200])] * 2
    paging = dict(paged=True, page_size=16) if paged else {}
    engines = [Engine(model, max_seq=256, max_batch=4, prefill_graphs=g, **paging) for g in (False, True)]
    for prompts in batches:
        runs = [e.generate(prompts, 8) for e in engines]
        assert runs[0].tokens == runs[1].tokens
    assert len(engines[1]._prefill._entries) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("early_weights", [0, 1, 2])
def test_pdl_gives_identical_tokens(monkeypatch, early_weights):
    """Programmatic dependent launch (ONETRIP_PDL, on by default) over the whole batch-1
    step in a graph: the GEMVs wait for whatever ran before them (append_kv, decode
    attention split in two over a 600-token context in a 1024-slot cache, its merge), and
    the argmax for the LM head; likewise with the GEMVs' first 0, 1 or 2 weight chunks
    loaded before the wait. The same greedy tokens as without."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    model = _model("llama", "fused", seed=5, dtype=torch.bfloat16)
    model.fused_options = FusedOptions(gemv_picks=GEMV_PICKS.with_early(early_weights))
    prompt = _prompts(torch.Generator(device=DEVICE).manual_seed(1), [600])
    runs = []
    for m in (0, 1):
        monkeypatch.setenv("ONETRIP_PDL", str(m))
        runs.append(Engine(model, max_seq=1024, max_batch=1, graphs=True).generate(prompt, 24).tokens)
    assert runs[0] == runs[1]
