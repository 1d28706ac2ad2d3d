"""flash_attention against the naive reference, under the accuracy rule of onetrip.testing.

On the CPU the kernel runs through Triton's interpreter, so shapes stay small; block sizes
are forced small in ``test_configs`` so that even short sequences cross several query
blocks and all three key ranges (left edge, unmasked interior, diagonal)."""

import importlib
import math
from dataclasses import astuple

import pytest
import torch

from onetrip.ops.flash_attention import AttentionConfig, attention_config, attention_ref, flash_attention
from onetrip.ops._attention_tma import TMA_TILES
from onetrip.testing import assert_close, poison_, upcast

from conftest import DEVICE, ON_GPU, assert_replay_matches

fa = importlib.import_module("onetrip.ops.flash_attention")  # onetrip.ops re-exports a function of that name

DTYPES = [torch.float16, torch.bfloat16]


def _qkv(batch, seq_q, seq_k, heads, kv_heads, head_dim, dtype, gen, scale=1.0):
    def rn(*shape):
        return (scale * torch.randn(shape, generator=gen, device=DEVICE)).to(dtype)
    return rn(batch, seq_q, heads, head_dim), rn(batch, seq_k, kv_heads, head_dim), rn(batch, seq_k, kv_heads, head_dim)


def _check(name, q, k, v, out, lse, **kw):
    """out and lse against the float64 reference, with PyTorch's error in q's dtype as the yardstick."""
    exact, exact_lse = attention_ref(*upcast(q, k, v), **kw, return_lse=True)
    eager, eager_lse = attention_ref(q, k, v, **kw, return_lse=True)
    assert_close(f"{name} out", out, exact, eager)
    assert lse.dtype == torch.float32 and lse.shape == exact_lse.shape
    # Rows that see no key: lse exactly -inf (the rule ignores non-finite exact values).
    assert torch.equal(torch.isneginf(lse.cpu()), torch.isneginf(exact_lse.cpu())), f"{name}: -inf rows differ"
    assert_close(f"{name} lse", lse, exact_lse, eager_lse)


# (batch, seq_q, seq_k, heads, kv_heads, head_dim, causal, window, softcap)
CASES = {
    "seq1": (2, 1, 1, 4, 4, 64, False, (-1, -1), 0.0),
    "seq1_causal_long_k": (2, 1, 40, 4, 2, 32, True, (-1, -1), 0.0),  # decode: the one query sees every key
    "seq17_gqa_causal": (2, 17, 17, 8, 2, 32, True, (-1, -1), 0.0),
    "113x203_mqa_causal": (1, 113, 203, 4, 1, 80, True, (-1, -1), 0.0),  # seq_q < seq_k
    "203x113_causal": (1, 203, 113, 2, 2, 128, True, (-1, -1), 0.0),  # seq_q > seq_k: 90 empty rows
    "257x259_gqa": (1, 257, 259, 4, 2, 64, False, (-1, -1), 0.0),
    "window": (1, 100, 130, 2, 2, 32, False, (20, 5), 0.0),
    "window_left_causal": (2, 77, 77, 2, 1, 64, True, (16, -1), 0.0),
    "window_q_gt_k": (1, 60, 30, 2, 2, 32, False, (3, 2), 0.0),  # most rows see nothing
    "softcap_causal": (1, 50, 61, 2, 2, 64, True, (-1, -1), 5.0),
    "1023x1024_causal": (1, 1023, 1024, 1, 1, 32, True, (-1, -1), 0.0),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(gen, case, dtype):
    b, sq, sk, h, hk, d, causal, window, cap = CASES[case]
    # softcap: larger scores (std ~3 before the cap of 5) so that tanh bends them.
    q, k, v = _qkv(b, sq, sk, h, hk, d, dtype, gen, scale=1.8 if cap else 1.0)
    out = poison_(torch.empty_like(q))
    got, lse = flash_attention(q, k, v, causal=causal, window=window, softcap=cap, return_lse=True, out=out)
    assert got is out
    _check(case, q, k, v, got, lse, causal=causal, window=window, softcap=cap)


@pytest.mark.parametrize("config", [(16, 16), (16, 32), (32, 16), (64, 64)])
@pytest.mark.parametrize("mask", ["causal", "window", "none"])
def test_configs(gen, config, mask):
    """Small tiles: many query blocks and key tiles, so every range of the key loop runs."""
    causal, window = {"causal": (True, (-1, -1)), "window": (True, (23, -1)), "none": (False, (-1, -1))}[mask]
    q, k, v = _qkv(1, 71, 97, 2, 1, 32, torch.bfloat16, gen)
    out = poison_(torch.empty_like(q))
    lse = poison_(torch.empty(1, 2, 71, device=DEVICE))
    right = 0 if causal else window[1]
    fa._launch(q, k, v, out, lse, None, None, 71, 32 ** -0.5, (window[0], right), 0.0,
               AttentionConfig(config[0], config[1], 4, 1))
    _check(f"{mask} {config}", q, k, v, out, lse, causal=causal, window=window)


@pytest.mark.parametrize("mask", ["causal", "window"])
def test_skips_masked_tiles(gen, mask):
    """Key tiles that no row of a query block sees are never loaded: NaN planted in them
    stays out of that block's rows (a loaded tile would spread it, as 0 * NaN = NaN)."""
    q, k, v = _qkv(1, 64, 64, 1, 1, 32, torch.bfloat16, gen)
    if mask == "causal":  # rows 0..47 never reach keys 48..63
        v[:, 48:] = float("nan")
        window, clean = (-1, 0), slice(0, 48)
    else:  # left = 20: the block of rows 48..63 starts at key 28, so skips tile 0..15
        v[:, :16] = float("nan")
        window, clean = (20, 0), slice(48, 64)
    out = torch.empty_like(q)
    fa._launch(q, k, v, out, None, None, None, 64, 32 ** -0.5, window, 0.0, AttentionConfig(16, 16, 4, 1))
    assert torch.isfinite(out[:, clean]).all()


# -- the TMA path: forced through _launch (on the CPU the interpreter emulates descriptors) ----

# Hopper or the interpreter; an older GPU runs the pointer path for every config.
TMA_HERE = not ON_GPU or torch.cuda.get_device_capability()[0] >= 9


def _launch_forced(q, k, v, config, causal=False, window=(-1, -1), softcap=0.0):
    """(out, lse) of one launch with ``config``, the window resolved as flash_attention does."""
    right = (0 if window[1] < 0 else min(window[1], 0)) if causal else window[1]
    out = poison_(torch.empty_like(q))
    lse = poison_(torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device))
    fa._launch(q, k, v, out, lse, None, None, q.shape[1], q.shape[-1] ** -0.5, (window[0], right), softcap, config)
    return out, lse


@pytest.fixture
def tma_calls(monkeypatch):
    """A list that grows by one each time a launch builds TMA descriptors."""
    calls, build = [], fa.descriptors
    monkeypatch.setattr(fa, "descriptors", lambda *a: calls.append(a[4:]) or build(*a))
    return calls


# case of CASES -> (block_m, block_n): small tiles, so each sequence spans several blocks
TMA_CASES = {"seq1": (16, 16), "seq17_gqa_causal": (16, 16), "113x203_mqa_causal": (32, 64),
             "203x113_causal": (64, 32), "window": (16, 32), "window_left_causal": (32, 16),
             "window_q_gt_k": (16, 16), "softcap_causal": (16, 16)}


@pytest.mark.skipif(not TMA_HERE, reason="TMA needs compute capability >= 9")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(TMA_CASES))
def test_tma_matches_reference(gen, tma_calls, case, dtype):
    b, sq, sk, h, hk, d, causal, window, cap = CASES[case]
    q, k, v = _qkv(b, sq, sk, h, hk, d, dtype, gen, scale=1.8 if cap else 1.0)
    out, lse = _launch_forced(q, k, v, AttentionConfig(*TMA_CASES[case], 4, 2, use_tma=True), causal, window, cap)
    assert len(tma_calls) == 1
    _check(f"tma {case}", q, k, v, out, lse, causal=causal, window=window, softcap=cap)


@pytest.mark.skipif(not TMA_HERE, reason="TMA needs compute capability >= 9")
@pytest.mark.parametrize("causal", [False, True])
def test_tma_stays_inside_its_tensors(gen, tma_calls, causal):
    """Views into NaN-filled buffers: head dim 80 of 128 columns, 40 of 50 key rows, 33 of
    37 query rows. The ragged key tile and the padded head dims read zeros (the copy
    engine's bounds), not the NaN beside them, and the store leaves the NaN it must not touch."""
    def inside(shape, rows):
        buf = torch.full((shape[0], rows, shape[2], 128), float("nan"), device=DEVICE, dtype=torch.bfloat16)
        buf[:, :shape[1], :, :shape[3]] = torch.randn(shape, generator=gen, device=DEVICE).to(torch.bfloat16)
        return buf, buf[:, :shape[1], :, :shape[3]]

    _, q = inside((2, 33, 4, 80), 37)
    _, k = inside((2, 40, 2, 80), 50)
    _, v = inside((2, 40, 2, 80), 50)
    obuf, out = inside((2, 33, 4, 80), 37)
    out.fill_(float("nan"))
    lse = torch.empty(2, 4, 33, device=DEVICE)
    fa._launch(q, k, v, out, lse, None, None, 33, 80 ** -0.5, (-1, 0 if causal else -1), 0.0,
               AttentionConfig(16, 32, 4, 2, use_tma=True))
    assert len(tma_calls) == 1
    _check(f"tma in NaN buffers causal={causal}", q, k, v, out, lse, causal=causal)
    assert obuf[..., 80:].isnan().all() and obuf[:, 33:].isnan().all()


def test_tma_only_where_allowed(gen, tma_calls):
    """Float32, packed varlen tensors, misaligned bases or strides: the pointer path, same tile."""
    q, k, v = _qkv(1, 24, 24, 2, 2, 64, torch.bfloat16, gen)
    assert fa.tma_supported(q, k, v, q, False) == TMA_HERE
    assert not fa.tma_supported(q.float(), k.float(), v.float(), q.float(), False)
    assert not fa.tma_supported(q, k, v, q, True)
    shifted = torch.empty(q.numel() + 1, dtype=q.dtype, device=DEVICE)[1:].view(q.shape).copy_(q)  # base + 2 bytes
    assert not fa.tma_supported(shifted, k, v, q, False)
    odd = torch.empty(1, 24, 2, 68, dtype=q.dtype, device=DEVICE)[..., :64]  # head stride 136 bytes
    assert not fa.tma_supported(q, k, v, odd, False)
    heads_outer = q.transpose(1, 2).contiguous().transpose(1, 2)  # transformers' (batch, heads, seq, dim)
    assert not fa.tma_supported(heads_outer, k, v, q, False)
    out, lse = _launch_forced(shifted, k, v, AttentionConfig(16, 16, 4, 2, use_tma=True), causal=True)
    assert not tma_calls
    _check("misaligned q, TMA config", shifted, k, v, out, lse, causal=True)


def test_tma_candidates():
    """TMA twins join the tuner's list for 16-bit queries over 512 at head dims 33-128,
    each beside its pointer twin; a cached pick from before use_tma existed still loads."""
    for head_dim, n in ((64, 3), (80, 3), (128, 3), (32, 0), (256, 0)):
        cands = fa.attention_candidates(head_dim, torch.float16, 513)
        tma = [c for c in cands if c.use_tma]
        assert len(tma) == n and all(AttentionConfig(*astuple(c)[:4]) in cands for c in tma)
        assert tma == [c for c in fa.attention_candidates(head_dim, torch.bfloat16) if c.use_tma]
    assert not any(c.use_tma for c in fa.attention_candidates(128, torch.bfloat16, 512))
    assert not any(c.use_tma for c in fa.attention_candidates(128, torch.float32))
    assert AttentionConfig(**{"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3}).use_tma is False


@pytest.mark.gpu
@pytest.mark.skipif(not TMA_HERE, reason="TMA needs compute capability >= 9")
@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_tma_tiles_on_gpu(tma_calls, head_dim, causal):
    """Every TMA tile the tuner may pick, at a length that is no multiple of any tile,
    against the reference; then one captured in a CUDA graph and replayed."""
    g = torch.Generator(device="cuda").manual_seed(head_dim + causal)
    q, k, v = _qkv(2, 1000, 1011, 8, 2, head_dim, torch.bfloat16, g)
    tiles = TMA_TILES[max(16, 2 ** math.ceil(math.log2(head_dim)))]
    for bm, bn, w, st in tiles:
        out, lse = _launch_forced(q, k, v, AttentionConfig(bm, bn, w, st, use_tma=True), causal)
        _check(f"tma {bm}x{bn} {w} warps {st} stages", q, k, v, out, lse, causal=causal)
    assert len(tma_calls) == len(tiles)
    assert_replay_matches(lambda: _launch_forced(q, k, v, AttentionConfig(*tiles[0], use_tma=True), causal))


@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128, 192, 256])
def test_head_dims(gen, head_dim):
    dtype = torch.float16 if head_dim % 64 else torch.bfloat16
    q, k, v = _qkv(1, 33, 41, 2, 1, head_dim, dtype, gen)
    out, lse = flash_attention(q, k, v, causal=True, out=poison_(torch.empty_like(q)), return_lse=True)
    _check(f"head_dim {head_dim}", q, k, v, out, lse, causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen(gen, dtype, causal):
    """Packed sequences of very different lengths, one with no queries, one with no keys."""
    q_lens, k_lens = [1, 0, 45, 7, 3], [1, 5, 70, 7, 0]
    cu_q = torch.tensor([0] + q_lens, device=DEVICE).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + k_lens, device=DEVICE).cumsum(0).to(torch.int32)
    q, k, v = _qkv(1, sum(q_lens), sum(k_lens), 6, 2, 64, dtype, gen)
    q, k, v = q[0], k[0], v[0]  # (tokens, heads, head_dim)
    out = poison_(torch.empty_like(q))
    got, lse = flash_attention(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                               max_seqlen_q=max(q_lens) + 3, max_seqlen_k=max(k_lens), return_lse=True, out=out)
    assert lse.shape == (6, sum(q_lens))
    _check(f"varlen causal={causal}", q, k, v, got, lse, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    # The sequence without keys: zeros and -inf; the batch element of a dense call agrees.
    assert torch.equal(got[-3:], torch.zeros_like(got[-3:])) and torch.isneginf(lse[:, -3:]).all()
    dense = flash_attention(q[1:46][None], k[6:76][None], v[6:76][None], causal=causal)
    torch.testing.assert_close(got[1:46], dense[0], rtol=0, atol=0)


def test_fully_masked_rows(gen):
    """Queries that see no key return zeros and lse = -inf, never NaN."""
    q, k, v = _qkv(2, 20, 6, 2, 2, 32, torch.bfloat16, gen)
    out, lse = flash_attention(q, k, v, causal=True, return_lse=True, out=poison_(torch.empty_like(q)))
    assert torch.equal(out[:, :14], torch.zeros_like(out[:, :14]))  # rows i < seq_q - seq_k
    assert torch.isneginf(lse[:, :, :14]).all() and torch.isfinite(lse[:, :, 14:]).all()
    assert not out.isnan().any()
    q, k, v = _qkv(1, 5, 0, 2, 1, 32, torch.float16, gen)  # no keys at all
    out, lse = flash_attention(q, k, v, return_lse=True, out=poison_(torch.empty_like(q)))
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_strided_inputs_and_scale(gen):
    """q, k, v as views of one packed qkv projection; a strided out; a custom scale."""
    qkv = torch.randn(2, 19, 3, 4, 64, generator=gen, device=DEVICE).to(torch.float16)
    q, k, v = qkv.unbind(2)  # non-contiguous (batch, seq, heads, head_dim) views
    out = poison_(torch.empty(2, 4, 19, 64, dtype=torch.float16, device=DEVICE)).transpose(1, 2)
    got, lse = flash_attention(q, k, v, causal=True, softmax_scale=0.3, out=out, return_lse=True)
    assert got is out
    _check("strided", q, k, v, got, lse, causal=True, softmax_scale=0.3)
    head_major = poison_(torch.empty(2, 19, 64, 4, dtype=torch.float16, device=DEVICE)).transpose(2, 3)
    flash_attention(q, k, v, causal=True, softmax_scale=0.3, out=head_major)  # stride(-1) != 1: scratch + copy
    torch.testing.assert_close(head_major, got, rtol=0, atol=0)


def test_float32(gen):
    q, k, v = _qkv(1, 37, 29, 2, 1, 64, torch.float32, gen)
    out, lse = flash_attention(q, k, v, window=(10, 3), return_lse=True, out=poison_(torch.empty_like(q)))
    _check("float32", q, k, v, out, lse, window=(10, 3))


@pytest.mark.skipif(ON_GPU, reason="the fallback only runs on the CPU without the interpreter")
def test_cpu_fallback_is_the_reference(gen, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = _qkv(1, 9, 12, 2, 1, 32, torch.bfloat16, gen)
    out, lse = flash_attention(q, k, v, causal=True, softcap=3.0, return_lse=True)
    ref, ref_lse = attention_ref(q, k, v, causal=True, softcap=3.0, return_lse=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


def test_compile_fullgraph(gen):
    q, k, v = _qkv(2, 13, 21, 4, 2, 32, torch.bfloat16, gen)
    cu = torch.tensor([0, 5, 13], dtype=torch.int32, device=DEVICE)

    def fn(q, k, v):
        o, lse = flash_attention(q, k, v, causal=True, window=(8, -1), return_lse=True)
        ov = flash_attention(q[0], q[0], q[0], cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=8)
        return o * 2, lse, ov

    eager = fn(q, k, v)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    for got, want in zip(compiled(q, k, v), eager):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.gpu
def test_cuda_graph_capture():
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = _qkv(2, 77, 93, 8, 2, 128, torch.bfloat16, g)
    cu = torch.tensor([0, 30, 77], dtype=torch.int32, device="cuda")

    def fn():
        o, lse = flash_attention(q, k, v, causal=True, return_lse=True)
        ov = flash_attention(q[0], k[0], v[0], cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=47)
        return o, lse, ov

    assert_replay_matches(fn)


def test_config_heuristic():
    for d in (32, 64, 80, 96, 128, 192, 256):
        cfg = attention_config(d)
        assert cfg.block_m * max(16, 2 ** math.ceil(math.log2(d))) <= 128 * 128  # accumulator registers
    assert attention_config(128, max_seqlen_q=1).block_m == 16
    assert attention_config(64, max_seqlen_q=100).block_m == 128
    # where the launch can use TMA: 64 x 64 tiles at 4 warps from 1024 queries, head dim <= 128
    assert attention_config(128, max_seqlen_q=2048, tma=True) == AttentionConfig(64, 64, 4, 3, use_tma=True)
    assert not attention_config(128, max_seqlen_q=512, tma=True).use_tma
    assert not attention_config(256, max_seqlen_q=4096, tma=True).use_tma


def test_bad_input():
    q = torch.randn(2, 5, 4, 32, device=DEVICE)
    k = torch.randn(2, 7, 2, 32, device=DEVICE)
    cu = torch.tensor([0, 5, 10], dtype=torch.int32, device=DEVICE)
    with pytest.raises(TypeError, match="k has dtype torch.float16 but q has torch.float32"):
        flash_attention(q, k.half(), k)
    with pytest.raises(ValueError, match=r"v has shape \(2, 6, 2, 32\) but k has \(2, 7, 2, 32\)"):
        flash_attention(q, k, k[:, :6])
    with pytest.raises(ValueError, match="q has 4 heads and k has 3"):
        flash_attention(q, k[:, :, :1].expand(2, 7, 3, 32), k[:, :, :1].expand(2, 7, 3, 32))
    with pytest.raises(ValueError, match="k has head_dim 16 but q has 32"):
        flash_attention(q, k[..., :16], k[..., :16])
    with pytest.raises(ValueError, match="head_dim is 512; supported: 1 to 256"):
        flash_attention(torch.randn(1, 2, 1, 512), torch.randn(1, 2, 1, 512), torch.randn(1, 2, 1, 512))
    with pytest.raises(ValueError, match="k has batch 1 but q has 2"):
        flash_attention(q, k[:1], k[:1])
    with pytest.raises(ValueError, match=r"expected \(batch, seq, heads, head_dim\)"):
        flash_attention(q[0], k[0], k[0])
    with pytest.raises(ValueError, match="must be given together"):
        flash_attention(q[0], k[0], k[0], cu_seqlens_q=cu)
    with pytest.raises(ValueError, match="cu_seqlens_k must be a 1-D int32 tensor"):
        flash_attention(q[0], k[0], k[0], cu_seqlens_q=cu, cu_seqlens_k=cu.long(), max_seqlen_q=5)
    with pytest.raises(ValueError, match="max_seqlen_q is required"):
        flash_attention(q[0], k[0], k[0], cu_seqlens_q=cu, cu_seqlens_k=cu)
    with pytest.raises(ValueError, match=r"window must be a \(left, right\) pair"):
        flash_attention(q, k, k, window=4)
    with pytest.raises(ValueError, match=r"window\[0\] must be an int >= -1, got -2"):
        flash_attention(q, k, k, window=(-2, 0))
    with pytest.raises(ValueError, match="softcap must be a finite float >= 0"):
        flash_attention(q, k, k, softcap=-1.0)
    with pytest.raises(TypeError, match="q has dtype torch.int64"):
        flash_attention(q.long(), k.long(), k.long())
    with pytest.raises(ValueError, match=r"out has shape \(2, 5, 4, 16\)"):
        flash_attention(q, k, k, out=torch.empty(2, 5, 4, 16, device=DEVICE))


@pytest.mark.gpu
def test_memory_is_linear_in_seq():
    """Peak extra memory (beyond inputs and output) grows ~linearly with seq for the kernel
    and ~quadratically for the reference, which materializes (B, H, S, S) scores."""
    def peak(fn, seq):
        q, k, v = (torch.randn(1, seq, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        fn(q, k, v, out)  # warm up: compile outside the measurement
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn(q, k, v, out)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    def ours(q, k, v, out):
        flash_attention(q, k, v, causal=True, out=out, return_lse=True)

    def ref(q, k, v, out):
        out.copy_(attention_ref(q, k, v, causal=True))

    small, large = 1024, 8192  # 8x the tokens
    ours_s, ours_l = peak(ours, small), peak(ours, large)
    ref_s, ref_l = peak(ref, small), peak(ref, large)
    assert ours_l <= 8 * max(ours_s, 8 * 1024 * 4) * 1.25, (ours_s, ours_l)  # linear: lse is 8 heads x seq fp32
    assert ref_l >= 40 * ref_s, (ref_s, ref_l)  # quadratic: 64x in theory
    assert ours_l * 100 < ref_l
