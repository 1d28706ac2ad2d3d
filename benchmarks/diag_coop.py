"""Diagnose the split-row ("coop") norm kernel on a GPU: timings per config, graph or not,
two-pass for comparison, the sync counters after a launch, and registers/spills."""
import time
import torch
from onetrip.bench.harness import time_ms, copy_bandwidth_gbs
from onetrip.ops import norm

dev = torch.device("cuda")
copy = copy_bandwidth_gbs(dev)
print(f"copy {copy:.0f} GB/s", flush=True)
g = torch.Generator(device=dev).manual_seed(0)
for rows, width in [(64, 262144), (512, 32768), (256, 262144)]:
    x = torch.randn(rows, width, device=dev, generator=g).bfloat16()
    r = torch.randn_like(x); w = torch.randn(width, device=dev).bfloat16(); b = torch.randn_like(w)
    y = torch.empty_like(x); h = torch.empty_like(x)
    E = x.numel() * 2
    for kind in ["rms", "ln"]:
        is_rms = kind == "rms"
        for res in [True, False]:
            nbytes = (4 if res else 2) * E
            for mode, chunk, warps in [("coop", 8192, 16), ("coop", 4096, 8), ("coop", 2048, 4), ("two_pass", 8192, 16)]:
                cfg = norm.NormConfig(mode, 1, chunk, warps)
                f = lambda: norm._launch(x, r if res else None, w, None if is_rms else b, y, h if res else None, 1e-6, is_rms, False, cfg)
                t0 = time.time()
                k = f(); torch.cuda.synchronize()
                dt = time.time() - t0
                tg = time_ms(f, reps=30)
                tn = time_ms(f, reps=30, use_graph=False)
                print(f"{kind:3s} res={int(res)} {rows}x{width} {mode:8s} chunk={chunk:5d} w={warps:2d}: graph {tg.median_ms*1e3:8.1f} us "
                      f"({nbytes/tg.median_ms/1e6:6.0f} GB/s)  direct {tn.median_ms*1e3:8.1f} us  first call {dt*1e3:7.1f} ms "
                      f"regs={getattr(k,'n_regs',None)} spills={getattr(k,'n_spills',None)}", flush=True)
    del x, r, y, h
# counters after one coop launch
x = torch.randn(8, 70001, device=dev).bfloat16(); w = torch.randn(70001, device=dev).bfloat16(); y = torch.empty_like(x)
import unittest.mock as um
captured = {}
real_zeros = torch.zeros
def spy(*a, **kw):
    t = real_zeros(*a, **kw); captured["sync"] = t; return t
with um.patch.object(norm.torch, "zeros", spy):
    norm._launch(x, None, w, None, y, None, 1e-6, True, False, norm.NormConfig("coop", 1, 8192, 16))
torch.cuda.synchronize()
print("sync counters after coop launch (ticket, then per row; expect grid=8*9=72, then 9s):", captured["sync"].tolist())
ref = norm.rms_norm_ref(x.double(), w.double(), 1e-6)
print("max err", (y.double() - ref).abs().max().item())
