"""onetrip serve through the official openai client: a tiny model directory (a byte-level BPE
trained here, a ChatML template, random float32 weights) served by uvicorn on a free port of
127.0.0.1, with the engine thread over a Scheduler. Greedy answers must be the Engine's tokens
for the same prompt ids; errors must be OpenAI-shaped; a client that leaves mid-stream must
get its pages freed."""

import concurrent.futures
import dataclasses
import http.client
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from conftest import byte_bpe  # noqa: E402

from onetrip.engine import Engine, SamplingParams  # noqa: E402
from onetrip.engine.commands import load  # noqa: E402
from onetrip.engine.scheduler import Scheduler  # noqa: E402
from onetrip.models import Model, get_config, save_model  # noqa: E402
from onetrip.serve import EngineRunner  # noqa: E402
from onetrip.serve.app import create_app  # noqa: E402

NAME = "tiny-chat"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = ["The café serves coffee and crêpes.", "Hello world, hello server!",
          "The quick brown fox jumps over the lazy dog.", "We visited 日本 and a café."] * 3
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, café?"}]


class RecordingScheduler(Scheduler):
    """Records every abort (id, reason)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.aborts = []

    def abort(self, request_id, reason="abort"):
        self.aborts.append((request_id, reason))
        return super().abort(request_id, reason)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    backend = byte_bpe(CORPUS, 300, SPECIAL, min_frequency=2)
    path = tmp_path_factory.mktemp("serve") / NAME
    config = dataclasses.replace(get_config("tiny"), vocab_size=backend.get_vocab_size())
    save_model(Model.random(config, torch.float32, "cpu"), path)
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"}))
    return path


@contextmanager
def serving(runner, name=NAME):
    """The app of ``runner`` under uvicorn on a free port; yields the base URL."""
    server = uvicorn.Server(uvicorn.Config(create_app(runner, name), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    runner.start()
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)
        runner.shutdown(10)


@pytest.fixture(scope="module")
def served(model_dir):
    model, tok, _ = load(str(model_dir), torch.float32, "cpu")
    assert model.backend == "eager"  # the loader's default: no interpreter on the CPU
    scheduler = RecordingScheduler(model, max_batch=4, eos_ids=tok.eos_ids)
    runner = EngineRunner(scheduler, tok)
    with serving(runner) as url:
        yield SimpleNamespace(url=url, client=openai.OpenAI(base_url=url, api_key="x", max_retries=0), runner=runner,
                              tok=tok)


@pytest.fixture(scope="module")
def reference(model_dir):
    """Greedy tokens of the Engine (its own copy of the model): ids -> tokens."""
    model, tok, _ = load(str(model_dir), torch.float32, "cpu")
    engine = Engine(model, max_seq=model.config.max_position_embeddings, graphs=False)

    def greedy(ids, n, eos=True):
        return engine.generate([ids], n, sampling=SamplingParams(), eos_ids=tok.eos_ids if eos else ()).tokens[0]
    return greedy


def _raw(url, body: bytes):
    """POST raw bytes; (status, parsed JSON)."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_models_and_health(served):
    assert [m.id for m in served.client.models.list().data] == [NAME]
    with urllib.request.urlopen(served.url.removesuffix("/v1") + "/health", timeout=10) as response:
        assert response.status == 200


def test_completions_greedy_match_engine(served, reference):
    ids = served.tok.encode("The quick brown fox")
    expected = reference(ids, 12, eos=False)
    out = served.client.completions.create(model=NAME, prompt=ids, max_tokens=12, temperature=0,
                                           extra_body={"ignore_eos": True, "return_token_ids": True})
    choice = out.choices[0]
    assert choice.token_ids == expected and choice.finish_reason == "length"
    assert choice.text == served.tok.decode(expected)
    usage = out.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (len(ids), 12, len(ids) + 12)
    # the same as text, streamed, with the usage chunk last
    chunks = list(served.client.completions.create(model=NAME, prompt="The quick brown fox", max_tokens=12,
                                                   temperature=0, stream=True, stream_options={"include_usage": True},
                                                   extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_chat_greedy_match_engine(served, reference):
    ids = served.tok.encode_chat(CHAT)
    expected = reference(ids, 10)
    out = served.client.chat.completions.create(model=NAME, messages=CHAT, max_completion_tokens=10, temperature=0)
    text = out.choices[0].message.content
    assert text == served.tok.decode(expected) and out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason == ("stop" if len(expected) < 10 else "length")
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == len(expected)
    chunks = list(served.client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=10, temperature=0,
                                                        stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == out.choices[0].finish_reason


def test_seeded_sampling_reproduces(served):
    def draw(seed):
        return served.client.completions.create(
            model=NAME, prompt="The café", max_tokens=8, temperature=1.0, seed=seed,
            extra_body={"top_k": 40, "min_p": 0.01, "ignore_eos": True, "return_token_ids": True}).choices[0].token_ids

    with concurrent.futures.ThreadPoolExecutor(3) as pool:  # alone or in a batch: the same draws
        runs = list(pool.map(draw, [7, 7, 7]))
    alone = draw(7)
    assert runs == [alone] * 3 and len(alone) == 8 and draw(8) != alone


def test_stop_strings_cut_and_abort(served):
    prompt = "The quick brown fox"
    full = served.client.completions.create(model=NAME, prompt=prompt, max_tokens=24, temperature=0,
                                            extra_body={"ignore_eos": True}).choices[0].text
    clean = full.split("\ufffd")[0]  # random weights: bytes that make no character follow
    stop = clean[len(clean) // 2:len(clean) // 2 + 2]
    expected = full[:full.find(stop)]
    assert len(clean) >= 8 and len(expected) >= 2, full
    kwargs = dict(model=NAME, prompt=prompt, max_tokens=24, temperature=0, stop=[stop, "\x00never"],
                  extra_body={"ignore_eos": True})
    out = served.client.completions.create(**kwargs)
    assert (out.choices[0].text, out.choices[0].finish_reason) == (expected, "stop")
    assert out.usage.completion_tokens < 24
    assert out.id in {rid for rid, reason in served.runner.scheduler.aborts if reason == "stop"}
    chunks = list(served.client.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks) == expected  # nothing past the stop ever streamed
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_errors(served):
    client, url = served.client, served.url
    cases = [(dict(temperature=-1), openai.BadRequestError, "temperature"),
             (dict(n=2), openai.BadRequestError, "n"),
             (dict(max_tokens=0), openai.BadRequestError, "max_tokens"),
             (dict(max_tokens=10_000), openai.BadRequestError, "prompt"),
             (dict(logprobs=2), openai.BadRequestError, "logprobs"),
             (dict(model="gpt-4o"), openai.NotFoundError, "model")]
    for kwargs, error, param in cases:
        with pytest.raises(error) as info:
            client.completions.create(**{"model": NAME, "prompt": "Hi", **kwargs})
        body = info.value.body
        assert body["param"] == param and set(body) == {"message", "type", "param", "code"}, body
    assert info.value.status_code == 404 and body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=NAME, prompt="Hi", max_tokens=10_000)
    assert info.value.body["code"] == "context_length_exceeded" and "512" in info.value.body["message"]

    status, body = _raw(f"{url}/completions", b'{"model": "tiny-chat", "prompt": ')
    assert status == 400 and body["error"]["code"] == "invalid_json", body
    status, body = _raw(f"{url}/chat/completions", json.dumps(
        {"model": NAME, "messages": CHAT, "temperature": "hot"}).encode())
    assert status == 400 and body["error"]["param"] == "temperature", body
    status, body = _raw(f"{url}/completions", json.dumps({"model": NAME, "prompt": [1, 10**6]}).encode())
    assert status == 400 and body["error"]["param"] == "prompt", body


def _wait(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_disconnect_frees_pages(served):
    scheduler = served.runner.scheduler
    aborted = lambda: {rid for rid, reason in scheduler.aborts if reason == "abort"}  # noqa: E731
    stream = served.client.completions.create(model=NAME, prompt="Hello", max_tokens=500, temperature=0, stream=True,
                                              extra_body={"ignore_eos": True, "return_token_ids": True})
    seen = 0
    for chunk in stream:
        seen += len(chunk.choices[0].token_ids)
        if seen >= 2:
            break
    assert scheduler.free_pages < scheduler.total_pages
    stream.close()
    assert _wait(lambda: scheduler.free_pages == scheduler.total_pages)
    assert chunk.id in aborted()

    # not streaming: the client sends its request and hangs up while it runs
    before = set(aborted())
    conn = http.client.HTTPConnection(served.url.split("/")[2], timeout=10)
    conn.request("POST", "/v1/completions", json.dumps({"model": NAME, "prompt": "Hello", "max_tokens": 500,
                                                        "temperature": 0, "ignore_eos": True}),
                 {"Content-Type": "application/json"})
    assert _wait(lambda: scheduler.free_pages < scheduler.total_pages)
    conn.close()
    assert _wait(lambda: scheduler.free_pages == scheduler.total_pages) and len(aborted() - before) == 1


def test_no_tokenizer_serves_token_ids(model_dir, reference):
    model, tok, _ = load(str(model_dir), torch.float32, "cpu")
    runner = EngineRunner(Scheduler(model, max_batch=2), None)
    with serving(runner, "tiny") as url:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        out = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=5, temperature=0)
        assert out.choices[0].token_ids == reference([5, 6, 7], 5, eos=False) and out.choices[0].text == ""
        for call in (lambda: client.completions.create(model="tiny", prompt="Hi", max_tokens=5),
                     lambda: client.chat.completions.create(model="tiny", messages=CHAT)):
            with pytest.raises(openai.BadRequestError, match="no tokenizer"):
                call()


def test_cli_errors(monkeypatch, capsys):
    from onetrip.cli import main

    assert main(["serve", "no-such-model", "--port", "0"]) == 2
    assert capsys.readouterr().err.startswith("onetrip serve: --model 'no-such-model' is neither")
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # find_spec then says: not installed
    assert main(["serve", "tiny", "--port", "0", "--max-batch", "2"]) == 2
    assert "pip install 'onetrip[serve]'" in capsys.readouterr().err



def test_start_up_warm_up(capsys):
    """onetrip serve warms the scheduler up before it listens, and says how long it took."""
    from onetrip.serve.command import _warm_up

    scheduler = Scheduler(Model.random(get_config("tiny"), torch.float32, "cpu"), max_batch=2, max_seq=64)
    _warm_up(scheduler)
    err = capsys.readouterr().err
    assert "onetrip serve: warmed up in " in err and "(0 decode graphs captured)" in err
    assert not scheduler.has_unfinished() and scheduler.free_pages == scheduler.total_pages

@pytest.mark.gpu
def test_gpu_fused_graphs_on_the_engine_thread():
    """The fused backend and CUDA graphs run on the engine thread (its own current device):
    one request at a time matches the Scheduler driven here; four at once all finish and
    give their pages back."""
    model, mirror = (Model.random(get_config("tiny"), torch.float32, "cuda") for _ in range(2))
    model.backend = mirror.backend = "fused"
    prompts = [[1 + i, 2, 3, 4 + i] for i in range(4)]
    expected = []
    for i, prompt in enumerate(prompts):
        scheduler = Scheduler(mirror, max_batch=4)
        scheduler.add_request("r", prompt, SamplingParams(max_tokens=20, ignore_eos=True))
        outs = [out for _ in range(40) if scheduler.has_unfinished() for out in scheduler.step()]
        expected.append(outs[-1].token_ids)
    scheduler = Scheduler(model, max_batch=4)
    with serving(EngineRunner(scheduler, None), "tiny") as url:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)

        def complete(prompt):
            return client.completions.create(model="tiny", prompt=prompt, max_tokens=20, temperature=0,
                                             extra_body={"ignore_eos": True}).choices[0].token_ids

        assert [complete(p) for p in prompts] == expected
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert [len(ids) for ids in pool.map(complete, prompts)] == [20] * 4
        assert _wait(lambda: scheduler.free_pages == scheduler.total_pages)
