"""The batch-1 GEMV pair that carries the residual add and RMSNorm: against the op-by-op
chain (linear, add, HF RMSNorm, linear) in float64, by the 2 x PyTorch-error rule."""

import pytest
import torch

from conftest import DEVICE, ON_GPU, capture
from onetrip.ops.gemv_norm import (gemv_add_residual, gemv_add_residual_ref, gemv_rms_norm, gemv_rms_norm_ref,
                                   partials)
from onetrip.ops.skinny_matmul import GEMV_PICKS
from onetrip.testing import assert_close, upcast


def _rn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen, device=DEVICE).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("K,N,M2,silu", [(17, 111, 33, False), (1023, 300, 17, True), (256, 5000, 7, False)])
def test_chain(gen, dtype, K, N, M2, silu):
    x = _rn(gen, 1, 1, 2 * K if silu else K, dtype=dtype)
    w1, res = _rn(gen, N, K, dtype=dtype), _rn(gen, 1, N, dtype=dtype)
    g = (1 + 0.1 * _rn(gen, N, dtype=torch.float32)).to(dtype)
    w2, b2 = _rn(gen, M2, N, dtype=dtype), _rn(gen, M2, dtype=dtype)
    h, ss = gemv_add_residual(x, w1, res, silu_mul=silu)
    assert h.shape == (1, N) and ss.shape == (partials(N, K, h.device, dtype, silu),)
    h_exact = gemv_add_residual_ref(*upcast(x, w1, res), silu_mul=silu)
    h_torch = gemv_add_residual_ref(x, w1, res, silu_mul=silu)
    assert_close("h", h, h_exact, h_torch)
    # The second GEMV is judged on its own input: exact = float64 from onetrip's h, and
    # PyTorch's error is float32/bf16 from that same h. (Judged from h_exact, h's own
    # allowed error compounds: a float32 run failed at 2.5 x PyTorch's 0.6 ulp on the H200.)
    g64, w64, b64 = upcast(g, w2, b2)
    y_exact = gemv_rms_norm_ref(upcast(h), g64, 1e-5, w64, b64)
    y_torch = gemv_rms_norm_ref(h, g, 1e-5, w2, b2)
    assert_close("y", gemv_rms_norm(h, ss, g, 1e-5, w2, b2), y_exact, y_torch)


def test_bad_input(gen):
    x, w, r = _rn(gen, 2, 8, dtype=torch.float32), _rn(gen, 4, 8, dtype=torch.float32), _rn(gen, 4, dtype=torch.float32)
    with pytest.raises(ValueError, match="expected one row of 8 values"):
        gemv_add_residual(x, w, r)
    with pytest.raises(ValueError, match="weight has shape"):
        gemv_add_residual(x[:1], w[:, :7], r)
    h, ss = gemv_add_residual(x[:1], w, r)
    with pytest.raises(TypeError, match="ss must be the float32 partials"):
        gemv_rms_norm(h, ss.double(), r, 1e-5, w.T.contiguous())
    with pytest.raises(ValueError, match="norm_weight has shape"):
        gemv_rms_norm(h, ss, r[:3], 1e-5, w.T.contiguous())


def test_partials_follow_the_tuned_launch():
    """The consumer reads as many partials as the producer's grid has programs: 8B o_proj
    + residual runs 16 columns a program (the H200 table), so 256 partials, not 512."""
    cpu = torch.device("cpu")
    assert partials(4096, 4096, cpu, torch.bfloat16) == 256
    assert partials(4096, 14336, cpu, torch.bfloat16, silu_mul=True) == 512


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (programmatic dependent launch: Hopper)")
@pytest.mark.parametrize("early_weights", [0, 1, 2])
def test_pdl_chain_in_a_graph_matches(monkeypatch, early_weights):
    """Programmatic dependent launch (ONETRIP_PDL) lets each GEMV start while the previous
    one drains; every read of its outputs waits (after ``early_weights`` weight chunks are
    in flight). A chain of 3 layers (residual, norm, SwiGLU, each reading the last
    kernel's output) captured in a CUDA graph and replayed with new inputs gives bit for
    bit what ordinary launches give."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    gen = torch.Generator(device="cuda").manual_seed(0)
    H, F = 256, 704
    rn = lambda *s: torch.randn(*s, generator=gen, device="cuda").to(torch.bfloat16)  # noqa: E731
    layers = [(rn(H, H) * 0.05, rn(2 * F, H) * 0.05, rn(H, F) * 0.05) for _ in range(3)]
    g = 1 + 0.1 * rn(H)
    x, res = rn(1, H), rn(1, H)

    picks = GEMV_PICKS.with_early(early_weights)

    def step():
        h, ss = gemv_add_residual(x, layers[0][0], res, picks=picks)
        for wo, wgu, wd in layers:
            h, ss = gemv_add_residual(gemv_rms_norm(h, ss, g, 1e-5, wgu, picks=picks), wd, h, silu_mul=True,
                                      picks=picks)
            h, ss = gemv_add_residual(h, wo, h, picks=picks)
        return h

    x_new, res_new = rn(1, H), rn(1, H)
    monkeypatch.setenv("ONETRIP_PDL", "0")
    x.copy_(x_new)
    res.copy_(res_new)
    expected = step().clone()
    x.copy_(rn(1, H))  # captured on other inputs, replayed on x_new, res_new
    res.copy_(rn(1, H))
    monkeypatch.setenv("ONETRIP_PDL", "1")
    graph, h = capture(step)
    x.copy_(x_new)
    res.copy_(res_new)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(h, expected, rtol=0, atol=0)
