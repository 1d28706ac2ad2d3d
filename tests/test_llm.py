"""onetrip.LLM on the tiny preset (eager, float32, CPU): token-id prompts give the
Scheduler's greedy tokens; text prompts through a byte-level BPE trained here; stop
strings cut the text and abort the request; chat renders the template; errors."""

import dataclasses

import pytest
import torch
from tokenizers import processors

import onetrip
from onetrip.engine import Engine, LLM, SamplingParams, Tokenizer, stop_string_cut
from onetrip.models import Model

from conftest import byte_bpe
from test_models import TINY

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello world, hello tokenizer!",
          "A café in Paris serves coffee.", "Numbers: 1, 2, 3, 4, 5."] * 3
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny steps: two threads on two shared cores spin against each other
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tok():
    """A byte-level BPE of ~300 ids with a BOS post-processor, an EOS and a chat template."""
    backend = byte_bpe(CORPUS, 300, ["<s>", "<|end|>"])
    bos = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    return Tokenizer(backend, TEMPLATE, {"bos_token": "<s>", "eos_token": "<|end|>"},
                     (backend.token_to_id("<|end|>"),), bos)


@pytest.fixture(scope="module")
def text_llm(tok):
    model = Model.random(dataclasses.replace(TINY, vocab_size=tok.vocab_size), torch.float32, "cpu", seed=2)
    return LLM(model, tokenizer=tok, max_batch=4, max_seq=64, page_size=8)


def test_token_prompts_match_engine():
    """Id prompts (no tokenizer): the greedy tokens of Engine.generate, in the prompts' order;
    one list of ids is one prompt; per-prompt params; onetrip.LLM from a preset name."""
    model = Model.random(TINY, torch.float32, "cpu", seed=3)
    prompts = [[5, 9, 2], [7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
    want = Engine(model, max_seq=32, max_batch=4, graphs=False).generate(prompts, 6).tokens
    llm = LLM(model, max_batch=2, max_seq=32, page_size=4)
    outs = llm.generate(prompts, [SamplingParams(max_tokens=n) for n in (6, 3, 6)], use_tqdm=True)
    assert [o.token_ids for o in outs] == [want[0], want[1][:3], want[2]]
    assert [o.finish_reason for o in outs] == ["length"] * 3
    assert outs[1].prompt is None and outs[1].text is None and outs[1].prompt_token_ids == [7]
    assert llm.generate([5, 9, 2], SamplingParams(max_tokens=6))[0].token_ids == want[0]
    assert llm.scheduler.free_pages == llm.scheduler.total_pages
    preset = onetrip.LLM("tiny", device="cpu", max_batch=2, max_seq=32, page_size=4)
    assert preset.tokenizer is None and preset.model.backend == "eager"
    assert len(preset.generate([[1, 2]], SamplingParams(max_tokens=3))[0].token_ids) == 3


def test_text_prompts_and_stop_strings(tok, text_llm):
    """A text prompt is encoded with its BOS and the output decoded; a stop string found in
    the text cuts it before the string (reason "stop") and frees the request's pages."""
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    full = text_llm.generate("Hello world", params)[0]
    assert full.prompt == "Hello world" and full.prompt_token_ids == tok.encode("Hello world")
    assert full.prompt_token_ids[0] == tok.bos_id and full.text == tok.decode(full.token_ids)
    assert len(full.token_ids) == 24 and full.finish_reason == "length"
    i = next(i for i in range(len(full.text) // 3, len(full.text) - 2) if "\ufffd" not in full.text[i:i + 2])
    stop = full.text[i:i + 2]
    cut = full.text.index(stop)
    out = text_llm.generate(["Hello world"], dataclasses.replace(params, stop=[stop, "never seen"]))[0]
    assert out.text == full.text[:cut] and out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[: len(out.token_ids)] and len(out.token_ids) < 24
    assert text_llm.scheduler.free_pages == text_llm.scheduler.total_pages
    assert stop_string_cut("hello world", ["o w", "ld"]) == ("hell", True)
    assert stop_string_cut("hello", ["x"]) == ("hello", False)


def test_chat(tok, text_llm):
    """One conversation or several, through the template (the BOS from the template only)."""
    convs = [[{"role": "user", "content": "Hi"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Numbers?"}]]
    params = SamplingParams(max_tokens=5)
    outs = text_llm.chat(convs, params)
    for conv, out in zip(convs, outs):
        assert out.prompt == tok.apply_chat_template(conv) and out.prompt.endswith("<|assistant|>")
        assert out.prompt_token_ids == tok.encode_chat(conv) and out.prompt_token_ids.count(tok.bos_id) == 1
        assert out.token_ids == text_llm.generate([out.prompt_token_ids], params)[0].token_ids
    assert text_llm.chat(convs[0], params)[0].token_ids == outs[0].token_ids


def test_errors(text_llm):
    model = Model.random(TINY, torch.float32, "cpu", seed=3)
    llm = LLM(model, max_batch=2, max_seq=32, page_size=4)
    with pytest.raises(ValueError, match="text prompts needs a tokenizer"):
        llm.generate("hello")
    with pytest.raises(ValueError, match="chat needs a tokenizer"):
        llm.chat([{"role": "user", "content": "Hi"}])
    with pytest.raises(ValueError, match="params must be a SamplingParams or a list of 2"):
        llm.generate([[1], [2]], [SamplingParams()])
    with pytest.raises(ValueError, match="prompts must be a str, a non-empty list"):
        llm.generate([])
    with pytest.raises(TypeError, match="prompts must be all str or all token-id lists"):
        text_llm.generate(["a", [1]])
    with pytest.raises(ValueError, match="dtype and device apply to a model LLM loads"):
        LLM(model, dtype=torch.float16)
    with pytest.raises(TypeError, match="model_or_spec must be a Model or a str"):
        LLM(3)
    with pytest.raises(ValueError, match="prompt_ids must lie in"):
        llm.generate([[1], [300]])  # the first, queued already, is withdrawn
    assert not llm.scheduler.has_unfinished()
