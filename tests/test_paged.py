"""The paged KV cache (``models.paged``): the host-side page plan, and both backends
reading a paged cache whose pages are shuffled through the pool, against the float64 eager
run on a contiguous cache by the error rule. The fused runs start from pools full of NaN,
so a slot read before it was written fails."""

import copy
import importlib

import pytest
import torch

from onetrip.models import Model
from onetrip.models.paged import SINK, PagedKVCache, PagePlan, pages_for, plan_pages
from onetrip.testing import assert_close, poison_

from conftest import DEVICE
from test_models import TINY, VARIANTS


def test_plan_pages():
    """Each sequence gets ceil(tokens / page_size) pages of its own, none of them the sink."""
    plan = plan_pages([5 + 8, 1 + 8, 19 + 8, 16], page_size=8, num_pages=11)
    assert [len(p) for p in plan.pages] == [2, 2, 4, 2] == [pages_for(n, 8) for n in (13, 9, 27, 16)]
    ids = [i for p in plan.pages for i in p]
    assert plan.pages_used == 10 and sorted(ids) == list(range(1, 11))
    table = plan.table(rows=8, max_blocks=5)  # a bucket of 8: four padding rows
    assert table.dtype == torch.int32 and table.shape == (8, 5)
    assert table[2].tolist() == list(plan.pages[2]) + [SINK]
    assert (table[4:] == SINK).all() and table[0, 2:].eq(SINK).all()


def test_plan_pages_refuses_a_small_pool():
    plan_pages([64, 65], page_size=64, num_pages=4)  # 1 + 2 pages and the sink: fits exactly
    with pytest.raises(ValueError, match=r"needs 3 pages of 64 tokens \(\[1, 2\] per sequence\) but the pool has 2 "
                                         r"\(num_pages 3, one is the sink\); num_pages >= 4 fits it"):
        plan_pages([64, 65], page_size=64, num_pages=3)
    with pytest.raises(ValueError, match="page_size must be >= 1, got 0"):
        plan_pages([1], page_size=0, num_pages=4)
    with pytest.raises(ValueError, match="cannot hold this plan"):
        PagePlan(4, ((1, 2, 3),)).table(rows=1, max_blocks=2)
    with pytest.raises(ValueError, match=r"block_table must be a \(batch, max_blocks\) int32 tensor"):
        PagedKVCache(3, 4, 1, 8, torch.zeros(2, 3, dtype=torch.int64), torch.float32, "cpu")


def _use_paged(model, batch, max_seq, page, gen, poison):
    """Install a paged cache in every layer: the pages of all sequences a random
    permutation of pool pages 1.., so no order of pages is assumed."""
    c = model.config
    n = pages_for(max_seq, page)
    perm = 1 + torch.randperm(batch * n, generator=gen, device=DEVICE)
    table = perm.view(batch, n).to(torch.int32)
    for layer in model.layers:
        cache = PagedKVCache(batch * n + 1, page, c.num_kv_heads, c.head_dim, table, model.dtype, DEVICE)
        if poison:
            poison_(cache.k), poison_(cache.v)
        layer.attn.cache = cache


def _feed(model, chunks, starts):
    """Logits of ``chunks`` (batch, n) fed in turn; ``starts[i]`` (a list) resets the
    lengths before chunk i when given. Concatenated along seq."""
    lens, out = None, []
    for c, start in zip(chunks, starts):
        if start is not None:
            lens = torch.tensor(start, dtype=torch.int32, device=DEVICE)
        out.append(model(c, lens))
        lens += c.shape[1]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("backend", ["eager", "fused"])
def test_paged_matches_contiguous_logits(backend, gen):
    """Both attention paths on a paged cache of 8-token pages: a 17-token prefill at equal
    lengths (one gather, one flash_attention), an 18-token prefill where sequence 0 starts
    over (a gather per sequence), a single-token step and a 2-token step (decode_attention
    through the table)."""
    model = Model.random(VARIANTS["qwen3"], torch.float32, DEVICE, seed=5)
    exact = copy.deepcopy(model).to(torch.float64)
    tokens = torch.randint(0, TINY.vocab_size, (2, 38), generator=gen, device=DEVICE)
    chunks = [tokens[:, :17], tokens[:, 17:35], tokens[:, 35:36], tokens[:, 36:38]]
    starts = [[0, 0], [0, 17], None, None]
    outs = []
    for m in (exact, model):
        m.setup_cache(2, 40)
        outs.append(_feed(m, chunks, starts))
    model.backend = backend
    _use_paged(model, 2, 40, 8, gen, poison=backend == "fused")  # eager's masked product would spread NaN
    ours = _feed(model, chunks, starts)
    assert_close(f"paged {backend} logits", ours, outs[0], outs[1], atol=1e-6)


def test_paged_batch_one_gemv_path(gen, monkeypatch):
    """Batch 1, one token a step (``_decode_one_row``, forced as in test_models_fused) on a
    paged cache of 4-token pages, the prefill of 9 through decode_attention's q_len 9."""
    fused_mod = importlib.import_module("onetrip.models.fused")
    monkeypatch.setattr(fused_mod, "_gemv", lambda x: True)
    calls = []
    one_row = fused_mod._decode_one_row
    monkeypatch.setattr(fused_mod, "_decode_one_row", lambda *a: calls.append(1) or one_row(*a))
    model = Model.random(VARIANTS["llama"], torch.float32, DEVICE, seed=9)
    exact = copy.deepcopy(model).to(torch.float64)
    tokens = torch.randint(0, TINY.vocab_size, (1, 12), generator=gen, device=DEVICE)
    chunks = [tokens[:, :9]] + [tokens[:, i:i + 1] for i in range(9, 12)]
    starts = [[0], None, None, None]
    outs = []
    for m in (exact, model):
        m.setup_cache(1, 16)
        outs.append(_feed(m, chunks, starts))
    model.backend = "fused"
    _use_paged(model, 1, 16, 4, gen, poison=True)
    ours = _feed(model, chunks, starts)
    assert len(calls) == 3
    assert_close("paged batch-1 GEMV logits", ours, outs[0], outs[1], atol=1e-6)
