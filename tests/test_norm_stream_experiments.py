"""benchmarks/norm_stream.py (persistent programs walking rows, the next row's loads in
flight; clusters on Hopper) and benchmarks/norm_wbheld.py (a cluster over several rows with
its weight held), benchmarks/norm_fetch.py and norm_fetch_res.py (segments copied into
shared memory), the cluster probes, norm_streams, norm_pair and bulk_norm (CUDA C++ on bulk
copies): within the 2x-PyTorch-error rule, h = x + r exact. The one-program-a-row
streaming form runs under the interpreter too; the clusters need a Hopper GPU."""

import sys
from pathlib import Path

import pytest
import torch

from onetrip.ops.norm import add_layer_norm_ref, add_rms_norm_ref
from onetrip.testing import assert_close, poison_, upcast

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def _inputs(gen, device, rows, width, kind, residual):
    def rand(*shape):
        return torch.randn(*shape, device=device, generator=gen).to(torch.bfloat16)
    x = (torch.randn(rows, width, device=device, generator=gen) * 2 + 0.5).to(torch.bfloat16)
    return x, rand(rows, width) if residual else None, rand(width), rand(width) if kind == "layer" else None


def _check(x, r, w, b, y, h, eps):
    """y against the float32 reference of h = x + r as rounded (the experiments normalize the
    rounded h, as ``add_*_ref`` does), h exact."""
    hh = x if r is None else x + r
    if r is not None:
        assert torch.equal(h, hh)
    if b is None:
        assert_close("y", y, add_rms_norm_ref(*upcast(hh, None, w), eps, round_to=x.dtype)[0],
                     add_rms_norm_ref(hh, None, w, eps)[0])
    else:
        assert_close("y", y, add_layer_norm_ref(*upcast(hh, None, w, b), eps)[0],
                     add_layer_norm_ref(hh, None, w, b, eps)[0])


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("rows, width, programs, prefetch", [(7, 100, 3, True), (5, 64, 5, False), (1, 17, 4, True)])
def test_stream_one_program_a_row(device, gen, kind, residual, rows, width, programs, prefetch):
    """Programs walking 1-3 rows each (or none: 4 programs for 1 row), ragged widths."""
    from norm_stream import stream_norm

    x, r, w, b = _inputs(gen, device, rows, width, kind, residual)
    y = poison_(torch.empty_like(x))
    h = poison_(torch.empty_like(x)) if residual else None
    stream_norm(x, r, w, b, 1e-5, y, h, 1, 4, programs, prefetch)
    _check(x, r, w, b, y, h, 1e-5)


def _hopper():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("clusters need Hopper")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("c, clusters, prefetch", [(4, 3, True), (2, 9, False), (16, 1, True)])
def test_stream_clusters(gen, kind, residual, c, clusters, prefetch):
    """Rows split over clusters of 2-16, 1-4 rows a cluster (9 rows), a ragged last segment."""
    _hopper()
    from norm_stream import stream_norm

    x, r, w, b = _inputs(gen, "cuda", 9, 5000, kind, residual)
    y = poison_(torch.empty_like(x))
    h = poison_(torch.empty_like(x)) if residual else None
    stream_norm(x, r, w, b, 1e-5, y, h, c, 4, clusters, prefetch)
    _check(x, r, w, b, y, h, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("r, held_wb, hold", [(1, False, 1), (2, True, 0), (4, True, 1), (3, False, 0)])
def test_wb_held_clusters(gen, kind, r, held_wb, hold):
    """Clusters of 4 over 1-4 of 9 rows (the last cluster's rows past the end skipped)."""
    _hopper()
    from norm_wbheld import wb_norm

    x, _, w, b = _inputs(gen, "cuda", 9, 4 * 2 * 256, kind, False)
    y = poison_(torch.empty_like(x))
    wb_norm(x, w, b, 1e-5, y, 4, 256, 4, r, held_wb, hold)
    _check(x, None, w, b, y, None, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("c, wb, pf", [(1, False, 0), (4, False, 1), (4, True, 0), (16, False, 2)])
def test_fetch(gen, kind, c, wb, pf):
    """benchmarks/norm_fetch.py: segments copied into shared memory by cp.async, a program a
    row (c 1) or clusters of 4-16; the weight and bias fetched too (wb), or loaded pf
    chunks ahead."""
    _hopper()
    from norm_fetch import fetch_norm

    x, _, w, b = _inputs(gen, "cuda", 9, c * 2 * 1024, kind, False)
    y = poison_(torch.empty_like(x))
    fetch_norm(x, w, b, 1e-5, y, c, 1024, 4, wb, pf)
    _check(x, None, w, b, y, None, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("c, block, warps", [(4, 1024, 4), (16, 2048, 8)])
def test_fetch_residual(gen, kind, c, block, warps):
    """benchmarks/norm_fetch_res.py: x and r copied into dynamic shared memory, h = x + r
    stored and kept there for pass 2; clusters of 4-16."""
    _hopper()
    from norm_fetch_res import res_norm

    x, r, w, b = _inputs(gen, "cuda", 9, c * 2 * block, kind, True)
    y, h = poison_(torch.empty_like(x)), poison_(torch.empty_like(x))
    res_norm(x, r, w, b, 1e-5, y, h, c, block, warps)
    _check(x, r, w, b, y, h, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("rows, c, clusters, depth, wsm", [(37, 4, 5, 2, False), (9, 16, 2, 3, True),
                                                          (3, 8, 7, 2, True), (17, 2, 1, 2, False)])
def test_ring(gen, kind, rows, c, clusters, depth, wsm):
    """benchmarks/norm_ring.py: persistent clusters (more or fewer than the rows) streaming
    rows through a ring of ``depth`` shared-memory slots, w and b there too (wsm)."""
    _hopper()
    from norm_ring import ring_norm

    x, _, w, b = _inputs(gen, "cuda", rows, c * 2 * 1024, kind, False)
    y = poison_(torch.empty_like(x))
    ring_norm(x, w, b, 1e-5, y, c, 1024, 4, clusters, depth, wsm)
    _check(x, None, w, b, y, None, 1e-5)


@pytest.mark.gpu
def test_cluster_room():
    """benchmarks/cluster_room.py: the driver's count of clusters that fit is positive and
    falls as the clusters grow or the CTAs an SM shrink (a wrong struct layout gives None or
    nonsense)."""
    _hopper()
    from cluster_room import fingerprint

    room = fingerprint()
    for per_sm in range(1, 6):
        counts = [room[f"{per_sm}/SM"][f"c{c}"] for c in (2, 4, 8, 16)]
        assert all(isinstance(n, int) and n > 0 for n in counts), counts
        assert counts == sorted(counts, reverse=True), counts
        assert room[f"{per_sm}/SM"]["blocks_per_sm"] == per_sm
    assert room["1/SM"]["c2"] * 2 <= torch.cuda.get_device_properties(0).multi_processor_count


@pytest.mark.gpu
def test_cluster_placement():
    """cluster_room.placement: every CTA wrote an SM id of this GPU (none left at -1)."""
    _hopper()
    from cluster_room import placement

    res = placement(clusters=32)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for row in res["sm_of_rank_first_4_clusters"]:
        assert len(row) == 16 and all(0 <= s < sms for s in row), row
    assert 1 <= res["sms_used"] <= sms and sum(res["ranks_per_sm"]) >= 16


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("side", ["c8", "split16", None])
def test_two_streams(gen, kind, side):
    """benchmarks/norm_streams.py: 9 rows of 256K, 6 by the pick and 3 by the side stream's
    config (or all 9 there), eagerly and replayed from a CUDA graph with new inputs."""
    _hopper()
    from norm_streams import SIDE, two_streams

    x, _, w, b = _inputs(gen, "cuda", 9, 262144, kind, False)
    cfg = SIDE[kind == "rms"][side] if side else None
    k = 6 if side else 0
    y = poison_(torch.empty_like(x))
    two_streams(x, w, b, y, 1e-5, k, cfg)
    torch.cuda.synchronize()
    _check(x, None, w, b, y, None, 1e-5)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        two_streams(x, w, b, y, 1e-5, k, cfg)
    x.copy_((torch.randn(x.shape, device="cuda", generator=gen) * 2 + 0.5).to(x.dtype))
    poison_(y)
    graph.replay()
    torch.cuda.synchronize()
    _check(x, None, w, b, y, None, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("r, split, block_n", [(1, 16, 4096), (2, 16, 4096), (2, 4, 1024)])
def test_pair(gen, r, split, block_n):
    """benchmarks/norm_pair.py: 6 rows of 256K (three pairs, or six clusters), within the rule."""
    _hopper()
    from norm_pair import pair_rms_norm

    x, _, w, _ = _inputs(gen, "cuda", 6, 262144, "rms", False)
    y = poison_(torch.empty_like(x))
    pair_rms_norm(x, w, 1e-5, y, r, split, block_n)
    torch.cuda.synchronize()
    _check(x, None, w, None, y, None, 1e-5)


def _built(source):
    """Skips unless bulk_norm.SOURCES[source] builds (nvcc on the GPU machine)."""
    from bulk_norm import build

    try:
        build(source)
    except RuntimeError as exc:
        pytest.skip(str(exc))


def _sliced(gen, rows, width, kind, padded):
    """(x, w, b, y) on the GPU: x's rows ``width`` wide out of rows 64 wider when ``padded``;
    y poisoned."""
    x, _, w, b = _inputs(gen, "cuda", rows, width + 64 * padded, kind, False)
    x, w = x[:, :width], w[:width]
    b = None if b is None else b[:width]
    return x, w, b, poison_(torch.empty_like(x))


def _eager_then_graph(call, x, w, b, y, gen, n):
    """``call()`` (writing y from x) n times eagerly, then captured in a CUDA graph and
    replayed n times, each on new x: y within the rule after every one."""
    for _ in range(n):
        call()
        torch.cuda.synchronize()
        _check(x, None, w, b, y, None, 1e-5)
        poison_(y)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for _ in range(n):
        x.copy_((torch.randn(x.shape, device="cuda", generator=gen) * 2 + 0.5).to(x.dtype))
        poison_(y)
        graph.replay()
        torch.cuda.synchronize()
        _check(x, None, w, b, y, None, 1e-5)


_BULK = [  # (rows, width, config class, its fields, clusters cap, padded row stride)
    (6, 262144, "bulk", dict(ranks=16, early=0, xch=0), None, False),
    (6, 262144, "bulk", dict(ranks=16, early=0, wsmem=True), None, True),
    (6, 262144, "bulk", dict(ranks=16, early=2, pb=2), None, False),
    (7, 262144, "bulk", dict(ranks=16, nbuf=2), 2, False),  # persistent: 3-4 rows a cluster, parity flips
    (9, 262144, "bulk", dict(ranks=16, nbuf=2, early=2, pb=4), 3, True),
    (5, 32768, "bulk", dict(ranks=4, pb=4), None, True),
    (9, 131072, "bulk", dict(ranks=8, threads=512, pb=4), None, False),
    (5, 262144, "bulk", dict(ranks=8, early=2, pb=4), None, False),
    (7, 262144, "ws", dict(ranks=16, nbuf=4, look=0, xw=0), 2, False),
    (9, 262144, "ws", dict(ranks=16, nbuf=3), 2, True),
    (11, 262144, "ws", dict(ranks=16, nbuf=3, wsmem=False, early=1), 2, True),
    (4, 131072, "ws", dict(ranks=8, nbuf=5, xw=0), 1, False),  # fewer rows than buffers
    (7, 262144, "ws", dict(ranks=16, nbuf=4, look=0), 2, False),
    (9, 131072, "ws", dict(ranks=8, nbuf=3, prod=3), 2, True),
    (11, 131072, "ws", dict(ranks=8, nbuf=4, prod=4), 3, False),
    (3, 131072, "ws", dict(ranks=8, nbuf=4, prod=4), 1, False),  # a producer with no rows
    (9, 131072, "ws", dict(ranks=8, cw=16, nbuf=4, prod=4), 3, False),
    (9, 262144, "ws", dict(ranks=16, nbuf=4, prod=4, hint=False), 2, True),  # without the L2 hints
    (11, 131072, "ws", dict(ranks=8, nbuf=4, prod=4, hint=False), 3, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("rows, width, cls, fields, clusters, padded", _BULK)
def test_bulk_norm(gen, kind, rows, width, cls, fields, clusters, padded):
    """benchmarks/bulk_norm.py (CUDA C++, bulk copies and DSMEM; bulk_norm.cu and its
    warp-specialized bulk_norm_ws.cu): within the rule, for plain and persistent grids, more
    or fewer rows than buffers, padded rows; eagerly and replayed from a CUDA graph on new x."""
    _hopper()
    from bulk_norm import BulkConfig, WsConfig, bulk_norm

    _built(0)
    cfg = (BulkConfig if cls == "bulk" else WsConfig)(**fields)
    x, w, b, y = _sliced(gen, rows, width, kind, padded)
    _eager_then_graph(lambda: bulk_norm(x, w, b, 1e-5, y, cfg, clusters), x, w, b, y, gen, 1)


def test_bulk_norm_rejects():
    """The launcher's checks, before any GPU work: a width that does not cut into whole
    16-byte chunks, too much shared memory, and a tensor off the GPU raise ValueError naming
    the limit."""
    from bulk_norm import BulkConfig, bulk_norm

    x = torch.empty(2, 262144, dtype=torch.bfloat16)
    w = torch.empty(262144, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="segments of a multiple of 8192"):
        bulk_norm(x[:, :1000], w[:1000], None, 1e-5, x[:, :1000], BulkConfig(4))
    with pytest.raises(ValueError, match="shared memory"):
        bulk_norm(x, w, w, 1e-5, x, BulkConfig(8, 256, 2, 1, True))
    with pytest.raises(ValueError, match="x must be a CUDA bfloat16"):
        bulk_norm(x, w, None, 1e-5, x)


_GRID = [  # (rows, width, GridConfig fields, padded row stride)
    (1, 262144, {}, False),
    (7, 262144, {}, True),
    (37, 131072, dict(cw=4), False),
    (3, 8008, {}, True),  # 126 CTAs of 64 columns, the last with 8
    (300, 4096, dict(batch=2), False),  # the ring's parities flip a dozen times
    (70, 262144, dict(d=40, lag=16, batch=8), True),  # a last batch of 6 rows
    (65, 262144, dict(vpt=2, d=24, ctas=64), False),
    (37, 262144, dict(poll=4, batch=1, hint=True), False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("rows, width, fields, padded", _GRID)
def test_grid_norm(gen, kind, rows, width, fields, padded):
    """benchmarks/grid_norm.py (CUDA C++, every SM on every row, statistics through L2 as
    tagged words): within the rule for uneven last slices, more rows than the ring holds and
    padded rows; eagerly twice and replayed twice from a CUDA graph on new x (each launch's
    tag differs, so no launch takes an earlier one's partials)."""
    _hopper()
    from grid_norm import GridConfig, grid_norm

    _built(2)
    cfg = GridConfig(**fields)
    x, w, b, y = _sliced(gen, rows, width, kind, padded)
    _eager_then_graph(lambda: grid_norm(x, w, b, 1e-5, y, cfg), x, w, b, y, gen, 2)


def test_grid_norm_rejects():
    """The launcher's checks before any GPU work: a width off the 16-byte grid, a diagnostic
    asked of LayerNorm, and a tensor off the GPU raise ValueError."""
    from grid_norm import GridConfig, grid_norm

    x = torch.empty(2, 4096, dtype=torch.bfloat16)
    w = torch.empty(4096, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiples of 8"):
        grid_norm(x[:, :1001], w[:1001], None, 1e-5, x[:, :1001])
    with pytest.raises(ValueError, match="RMSNorm diagnostic"):
        grid_norm(x, w, w, 1e-5, x, GridConfig(kind="copy"))
    with pytest.raises(ValueError, match="x must be a 16-byte aligned CUDA bfloat16"):
        grid_norm(x, w, None, 1e-5, x)
