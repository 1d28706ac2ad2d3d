"""apply_rotary's backward (the rotation by -theta): dq and dk against PyTorch's autograd of
the reference (the 2x rule), in place and out of place, torch.compile and CUDA-graph capture
of fwd + bwd."""

import pytest
import torch

from onetrip.ops.rotary import apply_rotary, apply_rotary_ref
from onetrip.testing import assert_grads_close, strided_like

from conftest import ON_GPU, assert_replay_matches, rope_tables


def leaf(shape, dtype, device, gen, kind="contiguous"):
    return strided_like(shape, dtype, device, kind, generator=gen).requires_grad_()


def positions(kind, lead, max_pos, device, gen):
    if kind is None:
        return None
    shape = lead if kind == "per_token" else lead[-1:]  # per_seq: (seq,), shared by the batch
    return torch.randint(0, max_pos, shape, device=device, generator=gen)


def upstream(q, k, gen, kind="contiguous"):
    return tuple(strided_like(t.shape, t.dtype, t.device, kind, generator=gen) for t in (q, k))


def inplace_rotary(q, k, cos, sin, positions=None, interleaved=False):
    """In place on non-leaf copies, as a layer does on its projections' outputs."""
    q, k = q.clone(), k.clone()
    q_out, k_out = apply_rotary(q, k, cos, sin, positions, interleaved, inplace=True)
    if not torch.compiler.is_compiling():  # traced (torch 2.11), the outputs are new variables
        assert q_out is q and k_out is k
    return q_out, k_out


# (dtype, interleaved, lead (batch, seq) or (tokens,), heads, kv_heads, head_dim, rot, positions, inplace);
# few tokens: the interpreter spends ~0.1 s a program (a token) here.
CASES = [
    (torch.float32, False, (2, 2), 3, 1, 34, 18, "per_token", False),  # partial rotary, MQA
    (torch.bfloat16, True, (1, 3), 2, 2, 16, 16, None, True),
    (torch.bfloat16, False, (2, 2), 4, 2, 34, 34, "per_seq", False),  # GQA
    (torch.float32, True, (3,), 3, 1, 40, 24, "per_token", True),  # (tokens, heads, head_dim), partial
]


@pytest.mark.parametrize("dtype, interleaved, lead, heads, kv_heads, head_dim, rot, pos, inplace", CASES)
def test_grads_match_reference(device, gen, dtype, interleaved, lead, heads, kv_heads, head_dim, rot, pos, inplace):
    q, k = leaf(lead + (heads, head_dim), dtype, device, gen), leaf(lead + (kv_heads, head_dim), dtype, device, gen)
    cos, sin = rope_tables(64, rot, device)
    inputs = dict(q=q, k=k, cos=cos, sin=sin, positions=positions(pos, lead, 64, device, gen), interleaved=interleaved)
    assert_grads_close("rotary", inplace_rotary if inplace else apply_rotary, apply_rotary_ref, inputs,
                       upstream(q, k, gen))


def test_non_contiguous_and_one_input(device, gen):
    # q in a layout no (B, S, H, D) view describes (copied), k a padded view that needs no
    # gradient (dq alone flows); the upstream gradients padded
    q = leaf((2, 2, 4, 34), torch.float32, device, gen, "transposed")
    k = strided_like((2, 2, 2, 34), torch.float32, device, "padded", generator=gen)
    cos, sin = rope_tables(64, 18, device)
    gq, gk = upstream(q, k, gen, "padded")
    reports = assert_grads_close("rotary", apply_rotary, apply_rotary_ref, dict(q=q, k=k, cos=cos, sin=sin), (gq, None))
    assert set(reports) == {"q"}


def test_bad_input_with_grad(device, gen):
    q, k = leaf((1, 3, 2, 8), torch.float32, device, gen), leaf((1, 3, 1, 8), torch.float32, device, gen)
    cos, sin = rope_tables(8, 8, device)
    with pytest.raises(ValueError, match="cos and sin require a gradient"):
        apply_rotary(q, k, cos.requires_grad_(), sin)
    cos.requires_grad_(False)
    with pytest.raises(ValueError, match="out= is not supported when an input requires a gradient"):
        apply_rotary(q, k, cos, sin, out=(torch.empty_like(q), torch.empty_like(k)))
    with pytest.raises(ValueError, match="q is a leaf tensor that requires a gradient"):
        apply_rotary(q, k, cos, sin, inplace=True)
    qkv = torch.randn(1, 3, 4, 8, device=device, requires_grad=True) * 1  # a fused QKV output
    with pytest.raises(ValueError, match="q is a view of another tensor"):
        apply_rotary(qkv[:, :, :2], qkv[:, :, 2:3], cos, sin, inplace=True)
    q0 = q.detach().clone()
    with torch.no_grad():  # nothing recorded: in place as before
        apply_rotary(q, k, cos, sin, inplace=True)
    assert not torch.equal(q, q0)


def test_cpu_without_interpreter_runs_fallback(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k = leaf((2, 5, 3, 34), torch.bfloat16, "cpu", None), leaf((2, 5, 1, 34), torch.bfloat16, "cpu", None)
    cos, sin = rope_tables(64, 18, "cpu")
    pos = torch.randint(0, 64, (2, 5))
    for fn in (apply_rotary, inplace_rotary):
        assert_grads_close("rotary", fn, apply_rotary_ref, dict(q=q, k=k, cos=cos, sin=sin, positions=pos,
                                                                interleaved=True), upstream(q, k, None))


def test_compile_fwd_bwd(device, gen):
    """The forward traced whole (fullgraph), its backward graph (AOTAutograd's) holding the
    backward op: both equal to eager bit for bit, out of place and in place."""
    q, k = leaf((1, 3, 2, 34), torch.bfloat16, device, gen), leaf((1, 3, 1, 34), torch.bfloat16, device, gen)
    cos, sin = rope_tables(64, 18, device)
    pos = torch.tensor([5, 9, 2], device=device)
    gq, gk = upstream(q, k, gen)

    def both(q, k):
        return (*apply_rotary(q, k, cos, sin, pos), *inplace_rotary(q, k, cos, sin, pos, True))

    def step(fn):
        outs = fn(q, k)
        return (*outs, *torch.autograd.grad(outs, (q, k), (gq, gk, gq, gk)))

    eager = step(both)
    torch._dynamo.reset()
    # aot_eager on the CPU: the question is whether the graph traces without a break (test_compile.py)
    got = step(torch.compile(both, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager"))
    for a, e in zip(got, eager):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("lead, heads, kv_heads, head_dim, rot, pos", [
    ((4, 1024), 32, 8, 128, 128, None),  # Llama-8B
    ((2, 777), 14, 2, 64, 64, "per_token"),  # Qwen-0.5B
    ((3, 500), 16, 16, 96, 64, "per_seq"),  # partial rotary
])
def test_gpu_wide(gen, dtype, interleaved, inplace, lead, heads, kv_heads, head_dim, rot, pos):
    q, k = leaf(lead + (heads, head_dim), dtype, "cuda", gen), leaf(lead + (kv_heads, head_dim), dtype, "cuda", gen)
    cos, sin = rope_tables(4096, rot, "cuda")
    inputs = dict(q=q, k=k, cos=cos, sin=sin, positions=positions(pos, lead, 4096, "cuda", gen),
                  interleaved=interleaved)
    assert_grads_close("rotary", inplace_rotary if inplace else apply_rotary, apply_rotary_ref, inputs,
                       upstream(q, k, gen))


@pytest.mark.gpu
@pytest.mark.parametrize("inplace", [False, True])
def test_gpu_graph_capture(gen, inplace):
    q, k = leaf((2, 300, 32, 128), torch.bfloat16, "cuda", gen), leaf((2, 300, 8, 128), torch.bfloat16, "cuda", gen)
    cos, sin = rope_tables(512, 96, "cuda")  # partial: the tail dims copied
    gq, gk = upstream(q, k, gen)
    fn = inplace_rotary if inplace else apply_rotary

    def step():
        outs = fn(q, k, cos, sin)
        return (*outs, *torch.autograd.grad(outs, (q, k), (gq, gk)))

    assert_replay_matches(step)
