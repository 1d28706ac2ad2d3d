"""cross_entropy's launch picks (``CrossEntropyConfig``): whole rows in registers up to
ROWS_LIMIT logits, else a loop over the row, split over a thread-block cluster where the
vocabulary is wide (``cross_entropy_config``, ``split_for``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from ._common import next_pow2

MODES = ("rows", "loop")
SPLITS = (1, 2, 4, 8, 16)  # cluster sizes: 2-8 portable, 16 on Hopper (_cluster.cluster_ok)


@dataclass(frozen=True)
class CrossEntropyConfig:
    """How the kernel covers a row (``_cross_entropy_jit``'s docstring has the two kernels).

    mode "rows": ``block_r`` whole rows a program, held in registers (one read of a row).
    mode "loop": a program walks its row, or its segment of a row split over ``split``
    programs (one Hopper thread-block cluster), in steps of ``unroll`` 16-byte vectors a
    thread (a step: unroll x num_warps x 512 bytes); pass 1 sums, pass 2 writes the
    gradient, re-reading the segment from L2.
    """

    mode: str
    num_warps: int
    block_r: int = 1  # "rows": rows a program
    unroll: int = 4  # "loop": 16-byte vectors a thread a step
    split: int = 1  # "loop": programs a row (a cluster); 1 where a cluster cannot be launched
    keep_row: bool = True  # "loop": pass 1 loads evict_last; pass 2 loads and gradient stores evict_first
    maxnreg: int = 0  # ptxas's register cap (0: none): 32 warps at 32 registers fit two programs an SM

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"CrossEntropyConfig.mode={self.mode!r} must be one of {MODES}")
        for name, hi in (("num_warps", 32), ("block_r", 64), ("unroll", 16)):
            if not (1 <= getattr(self, name) <= hi and getattr(self, name) & (getattr(self, name) - 1) == 0):
                raise ValueError(f"CrossEntropyConfig.{name}={getattr(self, name)!r} must be a power of two 1-{hi}")
        if self.split not in SPLITS:
            raise ValueError(f"CrossEntropyConfig.split={self.split!r} must be one of {SPLITS}")
        if self.mode == "rows" and self.split != 1:
            raise ValueError("CrossEntropyConfig.split applies to mode 'loop' only")
        if self.maxnreg and not 16 <= self.maxnreg <= 255:  # else ptxas fails deep inside Triton's compile
            raise ValueError(f"CrossEntropyConfig.maxnreg={self.maxnreg!r} must be 0 (no cap) or 16-255 registers")


ROWS_LIMIT = 8192  # the widest row of mode "rows": 16 logits a thread at 16 warps
ROWS_ELEMENTS = 8192  # logits a "rows" program holds: several rows where they are narrower
ROWS_MAX = 8  # rows a "rows" program: (8, 1024) at 16 warps takes 117 registers, no spill (ptxas 13, sm_90a)

# Mode "loop" by V rounded up to a power of two (wider rows take the widest), timed by
# tools/tune_cross_entropy.py (H200, bf16, fwd+bwd, % of copy): two 16-byte vectors a thread a
# step beat four at every vocabulary (32000: 69.9 against 63.7 at 8 warps; 50257: 55.2 against
# 37.9-40.6), and from 128K a row split over a cluster so that the segments between the two
# passes stay in L2; ``split_for`` sizes it.
LOOP_PICKS = {
    16384: CrossEntropyConfig("loop", 16, unroll=2),
    32768: CrossEntropyConfig("loop", 16, unroll=2),
    65536: CrossEntropyConfig("loop", 8, unroll=2),
    131072: CrossEntropyConfig("loop", 8, unroll=2, split=8),
    262144: CrossEntropyConfig("loop", 8, unroll=2, split=16),
}
SEGMENT_MAX = 20480  # logits a split segment: 128256/8 66.0%, 151936/8 66.0 (/16: 48.0), 262144/16 73.9%


def split_for(V: int, most: int) -> int:
    """The fewest programs (a power of two, at most ``most``) whose segments of a V-wide row
    hold at most SEGMENT_MAX logits."""
    split = 1
    while split < most and V > split * SEGMENT_MAX:
        split *= 2
    return split


def cross_entropy_config(rows: int, V: int, itemsize: int, device: torch.device) -> CrossEntropyConfig:
    """The launch for ``rows`` rows of ``V`` logits of ``itemsize`` bytes: up to ROWS_LIMIT
    logits, whole rows in registers, up to 8 rows a program filling 8192 logits (V = 1000:
    8 rows), 16 logits a thread; wider, the "loop" pick of V's power-of-two bucket. Memoized:
    a launch asks at every call."""
    return _cross_entropy_config(rows, V, itemsize)


@functools.lru_cache(maxsize=4096)
def _cross_entropy_config(rows: int, V: int, itemsize: int) -> CrossEntropyConfig:
    if V <= ROWS_LIMIT:
        block = next_pow2(V)
        block_r = max(1, min(next_pow2(max(rows, 1)), ROWS_MAX, ROWS_ELEMENTS // block))
        return CrossEntropyConfig("rows", max(1, min(16, block_r * block // (16 * 32))), block_r=block_r)
    pick = LOOP_PICKS.get(next_pow2(V), LOOP_PICKS[max(LOOP_PICKS)])
    return pick if pick.split == 1 else replace(pick, split=split_for(V, pick.split))
