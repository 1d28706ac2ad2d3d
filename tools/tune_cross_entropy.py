"""Sweep cross_entropy's launch configs on a GPU: fwd+bwd GB/s and % of copy per config and vocabulary.

    PYTHONPATH=src python tools/tune_cross_entropy.py --out ce_sweep.json   # GPU, under 90 s
    PYTHONPATH=src python tools/tune_cross_entropy.py --dry-run             # the candidates, no GPU
    PYTHONPATH=src python tools/tune_cross_entropy.py --ptxas               # their sm_90a registers and
                                                                            # spills, no GPU

Shapes: the loss bench's (``bench.loss``): bf16 logits (tokens, vocab), tokens = 2**28 // vocab,
vocab 32000, 50257, 128256, 151936, 262144, uniform targets, none ignored. The step timed is
the bench's, ``torch.autograd.grad(cross_entropy(logits, target), logits)`` (mean): the count
kernel, the row kernel, the loss total and the backward's scaling at grad_output = 1.0;
bytes = logits read once + gradient written once (2 x tokens x vocab x 2). The row kernel is
also timed alone (``kernel_ms``): the difference is what the small kernels cost.

Each candidate (``CANDIDATES``, after the vocabulary's current pick) is forced by patching
``cross_entropy_config`` for the call, checked once against PyTorch's float32 gradient (the
timed path, and the in-place one, which leaves an unwritten element holding its logit), then
timed with ``onetrip.device.time_ms`` (CUDA graph, L2 flushed by a read before each replay).
Candidates run round-robin over the vocabularies, so a run cut by ``--budget-s`` still has
every vocabulary's first ones; the JSON is rewritten after each candidate. A candidate that
fails is recorded and the sweep goes on; one that loses the CUDA context re-runs this script
with ``--resume`` (the JSON's finished entries are skipped). The last lines name the fastest
correct config per vocabulary, in the form ``LOOP_PICKS`` takes.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

from onetrip.ops._cross_entropy_picks import CrossEntropyConfig

ce = importlib.import_module("onetrip.ops.cross_entropy")  # the module (onetrip.ops.cross_entropy is the function)

VOCABS = (32000, 50257, 128256, 151936, 262144)
ELEMENTS = 1 << 28
REPS = 50


def L(warps: int, unroll: int, split: int = 1, **fields) -> CrossEntropyConfig:  # noqa: N802 - a table's shorthand
    return CrossEntropyConfig("loop", warps, unroll=unroll, split=split, **fields)


# Alternatives to each vocabulary's pick, in the order they are timed. Registers (ptxas 13.4,
# sm_90a, --ptxas): 16 warps x 2 vectors 40 (50257: 62), x 4 64 (50257: 83); 8 x 4 76-80;
# 32 x 2 50 uncapped (one program an SM), 32 capped (two). Splits 2-16 are Hopper clusters.
# None spills.
CANDIDATES = {
    32000: [L(16, 2), L(32, 2, maxnreg=32), L(8, 4), L(4, 8), L(16, 4, keep_row=False), L(8, 4, split=2)],
    50257: [L(16, 2), L(32, 2, maxnreg=32), L(16, 4), L(8, 2), L(8, 4, split=2), L(8, 4, keep_row=False)],
    128256: [L(16, 2, split=8), L(8, 2, split=8), L(8, 4, split=16), L(8, 4, split=4), L(16, 4)],
    151936: [L(16, 2, split=8), L(8, 2, split=16), L(16, 2, split=16), L(8, 2, split=8), L(16, 4)],
    262144: [L(8, 4, split=8), L(16, 2, split=16), L(8, 2, split=16), L(16, 4, split=16), L(16, 4)],
}


def candidates(vocab: int) -> list[tuple[str, CrossEntropyConfig]]:
    """(label, config) for ``vocab``: the current pick first, then CANDIDATES' new ones."""
    pick = ce.cross_entropy_config(ELEMENTS // vocab, vocab, 2, torch.device("cpu"))
    out, seen = [("pick", pick)], {pick}
    for cfg in CANDIDATES[vocab]:
        if cfg not in seen:
            seen.add(cfg)
            out.append((label_of(cfg), cfg))
    return out


def label_of(cfg: CrossEntropyConfig) -> str:
    label = f"w{cfg.num_warps} u{cfg.unroll}" + (f" s{cfg.split}" if cfg.split > 1 else "")
    return label + ("" if cfg.keep_row else " nokeep") + (f" r{cfg.maxnreg}" if cfg.maxnreg else "")


def ptxas_main() -> int:
    """Registers and spills of every loop candidate compiled for sm_90a as ``_launch`` would
    launch it on the sweep's shapes (bf16, mean: scale read after the PDL wait); no GPU."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ptxas_report as pr  # drops TRITON_INTERPRET; compiles with triton's CUDA backend

    fn = ce._ce_loop_kernel
    print(f"triton {pr.triton.__version__}, ptxas {Path(pr.PTXAS).name}, sm_90a")
    for vocab in VOCABS:
        for label, cfg in candidates(vocab):
            const = dict(V=vocab, LANES=32 * cfg.num_warps, VEC=8, UNROLL=cfg.unroll, SPLIT=cfg.split,
                         CLUSTER=cfg.split > 1, PASSES=0, SHIFT=vocab % 16 != 0, G_ALIGNED=True, KEEP=cfg.keep_row,
                         HAS_SOFTCAP=False, HAS_SCALE=True, FORWARD=True, WRITE_GRAD=True, SMOOTH=False, PDL=1)
            ints = dict(N=ELEMENTS // vocab, stride_x=vocab, stride_g=vocab, stride_scale=0, ignore_index=-100)
            sig, attrs = {}, {}
            for i, n in enumerate(fn.arg_names):
                if n in const:
                    sig[n] = "constexpr"
                elif n.endswith("_ptr"):
                    sig[n] = {"x_ptr": "*bf16", "g_ptr": "*bf16", "t_ptr": "*i64"}.get(n, "*fp32")
                else:
                    sig[n] = "fp32" if n in ("smoothing", "z_loss", "softcap") else "i32"
                if n.endswith("_ptr") or (sig[n] == "i32" and ints[n] % 16 == 0):
                    attrs[(i,)] = [["tt.divisibility", 16]]
            k = pr._compile_marked(fn, sig, const, attrs, cfg.num_warps, None, cfg.maxnreg)
            regs, spill, _ = pr._ptxas(k.asm["ptx"])
            flag = "" if spill.startswith("0 ") else "  SPILLS: drop"
            print(f"{vocab:6d} {label:18s} {regs:>3s} registers, {spill}, {k.metadata.shared} B shared{flag}")
    return 0


def reference(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, float]:
    """PyTorch's float32 gradient of the mean cross-entropy, and its loss."""
    x = logits.float()
    loss = float(F.cross_entropy(x, target))
    g = torch.softmax(x, -1)
    g[torch.arange(len(target), device=g.device), target] -= 1.0
    return g.div_(len(target)), loss


def check(name: str, got: torch.Tensor, ref: torch.Tensor) -> tuple[bool, str]:
    """max |got - ref| within 2**-8 of max |ref| (bf16 rounding is 2**-9 of each element), all finite."""
    err = float((got.float() - ref).abs().max())
    bound = 2.0 ** -8 * float(ref.abs().max())
    ok = bool(torch.isfinite(got).all()) and err <= bound
    return ok, f"{name}: max err {err:.3e} vs bound {bound:.3e}{'' if ok else ' FAIL'}"


def run_one(vocab: int, data: dict, label: str, cfg: CrossEntropyConfig, copy: float, flush, time_ms) -> dict:
    """Check and time one candidate; the record always comes back (``error`` on a failure)."""
    logits, target, ref, ref_loss = data["logits"], data["target"], data["ref"], data["ref_loss"]
    tokens = logits.shape[0]
    nbytes = 2 * logits.numel() * logits.element_size()
    rec = {"vocab": vocab, "tokens": tokens, "label": label, "config": dataclasses.asdict(cfg), "bytes": nbytes,
           "ms": None, "gbs": None, "pct_copy": None, "kernel_ms": None, "kernel_pct_copy": None, "n_regs": None,
           "n_spills": None, "ok": None, "check": None, "error": None}
    start = time.perf_counter()
    leaf = logits.clone().requires_grad_(True)

    def step():
        return torch.autograd.grad(ce.cross_entropy(leaf, target), leaf)

    try:
        with mock.patch.object(ce, "cross_entropy_config", lambda *args: cfg):
            loss = ce.cross_entropy(leaf, target)
            (g,) = torch.autograd.grad(loss, leaf)
            checks = [check("step", g, ref)]
            del g
            buf = logits.clone()
            scale, _ = ce.mean_scale(target, -100)
            ce.cross_entropy_grad_(buf, target, scale)
            checks.append(check("in place", buf, ref))
            loss_err = abs(float(loss.detach()) - ref_loss) / abs(ref_loss)
            checks.append((loss_err <= 1e-4, f"loss rel err {loss_err:.1e}"))
            t = time_ms(step, reps=REPS, flush=flush)
            grad = torch.empty_like(logits)
            loss_rows = torch.empty(tokens, dtype=torch.float32, device=logits.device)
            lse = torch.empty_like(loss_rows)
            kernel = ce._launch(logits, target, scale, loss_rows, lse, grad, -100, 0.0, 0.0, 0.0, True)
            rec.update(n_regs=getattr(kernel, "n_regs", None), n_spills=getattr(kernel, "n_spills", None))
            k = time_ms(lambda: ce._launch(logits, target, scale, loss_rows, lse, grad, -100, 0.0, 0.0, 0.0, True),
                        reps=REPS, flush=flush)
        gbs = nbytes / t.median_ms / 1e6
        rec.update(ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms, graph=t.graph, gbs=gbs, pct_copy=100 * gbs / copy,
                   kernel_ms=k.median_ms, kernel_pct_copy=100 * nbytes / k.median_ms / 1e6 / copy,
                   ok=all(c[0] for c in checks), check="; ".join(c[1] for c in checks))
    except Exception as exc:  # noqa: BLE001 - a config that fails to compile or launch is recorded
        rec["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    rec["wall_s"] = time.perf_counter() - start
    return rec


def print_record(r: dict) -> None:
    if r["error"]:
        print(f"  {r['vocab']:6d} {r['label']:18s} error {r['error'][:110]}", flush=True)
        return
    print(f"  {r['vocab']:6d} {r['label']:18s} {r['ms'] * 1e3:7.1f} us {r['gbs']:6.0f} GB/s {r['pct_copy']:5.1f}%  "
          f"kernel {r['kernel_ms'] * 1e3:6.1f} us {r['kernel_pct_copy']:5.1f}%  regs {r['n_regs']} spills "
          f"{r['n_spills']}  {'ok' if r['ok'] else 'CHECK FAILED'}  ({r['wall_s']:.1f} s)", flush=True)


def best_lines(results: list[dict]) -> dict:
    """vocab -> the fastest correct record's label, % of copy and config (LOOP_PICKS' form)."""
    best = {}
    for r in results:
        if r.get("ok") and (r["vocab"] not in best or r["pct_copy"] > best[r["vocab"]]["pct_copy"]):
            best[r["vocab"]] = r
    return {v: {"label": r["label"], "pct_copy": r["pct_copy"], "config": repr(CrossEntropyConfig(**r["config"]))}
            for v, r in sorted(best.items())}


def write(path: Path, meta: dict, results: list[dict]) -> None:
    path.write_text(json.dumps({**meta, "results": results, "best": best_lines(results)}, indent=1, default=str))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="JSON file for every result (rewritten after each candidate)")
    ap.add_argument("--dry-run", action="store_true", help="print the candidates and exit (no GPU)")
    ap.add_argument("--ptxas", action="store_true", help="compile the candidates for sm_90a (no GPU)")
    ap.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS), choices=VOCABS)
    ap.add_argument("--budget-s", type=float, default=75.0, help="start no candidate after this many seconds")
    ap.add_argument("--resume", action="store_true", help="skip the (vocab, label) pairs --out already holds")
    ap.add_argument("--started", type=float, default=None, help=argparse.SUPPRESS)  # a resumed run's start time
    args = ap.parse_args()
    if args.ptxas:
        return ptxas_main()
    if args.dry_run:
        for vocab in args.vocabs:
            print(f"{ELEMENTS // vocab} x {vocab}")
            for label, cfg in candidates(vocab):
                print(f"  {label:18s} {cfg}")
        return 0
    if args.out is None:
        ap.error("--out is required for a sweep")

    from onetrip.bench.harness import device_info
    from onetrip.device import copy_bandwidth_gbs, new_flush_buffer, time_ms

    started = args.started or time.time()
    dev = torch.device("cuda")
    results = json.loads(args.out.read_text())["results"] if args.resume and args.out.exists() else []
    done = {(r["vocab"], r["label"]) for r in results}
    meta = {"tool": "tune_cross_entropy", **device_info(dev)}
    meta["copy_gbs"] = copy = copy_bandwidth_gbs(dev)
    print(f"{meta.get('gpu')}  copy {copy:.0f} GB/s  torch {torch.__version__}  triton {meta.get('triton')}",
          flush=True)
    flush = new_flush_buffer(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    data = {}
    for vocab in args.vocabs:
        logits = torch.randn(ELEMENTS // vocab, vocab, device=dev, generator=gen).to(torch.bfloat16)
        target = torch.randint(0, vocab, (ELEMENTS // vocab,), device=dev, generator=gen)
        ref, ref_loss = reference(logits, target)
        data[vocab] = dict(logits=logits, target=target, ref=ref, ref_loss=ref_loss)
    todo = {v: [c for c in candidates(v) if (v, c[0]) not in done] for v in args.vocabs}
    for rank in range(max(len(c) for c in todo.values())):
        for vocab in args.vocabs:
            if rank >= len(todo[vocab]):
                continue
            if time.time() - started > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: stopping", flush=True)
                write(args.out, meta, results)
                return report(results, args.out)
            label, cfg = todo[vocab][rank]
            rec = run_one(vocab, data[vocab], label, cfg, copy, flush, time_ms)
            results.append(rec)
            print_record(rec)
            write(args.out, meta, results)
            if rec["error"] and not context_ok():
                print("the CUDA context is lost: resuming in a new process", flush=True)
                argv = [a for a in sys.argv if a != "--resume"]
                os.execv(sys.executable, [sys.executable, *argv, "--resume", "--started", str(started)])
    return report(results, args.out)


def context_ok() -> bool:
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:  # noqa: BLE001
        return False


def report(results: list[dict], out: Path) -> int:
    print("\nfastest correct config per vocabulary (% of copy, fwd+bwd):")
    for vocab, b in best_lines(results).items():
        print(f"  {vocab:6d} {b['pct_copy']:5.1f}%  {b['label']:18s} {b['config']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
