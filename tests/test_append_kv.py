"""append_kv against its op-by-op reference (rotary in the input dtype + index_put)."""

import pytest
import torch

from onetrip.ops.append_kv import _append_kv_op, append_config, append_kv, append_kv_ref
from onetrip.testing import assert_close, upcast

from conftest import DTYPES, rope_tables


def randn(shape, dtype, device, gen):
    return torch.randn(shape, device=device, generator=gen).to(dtype)


def make_case(lengths, q_len, heads, kv_heads, head_dim, max_seq, dtype, device, gen, page=None):
    """New tokens, caches and (paged) a shuffled block table; the slots the append will
    write hold NaN beforehand, so one it misses fails the check."""
    B = len(lengths)
    L = torch.tensor(lengths, dtype=torch.int32, device=device)
    q = randn((B, q_len, heads, head_dim), dtype, device, gen)
    k = randn((B, q_len, kv_heads, head_dim), dtype, device, gen)
    v = randn((B, q_len, kv_heads, head_dim), dtype, device, gen)
    pos = L.long()[:, None] + torch.arange(q_len, device=device)
    rows = torch.arange(B, device=device)[:, None].expand_as(pos)
    if page is None:
        kc = randn((B, max_seq, kv_heads, head_dim), dtype, device, gen)
        vc = randn((B, max_seq, kv_heads, head_dim), dtype, device, gen)
        table = None
        kc[rows, pos] = float("nan")
        vc[rows, pos] = float("nan")
    else:
        n = max_seq // page
        pool = B * n + 2
        table = torch.randperm(pool, device=device, generator=gen)[: B * n].view(B, n).to(torch.int32)
        kc = randn((pool, page, kv_heads, head_dim), dtype, device, gen)
        vc = randn((pool, page, kv_heads, head_dim), dtype, device, gen)
        blocks = table.long()[rows, pos // page]
        kc[blocks, pos % page] = float("nan")
        vc[blocks, pos % page] = float("nan")
    return q, k, v, kc, vc, L, table


def run_and_check(q, k, v, kc, vc, L, cos, sin, table, interleaved=False):
    exact = append_kv_ref(*upcast(q, k, v, kc, vc), L, *upcast(cos, sin), table, interleaved)
    eager = append_kv_ref(q, k, v, kc, vc, L, cos, sin, table, interleaved)
    k_before, v_before = kc.clone(), vc.clone()
    res = append_kv(q, k, v, kc, vc, L, cos, sin, block_table=table, interleaved=interleaved)
    assert res is q
    for name, o, e, t in zip(("q", "k_cache", "v_cache"), (q, kc, vc), exact, eager):
        assert_close(name, o, e, t)
    # Every slot other than the new tokens' is untouched, bit for bit (NaN marks the new ones).
    for before, after in ((k_before, kc), (v_before, vc)):
        keep = ~before.isnan()
        assert torch.equal(after[keep], before[keep])
    assert torch.equal(vc, eager[2])  # v is copied, not computed: bit for bit


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page", [None, 16, 64])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("q_len", [1, 4])
def test_matches_reference(device, gen, dtype, page, interleaved, q_len):
    # Lengths 0, 1, 17 and 1023 - q_len (the last token lands in the last slot); with pages
    # of 16, length 14 and q_len 4 straddle a page boundary.
    lengths = [0, 1, 14, 17, 1024 - q_len]
    q, k, v, kc, vc, L, table = make_case(lengths, q_len, 8, 2, 64, 1024, dtype, device, gen, page)
    cos, sin = rope_tables(1024, 64, device)
    run_and_check(q, k, v, kc, vc, L, cos, sin, table, interleaved)


@pytest.mark.parametrize("head_dim, rot", [(64, 32), (32, 32), (40, 24)])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_partial_rotary_and_gqa(device, gen, head_dim, rot, group):
    q, k, v, kc, vc, L, table = make_case([3, 100], 2, 8, 8 // group, head_dim, 128, torch.bfloat16, device, gen, 16)
    cos, sin = rope_tables(128, rot, device, torch.bfloat16)  # tables in q's dtype
    run_and_check(q, k, v, kc, vc, L, cos, sin, table, interleaved=rot == 24)


def test_strided_inputs(device, gen):
    """q, k, v as slices of one fused QKV output: q rotated in place inside the buffer;
    a q with no unit head_dim stride goes through a copy written back."""
    B, S, H, KVH, D = 2, 3, 4, 2, 32
    qkv = randn((B, S, H + 2 * KVH, D), torch.float16, device, gen)
    q, k, v = qkv[:, :, :H], qkv[:, :, H:H + KVH], qkv[:, :, H + KVH:]
    _, _, _, kc, vc, L, table = make_case([5, 9], S, H, KVH, D, 64, torch.float16, device, gen, 16)
    cos, sin = rope_tables(64, D, device)
    run_and_check(q, k, v, kc, vc, L, cos, sin, table)
    qt = randn((B, S, H, D), torch.float16, device, gen).transpose(-1, -2).contiguous().transpose(-1, -2)
    assert qt.stride(-1) != 1
    run_and_check(qt, k, v, kc, vc, L, cos, sin, table)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback runs on the CPU only")
@pytest.mark.parametrize("page", [None, 16])
def test_cpu_fallback(gen, monkeypatch, page):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # use_triton() -> False: the float32 reference
    q, k, v, kc, vc, L, table = make_case([0, 30], 3, 4, 2, 32, 64, torch.bfloat16, "cpu", gen, page)
    cos, sin = rope_tables(64, 32, "cpu")
    run_and_check(q, k, v, kc, vc, L, cos, sin, table, interleaved=True)


def test_opcheck(device, gen):
    """Schema, fake tensor and AOT dispatch of the custom op (what torch.compile relies on)."""
    q, k, v, kc, vc, L, table = make_case([3, 40], 2, 4, 2, 32, 64, torch.bfloat16, device, gen, 16)
    cos, sin = rope_tables(64, 32, device)
    torch.library.opcheck(_append_kv_op, (q, k, v, kc.nan_to_num(), vc.nan_to_num(), L, cos, sin, table, False))


def test_config():
    """Enough tokens to fill the SMs (4 nominal on the CPU): one token a program, 8 heads
    at a time; fewer keep the rotary rule (one token, all heads)."""
    cpu = torch.device("cpu")
    assert (append_config(4096, 32, 64, cpu).block_t, append_config(4096, 32, 64, cpu).block_h) == (1, 8)
    assert append_config(4096, 4, 64, cpu).block_h == 4
    assert append_config(2, 32, 64, cpu).block_h == 32


def test_bad_input(device):
    q = torch.randn(2, 1, 4, 32, device=device)
    k = torch.randn(2, 1, 2, 32, device=device)
    kc = torch.randn(2, 16, 2, 32, device=device)
    L = torch.tensor([3, 5], dtype=torch.int32, device=device)
    cos, sin = rope_tables(16, 32, device)
    with pytest.raises(ValueError, match=r"k has shape \(2, 1, 1, 32\)"):
        append_kv(q, k[:, :, :1], k, kc, kc.clone(), L, cos, sin)
    with pytest.raises(ValueError, match=r"v has shape \(2, 1, 2, 16\)"):
        append_kv(q, k, k[..., :16], kc, kc.clone(), L, cos, sin)
    with pytest.raises(TypeError, match="v has dtype torch.float16 but q has torch.float32"):
        append_kv(q, k, k.half(), kc, kc.clone(), L, cos, sin)
    with pytest.raises(TypeError, match="cache_seqlens has dtype torch.int64"):
        append_kv(q, k, k, kc, kc.clone(), L.long(), cos, sin)
    with pytest.raises(ValueError, match="rot_dim <= head_dim = 32"):
        append_kv(q, k, k, kc, kc.clone(), L, *rope_tables(16, 64, device))
    with pytest.raises(ValueError, match=r"sin has shape \(16, 8\)"):
        append_kv(q, k, k, kc, kc.clone(), L, cos, sin[:, :8])
    with pytest.raises(TypeError, match="cos has dtype torch.float16"):
        append_kv(q, k, k, kc, kc.clone(), L, cos.half(), sin.half())
    with pytest.raises(ValueError, match="k_cache must have unit stride along head_dim"):
        kt = torch.randn(2, 16, 32, 2, device=device).transpose(-1, -2)
        append_kv(q, k, k, kt, kt, L, cos, sin)
    with pytest.raises(ValueError, match="block_table must be a"):
        append_kv(q, k, k, kc, kc.clone(), L, cos, sin, block_table=torch.zeros(2, dtype=torch.int32, device=device))
