"""benchmarks/persist_chain.py's persistent two-GEMV chain against its op-by-op reference:
through the interpreter its phases run as two launches (no program can wait on another
there); on a GPU in one launch with the grid barrier, several calls in a row."""

import sys
from pathlib import Path

import pytest
import torch

from conftest import check_chain_phases

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from persist_chain import persist_chain  # noqa: E402


@pytest.mark.parametrize("occ, preload", [(1, False), (2, True)])
def test_chain_matches_reference(device, gen, occ, preload):
    """Phase 1: 96 columns in tiles of 64 (the last half empty); phase 2: 23 columns in
    tiles of 4 over 4-8 resident programs (several tiles a program, the last ragged), W2's
    rows strided."""
    K1, F, N2 = 64, 48, 23
    x = torch.randn(K1, device=device, generator=gen).to(torch.bfloat16)
    w1 = (torch.randn(2 * F, K1, device=device, generator=gen) * 0.2).to(torch.bfloat16)
    w2 = (torch.randn(N2, F + 16, device=device, generator=gen) * 0.2).to(torch.bfloat16)[:, :F]
    mid = torch.empty(2 * F, device=device, dtype=torch.bfloat16)
    y = torch.empty(N2, device=device, dtype=torch.bfloat16)
    sync = torch.zeros(2, dtype=torch.int32, device=device)
    for _ in range(2):  # the kernel re-arms its counters: a second call runs the same
        y.fill_(float("nan"))
        persist_chain(x, w1, w2, mid, y, sync, ((64, 32), (4, 16)), num_warps=4, occ=occ, preload=preload)
        check_chain_phases(x, w1, w2, mid, y)
        assert sync.tolist() == [0, 0]


def test_bad_tiles(device):
    x = torch.zeros(64, device=device, dtype=torch.bfloat16)
    w1 = torch.zeros(96, 64, device=device, dtype=torch.bfloat16)
    w2 = torch.zeros(23, 48, device=device, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="do not fit tiles"):
        persist_chain(x, w1, w2, torch.empty(96, device=device, dtype=torch.bfloat16),
                      torch.empty(23, device=device, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.int32,
                                                                                         device=device),
                      ((64, 32), (4, 32)))
