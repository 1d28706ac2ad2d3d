"""Each op under torch.compile(fullgraph=True) (a graph break raises), and on a GPU inside
CUDA-graph capture, with results equal to the eager call."""

import pytest
import torch

import onetrip
from conftest import DEVICE, ON_GPU, assert_replay_matches


def _cases(device):
    g = torch.Generator(device=device).manual_seed(0)

    def rn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g, device=device).to(dtype)

    x, r = rn(3, 5, 64), rn(3, 5, 64)
    w, b = rn(64), rn(64)
    gate_up = torch.cat([x, r], -1)
    xw, rw, ww = rn(2, 70001), rn(2, 70001), rn(70001)  # split rows: "coop" on a GPU
    q, k = rn(2, 7, 4, 32), rn(2, 7, 2, 32)
    pos = torch.arange(7, device=device)
    freqs = torch.outer(pos.float(), 10000.0 ** (-torch.arange(0, 32, 2, device=device).float() / 32))
    cos, sin = freqs.cos(), freqs.sin()
    kc, vc = rn(2, 16, 2, 32), rn(2, 16, 2, 32)  # KV caches (batch, max_seq, kv_heads, head_dim)
    lens = torch.tensor([3, 5], dtype=torch.int32, device=device)  # positions within the 7-row rope table
    q1, k1, v1 = rn(2, 1, 4, 32), rn(2, 1, 2, 32), rn(2, 1, 2, 32)

    def decode_step():  # one decode step as the engine will run it
        qr, kcache, vcache = q1.clone(), kc.clone(), vc.clone()
        onetrip.append_kv(qr, k1, v1, kcache, vcache, lens, cos, sin)
        return onetrip.decode_attention(qr, kcache, vcache, lens + 1)

    def append_attention_step():  # the same step in one launch
        kcache, vcache = kc.clone(), vc.clone()
        return onetrip.append_attention(q1, k1, v1, kcache, vcache, lens, cos, sin), kcache, vcache

    return {
        "bias_gelu": (lambda: onetrip.bias_gelu(x, b)),
        "add_rms_norm": (lambda: onetrip.add_rms_norm(x, r, w, 1e-6)),
        "rms_norm_gemma": (lambda: onetrip.rms_norm(x, w, 1e-6, gemma=True)),
        "add_layer_norm": (lambda: onetrip.add_layer_norm(x, r, w, b, 1e-5)),
        "add_rms_norm_wide": (lambda: onetrip.add_rms_norm(xw, rw, ww, 1e-6)),
        "silu_mul": (lambda: onetrip.silu_mul(gate_up)),
        "gelu_mul": (lambda: onetrip.gelu_mul(x, r)),
        "apply_rotary": (lambda: onetrip.apply_rotary(q, k, cos, sin)),
        "apply_rotary_inplace": (lambda: onetrip.apply_rotary(q.clone(), k.clone(), cos, sin, inplace=True)),
        "flash_attention": (lambda: onetrip.flash_attention(q, k, k, causal=True, return_lse=True)),
        "decode_step": decode_step,
        "append_attention": append_attention_step,
    }


# apply_rotary_inplace on the CPU: test_rotary_backward.py compiles it, forward and backward
CASES = [c for c in _cases("cpu") if ON_GPU or c != "apply_rotary_inplace"]


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("name", CASES)
def test_fullgraph_compile(name):
    fn = _cases(DEVICE)[name]
    eager = _flat(fn())
    torch._dynamo.reset()
    # On the CPU, Inductor's C++ code generation would dominate the test time while the
    # question is whether Dynamo traces the custom op without a break: aot_eager answers it.
    compiled = torch.compile(fn, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    got = _flat(compiled())
    assert len(got) == len(eager)
    for a, e in zip(got, eager):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASES)
def test_cuda_graph_capture(name):
    assert_replay_matches(_cases("cuda")[name], _flat)
