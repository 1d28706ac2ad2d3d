"""The norm kernel's shared-memory segment (``Reuse.smem_segment``, ``ops/_norm_smem.py``): a
"loop" program's segment copied into shared memory, both passes reading it there."""

import dataclasses
import pytest
import torch

from onetrip.ops import norm as norm_mod
from onetrip.ops._common import pdl_mode
from onetrip.ops._norm_picks import FEW_ROWS_GPU, PICKS_GPU
from onetrip.ops._norm_smem import SMEM_BYTES, smem_fits
from onetrip.ops.norm import CacheHints, NormConfig, Reuse, Split
from onetrip.testing import poison_, strided_like

from conftest import ON_GPU
from test_norm import KINDS, _check, _params

HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] >= 9


SMEM = Reuse(smem_segment=True)


def test_smem_fits():
    """16-bit elements only, whole runs of 8 a thread, a segment of whole chunks <= 32 KB."""
    assert smem_fits(16384, 4096, 16, 2)  # the 256K row in 16: 8 a thread, 32 KB
    assert smem_fits(16384, 4096, 8, 2)  # 16 a thread: two runs of 8
    assert not smem_fits(16384, 4096, 16, 4)  # float32
    assert not smem_fits(20480, 4096, 16, 2)  # 40 KB
    assert not smem_fits(5000, 1024, 4, 2)  # not whole chunks
    assert not smem_fits(1024, 128, 4, 2)  # one element a thread
    assert not smem_fits(2048, 1024, 8, 2)  # four elements a thread
    assert SMEM_BYTES == 32768


@pytest.mark.parametrize("per_chunk", [False, True])
def test_smem_falls_back(device, gen, per_chunk):
    """Where shared memory cannot serve (the interpreter, a chunk of one element a thread),
    the config runs as without it (``smem_sum_per_chunk`` too), and right."""
    x = strided_like((5, 1024), torch.bfloat16, device, generator=gen)
    w, b = _params("layer", 1024, torch.bfloat16, device, gen)
    y = poison_(torch.empty_like(x))
    kernel = norm_mod._launch(x, None, w, b, y, None, 1e-6, False, False,
                              NormConfig("loop", 1, 128, 4, const_n=True, split=Split(4),
                                         hints=CacheHints(keep_row=True),
                                         reuse=Reuse(smem_segment=True, smem_sum_per_chunk=per_chunk)))
    _check("layer", x, None, w, b, 1e-6, y, None)
    if kernel is not None:
        assert "onorm_segment" not in kernel.asm["ptx"]


def _replays(x, w, b, kind, cfg, gen):
    """``cfg`` captured in a CUDA graph on ``x`` (no residual), then replayed on new values of
    x into a poisoned y, and the result checked."""
    y = poison_(torch.empty_like(x))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        norm_mod._launch(x, None, w, b, y, None, 1e-6, kind != "layer", kind == "gemma", cfg)
    x.copy_(torch.randn(x.shape, generator=gen, device=x.device))
    poison_(y)
    graph.replay()
    torch.cuda.synchronize()
    _check(kind, x, None, w, b, 1e-6, y, None)


def _run(x, r, w, b, kind, cfg, taken):
    """Launch ``cfg`` on poisoned outputs, check that shared memory was taken or not, and the result."""
    y = poison_(torch.empty(x.shape, dtype=x.dtype, device=x.device))
    h = poison_(torch.empty_like(y)) if r is not None else None
    kernel = norm_mod._launch(x, r, w, b, y, h, 1e-6, kind != "layer", kind == "gemma", cfg)
    assert ("onorm_segment" in kernel.asm["ptx"]) == taken
    _check(kind, x, r, w, b, 1e-6, y, h)


@pytest.mark.skipif(not ON_GPU, reason="the shared-memory segment is inline PTX: a GPU")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width, chunk, warps, split, cluster", [
    (5120, 1024, 4, 1, False),  # a row a program: 5 chunks
    (6144, 1024, 4, 3, False),  # 3 programs a row, waiting on each other through global memory
    (65536, 2048, 8, 8, True),  # a cluster of 8 segments of 4 chunks
    (262144, 4096, 8, 16, True)])  # the H100's 256K picks' form
def test_smem_gpu(gen, kind, dtype, width, chunk, warps, split, cluster):
    """Shared memory is taken (its buffer is in the kernel) and right, eagerly and replayed from
    a CUDA graph with new inputs; it is not taken, and the result is right still, with a
    residual, on strided rows (the width not a constant), on a row not 16-byte aligned,
    on a width that is not whole chunks (no masks on the copies), and in float32."""
    device = torch.device("cuda")
    cfg = NormConfig("loop", 1, chunk, warps, const_n=True, split=Split(split, cluster and HOPPER),
                     hints=CacheHints(keep_row=True, drop_y=True), reuse=SMEM)
    w, b = _params(kind, width, dtype, device, gen)
    x = torch.randn(5, width, generator=gen, device=device).to(dtype)
    _run(x, None, w, b, kind, cfg, True)
    _replays(x, w, b, kind, cfg, gen)
    _run(x, torch.randn_like(x), w, b, kind, cfg, False)  # a residual
    _run(strided_like((5, width), dtype, device, "rows", generator=gen), None, w, b, kind, cfg, False)
    flat = torch.randn(5 * width + 1, generator=gen, device=device).to(dtype)
    _run(flat[1:].view(5, width), None, w, b, kind, cfg, False)  # 2 bytes past a 16-byte boundary
    w1, b1 = _params(kind, width - 8, dtype, device, gen)
    _run(torch.randn(5, width - 8, generator=gen, device=device).to(dtype), None, w1, b1, kind, cfg, False)
    _run(x.float(), None, w.float(), b.float() if b is not None else None, kind, cfg, False)


@pytest.mark.skipif(not ON_GPU, reason="the shared-memory segment is inline PTX: a GPU")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("width, chunk, warps, split", [
    (5120, 1024, 4, 1),  # a row a program: 5 chunks, more than the 4 groups a wait names
    (65536, 2048, 8, 8),  # a cluster of 8 segments of 4 chunks
    (262144, 4096, 8, 16)])  # the H100's 256K form
def test_smem_sum_per_chunk_gpu(gen, kind, width, chunk, warps, split):
    """``smem_sum_per_chunk``: each chunk's copies a group, summed as it lands (its wait in
    the kernel); y right, eagerly and replayed from a CUDA graph with new inputs."""
    device = torch.device("cuda")
    cfg = NormConfig("loop", 1, chunk, warps, const_n=True, affine_fma=True, split=Split(split, split > 1 and HOPPER),
                     reuse=Reuse(smem_segment=True, smem_sum_per_chunk=True))
    w, b = _params(kind, width, torch.bfloat16, device, gen)
    x = torch.randn(5, width, generator=gen, device=device).to(torch.bfloat16)
    y = poison_(torch.empty_like(x))
    kernel = norm_mod._launch(x, None, w, b, y, None, 1e-6, kind != "layer", kind == "gemma", cfg)
    assert "cp.async.wait_group 0" in kernel.asm["ptx"]
    _check(kind, x, None, w, b, 1e-6, y, None)
    _replays(x, w, b, kind, cfg, gen)


def test_maxnreg_runs_anywhere(device, gen):
    """``NormConfig.maxnreg`` is a compile option; the interpreter drops it and runs the
    config as without it, and right. A cap ptxas cannot take is refused when the config is made."""
    x = strided_like((3, 1000), torch.bfloat16, device, generator=gen)
    w, b = _params("layer", 1000, torch.bfloat16, device, gen)
    y = poison_(torch.empty_like(x))
    norm_mod._launch(x, None, w, b, y, None, 1e-6, False, False,
                     NormConfig("loop", 1, 256, 4, maxnreg=32, split=Split(2)))
    _check("layer", x, None, w, b, 1e-6, y, None)
    with pytest.raises(ValueError, match="NormConfig.maxnreg=8 must be 0"):
        NormConfig("loop", 1, 256, 4, maxnreg=8)


def _h100_smem_picks():
    """(is_rms, width, config) of every H100 shared-memory pick, PICKS_GPU's and FEW_ROWS_GPU's."""
    entries = list(PICKS_GPU["H100"].items()) + [(k, c) for k, (_, c) in FEW_ROWS_GPU["H100"].items()]
    return [(is_rms, width, c) for (mode, is_rms, res, width), c in entries if c.reuse.smem_segment]


def test_smem_picks_capped():
    """Every H100 shared-memory pick carries the register cap (see the GPU test below)."""
    assert len(_h100_smem_picks()) == 4  # rms_norm and layer_norm at 128K and 256K
    assert all(c.maxnreg == 48 for _, _, c in _h100_smem_picks())


@pytest.mark.skipif(not HOPPER, reason="the H100's shared-memory picks: clusters, Hopper")
@pytest.mark.parametrize("is_rms, width, pick", _h100_smem_picks())
def test_smem_picks_register_cap(gen, is_rms, width, pick):
    """The H100 shared-memory picks carry ``maxnreg=48`` and the compile takes it: the PTX asks for
    48, ptxas gives <= 48 with no spills, and y is right. Without the cap CUDA 13's ptxas
    (torch's, which Inductor hands Triton through TRITON_PTXAS_PATH) squeezed them to 44
    registers and split pass 2's weight and bias loads (layer_norm 256 x 256K 85.7 -> 81.9%)."""
    kind = "rms" if is_rms else "layer"
    x = torch.randn((4, width), device="cuda", generator=gen).to(torch.bfloat16)
    w, b = _params(kind, width, torch.bfloat16, x.device, gen)
    # a pick that reads ahead from ahead_min_rows rows: its kernel with the requests too (4 rows here)
    no_min = dataclasses.replace(pick, l2=dataclasses.replace(pick.l2, ahead_min_rows=0))
    for cfg in (pick, no_min) if pick.l2.ahead_rows else (pick,):
        y = poison_(torch.empty_like(x))
        kernel = norm_mod._launch(x, None, w, b, y, None, 1e-6, is_rms, False, cfg)
        _check(kind, x, None, w, b, 1e-6, y, None)
        assert ".maxnreg 48" in kernel.asm["ptx"]
        # the read-ahead from ahead_min_rows rows, or the first chunks asked before the PDL wait
        asks = (cfg.l2.ahead_min_rows <= 4 and cfg.l2.ahead_rows > 0) or (cfg.l2.first_chunks > 0 and pdl_mode() == 1)
        assert ("cp.async.bulk.prefetch.L2" in kernel.asm["ptx"]) == asks
        assert kernel.n_regs <= 48 and kernel.n_spills == 0
