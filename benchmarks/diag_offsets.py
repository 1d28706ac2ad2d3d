"""Does the layer_norm shelf kernel's speed follow where x and y sit in memory?
(NOTES.md, twenty-sixth session.)

In the ops bench the shelf picks read either ~86% of copy (256 x 256K) or ~81%, process by
process, whichever copy size the kernel has; nothing that state-resetting calls touch
brings the slow figure back, and no GPU clock or L2 setting differs. The one thing a
process's history changes for certain is where its tensors land. Here x and y of each of two
input sets are cut from one pool at chosen offsets, and the library's pick is timed as the
ops bench times it (a graph of 4 calls over the 2 sets after a flush, median per call) for:

* y placed d after x (the sets 1 GiB apart), d = 128 MiB (adjacent) + a sweep of 0 B-16 MiB;
* the whole layout shifted by a sweep of base offsets.

    PYTHONPATH=src python benchmarks/diag_offsets.py [--rows 256] [--width 262144] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from onetrip.bench import harness
from onetrip.ops import norm

KB, MB = 1 << 10, 1 << 20
EXTRAS = [0, 16 * KB, 32 * KB, 64 * KB, 128 * KB, 256 * KB, 512 * KB, 1 * MB, 2 * MB, 4 * MB, 8 * MB, 16 * MB]
BASES = [0, 64 * KB, 512 * KB, 1 * MB, 2 * MB, 6 * MB, 24 * MB]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--width", type=int, default=262144)
    ap.add_argument("--out", default=".", help="folder for the JSON")
    args = ap.parse_args()
    dev = torch.device("cuda")
    copy = harness.copy_bandwidth_gbs(dev)
    flush = harness.new_flush_buffer(dev)
    m, n = args.rows, args.width
    size = m * n * 2  # bytes of one bf16 tensor
    pool = torch.empty(4 * (1 << 30) // 2, device=dev, dtype=torch.bfloat16)  # 4 GiB
    pool.normal_()
    w = torch.randn(n, device=dev).to(torch.bfloat16)
    b = torch.randn(n, device=dev).to(torch.bfloat16)
    nbytes = 2 * size + 4 * n
    cfg = norm.norm_config(m, n, dev, is_rms=False, has_residual=False)

    def view(offset: int) -> torch.Tensor:
        return pool[offset // 2: offset // 2 + m * n].view(m, n)

    def timed(base: int, d: int) -> float:
        sets = [(view(base + k * (1 << 30)), view(base + k * (1 << 30) + d)) for k in range(2)]

        def replay():
            for i in range(4):
                x, y = sets[i % 2]
                norm._launch(x, None, w, b, y, None, 1e-5, False, False, cfg)
        t = harness.per_call(harness.time_ms(replay, flush=flush), 4)
        return round(100 * harness.gbs(nbytes, t.median_ms) / copy, 1)

    log = {"device": harness.device_info(dev), "copy_gbs": copy, "config": repr(cfg), "rows": m, "width": n,
           "y_after_x": [], "base": []}
    print(f"{log['device']['gpu']} copy {copy:.0f} GB/s; layer_norm {m} x {n}", flush=True)
    for extra in EXTRAS:
        pct = timed(0, size + extra)
        log["y_after_x"].append({"d_minus_size": extra, "pct": pct})
        print(f"y at x + size + {extra // KB:6d} KB: {pct:.1f}%", flush=True)
    for base in BASES:
        pct = timed(base, size)
        log["base"].append({"base": base, "pct": pct})
        print(f"base {base // KB:6d} KB (y right after x): {pct:.1f}%", flush=True)
    again = timed(0, size)
    log["again"] = again
    print(f"first layout again: {again:.1f}%")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"diag-offsets-{m}x{n}.json").write_text(json.dumps(log, indent=1))


if __name__ == "__main__":
    main()
