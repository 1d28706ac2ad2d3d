"""A Hugging Face transformers model on the same weights as an onetrip ``Model``, without a copy.

    ref = to_transformers(model)    # LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM

The benchmarks compare transformers' own decoding with onetrip's on identical weights;
an 8B checkpoint cannot be held twice, so transformers' parameters are views of onetrip's
fused q/k/v and gate/up matrices (split along their rows, which keeps each view
contiguous). Changing one model's weights changes the other's.
"""

from __future__ import annotations

import torch

from .llama import Model
from .loader import hf_state_dict


def to_transformers(model: Model, attn_implementation: str = "sdpa"):
    """transformers' ``*ForCausalLM`` for ``model.config`` whose parameters are views of
    ``model``'s (same device and dtype), in eval mode. Needs ``transformers``."""
    import transformers

    hf = model.config.to_hf(model.dtype)
    hf.pop("architectures", None)
    config = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
    config._attn_implementation = attn_implementation
    with torch.device("meta"):
        ref = transformers.AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    missing, unexpected = ref.load_state_dict(hf_state_dict(model), strict=False, assign=True)
    missing = [n for n in missing if not (n == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"weights do not map onto {type(ref).__name__}: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    if model.config.tie_word_embeddings:
        ref.lm_head.weight = ref.model.embed_tokens.weight
    # Buffers (the rotary inv_freq) were created on the meta device: build those modules anew.
    for parent in list(ref.modules()):
        for child_name, child in list(parent.named_children()):
            if hasattr(child, "inv_freq"):
                setattr(parent, child_name, type(child)(ref.config).to(model.device))
    return ref.to(model.device).eval()


def decode_stepper(hf, ids: torch.Tensor):
    """A zero-argument callable that runs one greedy decode step of a transformers causal
    LM on ``ids`` (batch, prompt) with its dynamic KV cache: the first call prefills, each
    call after it feeds the last token. For profilers (``onetrip profile --model X
    --backend transformers``, ``bench decode``'s kernel count); the cache grows with each
    call."""
    state = {}

    @torch.no_grad()
    def step():
        if "past" not in state:
            o = hf(ids, use_cache=True)
        else:
            o = hf(state["tok"], past_key_values=state["past"], use_cache=True)
        state["past"], state["tok"] = o.past_key_values, o.logits[:, -1:].argmax(-1)

    return step
