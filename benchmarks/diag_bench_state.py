"""Reproduce the process-history effect on layer_norm's wide shelf kernel with read-ahead
(NOTES.md, twenty-fifth session): time the 256 x 256K pick with ``pf`` rows of read-ahead
fresh, then after torch.compile has compiled and timed the bench's layer_norm reference at
1K, 2K, ... wide (the kernel's module loaded again before each probe). On an H100 it read
85.5-85.9% of copy until the 16K shape, then 74% for good; eager or Liger-Kernel before it
left it at 85.5, and the same kernel without read-ahead (--pf 0) reads as in tune_ops.

    PYTHONPATH=src python benchmarks/diag_bench_state.py [--pf 12] [--carveouts=-1,0,72,100]

--carveouts: in the end state, also time the kernel with each preferred shared-memory
carveout (% of 228 KB; -1 the driver's choice; `_common.prefer_carveout`).
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from onetrip.bench import harness
from onetrip.bench import ops as bench_ops
from onetrip.bench.cases import RowShape
from onetrip.ops import norm
from onetrip.ops._common import prefer_carveout


def bench_one(case, provider: str, shape, copy: float, flush: torch.Tensor, compiled=None) -> float:
    """% of copy of one provider of ``case`` at ``shape`` (bf16), timed as the ops bench times
    it (``bench_shape`` with its provider list cut to this one); 0.0 if it failed."""
    bench_ops.providers_for = lambda c: [provider]
    return bench_ops.bench_shape(case, shape, torch.bfloat16, compiled, copy, flush)[0]["pct_of_copy"] or 0.0


def shelf_pf(rows_ahead) -> None:
    """Give the library's shelf picks ``rows_ahead()`` rows of read-ahead (``NormConfig.pf``,
    from any row count) from here on in this process; 0 leaves them as they are (the 128K
    pick reads 32 ahead from 384 rows, the 256K one none: _norm_picks.py)."""
    pick = norm.norm_config

    def with_pf(*a, **k):
        cfg = pick(*a, **k)
        pf = rows_ahead()
        return dataclasses.replace(cfg, pf=pf, pf_rows=0) if cfg.shelf and pf else cfg

    norm.norm_config = with_pf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", default="1024,2048,4096,8192,16384", help="torch.compile's shapes, in order")
    ap.add_argument("--carveouts", default="", help="comma-separated carveouts to time at the end")
    ap.add_argument("--pf", type=int, default=12, help="rows of read-ahead given to the shelf picks (0: none)")
    args = ap.parse_args()
    shelf_pf(lambda: args.pf)
    dev = torch.device("cuda")
    copy = harness.copy_bandwidth_gbs(dev)
    flush = harness.new_flush_buffer(dev)
    case = next(iter(bench_ops.select(["layer_norm"])))
    big = RowShape(256, 262144)

    def timed(provider, shape, compiled=None):
        return bench_one(case, provider, shape, copy, flush, compiled)

    def probe():
        norm._norm_kernel.device_caches.clear()  # the next launch loads the module again
        return timed("onetrip", big)

    with torch.inference_mode():
        bench_ops._raise_recompile_limit()
        compiled = torch.compile(case.ref(), dynamic=False)
        gpu = harness.device_info(dev).get("gpu")
        print(f"{gpu}: copy {copy:.0f} GB/s; 256 x 256K fresh {probe():.1f}%", flush=True)
        for w in (int(v) for v in args.widths.split(",")):
            pct = timed("torch.compile", RowShape(2**26 // w, w), compiled)
            print(f"torch.compile {w:6d} wide {pct:5.1f}% -> onetrip 256 x 256K {probe():.1f}%", flush=True)
        if args.carveouts:
            x = torch.randn(big.rows, big.width, device=dev).to(torch.bfloat16)
            w = torch.ones(big.width, device=dev, dtype=torch.bfloat16)
            kernel = norm._launch(x, None, w, w, torch.empty_like(x), None, 1e-5, False, False)
            for c in (int(v) for v in args.carveouts.split(",")):
                prefer_carveout(kernel, c)
                print(f"  carveout {c:4d}: {timed('onetrip', big):.1f}%", flush=True)


if __name__ == "__main__":
    main()
