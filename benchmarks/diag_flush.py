"""Does the L2 flush before each timed rep bias the measurement? Time a copy and an RMSNorm
after a flush that writes 256 MiB (dirty lines left in L2) and after one that reads it."""
import torch
from onetrip.ops import rms_norm

dev = "cuda"
buf = torch.ones(64 << 20, device=dev)  # 256 MiB
sink = torch.empty((), device=dev)
x = torch.randn(16384, 4096, device=dev).bfloat16(); w = torch.ones(4096, device=dev).bfloat16()
y = torch.empty_like(x)
src = torch.randn(64 << 20, device=dev); dst = torch.empty_like(src)  # 256 MiB copy
cases = {"copy 256MiB": (lambda: dst.copy_(src), 2 * src.nbytes),
         "rms_norm 16384x4096": (lambda: rms_norm(x, w, 1e-6, out=y), 2 * x.nbytes)}
for name, (fn, nbytes) in cases.items():
    for flush_name, flush in [("write", lambda: buf.zero_()), ("read", lambda: torch.amax(buf, 0, out=sink)), ("none", lambda: None)]:
        for _ in range(3):
            fn()
        ts = []
        for _ in range(50):
            flush()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record()
            ts.append((a, b))
        torch.cuda.synchronize()
        t = sorted(a.elapsed_time(b) for a, b in ts)[25]
        print(f"{name:22s} flush={flush_name:5s} {t*1e3:8.1f} us {nbytes/t/1e6:7.0f} GB/s", flush=True)
