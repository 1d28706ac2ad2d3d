"""What a batch-1 x 4K decode-attention call waits on: run it (contiguous bf16 cache, 32 query
/ 8 kv heads, head dim 128) at a few split counts, three calls each, for Nsight Compute:

    ncu --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \\
        --section MemoryWorkloadAnalysis python benchmarks/diag_decode_ncu.py 0 16 32

Each argument is a ``num_splits`` (0: the default pick); every call launches the attention
kernel and the split merge. The third call of each is the one to read (warm caches aside:
the cache is 16.8 MB, so it sits in the 60 MB L2 here, unlike the bench's 16 copies).
"""

from __future__ import annotations

import sys

import torch

import onetrip


def main(argv: list[str]) -> int:
    dev = torch.device("cuda")
    B, ctx, H, KVH, D = 1, 4096, 32, 8, 128
    k = torch.randn(B, ctx, KVH, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(B, 1, H, D, device=dev, dtype=torch.bfloat16)
    lens = torch.full((B,), ctx, device=dev, dtype=torch.int32)
    for arg in argv or ["0"]:
        splits = int(arg)
        for _ in range(3):
            onetrip.decode_attention(q, k, v, lens, num_splits=splits or None)
        torch.cuda.synchronize()
        print(f"num_splits={splits or 'default'} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
