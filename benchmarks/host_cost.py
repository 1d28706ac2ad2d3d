"""Host time of an op call, and what it costs the engine without CUDA graphs: the custom
op's dispatch (``ONETRIP_DISPATCH=op``) against ``call_op``'s direct call (the default).

    PYTHONPATH=src python benchmarks/host_cost.py [--preset llama-3.2-1b] [--out DIR]

Part 1, per op (tiny shapes, so the host sets the pace): microseconds of host time per
call over 400 calls, each way, beside a plain ``torch.add`` and each op's bare launcher.
Part 2, the engine at batch 1 with ``graphs=False`` (fused backend): decode ms per step
and the time to first token at 512 / 2048 prompt tokens, each way, beside the eager
backend. Results in DIR/host-cost.json.
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

import onetrip  # noqa: E402
from onetrip.bench.decode import _prompts, build  # noqa: E402
from onetrip.engine.generate import Engine  # noqa: E402
from onetrip.ops import _common  # noqa: E402
from onetrip.ops import norm as norm_mod  # noqa: E402
from onetrip.ops.argmax import argmax  # noqa: E402
from onetrip.ops.skinny_matmul import skinny_matmul  # noqa: E402


def per_call_us(fn, n: int = 400) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = time.perf_counter() - t
    torch.cuda.synchronize()
    return host / n * 1e6


def op_cases(dev):
    g = torch.Generator(device=dev).manual_seed(0)

    def rn(*s):
        return torch.randn(*s, generator=g, device=dev).to(torch.bfloat16)

    x, r, w = rn(1, 2048), rn(1, 2048), rn(2048)
    y, h = torch.empty_like(x), torch.empty_like(x)
    gu = rn(1, 16384)
    wq = rn(3072, 2048)
    q, kc, vc = rn(1, 1, 32, 64), rn(1, 512, 8, 64), rn(1, 512, 8, 64)
    lens = torch.tensor([300], dtype=torch.int32, device=dev)
    qp, kp, vp = rn(1, 64, 32, 64), rn(1, 64, 8, 64), rn(1, 64, 8, 64)
    logits = rn(1, 128256)
    return {
        "torch.add": lambda: torch.add(x, r, out=y),
        "add_rms_norm": lambda: onetrip.add_rms_norm(x, r, w, 1e-6, out=y, residual_out=h),
        "add_rms_norm launcher": lambda: norm_mod._launch(x, r, w, None, y, h, 1e-6, True, False),
        "silu_mul": lambda: onetrip.silu_mul(gu),
        "skinny_matmul 1x2048 @ 3072x2048": lambda: skinny_matmul(x, wq),
        "decode_attention b1 300 tokens": lambda: onetrip.decode_attention(q, kc, vc, lens),
        "flash_attention 64 tokens": lambda: onetrip.flash_attention(qp, kp, vp, causal=True),
        "argmax 128256": lambda: argmax(logits),
    }


def engine_rows(preset: str) -> list[dict]:
    model, _ = build(preset, torch.bfloat16, "cuda", False)
    rows = []
    for n in (512, 2048):
        prompts = _prompts(1, n, model.config.vocab_size, seed=1).tolist()
        for backend, mode in (("eager", "op"), ("fused", "op"), ("fused", "direct")):
            _common._DIRECT = mode == "direct"
            model.backend = backend
            eng = Engine(model, max_seq=n + 80, graphs=False)
            eng.generate(prompts, 4)  # warm-up
            res = [eng.generate(prompts, 65) for _ in range(3)]
            prefill = sorted(r.prefill_ms for r in res)[1]
            step = sorted(r.decode_ms / 64 for r in res)[1]
            rows.append({"prompt": n, "backend": backend, "dispatch": mode, "ttft_ms": prefill,
                         "decode_ms_per_step": step})
            print(f"prompt {n:5d} {backend:5s} {mode:6s}: prefill {prefill:7.2f} ms, decode {step:6.2f} ms/step",
                  flush=True)
    _common._DIRECT = True
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-3.2-1b")
    ap.add_argument("--out", type=Path, default=Path("gpu-out"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "ops": []}
    result["triton"] = __import__("triton").__version__
    for name, fn in op_cases(dev).items():
        row = {"op": name}
        for mode in ("op", "direct"):
            _common._DIRECT = mode == "direct"
            row[mode + "_us"] = per_call_us(fn)
        _common._DIRECT = True
        result["ops"].append(row)
        print(f"{name:36s} through the op {row['op_us']:7.1f} us   direct {row['direct_us']:7.1f} us", flush=True)
    cases = op_cases(dev)
    for name in ("add_rms_norm", "flash_attention 64 tokens", "decode_attention b1 300 tokens"):  # where a direct call's time goes
        prof = cProfile.Profile()
        prof.enable()
        per_call_us(cases[name], 300)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(22)
        result.setdefault("cprofile", {})[name] = buf.getvalue()
        print(f"-- {name}, 320 direct calls under cProfile (own time)\n" + buf.getvalue()[-4500:], flush=True)
    result["engine"] = engine_rows(args.preset)
    (args.out / "host-cost.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
