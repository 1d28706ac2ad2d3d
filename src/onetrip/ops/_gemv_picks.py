"""Measured launches of the batch-1 GEMVs (``skinny_matmul.py``), kept apart from the
kernel so that each table can carry the sweeps behind it, as ``_norm_picks`` does for the
norms. ``skinny_matmul`` imports these names and reads them from its own namespace, so a
test or an A/B run patches them there (``skinny_matmul._TUNED_GEMV`` and so on)."""

# Batch-1 shapes where an H200 sweep's best launch beat the rule (skinny_matmul._gemv_config) by >3%
# (benchmarks/ab_next.py, 2026-11-21, benchmarks/results/ab-round{2,3}-h200-20261121.json):
# (N, K, fusion) -> (block_n, block_k, num_warps), time in us (the rule's).
_TUNED_GEMV = {
    (16384, 2048, "plain"): (32, 256, 4),           # Llama-3.2-1B gate_up            18.4 (20.9)
    (16384, 2048, "norm"): (16, 256, 8),            # 1B gate_up + RMSNorm            19.9 (22.0)
    (6144, 4096, "plain"): (8, 512, 4),             # Llama-3.1-8B qkv                14.7 (16.2)
    (6144, 4096, "norm"): (8, 512, 4),              # 8B qkv + RMSNorm                15.2 (18.6)
    (4096, 4096, "residual"): (16, 1024, 8),        # 8B o + residual                 11.4 (12.4)
    (4096, 14336, "silu_residual"): (8, 1024, 4),   # 8B down + SwiGLU + residual     30.3 (38.3)
}
# Launches measured on one GPU model, in the engine's decode step (benchmarks/ab_next.py,
# NOTES.md round 21), keyed by a part of the device's name; there they take precedence
# over _TUNED_GEMV (whose entries come from H200 sweeps). A fourth value: early chunks.
_TUNED_GEMV_GPU = {
    "H100": {
        # 1B o + residual: 512 programs of 4 rows at 4 warps (64 registers as launched), all
        # in one wave beside the attention grid, each loading its whole 16 KB of W_o (2 chunks)
        # before its PDL wait, i.e. during the attention kernel (models.fused.TRIGGER_O):
        # o 5.2 -> 2.0 us a layer, the attention before it 5.0 -> 6.8; step 1.042 -> 1.031 ms.
        (2048, 2048, "residual"): (4, 1024, 4, 2),
        # gate_up + RMSNorm, 512-wide chunks at 4 warps: 1B step 1.031 -> 1.020-1.025 ms,
        # 8B 5.413 -> 5.350 ms (against (16, 256, 8) and the rule's (16, 256, 4)).
        (16384, 2048, "norm"): (16, 512, 4),
        (28672, 4096, "norm"): (16, 512, 4),
    },
}

# Weight chunks a batch-1 GEMV puts in flight before its PDL wait, by its place in a layer.
# The chunk loads overlap the previous kernel's last wave. Measured over the whole step
# (benchmarks/NOTES.md, round 13): one chunk everywhere, 1B 0.817 -> 0.804 ms and 8B
# 3.878 -> 3.837 ms; two everywhere lost (+3%, +5%: gate_up's extra registers cost it an
# SM slot, and the prefetch took bandwidth from the kernel draining beside it).
EARLY_CHUNKS = {"qkv": 1, "o": 1, "gate_up": 1, "down": 1, "plain": 1}
