"""benchmarks/ws_chain.py's warp-specialized persistent MLP chain (Gluon; Hopper only, so
every test here needs the GPU) against its op-by-op references: the bare chain (gate_up,
SwiGLU, down) and the engine's MLP block (RMSNorm from partial sums, the chain, the
residual add and the next norm's partials), several calls in a row (the kernel re-arms
its grid barrier's counters)."""

import sys
from pathlib import Path

import pytest
import torch

from conftest import check_chain_phases
from onetrip.ops.gemv_norm import gemv_add_residual_ref, gemv_rms_norm_ref

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9), reason="Gluon's TMA needs Hopper")]


def _case(k, f, gen):
    h = torch.randn((1, k), device="cuda", generator=gen).to(torch.bfloat16)
    nw = (1 + 0.1 * torch.randn((k,), device="cuda", generator=gen)).to(torch.bfloat16)
    w1 = (torch.randn((2 * f, k), device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
    w2 = (torch.randn((k, f), device="cuda", generator=gen) / f ** 0.5).to(torch.bfloat16)
    return h, nw, w1, w2


@pytest.mark.parametrize("k, f", [(2048, 8192), (256, 1024)])
def test_bare_chain(gen, k, f):
    from ws_chain import ws_chain
    h, _, w1, w2 = _case(k, f, gen)
    mid = torch.empty(2 * f, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(k, device="cuda", dtype=torch.bfloat16)
    sync = torch.zeros(2, dtype=torch.int32, device="cuda")
    for _ in range(2):
        y.fill_(float("nan"))
        ws_chain(h[0], w1, w2, mid, y, sync, R=16, nslot=8, ch=1024)
        check_chain_phases(h[0], w1, w2, mid, y)
        assert sync.tolist() == [0, 0]


@pytest.mark.parametrize("k, f", [(2048, 8192), (4096, 14336), (256, 1024)])
def test_mlp_block(gen, k, f):
    """With the norm and the residual (Llama-3.2-1B's, Llama-3.1-8B's and a small MLP; the
    small one's phase-1 x is staged in chunks of 256); the partials sum to h''s squares."""
    from ws_chain import launch, mlp_config
    from onetrip.ops._common import sm_count
    h, nw, w1, w2 = _case(k, f, gen)
    sq = h.float().square()[0]
    ss = torch.stack([sq[: k // 2].sum(), sq[k // 2:].sum()])
    mid = torch.empty(2 * f, device="cuda", dtype=torch.bfloat16)
    y = torch.empty((1, k), device="cuda", dtype=torch.bfloat16)
    ss_out = torch.empty(sm_count(h.device), dtype=torch.float32, device="cuda")
    sync = torch.zeros(2, dtype=torch.int32, device="cuda")
    for _ in range(2):
        y.fill_(float("nan"))
        launch(h, w1, w2, mid, y, residual=h, ss_in=ss, norm_weight=nw, eps=1e-5, ss_out=ss_out, sync=sync,
               config=mlp_config(k))
        check_chain_phases(h, w1, w2, mid[None], y, extra=(nw, h),
                           first=lambda h, w1, nw, _: gemv_rms_norm_ref(h, nw, 1e-5, w1),
                           second=lambda mid, w2, _, res: gemv_add_residual_ref(mid, w2, res, silu_mul=True))
        want = y.double().square().sum()
        assert abs(ss_out.double().sum() - want) <= 1e-5 * want
        assert sync.tolist() == [0, 0]
