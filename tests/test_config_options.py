"""config.json options: each one onetrip does not implement is refused by name, with its value
and what is supported; each one it implements is read as transformers reads it.

Tiny config dicts, no weights: the refusals happen in ``ModelConfig.from_hf``, which
``load_model``, ``load_model_tp`` and ``onetrip generate --model`` all go through.
"""

import pytest

from onetrip.models import ModelConfig, RopeScaling

SHAPE = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}
FAMILIES = {
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **SHAPE},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **SHAPE},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **SHAPE, "head_dim": 16},
}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
SLIDING = {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 0}


def _config(family: str, change: dict) -> dict:
    """The family's dict with ``change`` applied; a None value (nested too) removes the key."""
    def drop_none(d):
        return {k: drop_none(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}
    return drop_none({**FAMILIES[family], **change})


REFUSED = [  # (family, options, the message)
    ("qwen3", SLIDING, r"Qwen3ForCausalLM: use_sliding_window=True is not supported \(sliding_window=4096, "
                       r"max_window_layers=0\); only full attention on every layer"),
    ("qwen2", SLIDING, r"Qwen2ForCausalLM: use_sliding_window=True is not supported"),
    ("qwen3", {"layer_types": ["full_attention", "sliding_attention"]},
     r"Qwen3ForCausalLM: layer_types has 1 layer\(s\) of kind 'sliding_attention' \(the first is layer 1\); "
     r"only 'full_attention' is supported"),
    ("llama", {"layer_types": ["chunked_attention"] * 2}, r"of kind 'chunked_attention' \(the first is layer 0\)"),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     r"LlamaForCausalLM: rope scaling type 'linear' is not supported \(only 'llama3' or none\)"),
    ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
     r"rope scaling type 'dynamic' is not supported"),
    ("qwen2", {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
     r"Qwen2ForCausalLM: rope scaling type 'yarn' is not supported"),
    ("qwen3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e6}},
     r"rope scaling type 'longrope' is not supported"),
    ("llama", {"partial_rotary_factor": 0.5}, r"partial_rotary_factor=0.5 is not supported; the rotary covers "
                                              r"the whole head_dim \(1.0\)"),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     r"rope scaling 'llama3' has no 'low_freq_factor', 'high_freq_factor'"),
    ("llama", {"rope_scaling": {**LLAMA3, "low_freq_factor": 4.0}},
     r"llama3' needs low_freq_factor < high_freq_factor, got 4.0 and 4.0"),
    ("llama", {"attention_bias": True}, r"LlamaForCausalLM: attention_bias=True is not supported \(biases on q, "
                                        r"k, v and o\); LlamaForCausalLM runs without attention biases"),
    ("qwen3", {"attention_bias": True}, r"Qwen3ForCausalLM: attention_bias=True is not supported"),
    ("llama", {"mlp_bias": True}, r"mlp_bias=True is not supported \(biases on gate, up and down\)"),
    ("qwen2", {"hidden_act": "gelu_pytorch_tanh"}, r"hidden_act 'gelu_pytorch_tanh' is not supported, only 'silu'"),
    ("llama", {"quantization_config": {"quant_method": "awq", "bits": 4}},
     r"quantization_config \(quant_method 'awq'\) is not supported; only unquantized"),
    ("llama", {"head_dim": 15}, r"head_dim must be even for the rotary embedding, got 15"),
    ("llama", {"num_key_value_heads": 3}, r"num_heads \(4\) must be a multiple of num_kv_heads \(3\)"),
    ("qwen3", {"architectures": ["Qwen3MoeForCausalLM"]}, r"unsupported architecture 'Qwen3MoeForCausalLM'"),
    ("qwen3", {"architectures": None, "model_type": "qwen3_moe"}, r"model_type 'qwen3_moe' is not a supported"),
]


@pytest.mark.parametrize("family, change, message", REFUSED)
def test_refused(family, change, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(_config(family, change))


def test_every_refusal_is_named():
    with pytest.raises(ValueError, match=r"LlamaForCausalLM: mlp_bias=True .*; attention_bias=True .*; "
                                         r"rope scaling type 'yarn'"):
        ModelConfig.from_hf(_config("llama", {"attention_bias": True, "mlp_bias": True,
                                              "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}))


IMPLEMENTED = [  # (family, options, the fields they set)
    ("llama", {}, {"head_dim": 16, "rope_theta": 10000.0, "rope_scaling": None, "rms_norm_eps": 1e-6,
                   "tie_word_embeddings": False, "max_position_embeddings": 2048}),  # transformers' defaults
    ("qwen2", {}, {"attention_bias": True, "max_position_embeddings": 32768}),
    ("qwen3", {"head_dim": None}, {"head_dim": 128, "qk_norm": True}),  # Qwen3Config's head_dim: 128
    ("llama", {"head_dim": 32}, {"head_dim": 32}),  # heads x head_dim need not equal hidden
    ("llama", {"tie_word_embeddings": True}, {"tie_word_embeddings": True}),
    ("llama", {"rope_theta": 5e5, "rope_scaling": LLAMA3}, {"rope_theta": 5e5,
                                                            "rope_scaling": RopeScaling(8.0, 1.0, 4.0, 8192)}),
    ("llama", {"rope_parameters": {**LLAMA3, "original_max_position_embeddings": None, "rope_theta": 5e5},
               "max_position_embeddings": 4096},
     {"rope_theta": 5e5, "rope_scaling": RopeScaling(8.0, 1.0, 4.0, 4096)}),  # original: max_position_embeddings
    ("qwen3", {"layer_types": ["full_attention"] * 2,
               "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6}}},
     {"rope_theta": 1e6, "rope_scaling": None}),  # nested per layer type
    ("qwen2", {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 1}, {}),
    ("qwen2", {"attention_bias": False, "mlp_bias": True}, {"attention_bias": True}),  # Qwen2 ignores both
    ("llama", {"hidden_act": "swish", "pretraining_tp": 2, "attention_dropout": 0.1}, {}),  # same math at inference
]


@pytest.mark.parametrize("family, change, fields", IMPLEMENTED)
def test_implemented(family, change, fields):
    config = ModelConfig.from_hf(_config(family, change))
    assert {name: getattr(config, name) for name in fields} == fields
