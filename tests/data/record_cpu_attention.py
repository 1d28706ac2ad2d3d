"""Records tests/data/cpu_attention.json.gz: PyTorch's own profiler (CPU only, shapes
recorded) around an unfused attention, two ProfilerSteps, so that the reader is checked on
the exact format PyTorch writes (recorded with torch 2.13):

    python tests/data/record_cpu_attention.py tests/data/cpu_attention.json.gz
"""

import gzip
import os
import shutil
import sys

import torch
from torch.profiler import ProfilerActivity, profile, schedule


def attention(q, k, v):
    scores = q @ k.transpose(-1, -2)  # (2, 4, 128, 128): the N x N intermediate
    p = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return p @ v


def main(out: str) -> None:
    q = torch.randn(2, 4, 128, 32, dtype=torch.bfloat16)  # (batch, heads, seq, head_dim)
    k, v = torch.randn_like(q), torch.randn_like(q)
    tmp = out + ".tmp"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(tmp)) as prof:
        for _ in range(4):
            attention(q, k, v)
            prof.step()
    with open(tmp, "rb") as f, gzip.GzipFile(out, "wb", mtime=0) as g:
        shutil.copyfileobj(f, g)
    os.remove(tmp)


if __name__ == "__main__":
    main(sys.argv[1])
