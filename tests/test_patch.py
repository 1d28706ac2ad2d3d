"""onetrip.patch on tiny transformers Llama, Qwen2 and Qwen3 models: the patched model's loss
and gradients (every parameter) against the unpatched one by the 2x rule (the unpatched
model in float64 is exact, in the patched model's dtype PyTorch's own), with padding on
either side, packed rows, ignored labels, a KV cache; unpatch restores the model bit for bit;
what cannot be honoured raises.

On the CPU, two one-layer cases and the torch.compile test run the Triton kernels through the
interpreter (a forward and backward costs seconds there); the rest run the ops' PyTorch
fallbacks (TRITON_INTERPRET=0 for the test), which check the wiring (layouts, segments, label
shift, fusion) in a fraction of a second. On a GPU every case runs the kernels, the main ones
in bfloat16.
"""

import copy
import inspect

import pytest
import torch

import onetrip
from conftest import DEVICE, ON_GPU
from onetrip.patch import attention_forward, patch, unpatch
from onetrip.testing import assert_close

transformers = pytest.importorskip("transformers")

FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    # Qwen2.5-0.5B ties the head to the embeddings: the loss's weight gradient lands in both
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {"tie_word_embeddings": True}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 16}),
}
B, S, VOCAB = 2, 12, 128


def _model(family, layers=2, dtype=torch.float32, **extra):
    config_cls, model_cls, defaults = FAMILIES[family]
    shape = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64)
    # sdpa for the unpatched model: eager's float32 softmax makes float64 left padding NaN
    config = config_cls(attn_implementation="sdpa", **{**shape, **defaults, **extra})
    torch.manual_seed(0)
    return model_cls(config).to(DEVICE, dtype)


def _padded(seq=S):
    """Row 0 left-padded by 3, row 1 right-padded by 4; ignored labels at the pads, at the first
    token of row 0 (a pad predicts it: no implementation defines a pad query's output) and at one
    more token."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (B, seq), generator=g)
    mask = torch.ones(B, seq, dtype=torch.long)
    mask[0, :3] = 0
    mask[1, seq - 4:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[0, 3] = labels[1, 5] = -100
    batch = dict(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False)
    return {k: v.to(DEVICE) if torch.is_tensor(v) else v for k, v in batch.items()}


def _packed(rows=((5, 7), (4, 3, 5))):
    """DataCollatorWithFlattening's layout: sequences of these lengths packed in each row,
    positions restarting at each, no mask, each sequence's first label ignored; the loss summed
    over num_items_in_batch (gradient accumulation's normalisation), here 3 more than the labels."""
    positions = torch.tensor([[p for n in row for p in range(n)] for row in rows])
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, VOCAB, positions.shape, generator=g)
    labels = ids.masked_fill(positions == 0, -100)
    items = torch.tensor(int((labels[:, 1:] != -100).sum()) + 3)
    batch = dict(input_ids=ids, position_ids=positions, labels=labels, use_cache=False, num_items_in_batch=items)
    return {k: v.to(DEVICE) if torch.is_tensor(v) else v for k, v in batch.items()}


BATCHES = {"padded": _padded, "packed": _packed}


def _loss_grads(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out, {n.removeprefix("_orig_mod."): p.grad.detach().clone() for n, p in model.named_parameters()}


def _check_against_unpatched(model, batch, **options):
    """The 2x rule for the loss and every gradient: patched ``model`` against the unpatched model
    in float64 (exact) and in ``model``'s dtype (PyTorch's own error)."""
    exact = copy.deepcopy(model).double()
    loss64, grads64 = _loss_grads(exact, batch)
    ref, grads_ref = _loss_grads(model, batch)
    onetrip.patch(model, **options)
    try:
        out, grads = _loss_grads(model, batch)
    finally:
        unpatch(model)
    if options.get("loss", True):
        assert out.logits is None  # never materialized
    assert_close("loss", out.loss, loss64.loss, ref.loss)
    for name, g in grads.items():
        assert_close(name, g, grads64[name], grads_ref[name])


@pytest.fixture
def fallback(monkeypatch):
    """The ops' PyTorch fallbacks instead of the interpreter, on the CPU."""
    if not ON_GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("family", FAMILIES)
def test_same_loss_and_grads(family, batch, fallback):
    # float32 on the GPU too: in bf16 the whole model's mean loss is one scalar whose error
    # against float64 is dominated by where each path rounds (H200: 1.1e-4 patched against
    # transformers' 1.5e-5 on packed rows); bench train compares the bf16 losses of 20 steps.
    model = _model(family, dtype=torch.float32)
    _check_against_unpatched(model, BATCHES[batch]())


def _padded_positions():
    """``_padded`` with position ids counting each row's tokens, as generate makes them."""
    batch = _padded(seq=8)
    batch["position_ids"] = (batch["attention_mask"].cumsum(1) - 1).clamp(min=0)
    return batch


@pytest.mark.parametrize("family, batch", [
    ("llama", _padded_positions),  # padding both sides, positions per row: the rotary kernel's per-token rows
    ("qwen3", lambda: _packed(((3, 5), (4, 4)))),  # packed segments, the q/k norms
])
def test_through_the_kernels(family, batch):
    """The Triton kernels themselves (on the CPU through the interpreter, one layer to keep it short)."""
    _check_against_unpatched(_model(family, layers=2 if ON_GPU else 1), batch())


def test_sliding_window_and_partial_options(fallback):
    """Qwen2's sliding-window layers (the second layer's window of 4 < 12 tokens) through
    flash_attention's window; the loss left as transformers has it (logits returned)."""
    model = _model("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1)
    assert model.config.layer_types == ["full_attention", "sliding_attention"]
    _check_against_unpatched(model, _padded(), loss=False, swiglu=False)


def _cache_name(model):
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def _decode(model, ids, mask, new):
    """Last-position logits of a left-padded prefill and one step per column of ``new``,
    through a DynamicCache."""
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    logits = [out.logits[:, -1]]
    for t in range(new.shape[1]):
        cache = getattr(out, _cache_name(model), None)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=new[:, t:t + 1], attention_mask=mask, position_ids=positions, use_cache=True,
                    **{_cache_name(model): cache})
        logits.append(out.logits[:, -1])
    return torch.stack(logits, 1)


def test_decode_with_cache(fallback):
    model = _model("qwen3").eval()
    batch = _padded()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    mask[1] = 1  # left padding only: a right-padded row would have a gap once tokens are appended
    new = torch.randint(0, VOCAB, (B, 2), device=DEVICE)
    with torch.no_grad():
        exact = _decode(copy.deepcopy(model).double(), ids, mask, new)
        ref = _decode(model, ids, mask, new)
        got = _decode(onetrip.patch(model), ids, mask, new)
    assert_close("decode logits", got, exact, ref)


def test_base_model(fallback):
    """The base model (no head: ``loss`` has nothing to replace) gives the unpatched hidden states."""
    base = _model("llama").model
    batch = {k: v for k, v in _padded().items() if k in ("input_ids", "attention_mask")}
    keep = batch["attention_mask"].bool()[..., None]  # pad positions have no defined output
    with torch.no_grad():
        exact = copy.deepcopy(base).double()(**batch).last_hidden_state
        ref = base(**batch).last_hidden_state
        got = onetrip.patch(base)(**batch).last_hidden_state
    assert_close("hidden", got * keep, exact * keep, ref * keep)


def test_unpatch_restores_bit_for_bit(fallback):
    model = _model("qwen3")
    batch = _padded()
    with torch.no_grad():
        before = model(**batch)
        record = onetrip.patch(model)._onetrip_patch
        assert all(layer.self_attn.config._attn_implementation == "onetrip" for layer in model.model.layers)
        assert record.options.rms_norm and len(record.forwards) > 0
        patched = model(batch["input_ids"], batch["attention_mask"], labels=batch["labels"])  # positional too
        assert patched.logits is None and torch.isfinite(patched.loss)
        ones = torch.ones_like(batch["attention_mask"])  # a mask of ones is plain causal attention
        assert torch.equal(model(batch["input_ids"], ones, labels=batch["labels"]).loss,
                           model(batch["input_ids"], labels=batch["labels"]).loss)
        unpatch(model)
        after = model(**batch)
    assert model.config._attn_implementation == "sdpa"
    assert not hasattr(model, "_onetrip_patch")
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert torch.equal(before.logits, after.logits) and torch.equal(before.loss, after.loss)


def test_gradient_checkpointing(fallback):
    """Checkpointed layers run again in the backward (the first norm is called twice a layer) and
    give the same loss and gradients as without checkpointing."""
    model = onetrip.patch(_model("llama"))
    batch = _padded()
    plain, plain_grads = _loss_grads(model, batch)
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()  # the newer name (transformers 5.24), else the older one (5.17)
    calls = []
    for layer in model.model.layers:
        layer.input_layernorm.register_forward_hook(lambda *_: calls.append(1))
    out, grads = _loss_grads(model, batch)
    assert len(calls) == 2 * len(model.model.layers)
    torch.testing.assert_close(out.loss, plain.loss, rtol=0, atol=0)
    for name, g in grads.items():
        torch.testing.assert_close(g, plain_grads[name], rtol=0, atol=0, msg=name)


@pytest.mark.slow  # ~12 s on 2 cores (make test-all; every op's own compile test runs in CI)
def test_torch_compile():
    """torch.compile(fullgraph=True) of the patched model (inductor on a GPU; aot_eager and the
    interpreter on the CPU: flash_attention's PyTorch fallback backward gives zero gradients when
    called through the dispatcher, as compiled code calls it) against the unpatched model by
    the 2x rule."""
    model = _model("qwen2", layers=1)
    batch = {k: v for k, v in _padded(seq=8).items() if k in ("input_ids", "labels")}
    exact, exact_grads = _loss_grads(copy.deepcopy(model).double(), batch)
    ref, ref_grads = _loss_grads(model, batch)
    compiled = torch.compile(onetrip.patch(model), fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    out, grads = _loss_grads(compiled, batch)
    assert_close("loss", out.loss, exact.loss, ref.loss)
    for name, g in grads.items():
        assert_close(name, g, exact_grads[name], ref_grads[name])


def test_refusals(fallback):
    with pytest.raises(TypeError, match="supports LlamaForCausalLM, LlamaModel.*got torch.nn.modules.linear.Linear"):
        patch(torch.nn.Linear(2, 2))
    model = _model("llama", layers=1)
    with pytest.raises(TypeError, match="OptimizedModule"):
        patch(torch.compile(model))
    with pytest.raises(TypeError, match="rope must be a bool"):
        patch(model, rope=1)
    with pytest.raises(ValueError, match="is not patched"):
        unpatch(model)
    gelu = _model("llama", layers=1, hidden_act="gelu")
    with pytest.raises(ValueError, match="hidden_act is 'gelu'"):
        patch(gelu)
    assert "_onetrip_patch" not in gelu.__dict__ and all("forward" not in m.__dict__ for m in gelu.modules())
    patch(gelu, swiglu=False)
    odd = _model("llama", layers=1)
    odd.model.layers[0].mlp = torch.nn.Identity()
    with pytest.raises(TypeError, match=r"layers\[0\].mlp is a Identity"):
        patch(odd)

    hooked = _model("llama", layers=1)
    hooked.model.norm.forward = hooked.model.norm.forward  # as accelerate's hooks do
    with pytest.raises(ValueError, match="LlamaRMSNorm has a forward of its own"):
        patch(hooked)

    patch(model)
    with pytest.raises(ValueError, match="patched already"):
        patch(model)
    with pytest.raises(ValueError, match="has a forward of its own"):
        patch(model.model)
    batch = _padded()
    gap = batch["attention_mask"].clone()
    gap[1, 2] = 0
    with pytest.raises(ValueError, match="gap inside a row"):
        model(**{**batch, "attention_mask": gap})
    with pytest.raises(ValueError, match="output_attentions"):
        model(**batch, output_attentions=True)
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(**batch, logits_to_keep=1)
    q = torch.zeros(1, 4, 3, 16)
    with pytest.raises(ValueError, match="runs inside models prepared by onetrip.patch"):
        attention_forward(model.model.layers[0].self_attn, q, q[:, :2], q[:, :2], None, scaling=0.25)

    dropout = patch(_model("llama", layers=1, attention_dropout=0.1))
    with pytest.raises(ValueError, match="attention dropout 0.1 in training"):
        dropout(**batch)
    with torch.no_grad():
        assert torch.isfinite(dropout.eval()(**batch).loss)
