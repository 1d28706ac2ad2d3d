"""onetrip.models on the CPU: configs and presets, rotary tables, the eager decoder with
its KV cache, and Hugging Face checkpoint round trips (against transformers when it is
installed)."""

import dataclasses
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from onetrip.testing import assert_close
from onetrip.models import (
    PRESETS, Model, ModelConfig, RopeScaling, get_config, greedy_generate, load_model, rope_tables, save_model,
)

TINY = get_config("tiny")
# The families' distinguishing paths at tiny size: Llama-3 rope scaling + tied head,
# Qwen2's q/k/v biases, Qwen3's q/k norms, and multi-query attention (1 kv head).
VARIANTS = {
    "llama": TINY,
    "llama3-tied": dataclasses.replace(TINY, tie_word_embeddings=True, rope_theta=500000.0,
                                       rope_scaling=RopeScaling(8.0, 1.0, 4.0, 64)),
    "qwen2": dataclasses.replace(TINY, attention_bias=True, rope_theta=1e6, rms_norm_eps=1e-6),
    "qwen3": dataclasses.replace(TINY, qk_norm=True, num_kv_heads=1, head_dim=32, rms_norm_eps=1e-6),
}


# ---- configs ------------------------------------------------------------------------------

# Published sizes: Llama 3.2 1B "1.23B", Llama 3.1 8B "8.03B", Qwen2.5-0.5B "0.49B",
# Qwen2.5-7B "7.61B" (tied embeddings counted once).
@pytest.mark.parametrize("name, expected", [
    ("llama-3.2-1b", 1.236e9), ("llama-3.1-8b", 8.03e9), ("qwen2.5-0.5b", 0.494e9), ("qwen2.5-7b", 7.616e9),
])
def test_preset_parameter_counts(name, expected):
    config = get_config(name)
    assert config.num_parameters() == pytest.approx(expected, rel=0.005)
    with torch.device("meta"):  # construct without memory
        model = Model(config, torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == config.num_parameters()


def test_presets_shapes():
    assert set(PRESETS) >= {"llama-3.2-1b", "llama-3.1-8b", "qwen2.5-0.5b", "qwen2.5-7b", "tiny"}
    c = get_config("llama-3.2-1b")
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (16, 2048, 32, 8, 64)
    assert c.tie_word_embeddings and c.rope_scaling == RopeScaling(32.0, 1.0, 4.0, 8192)
    assert get_config("qwen2.5-0.5b").architecture == "Qwen2ForCausalLM"
    with pytest.raises(ValueError, match="unknown model preset 'llama-9'"):
        get_config("llama-9")
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        dataclasses.replace(TINY, num_kv_heads=3)


LLAMA_32_1B_JSON = {  # the fields of meta-llama/Llama-3.2-1B's config.json that matter
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "hidden_act": "silu", "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True, "max_position_embeddings": 131072, "attention_bias": False, "mlp_bias": False,
}
QWEN25_05B_JSON = {  # Qwen/Qwen2.5-0.5B: no head_dim field (hidden / heads = 64)
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
    "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "hidden_act": "silu", "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "tie_word_embeddings": True,
    "max_position_embeddings": 32768, "use_sliding_window": False, "sliding_window": 32768,
}

QWEN3_JSON = {**QWEN25_05B_JSON, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 128,
              "attention_bias": False, "layer_types": ["full_attention"] * 24}


def test_from_hf_matches_presets():
    assert ModelConfig.from_hf(LLAMA_32_1B_JSON) == get_config("llama-3.2-1b")
    assert ModelConfig.from_hf(QWEN25_05B_JSON) == get_config("qwen2.5-0.5b")
    # transformers >= 5 nests theta and scaling in "rope_parameters".
    v5 = {k: v for k, v in LLAMA_32_1B_JSON.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {**LLAMA_32_1B_JSON["rope_scaling"], "rope_theta": 500000.0}
    assert ModelConfig.from_hf(v5) == get_config("llama-3.2-1b")
    qwen3 = ModelConfig.from_hf(QWEN3_JSON)
    assert qwen3.qk_norm and not qwen3.attention_bias and qwen3.head_dim == 128


@pytest.mark.parametrize("config", list(PRESETS.values()) + list(VARIANTS.values()))
def test_to_hf_round_trip(config):
    assert ModelConfig.from_hf(json.loads(json.dumps(config.to_hf(torch.bfloat16)))) == config


@pytest.mark.parametrize("change, message", [
    ({"architectures": ["MistralForCausalLM"]}, "unsupported architecture 'MistralForCausalLM'"),
    ({"architectures": [], "model_type": "mistral"}, "no 'architectures' and its model_type 'mistral'"),
    ({"architectures": None, "model_type": None}, "no 'architectures' and its model_type None"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling type 'yarn'"),
    ({"attention_bias": True}, "attention_bias=True"),
    ({"num_attention_heads": None}, "LlamaForCausalLM: the config has no 'num_attention_heads'"),
])
def test_from_hf_rejects(change, message):
    hf = {k: v for k, v in {**LLAMA_32_1B_JSON, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(hf)


@pytest.mark.parametrize("base", [LLAMA_32_1B_JSON, QWEN25_05B_JSON, QWEN3_JSON])
def test_from_hf_reads_model_type_without_architectures(base):
    """transformers picks the class from model_type when "architectures" is absent."""
    bare = {k: v for k, v in base.items() if k != "architectures"}
    assert ModelConfig.from_hf(bare) == ModelConfig.from_hf(base)


@pytest.mark.parametrize("base", [QWEN25_05B_JSON, QWEN3_JSON])
@pytest.mark.parametrize("change, message", [
    ({"use_sliding_window": True}, "use_sliding_window=True is not supported"),
    ({"layer_types": ["full_attention"] * 20 + ["sliding_attention"] * 4},
     "layer_types has 4 layer.s. of kind 'sliding_attention' .the first is layer 20."),
])
def test_from_hf_rejects_sliding_window(base, change, message):
    """Sliding-window layers attend over a window, not the whole context: refused, not run wrong."""
    arch = base["architectures"][0]
    with pytest.raises(ValueError, match=f"{arch}: {message}"):
        ModelConfig.from_hf({**base, **change})


# ---- rotary tables --------------------------------------------------------------------------

def _llama3_frequency(theta, i, head_dim, s: RopeScaling):
    """Llama-3 scaling of one frequency, written out branch by branch in float64."""
    freq = theta ** (-2 * i / head_dim)
    wavelen = 2 * math.pi / freq
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    if wavelen < high_wavelen:
        return freq
    if wavelen > low_wavelen:
        return freq / s.factor
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    return (1 - smooth) * freq / s.factor + smooth * freq


@pytest.mark.parametrize("name", ["llama-3.2-1b", "llama-3.1-8b", "qwen2.5-0.5b", "tiny"])
def test_rope_tables(name):
    config = get_config(name)
    max_pos, half = 131072, config.head_dim // 2
    cos, sin = rope_tables(config, max_pos, "cpu")
    assert cos.shape == sin.shape == (max_pos, half) and cos.dtype == sin.dtype == torch.float32
    s = config.rope_scaling
    freqs = [config.rope_theta ** (-2 * i / config.head_dim) if s is None else
             _llama3_frequency(config.rope_theta, i, config.head_dim, s) for i in range(half)]
    for p in (0, 1, 17, 999, 131071):
        want = torch.tensor([p * f for f in freqs], dtype=torch.float64)
        torch.testing.assert_close(cos[p].double(), want.cos(), atol=1e-7, rtol=0)
        torch.testing.assert_close(sin[p].double(), want.sin(), atol=1e-7, rtol=0)
    if s is not None:  # all three regimes occur at these sizes: kept, blended, divided
        base = [config.rope_theta ** (-2 * i / config.head_dim) for i in range(half)]
        ratio = [f / b for f, b in zip(freqs, base)]
        assert ratio[0] == 1 and ratio[-1] == pytest.approx(1 / s.factor)
        assert any(1 / s.factor + 1e-6 < r < 1 - 1e-6 for r in ratio)


# ---- the decoder and its KV cache ----------------------------------------------------------

@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_then_decode_matches_full_forward(variant):
    """Prefill 5 tokens, then 1 token at a time, then a chunk of 3: the same logits as one
    causal forward of the whole sequences (fp32)."""
    model = Model.random(VARIANTS[variant], torch.float32, "cpu", seed=1)
    tokens = torch.randint(0, TINY.vocab_size, (3, 12), generator=torch.Generator().manual_seed(2))
    full = model(tokens)  # (3, 12, vocab), no cache
    model.setup_cache(3, 16)
    seqlens = torch.zeros(3, dtype=torch.int32)
    steps = []
    for lo, hi in [(0, 5)] + [(i, i + 1) for i in range(5, 9)] + [(9, 12)]:
        steps.append(model(tokens[:, lo:hi], seqlens))
        seqlens += hi - lo
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert full.abs().max() > 0.1  # not trivially zero


def test_decode_with_different_lengths_per_sequence():
    """One call where sequence 0 starts over at position 0 and sequence 1 continues at 3:
    each row must see only its own cached prefix."""
    model = Model.random(TINY, torch.float32, "cpu", seed=3)
    tokens = torch.randint(0, TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(4))
    model.setup_cache(2, 8)
    model(tokens[:, :3], torch.zeros(2, dtype=torch.int32))
    fresh = torch.randint(0, TINY.vocab_size, (4,), generator=torch.Generator().manual_seed(5))
    chunk = torch.stack([fresh, tokens[1, 3:7]])  # (2, 4)
    out = model(chunk, torch.tensor([0, 3], dtype=torch.int32))
    model.reset_cache()
    torch.testing.assert_close(out[0], model(fresh[None])[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1], model(tokens[1:, :7])[0, 3:], atol=1e-5, rtol=1e-5)
    # Without a cache, cache_seqlens gives start positions: a shifted sequence differs.
    assert not torch.allclose(model(fresh[None], torch.tensor([2])), model(fresh[None]))


def test_forward_argument_errors():
    model = Model.random(TINY, seed=0)
    with pytest.raises(ValueError, match="tokens must be .batch, seq. integer ids, got .5,."):
        model(torch.zeros(5, dtype=torch.long))
    model.setup_cache(2, 8)
    with pytest.raises(ValueError, match="pass cache_seqlens"):
        model(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"cache_seqlens must be \(2,\) integers"):
        model(torch.zeros(2, 2, dtype=torch.long), torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="do not fit the KV cache of batch 2 and max_seq 8"):
        model(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, dtype=torch.int32))


def test_greedy_decode_is_deterministic_and_matches_recompute():
    model = Model.random(VARIANTS["qwen2"], torch.float32, "cpu", seed=6)
    prompt = torch.randint(0, TINY.vocab_size, (2, 4), generator=torch.Generator().manual_seed(7))
    first = greedy_generate(model, prompt, 32)
    assert first.shape == (2, 32)
    assert torch.equal(greedy_generate(model, prompt, 32), first)
    model.reset_cache()
    seq = prompt
    for _ in range(32):  # no cache: recompute the whole sequence every step
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(seq[:, 4:], first)


def test_random_is_seeded():
    a, b = Model.random(TINY, seed=0), Model.random(TINY, seed=0)
    c = Model.random(TINY, seed=1)
    tokens = torch.arange(10)[None]
    assert torch.equal(a(tokens), b(tokens)) and not torch.equal(a(tokens), c(tokens))
    bf16 = Model.random(TINY, torch.bfloat16, seed=0)
    assert bf16.dtype == torch.bfloat16 and bf16(tokens).dtype == torch.bfloat16


# ---- checkpoints ---------------------------------------------------------------------------

@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("shard", [None, 20_000])
def test_save_load_round_trip(tmp_path, variant, shard):
    model = Model.random(VARIANTS[variant], torch.float32, "cpu", seed=8)
    save_model(model, tmp_path, max_shard_bytes=shard)
    if shard:
        assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
        assert (tmp_path / "model.safetensors.index.json").is_file()
    loaded = load_model(tmp_path)
    assert loaded.config == model.config and loaded.dtype == torch.float32
    tokens = torch.randint(0, TINY.vocab_size, (2, 7), generator=torch.Generator().manual_seed(9))
    assert torch.equal(loaded(tokens), model(tokens))


def test_load_casts_and_keeps_dtype(tmp_path):
    save_model(Model.random(VARIANTS["llama3-tied"], torch.bfloat16, seed=0), tmp_path)
    names = load_file(tmp_path / "model.safetensors").keys()
    assert "lm_head.weight" not in names and "model.layers.1.self_attn.q_proj.weight" in names
    assert load_model(tmp_path).dtype == torch.bfloat16  # config.json's torch_dtype
    assert load_model(tmp_path, dtype=torch.float32).dtype == torch.float32
    hf = json.loads((tmp_path / "config.json").read_text())
    hf["dtype"] = hf.pop("torch_dtype")  # transformers >= 5 spelling
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert load_model(tmp_path).dtype == torch.bfloat16
    (tmp_path / "config.json").write_text(json.dumps({**hf, "dtype": "float8"}))
    with pytest.raises(ValueError, match="torch_dtype 'float8' is not a torch dtype"):
        load_model(tmp_path)


def _saved(tmp_path, config=TINY):
    save_model(Model.random(config, seed=0), tmp_path)
    return load_file(tmp_path / "model.safetensors")


def test_bad_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path)
    tensors = _saved(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor"):
        load_model(tmp_path)
    hf = TINY.to_hf()
    (tmp_path / "config.json").write_text(json.dumps({**hf, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        n: "model-00001-of-00001.safetensors" for n in tensors}}))
    with pytest.raises(FileNotFoundError, match="shard 'model-00001-of-00001.safetensors'"):
        load_model(tmp_path)


@pytest.mark.parametrize("shard", [None, 20_000])
def test_truncated_weights_named(tmp_path, shard):
    """A weights file cut short (an interrupted download) or overwritten: a ValueError naming it."""
    save_model(Model.random(TINY, seed=0), tmp_path, max_shard_bytes=shard)
    file = sorted(tmp_path.glob("model*.safetensors"))[-1]
    data = file.read_bytes()
    for broken in (data[: len(data) // 2], b"<html>not found</html>", b""):
        file.write_bytes(broken)
        with pytest.raises(ValueError, match=f"'{file}' is not a readable safetensors file.*corrupt or truncated"):
            load_model(tmp_path)


def test_bad_config_json_named(tmp_path):
    """Invalid JSON, a missing key, an unsupported option: each error names config.json."""
    save_model(Model.random(TINY, seed=0), tmp_path)
    cfg = tmp_path / "config.json"
    hf = json.loads(cfg.read_text())
    cfg.write_text(json.dumps(hf)[:40])
    with pytest.raises(ValueError, match=f"'{cfg}' is not valid JSON"):
        load_model(tmp_path)
    cfg.write_text(json.dumps({k: v for k, v in hf.items() if k != "num_attention_heads"}))
    with pytest.raises(ValueError, match=f"'{cfg}': LlamaForCausalLM: the config has no 'num_attention_heads'"):
        load_model(tmp_path)
    cfg.write_text(json.dumps([hf]))
    with pytest.raises(ValueError, match=f"'{cfg}' holds a JSON list, not an object"):
        load_model(tmp_path)
    qwen3 = dataclasses.replace(TINY, qk_norm=True).to_hf()
    cfg.write_text(json.dumps({**qwen3, "use_sliding_window": True}))
    with pytest.raises(ValueError, match=f"'{cfg}': Qwen3ForCausalLM: use_sliding_window=True"):
        load_model(tmp_path)
    cfg.write_text(json.dumps({k: v for k, v in hf.items() if k != "architectures"}))  # model_type "llama"
    assert load_model(tmp_path).config == TINY


def test_bad_tensors(tmp_path):
    tensors = _saved(tmp_path)
    name = "model.layers.1.self_attn.k_proj.weight"
    save_file({**tensors, name: torch.zeros(16, 64)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"'model.layers.1.self_attn.k_proj.weight'.*expected shape "
                                         r"\(32, 64\).*found \(16, 64\)"):
        load_model(tmp_path)
    save_file({n: t for n, t in tensors.items() if n != name}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="1 tensor.s. missing.*k_proj"):
        load_model(tmp_path)
    save_file({**tensors, "model.layers.2.mlp.up_proj.weight": torch.zeros(1)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="unexpected tensor.*layers.2.mlp.up_proj"):
        load_model(tmp_path)
    # A config with more layers than the weights: missing tensors, named.
    (tmp_path / "config.json").write_text(json.dumps(dataclasses.replace(TINY, num_layers=3).to_hf()))
    with pytest.raises(ValueError, match="missing.*model.layers.2"):
        load_model(tmp_path)


# ---- against transformers (only when it is installed) ---------------------------------------

@pytest.mark.parametrize("variant", list(VARIANTS))
def test_matches_transformers(tmp_path, variant):
    transformers = pytest.importorskip("transformers")
    model = Model.random(VARIANTS[variant], torch.float32, "cpu", seed=10)
    save_model(model, tmp_path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    assert type(ref).__name__ == model.config.architecture
    tokens = torch.randint(0, TINY.vocab_size, (2, 40), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        want = ref(tokens).logits
    torch.testing.assert_close(model(tokens), want, atol=2e-5, rtol=1e-4)

    # A directory written by transformers (its own config.json format) loads here.
    ref.save_pretrained(tmp_path / "hf")
    assert torch.equal(load_model(tmp_path / "hf", torch.float32)(tokens), model(tokens))

    # bf16: no further from the fp32 logits than transformers' own bf16 run (onetrip's rule).
    ours = load_model(tmp_path, dtype=torch.bfloat16)
    with torch.no_grad():
        theirs = ref.to(torch.bfloat16)(tokens).logits  # .to() is in place: done last
    assert_close(f"{variant} bf16 logits", ours(tokens), want, theirs, atol=1e-3)


def test_starts_must_match_the_batch():
    """Model.forward's host copy of the cached lengths: one int >= 0 a sequence, else ValueError."""
    model = Model.random(TINY, torch.float32, "cpu", seed=0)
    model.setup_cache(2, 16)
    tokens, lens = torch.ones(2, 3, dtype=torch.int64), torch.zeros(2, dtype=torch.int32)
    for bad in ([0], [0, -1], [0, 1.0]):
        with pytest.raises(ValueError, match="starts must be 2 ints >= 0"):
            model(tokens, lens, starts=bad)
    assert model(tokens, lens, starts=[0, 0]).shape == (2, 3, TINY.vocab_size)
