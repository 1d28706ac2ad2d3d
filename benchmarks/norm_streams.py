"""Experiment: the SMs that a grid of 16-CTA clusters leaves idle, given rows of their own
on a second stream (issue 2's 256K rows; NOTES.md, twenty-second session).

Why: a cluster's CTAs must sit in one GPC. This H100's GPCs have 16-18 SMs but one has
8-10, so the library's 16-rank picks (rms_norm and layer_norm 256K) run on at most 112-116
of the 132 SMs (``cluster_room.placement``: 256 clusters of 16 ran on 116); whatever the
per-SM rate, 12-15% of the chip waits. Here the rows are cut in two: the first ``k`` rows
run the library's pick on the caller's stream, the other ``M - k`` a config whose CTAs fit
where clusters of 16 do not (clusters of 8, or a split row without clusters) on a side
stream, both captured in the same CUDA graph as parallel branches (fork and join by
``wait_stream``), so the two grids share the GPU.

    python benchmarks/norm_streams.py --out DIR      # on an H100

Outcome on an H100 (NOTES.md, twenty-second session): slower at every cut (rms_norm 256K
88.2-88.5% -> 85.1-86.8, layer_norm 83.9 -> 78.7-82.1, 64 rows 5-14 points lower), the fork
itself free (the pick alone on the side stream: level): the 16-rank picks are not short of
SMs, and a second grid only competes for the memory system.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from onetrip.ops import norm  # noqa: E402
from onetrip.ops._norm_picks import NormConfig  # noqa: E402

_SIDE: dict = {}


def two_streams(x, w, b, y, eps, k: int, cfg_side: NormConfig | None, side_first: bool = True):
    """y = norm(x): rows [0, k) by the library's pick for x's whole shape on the current
    stream, rows [k, M) by ``cfg_side`` (None: that pick too) on a side stream (one per
    device), joined before returning. RMSNorm without a bias ``b``, LayerNorm with one."""
    is_rms = b is None
    pick = norm.norm_config(x.shape[0], x.shape[1], x.device, is_rms=is_rms, has_residual=False)
    main = torch.cuda.current_stream()
    side = _SIDE.setdefault(x.device, torch.cuda.Stream(x.device))
    side.wait_stream(main)

    def rest():
        with torch.cuda.stream(side):
            norm._launch(x[k:], None, w, b, y[k:], None, eps, is_rms, False, cfg_side or pick)

    if side_first:
        rest()
    norm._launch(x[:k], None, w, b, y[:k], None, eps, is_rms, False, pick)
    if not side_first:
        rest()
    main.wait_stream(side)
    return y


_C8 = dict(hints=True, vec=True, const_n=True, drop_y=True, cluster=True)
SIDE = {True: {"c8": NormConfig("loop", 1, 4096, 16, split=8, hold=1, **_C8),
               "split16": NormConfig("loop", 1, 4096, 16, hints=True, vec=True, const_n=True, split=16, hold=1,
                                     drop_y=True)},
        False: {"c8": NormConfig("loop", 1, 4096, 8, split=8, shelf=True, fold=True, **_C8),
                "split16": NormConfig("loop", 1, 4096, 8, hints=True, vec=True, const_n=True, split=16,
                                      drop_y=True, fold=True)}}
CUTS = {(256, 262144): [240, 232, 224, 216], (64, 262144): [60, 56, 52]}


def _variants(rows, width, is_rms, w, b, eps):
    out = []
    for k in CUTS[(rows, width)]:
        for name, cfg in SIDE[is_rms].items():
            out.append((f"pick {k} + {name} {rows - k}",
                        lambda x, y, k=k, cfg=cfg: two_streams(x, w, b, y, eps, k, cfg)))
    k = CUTS[(rows, width)][1]
    out.append((f"pick {k} + c8 {rows - k} (side second)",
                lambda x, y, k=k: two_streams(x, w, b, y, eps, k, SIDE[is_rms]["c8"], side_first=False)))
    out.append((f"pick {rows} on the side stream alone",
                lambda x, y: two_streams(x, w, b, y, eps, 0, None)))
    return out


def main() -> int:
    from norm_variants import rows_main  # noqa: PLC0415
    return rows_main(list(CUTS), _variants, "norm-streams.json")


if __name__ == "__main__":
    raise SystemExit(main())
