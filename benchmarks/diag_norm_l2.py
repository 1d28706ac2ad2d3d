"""Where the wide-row norms' bytes come from: launch today's pick of each (family, width)
three times on 2**26 bf16 elements, for Nsight Compute to count DRAM bytes and L2 hits
of the third launch (mode "loop" re-reads each row in pass 2: from L2, or again from HBM?).

    ncu --kernel-name regex:_norm_kernel --launch-skip 2 --launch-count 1 \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \\
        python benchmarks/diag_norm_l2.py rms_norm:131072 layer_norm:65536

Each (family, width) is one process argument; ncu's report names them in launch order.
An argument ``family:width:rows`` sets the rows (default 2**26 // width); the family
``copy`` launches ``torch.neg`` on the same bytes (what a plain element-wise kernel does
with them: the profile to compare against); ``tiles`` / ``add_tiles`` run
``norm_tiles.tiles_norm`` (rms_norm / add_rms_norm in two launches, 4 x 8192 tiles in chunks
of 2048, 8 warps): profile both launches of the third call with ``--cache-control none``,
to see whether launch 2 finds launch 1's bytes in L2. ``ONETRIP_DIAG_CONFIG``: a
``NormConfig(...)`` repr launched in place of the picks. ``ONETRIP_DIAG_BIAS``: ``weight`` (the
bias is the weight tensor: does the L1 merge the second load of each line, or does the L2 see
both?) or ``none`` (no bias); otherwise a bias of its own.
"""

from __future__ import annotations

import importlib
import os
import sys

import torch

norm = importlib.import_module("onetrip.ops.norm")


def main(argv: list[str]) -> int:
    dev = torch.device("cuda")
    for arg in argv:
        fam, width, *rows = arg.split(":")
        width = int(width)
        rows = int(rows[0]) if rows else 2**26 // width
        res, is_rms = fam.startswith("add_"), "rms" in fam
        x = torch.randn(rows, width, device=dev, dtype=torch.bfloat16)
        r = torch.randn_like(x) if res else None
        w = torch.randn(width, device=dev, dtype=torch.bfloat16)
        bias = torch.randn(width, device=dev, dtype=torch.bfloat16)  # not w: that would halve their L2 traffic
        bias = {"weight": w, "none": None}.get(os.environ.get("ONETRIP_DIAG_BIAS", ""), bias)
        y, h = torch.empty_like(x), (torch.empty_like(x) if res else None)
        if fam == "copy":
            for _ in range(3):
                torch.neg(x, out=y)
            continue
        if fam.endswith("tiles"):
            from norm_tiles import tiles_norm  # noqa: PLC0415
            for _ in range(3):
                tiles_norm(x, r, w, None, 1e-6, y, h, 4, 8192, 2048, 8)
            torch.cuda.synchronize()
            continue
        cfg = norm.norm_config(rows, width, dev, is_rms=is_rms, has_residual=res)
        if os.environ.get("ONETRIP_DIAG_CONFIG"):  # a NormConfig(...) repr in place of the pick
            cfg = eval(os.environ["ONETRIP_DIAG_CONFIG"], {"NormConfig": norm.NormConfig})
        print(f"{fam} {rows}x{width}: {cfg}", flush=True)
        for _ in range(3):
            norm._launch(x, r, w, None if is_rms else bias, y, h, 1e-6, is_rms, False, cfg)
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
