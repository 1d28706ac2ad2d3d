"""The fused backend of the decoder against the eager one: same weights, logits within the
error rule (fused's error against a float64 eager run <= 2 x the float32 eager run's),
for every family variant, prefill (flash_attention) and decode (decode_attention) paths,
sequences of different lengths in one batch, and without a cache.

On the CPU the kernels run through Triton's interpreter; the tiny configs keep it quick.
"""

import copy

import pytest
import torch

from onetrip.models import FusedOptions, Model
from onetrip.testing import assert_close

from conftest import DEVICE
from test_models import TINY, VARIANTS


def _pair(variant, seed, options=FusedOptions()):
    """(eager float32, eager float64, fused float32) models with the same weights."""
    model = Model.random(VARIANTS[variant], torch.float32, DEVICE, seed=seed, fused_options=options)
    exact = copy.deepcopy(model).to(torch.float64)
    fused = copy.deepcopy(model)
    fused.backend = "fused"
    return model, exact, fused


def _run(models, chunks, batch, max_seq):
    """Feed ``chunks`` (list of (batch, n) token tensors) through each model with a cache;
    returns the concatenated logits of each."""
    outs = []
    for m in models:
        m.setup_cache(batch, max_seq)
        lens = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
        logits = []
        for c in chunks:
            logits.append(m(c, lens))
            lens += c.shape[1]
        outs.append(torch.cat(logits, dim=1))
    return outs


@pytest.mark.parametrize("append_in_attention", [False, True])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fused_matches_eager(variant, append_in_attention, gen):
    """Decode steps through append_kv + decode_attention, or append_attention (one launch)."""
    eager, exact, fused = _pair(variant, seed=int(torch.randint(0, 1000, (1,), generator=gen, device=DEVICE)),
                                options=FusedOptions(append_in_attention=append_in_attention))
    tokens = torch.randint(0, TINY.vocab_size, (2, 23), generator=gen, device=DEVICE)
    # A prefill of 19 (> MAX_Q_LEN: flash_attention), 2 single-token steps, then a chunk of
    # 2 (decode_attention with q_len 2, causal among the new tokens).
    chunks = [tokens[:, :19], tokens[:, 19:20], tokens[:, 20:21], tokens[:, 21:23]]
    want, torch_out, ours = _run([exact, eager, fused], chunks, 2, 32)
    assert_close(f"{variant} fused logits", ours, want, torch_out, atol=1e-6)


def test_fused_different_lengths_per_sequence(gen):
    """A batch whose sequences sit at different positions: the prefill path attends per
    sequence, the decode path reads each sequence's own length."""
    eager, exact, fused = _pair("qwen3", seed=5)
    tokens = torch.randint(0, TINY.vocab_size, (2, 40), generator=gen, device=DEVICE)
    outs = []
    for m in (exact, eager, fused):
        m.setup_cache(2, 48)
        m(tokens[:, :3], torch.zeros(2, dtype=torch.int32, device=DEVICE))
        lens = torch.tensor([0, 3], dtype=torch.int32, device=DEVICE)  # sequence 0 starts over
        a = m(tokens[:, 3:21], lens)   # 18 new tokens: prefill path
        lens += 18
        b = m(tokens[:, 21:22], lens)  # decode path
        outs.append(torch.cat([a, b], dim=1))
    assert_close("mixed-length fused logits", outs[2], outs[0], outs[1], atol=1e-6)


def test_fused_without_cache(gen):
    eager, exact, fused = _pair("llama3-tied", seed=7)
    tokens = torch.randint(0, TINY.vocab_size, (3, 17), generator=gen, device=DEVICE)
    assert_close("no-cache fused logits", fused(tokens), exact(tokens), eager(tokens), atol=1e-6)


def test_backend_errors():
    model = Model.random(TINY, seed=0)
    with pytest.raises(ValueError, match="backend must be one of eager, fused; got 'triton'"):
        model.backend = "triton"
    assert model.backend == "eager"
    with pytest.raises(TypeError, match="fused_options must be a FusedOptions, got dict"):
        Model.random(TINY, seed=0, fused_options={"append_in_attention": False})


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_batch_one_gemv_path(variant, gen, monkeypatch):
    """Batch 1, one token a step: the path where every projection is a GEMV and the norms
    ride in them (``_decode_one_row``). On a GPU it runs for 16-bit rows; forced here so
    the interpreter checks it in float32 against the float64 eager run."""
    import importlib

    fused_mod = importlib.import_module("onetrip.models.fused")
    monkeypatch.setattr(fused_mod, "_gemv", lambda x: True)
    calls = []
    one_row = fused_mod._decode_one_row
    monkeypatch.setattr(fused_mod, "_decode_one_row", lambda *a: calls.append(1) or one_row(*a))
    eager, exact, fused = _pair(variant, seed=int(torch.randint(0, 1000, (1,), generator=gen, device=DEVICE)))
    tokens = torch.randint(0, TINY.vocab_size, (1, 12), generator=gen, device=DEVICE)
    chunks = [tokens[:, :9]] + [tokens[:, i:i + 1] for i in range(9, 12)]
    want, torch_out, ours = _run([exact, eager, fused], chunks, 1, 16)
    assert len(calls) == 3  # the three single-token steps took the GEMV path
    assert_close(f"{variant} batch-1 GEMV logits", ours, want, torch_out, atol=1e-6)
