"""Full-size shapes in bf16 on a GPU: onetrip's fused decoder against transformers on the
same weights, both judged against a float32 run (the 2 x PyTorch-error rule), for the
prefill path and the batch-1 decode path (GEMVs carrying the norms). GPU only."""

import copy

import pytest
import torch

from onetrip.models import Model, get_config
from onetrip.models.hf import to_transformers
from onetrip.testing import assert_close

from conftest import ON_GPU

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")]


@pytest.mark.parametrize("preset", ["llama-3.2-1b", "qwen2.5-0.5b"])
@torch.no_grad()
def test_full_shape_logits_against_transformers(preset):
    model = Model.random(get_config(preset), torch.bfloat16, "cuda", seed=1)
    exact = copy.deepcopy(model).float()  # the same (bf16-rounded) weights, float32 arithmetic
    model.backend, exact.backend = "fused", "eager"
    tokens = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0)).cuda()
    outs = []
    for m in (model, exact):
        m.setup_cache(1, 64)
        lens = torch.zeros(1, dtype=torch.int32, device="cuda")
        prefill = m(tokens[:, :39], lens)[:, -1:]      # flash_attention path
        step = m(tokens[:, 39:], lens + 39)              # one token: the batch-1 GEMV path
        outs.append(torch.cat([prefill, step], dim=1).float())
        m.reset_cache()
    ours, want = outs
    theirs = to_transformers(model)(tokens).logits[:, 38:40].float()  # bf16 transformers, SDPA
    assert_close(f"{preset} logits vs float32", ours, want.double(), theirs, atol=1e-4)
