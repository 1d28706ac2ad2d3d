"""``--model org/name[@revision]``: Hub ids resolved through the hub cache, offline.

The cache is laid out as huggingface_hub lays it out (models--org--name/refs/<branch> holding
a commit hash, snapshots/<commit>/<files>) under tmp_path; HF_HUB_CACHE points there and
HF_HUB_OFFLINE=1, so nothing reaches the network.
"""

import pytest
import torch
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models

from onetrip.engine.commands import check_model, load, model_source
from onetrip.models import Model, get_config, save_model
from onetrip.models.hub import HubId, hub_cache_dir, parse_hub_id, snapshot

TINY = get_config("tiny")
MAIN, V2 = "a" * 40, "b" * 40  # commit hashes


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A hub cache holding org/tiny-llama: branch main (one safetensors file and a
    tokenizer) and tag v2 (sharded weights, no tokenizer)."""
    root = tmp_path / "hub"
    repo = root / "models--org--tiny-llama"
    model = Model.random(TINY, seed=0)
    save_model(model, repo / "snapshots" / MAIN)
    save_model(model, repo / "snapshots" / V2, max_shard_bytes=200_000)  # 3 shards of the 430 kB
    vocab = {f"w{i}": i for i in range(TINY.vocab_size)}
    BackendTokenizer(models.WordLevel(vocab, unk_token="w0")).save(str(repo / "snapshots" / MAIN / "tokenizer.json"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)  # no newline: huggingface_hub reads the file as it is
    (repo / "refs" / "v2").write_text(V2)
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return root


def test_hub_id_forms():
    assert parse_hub_id("meta-llama/Llama-3.2-1B") == HubId("meta-llama/Llama-3.2-1B")
    assert parse_hub_id("Qwen/Qwen2.5-0.5B@refs/pr/1") == HubId("Qwen/Qwen2.5-0.5B", "refs/pr/1")
    for bad in ("tiny", "a/b/c", "/abs/path", "./rel", "org/", "org/name@", "org/-x", "org/a--b", "org/a..b"):
        assert parse_hub_id(bad) is None, bad


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert hub_cache_dir() == tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub_cache_dir() == tmp_path / "elsewhere"


@pytest.mark.parametrize("spec, commit, tokenizer", [
    ("org/tiny-llama", MAIN, True), ("org/tiny-llama@v2", V2, False), (f"org/tiny-llama@{MAIN}", MAIN, True)])
def test_load_from_the_cache_offline(cache, spec, commit, tokenizer):
    check_model(spec)
    assert snapshot(parse_hub_id(spec)) == cache / "models--org--tiny-llama" / "snapshots" / commit
    model, tok, label = load(spec, None, "cpu")
    assert model.config == TINY and label == "tiny-llama" and (tok is not None) == tokenizer
    expected = Model.random(TINY, seed=0)
    assert torch.equal(model.embed.weight, expected.embed.weight)
    assert torch.equal(model.layers[1].attn.wqkv.weight, expected.layers[1].attn.wqkv.weight)


def test_offline_and_not_cached_says_how_to_fetch(cache):
    for spec in ("org/other", "org/tiny-llama@v3"):
        for call in (check_model, lambda s: load(s, None, "cpu")):  # check_model fails before anything slow
            with pytest.raises(ValueError, match=rf"Hub model '{spec}' is not \(completely\) in the hub cache "
                                                 rf"'{cache}' and offline mode \(HF_HUB_OFFLINE=1\).*"
                                                 rf"`hf download {spec.split('@')[0]}"):
                call(spec)


def test_snapshot_without_safetensors(cache):
    repo = cache / "models--org--bin-only"
    save_model(Model.random(TINY, seed=0), repo / "snapshots" / MAIN)
    (repo / "snapshots" / MAIN / "model.safetensors").rename(repo / "snapshots" / MAIN / "pytorch_model.bin")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    with pytest.raises(ValueError, match="'org/bin-only' has neither model.safetensors nor "
                                         "model.safetensors.index.json.*no safetensors weights"):
        load("org/bin-only", None, "cpu")


def test_spec_forms(tmp_path, monkeypatch):
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    assert model_source("tiny") == "tiny"
    assert model_source("org/name@main") == HubId("org/name", "main")
    check_model("org/name")  # online: recognised, nothing fetched yet
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    for spec in ("org/name", "no-such-model", "a/b/c"):  # a local directory is never a Hub id
        with pytest.raises(ValueError, match=rf"--model '{spec}' is neither a directory with config.json nor a "
                                             r"preset; presets: llama-3.2-1b, .*; nor a Hugging Face Hub id "
                                             r"\(org/name or org/name@revision\)"):
            check_model(spec)
