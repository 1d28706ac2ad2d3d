"""The decode engine on tiny configs: greedy tokens match transformers' greedy generate and
the model's own greedy loop, for both backends; ragged batches, EOS, streaming, errors;
on a GPU, graphs on and off give identical tokens."""

import pytest
import torch

from onetrip.engine import Engine, SamplingParams
from onetrip.engine.generate import bucket_for
from onetrip.models import Model, greedy_generate, save_model

from conftest import DEVICE, ON_GPU
from test_models import TINY, VARIANTS


def _model(variant="llama", backend="eager", seed=3, dtype=torch.float32):
    m = Model.random(VARIANTS[variant], dtype, DEVICE, seed=seed)
    m.backend = backend
    return m


def _prompts(gen, lens):
    return [torch.randint(1, TINY.vocab_size, (n,), generator=gen, device=DEVICE).tolist() for n in lens]


@pytest.mark.parametrize("backend", ["eager", "fused"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_matches_transformers(tmp_path, variant, backend, gen):
    """32 greedy tokens, fp32: the same as transformers' generate on the same checkpoint."""
    transformers = pytest.importorskip("transformers")
    model = _model(variant, backend, seed=11)
    save_model(model, tmp_path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32).eval().to(DEVICE)
    prompt = _prompts(gen, [7])
    with torch.no_grad():
        want = ref.generate(torch.tensor(prompt, device=DEVICE), max_new_tokens=32, do_sample=False,
                            min_new_tokens=32, eos_token_id=None, pad_token_id=0)[0, 7:].tolist()
    got = Engine(model, max_seq=64, graphs=False).generate(prompt, 32)
    assert got.tokens == [want]
    assert got.decode_steps == 31


@pytest.mark.parametrize("backend", ["eager", "fused"])
def test_ragged_batch_matches_one_by_one(backend, gen):
    """Three prompts of lengths 5, 1 and 19 (bucket 4, right-padded, the 19 prefilled in
    chunks of 8): each sequence's tokens equal its own single-sequence greedy run."""
    model = _model("qwen2", backend, seed=4)
    prompts = _prompts(gen, [5, 1, 19])
    engine = Engine(model, max_seq=48, max_batch=4, graphs=False, prefill_chunk=8)
    got = engine.generate(prompts, 12)
    assert got.batch_bucket == 4 and got.prompt_lens == [5, 1, 19]
    for p, toks in zip(prompts, got.tokens):
        want = greedy_generate(model, torch.tensor([p], device=DEVICE), 12)[0].tolist()
        assert toks == want


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
@pytest.mark.parametrize("backend", ["eager", "fused"])
def test_graphs_give_identical_tokens(backend):
    """bf16 on the GPU: one graph replay per token gives exactly the tokens of the same
    steps run eagerly, greedy and sampled, for a ragged batch of 3 (bucket 4)."""
    model = _model("qwen3", backend, seed=8, dtype=torch.bfloat16)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    prompts = _prompts(gen, [9, 2, 30])
    for sampling in (SamplingParams(), SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=3)):
        runs = [Engine(model, max_seq=96, max_batch=4, graphs=g).generate(prompts, 40, sampling=sampling)
                for g in (False, True)]
        assert runs[1].graphs and not runs[0].graphs
        assert runs[0].tokens == runs[1].tokens
