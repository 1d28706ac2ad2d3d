"""Experiment: what the weight and bias cost the wide norms (issue 2; NOTES.md, nineteenth
session). The loop re-reads a row's weight (and bias) from L2 in pass 2, for every row, as
it re-reads the row itself: at 128K-256K, with a quarter of the row held, L2 serves ~2.5
(RMSNorm) to ~4.5 (LayerNorm) bytes an element besides the HBM traffic's 4. If L2's
bandwidth is what holds LayerNorm 5-7 points under RMSNorm there, dropping the bias (and
then the weight) frees it and the time falls; if not, the time stays.

The library's own kernels and picks, timed as ``onetrip bench ops`` times them (a replay of
back-to-back calls over input sets that pass 256 MiB), with the weight and bias present or
None, and (LayerNorm) with the bias at the weight's address: the same kernel, whose L2 then
serves half the weight-and-bias bytes (the L1 merges the second load of a line; thirty-fifth
session: as few L2 sectors as no bias, and the time of its own bias). Bytes counted as if
present (so the % compares time alone).

    python benchmarks/norm_wb.py --out DIR      # on an H100/H200
    python benchmarks/norm_wb.py --out DIR --residual --shapes 256x262144 64x262144
                                                # add_rms_norm, add_layer_norm (thirty-first session)
    python benchmarks/norm_wb.py --out DIR --kinds layer --shapes 64x262144 \
        --config 'NormConfig("loop", 1, 2048, 8, ..., bshelf=True)'
                                                # each variant under these configs too, beside the
                                                # library's pick (thirty-sixth session)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = [(4096, 4096), (1024, 65536), (512, 131072), (256, 262144), (64, 262144)]
VARIANTS = {"rms": [("weight", True, False), ("none", False, False)],
            "layer": [("weight + bias", True, True), ("weight + bias at the weight's address", True, "same"),
                      ("weight", True, False), ("none", False, False)]}


def _args(ap) -> None:
    ap.add_argument("--residual", action="store_true", help="add_rms_norm and add_layer_norm (x + r normed, "
                    "h = x + r written too) instead of rms_norm and layer_norm")
    ap.add_argument("--shapes", nargs="+", default=[f"{m}x{n}" for m, n in SHAPES], help="ROWSxWIDTH ...")
    ap.add_argument("--kinds", nargs="+", choices=sorted(VARIANTS), default=sorted(VARIANTS))
    ap.add_argument("--config", action="append", default=[],
                    help="a NormConfig repr: each variant also launched with it (norm._launch), without a residual")


def main() -> int:
    from gemv_chain import chain_setup
    from norm_variants import bench_ms, run_variant

    from onetrip.bench.ops import timing_plan
    from onetrip.ops import norm

    args, copy, flush, res = chain_setup(extra=_args)
    if args.config and args.residual:
        raise SystemExit("--config runs rms_norm and layer_norm (no --residual)")
    configs = [(None, "pick")] + [(eval(c, {"NormConfig": norm.NormConfig}), c) for c in args.config]
    dev, dt = torch.device("cuda"), torch.bfloat16
    print(f"copy {copy:.0f} GB/s", flush=True)
    tensors = 4 if args.residual else 2  # x, (r,) y, (h): each read or written once
    for rows, width in (tuple(int(v) for v in s.split("x")) for s in args.shapes):
        for kind, variants in ((k, VARIANTS[k]) for k in args.kinds):
            nbytes = tensors * rows * width * 2 + (1 if kind == "rms" else 2) * width * 2
            n_sets, n_calls = timing_plan(nbytes)
            sets = [tuple(torch.randn(rows, width, device=dev).to(dt) for _ in range(tensors))
                    for _ in range(n_sets)]  # (x, y) or (x, r, y, h)
            w = torch.randn(width, device=dev).to(dt)
            b = torch.randn(width, device=dev).to(dt)
            for (label, has_w, has_b), (cfg, cfg_name) in ((v, c) for c in configs for v in variants):
                # "same": the bias is the weight tensor, so the same kernel asks the L2 for half the
                # bytes (its second load of a line finds it in L1): what the L2's traffic costs
                wv, bv = (w if has_w else None), (w if has_b == "same" else b if has_b else None)
                if args.residual and kind == "rms":
                    fn = lambda x, r, y, h: norm.add_rms_norm(x, r, wv, 1e-6, out=y, residual_out=h)  # noqa: E731
                elif args.residual:
                    fn = lambda x, r, y, h: norm.add_layer_norm(x, r, wv, bv, 1e-5, out=y,  # noqa: E731
                                                                residual_out=h)
                elif kind == "rms":
                    fn = lambda x, y: norm.rms_norm(x, wv, 1e-6, out=y)  # noqa: E731
                else:
                    fn = lambda x, y: norm.layer_norm(x, wv, bv, 1e-5, out=y)  # noqa: E731
                if cfg is not None:  # the same op, launched with cfg
                    fn = lambda x, y, _c=cfg, _w=wv, _b=bv, _r=kind == "rms": norm._launch(  # noqa: E731
                        x, None, _w, _b, y, None, 1e-6 if _r else 1e-5, _r, False, _c)
                op = f"{'add_' if args.residual else ''}{kind}_norm"
                fields = {"op": op, "rows": rows, "width": width, "variant": label}
                if len(configs) > 1:
                    fields["config"] = cfg_name
                    print(f"  config {cfg_name}", flush=True)
                run_variant(res, fields, fn, sets,
                            sets[0][-2], None, nbytes, copy, lambda calls: bench_ms(calls, flush, n_calls))
            del sets
            torch.cuda.empty_cache()
    (args.out / "norm-wb.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
