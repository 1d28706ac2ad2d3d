"""onetrip: fused Triton kernels for transformer inference and training, and tools that
show the seams between kernels.

    import onetrip
    y = onetrip.bias_gelu(x, bias)
    normed, h = onetrip.add_rms_norm(x, residual, weight, eps=1e-6)   # differentiable
    loss = onetrip.linear_cross_entropy(hidden, lm_head.weight, labels)
    opt = onetrip.optim.AdamW(model.parameters(), lr=1e-4)
    onetrip.patch(hf_model)    # a transformers Llama/Qwen model's training step on onetrip's ops
    llm = onetrip.LLM("tiny")  # continuous-batching generation (engine.llm)
    outs = llm.generate([[1, 2, 3]], onetrip.SamplingParams(temperature=0.7, max_tokens=32))

The ops are imported on first use, so that a program (the ``onetrip`` command, a test
session) can choose Triton's interpreter through ``TRITON_INTERPRET=1`` before any
kernel is defined.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_ENGINE = ("LLM", "SamplingParams")


def __getattr__(name: str):
    value = _resolve(name)
    globals()[name] = value  # later reads are plain attribute reads: this lookup costs ~3 us a call
    return value


def _resolve(name: str):
    if name == "optim":
        return importlib.import_module("onetrip.optim")
    if name in _ENGINE:
        return getattr(importlib.import_module("onetrip.engine"), name)
    if name in ("patch", "unpatch"):  # onetrip.patch is the module itself, callable as patch() (patch.py)
        module = importlib.import_module("onetrip.patch")
        return module if name == "patch" else module.unpatch
    ops = importlib.import_module("onetrip.ops")  # imported once, then served from sys.modules
    if name in ops.__all__:
        return getattr(ops, name)
    raise AttributeError(f"module 'onetrip' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + ["optim", "patch", "unpatch", *_ENGINE] + list(importlib.import_module("onetrip.ops").__all__))
