"""What torch.compile leaves behind that slows layer_norm's wide shelf kernels
(NOTES.md, twenty-fifth and twenty-sixth sessions).

After torch.compile has compiled and run the ops bench's layer_norm reference at 1K-16K,
the shelf picks read 81 instead of 85% of copy at 256 x 256K and 88.5 instead of 90 at 512
x 128K (with read-ahead: 74.5 instead of 86), for good; L2 lines pinned at evict_last are
not the cause (``diag_l2_pin.py``). In each state this prints, for each probe:

* bench: % of copy as the ops bench times it (CUDA-graph replays, CUDA events);
* kernel: % of copy from the kernel's own duration as CUPTI records it (median of 20 calls
  after a flush each), which no host-side effect can touch;
* the SM clock, power and throttle reasons nvidia-smi reads while the probe runs ~1 s;
* the host: load average, this process's children, the processes with a CUDA context.

States: fresh -> after torch.compile of layer_norm over the bench's shapes -> after
Inductor's compile workers are shut down -> after torch._dynamo.reset() and a collection.

    PYTHONPATH=src python benchmarks/diag_compile_state.py [--out DIR]
    TORCHINDUCTOR_COMPILE_THREADS=1 PYTHONPATH=src python benchmarks/diag_compile_state.py
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
from pathlib import Path

import torch
from torch.autograd import DeviceType

from onetrip.bench import harness
from onetrip.bench import ops as bench_ops
from onetrip.bench.cases import RowShape

from diag_bench_state import bench_one

SMI_QUERY = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def kernel_pct(fn, nbytes: int, flush: torch.Tensor, copy: float, n: int = 20) -> float:
    """% of copy from the median CUPTI duration of the kernels named *_norm_kernel* in fn()."""
    sink = torch.empty((), device=flush.device, dtype=flush.dtype)
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            torch.amax(flush, dim=0, out=sink)
            fn()
        torch.cuda.synchronize()
    durs = sorted(e.time_range.elapsed_us() for e in prof.events()
                  if e.device_type == DeviceType.CUDA and "norm_kernel" in e.name)
    if not durs:
        return 0.0
    return round(100 * harness.gbs(nbytes, durs[len(durs) // 2] / 1e3) / copy, 1)


def smi_during(fn, calls: int) -> str:
    """nvidia-smi's reading taken while ``calls`` calls of fn run on the GPU."""
    proc = subprocess.Popen(["bash", "-c", f"sleep 0.3; nvidia-smi --query-gpu={SMI_QUERY} --format=csv,noheader"],
                            stdout=subprocess.PIPE, text=True)
    for _ in range(calls):
        fn()
    out, _ = proc.communicate()
    torch.cuda.synchronize()
    return out.strip()


def host() -> dict:
    children = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, text=True).stdout.split()
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip().splitlines()
    return {"load": os.getloadavg(), "children": len(children), "cuda_apps": apps}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", default="1024,2048,4096,8192,16384", help="torch.compile's shapes, in order")
    ap.add_argument("--out", default=".", help="folder for the JSON")
    args = ap.parse_args()
    dev = torch.device("cuda")
    copy = harness.copy_bandwidth_gbs(dev)
    flush = harness.new_flush_buffer(dev)
    case = next(iter(bench_ops.select(["layer_norm"])))
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    probes = {}
    for shape in (RowShape(256, 262144), RowShape(512, 131072)):
        inputs = case.make_inputs(shape, torch.bfloat16, dev, gen)
        probes[shape.label] = (shape, (lambda t=inputs: case.fused(*t)), case.bytes_moved(shape, torch.bfloat16))

    def timed(provider, shape, compiled=None):
        return bench_one(case, provider, shape, copy, flush, compiled)

    log = {"device": harness.device_info(dev), "copy_gbs": copy,
           "compile_threads": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS"), "states": []}

    def record(name: str) -> None:
        row = {"state": name, "host": host()}
        for label, (shape, fn, nbytes) in probes.items():
            row[label] = {"bench": round(timed("onetrip", shape), 1), "kernel": kernel_pct(fn, nbytes, flush, copy),
                          "smi": smi_during(fn, 12000 if "256" in label else 24000)}
        log["states"].append(row)
        print(json.dumps(row), flush=True)

    with torch.inference_mode():
        bench_ops._raise_recompile_limit()
        print(f"{log['device']['gpu']}: copy {copy:.0f} GB/s; compile threads {log['compile_threads']}", flush=True)
        record("fresh")
        compiled = torch.compile(case.ref(), dynamic=False)
        for w in (int(v) for v in args.widths.split(",")):
            timed("torch.compile", RowShape(2**26 // w, w), compiled)
        record("after torch.compile's layer_norm over the widths")
        try:
            from torch._inductor.async_compile import shutdown_compile_workers  # noqa: PLC0415

            shutdown_compile_workers()
            record("after shutdown_compile_workers()")
        except Exception as exc:  # noqa: BLE001 - a diagnostic: say why and go on
            print(f"no shutdown_compile_workers: {exc}")
        del compiled
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
        record("after torch._dynamo.reset(), gc, empty_cache")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "threads1" if log["compile_threads"] == "1" else "default"
    (out / f"diag-compile-state-{tag}.json").write_text(json.dumps(log, indent=1))


if __name__ == "__main__":
    main()
