"""What torch.compile generates for the cells where it beats onetrip: its Triton
kernel source and the launch config it picked (block sizes, warps), to read, not copy.

    PYTHONPATH=src python benchmarks/diag_inductor.py --out DIR

Cells (bf16, the ops bench's shapes): rms_norm 2048 x 32768 and 8192 x 8192, layer_norm
4096 x 16384; silu_mul at the anchors 4096 x 4096 and 64 x 262144 and at 4096 x 16384.
Writes DIR/inductor-<cell>.py (the generated code) and prints each kernel's launchers'
configs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
from torch._inductor.utils import run_and_get_code  # noqa: E402

from onetrip.ops.glu import silu_mul_ref  # noqa: E402
from onetrip.ops.norm import layer_norm_ref, rms_norm_ref  # noqa: E402

CELLS = {"rms_norm-2048x32768": ("rms", 2048, 32768), "rms_norm-8192x8192": ("rms", 8192, 8192),
         "layer_norm-4096x16384": ("layer", 4096, 16384),
         # silu_mul on the (rows, 2 x width) gate-up output, as the ops bench passes it
         "silu_mul-4096x4096": ("silu", 4096, 4096), "silu_mul-64x262144": ("silu", 64, 262144),
         "silu_mul-4096x16384": ("silu", 4096, 16384)}


def launch_configs() -> list[str]:
    """The configs of every compiled Triton kernel inductor has loaded (after a run)."""
    from torch._inductor.codecache import PyCodeCache

    mods = getattr(PyCodeCache, "modules", None) or list(getattr(PyCodeCache, "cache", {}).values())
    out = []
    for mod in mods:
        for name, obj in vars(mod).items():
            for launcher in getattr(obj, "launchers", None) or []:
                cfg = getattr(launcher, "config", None)
                out.append(f"{name}: {cfg} n_regs={getattr(launcher, 'n_regs', None)}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu-out"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for cell, (kind, rows, width) in CELLS.items():
        torch._dynamo.reset()
        x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(width, device="cuda", dtype=torch.bfloat16)
        if kind == "silu":
            fn = torch.compile(silu_mul_ref)
            args_ = (torch.randn(rows, 2 * width, device="cuda", dtype=torch.bfloat16),)
        elif kind == "rms":
            fn = torch.compile(lambda a, b: rms_norm_ref(a, b, 1e-6))
            args_ = (x, w)
        else:
            fn = torch.compile(lambda a, b, c: layer_norm_ref(a, b, c, 1e-5))
            args_ = (x, w, w)
        _, codes = run_and_get_code(fn, *args_)
        (args.out / f"inductor-{cell}.py").write_text("\n\n# ----\n\n".join(codes))
        print(f"== {cell}")
        for line in launch_configs():
            print("  ", line)
        for code in codes:  # the kernels' decorators and loop structure, briefly
            for ln in code.splitlines():
                s = ln.strip()
                if s.startswith(("@triton_heuristics", "def triton_", "for r", "tmp", "_tmp")) or "evict" in s \
                        or "size_hints" in s or "num_warps" in s:
                    print("    " + s[:160])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
