"""Does the kernel launched before a wide norm decide its shared-memory configuration?
(NOTES.md, twenty-seventh session.)

Each SM splits its 256 KB of L1 / shared memory per kernel. With no preference set, the
driver picks the split "to run beside the kernels already launched", so the split a kernel
gets may follow the one before it. The wide norm picks are sensitive to it (twenty-fifth
session, % of copy by preferred carveout): layer_norm's shelf 85.4 at 164 KB of shared memory
and 82.5-82.6 at 196-228 KB; rms_norm's loop pick 88.2-88.4 at <= 32 KB and 80.7-80.8 from 64
KB on. Here each pick is timed as the ops bench times it right after a primer:

* ``gemm``: a cuBLAS bf16 GEMM (its kernels take most of the shared memory), as a
  transformer's projections run before its norms;
* ``l1``: the rms_norm pick with a carveout of 0 asked (the split with the most L1);

once with the driver's choice (-1) and once with the carveout the pick is best at asked
(the shelf picks 72%, the others 0%; `_common.prefer_carveout`).

--after-bench OPS: instead, run the ops bench of OPS (comma-separated, in order) in this
process first, then time each pick with the carveouts of --carveouts: does a process that
the bench left in the slow state (twenty-sixth session) come back with one asked?

    PYTHONPATH=src python benchmarks/diag_smem_config.py [--out DIR] [--rounds 2]
    PYTHONPATH=src python benchmarks/diag_smem_config.py --after-bench rms_norm,add_rms_norm,add_layer_norm,layer_norm
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from diag_bench_state import bench_one
from onetrip.bench import harness
from onetrip.bench import ops as bench_ops
from onetrip.bench.cases import RowShape
from onetrip.ops import norm
from onetrip.ops._common import prefer_carveout

SHAPES = [RowShape(256, 262144), RowShape(512, 131072), RowShape(64, 262144)]


def picks(dev: torch.device, families: str):
    """(family, its bench case, is_rms, shape, the pick's compiled kernel) for each family and
    shape of SHAPES; the kernel is launched once here so that a carveout can be asked of it."""
    for fam in families.split(","):
        case = next(iter(bench_ops.select([fam])))
        is_rms = fam == "rms_norm"
        for shape in SHAPES:
            x = torch.randn(shape.rows, shape.width, device=dev, dtype=torch.bfloat16)
            w = torch.ones(shape.width, device=dev, dtype=torch.bfloat16)
            kernel = norm._launch(x, None, w, None if is_rms else w, torch.empty_like(x), None, 1e-6, is_rms, False)
            del x, w
            yield fam, case, is_rms, shape, kernel
            prefer_carveout(kernel, -1)


def write(out: str, name: str, dev: torch.device, copy: float, rows: list) -> None:
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    path = path / name
    path.write_text(json.dumps(dict(meta=dict(harness.device_info(dev), copy_gbs=copy), results=rows), indent=1,
                               default=str))
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".", help="folder for the JSON")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--families", default="layer_norm,rms_norm")
    ap.add_argument("--after-bench", default="", help="ops to bench in this process first (see above)")
    ap.add_argument("--carveouts", default="-1,72,86,100,-1", help="with --after-bench")
    args = ap.parse_args()
    if args.after_bench:
        return after_bench(args)
    dev = torch.device("cuda")
    copy = harness.copy_bandwidth_gbs(dev)
    flush = harness.new_flush_buffer(dev)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    x_l1 = torch.randn(256, 262144, device=dev, dtype=torch.bfloat16)
    w_l1 = torch.ones(262144, device=dev, dtype=torch.bfloat16)
    l1_cfg = dataclasses.replace(norm.norm_config(256, 262144, dev, is_rms=True, has_residual=False), carveout=0)

    def primer(kind: str) -> None:
        if kind == "gemm":
            torch.mm(a, a)
        else:  # twice: the carveout is asked from the second launch on
            for _ in range(2):
                norm._launch(x_l1, None, w_l1, None, torch.empty_like(x_l1), None, 1e-6, True, False, l1_cfg)
        torch.cuda.synchronize()

    rows = []
    gpu = harness.device_info(dev).get("gpu")
    print(f"{gpu}: copy {copy:.0f} GB/s", flush=True)
    with torch.inference_mode():
        for fam, case, is_rms, shape, kernel in picks(dev, args.families):
            best = 72 if norm.norm_config(shape.rows, shape.width, dev, is_rms=is_rms, has_residual=False).shelf else 0
            for rnd in range(args.rounds):
                for kind in ("gemm", "l1"):
                    for pref in (-1, best):
                        prefer_carveout(kernel, pref)
                        primer(kind)
                        pct = bench_one(case, "onetrip", shape, copy, flush)
                        rows.append(dict(family=fam, rows=shape.rows, width=shape.width, primer=kind, carveout=pref,
                                         round=rnd, pct_copy=pct))
                        print(f"{fam:10s} {shape.rows:4d} x {shape.width // 1024}K after {kind:4s} "
                              f"carveout {pref:3d}: {pct:5.1f}%", flush=True)
    write(args.out, "diag-smem-config.json", dev, copy, rows)


def after_bench(args) -> None:
    """The ops bench of ``args.after_bench`` first, then each pick at each carveout."""
    import tempfile

    dev = torch.device("cuda")
    records = bench_ops.run_ops_bench(args.after_bench.split(","), torch.bfloat16, Path(tempfile.mkdtemp()), False)
    copy = harness.copy_bandwidth_gbs(dev)
    flush = harness.new_flush_buffer(dev)
    rows = [dict(r, source="ops bench") for r in records if r.get("provider") == "onetrip"
            and r.get("op") in args.families.split(",") and (r.get("width") or 0) >= 131072]
    for r in rows:
        print(f"bench: {r['op']} {r['rows']} x {r['width'] // 1024}K {r.get('pct_of_copy') or 0:.1f}%", flush=True)
    with torch.inference_mode():
        for fam, case, _, shape, kernel in picks(dev, args.families):
            for pref in (int(c) for c in args.carveouts.split(",")):
                prefer_carveout(kernel, pref)
                pct = bench_one(case, "onetrip", shape, copy, flush)
                rows.append(dict(family=fam, rows=shape.rows, width=shape.width, carveout=pref, pct_copy=pct))
                print(f"{fam:10s} {shape.rows:4d} x {shape.width // 1024}K carveout {pref:3d}: {pct:5.1f}%", flush=True)
    write(args.out, "diag-smem-config-after-bench.json", dev, copy, rows)


if __name__ == "__main__":
    main()
