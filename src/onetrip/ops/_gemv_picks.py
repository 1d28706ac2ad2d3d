"""The batch-1 GEMVs' measured launches (``_gemv_launch.gemv_config`` reads them): the
shapes where a launch beat the rule, and the weight chunks each GEMV loads before its PDL
wait. ``GEMV_PICKS`` is the default every GEMV entry point takes; pass another
``GemvPicks`` to A/B a launch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

# (N, K, fusion) -> (block_n, block_k, num_warps). H200 sweep, bf16: us, the rule's in ().
TUNED_GEMV = MappingProxyType({
    (16384, 2048, "plain"): (32, 256, 4),          # Llama-3.2-1B gate_up               18.4 (20.9)
    (16384, 2048, "norm"): (16, 256, 8),           # 1B gate_up + RMSNorm               19.9 (22.0)
    (6144, 4096, "plain"): (8, 512, 4),            # Llama-3.1-8B qkv                   14.7 (16.2)
    (6144, 4096, "norm"): (8, 512, 4),             # 8B qkv + RMSNorm                   15.2 (18.6)
    (4096, 4096, "residual"): (16, 1024, 8),       # 8B o + residual                    11.4 (12.4)
    (4096, 14336, "silu_residual"): (8, 1024, 4),  # 8B down + SwiGLU + residual        30.3 (38.3)
})

# GPU model (a part of the device's name) -> entries that take precedence over TUNED_GEMV
# there; a fourth value sets the entry's early chunks. H100, the whole decode step in a graph.
TUNED_GEMV_GPU = MappingProxyType({
    "H100": MappingProxyType({
        (2048, 2048, "residual"): (4, 1024, 4, 2),  # 1B o + residual, W_o before the wait: step 1.042 -> 1.031 ms
        (16384, 2048, "norm"): (16, 512, 4),        # 1B gate_up + RMSNorm: step 1.031 -> 1.020-1.025 ms
        (28672, 4096, "norm"): (16, 512, 4),        # 8B gate_up + RMSNorm: step 5.413 -> 5.350 ms
    }),
})

# Weight chunks a batch-1 GEMV loads before its PDL wait, by its place in a layer
# (``_gemv_launch.gemv_role``). H200 step, one everywhere: 1B 0.817 -> 0.804 ms, 8B
# 3.878 -> 3.837 ms; two everywhere lose (+3%, +5%: gate_up's registers cost it an SM slot).
EARLY_CHUNKS = MappingProxyType({"qkv": 1, "o": 1, "gate_up": 1, "down": 1, "plain": 1})


@dataclass(frozen=True)
class GemvPicks:
    """What ``gemv_config`` reads besides the shape: ``tuned`` and, on a GPU model it names,
    ``tuned_gpu`` (launches that beat the rule), and ``early_chunks`` by role."""

    tuned: Mapping[tuple[int, int, str], tuple[int, ...]]
    tuned_gpu: Mapping[str, Mapping[tuple[int, int, str], tuple[int, ...]]]
    early_chunks: Mapping[str, int]

    def with_early(self, chunks: int) -> "GemvPicks":
        """These picks with ``chunks`` (0-2) early weight chunks for every role."""
        if chunks not in (0, 1, 2):
            raise ValueError(f"chunks must be 0, 1 or 2 (weight chunks before the PDL wait), got {chunks!r}")
        return dataclasses.replace(self, early_chunks=MappingProxyType(dict.fromkeys(self.early_chunks, chunks)))

    # Immutable (read-only mappings): hashed by content, so a config holding it is a key
    # (the engine's CUDA graphs are keyed by the model's options), and never deep-copied.
    def __hash__(self) -> int:
        return hash((tuple(self.tuned.items()), tuple((gpu, tuple(t.items())) for gpu, t in self.tuned_gpu.items()),
                     tuple(self.early_chunks.items())))

    def __deepcopy__(self, memo: dict) -> "GemvPicks":
        return self


GEMV_PICKS = GemvPicks(TUNED_GEMV, TUNED_GEMV_GPU, EARLY_CHUNKS)
