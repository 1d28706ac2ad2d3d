"""Does a kernel's ``evict_last`` traffic leave L2 lines pinned for later kernels?
(NOTES.md, twenty-sixth session: the hypothesis behind the bench's slow state.)

The twenty-fifth session found that after torch.compile's LayerNorm kernels of the ops
bench have run, layer_norm's shelf kernel with read-ahead (``NormConfig.pf``) runs 10-11
points slower for good, and nothing tried brought it back. Inductor loads a looped
reduction's row with ``evict_last`` in its first pass; if such lines keep their priority
after the kernel, normal traffic (the bench's flush included) cannot evict them, and later
kernels see a smaller L2. The read-ahead kernel needs L2 room for the rows it asked for.

States, in order; in each: the probes (onetrip's layer_norm picks, timed as the ops bench
times them) and an "effective L2" column (GB/s of re-reading 8-40 MiB with torch.amax). That
column measures nothing: a 1-D amax reads too slowly to tell the L2 from HBM (1.1-2.9 TB/s
at every size on an H100); it is kept so that the script reproduces its result file.

    fresh -> pinned by a Triton kernel reading a buffer with evict_last -> after the
    bench's flush (256 MiB of ordinary reads) -> after cuCtxResetPersistingL2Cache ->
    after torch.compile's layer_norm reference over the bench's shapes -> after a reset

    PYTHONPATH=src python benchmarks/diag_l2_pin.py [--pin-mib 128] [--out DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from onetrip.bench import harness
from onetrip.bench import ops as bench_ops
from onetrip.bench.cases import RowShape
from onetrip.ops import norm
from onetrip.ops._common import _libcuda

from diag_bench_state import bench_one, shelf_pf

_PERSISTING_LIMIT = 0x06  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE
_MAX_PERSISTING = 108  # CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, POLICY: tl.constexpr, BLOCK: tl.constexpr):
    """out[pid] = sum of x's BLOCK elements at pid, loaded with eviction policy POLICY."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy=POLICY)
    tl.store(out_ptr + pid, tl.sum(v, axis=0))


def read_with(buf: torch.Tensor, policy: str) -> None:
    """Read every element of ``buf`` (float32) once with the given L2 eviction policy."""
    block = 4096
    out = torch.empty(triton.cdiv(buf.numel(), block), device=buf.device, dtype=torch.float32)
    _read_kernel[(out.numel(),)](buf, out, buf.numel(), POLICY=policy, BLOCK=block)


def effective_l2(dev: torch.device, sizes_mib=(8, 16, 24, 32, 40)) -> dict:
    """GB/s of re-reading (torch.amax, ordinary loads) a buffer of each size 20 times in a
    row: near L2 speed while it fits in what the L2 lets it keep, near HBM speed past that."""
    res = {}
    for mib in sizes_mib:
        buf = torch.ones(mib << 18, device=dev, dtype=torch.float32)
        sink = torch.empty((), device=dev, dtype=torch.float32)
        graph = torch.cuda.CUDAGraph()  # 20 reads in one replay: a launch (~4 us) outlasts an 8 MiB read
        with torch.cuda.graph(graph):
            for _ in range(20):
                torch.amax(buf, dim=0, out=sink)
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        res[mib] = round(harness.gbs(20 * buf.numel() * 4, start.elapsed_time(end)), 0)
        del graph, buf
    return res


def reset_persisting() -> int:
    """cuCtxResetPersistingL2Cache on the current context: every persisting line back to normal."""
    lib = _libcuda()
    return -1 if lib is None else int(lib.cuCtxResetPersistingL2Cache())


def limits(dev: torch.device) -> dict:
    lib, val, attr = _libcuda(), ctypes.c_size_t(0), ctypes.c_int(0)
    if lib is None:
        return {}
    lib.cuCtxGetLimit(ctypes.byref(val), ctypes.c_int(_PERSISTING_LIMIT))
    lib.cuDeviceGetAttribute(ctypes.byref(attr), ctypes.c_int(_MAX_PERSISTING), ctypes.c_int(dev.index or 0))
    return {"persisting_limit": val.value, "max_persisting": attr.value}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pin-mib", type=int, default=128, help="MiB read with evict_last to pin lines")
    ap.add_argument("--pf", type=int, default=12, help="rows of read-ahead for the shelf probe (0: none)")
    ap.add_argument("--widths", default="1024,2048,4096,8192,16384", help="torch.compile's shapes, in order")
    ap.add_argument("--out", default=".", help="folder for the JSON and Inductor's 16K code")
    args = ap.parse_args()
    dev = torch.device("cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state = {"pf": 0}
    shelf_pf(lambda: state["pf"])
    copy = harness.copy_bandwidth_gbs(dev)
    flush = harness.new_flush_buffer(dev)
    case = next(iter(bench_ops.select(["layer_norm"])))
    probes = {"256x256K pf": (RowShape(256, 262144), args.pf), "256x256K": (RowShape(256, 262144), 0),
              "512x128K": (RowShape(512, 131072), 0)}

    def timed(provider, shape, compiled=None):
        return bench_one(case, provider, shape, copy, flush, compiled)

    log = {"device": harness.device_info(dev), "copy_gbs": copy, "limits": limits(dev), "states": []}

    def record(name: str) -> None:
        row = {"state": name, "l2_gbs": effective_l2(dev)}
        for label, (shape, pf) in probes.items():
            state["pf"] = pf
            norm._norm_kernel.device_caches.clear()
            row[label] = round(timed("onetrip", shape), 1)
        state["pf"] = 0
        log["states"].append(row)
        print(json.dumps(row), flush=True)

    pin = torch.ones(args.pin_mib << 18, device=dev, dtype=torch.float32)
    with torch.inference_mode():
        bench_ops._raise_recompile_limit()
        print(f"{log['device']['gpu']}: copy {copy:.0f} GB/s, {log['limits']}", flush=True)
        record("fresh")
        read_with(pin, "evict_last")
        record(f"after {args.pin_mib} MiB read evict_last")
        torch.amax(flush, dim=0)
        record("after the bench's flush")
        log["reset_rc"] = reset_persisting()
        record("after cuCtxResetPersistingL2Cache")
        read_with(pin, "evict_last")
        read_with(pin, "evict_first")
        record("after evict_last then evict_first over the same buffer")
        compiled = torch.compile(case.ref(), dynamic=False)
        for w in (int(v) for v in args.widths.split(",")):
            timed("torch.compile", RowShape(2**26 // w, w), compiled)
        record("after torch.compile's layer_norm 1K-16K")
        reset_persisting()
        record("after a second reset")
        try:  # what Inductor loads with which eviction policy at 16K
            from torch._inductor.utils import run_and_get_code  # noqa: PLC0415

            torch._dynamo.reset()
            shape = RowShape(2**26 // 16384, 16384)
            gen = torch.Generator(device=dev)
            gen.manual_seed(0)
            inputs = case.make_inputs(shape, torch.bfloat16, dev, gen)
            _, code = run_and_get_code(torch.compile(case.ref(), dynamic=False), *inputs)
            (out / "inductor-layer-norm-16k.py").write_text("\n\n".join(code))
        except Exception as exc:  # noqa: BLE001 - a diagnostic: say why and go on
            print(f"Inductor's code not saved: {exc}")
    (out / "diag-l2-pin.json").write_text(json.dumps(log, indent=1))


if __name__ == "__main__":
    main()
