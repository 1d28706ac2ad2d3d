"""The attention backward's tiles: what each gradient kernel runs with, per head dim, dtype
and mode, measured on an H200 (``tools/tune_attention_backward.py``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from ._common import next_pow2


@dataclass(frozen=True)
class BackwardTile:
    """A gradient kernel's tile, ``block_m`` query rows x ``block_n`` keys: dK/dV keeps the
    keys resident and streams query blocks, dQ keeps the rows and streams key tiles."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class AttentionBackwardConfig:
    """``dkdv``: the dK/dV kernel (in the atomic mode it adds dQ too); ``dq``: the deterministic
    mode's dQ kernel (None: atomic); ``dq_tma``: atomic dQ adds by TMA bulk reductions where
    ``dq_tma_allowed``, else by pointer atomics."""

    dkdv: BackwardTile
    dq: BackwardTile | None = None
    dq_tma: bool = False


# float16 / bfloat16 picks by (deterministic, head_dim padded to a power of two >= 64).
# K and V stay in shared memory as wgmma operands; the dK and dV accumulators hold 128
# registers a thread at 128 keys x 128 dims, 8 warps, so 64 query rows a step spill there.
BACKWARD_PICKS = {
    # tools/tune_attention_backward.py, H200 bf16 16K tokens: best geomean over S 2048/8192,
    # causal and not. Registers (Triton 3.6, none spilled): head dim 64 dK/dV 224-240, dQ
    # 123-128, atomic 247-255; 128: 214-227, 178-194, atomic 245-251; 256 (causal): 166, 124, 171
    (True, 64): AttentionBackwardConfig(BackwardTile(64, 64, 4, 2), BackwardTile(128, 64, 8, 3)),
    (True, 128): AttentionBackwardConfig(BackwardTile(32, 128, 8, 3), BackwardTile(128, 64, 8, 3)),
    (True, 256): AttentionBackwardConfig(BackwardTile(16, 32, 8, 2), BackwardTile(32, 32, 8, 2)),
    (False, 64): AttentionBackwardConfig(BackwardTile(64, 64, 4, 2), dq_tma=True),
    (False, 128): AttentionBackwardConfig(BackwardTile(32, 128, 8, 3), dq_tma=True),
    (False, 256): AttentionBackwardConfig(BackwardTile(16, 32, 8, 2), dq_tma=True),
}
# float32 by padded head_dim, both modes: its products run on FMA units with the operands in
# registers, so the 16-bit tiles spill (2.9 KB at 32 x 128, head dim 64). These do not:
# 124 / 108 registers (dK/dV / dQ), atomic 137 at head dim 64 (causal, as above).
FLOAT32_PICKS = {
    64: AttentionBackwardConfig(BackwardTile(16, 64, 8, 2), BackwardTile(64, 32, 8, 2)),
    128: AttentionBackwardConfig(BackwardTile(16, 32, 8, 2), BackwardTile(32, 32, 8, 2)),
    256: AttentionBackwardConfig(BackwardTile(16, 16, 8, 2), BackwardTile(16, 32, 8, 2)),
}


def backward_config(head_dim: int, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                    dtype: torch.dtype = torch.bfloat16, deterministic: bool = True) -> AttentionBackwardConfig:
    """The pick for ``head_dim`` (padded to a power of two >= 64) of ``dtype`` in that mode
    (``BACKWARD_PICKS``, ``FLOAT32_PICKS``), with query blocks shrunk to the next power of
    two >= ``max_seqlen_q`` and key blocks to that of ``max_seqlen_k`` (at least 16, tl.dot's
    minimum). Memoized on those buckets, as a launch asks at every call: after editing the
    tables at run time, ``_backward_config.cache_clear()``."""
    def bucket(seq):
        return None if seq is None else max(16, next_pow2(max(seq, 1)))

    return _backward_config(max(64, next_pow2(head_dim)), bucket(max_seqlen_q), bucket(max_seqlen_k), dtype,
                            bool(deterministic))


@functools.lru_cache(maxsize=4096)
def _backward_config(bucket: int, seq_q: int | None, seq_k: int | None, dtype: torch.dtype,
                     deterministic: bool) -> AttentionBackwardConfig:
    if dtype == torch.float32:
        cfg = FLOAT32_PICKS[bucket]
        cfg = cfg if deterministic else replace(cfg, dq=None)
    else:
        cfg = BACKWARD_PICKS[(deterministic, bucket)]

    def cap(block, seq):
        return block if seq is None else min(block, seq)

    def shrink(t):
        return t and replace(t, block_m=cap(t.block_m, seq_q), block_n=cap(t.block_n, seq_k))

    return replace(cfg, dkdv=shrink(cfg.dkdv), dq=shrink(cfg.dq))
