"""onetrip's differentiable ops inside a Hugging Face Llama, Qwen2 or Qwen3 model, per instance.

    model = transformers.AutoModelForCausalLM.from_pretrained(...)
    onetrip.patch(model)                     # every replacement; each one can be turned off
    loss = model(input_ids, attention_mask=mask, labels=labels).loss   # .logits is None
    onetrip.unpatch(model)                   # the model's own forwards again, bit for bit

What is replaced (keyword: what runs instead):
  * ``rms_norm``: every RMSNorm (``rms_norm``; Qwen3's q/k norms too), and in each decoder
    layer ``residual + attention output`` then ``post_attention_layernorm`` as one
    ``add_rms_norm``.
  * ``swiglu``: the MLP's ``act(gate) * up`` (``silu_mul``); the three projections stay.
  * ``rope``: ``apply_rotary_pos_emb`` (``apply_rotary``) on transformers' own cos/sin, so
    every rope type (default, linear, dynamic, yarn, llama3, ...) rotates as transformers has it.
  * ``attention``: the attention function (``flash_attention``, registered in transformers'
    ``AttentionInterface`` as "onetrip"). A 2-D padding mask becomes varlen segments over the
    (batch * seq) tokens, three a row (pads before, the tokens, pads after: no gather, no copy);
    packed rows (position ids restarting, no mask, as ``DataCollatorWithFlattening`` makes them)
    become one segment per sequence; else causal. Either costs one host sync a forward.
    Qwen2/3 sliding-window layers take flash_attention's window.
  * ``loss`` (``*ForCausalLM``): with labels, the loss is ``linear_cross_entropy`` of the last
    hidden states, the lm_head weight and the labels shifted as transformers shifts them
    (``ignore_index``, ``shift_labels`` and ``num_items_in_batch`` honoured), and ``logits`` is
    None: the (tokens, vocab) logits are never made. Without labels the forward is the model's own.

Forwards are replaced on the instances (an attribute ``forward`` bound to the module); the
parameters, buffers and module tree are untouched and ``model._onetrip_patch`` records what to
restore. Patching a patched model raises. What cannot be honoured is refused with an error,
never run differently: an unsupported class (TypeError), a non-SiLU MLP, attention dropout in
training, ``output_attentions``, a static (compileable) KV cache, a padding mask with a gap
inside a row, partial rotary, a sliding window whose cache was trimmed. docs/patch.md has the
details and where the memory goes.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import types
from dataclasses import dataclass, fields
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from .ops import add_rms_norm, apply_rotary, flash_attention, linear_cross_entropy, rms_norm, silu_mul

ATTENTION_NAME = "onetrip"  # the name registered in transformers' AttentionInterface
_PLAN_KEY = "onetrip_attention_plan"  # the forward keyword that carries the batch's segments to each layer
_RECORD = "_onetrip_patch"

# family: (transformers module, class prefix)
_FAMILIES = {
    "llama": ("transformers.models.llama.modeling_llama", "Llama"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2"),
    "qwen3": ("transformers.models.qwen3.modeling_qwen3", "Qwen3"),
}
SUPPORTED = tuple(f"{p}{kind}" for _, p in _FAMILIES.values() for kind in ("ForCausalLM", "Model"))


@dataclass(frozen=True)
class PatchOptions:
    """Which replacements ``patch`` made (module docstring)."""

    rms_norm: bool = True
    swiglu: bool = True
    rope: bool = True
    attention: bool = True
    loss: bool = True


@dataclass(frozen=True)
class PatchRecord:
    """``model._onetrip_patch``: the options, each patched module with the bound forward set on
    it (before, it had none of its own: the class's ran), and each config of the model with its
    attention implementation before (empty when attention was not patched)."""

    options: PatchOptions
    forwards: tuple
    attn_implementations: tuple = ()


class _Plan(NamedTuple):
    """The batch's attention layout, made once a forward (``_base_forward``) and passed to every
    layer. cu_seqlens None: dense causal. Else int32 segment offsets into the flattened
    (batch * seq) query and (batch * kv_len) key tokens; max_seqlen_* bound every segment."""

    cu_seqlens_q: Optional[torch.Tensor]
    cu_seqlens_k: Optional[torch.Tensor]
    max_seqlen_q: int
    max_seqlen_k: int
    kv_len: int  # keys a row the layers must see (past + new tokens)


# -- patch / unpatch ---------------------------------------------------------------------------

def patch(model, *, rms_norm: bool = True, swiglu: bool = True, rope: bool = True, attention: bool = True,
          loss: bool = True):
    """Run ``model`` (a transformers LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM, or
    its base LlamaModel / Qwen2Model / Qwen3Model) on onetrip's ops; returns ``model``.

    Each keyword turns one replacement on or off (module docstring); ``loss`` applies to the
    ``*ForCausalLM`` classes only. Everything is checked before anything changes: a refused
    model is left as it was. Raises TypeError for another class (or a layer of another class,
    e.g. a model wrapped by torch.compile: patch first, then compile) and ValueError for a
    patched model or a config the replacements cannot honour. Works in any dtype the ops take
    (float32, float16, bfloat16), under autocast, torch.compile and gradient checkpointing.
    """
    options = PatchOptions(rms_norm, swiglu, rope, attention, loss)
    for f in fields(options):
        if not isinstance(getattr(options, f.name), bool):
            raise TypeError(f"{f.name} must be a bool, got {getattr(options, f.name)!r}")
    mod, prefix, causal = _family(model)
    if any(_RECORD in m.__dict__ for m in model.modules()):
        raise ValueError(f"{type(model).__name__} is patched already; call onetrip.unpatch(model) first")
    base = model.model if causal else model
    config = model.config
    _check_layers(base, mod, prefix)
    if swiglu and config.hidden_act not in ("silu", "swish"):
        raise ValueError(f"hidden_act is {config.hidden_act!r}; swiglu=True replaces a SiLU gate only "
                         f"(pass swiglu=False)")
    head_dim = base.layers[0].self_attn.head_dim if len(base.layers) else 0
    if attention and head_dim > 256:
        raise ValueError(f"head_dim is {head_dim}; flash_attention takes up to 256 (pass attention=False)")
    if attention and not getattr(config, "is_causal", True):
        raise ValueError("config.is_causal is False (bidirectional attention); onetrip's attention is causal "
                         "(pass attention=False)")
    if causal and loss:
        from transformers.loss.loss_utils import LOSS_MAPPING
        if model.loss_function is not LOSS_MAPPING["ForCausalLM"]:
            raise ValueError(f"the model's loss_function is {model.loss_function!r}, not transformers' "
                             f"ForCausalLMLoss, which loss=True reproduces (pass loss=False)")

    new = []  # (module, replacement forward)
    if rms_norm:
        new += [(m, _rms_norm_forward) for m in base.modules() if type(m) is getattr(mod, f"{prefix}RMSNorm")]
        new += [(layer, _decoder_forward if _checkpoint_in_call() else _decoder_forward_checkpointed)
                for layer in base.layers]
    if swiglu:
        new += [(layer.mlp, _swiglu_forward) for layer in base.layers]
    if rope or attention:
        new += [(layer.self_attn, _attention_forward_rope if rope else _attention_forward) for layer in base.layers]
    if attention:
        new.append((base, _base_forward))
    if causal and loss:
        new.append((model, _causal_lm_forward))

    for module, _ in new:  # a forward set on the instance (ours through a parent, accelerate's hooks) stays
        if "forward" in module.__dict__:
            raise ValueError(f"{type(module).__name__} has a forward of its own, set on the instance "
                             f"({module.__dict__['forward']!r}); onetrip.patch would replace it")

    previous = ()
    if attention:
        from transformers.modeling_utils import AttentionInterface
        AttentionInterface.register(ATTENTION_NAME, attention_forward)
        configs = {id(c): c for c in (m.__dict__.get("config") for m in model.modules())
                   if hasattr(c, "_attn_implementation")}  # every config the modules hold: one, shared
        previous = tuple((c, c._attn_implementation) for c in configs.values())
        for c in configs.values():
            c._attn_implementation = ATTENTION_NAME
    for module, fn in new:
        module.forward = types.MethodType(fn, module)
    model.__dict__[_RECORD] = PatchRecord(options, tuple((m, m.forward) for m, _ in new), previous)
    return model


def unpatch(model):
    """Undo ``patch``: the classes' forwards and the configs' attention implementation as they
    were, so outputs are bit-identical to the model's before ``patch``. Returns ``model``;
    ValueError if it is not patched, or if a patched forward was replaced since (nothing is
    changed then)."""
    record = model.__dict__.get(_RECORD)
    if record is None:
        raise ValueError(f"{type(model).__name__} is not patched by onetrip.patch")
    for module, installed in record.forwards:
        if module.__dict__.get("forward") is not installed:
            raise ValueError(f"the forward of a {type(module).__name__} was replaced after onetrip.patch; "
                             f"unpatch would drop that replacement")
    for module, _ in record.forwards:
        del module.forward
    for config, implementation in record.attn_implementations:
        config._attn_implementation = implementation
    del model.__dict__[_RECORD]
    return model


def _family(model):
    """(transformers module, class prefix, is a *ForCausalLM) of a supported model, else TypeError."""
    name = type(model).__name__
    for family, (path, prefix) in _FAMILIES.items():
        if name.startswith(prefix) and name in SUPPORTED:
            mod = importlib.import_module(path)
            for causal in (True, False):
                if type(model) is getattr(mod, f"{prefix}{'ForCausalLM' if causal else 'Model'}"):
                    return mod, prefix, causal
    raise TypeError(f"onetrip.patch supports {', '.join(SUPPORTED)} (transformers' own classes, not "
                    f"subclasses or wrappers); got {type(model).__module__}.{name}")


def _check_layers(base, mod, prefix):
    """Every decoder layer, attention, MLP and norm of the family's own classes (TypeError)."""
    expect = {"": "DecoderLayer", "self_attn": "Attention", "mlp": "MLP", "input_layernorm": "RMSNorm",
              "post_attention_layernorm": "RMSNorm"}
    parts = [(f"layers[{i}]{'.' + k if k else ''}", layer.get_submodule(k) if k else layer, v)
             for i, layer in enumerate(base.layers) for k, v in expect.items()]
    parts.append(("norm", base.norm, "RMSNorm"))
    for where, module, kind in parts:
        if type(module) is not getattr(mod, f"{prefix}{kind}"):
            raise TypeError(f"{where} is a {type(module).__name__}, not transformers' {prefix}{kind}; "
                            f"onetrip.patch replaces the forwards of those classes only")


def _checkpoint_in_call() -> bool:
    """Where transformers' gradient checkpointing wraps a decoder layer: in ``__call__``
    (older releases; an instance forward runs inside it) or in the class's ``forward``
    (newer; an instance forward replaces the wrapper, so ours checkpoints itself)."""
    from transformers.modeling_layers import GradientCheckpointingLayer
    return "__call__" in vars(GradientCheckpointingLayer)


# -- the replacement forwards ------------------------------------------------------------------

def _rms_norm_forward(self, hidden_states):
    """transformers' RMSNorm; the output dtype is promote(weight, input) as there."""
    x, w = hidden_states, self.weight
    if w.dtype != x.dtype:  # mixed precision: transformers multiplies in the wider dtype
        dtype = torch.promote_types(w.dtype, x.dtype)
        x, w = x.to(dtype), w.to(dtype)
    return rms_norm(x, w, self.variance_epsilon)


def _swiglu_forward(self, x):
    return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))


def _decoder_body(self, hidden_states, **kwargs):
    """The decoder layer with ``residual + attention`` and the post-attention norm in one kernel."""
    residual = hidden_states
    attn, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
    norm = self.post_attention_layernorm
    if attn.dtype == residual.dtype == norm.weight.dtype:
        normed, hidden_states = add_rms_norm(attn, residual, norm.weight, norm.variance_epsilon)
    else:  # mixed dtypes (autocast): the add promotes as transformers' does
        hidden_states = residual + attn
        normed = norm(hidden_states)
    return hidden_states + self.mlp(normed)


_decoder_forward = _decoder_body


def _decoder_forward_checkpointed(self, hidden_states, **kwargs):
    """``_decoder_body`` under the layer's gradient checkpointing, as transformers' wrapper does it."""
    if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
        if kwargs.get("use_cache"):
            kwargs["use_cache"] = False
        if not getattr(self, "_can_checkpoint_with_cache", False):
            for key in ("cache", "past_key_values", "layer_past"):
                if kwargs.get(key) is not None:
                    kwargs[key] = None
        return self._gradient_checkpointing_func(functools.partial(_decoder_body, self, **kwargs), hidden_states)
    return _decoder_body(self, hidden_states, **kwargs)


def _attention_forward_rope(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
    return _attention(self, hidden_states, position_embeddings, attention_mask, True, kwargs)


def _attention_forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
    return _attention(self, hidden_states, position_embeddings, attention_mask, False, kwargs)


def _attention(self, hidden_states, position_embeddings, attention_mask, fused_rope, kwargs):
    """transformers' attention module in the (batch, seq, heads, head_dim) layout the ops take:
    projections, Qwen3's q/k norms, rope, the KV cache, the configured attention function."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cache = kwargs.pop("cache", None)
    past = kwargs.pop("past_key_values", None)  # the cache's name in older transformers
    cache = past if cache is None else cache
    if cache is not None and getattr(cache, "is_compileable", False):
        raise ValueError(f"a {type(cache).__name__} (a static, compileable KV cache) is not supported by "
                         f"onetrip.patch's attention; use a DynamicCache")
    B, S = hidden_states.shape[:2]
    D = self.head_dim
    q = self.q_proj(hidden_states).view(B, S, -1, D)  # (batch, seq, heads, head_dim)
    k = self.k_proj(hidden_states).view(B, S, -1, D)  # (batch, seq, kv_heads, head_dim)
    v = self.v_proj(hidden_states).view(B, S, -1, D)
    if hasattr(self, "q_norm"):  # Qwen3
        q, k = self.q_norm(q), self.k_norm(k)
    cos, sin = position_embeddings
    q, k = _rotate(self, q, k, cos, sin, fused_rope)
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # (batch, kv_heads, seq, head_dim): the cache's layout
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx)
    eager = sys.modules[type(self).__module__].eager_attention_forward
    fn = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager)
    if hasattr(self, "sliding_window"):
        kwargs["sliding_window"] = self.sliding_window
    out, weights = fn(self, q.transpose(1, 2), k, v, attention_mask,
                      dropout=self.attention_dropout if self.training else 0.0, scaling=self.scaling, **kwargs)
    return self.o_proj(out.reshape(B, S, -1)), weights


def _rotate(self, q, k, cos, sin, fused):
    """RoPE of q, k (batch, seq, heads, head_dim) by transformers' cos, sin (1 or batch, seq,
    head_dim), both halves equal (``cat(freqs, freqs)`` for every rope type): the first half
    is the compact table apply_rotary takes, a row per token."""
    D = q.shape[-1]
    if cos.shape[-1] != D:
        raise ValueError(f"cos has {cos.shape[-1]} columns for head_dim {D}; partial rotary is not supported")
    if not fused:
        return sys.modules[type(self).__module__].apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    B, S = q.shape[:2]
    half = D // 2
    if cos.shape[0] == 1:  # one row of positions for the batch: index the table by seq
        return apply_rotary(q, k, cos[0, :, :half], sin[0, :, :half])
    table_cos, table_sin = cos.reshape(B * S, D)[:, :half], sin.reshape(B * S, D)[:, :half]
    qr, kr = apply_rotary(q.reshape(B * S, *q.shape[2:]), k.reshape(B * S, *k.shape[2:]), table_cos, table_sin)
    return qr.view(q.shape), kr.view(k.shape)


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      sliding_window=None, softcap=None, **kwargs):
    """The "onetrip" entry of transformers' AttentionInterface: query (batch, heads, seq,
    head_dim), key and value (batch, kv_heads, kv_len, head_dim) -> ((batch, seq, heads,
    head_dim), None). Causal, with the batch's segments from the plan ``patch`` passes
    (``attention_mask`` is unused: the plan holds it); a call without that plan raises, so the
    name cannot run, unpadded and unpacked, in a model ``patch`` did not prepare."""
    plan = kwargs.get(_PLAN_KEY)
    if plan is None:
        raise ValueError(f"attn_implementation {ATTENTION_NAME!r} runs inside models prepared by onetrip.patch "
                         f"(which turns padding masks and packed position ids into segments)")
    if dropout:
        raise ValueError(f"attention dropout {dropout} in training is not supported by onetrip's attention "
                         f"(set config.attention_dropout = 0, or patch with attention=False)")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (batch, seq, heads, head_dim)
    device = q.device.type
    if torch.is_autocast_enabled(device):  # attention runs in the autocast dtype, as sdpa does
        dtype = torch.get_autocast_dtype(device)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    B, S, H, D = q.shape
    Sk = k.shape[1]
    if Sk != plan.kv_len:
        raise ValueError(f"layer {getattr(module, 'layer_idx', '?')} sees {Sk} keys a row where the batch has "
                         f"{plan.kv_len} (a sliding-window cache past its window?); not supported")
    opts = dict(causal=True, softmax_scale=scaling, softcap=float(softcap or 0.0),
                window=(sliding_window - 1, 0) if sliding_window else (-1, -1))  # keys q - window < j <= q
    if plan.cu_seqlens_q is None:
        return flash_attention(q, k, v, **opts), None
    out = flash_attention(q.reshape(B * S, H, D), k.reshape(B * Sk, -1, D), v.reshape(B * Sk, -1, D),
                          cu_seqlens_q=plan.cu_seqlens_q, cu_seqlens_k=plan.cu_seqlens_k,
                          max_seqlen_q=plan.max_seqlen_q, max_seqlen_k=plan.max_seqlen_k, **opts)
    return out.view(B, S, H, D), None


def _base_forward(self, *args, **kwargs):
    """The base model's own forward, given the batch's attention plan (``_plan``) as a keyword
    that transformers passes through every layer to the attention function."""
    kwargs = _named(type(self).forward, self, args, kwargs)
    if kwargs.get("output_attentions") or getattr(self.config, "output_attentions", False):
        raise ValueError("output_attentions=True: onetrip's attention never forms the attention weights "
                         "(patch with attention=False to get them)")
    if kwargs.get("input_ids") is not None or kwargs.get("inputs_embeds") is not None:  # else transformers raises
        kwargs[_PLAN_KEY] = _plan(kwargs)
    return type(self).forward(self, **kwargs)


def _causal_lm_forward(self, *args, **kwargs):
    """With labels: the loss through linear_cross_entropy and ``logits=None``; without, the
    class's own forward."""
    kwargs = _named(type(self).forward, self, args, kwargs)
    labels = kwargs.pop("labels", None)
    if labels is None:
        return type(self).forward(self, **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    logits_to_keep = kwargs.pop("logits_to_keep", 0)
    if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
        raise ValueError(f"logits_to_keep={logits_to_keep!r} with labels: the patched loss covers every token "
                         f"and returns no logits")
    num_items = kwargs.pop("num_items_in_batch", None)
    shift_labels = kwargs.pop("shift_labels", None)
    ignore_index = kwargs.pop("ignore_index", -100)
    return_dict = kwargs.pop("return_dict", None)
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    out = self.model(**kwargs)
    hidden = out.last_hidden_state  # (batch, seq, hidden)
    if shift_labels is None:  # position t predicts labels[t + 1]; the last position predicts nothing
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    weight, bias = self.lm_head.weight, self.lm_head.bias
    device = hidden.device.type
    if torch.is_autocast_enabled(device):  # lm_head is a linear: transformers runs it in the autocast dtype
        dtype = torch.get_autocast_dtype(device)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    loss = linear_cross_entropy(hidden, weight, shift_labels.to(hidden.device), bias, ignore_index=ignore_index,
                                reduction="mean" if num_items is None else "sum")
    if num_items is not None:  # gradient accumulation: the sum over the accumulated batches' token count
        loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
    cache_field = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
    result = CausalLMOutputWithPast(loss=loss, logits=None, hidden_states=out.hidden_states,
                                    attentions=out.attentions, **{cache_field: getattr(out, cache_field, None)})
    return result if return_dict else result.to_tuple()


def _named(forward, self, args, kwargs) -> dict:
    """Positional arguments named as the class's ``forward`` names them (transformers'
    releases differ in the cache's name and place)."""
    if not args:
        return kwargs
    bound = inspect.signature(forward).bind(self, *args, **kwargs).arguments
    bound.pop(next(iter(bound)))  # self
    extra = [name for name, p in inspect.signature(forward).parameters.items() if p.kind is p.VAR_KEYWORD]
    for name in extra:
        bound.update(bound.pop(name, {}))
    return dict(bound)


# -- the batch's attention plan ------------------------------------------------------------------

def _plan(kwargs) -> _Plan:
    """Dense causal, padding segments (a 2-D mask) or packed segments (position ids that restart,
    no mask, no past tokens), from the base model's forward arguments."""
    ids, embeds = kwargs.get("input_ids"), kwargs.get("inputs_embeds")
    B, S = (ids if ids is not None else embeds).shape[:2]
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    past = int(cache.get_seq_length()) if cache is not None else 0
    mask, positions = kwargs.get("attention_mask"), kwargs.get("position_ids")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.shape != (B, past + S):
            what = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"attention_mask is {what}; onetrip's attention takes a 2-D padding mask "
                             f"(batch, past + seq) = ({B}, {past + S})")
        return _padding_plan(mask, S)
    if positions is not None and past == 0 and S > 1:
        return _packed_plan(positions.expand(B, S))
    return _Plan(None, None, S, past + S, past + S)


def _padding_plan(mask: torch.Tensor, q_len: int) -> _Plan:
    """Three segments a row of the (batch, kv_len) mask: the pads before its tokens, the tokens,
    the pads after; the queries are the last q_len keys of each row (a cache's new tokens).
    Each query part is a suffix of its key segment, so causal attention aligned to the
    segments' ends is exact. Pads attend only to pads (their outputs are defined by no
    implementation and must carry ignored labels). One host sync: a row whose tokens are not
    contiguous (a gap) is refused, and a mask of ones is dense causal."""
    m = mask.bool()
    B, Sk = m.shape
    n = m.sum(1)                                   # tokens a row
    lead = (m.cumsum(1) == 0).sum(1)               # pads before the first token
    cols = torch.arange(Sk, device=m.device)
    contiguous = ((cols >= lead[:, None]) & (cols < (lead + n)[:, None]) == m).all()
    contiguous, ones = torch.stack([contiguous, m.all()]).tolist()
    if not contiguous:
        raise ValueError("attention_mask has a gap inside a row (zeros between ones); onetrip's attention "
                         "takes left or right padding")
    if ones:
        return _Plan(None, None, q_len, Sk, Sk)
    starts_k = torch.stack([torch.zeros_like(n), lead, lead + n], 1)    # (batch, 3) row-local segment starts
    starts_q = (starts_k - (Sk - q_len)).clamp(0, q_len)
    rows = torch.arange(B, device=m.device)[:, None]
    end_k = torch.full((1,), B * Sk, device=m.device, dtype=n.dtype)
    end_q = torch.full((1,), B * q_len, device=m.device, dtype=n.dtype)
    cu_k = torch.cat([(starts_k + rows * Sk).flatten(), end_k]).to(torch.int32)
    cu_q = torch.cat([(starts_q + rows * q_len).flatten(), end_q]).to(torch.int32)
    return _Plan(cu_q, cu_k, q_len, Sk, Sk)


def _packed_plan(positions: torch.Tensor) -> _Plan:
    """A segment wherever a row's position does not follow the previous one by 1 (transformers'
    rule for packed rows); dense causal when every row is one sequence. One host sync (the
    number of segments)."""
    B, S = positions.shape
    start = torch.ones(B, S, dtype=torch.bool, device=positions.device)
    start[:, 1:] = positions[:, 1:] - positions[:, :-1] != 1
    starts = start.flatten().nonzero().flatten()
    if starts.shape[0] == B:
        return _Plan(None, None, S, S, S)
    cu = torch.cat([starts, starts.new_full((1,), B * S)]).to(torch.int32)
    return _Plan(cu, cu, S, S, S)


class _CallableModule(types.ModuleType):
    """``onetrip.patch`` is this module once imported (Python binds a package's submodule to its
    name), so the module calls ``patch``: ``onetrip.patch(model)`` works in any import order."""

    def __call__(self, model, **options):
        return patch(model, **options)


sys.modules[__name__].__class__ = _CallableModule
