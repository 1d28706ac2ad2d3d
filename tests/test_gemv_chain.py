"""benchmarks/gemv_chain.py's one-launch GEMV chain against its op-by-op reference, through
the interpreter (programs run one after another, in ticket order) or on a GPU."""

import sys
from pathlib import Path

import pytest
import torch

from conftest import check_chain_phases

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gemv_chain import gemv_chain  # noqa: E402


@pytest.mark.parametrize("preload", [False, True])
def test_chain_matches_reference(device, gen, preload):
    K1, F, N2 = 64, 96, 48
    x = torch.randn(K1, device=device, generator=gen).to(torch.bfloat16)
    w1 = (torch.randn(2 * F, K1, device=device, generator=gen) * 0.2).to(torch.bfloat16)
    w2 = (torch.randn(N2, F, device=device, generator=gen) * 0.2).to(torch.bfloat16)
    mid, y = torch.empty(2 * F, device=device, dtype=torch.bfloat16), torch.empty(N2, device=device, dtype=torch.bfloat16)
    sync = torch.zeros(3, dtype=torch.int32, device=device)
    for _ in range(2):  # the kernel re-arms its counters: a second call runs the same
        y.fill_(float("nan"))
        gemv_chain(x, w1, w2, mid, y, sync, tiles=((16, 32), (8, 32)), num_warps=4, preload=preload)
        check_chain_phases(x, w1, w2, mid, y)
        assert sync.tolist() == [0, 0, 0]


def test_bad_tiles(device):
    x = torch.zeros(64, device=device, dtype=torch.bfloat16)
    w1, w2 = torch.zeros(192, 64, device=device, dtype=torch.bfloat16), torch.zeros(48, 96, device=device,
                                                                                   dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="do not fit tiles"):
        gemv_chain(x, w1, w2, torch.empty(192, device=device, dtype=torch.bfloat16),
                   torch.empty(48, device=device, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.int32,
                                                                                     device=device),
                   tiles=((16, 48), (8, 32)))


@pytest.mark.gpu
@pytest.mark.parametrize("preload", [False, True])
def test_chain_on_gpu_at_1b_shapes(gen, preload):
    """Llama-3.2-1B's MLP (2048 -> 2 x 8192 -> 2048): 1024 + 512 programs, more than fit at
    once, so second-phase programs really wait; five calls in a row, counters back at 0."""
    x = torch.randn(2048, device="cuda", generator=gen).to(torch.bfloat16)
    w1 = (torch.randn(16384, 2048, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    w2 = (torch.randn(2048, 8192, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    mid, y = torch.empty(16384, device="cuda", dtype=torch.bfloat16), torch.empty(2048, device="cuda",
                                                                                  dtype=torch.bfloat16)
    sync = torch.zeros(3, dtype=torch.int32, device="cuda")
    for _ in range(5):
        y.fill_(float("nan"))
        gemv_chain(x, w1, w2, mid, y, sync, preload=preload)
        torch.cuda.synchronize()
        check_chain_phases(x, w1, w2, mid, y)
        assert sync.tolist() == [0, 0, 0]
