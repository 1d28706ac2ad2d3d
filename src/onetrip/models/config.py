"""Model configuration: one frozen dataclass for Llama-family decoders, named presets,
reading and writing Hugging Face ``config.json`` dicts, and the rotary tables.

    cfg = get_config("llama-3.2-1b")            # or ModelConfig.from_hf(json.load(...))
    cos, sin = rope_tables(cfg, 4096, "cuda")   # (4096, head_dim // 2) float32 each

Covered families (``ModelConfig.architecture`` derives the name from the flags):

    LlamaForCausalLM   plain Llama 2/3 (optionally with Llama-3 "llama3" rope scaling)
    Qwen2ForCausalLM   Llama + biases on the q, k and v projections
    Qwen3ForCausalLM   Llama + RMSNorm of each q and k head before the rotary

A config.json option these do not implement (a sliding window, another rope scaling,
extra biases, quantization, ...) is refused by name (``unsupported_options``), never
ignored: ignoring it would run a different model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# config.json's "model_type" -> its architecture, for configs without "architectures".
MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# Keys config.json must have (everything else has a default).
REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3's "llama3" frequency scaling (Llama 3.1 and later).

    Wavelengths shorter than ``original_max_position_embeddings / high_freq_factor`` keep
    their frequency; longer than ``original / low_freq_factor`` are divided by ``factor``;
    in between, a linear blend in ``original / wavelength``.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of a Llama-family decoder (no weights).

    Projection shapes (out, in), as stored in Hugging Face checkpoints:
    q (num_heads * head_dim, hidden), k and v (num_kv_heads * head_dim, hidden),
    o (hidden, num_heads * head_dim), gate and up (intermediate, hidden),
    down (hidden, intermediate), embedding and LM head (vocab, hidden).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: Optional[RopeScaling] = None
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: biases on q, k, v (not on o)
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim of each q and k head
    max_position_embeddings: int = 8192

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for the rotary embedding, got {self.head_dim}")
        if self.attention_bias and self.qk_norm:
            raise ValueError("attention_bias with qk_norm (Qwen3 with q/k/v biases) is not supported")

    @property
    def architecture(self) -> str:
        """The Hugging Face architecture name these flags correspond to."""
        if self.qk_norm:
            return "Qwen3ForCausalLM"
        if self.attention_bias:
            return "Qwen2ForCausalLM"
        return "LlamaForCausalLM"

    @property
    def qkv_size(self) -> int:
        """Output width of the fused q/k/v projection: (num_heads + 2 num_kv_heads) head_dim."""
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    def num_parameters(self) -> int:
        """Parameter count; a tied embedding counts once."""
        h, hd = self.hidden_size, self.head_dim
        attn = h * self.qkv_size + self.num_heads * hd * h
        if self.attention_bias:
            attn += self.qkv_size
        if self.qk_norm:
            attn += 2 * hd
        layer = attn + 3 * h * self.intermediate_size + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_layers * layer + h + head

    # ---- Hugging Face config.json ------------------------------------------------------

    @classmethod
    def from_hf(cls, hf: dict) -> "ModelConfig":
        """Read a Hugging Face ``config.json`` dict (Llama, Qwen2 or Qwen3): the family from
        "architectures", or from "model_type" where there is none (as transformers does).
        Absent keys take the family's transformers defaults (Qwen3: head_dim 128).

        Raises ValueError naming the architecture, the missing key, or the option onetrip
        does not implement with its value and what is supported (``unsupported_options``).
        """
        arch = _architecture(hf)
        missing = [key for key in REQUIRED_KEYS if key not in hf]
        if missing:
            raise ValueError(f"{arch}: the config has no {', '.join(map(repr, missing))} "
                             f"(required: {', '.join(REQUIRED_KEYS)})")
        problems = unsupported_options(arch, hf)
        if problems:
            raise ValueError(f"{arch}: {'; '.join(problems)}")
        heads = hf["num_attention_heads"]
        theta, scaling = _rope(arch, hf)
        head_dim = hf.get("head_dim", _QWEN3_HEAD_DIM if arch == "Qwen3ForCausalLM" else None)
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=head_dim or hf["hidden_size"] // heads,
            rope_theta=theta,
            rope_scaling=scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=arch == "Qwen2ForCausalLM",  # Qwen2 always has q/k/v biases (and none on o)
            qk_norm=arch == "Qwen3ForCausalLM",
            max_position_embeddings=int(hf.get("max_position_embeddings", _MAX_POSITIONS[arch])),
        )

    def to_hf(self, torch_dtype: Optional[torch.dtype] = None) -> dict:
        """A ``config.json`` dict that ``from_hf`` (and transformers) read back to this config."""
        model_type = {arch: name for name, arch in MODEL_TYPES.items()}
        out = {
            "architectures": [self.architecture],
            "model_type": model_type[self.architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
        }
        if self.architecture != "Qwen2ForCausalLM":
            out["attention_bias"] = False
        else:
            out["use_sliding_window"] = False
        if self.rope_scaling is not None:
            out["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(self.rope_scaling)}
        if torch_dtype is not None:
            out["torch_dtype"] = str(torch_dtype).removeprefix("torch.")
        return out


def _architecture(hf: dict) -> str:
    """The supported architecture a config.json dict names; ValueError for any other."""
    archs = hf.get("architectures") or []
    if archs:
        if archs[0] not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"unsupported architecture {archs[0]!r} (config 'architectures' = {archs!r}); "
                             f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        return archs[0]
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"the config has no 'architectures' and its model_type {model_type!r} is not a supported "
                         f"family; supported: architectures {', '.join(SUPPORTED_ARCHITECTURES)} or model_type "
                         f"{', '.join(MODEL_TYPES)}")
    return MODEL_TYPES[model_type]


# transformers' defaults for keys a config.json may leave out.
_QWEN3_HEAD_DIM = 128  # Qwen3Config's head_dim, not hidden / heads
_MAX_POSITIONS = {"LlamaForCausalLM": 2048, "Qwen2ForCausalLM": 32768, "Qwen3ForCausalLM": 32768}
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor")


def _rope_parameters(hf: dict) -> dict:
    """The rotary settings as one flat dict: transformers >= 5 writes "rope_parameters" (with
    rope_theta inside, nested per layer type in some configs); older versions write
    "rope_theta" and "rope_scaling" at the top level."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ValueError(f"rope_parameters / rope_scaling must be a JSON object, got {rope!r}")
    if isinstance(rope.get("full_attention"), dict):  # nested per layer type; sliding layers are refused
        rope = rope["full_attention"]
    return dict(rope)


def unsupported_options(arch: str, hf: dict) -> list[str]:
    """One sentence per option of the config.json dict ``hf`` (architecture ``arch``) that
    onetrip does not implement, naming the option, its value and what is supported; empty
    when every option is implemented. The rules are transformers' meaning of each option
    for Llama, Qwen2 and Qwen3, shared by the three families."""
    problems = []
    if hf.get("use_sliding_window"):  # Qwen2/Qwen3: layers from max_window_layers on see a window
        problems.append(f"use_sliding_window=True is not supported (sliding_window={hf.get('sliding_window')!r}, "
                        f"max_window_layers={hf.get('max_window_layers')!r}); only full attention on every layer")
    other = {i: kind for i, kind in enumerate(hf.get("layer_types") or []) if kind != "full_attention"}
    if other:
        problems.append(f"layer_types has {len(other)} layer(s) of kind "
                        f"{', '.join(map(repr, sorted(set(other.values()))))} (the first is layer {min(other)}); "
                        f"only 'full_attention' is supported")
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):  # transformers maps both names to SiLU
        problems.append(f"hidden_act {act!r} is not supported, only 'silu'")
    if arch == "LlamaForCausalLM" and hf.get("mlp_bias"):  # Qwen2/Qwen3 MLPs have no biases whatever it says
        problems.append("mlp_bias=True is not supported (biases on gate, up and down); only MLPs without biases")
    if arch != "Qwen2ForCausalLM" and hf.get("attention_bias"):  # Qwen2 has q/k/v biases whatever it says
        problems.append(f"attention_bias=True is not supported (biases on q, k, v and o); {arch} runs without "
                        f"attention biases (Qwen2ForCausalLM: on q, k and v)")
    quant = hf.get("quantization_config")
    if quant:
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        problems.append(f"quantization_config (quant_method {method!r}) is not supported; only unquantized "
                        f"float32, float16 or bfloat16 weights")

    rope = _rope_parameters(hf)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "llama3"):
        problems.append(f"rope scaling type {kind!r} is not supported (only 'llama3' or none): {rope!r}")
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        problems.append(f"partial_rotary_factor={partial!r} is not supported; the rotary covers the whole "
                        f"head_dim (1.0)")
    if kind == "llama3":
        missing = [key for key in _LLAMA3_KEYS if key not in rope]
        if missing:
            problems.append(f"rope scaling 'llama3' has no {', '.join(map(repr, missing))} "
                            f"(required: {', '.join(_LLAMA3_KEYS)}): {rope!r}")
        elif not rope["low_freq_factor"] < rope["high_freq_factor"]:
            problems.append(f"rope scaling 'llama3' needs low_freq_factor < high_freq_factor, got "
                            f"{rope['low_freq_factor']!r} and {rope['high_freq_factor']!r}")
    return problems


def _rope(arch: str, hf: dict) -> tuple[float, Optional[RopeScaling]]:
    """(rope_theta, the llama3 scaling or None) of a config ``unsupported_options`` passed."""
    rope = _rope_parameters(hf)
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    if rope.get("rope_type", rope.get("type", "default")) != "llama3":
        return theta, None
    # transformers: a top-level original_max_position_embeddings wins; absent, max_position_embeddings.
    original = hf.get("original_max_position_embeddings",
                      rope.get("original_max_position_embeddings",
                               hf.get("max_position_embeddings", _MAX_POSITIONS[arch])))
    return theta, RopeScaling(float(rope["factor"]), float(rope["low_freq_factor"]),
                              float(rope["high_freq_factor"]), int(original))


_LLAMA3_1B_SCALING = RopeScaling(32.0, 1.0, 4.0, 8192)
_LLAMA3_8B_SCALING = RopeScaling(8.0, 1.0, 4.0, 8192)

# Numbers from the public config.json files of the Hugging Face repos
# meta-llama/Llama-3.2-1B, meta-llama/Llama-3.1-8B, meta-llama/Llama-3.1-70B, Qwen/Qwen2.5-0.5B,
# Qwen/Qwen2.5-7B.
PRESETS: dict[str, ModelConfig] = {
    "llama-3.2-1b": ModelConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
        num_kv_heads=8, head_dim=64, rope_theta=500000.0, rope_scaling=_LLAMA3_1B_SCALING,
        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=131072,
    ),
    "llama-3.1-8b": ModelConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
        num_kv_heads=8, head_dim=128, rope_theta=500000.0, rope_scaling=_LLAMA3_8B_SCALING,
        rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=131072,
    ),
    # meta-llama/Llama-3.1-70B: for tensor-parallel runs (140 GB of bf16 weights)
    "llama-3.1-70b": ModelConfig(
        vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64,
        num_kv_heads=8, head_dim=128, rope_theta=500000.0, rope_scaling=_LLAMA3_8B_SCALING,
        rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=131072,
    ),
    "qwen2.5-0.5b": ModelConfig(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
        num_kv_heads=2, head_dim=64, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, attention_bias=True, max_position_embeddings=32768,
    ),
    # max_position_embeddings: the base Qwen2.5-7B config says 131072 (the Instruct one
    # 32768, with YaRN for longer contexts); it only bounds what callers may ask for here.
    "qwen2.5-7b": ModelConfig(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
        num_kv_heads=4, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, attention_bias=True, max_position_embeddings=131072,
    ),
    # For CPU tests: the Llama code paths (GQA, untied head) at ~107k parameters.
    "tiny": ModelConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, max_position_embeddings=512,
    ),
}


def get_config(name: str) -> ModelConfig:
    """The preset called ``name`` (see ``PRESETS``)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}") from None


# ---- rotary tables ----------------------------------------------------------------------


def rope_frequencies(config: ModelConfig, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(head_dim // 2,) angular frequencies theta_i = rope_theta^(-2i / head_dim), with the
    llama3 scaling applied when ``config.rope_scaling`` is set; computed in float64."""
    half = config.head_dim // 2
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(half, dtype=torch.float64) * 2 / config.head_dim)
    s = config.rope_scaling
    if s is not None:
        wavelen = 2 * math.pi / inv_freq
        ratio = s.original_max_position_embeddings / wavelen  # periods in the original context
        # ratio <= low: long wavelengths, interpolated (/ factor); >= high: short, kept.
        smooth = ((ratio - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)).clamp(0.0, 1.0)
        inv_freq = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
    return inv_freq.to(dtype)


def rope_tables(config: ModelConfig, max_pos: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Compact cos and sin tables, each (max_pos, head_dim // 2) float32:
    ``cos[p, i] = cos(p * theta_i)``, the layout ``apply_rotary`` and ``append_kv`` take.

    Frequencies and angles are formed in float64 and rounded once: Hugging Face's float32
    ``p * theta_i`` is off by up to ~p * 6e-8 radians (3e-6 at p = 1000, 0.5 rad at 2**23);
    these tables are within 6e-8 of the exact values at every position."""
    inv_freq = rope_frequencies(config, torch.float64)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().to(torch.float32).to(device), angles.sin().to(torch.float32).to(device)
