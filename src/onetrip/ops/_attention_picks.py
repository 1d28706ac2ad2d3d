"""flash_attention's forward picks: the launch config (``AttentionConfig``), the heuristic
(``attention_config``), the candidates first-use tuning times (``attention_candidates``) and
the shape buckets that share a tuned pick (``attention_bucket``)."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Optional

import torch
import triton

from ._attention_tma import TMA_DTYPES, TMA_MIN_SEQ, TMA_TILES
from ._common import next_pow2


@dataclass(frozen=True)
class AttentionConfig:
    """Launch shape: ``block_m`` query rows per program, K/V tiles of ``block_n`` keys.

    ``use_tma``: Q, K, V and O move through Hopper tensor descriptors where the call
    allows it (``_attention_tma.tma_supported``), else the same tile takes the pointer
    path. Defaults to False, so tuning-cache entries written before it existed still load.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    use_tma: bool = False


@functools.lru_cache(maxsize=4096)  # a launch asks at every call
def attention_config(head_dim: int, max_seqlen_q: Optional[int] = None, tma: bool = False) -> AttentionConfig:
    """The heuristic by head dim: the launch config wherever autotuning does not run
    (ONETRIP_AUTOTUNE=0, the interpreter, capture of an untuned bucket; see _tuned_config).

    ``tma`` (the launch can use tensor descriptors: a Hopper GPU, ``tma_supported``): head
    dims up to 128 with 1024 queries or more take 64 x 64 tiles at 4 warps through TMA, the
    best config or within 11% of it at all 20 shapes of the H200 tuning sweep (head dim 64
    and 128, seq 1K-16K, causal and not; ``tools/tune_attention.py``)
    and 14-50% above the pointer heuristic below (e.g. head dim 128, seq 2048, causal: 294
    -> 437 TFLOP/s). Shorter queries keep the pointer heuristic (not swept).

    Registers bound the tile: the float32 accumulator is block_m x head_dim and the score
    tile block_m x block_n per program, so wide heads take fewer rows. Compiled for sm_90
    on a CPU (Triton 3.9, ``ptxas -v``, bf16, causal): 128 x 64 used 255 registers at head
    dim 64 (4 warps) and 254 at 128 (8 warps), no spills; at 256, 64 x 64 with 8 warps
    spilled 28 bytes, 64 x 32 none (4 warps: 160 bytes). Shared memory then holds
    num_stages K and V tiles: 2 x 32 x 256 bf16 x 2 (64 KiB) + Q (32 KiB) at head dim 256.
    Short queries (decode, tests) shrink block_m to the next power of two >= max_seqlen_q
    (at least 16, tl.dot's minimum).
    """
    if tma and head_dim <= 128 and (max_seqlen_q is None or max_seqlen_q >= 1024):
        return AttentionConfig(64, 64, 4, 3, use_tma=True)
    if head_dim <= 64:
        cfg = AttentionConfig(128, 64, 4, 3)
    elif head_dim <= 128:
        cfg = AttentionConfig(128, 64, 8, 3)
    else:
        cfg = AttentionConfig(64, 32, 8, 2)
    if max_seqlen_q is not None:
        cfg = AttentionConfig(min(cfg.block_m, max(16, next_pow2(max(max_seqlen_q, 1)))),
                              cfg.block_n, cfg.num_warps, cfg.num_stages)
    return cfg


# -- autotuning: a pruned candidate list per head dim, one pick per shape bucket -------------

# The space: 2 x 3 x 2 x 3 = 36 configs before pruning.
_BLOCK_M, _BLOCK_N, _WARPS, _STAGES = (64, 128), (32, 64, 128), (4, 8), (2, 3, 4)
# float32 values per thread held by the accumulator plus the score tile. 128 leaves room
# for addresses, m, l and the loaded tiles under the 255-register cap: the heuristic
# tiles sit at or under it and compiled without spills (see attention_config), while
# 64 x 64 with 4 warps at head dim 256 (128 + 32) spilled 160 bytes.
_MAX_TILE_REGS = 128
# Below 48 (e.g. 64 x 32 with 8 warps at head dim 64: 16 + 8) each warp's MMA tiles are
# so thin that K and V are re-read for little work; such tiles only add compile time.
_MIN_TILE_REGS = 48
_MAX_SHARED = 227 * 1024  # opt-in shared memory per block on Hopper (sm_90)
MAX_TUNED_SEQ = 16384     # longer queries share the 16384 bucket


def _tile_fits(cfg: AttentionConfig, head_dim: int, elem: int) -> bool:
    """Register and shared-memory estimates of one config, before compiling it."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    threads = 32 * cfg.num_warps
    regs = (cfg.block_m * block_d + cfg.block_m * cfg.block_n) / threads  # acc + scores, fp32
    # num_stages buffers of a K and a V tile, plus the Q block that stays resident.
    smem = cfg.num_stages * (cfg.block_n * block_d * 2 * elem) + cfg.block_m * block_d * elem
    return _MIN_TILE_REGS <= regs <= _MAX_TILE_REGS and smem <= _MAX_SHARED


# (padded head dim, tile) that faults (illegal address) when causal on an H200 with Triton 3.6,
# at (1, 4096, 32/8 heads) and (4, 4096, 14/2); the same tile at 3 stages or 8 warps runs.
_FAULTING = frozenset({(64, (128, 32, 4, 2))})


def attention_candidates(head_dim: int, dtype: torch.dtype = torch.bfloat16,
                         max_seqlen_q: Optional[int] = None) -> list[AttentionConfig]:
    """The configs worth timing at ``head_dim`` and ``dtype``: the space above, pruned by
    ``_tile_fits``, block_m shrunk for short queries as in ``attention_config``, and the
    heuristic default always included (so a tuned pick is never a config the heuristic
    would beat by more than timing noise). Deterministic, in a fixed order.

    E.g. bfloat16 keeps 26 of the 36 at head dim 64, 21 at 128 and 5 at 256 (float32: 23, 12,
    1); ``_FAULTING`` leaves one out at head dim 64.
    Then, for float16 / bfloat16 at head dims padded to 64 or 128 and buckets of seq_q >=
    TMA_MIN_SEQ (or unknown), the TMA twins of three of those tiles (``TMA_TILES``), which
    the launcher turns back into pointer tiles where TMA is not allowed.
    """
    elem = torch.empty((), dtype=dtype).element_size()
    cap = None if max_seqlen_q is None else max(16, triton.next_power_of_2(max(max_seqlen_q, 1)))
    out = [attention_config(head_dim, max_seqlen_q)]
    block_d = max(16, triton.next_power_of_2(head_dim))
    for bm, bn, w, st in itertools.product(_BLOCK_M, _BLOCK_N, _WARPS, _STAGES):
        cfg = AttentionConfig(bm, bn, w, st)
        if not _tile_fits(cfg, head_dim, elem) or (block_d, (bm, bn, w, st)) in _FAULTING:
            continue
        if cap is not None and bm > cap:
            cfg = AttentionConfig(cap, bn, w, st)
        if cfg not in out:
            out.append(cfg)
    if dtype in TMA_DTYPES and (cap is None or cap >= TMA_MIN_SEQ):  # per bucket (seq_q rounded up)
        for bm, bn, w, st in TMA_TILES.get(block_d, ()):
            cfg = AttentionConfig(bm, bn, w, st, use_tma=True)
            if _tile_fits(cfg, head_dim, elem):
                out.append(cfg)
    return out


def attention_bucket(head_dim: int, causal: bool, max_seqlen_q: int, group: int, dtype: torch.dtype) -> tuple:
    """Shapes that share one tuned config: (head_dim, causal, seq_q rounded up to a power
    of two and capped at MAX_TUNED_SEQ, GQA group size, dtype name). The key length is
    left out: the best tile depends on how many query blocks fill the GPU (seq_q) far
    more than on how long each block's key loop runs."""
    seq = min(next_pow2(max(int(max_seqlen_q), 1)), MAX_TUNED_SEQ)
    return (int(head_dim), bool(causal), seq, int(group), str(dtype).removeprefix("torch."))
