"""append_attention_o (append_attention + o projection + residual add, one launch) against
the unfused chain op by op (``append_attention_o_ref``), with the accuracy rule of
onetrip.testing: in float64 (exact) and in the input dtype (PyTorch's own error).

The caches hold NaN at and past each length (the slot the append writes included): a
read past the cached range or a missed write fails. h is poisoned before the kernel
writes it; several column blocks and weight chunks run through small configs.
"""

import importlib

import pytest
import torch

from onetrip.ops.attention_o import AttentionOConfig, append_attention_o, append_attention_o_ref, attention_o_config
from onetrip.ops.gemv_norm import gemv_rms_norm, gemv_rms_norm_ref
from onetrip.testing import assert_close, poison_, upcast

from conftest import DTYPES, rope_tables
from test_decode_attention import make_cache

ao = importlib.import_module("onetrip.ops.attention_o")


def make_case(length, heads, kv_heads, head_dim, n, max_seq, dtype, device, gen, page=None):
    q = torch.randn((1, 1, heads, head_dim), device=device, generator=gen).to(dtype)
    k, v = (torch.randn((1, 1, kv_heads, head_dim), device=device, generator=gen).to(dtype) for _ in "kv")
    kc, vc, table, L = make_cache([length], max_seq, kv_heads, head_dim, dtype, device, gen, page, garbage=False)
    w = (torch.randn((n, heads * head_dim), device=device, generator=gen) / (heads * head_dim) ** 0.5).to(dtype)
    res = torch.randn((1, n), device=device, generator=gen).to(dtype)
    return q, k, v, kc, vc, L, table, w, res


def run_and_check(q, k, v, kc, vc, L, cos, sin, table, w, res, config=None, interleaved=False):
    exact = append_attention_o_ref(*upcast(q, k, v, kc, vc), L, *upcast(cos, sin, w, res), table, interleaved)
    eager = append_attention_o_ref(q, k, v, kc, vc, L, cos, sin, w, res, table, interleaved)
    k_before, v_before, q_before = kc.clone(), vc.clone(), q.clone()
    if config is None:
        h, ss = append_attention_o(q, k, v, kc, vc, L, cos, sin, w, res, block_table=table, interleaved=interleaved)
    else:
        n = w.shape[0]
        h = poison_(torch.empty((1, n), dtype=q.dtype, device=q.device))
        ss = poison_(torch.empty((-(-n // config.rows),), dtype=torch.float32, device=q.device))
        ao._launch(q, k, v, kc, vc, L, cos, sin, w, res, h, ss, table, interleaved, q.shape[-1] ** -0.5, config)
    assert torch.equal(q, q_before)
    assert_close("h", h, exact[0], eager[0])
    written = k_before.isnan() & ~exact[1].isnan()  # the new token's slots
    for name, after, before, ex, ea in (("k_cache", kc, k_before, exact[1], eager[1]),
                                        ("v_cache", vc, v_before, exact[2], eager[2])):
        assert_close(name, after[written], ex[written], ea[written])
        assert torch.equal(after[~written].nan_to_num(), before[~written].nan_to_num())
    # the partials sum to h's sum of squares (of the rounded h), in float32
    torch.testing.assert_close(ss.double().sum(), h.double().square().sum(), rtol=1e-5, atol=1e-6)
    return h, ss


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", [0, 1, 17, 127])
def test_matches_chain(device, gen, dtype, length):
    """Lengths 0 (only the new token), 1, 17, and one that fills the cache to its last slot;
    three column blocks of two chunks, the last block ragged (N = 111)."""
    q, k, v, kc, vc, L, table, w, res = make_case(length, 8, 2, 32, 111, 128, dtype, device, gen)
    cos, sin = rope_tables(128, 32, device)
    run_and_check(q, k, v, kc, vc, L, cos, sin, table, w, res, AttentionOConfig(48, 16, block_n=32, num_warps=4))


@pytest.mark.parametrize("page", [16, 64])
def test_paged(device, gen, page):
    q, k, v, kc, vc, L, table, w, res = make_case(100, 4, 1, 64, 64, 192, torch.bfloat16, device, gen, page)
    cos, sin = rope_tables(192, 64, device)
    run_and_check(q, k, v, kc, vc, L, cos, sin, table, w, res, AttentionOConfig(32, 32, block_n=16, num_warps=4))


@pytest.mark.parametrize("heads, kv_heads, head_dim, rot, interleaved", [
    (14, 2, 40, 24, True),   # group 7 (Qwen2.5-0.5B's), head_dim and rotary part not powers of two
    (4, 4, 16, 16, False),   # no GQA
    (8, 1, 32, 16, False),   # one kv head: every program is the last of its block
])
def test_groups_and_rotary(device, gen, heads, kv_heads, head_dim, rot, interleaved):
    q, k, v, kc, vc, L, table, w, res = make_case(33, heads, kv_heads, head_dim, 17, 64, torch.bfloat16, device, gen)
    cos, sin = rope_tables(64, rot, device, torch.bfloat16)
    run_and_check(q, k, v, kc, vc, L, cos, sin, table, w, res, AttentionOConfig(8, 4, block_n=16, num_warps=4),
                  interleaved=interleaved)


def test_default_config_twice_and_feeds_gemv_rms_norm(device, gen):
    """The default launch twice in a row (the tickets re-arm), the second on the cache the
    first wrote; its (h, ss) as gemv_rms_norm's input equal the unfused norm + GEMV."""
    q, k, v, kc, vc, L, table, w, res = make_case(20, 8, 2, 32, 96, 64, torch.bfloat16, device, gen)
    cos, sin = rope_tables(64, 32, device)
    run_and_check(q, k, v, kc, vc, L, cos, sin, table, w, res)
    L += 1
    h, ss = run_and_check(q, k, v, kc, vc, L, cos, sin, table, w, res)
    g = torch.randn(96, device=device, generator=gen).to(torch.bfloat16)
    w2 = torch.randn((40, 96), device=device, generator=gen).to(torch.bfloat16)
    out = gemv_rms_norm(h, ss, g, 1e-6, w2)
    ref = gemv_rms_norm_ref(h.double(), g.double(), 1e-6, w2.double())
    eager = gemv_rms_norm_ref(h, g, 1e-6, w2)
    assert_close("out", out, ref, eager)


def test_config_rule():
    cpu = torch.device("cpu")  # a nominal 4 SMs
    cfg = attention_o_config(2048, 8, 4, 64, cpu)
    assert cfg.rows == 2048 and cfg.block_r == 128 and 2048 % cfg.block_r == 0


@pytest.mark.parametrize("bad, match", [
    (dict(q=(1, 2, 8, 32)), "one token of one sequence"),
    (dict(w=(96, 100)), "weight has shape"),
    (dict(res=(1, 95)), "residual has shape"),
    (dict(w_dtype=torch.float16), "weight"),
])
def test_bad_input(device, gen, bad, match):
    q, k, v, kc, vc, L, table, w, res = make_case(5, 8, 2, 32, 96, 64, torch.bfloat16, device, gen)
    cos, sin = rope_tables(64, 32, device)
    if "q" in bad:
        q = torch.randn(bad["q"], device=device).to(torch.bfloat16)
        k, v = (torch.randn((1, 2, 2, 32), device=device).to(torch.bfloat16) for _ in "kv")
    if "w" in bad:
        w = torch.randn(bad["w"], device=device).to(torch.bfloat16)
    if "res" in bad:
        res = torch.randn(bad["res"], device=device).to(torch.bfloat16)
    if "w_dtype" in bad:
        w = w.to(bad["w_dtype"])
    with pytest.raises((ValueError, TypeError), match=match):
        append_attention_o(q, k, v, kc, vc, L, cos, sin, w, res)
