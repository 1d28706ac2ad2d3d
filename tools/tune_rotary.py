"""Sweep apply_rotary's launch configs on a GPU: GB/s and % of copy per config and shape.

    PYTHONPATH=src python tools/tune_rotary.py --out DIR   # GPU, ~1 minute
    PYTHONPATH=src python tools/tune_rotary.py --dry-run   # the candidates, no GPU
    PYTHONPATH=src python tools/tune_rotary.py --ptxas     # their sm_90a registers and
                                                                # spills, no GPU (CUDA's ptxas)

The shapes are the ops bench's (``bench.cases.rotary_shapes``: llama-8b, qwen-0.5b and
partial, bf16, >= 256 MiB moved), the bytes its ``rotary_bytes`` (q and k read and written
once, the cos/sin rows read once). Each config is launched through ``rotary._launch`` into
preallocated outputs, checked once against ``apply_rotary_ref`` under the repository's rule
(onetrip.testing), then timed under a CUDA graph with L2 flushed (``harness.time_ms``).

Candidates per shape (``candidates``):
  baseline       the first kernel: ``rotary_config``'s tile, 64-bit token indices
  heuristic      ``rotary_config`` as launched today (32-bit token indices)
  split-k        the same with k in chunks of its own size (2 kv heads: 2 lanes, not 16)
  merged_config  ``rotary.merged_config``: q and k of a token in one chunk, loads before stores
  merge ...      merge_qk over a grid of tokens per program and warps (4 to 96 lanes a
                 thread), and one with q and k in two chunks each (half the registers, two trips)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from pathlib import Path

import torch
import triton

from onetrip.bench.cases import _rotary_inputs, rotary_bytes, rotary_shapes
from onetrip.ops import rotary
from onetrip.ops.rotary import RotaryConfig, apply_rotary_ref, merged_config, rotary_config
from onetrip.testing import DEFAULT_ATOL, upcast

DT = torch.bfloat16


def check(name: str, out: torch.Tensor, exact: torch.Tensor, torch_err: float) -> tuple[bool, str]:
    """onetrip.testing's rule, max |out - exact| <= 2 x PyTorch's + atol with nothing
    non-finite, evaluated on the GPU (error_report's CPU pass over 60M elements, twice per
    config, would take most of the run)."""
    err = (out.double() - exact).abs()
    nonfinite = int((~torch.isfinite(err)).sum())
    max_err = float(err.nan_to_num(nan=float("inf")).max())
    bound = 2 * torch_err + DEFAULT_ATOL[out.dtype]
    ok = nonfinite == 0 and max_err <= bound
    return ok, (f"{name}: {'ok' if ok else 'FAIL'}: max err {max_err:.3e} vs bound {bound:.3e} = 2 x PyTorch's "
                f"{torch_err:.3e} + atol" + (f", {nonfinite} non-finite" if nonfinite else ""))


def candidates(s, device) -> list[tuple[str, RotaryConfig]]:
    """(label, config) for shape ``s``, without duplicates."""
    half, tail = s.rot_dim // 2, s.head_dim - s.rot_dim
    cur = rotary_config(s.tokens, max(s.heads, s.kv_heads), half, device)
    bh, bhk = triton.next_power_of_2(s.heads), triton.next_power_of_2(s.kv_heads)
    cols = 2 * triton.next_power_of_2(half) + (triton.next_power_of_2(tail) if tail else 0)
    out = [("baseline", dataclasses.replace(cur, index64=True)), ("heuristic", cur),
           ("split-k", dataclasses.replace(cur, block_hk=bhk)),
           ("merged_config", merged_config(s.tokens, s.heads, s.kv_heads, half, tail, device))]
    for bt in (1, 2, 4, 8):
        for warps in (4, 8):
            if 4 <= bt * (bh + bhk) * cols // (32 * warps) <= 96:
                out.append((f"merge t{bt} w{warps}", RotaryConfig(bt, bh, warps, bhk, merge_qk=True)))
    best = out[-1][1]  # the largest grid tile: the same tokens in two chunks of heads
    out.append(("merge 2 chunks", dataclasses.replace(best, block_h=max(1, bh // 2), block_hk=max(1, bhk // 2))))
    seen, unique = set(), []
    for label, cfg in out:
        if cfg not in seen:
            seen.add(cfg)
            unique.append((label, cfg))
    return unique


def ptxas_main() -> int:
    """Registers and spills of every candidate compiled for sm_90a, with the integer
    arguments a launch marks divisible by 16 marked here too; no GPU needed."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ptxas_report as pr  # drops TRITON_INTERPRET; compiles with triton's CUDA backend

    fn = rotary._rotary_kernel
    for s in rotary_shapes():
        T, H, Hkv, D = s.tokens, s.heads, s.kv_heads, s.head_dim
        half, tail = s.rot_dim // 2, D - s.rot_dim
        ints = dict(n_tokens=T, seq=T, n_pos=T, q_heads=H, k_heads=Hkv, half=half, tail=tail,
                    stride_cos=half, stride_sin=half)
        for t, h in (("q", H), ("k", Hkv)):
            for o in ("", "o"):
                ints.update({f"stride_{t}{o}b": T * h * D, f"stride_{t}{o}s": h * D, f"stride_{t}{o}h": D})
        for label, cfg in candidates(s, torch.device("cpu")):
            const = dict(INTERLEAVED=False, HAS_POS=False, COPY_TAIL=tail > 0, MERGE_QK=cfg.merge_qk,
                         TOK64=cfg.index64, BLOCK_T=cfg.block_t, BLOCK_H=cfg.block_h,
                         BLOCK_HK=cfg.block_hk or cfg.block_h, BLOCK_HALF=triton.next_power_of_2(half),
                         BLOCK_TAIL=triton.next_power_of_2(max(tail, 1)))
            sig, attrs = {}, {}
            for i, n in enumerate(fn.arg_names):
                if n in const:
                    sig[n] = "constexpr"
                elif n.endswith("_ptr"):
                    sig[n] = "*fp32" if n in ("cos_ptr", "sin_ptr", "pos_ptr") else "*bf16"
                else:
                    sig[n] = "i32"
                if n.endswith("_ptr") or (sig[n] == "i32" and ints[n] % 16 == 0):
                    attrs[(i,)] = [["tt.divisibility", 16]]
            k = pr._compile_marked(fn, sig, const, attrs, cfg.num_warps)
            regs, spill, _ = pr._ptxas(k.asm["ptx"])
            print(f"{s.name:10s} {label:15s} {regs:>3s} registers, {spill}, {k.metadata.shared} B shared  {cfg}")
    return 0


def sweep_shape(s, dev, gen, copy: float, time_ms) -> list[dict]:
    """Check and time every candidate on shape ``s``; print a line and return a record each."""
    q, k, cos, sin = _rotary_inputs(s, DT, dev, gen)
    exact = apply_rotary_ref(*upcast(q, k, cos, sin))
    torch_err = [float((e.double() - x).abs().max()) for e, x in zip(apply_rotary_ref(q, k, cos, sin), exact)]
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    nbytes = rotary_bytes(s, DT)
    print(f"\n{s.label}  ({nbytes / 2**20:.0f} MiB)", flush=True)
    results = []
    for label, cfg in candidates(s, dev):
        rec = {"shape": s.label, "label": label, "config": dataclasses.asdict(cfg)}
        results.append(rec)
        launch = functools.partial(rotary._launch, q, k, cos, sin, None, q_out, k_out, False, cfg)
        try:
            q_out.fill_(float("nan"))
            k_out.fill_(float("nan"))
            kern = launch()
            checks = [check(n, o, x, e) for n, o, x, e in zip("qk", (q_out, k_out), exact, torch_err)]
            t = time_ms(launch)
        except Exception as e:  # a config that fails to compile (registers, shared memory)
            rec["error"] = repr(e)[:300]
            print(f"  {label:15s} error {rec['error'][:100]}", flush=True)
            continue
        gbs = nbytes / t.median_ms / 1e6
        rec.update(ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms, graph=t.graph, gbs=gbs,
                   pct_copy=100 * gbs / copy, ok=all(c[0] for c in checks), check=[c[1] for c in checks],
                   n_regs=getattr(kern, "n_regs", None), n_spills=getattr(kern, "n_spills", None))
        print(f"  {label:15s} {t.median_ms * 1e3:7.1f} us {gbs:6.0f} GB/s {rec['pct_copy']:5.1f}%  "
              f"regs={rec['n_regs']} spills={rec['n_spills']} {'ok' if rec['ok'] else 'CHECK FAILED'}  {cfg}",
              flush=True)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--dry-run", action="store_true", help="print the candidates and exit (no GPU)")
    ap.add_argument("--ptxas", action="store_true", help="compile the candidates for sm_90a (no GPU)")
    args = ap.parse_args()
    if args.ptxas:
        return ptxas_main()
    if args.dry_run:  # rotary_config's SM-count floor does not bind at these token counts
        for s in rotary_shapes():
            print(s.label)
            for label, cfg in candidates(s, torch.device("cpu")):
                print(f"  {label:15s} {cfg}")
        return 0

    from onetrip.bench.harness import copy_bandwidth_gbs, device_info, sweep_path, time_ms, write_sweep

    dev = torch.device("cuda")
    info = device_info(dev)
    copy = copy_bandwidth_gbs(dev)
    print(f"{info.get('gpu')}  copy {copy:.0f} GB/s", flush=True)
    path = sweep_path(args.out, info, "tune-rotary")
    results = []
    gen = torch.Generator(device=dev).manual_seed(0)
    for s in rotary_shapes():
        results += sweep_shape(s, dev, gen, copy, time_ms)
        torch.cuda.empty_cache()
        write_sweep(path, info, copy, results)  # after every step: a cut-off run keeps what it measured
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
