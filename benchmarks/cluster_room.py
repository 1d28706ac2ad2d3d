"""How many thread-block clusters this GPU holds at once: the chip's fingerprint for the
cluster norms (issue 2; NOTES.md, twenty-first session).

Why: a cluster's CTAs must all sit in one GPC, so the room for clusters of 16 depends on
how many SMs each GPC of this particular chip has (H100 SXM parts differ: 132 SMs over
8 GPCs, not evenly), and the same split-row pick ran 2-3 points apart on different H100s.
This prints, from ``cuOccupancyMaxActiveClusters``: clusters of 2-16 a probe kernel fits
at 1-5 CTAs an SM (set by its dynamic shared memory), and for the library's cluster picks
(H100 table) the clusters that fit against the CTAs the SMs would hold without clusters;
and which SMs each cluster rank lands on (``placement``).
    python benchmarks/cluster_room.py --out DIR      # on a Hopper GPU
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


class LaunchAttr(ctypes.Structure):
    """The driver API's CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value whose
    first 12 bytes are, for the cluster dimension (id 4), the cluster's x, y, z."""
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("dim", ctypes.c_uint32 * 3),
                ("rest", ctypes.c_uint8 * 52)]


class LaunchConfig(ctypes.Structure):
    """The driver API's CUlaunchConfig: grid, block, dynamic shared bytes, stream, attributes."""
    _fields_ = [("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("smem", ctypes.c_uint32),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttr)), ("n_attrs", ctypes.c_uint32)]


def cluster_config(grid: int, c: int, threads: int, nbytes: int, stream: int | None = None):
    """(config, attribute) for a 1-D launch of ``grid`` CTAs in clusters of ``c``; keep the
    attribute alive as long as the config."""
    attr = LaunchAttr(id=4, dim=(c, 1, 1))  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cfg = LaunchConfig(grid=(grid, 1, 1), block=(threads, 1, 1), smem=nbytes, stream=stream,
                       attrs=ctypes.pointer(attr), n_attrs=1)
    return cfg, attr


def max_clusters(compiled, c: int, warps: int, nbytes: int) -> int | None:
    """How many clusters of c CTAs of this kernel the GPU holds at once
    (``cuOccupancyMaxActiveClusters``), or None where the driver call is unavailable.
    ``compiled``: anything with the CUfunction handle as ``.function``; ``nbytes``: its
    dynamic shared memory a CTA."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        fn = ctypes.c_void_p(compiled.function)
        cu.cuFuncSetAttribute(fn, 14, 1)  # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        cfg, _attr = cluster_config(c * 64, c, 32 * warps, nbytes)
        n = ctypes.c_int(0)
        if cu.cuOccupancyMaxActiveClusters(ctypes.byref(n), fn, ctypes.byref(cfg)) != 0:
            return None
        return n.value
    except (OSError, AttributeError, TypeError):
        return None


@triton.jit
def _probe(x_ptr):
    tl.store(x_ptr + tl.arange(0, 128), tl.zeros([128], tl.float32))


@triton.jit
def _where(out_ptr, spin):
    """Records the SM this CTA runs on (``%smid``), after ``spin`` rounds of busy work (so
    that the CTAs of a grid overlap as the norm's do)."""
    smid = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    acc = tl.zeros([128], tl.float32) + smid.to(tl.float32)
    for _ in range(spin):
        acc = acc * 0.999 + 1.0
    tl.store(out_ptr + tl.program_id(0), smid + (tl.sum(acc) < -1.0).to(tl.int32))


def placement(ranks: int = 16, clusters: int = 256, warps: int = 16, spin: int = 20000) -> dict:
    """Which SMs the CTAs of each cluster rank land on, for a grid like the rms_norm 256K pick
    (256 clusters of 16, 16 warps: four CTAs an SM by warps). Whether the SM that runs rank
    k of one row's cluster runs rank k of the other rows too decides if a segment's weight
    could be served from that SM's L1 rather than re-read from L2 for every row. (An H100,
    twenty-second session: 116 SMs, 88 of them one rank only; the weight still missed the L1.)"""
    from onetrip.ops._cluster import launch_clusters  # noqa: PLC0415
    out = torch.full((clusters * ranks,), -1, device="cuda", dtype=torch.int32)
    if launch_clusters(_where, clusters, ranks, out, spin, num_warps=warps) is None:
        raise RuntimeError("this Triton's kernels carry no cluster launch metadata")
    torch.cuda.synchronize()
    if int(out.min()) < 0:
        raise RuntimeError("a CTA never ran")
    sm = out.view(clusters, ranks).cpu()
    by_sm: dict[int, set] = {}
    for c in range(clusters):
        for k in range(ranks):
            by_sm.setdefault(int(sm[c, k]), set()).add(k)
    counts = sorted(len(v) for v in by_sm.values())
    res = {"ranks": ranks, "clusters": clusters, "warps": warps, "sms_used": len(by_sm),
           "ranks_per_sm": counts, "sm_of_rank_first_4_clusters": sm[:4].tolist()}
    print(f"placement: {clusters} clusters of {ranks} at {warps} warps on {len(by_sm)} SMs; distinct ranks an SM "
          f"ran: min {counts[0]}, median {counts[len(counts) // 2]}, max {counts[-1]}", flush=True)
    return res


def blocks_per_sm(compiled, warps: int, smem: int) -> int:
    """CTAs of ``compiled`` an SM holds (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
    cu = ctypes.CDLL("libcuda.so.1")
    n = ctypes.c_int(0)
    cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), ctypes.c_void_p(compiled.function),
                                                   32 * warps, smem)
    return n.value


def fingerprint() -> dict:
    """Clusters of 2-16 of a 4-warp probe at 1-5 CTAs an SM."""
    x = torch.empty(128, device="cuda")
    compiled = _probe.warmup(x, grid=(1,), num_warps=4)
    compiled._init_handles()
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuFuncSetAttribute(ctypes.c_void_p(compiled.function), 8, 200 * 1024)  # MAX_DYNAMIC_SHARED_SIZE_BYTES
    out = {}
    for per_sm, smem in [(1, 120 * 1024), (2, 100 * 1024), (3, 70 * 1024), (4, 52 * 1024), (5, 42 * 1024)]:
        got = blocks_per_sm(compiled, 4, smem)
        out[f"{per_sm}/SM"] = {"blocks_per_sm": got,
                               **{f"c{c}": max_clusters(compiled, c, 4, smem) for c in (2, 4, 8, 16)}}
        print(f"{per_sm} CTA/SM (occupancy says {got}): " + ", ".join(
            f"clusters of {c}: {v}" for c, v in ((c, out[f'{per_sm}/SM'][f'c{c}']) for c in (2, 4, 8, 16))),
            flush=True)
    return out


def picks() -> list:
    """The H100 table's cluster picks: clusters that fit, CTAs an SM without clusters."""
    from onetrip.ops import norm  # noqa: PLC0415
    from onetrip.ops._norm_picks import PICKS_GPU  # noqa: PLC0415
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for (mode, is_rms, res, width), cfg in PICKS_GPU.get("H100", {}).items():
        if not cfg.cluster or cfg.split < 2:
            continue
        m = 2 * cfg.split
        x = torch.randn(m, width, device="cuda", dtype=torch.bfloat16)
        r = torch.randn_like(x) if res else None
        w = torch.randn(width, device="cuda", dtype=torch.bfloat16)
        y, h = torch.empty_like(x), (torch.empty_like(x) if res else None)
        compiled = norm._launch(x, r, w, None if is_rms else w, y, h, 1e-5, is_rms, False, cfg)
        smem = compiled.metadata.shared
        fit = max_clusters(compiled, cfg.split, cfg.num_warps, smem)
        per_sm = blocks_per_sm(compiled, cfg.num_warps, smem)
        name = ("add_" if res else "") + ("rms_norm" if is_rms else "layer_norm")
        row = dict(op=name, width=width, split=cfg.split, warps=cfg.num_warps, regs=compiled.n_regs,
                   clusters_fit=fit, ctas_in_clusters=(fit or 0) * cfg.split, ctas_without=per_sm * sms)
        rows.append(row)
        print(f"{name:15s} {width:7d} split {cfg.split:2d} {cfg.num_warps:2d} warps {compiled.n_regs:3d} regs: "
              f"{fit} clusters = {row['ctas_in_clusters']} CTAs of {row['ctas_without']} ({per_sm} an SM)", flush=True)
    return rows


def main() -> int:
    from gemv_chain import chain_setup  # noqa: PLC0415
    args, _, _, res = chain_setup()
    res["fingerprint"] = fingerprint()
    res["picks"] = picks()
    res["placement"] = [placement(), placement(clusters=64), placement(ranks=8, warps=8)]
    (args.out / "cluster-room.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
