"""Where the fused backend's prefill time goes (batch 1): wall time per prompt length, the
GPU's busy time in the same call, and the host's hottest Python functions.

    python benchmarks/diag_prefill.py [--preset llama-3.2-1b] [--prompts 512 2048] [--out DIR]

The decode bench's time to first token (``onetrip bench decode``) had the fused prefill at
twice eager's at 512 tokens (1B: 33.5 vs 17.0 ms, H200) for ~8x fewer kernels, so the
host, not the GPU, sets it: this prints how much of the wall time the GPU is busy
(torch.profiler's kernel time, summed) and cProfile's top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from onetrip.bench.decode import _prompts, build  # noqa: E402
from onetrip.engine.generate import Engine  # noqa: E402


def prefill_once(model, prompts, n: int) -> float:
    eng = Engine(model, max_seq=n + 8, graphs=False)
    torch.cuda.synchronize()
    t = time.perf_counter()
    eng.generate(prompts.tolist(), 1)
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-3.2-1b")
    ap.add_argument("--prompts", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--out", type=Path, default=Path("gpu-out"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model, _ = build(args.preset, torch.bfloat16, "cuda", False)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "preset": args.preset, "rows": []}
    for n in args.prompts:
        prompts = _prompts(1, n, model.config.vocab_size, seed=1)
        row = {"prompt": n}
        for backend in ("eager", "fused"):
            model.backend = backend
            walls = [prefill_once(model, prompts, n) for _ in range(4)]
            row[backend] = {"wall_ms": sorted(walls[1:])[1] * 1e3}
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                prefill_once(model, prompts, n)
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            row[backend]["gpu_busy_ms"] = sum(e.device_time for e in kernels) / 1e3
            row[backend]["kernels"] = len(kernels)
            prof_c = cProfile.Profile()
            prof_c.enable()
            prefill_once(model, prompts, n)
            prof_c.disable()
            buf = io.StringIO()
            pstats.Stats(prof_c, stream=buf).sort_stats("tottime").print_stats(18)
            row[backend]["cprofile_top"] = buf.getvalue()
            print(f"prompt {n} {backend}: wall {row[backend]['wall_ms']:.1f} ms, GPU busy "
                  f"{row[backend]['gpu_busy_ms']:.1f} ms over {len(kernels)} kernels", flush=True)
            if backend == "fused":
                print(buf.getvalue()[-4000:], flush=True)
        result["rows"].append(row)
    (args.out / "diag-prefill.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
