"""decode_attention against its op-by-op reference (the accuracy rule of onetrip.testing).

Caches hold NaN in every slot at or past a sequence's length, and paged block tables are
shuffled with garbage entries past the last used page: the kernel must never read them.
"""

import importlib

import pytest
import torch

from onetrip.ops.append_kv import append_kv
from onetrip.ops.decode_attention import DecodeConfig, decode_attention, decode_attention_ref, decode_config
from onetrip.testing import assert_close, poison_, upcast

from conftest import DTYPES, ON_GPU, capture, rope_tables

da = importlib.import_module("onetrip.ops.decode_attention")  # onetrip.ops re-exports a function of that name
dl = importlib.import_module("onetrip.ops._decode_launch")

LENGTHS = [0, 1, 17, 1023]  # mixed in one batch: empty, one key, ragged tile, a long one


def make_cache(lengths, max_seq, kv_heads, head_dim, dtype, device, gen, page=None, garbage=True):
    """(k_cache, v_cache, block_table, cache_seqlens) with NaN past each length.

    Paged: the pages of all sequences are a random permutation of the pool (plus spare
    pages); with ``garbage``, table entries past a sequence's last page are out of range."""
    B = len(lengths)
    L = torch.tensor(lengths, dtype=torch.int32, device=device)
    dense = [torch.randn((B, max_seq, kv_heads, head_dim), device=device, generator=gen).to(dtype) for _ in "kv"]
    unused = torch.arange(max_seq, device=device)[None, :] >= L[:, None].long()
    for t in dense:
        t[unused] = float("nan")
    if page is None:
        return dense[0], dense[1], None, L
    n = -(-max_seq // page)
    pool = B * n + 3
    table = torch.randperm(pool, device=device, generator=gen)[: B * n].view(B, n).to(torch.int32)
    caches = []
    for t in dense:
        c = torch.full((pool, page, kv_heads, head_dim), float("nan"), dtype=dtype, device=device)
        c[table.long()] = t.view(B, n, page, kv_heads, head_dim)
        caches.append(c)
    if not garbage:
        return caches[0], caches[1], table, L
    used_pages = -(-L.long() // page)  # entries at or past this index are never read
    table[torch.arange(n, device=device)[None, :] >= used_pages[:, None]] = 1 << 30
    return caches[0], caches[1], table, L


def check(out, q, k_cache, v_cache, L, table, **kw):
    exact = decode_attention_ref(*upcast(q, k_cache, v_cache), L, table, **kw)
    eager = decode_attention_ref(q, k_cache, v_cache, L, table, **kw)
    return assert_close("decode_attention", out, exact, eager)


def run(q, k_cache, v_cache, L, table, **kw):
    out = poison_(torch.empty_like(q))
    res = decode_attention(q, k_cache, v_cache, L, block_table=table, out=out, **kw)
    assert res is out
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page", [None, 16, 64])
@pytest.mark.parametrize("q_len", [1, 4])
def test_matches_reference(device, gen, dtype, page, q_len):
    kvh, group, D = 2, 4, 64
    q = torch.randn((len(LENGTHS), q_len, kvh * group, D), device=device, generator=gen).to(dtype)
    k, v, table, L = make_cache(LENGTHS, 1024, kvh, D, dtype, device, gen, page)
    check(run(q, k, v, L, table), q, k, v, L, table)


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [32, 40])  # 40: not a power of two, masked columns
def test_gqa_ratios(device, gen, group, head_dim):
    kvh = 2 if group < 8 else 1
    q = torch.randn((3, 2, kvh * group, head_dim), device=device, generator=gen).to(torch.bfloat16)
    k, v, table, L = make_cache([5, 300, 129], 320, kvh, head_dim, torch.bfloat16, device, gen, page=16)
    check(run(q, k, v, L, table), q, k, v, L, table)


@pytest.mark.parametrize("head_dim", [16, 128, 256])  # 256: tiles of 32 keys
def test_head_dims(device, gen, head_dim):
    q = torch.randn((2, 3, 4, head_dim), device=device, generator=gen).to(torch.float16)
    k, v, table, L = make_cache([70, 128], 128, 2, head_dim, torch.float16, device, gen, page=32)
    check(run(q, k, v, L, table), q, k, v, L, table)
    check(run(q, k, v, L, table, num_splits=2), q, k, v, L, table)


@pytest.mark.parametrize("window, softcap", [((0, 0), 0.0), ((5, -1), 0.0), ((100, 0), 0.0), ((-1, -1), 5.0),
                                             ((37, -1), 2.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_window_and_softcap(device, gen, window, softcap, dtype):
    # Lengths below q_len leave the first queries with no visible key (zeros). In 293, 612
    # and 709 the first query's window starts 1-4 keys before a 64-key tile whose start is
    # the last query's window start (for left = 37, 100, 5): a range computed from the last
    # query would drop them. 2.0 * q makes the softcap bend the scores, not pass them.
    q = 2.0 * torch.randn((5, 4, 4, 64), device=device, generator=gen)
    q = q.to(dtype)
    k, v, table, L = make_cache([2, 4, 293, 612, 709], 768, 1, 64, dtype, device, gen, page=64)
    kw = dict(window=window, softcap=softcap)
    check(run(q, k, v, L, table, **kw), q, k, v, L, table, **kw)
    # Splits over a window: the split ranges cover the window, not the whole sequence.
    check(run(q, k, v, L, table, num_splits=4, **kw), q, k, v, L, table, **kw)


@pytest.mark.parametrize("page", [None, 16] if ON_GPU else [None])  # paged splits on the CPU: test_paged
def test_splits_agree(device, gen, page):
    """Forced split counts, including more splits than tiles (empty splits, lse = -inf)."""
    q = torch.randn((3, 4, 8, 64), device=device, generator=gen).to(torch.float16)
    k, v, table, L = make_cache([0, 33, 1000], 1024, 2, 64, torch.float16, device, gen, page)
    outs = []
    for splits in (1, 3, 7, 40):
        outs.append(run(q, k, v, L, table, num_splits=splits))
        check(outs[-1], q, k, v, L, table)
    for o in outs[1:]:  # the same result up to float32 rounding of the merge, seen through fp16
        torch.testing.assert_close(o, outs[0], rtol=2e-3, atol=2e-4)
    assert torch.equal(outs[0][0], torch.zeros_like(outs[0][0]))  # length 0: zeros


def test_layouts_and_scale(device, gen):
    """q a slice of a fused QKV buffer, out a transposed view (no unit stride along
    head_dim), an explicit softmax_scale, and float32 caches."""
    qkv = torch.randn((2, 3, 12, 64), device=device, generator=gen)
    q = qkv[:, :, :8]  # (2, 3, 8, 64) view: heads stride 64, seq stride 768
    k, v, table, L = make_cache([3, 250], 256, 2, 64, torch.float32, device, gen)
    out = poison_(torch.empty((64, 8, 3, 2), device=device)).permute(3, 2, 1, 0)
    decode_attention(q, k, v, L, softmax_scale=0.3, out=out)
    check(out, q, k, v, L, table, softmax_scale=0.3)


def test_config_heuristic():
    cpu = torch.device("cpu")  # a nominal 4 SMs: one wave is 4 programs
    assert decode_config(1, 1, 4096, 128, cpu) == DecodeConfig(128, 8, 4, min_tiles=2)
    assert decode_config(1, 1, 1000, 128, cpu).num_splits == 2  # one split per 4 tiles of max_seq
    assert decode_config(1, 1, 1000, 128, cpu).min_tiles == 4  # from 4K slots: one per 2 tiles
    assert decode_config(1, 1, 4096, 128, cpu, waves=16).num_splits == 16
    assert decode_config(1, 1, 4096, 128, cpu, waves=2).num_splits == 8
    assert decode_config(1, 3, 4096, 128, cpu).num_splits == 1  # 3 programs: a second split passes the wave
    assert decode_config(64, 8, 4096, 128, cpu).num_splits == 1
    assert decode_config(1, 2, 4096, 256, cpu).block_n == 32
    # several waves of short contiguous caches: 32-key tiles at 4 warps; long: 128
    assert decode_config(64, 8, 1024, 128, cpu) == DecodeConfig(32, 4, 1)
    # paged: the same short rule, with the table a tile ahead; else 64-key tiles (4 warps
    # under two programs an SM before splitting) and the 128-key split count
    assert decode_config(64, 8, 1024, 128, cpu, paged=True) == DecodeConfig(32, 4, 1, table_ahead=True)
    assert decode_config(32, 8, 4096, 128, cpu, paged=True) == DecodeConfig(64, 8, 1, table_ahead=True,
                                                                             min_tiles=2)  # >= 2 an SM
    assert decode_config(1, 1, 4096, 128, cpu, paged=True, waves=1) == DecodeConfig(64, 4, 4, table_ahead=True,
                                                                                     min_tiles=2)
    assert decode_config(1, 1, 4096, 128, cpu, paged=True) == DecodeConfig(64, 4, 8, table_ahead=True, min_tiles=2)
    assert decode_config(64, 8, 4096, 128, cpu).block_n == 128


@pytest.fixture
def poisoned_empty(monkeypatch):
    """torch.empty returns NaN-filled floating tensors: the split workspace comes poisoned."""
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: (lambda t: poison_(t) if t.is_floating_point() else t)(
        empty(*a, **kw)))


@pytest.mark.parametrize("paged, table_ahead", [(False, False), (True, False), (True, True)])
def test_launch_config(device, gen, paged, table_ahead, poisoned_empty):
    """The launch with an explicit config: smaller tiles, splits, lengths that end mid-tile,
    on one tile, and at 0; paged, the block-table entries loaded a tile ahead or not. The
    workspace comes poisoned (NaN): splits that saw no key must not leak it into the merge."""
    q = torch.randn((3, 2, 4, 32), device=device, generator=gen).to(torch.bfloat16)
    k, v, table, L = make_cache([31, 97, 0], 128, 2, 32, torch.bfloat16, device, gen, page=32 if paged else None)
    out = poison_(torch.empty_like(q))
    dl.launch(q, k, v, L, table, out, 32 ** -0.5, -1, 0.0, DecodeConfig(16, 2, 3, table_ahead))
    check(out, q, k, v, L, table)


def test_merge_over_several_chunks(device, gen):
    """The merge kernel folds the splits CHUNK_S at a time as an online softmax: 16 rows of
    head dim 128 give chunks of 2 splits, so 7 splits take 4 chunks. Lengths leave whole
    chunks of splits empty (lse = -inf throughout) before and after ones that saw keys."""
    q = torch.randn((3, 2, 16, 128), device=device, generator=gen).to(torch.bfloat16)  # group 8 x q_len 2
    k, v, _, L = make_cache([448, 65, 0], 448, 2, 128, torch.bfloat16, device, gen)
    assert dl._merge_chunk(7, 16, 128, 4) == 2
    out = poison_(torch.empty_like(q))
    dl.launch(q, k, v, L, None, out, 128 ** -0.5, -1, 0.0, DecodeConfig(16, 4, 7))
    check(out, q, k, v, L, None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback runs on the CPU only")
def test_cpu_fallback(gen, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # use_triton() -> False: the float32 reference
    q = torch.randn((2, 2, 4, 32), generator=gen).to(torch.bfloat16)
    k, v, table, L = make_cache([1, 60], 64, 2, 32, torch.bfloat16, "cpu", gen, page=16)
    kw = dict(window=(20, 0), softcap=3.0)
    check(run(q, k, v, L, table, **kw), q, k, v, L, table, **kw)


@pytest.mark.parametrize("page", [None, 16])
def test_append_then_attend(device, gen, page):
    """A decode step as the engine runs it: append_kv, lengths += q_len, decode_attention."""
    B, Q, H, KVH, D, S = 3, 2, 8, 2, 32, 128
    # garbage=False: the append writes into pages past the current lengths.
    k, v, table, L = make_cache([0, 15, 100], S, KVH, D, torch.bfloat16, device, gen, page, garbage=False)
    inv = 10000.0 ** (-torch.arange(0, D, 2, device=device, dtype=torch.float64) / D)
    ang = torch.arange(S, device=device, dtype=torch.float64)[:, None] * inv
    q = torch.randn((B, Q, H, D), device=device, generator=gen).to(torch.bfloat16)
    kn, vn = (torch.randn((B, Q, KVH, D), device=device, generator=gen).to(torch.bfloat16) for _ in "kv")
    append_kv(q, kn, vn, k, v, L, ang.cos().float(), ang.sin().float(), block_table=table)
    L += Q
    check(run(q, k, v, L, table), q, k, v, L, table)  # q, k, v as the append left them


def test_opcheck(device, gen):
    """Schema, fake tensor and AOT dispatch of the custom op (what torch.compile relies on)."""
    q = torch.randn((2, 2, 4, 32), device=device, generator=gen).to(torch.bfloat16)
    k, v, table, L = make_cache([3, 40], 64, 2, 32, torch.bfloat16, device, gen, page=16)
    torch.library.opcheck(da._decode_op, (q, k, v, L, table, torch.empty_like(q), 0.2, -1, 0.0, 2))


def test_bad_input(device):
    q = torch.randn(2, 1, 4, 32, device=device)
    k = torch.randn(2, 16, 2, 32, device=device)
    L = torch.tensor([3, 5], dtype=torch.int32, device=device)
    with pytest.raises(TypeError, match="cache_seqlens has dtype torch.int64"):
        decode_attention(q, k, k, L.long())
    with pytest.raises(ValueError, match=r"cache_seqlens has shape \(1,\)"):
        decode_attention(q, k, k, L[:1])
    with pytest.raises(TypeError, match="k_cache has dtype torch.float16 but q has torch.float32"):
        decode_attention(q, k.half(), k.half(), L)
    with pytest.raises(ValueError, match="heads must be a multiple of kv_heads"):
        decode_attention(q, torch.randn(2, 16, 3, 32, device=device), torch.randn(2, 16, 3, 32, device=device), L)
    with pytest.raises(ValueError, match="k_cache has head_dim 16 but q has 32"):
        decode_attention(q, k[..., :16], k[..., :16], L)
    with pytest.raises(ValueError, match=r"v_cache has shape \(2, 8, 2, 32\)"):
        decode_attention(q, k, k[:, :8], L)
    with pytest.raises(ValueError, match="q has q_len 17"):
        decode_attention(torch.randn(2, 17, 4, 32, device=device), k, k, L)
    with pytest.raises(ValueError, match="q must have at least 4 dimension"):
        decode_attention(q[0], k, k, L)
    with pytest.raises(ValueError, match=r"q has shape \(1, 2, 1, 4, 32\)"):
        decode_attention(q[None], k, k, L)
    with pytest.raises(ValueError, match="window must be"):
        decode_attention(q, k, k, L, window=(4, 2))
    with pytest.raises(ValueError, match="softcap must be"):
        decode_attention(q, k, k, L, softcap=-1.0)
    with pytest.raises(ValueError, match="num_splits must be"):
        decode_attention(q, k, k, L, num_splits=0)
    with pytest.raises(ValueError, match="a contiguous cache is"):
        decode_attention(q, k[:1], k[:1], L)
    with pytest.raises(TypeError, match="block_table has dtype torch.int64"):
        decode_attention(q, k, k, L, block_table=torch.zeros(2, 4, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="unit stride along head_dim"):
        kt = torch.randn(2, 16, 32, 2, device=device).transpose(-1, -2)
        decode_attention(q, kt, kt, L)
    with pytest.raises(TypeError, match="out has dtype torch.float16"):
        decode_attention(q, k, k, L, out=torch.empty(2, 1, 4, 32, device=device, dtype=torch.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("page", [None, 16])
def test_cuda_graph_capture(gen, page):
    """append_kv + decode_attention captured once, replayed after cache_seqlens changes in
    place: nothing in either call may depend on the lengths' values at capture time. Each
    replay must equal the same step run eagerly, and pass the accuracy rule. Three splits
    and their merge kernel."""
    device = "cuda"
    B, Q, H, KVH, D, S = 3, 2, 8, 2, 64, 2048
    k, v, table, L = make_cache([40, 7, 1500], S, KVH, D, torch.bfloat16, device, gen, page, garbage=False)
    cos, sin = rope_tables(S, D, device)
    q_in = torch.randn((B, Q, H, D), device=device, generator=gen).to(torch.bfloat16)
    k_in = torch.randn((B, Q, KVH, D), device=device, generator=gen).to(torch.bfloat16)
    v_in = torch.randn((B, Q, KVH, D), device=device, generator=gen).to(torch.bfloat16)
    q, lens, out, seq_after = q_in.clone(), L.clone(), torch.empty_like(q_in), torch.empty_like(L)
    k0, v0 = k.clone(), v.clone()

    def step():
        append_kv(q, k_in, v_in, k, v, lens, cos, sin, block_table=table)
        torch.add(lens, Q, out=seq_after)  # the new tokens now count
        decode_attention(q, k, v, seq_after, block_table=table, out=out, num_splits=3)

    def reset(lengths):
        lens.copy_(torch.tensor(lengths, dtype=torch.int32))
        q.copy_(q_in)
        k.copy_(k0)
        v.copy_(v0)

    graph, _ = capture(step)
    for lengths in ([40, 7, 1500], [0, 5, 1200]):  # within what make_cache filled (NaN beyond)
        reset(lengths)
        step()
        eager_out, eager_k = out.clone(), k.clone()
        reset(lengths)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager_out) and torch.equal(k.nan_to_num(), eager_k.nan_to_num())
        check(out, q, k, v, seq_after, table)
