"""``onetrip bench host``: what an eager call of each op costs the host, beside torch's own ops.

A call's host cost is the CPU time from the call to its return, with the GPU never the
limit: tiny tensors (a few KB), ``calls`` calls back to back, one synchronisation at the
end, wall time divided by ``calls`` (median of ``repeats`` such loops). Forward calls, and
forward + ``torch.autograd.grad`` for the differentiable ops (the whole training step of the
op, as an eager training loop runs it). torch's own ops of the same shapes are the anchors:
``x + r``, ``F.rms_norm``, ``F.silu(g) * u``, and their forward + backward.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ..ops._launch import launch_mode
from . import harness

CALLS = 1000
REPEATS = 5


def per_call_us(fn: Callable[[], object], calls: int = CALLS, repeats: int = REPEATS) -> float:
    """Median over ``repeats`` loops of the wall time of ``calls`` calls, per call, in us."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def cases(device: str = "cuda") -> dict[str, tuple[str, Callable[[], object]]]:
    """name -> (kind, zero-argument call): kind "torch" (an anchor), "forward", "step" (an
    optimizer's) or "fwd+bwd"."""
    import onetrip

    dt = torch.bfloat16
    x = torch.randn(4, 256, device=device, dtype=dt)
    r, w, b = torch.randn_like(x), torch.randn(256, device=device, dtype=dt), torch.randn(256, device=device, dtype=dt)
    gu = torch.randn(4, 512, device=device, dtype=dt)
    q, k = (torch.randn(1, 4, h, 64, device=device, dtype=dt) for h in (8, 2))
    cos, sin = torch.randn(16, 32, device=device), torch.randn(16, 32, device=device)
    logits, target = torch.randn(4, 1000, device=device, dtype=dt), torch.randint(0, 1000, (4,), device=device)
    kc, vc = (torch.zeros(4, 64, 2, 64, device=device, dtype=dt) for _ in range(2))
    lens = torch.full((4,), 8, device=device, dtype=torch.int32)
    q1, k1 = torch.randn(4, 1, 8, 64, device=device, dtype=dt), torch.randn(4, 1, 2, 64, device=device, dtype=dt)
    head = torch.randn(1000, 256, device=device, dtype=dt)
    params = [torch.randn(256, device=device, requires_grad=True) for _ in range(4)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = onetrip.optim.AdamW(params, lr=1e-3)
    xg, wg, gug, qg = (t.clone().requires_grad_(True) for t in (x, w, gu, q))
    dy = torch.randn_like(x)
    logits_g = logits.clone().requires_grad_(True)
    return {
        "x + r": ("torch", lambda: x + r),
        "F.rms_norm": ("torch", lambda: F.rms_norm(x, (256,), w, 1e-6)),
        "F.silu(g) * u": ("torch", lambda: F.silu(gu[:, :256]) * gu[:, 256:]),
        "F.rms_norm fwd+bwd": ("torch", lambda: torch.autograd.grad(F.rms_norm(xg, (256,), wg, 1e-6), (xg, wg), dy)),
        "bias_gelu": ("forward", lambda: onetrip.bias_gelu(x, b)),
        "rms_norm": ("forward", lambda: onetrip.rms_norm(x, w, 1e-6)),
        "add_rms_norm": ("forward", lambda: onetrip.add_rms_norm(x, r, w, 1e-6)),
        "layer_norm": ("forward", lambda: onetrip.layer_norm(x, w, b, 1e-5)),
        "silu_mul": ("forward", lambda: onetrip.silu_mul(gu)),
        "apply_rotary": ("forward", lambda: onetrip.apply_rotary(q, k, cos, sin)),
        "flash_attention": ("forward", lambda: onetrip.flash_attention(q, k, k, causal=True)),
        "cross_entropy": ("forward", lambda: onetrip.cross_entropy(logits, target)),
        "linear_cross_entropy": ("forward", lambda: onetrip.linear_cross_entropy(x, head, target)),
        "append_kv": ("forward", lambda: onetrip.append_kv(q1, k1, k1, kc, vc, lens, cos, sin)),
        "decode_attention": ("forward", lambda: onetrip.decode_attention(q1, kc, vc, lens)),
        "argmax": ("forward", lambda: onetrip.argmax(logits)),
        "AdamW.step (4 tensors)": ("step", opt.step),
        "bias_gelu fwd+bwd": ("fwd+bwd", lambda: torch.autograd.grad(onetrip.bias_gelu(xg, wg), (xg, wg), dy)),
        "rms_norm fwd+bwd": ("fwd+bwd", lambda: torch.autograd.grad(onetrip.rms_norm(xg, wg, 1e-6), (xg, wg), dy)),
        "silu_mul fwd+bwd": ("fwd+bwd", lambda: torch.autograd.grad(onetrip.silu_mul(gug), gug, dy)),
        "flash_attention fwd+bwd": ("fwd+bwd", lambda: torch.autograd.grad(
            onetrip.flash_attention(qg, k, k, causal=True).sum(), qg)),
        "cross_entropy fwd+bwd": ("fwd+bwd", lambda: torch.autograd.grad(
            onetrip.cross_entropy(logits_g, target), logits_g)),
    }


def run_host_bench(out_dir: Path, console=None) -> list[dict]:
    """Time every case on the current CUDA device; JSON under ``out_dir`` named
    ``host-<gpu>-<YYYYMMDD>``; a table, then one JSON summary line."""
    from rich.table import Table

    from . import report

    console = console or report.console()
    meta = {**harness.device_info("cuda"), "suite": "host", "calls": CALLS, "repeats": REPEATS,
            "timing": f"wall time of {CALLS} back-to-back eager calls on tiny tensors and one synchronisation, "
                      f"per call, median of {REPEATS}",
            "launch": launch_mode(), "cpu": harness.cpu_name()}
    records = []
    for name, (kind, fn) in cases().items():
        rec = {"case": name, "kind": kind, "host_us": None, "error": None}
        try:
            rec["host_us"] = per_call_us(fn)
        except Exception as exc:  # noqa: BLE001 - recorded, the suite goes on
            rec["error"] = harness.error_string(exc)
        records.append(rec)
    stem = Path(out_dir) / f"host-{harness.slug(meta['gpu'])}-{meta['date'][:10].replace('-', '')}"
    json_path, _ = harness.write_results(records, meta, stem)
    table = Table(title="host cost of an eager call, us (tiny tensors, the GPU idle)", title_justify="left")
    for col in ("case", "kind", "us"):
        table.add_column(col, justify="right" if col == "us" else "left")
    for r in records:
        table.add_row(r["case"], r["kind"], f"{r['host_us']:.1f}" if r["host_us"] else f"[red]{r['error'][:60]}[/]")
    console.print(table)
    console.print(f"wrote {json_path}")
    print(json.dumps({"bench": "host", "gpu": meta["gpu"], "results": str(json_path),
                      "us": {r["case"]: r["host_us"] and round(r["host_us"], 1) for r in records}}), flush=True)
    return records
