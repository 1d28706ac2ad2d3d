"""append_attention (append_kv + decode_attention in one launch) against the unfused pair,
op by op (``append_attention_ref``), with the accuracy rule of onetrip.testing.

The slots the append writes hold NaN beforehand and every slot past the new tokens holds
NaN too: a write that misses, or a read past the new length, fails the check.
"""

import dataclasses

import pytest
import torch

from onetrip.ops._decode_launch import launch
from onetrip.ops.append_attention import _append_attention_op, append_attention, append_attention_ref
from onetrip.ops.decode_attention import DecodeConfig
from onetrip.testing import assert_close, poison_, upcast

from conftest import DTYPES, capture, rope_tables
from test_decode_attention import make_cache


def make_case(lengths, q_len, heads, kv_heads, head_dim, max_seq, dtype, device, gen, page=None):
    """New tokens, and test_decode_attention's caches: NaN at and past each sequence's
    length (the slots the append writes included), paged through a shuffled table."""
    B = len(lengths)
    q = torch.randn((B, q_len, heads, head_dim), device=device, generator=gen).to(dtype)
    k, v = (torch.randn((B, q_len, kv_heads, head_dim), device=device, generator=gen).to(dtype) for _ in "kv")
    kc, vc, table, L = make_cache(lengths, max_seq, kv_heads, head_dim, dtype, device, gen, page, garbage=False)
    return q, k, v, kc, vc, L, table


def run_and_check(q, k, v, kc, vc, L, cos, sin, table, config=None, **kw):
    """Fused vs the pair in float64 (exact) and in the input dtype (PyTorch's own error);
    caches compared where the reference wrote, every other slot untouched bit for bit."""
    exact = append_attention_ref(*upcast(q, k, v, kc, vc), L, *upcast(cos, sin), table, **kw)
    eager = append_attention_ref(q, k, v, kc, vc, L, cos, sin, table, **kw)
    q_before, k_before, v_before = q.clone(), kc.clone(), vc.clone()
    out = poison_(torch.empty_like(q))
    if config is None:
        append_attention(q, k, v, kc, vc, L, cos, sin, block_table=table, out=out, **kw)
    else:
        launch(q, kc, vc, L, table, out, kw.get("softmax_scale") or q.shape[-1] ** -0.5,
               kw.get("window", (-1, -1))[0], kw.get("softcap", 0.0), config,
               append=(k, v, cos, sin, kw.get("interleaved", False)))
    assert torch.equal(q, q_before)  # q is rotated in registers only
    assert_close("out", out, exact[0], eager[0])
    written = k_before.isnan() & ~exact[1].isnan()  # the new tokens' slots
    for name, after, before, ex, ea in (("k_cache", kc, k_before, exact[1], eager[1]),
                                        ("v_cache", vc, v_before, exact[2], eager[2])):
        assert_close(name, after[written], ex[written], ea[written])
        assert torch.equal(after[~written].nan_to_num(), before[~written].nan_to_num())
    assert torch.equal(vc[written], eager[2][written])  # v is copied: bit for bit


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page", [None, 16])
@pytest.mark.parametrize("q_len", [1, 4])
def test_matches_pair(device, gen, dtype, page, q_len):
    """Lengths 0 (only the new tokens), 1, 17, and one that fills the cache to its last slot."""
    lengths = [0, 1, 17, 256 - q_len]
    q, k, v, kc, vc, L, table = make_case(lengths, q_len, 8, 2, 64, 256, dtype, device, gen, page)
    cos, sin = rope_tables(256, 64, device)
    run_and_check(q, k, v, kc, vc, L, cos, sin, table)


@pytest.mark.parametrize("head_dim, rot, interleaved", [(64, 32, False), (40, 24, True), (32, 32, True)])
@pytest.mark.parametrize("group", [1, 4])
def test_partial_rotary_gqa_window_softcap(device, gen, head_dim, rot, interleaved, group):
    q, k, v, kc, vc, L, table = make_case([3, 100, 0], 2, 8, 8 // group, head_dim, 128, torch.bfloat16, device,
                                          gen, 32)
    cos, sin = rope_tables(128, rot, device, torch.bfloat16)  # tables in q's dtype
    run_and_check(q, k, v, kc, vc, L, cos, sin, table, interleaved=interleaved, window=(20, 0), softcap=5.0)


@pytest.mark.parametrize("paged", [False, True])
def test_splits(device, gen, paged):
    """Three splits of 16-key tiles: split 0 writes and attends the new tokens, the others
    read only the cached keys; a split with no cached key but the new tokens (length 0)."""
    q, k, v, kc, vc, L, table = make_case([31, 97, 0], 2, 4, 2, 32, 128, torch.bfloat16, device, gen,
                                          32 if paged else None)
    cos, sin = rope_tables(128, 32, device)
    run_and_check(q, k, v, kc, vc, L, cos, sin, table, config=DecodeConfig(16, 2, 3))


def test_strided_and_float32(device, gen):
    """q, k, v as views into a packed qkv projection (the engine's layout), float32."""
    B, Q, H, KVH, D = 2, 3, 4, 2, 32
    qkv = torch.randn((B, Q, (H + 2 * KVH) * D), device=device, generator=gen)
    q, k, v = (t.view(B, Q, -1, D) for t in qkv.split([H * D, KVH * D, KVH * D], dim=-1))
    _, _, _, kc, vc, L, _ = make_case([5, 40], Q, H, KVH, D, 64, torch.float32, device, gen)
    cos, sin = rope_tables(64, D, device)
    run_and_check(q, k, v, kc, vc, L, cos, sin, None)


def test_opcheck(device, gen):
    """Schema, fake tensor and AOT dispatch of the custom op (what torch.compile relies on)."""
    q, k, v, kc, vc, L, table = make_case([3, 40], 2, 4, 2, 32, 64, torch.bfloat16, device, gen, 16)
    cos, sin = rope_tables(64, 32, device)
    torch.library.opcheck(_append_attention_op, (q, k, v, kc.nan_to_num(), vc.nan_to_num(), L, cos, sin, table,
                                                 torch.empty_like(q), False, 0.2, -1, 0.0, 0))


def test_bad_input(device, gen):
    q, k, v, kc, vc, L, _ = make_case([3, 5], 1, 4, 2, 32, 16, torch.float32, device, gen)
    cos, sin = rope_tables(16, 32, device)
    with pytest.raises(ValueError, match=r"k has shape \(2, 1, 4, 32\)"):
        append_attention(q, q, v, kc, vc, L, cos, sin)
    with pytest.raises(ValueError, match="cos has shape"):
        append_attention(q, k, v, kc, vc, L, cos[:, :0], sin[:, :0])
    with pytest.raises(TypeError, match="cache_seqlens has dtype torch.int64"):
        append_attention(q, k, v, kc, vc, L.long(), cos, sin)
    with pytest.raises(ValueError, match="window must be"):
        append_attention(q, k, v, kc, vc, L, cos, sin, window=(4, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("page", [None, 16])
def test_cuda_graph_replay(gen, page):
    """Captured once, replayed after the lengths change in place: each replay equals the
    same call run eagerly (out and cache, bit for bit)."""
    device = "cuda"
    q, k, v, kc, vc, L, table = make_case([40, 7, 1500], 2, 8, 2, 64, 2048, torch.bfloat16, device, gen, page)
    cos, sin = rope_tables(2048, 64, device)
    k0, v0, lens, out = kc.clone(), vc.clone(), L.clone(), torch.empty_like(q)

    def step():
        append_attention(q, k, v, kc, vc, lens, cos, sin, block_table=table, out=out, num_splits=3)

    def reset(lengths):
        lens.copy_(torch.tensor(lengths, dtype=torch.int32))
        kc.copy_(k0)
        vc.copy_(v0)

    graph, _ = capture(step)
    for lengths in ([40, 7, 1500], [0, 5, 1200]):
        reset(lengths)
        step()
        eager_out, eager_k = out.clone(), kc.clone()
        reset(lengths)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager_out) and torch.equal(kc.nan_to_num(), eager_k.nan_to_num())


@pytest.mark.gpu
def test_trigger_next_with_early_o_in_a_graph(gen, monkeypatch):
    """``trigger_next``: the attention kernel triggers the next kernel at its start, so the
    o GEMV (launched under PDL) is placed while the attention runs and loads its whole
    weight before it waits (the H100 launch of the 1B's o, forced here on any GPU). Captured
    in a graph and replayed on new tokens and lengths, attention + o + residual equal
    ordinary launches bit for bit, and the cache too."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    from onetrip.ops.gemv_norm import gemv_add_residual, loads_weight_early
    from onetrip.ops.skinny_matmul import GEMV_PICKS
    picks = dataclasses.replace(GEMV_PICKS, tuned_gpu={"": {(2048, 2048, "residual"): (4, 1024, 4, 2)}})
    device, dtype = "cuda", torch.bfloat16
    q, k, v, kc, vc, L, _ = make_case([300], 1, 32, 8, 64, 512, dtype, device, gen)
    cos, sin = rope_tables(512, 64, device)
    wo = (torch.randn((2048, 2048), device=device, generator=gen) * 0.02).to(dtype)
    res = torch.randn((1, 2048), device=device, generator=gen).to(dtype)
    assert loads_weight_early(wo, picks=picks)
    k0, v0, lens, out = kc.clone(), vc.clone(), L.clone(), torch.empty_like(q)

    def step(trigger):
        append_attention(q, k, v, kc, vc, lens, cos, sin, out=out, trigger_next=trigger)
        return gemv_add_residual(out.view(1, 2048), wo, res, picks=picks)[0]

    def new_inputs(length, seed):
        g = torch.Generator(device=device).manual_seed(seed)
        for t in (q, k, v, res):
            t.copy_(torch.randn(t.shape, device=device, generator=g).to(dtype))
        lens.fill_(length)
        kc.copy_(k0)
        vc.copy_(v0)

    expected = []
    monkeypatch.setenv("ONETRIP_PDL", "0")
    for length, seed in ((300, 1), (17, 2)):
        new_inputs(length, seed)
        expected.append((step(False).clone(), kc.clone()))
    monkeypatch.setenv("ONETRIP_PDL", "1")
    new_inputs(300, 3)
    graph, h = capture(lambda: step(True))
    for (length, seed), (h_ref, k_ref) in zip(((300, 1), (17, 2)), expected):
        new_inputs(length, seed)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(h, h_ref) and torch.equal(kc.nan_to_num(), k_ref.nan_to_num())
