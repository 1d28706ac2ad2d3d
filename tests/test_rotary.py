import pytest
import torch

from onetrip.ops import rotary
from onetrip.ops.rotary import RotaryConfig, apply_rotary, apply_rotary_ref
from onetrip.testing import assert_close, poison_, upcast

from conftest import DTYPES, rope_tables


def randn(shape, dtype, device, gen):
    return torch.randn(shape, device=device, generator=gen).to(dtype)


def check(outs, q, k, cos, sin, positions=None, interleaved=False):
    exact = apply_rotary_ref(*upcast(q, k, cos, sin), positions, interleaved)
    eager = apply_rotary_ref(q, k, cos, sin, positions, interleaved)
    for name, o, e, t in zip(("q", "k"), outs, exact, eager):
        assert_close(name, o, e, t)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("head_dim, rot", [(64, 32), (80, 80), (34, 34), (34, 18)])
def test_matches_reference(device, gen, dtype, interleaved, head_dim, rot):
    q = randn((2, 17, 8, head_dim), dtype, device, gen)
    k = randn((2, 17, 2, head_dim), dtype, device, gen)  # GQA
    cos, sin = rope_tables(300, rot, device)
    positions = torch.randint(0, 300, (2, 17), device=device, generator=gen)
    out = (poison_(torch.empty_like(q)), poison_(torch.empty_like(k)))
    q_out, k_out = apply_rotary(q, k, cos, sin, positions, interleaved, out=out)
    assert q_out is out[0] and k_out is out[1]
    check(out, q, k, cos, sin, positions, interleaved)


@pytest.mark.parametrize("seq", [1, 17, 111])
@pytest.mark.parametrize("positions", [None, "per_token", "per_seq"])
def test_seq_lengths_and_positions(device, gen, seq, positions):
    q = randn((3, seq, 4, 64), torch.bfloat16, device, gen)
    k = randn((3, seq, 1, 64), torch.bfloat16, device, gen)  # MQA
    cos, sin = rope_tables(1024, 64, device)
    if positions == "per_token":  # e.g. decode: each sequence at its own cache length
        start = torch.randint(0, 1024 - seq, (3, 1), device=device, generator=gen)
        positions = start + torch.arange(seq, device=device)
    elif positions == "per_seq":
        positions = torch.randint(0, 1024, (seq,), device=device, generator=gen).int()
    check(apply_rotary(q, k, cos, sin, positions), q, k, cos, sin, positions)


@pytest.mark.parametrize("positions", [False, True])
def test_tokens_layout(device, gen, positions):
    q = randn((111, 6, 40), torch.float16, device, gen)  # (tokens, heads, head_dim), rot 24 of 40
    k = randn((111, 3, 40), torch.float16, device, gen)
    cos, sin = rope_tables(500, 24, device, torch.float16)  # table in the input dtype
    pos = torch.randint(0, 500, (111,), device=device, generator=gen) if positions else None
    check(apply_rotary(q, k, cos, sin, pos, interleaved=True), q, k, cos, sin, pos, True)


@pytest.mark.parametrize("interleaved", [False, True])
def test_inplace(device, gen, interleaved):
    q = randn((2, 17, 4, 64), torch.bfloat16, device, gen)
    k = randn((2, 17, 2, 64), torch.bfloat16, device, gen)
    q0, k0 = q.clone(), k.clone()
    cos, sin = rope_tables(64, 32, device)  # partial: dims 32..63 pass through untouched
    q_out, k_out = apply_rotary(q, k, cos, sin, interleaved=interleaved, inplace=True)
    assert q_out is q and k_out is k
    check((q, k), q0, k0, cos, sin, None, interleaved)
    assert torch.equal(q[..., 32:], q0[..., 32:]) and torch.equal(k[..., 32:], k0[..., 32:])


def test_out_of_place_leaves_inputs(device, gen):
    q = randn((2, 17, 4, 64), torch.float16, device, gen)
    k = randn((2, 17, 2, 64), torch.float16, device, gen)
    q0, k0 = q.clone(), k.clone()
    cos, sin = rope_tables(64, 48, device)
    q_out, k_out = apply_rotary(q, k, cos, sin)
    assert torch.equal(q, q0) and torch.equal(k, k0)
    assert q_out.data_ptr() != q.data_ptr() and k_out.data_ptr() != k.data_ptr()
    check((q_out, k_out), q, k, cos, sin)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("shape", [(2, 17), (111,)])
def test_fused_qkv_views(device, gen, inplace, shape):
    H, Hkv, D = 8, 2, 64
    qkv = randn(shape + ((H + 2 * Hkv) * D,), torch.bfloat16, device, gen)  # a QKV projection's output
    qkv0 = qkv.clone()
    q, k, v = qkv.view(*shape, H + 2 * Hkv, D).split([H, Hkv, Hkv], dim=-2)
    assert not q.is_contiguous() and not k.is_contiguous()
    cos, sin = rope_tables(200, D, device)
    pos = torch.randint(0, 200, shape, device=device, generator=gen)
    q_out, k_out = apply_rotary(q, k, cos, sin, pos, inplace=inplace)
    q0, k0, v0 = qkv0.view(*shape, H + 2 * Hkv, D).split([H, Hkv, Hkv], dim=-2)
    check((q_out, k_out), q0, k0, cos, sin, pos)
    assert torch.equal(v, v0)
    if inplace:  # written through the views, into the QKV buffer
        assert q_out is q and k_out is k
    else:
        assert torch.equal(qkv, qkv0)


def test_layouts_that_need_copies(device, gen):
    # (2, 3) leading dims transposed: no (batch, seq) view; head_dim with stride 2.
    q = randn((3, 2, 5, 4, 32), torch.float32, device, gen).transpose(0, 1)
    k = randn((2, 3, 5, 2, 64), torch.float32, device, gen)[..., ::2]
    cos, sin = rope_tables(16, 32, device)
    q_out = poison_(torch.empty(3, 2, 5, 4, 32, device=device)).transpose(0, 1)  # written through scratch
    out = apply_rotary(q, k, cos, sin, out=(q_out, poison_(torch.empty_like(k))))
    check(out, q, k, cos, sin)
    q0, k0 = q.clone(), k.clone()
    apply_rotary(q, k, cos, sin, inplace=True)  # copied, rotated, copied back
    check((q, k), q0, k0, cos, sin)


@pytest.mark.parametrize("config", [RotaryConfig(1, 1, 1), RotaryConfig(4, 2, 2), RotaryConfig(64, 16, 8)])
def test_launch_configs(device, gen, config):
    q = randn((2, 17, 7, 34), torch.float16, device, gen)
    k = randn((2, 17, 3, 34), torch.float16, device, gen)
    cos, sin = rope_tables(40, 30, device)
    q_out, k_out = poison_(torch.empty_like(q)), poison_(torch.empty_like(k))
    rotary._launch(q, k, cos, sin, None, q_out, k_out, False, config)
    check((q_out, k_out), q, k, cos, sin)


# merge_qk (q and k chunks in one loop, every load before the stores), block_hk (k's own
# chunk) and the 64-bit token index of the first kernel: one chunk for all heads, several
# chunks of q heads (4 at a time, 14 heads: a partial last chunk), k chunks wider than
# kv_heads, and more k chunks than q chunks (2 q heads, k 1 at a time).
CONFIGS = {
    "merged-all-heads": RotaryConfig(1, 16, 4, 2, merge_qk=True),
    "merged-q-chunks": RotaryConfig(4, 4, 2, 1, merge_qk=True),
    "merged-wide-k": RotaryConfig(8, 2, 1, 4, merge_qk=True),
    "merged-k-chunks": RotaryConfig(2, 2, 2, 1, merge_qk=True),
    "split-k-block": RotaryConfig(2, 16, 2, 2),
    "index64": RotaryConfig(2, 16, 2, index64=True),
    "merged_config": None,  # rotary.merged_config's pick for the shape
}


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("tokens, heads, kv_heads, head_dim, rot, interleaved", [
    (1, 14, 2, 64, 64, False),  # Qwen-0.5B's heads, one token
    (17, 14, 2, 64, 64, True),
    (17, 3, 3, 128, 64, False),  # partial rotary: dims 64..127 pass through
    (17, 5, 1, 128, 64, True),
    (17, 2, 6, 34, 18, False),  # more kv heads than q heads; tail 16, half 9 (padded to 16)
])
def test_configs(device, gen, config, tokens, heads, kv_heads, head_dim, rot, interleaved):
    q = randn((1, tokens, heads, head_dim), torch.bfloat16, device, gen)
    k = randn((1, tokens, kv_heads, head_dim), torch.bfloat16, device, gen)
    cos, sin = rope_tables(64, rot, device)
    pos = torch.randint(0, 64, (tokens,), device=device, generator=gen, dtype=torch.int32)
    cfg = CONFIGS[config] or rotary.merged_config(tokens, heads, kv_heads, rot // 2, head_dim - rot, q.device)
    q_out, k_out = poison_(torch.empty_like(q)), poison_(torch.empty_like(k))
    rotary._launch(q, k, cos, sin, pos, q_out, k_out, interleaved, cfg)
    check((q_out, k_out), q, k, cos, sin, pos[None], interleaved)
    q0, k0 = q.clone(), k.clone()
    rotary._launch(q, k, cos, sin, pos, q, k, interleaved, cfg)  # in place: the tail is not touched
    check((q, k), q0, k0, cos, sin, pos[None], interleaved)
    assert torch.equal(q[..., rot:], q0[..., rot:]) and torch.equal(k[..., rot:], k0[..., rot:])


def test_reference_fallback(device, gen, monkeypatch):
    monkeypatch.setattr(rotary, "use_triton", lambda t: False)  # CPU without the interpreter
    q = randn((2, 5, 4, 16), torch.bfloat16, device, gen)
    k = randn((2, 5, 1, 16), torch.bfloat16, device, gen)
    cos, sin = rope_tables(10, 8, device)
    pos = torch.randint(0, 10, (2, 5), device=device, generator=gen)
    check(apply_rotary(q, k, cos, sin, pos, True), q, k, cos, sin, pos, True)


def test_custom_op(device, gen):
    """Schema, fake-tensor and AOT-dispatch checks of onetrip::apply_rotary, out of place and in place."""
    q = randn((1, 3, 2, 8), torch.float32, device, gen)
    k = randn((1, 3, 1, 8), torch.float32, device, gen)
    cos, sin = rope_tables(4, 8, device)
    pos = torch.tensor([0, 2, 3], device=device)
    torch.library.opcheck(rotary._rotary_op, (torch.empty_like(q), torch.empty_like(k), cos, sin, None, q, k, False))
    torch.library.opcheck(rotary._rotary_op, (q.clone(), k.clone(), cos, sin, pos, None, None, True))


def test_empty(device):
    cos, sin = rope_tables(4, 8, device)
    q, k = torch.empty(2, 0, 4, 8, device=device), torch.empty(2, 0, 1, 8, device=device)
    q_out, k_out = apply_rotary(q, k, cos, sin)
    assert q_out.shape == (2, 0, 4, 8) and k_out.shape == (2, 0, 1, 8)


def test_bad_input(device):
    q, k = torch.randn(2, 5, 4, 16, device=device), torch.randn(2, 5, 2, 16, device=device)
    cos, sin = rope_tables(10, 16, device)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        apply_rotary(q.tolist(), k, cos, sin)
    with pytest.raises(TypeError, match="cos must be a torch.Tensor, got list"):
        apply_rotary(q, k, cos.tolist(), sin)
    with pytest.raises(TypeError, match="positions must be a torch.Tensor or None, got list"):
        apply_rotary(q, k, cos, sin, [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"q must have at least 3 dimension\(s\)"):
        apply_rotary(q[0, 0], k, cos, sin)
    with pytest.raises(TypeError, match="k has dtype torch.float16 but q has torch.float32"):
        apply_rotary(q, k.half(), cos, sin)
    with pytest.raises(ValueError, match="k has head_dim 8 but q has 16"):
        apply_rotary(q, k[..., :8], cos, sin)
    with pytest.raises(ValueError, match=r"k has shape \(2, 4, 2, 16\) but q has \(2, 5, 4, 16\); their leading"):
        apply_rotary(q, k[:, :4], cos, sin)
    with pytest.raises(ValueError, match=r"rot_dim = 32 > head_dim = 16"):
        apply_rotary(q, k, *rope_tables(10, 32, device))
    with pytest.raises(ValueError, match=r"cos has shape \(10, 8, 1\); expected \(max_pos, rot_dim // 2\)"):
        apply_rotary(q, k, cos[..., None], sin[..., None])
    with pytest.raises(ValueError, match=r"sin has shape \(10, 4\); expected \(10, 8\)"):
        apply_rotary(q, k, cos, sin[:, :4])
    with pytest.raises(TypeError, match="cos has dtype torch.float64; allowed: float32"):
        apply_rotary(q, k, cos.double(), sin)
    with pytest.raises(TypeError, match="sin has dtype torch.float16; allowed: float32, bfloat16"):
        apply_rotary(q.bfloat16(), k.bfloat16(), cos, sin.half())
    with pytest.raises(TypeError, match="sin has dtype torch.bfloat16 but cos has torch.float32"):
        apply_rotary(q.bfloat16(), k.bfloat16(), cos, sin.bfloat16())
    with pytest.raises(TypeError, match="positions has dtype torch.float32; allowed: torch.int32, torch.int64"):
        apply_rotary(q, k, cos, sin, torch.zeros(2, 5, device=device))
    with pytest.raises(ValueError, match=r"positions has shape \(2, 4\); expected \(2, 5\)"):
        apply_rotary(q, k, cos, sin, torch.zeros(2, 4, dtype=torch.long, device=device))
    with pytest.raises(ValueError, match=r"positions has shape \(3, 2, 5\)"):
        apply_rotary(q, k, cos, sin, torch.zeros(3, 2, 5, dtype=torch.long, device=device))
    with pytest.raises(ValueError, match="positions is on meta but q is on"):
        apply_rotary(q, k, cos, sin, torch.zeros(5, dtype=torch.long, device="meta"))
    with pytest.raises(ValueError, match="cos is on meta but q is on"):
        apply_rotary(q, k, cos.to("meta"), sin)
    with pytest.raises(TypeError, match="out must be a pair"):
        apply_rotary(q, k, cos, sin, out=torch.empty_like(q))
    with pytest.raises(ValueError, match=r"out\[1\] has shape \(2, 5, 4, 16\)"):
        apply_rotary(q, k, cos, sin, out=(torch.empty_like(q), torch.empty_like(q)))
    with pytest.raises(TypeError, match=r"out\[0\] has dtype torch.float16"):
        apply_rotary(q, k, cos, sin, out=(torch.empty_like(q).half(), torch.empty_like(k)))
    with pytest.raises(ValueError, match="out must be None when inplace=True"):
        apply_rotary(q, k, cos, sin, inplace=True, out=(q, k))


def test_tables_shorter_than_the_sequence(device, gen):
    """Default positions 0..seq-1 with tables of fewer rows: a ValueError naming cos and sin,
    the rows given and needed (the reference's gather fails too), not rows of inf or 0.
    Explicit positions are not read on the host, so the same tables pass with them."""
    q, k = randn((2, 8, 4, 16), torch.float32, device, gen), randn((2, 8, 2, 16), torch.float32, device, gen)
    cos, sin = rope_tables(5, 16, device)
    with pytest.raises(ValueError, match=r"cos and sin have 5 rows but q has seq 8: the default positions 0\.\.7 "
                                         r"need 8 rows"):
        apply_rotary(q, k, cos, sin)
    if q.device.type == "cpu":  # (on a GPU the gather's failure is a device assert, fatal to the process)
        with pytest.raises(IndexError):
            apply_rotary_ref(q, k, cos, sin)
    positions = torch.tensor([0, 1, 2, 3, 4, 4, 3, 2], device=device)
    check(apply_rotary(q, k, cos, sin, positions), q, k, cos, sin, positions)
