"""Hugging Face checkpoint directories <-> ``Model``.

    model = load_model("path/to/Llama-3.2-1B", dtype=torch.bfloat16, device="cuda")
    save_model(model, "out/")          # config.json + model.safetensors (or shards + index)

A directory holds ``config.json`` and either ``model.safetensors`` or shards listed in
``model.safetensors.index.json`` (its "weight_map": tensor name -> shard file). Checkpoint
tensor names are Hugging Face's (``model.layers.{i}.self_attn.q_proj.weight``, ...); q/k/v
are concatenated into ``attn.wqkv`` and gate/up into ``mlp.w_gate_up`` while loading, and
split again when saving. Every tensor's shape is checked against the config before use.
The tokenizer (``tokenizer.json``) is ``engine.tokenizer``'s.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .config import ModelConfig
from .fused import FusedOptions
from .llama import Model

PathLike = Union[str, os.PathLike]
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Stored by some exporters but recomputed here from the config.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def hf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Hugging Face checkpoint of ``config`` holds, with its shape."""
    c = config
    h, hd = c.hidden_size, c.head_dim
    q, kv = c.num_heads * hd, c.num_kv_heads * hd
    shapes = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (c.intermediate_size, h),
            p + "mlp.up_proj.weight": (c.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, c.intermediate_size),
        })
        if c.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if c.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
    return shapes


def fused_names(config: ModelConfig) -> dict[str, list[str]]:
    """``Model`` parameter name -> the Hugging Face tensors concatenated (along dim 0) into it."""
    out = {"embed.weight": ["model.embed_tokens.weight"], "norm": ["model.norm.weight"]}
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = ["lm_head.weight"]
    for i in range(config.num_layers):
        p, m = f"model.layers.{i}.", f"layers.{i}."
        a = p + "self_attn."
        out[m + "attn_norm"] = [p + "input_layernorm.weight"]
        out[m + "mlp_norm"] = [p + "post_attention_layernorm.weight"]
        out[m + "attn.wqkv.weight"] = [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"]
        out[m + "attn.wo.weight"] = [a + "o_proj.weight"]
        out[m + "mlp.w_gate_up.weight"] = [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
        out[m + "mlp.w_down.weight"] = [p + "mlp.down_proj.weight"]
        if config.attention_bias:
            out[m + "attn.wqkv.bias"] = [a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"]
        if config.qk_norm:
            out[m + "attn.q_norm"] = [a + "q_norm.weight"]
            out[m + "attn.k_norm"] = [a + "k_norm.weight"]
    return out


def _read_json(file: Path) -> dict:
    """The JSON object in ``file``; ValueError naming the file when it is not one."""
    try:
        with open(file) as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{str(file)!r} is not valid JSON ({exc}); the file is corrupt or truncated") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(file)!r} holds a JSON {type(data).__name__}, not an object")
    return data


def _hf_config(path: PathLike) -> tuple[Path, dict]:
    """(the directory, its config.json as a dict); FileNotFoundError for either missing."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} does not exist")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{str(path)!r} has no config.json (expected a Hugging Face model directory)")
    return path, _read_json(cfg_file)


def load_config(path: PathLike) -> ModelConfig:
    """``ModelConfig`` from ``path/config.json``. FileNotFoundError for a missing directory or
    file; ValueError naming the file for invalid JSON, a missing key or an unsupported model."""
    return _config(*_hf_config(path))


def _config(path: Path, hf: dict) -> ModelConfig:
    """``ModelConfig.from_hf(hf)``, its ValueError prefixed with the config file's path."""
    try:
        return ModelConfig.from_hf(hf)
    except ValueError as exc:
        raise ValueError(f"{str(path / 'config.json')!r}: {exc}") from None


def _open(file: Path):
    """``safe_open`` of one weights file; ValueError naming it when it cannot be read."""
    try:
        return safe_open(file, framework="pt")
    except SafetensorError as exc:
        raise ValueError(f"{str(file)!r} is not a readable safetensors file ({exc}): it is corrupt or truncated "
                         f"(an interrupted download?); fetch it again") from None


def _tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it."""
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{str(index)!r} has no 'weight_map' dict")
        files = {name: path / shard for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.is_file():
                raise FileNotFoundError(f"shard {shard.name!r} listed in {INDEX_FILE} is missing from {str(path)!r}")
        return files
    single = path / SINGLE_FILE
    if not single.is_file():
        raise FileNotFoundError(f"{str(path)!r} has neither {SINGLE_FILE} nor {INDEX_FILE}")
    with _open(single) as f:
        return {name: single for name in f.keys()}


@dataclass(frozen=True)
class Checkpoint:
    """A checked Hugging Face directory: its config, the dtype to load in, and the
    safetensors file of every tensor (``open_checkpoint``)."""

    path: Path
    config: ModelConfig
    dtype: torch.dtype
    files: dict[str, Path]


def open_checkpoint(path: PathLike, dtype: Optional[torch.dtype] = None) -> Checkpoint:
    """Read and check ``path``'s config.json and tensor list (no weights): ``load_model``'s
    checks and errors. dtype None: config.json's "torch_dtype" or "dtype", else float32."""
    path, hf = _hf_config(path)
    config = _config(path, hf)
    if dtype is None:
        # transformers < 5 writes "torch_dtype", >= 5 "dtype".
        name = hf.get("torch_dtype") or hf.get("dtype") or "float32"
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{str(path / 'config.json')!r}: torch_dtype {name!r} is not a torch dtype; "
                             f"pass dtype=")
    files = _tensor_files(path)
    expected = hf_shapes(config)
    missing = [n for n in expected if n not in files]
    if missing:
        raise ValueError(f"{str(path)!r}: {len(missing)} tensor(s) missing for {config.architecture} "
                         f"with {config.num_layers} layers, e.g. {missing[:3]}")
    unexpected = [n for n in files if n not in expected and not n.endswith(_IGNORED_SUFFIXES)
                  and not (n == "lm_head.weight" and config.tie_word_embeddings)]
    if unexpected:
        raise ValueError(f"{str(path)!r}: {len(unexpected)} unexpected tensor(s) for {config.architecture} "
                         f"with {config.num_layers} layers, e.g. {unexpected[:3]}")
    return Checkpoint(path, config, dtype, files)


@contextmanager
def checkpoint_slices(ckpt: Checkpoint) -> Iterator[dict]:
    """Hugging Face name -> a lazy safetensors slice of each tensor the config expects
    (``slice[lo:hi]``, ``slice[:, lo:hi]`` read just those bytes, memory-mapped), each
    shape-checked against the config (ValueError naming the tensor). Valid inside the
    ``with``: the files are closed after it."""
    expected = hf_shapes(ckpt.config)
    handles = {}
    try:
        slices = {}
        for name, shape in expected.items():
            file = ckpt.files[name]
            if file not in handles:
                handles[file] = _open(file).__enter__()
            sl = handles[file].get_slice(name)
            if tuple(sl.get_shape()) != shape:
                raise ValueError(f"tensor {name!r} in {file.name}: expected shape {shape} "
                                 f"from config.json, found {tuple(sl.get_shape())}")
            slices[name] = sl
        yield slices
    finally:
        for h in handles.values():
            h.__exit__(None, None, None)


@torch.no_grad()
def load_model(path: PathLike, dtype: Optional[torch.dtype] = None, device=None, *,
               fused_options: FusedOptions = FusedOptions()) -> Model:
    """Load a Hugging Face Llama/Qwen2/Qwen3 directory into a ``Model``.

    dtype: the parameters' dtype (default: config.json's "torch_dtype" or "dtype", else
    float32);
    device: where the parameters live (default CPU). Tensors are read one at a time
    (memory-mapped), cast and copied, so the host never holds the whole checkpoint.
    fused_options: the model's ``FusedOptions``. ``tp.load_model_tp`` reads one rank's
    slices of a tensor-parallel model instead.

    Raises FileNotFoundError for a missing directory, config or weights file; ValueError
    for an unreadable config or weights file (naming it), an unsupported architecture, a
    missing or unexpected tensor, or a tensor whose shape does not match the config
    (naming the tensor, expected and found shapes).
    """
    ckpt = open_checkpoint(path, dtype)
    with torch.device("meta"):
        model = Model(ckpt.config, ckpt.dtype, fused_options=fused_options)
    model = model.to_empty(device=device or "cpu")
    params = dict(model.named_parameters())
    with checkpoint_slices(ckpt) as slices:
        for target, sources in fused_names(ckpt.config).items():
            row = 0
            dst = params[target]
            for name in sources:
                t = slices[name][:]
                dst[row:row + t.shape[0]].copy_(t.to(ckpt.dtype))
                row += t.shape[0]
    return model.requires_grad_(False)


@torch.no_grad()
def hf_state_dict(model: Model) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face names, q/k/v and gate/up split back apart.
    The tensors are views of the model's parameters (no copy, same device); a tied LM
    head is not included."""
    shapes = hf_shapes(model.config)
    params = dict(model.named_parameters())
    tensors = {}
    for target, sources in fused_names(model.config).items():
        parts = params[target].detach().split([shapes[n][0] for n in sources], dim=0)
        tensors.update(zip(sources, parts))
    return tensors


def save_model(model: Model, path: PathLike, max_shard_bytes: Optional[int] = None) -> None:
    """Write ``model`` as a Hugging Face directory: config.json (with torch_dtype) and
    model.safetensors, or, when ``max_shard_bytes`` is given, shards of at most about that
    size named ``model-0000i-of-0000n.safetensors`` plus model.safetensors.index.json.
    q/k/v and gate/up are split back into separate tensors; a tied LM head is not stored."""
    config = model.config
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {n: t.cpu().contiguous() for n, t in hf_state_dict(model).items()}
    with open(path / "config.json", "w") as f:
        json.dump(config.to_hf(model.dtype), f, indent=2)

    if max_shard_bytes is None:
        save_file(tensors, path / SINGLE_FILE, metadata={"format": "pt"})
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, path / fname, metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(path / INDEX_FILE, "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
