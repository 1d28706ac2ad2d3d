"""``onetrip bench ops --backward``: each fused op's training pass against its peers.

Per (op, shape, provider) two records, ``pass`` "fwd+bwd" and "bwd":

    fwd+bwd   one CUDA-graph replay of the forward with autograd recording, then
              ``torch.autograd.grad`` of its outputs against random upstream gradients
    bwd       fwd+bwd minus the forward alone (timed the same way, autograd recording)

Bytes count what an ideal kernel must move, as in ``cases``: the backward reads the
upstream gradients, the saved inputs and the weight, and writes the input gradients and the
weight/bias gradients, in elements of a (rows, width) problem (E = rows * width, N = width):

    bias_gelu       dy, x, bias -> dx, dbias                    3E + 2N
    rms_norm        dy, x, weight -> dx, dweight                3E + 2N
    add_rms_norm    dy, dh, h, weight -> dx (= dresidual), dw   4E + 2N
    layer_norm      dy, x, weight -> dx, dweight, dbias         3E + 3N
    add_layer_norm  dy, dh, h, weight -> dx, dweight, dbias     4E + 3N
    silu_mul        dy, gate, up -> dgate, dup                  5E
    gelu_mul        dy, gate, up -> dgate, dup                  5E
    rotary          dq_out, dk_out -> dq, dk (+ cos, sin)       the forward's bytes

(per-program partial sums of dweight are not counted: a few MB against the shape's 512 MB+);
fwd+bwd counts the forward's bytes plus these. Providers: eager (the ``*_ref`` under
autograd), torch.compile of it (AOTAutograd compiles the backward), Liger-Kernel where it
has the op with a backward, onetrip. onetrip's gradients are checked against float64 on
the first rows by ``onetrip.testing``'s rule.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Callable, Sequence

import torch

from . import harness
from .cases import DTYPE_NAMES, OpCase, Shape, liger_installed, onetrip_has
from .ops import CHECK_ELEMENTS, add_speedup, raise_recompile_limit, select

PASSES = ("fwd+bwd", "bwd")
# (row tensors read + written, vectors) of each op's backward: see the module docstring
BACKWARD_ELEMENTS = {"bias_gelu": (3, 2), "rms_norm": (3, 2), "add_rms_norm": (4, 2), "layer_norm": (3, 3),
                     "add_layer_norm": (4, 3), "silu_mul": (5, 0), "gelu_mul": (5, 0)}
# Liger-Kernel's autograd functions, with the arguments after the tensors (``cases`` names the same)
LIGER = {
    "rms_norm": ("rms_norm", "LigerRMSNormFunction", (1e-6, 0.0, "llama", False)),
    "add_rms_norm": ("fused_add_rms_norm", "LigerFusedAddRMSNormFunction", (1e-6, 0.0, "llama", False)),
    "layer_norm": ("layer_norm", "LigerLayerNormFunction", (1e-5,)),
    "silu_mul": ("swiglu", "LigerSiLUMulFunction", ()),
    "gelu_mul": ("geglu", "LigerGELUMulFunction", ()),
}


def backward_bytes(case: OpCase, shape: Shape, dtype: torch.dtype) -> int:
    """Bytes of an ideal backward (module docstring); rotary's backward moves its forward's."""
    if case.name not in BACKWARD_ELEMENTS:
        return case.bytes_moved(shape, dtype)
    rows, vectors = BACKWARD_ELEMENTS[case.name]
    return (rows * shape.rows * shape.width + vectors * shape.width) * dtype.itemsize


def _leaves(case: OpCase, inputs: tuple) -> tuple[torch.Tensor, ...]:
    """Fresh leaf copies of the inputs; the differentiable ones require a gradient (rotary's
    cos and sin tables do not)."""
    out = []
    for i, t in enumerate(inputs):
        leaf = t.detach().clone()
        if leaf.is_floating_point() and not (case.name == "rotary" and i >= 2):
            leaf.requires_grad_(True)
        out.append(leaf)
    return tuple(out)


def _as_tuple(out) -> tuple[torch.Tensor, ...]:
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


def providers_for(case: OpCase) -> list[str]:
    peers = ["eager", "torch.compile"] + (["liger"] if case.name in LIGER and liger_installed() else [])
    return peers + ["onetrip"]


def _call(provider: str, case: OpCase, leaves: tuple, compiled: Callable) -> tuple[Callable, tuple]:
    """(a zero-argument forward returning the outputs, the tensors that get gradients)."""
    grads_of = tuple(t for t in leaves if t.requires_grad)
    if provider == "eager":
        ref = case.ref()
        return (lambda: _as_tuple(ref(*leaves))), grads_of
    if provider == "torch.compile":
        return (lambda: _as_tuple(compiled(*leaves))), grads_of
    if provider == "onetrip":
        return (lambda: _as_tuple(case.fused(*leaves))), grads_of
    module, cls, args = LIGER[case.name]
    fn = getattr(importlib.import_module(f"liger_kernel.ops.{module}"), cls).apply
    if case.name in ("silu_mul", "gelu_mul"):  # Liger takes gate and up as two contiguous tensors
        halves = tuple(h.detach().contiguous().requires_grad_(True) for h in leaves[0].chunk(2, dim=-1))
        return (lambda: _as_tuple(fn(*halves, *args))), halves
    return (lambda: _as_tuple(fn(*leaves, *args))), grads_of


def check_grads(case: OpCase, inputs: tuple, rows: int, seed: int = 1) -> dict:
    """onetrip's gradients against float64 on the first rows (``onetrip.testing`` rule):
    {"ok", "max_err", "bound", "report"} of the gradient nearest its bound."""
    from onetrip.testing import error_report, grads

    n = max(1, min(rows, CHECK_ELEMENTS * rows // max(1, inputs[0].numel())))
    small = _leaves(case, tuple(case.head(t, n) for t in inputs))
    ref = case.ref()

    def variant(dtype):  # named copies of the inputs (float64 ones for the exact gradient)
        return {f"in{i}": (t.detach().to(dtype) if dtype and t.is_floating_point() else t.detach().clone())
                .requires_grad_(t.requires_grad) for i, t in enumerate(small)}

    def fused(**kw):
        return _as_tuple(case.fused(*kw.values()))

    def unfused(**kw):
        return _as_tuple(ref(*kw.values()))

    outs = fused(**variant(None))
    gen = torch.Generator(device=outs[0].device).manual_seed(seed)
    gos = tuple(torch.randn(o.shape, generator=gen, device=o.device).to(o.dtype) for o in outs)
    mine = grads(fused, variant(None), gos)
    exact = grads(unfused, variant(torch.float64), tuple(g.double() for g in gos))
    theirs = grads(unfused, variant(None), gos)
    reports = [error_report(f"{case.name} d{k}", mine[k], exact[k], theirs[k]) for k in mine if mine[k] is not None]
    worst = max(reports, key=lambda r: float("inf") if not r.ok else r.max_err / r.bound)
    return {"ok": all(r.ok for r in reports), "max_err": worst.max_err, "bound": worst.bound, "report": str(worst)}


def bench_shape(case: OpCase, shape: Shape, dtype: torch.dtype, compiled: Callable, copy_gbs: float,
                flush: torch.Tensor, done: Callable[[str], None] = lambda p: None) -> list[dict]:
    """Time fwd+bwd and the forward alone for every provider on one shape; two records each."""
    device = torch.device("cuda")
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    inputs = case.make_inputs(shape, dtype, device, gen)
    fwd_bytes, bwd_bytes = case.bytes_moved(shape, dtype), backward_bytes(case, shape, dtype)
    records = []
    for provider in providers_for(case):
        base = {"op": case.name, **shape.fields(), "dtype": DTYPE_NAMES[dtype], "provider": provider,
                "median_ms": None, "p20_ms": None, "p80_ms": None, "graph": None, "graph_error": None, "gbs": None,
                "pct_of_copy": None, "ok": None, "max_err": None, "bound": None, "check_report": None,
                "speedup_vs_best_peer": None, "best_peer": None, "error": None}
        both = {"fwd+bwd": {**base, "pass": "fwd+bwd", "bytes": fwd_bytes + bwd_bytes},
                "bwd": {**base, "pass": "bwd", "bytes": bwd_bytes}}
        records += both.values()
        try:
            leaves = _leaves(case, inputs)
            forward, grads_of = _call(provider, case, leaves, compiled)
            outs = forward()
            gos = tuple(torch.randn(o.shape, generator=gen, device=device).to(o.dtype) for o in outs)
            del outs

            def step():
                torch.autograd.grad(forward(), grads_of, gos)

            t_all = harness.time_ms(step, flush=flush)
            t_fwd = harness.time_ms(forward, flush=flush)
            t_bwd = (t_all.median_ms - t_fwd.median_ms, t_all.p20_ms - t_fwd.p20_ms, t_all.p80_ms - t_fwd.p80_ms)
            for rec, (med, p20, p80) in ((both["fwd+bwd"], (t_all.median_ms, t_all.p20_ms, t_all.p80_ms)),
                                         (both["bwd"], t_bwd)):
                rate = harness.gbs(rec["bytes"], med)
                rec.update(median_ms=med, p20_ms=p20, p80_ms=p80, graph=t_all.graph and t_fwd.graph,
                           graph_error=t_all.graph_error or t_fwd.graph_error, gbs=rate,
                           pct_of_copy=100 * rate / copy_gbs if rate else None)
            if provider == "onetrip":
                check = check_grads(case, inputs, shape.fields()["rows"])
                for rec in both.values():
                    rec.update(ok=check["ok"], max_err=check["max_err"], bound=check["bound"],
                               check_report=check["report"])
        except Exception as exc:  # noqa: BLE001 - recorded, the suite goes on
            for rec in both.values():
                rec["error"] = harness.error_string(exc)
        done(provider)
    for p in PASSES:
        add_speedup([r for r in records if r["pass"] == p])
    return records


METHOD = ("fwd+bwd: median of 100 CUDA-graph replays of the forward (autograd recording) and torch.autograd.grad "
          "of its outputs, L2 flushed (by reading 256 MiB) before each; bwd: fwd+bwd minus the forward alone, "
          "timed the same way")


def run_backward_bench(ops: Sequence[str] | None, dtype: torch.dtype, out_dir: Path, quick: bool,
                       console=None) -> list[dict]:
    """Time the suite's backward passes on the current CUDA device; JSON, CSV and PNG under
    ``out_dir`` named ``ops-backward-<gpu>-<dtype>-<YYYYMMDD>``; a table per op and pass,
    then one JSON summary line."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import report

    console = console or report.console()
    cases = [c for c in select(ops) if onetrip_has(c)]
    device = torch.device("cuda")
    meta = {**harness.device_info(device), "suite": "ops-backward", "dtype": DTYPE_NAMES[dtype], "quick": quick,
            "timing": METHOD, "bytes": "each input and upstream gradient read once + each gradient written once "
            "(see onetrip.bench.backward); fwd+bwd adds the forward's; 1 GB = 1e9 bytes"}
    meta["copy_gbs"] = harness.copy_bandwidth_gbs(device)
    console.print(f"{meta['gpu']}: copy bandwidth {meta['copy_gbs']:.0f} GB/s (read + write)")
    stem = Path(out_dir) / f"ops-backward-{harness.slug(meta['gpu'])}-{meta['dtype']}-{meta['date'][:10].replace('-', '')}"
    raise_recompile_limit()
    flush = harness.new_flush_buffer(device)
    records: list[dict] = []
    columns = (TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    total = sum(len(c.shapes(quick)) * len(providers_for(c)) for c in cases)
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("ops --backward", total=total)
        for case in cases:
            torch._dynamo.reset()
            compiled = torch.compile(case.ref(), dynamic=False)
            for shape in case.shapes(quick):
                progress.update(task, description=f"{case.name} {shape.label} backward")
                records += bench_shape(case, shape, dtype, compiled, meta["copy_gbs"], flush,
                                       lambda provider: progress.advance(task))
                torch.cuda.empty_cache()
            harness.write_results(records, meta, stem)
    json_path, csv_path = harness.write_results(records, meta, stem)
    shown = [{**r, "op": f"{r['op']} {r['pass']}"} for r in records]
    png = harness.plot_gbs(shown, meta, stem.with_suffix(".png")) if records else None
    for case in cases:
        for p in PASSES:
            report.print_op_table(console, shown, f"{case.name} {p}", providers_for(case))
    console.print(f"wrote {json_path}, {csv_path}" + (f", {png}" if png else ""))
    summary = report.summary(shown, meta, json_path)
    print(json.dumps({**summary, "bench": "ops-backward"}), flush=True)
    return records


def run_backward_check(ops: Sequence[str] | None, dtype: torch.dtype, console=None) -> int:
    """Without a GPU: onetrip's gradients against float64 on the check shapes, through the
    interpreter. Returns 1 if any check failed, else 0."""
    from . import report

    console = console or report.console()
    rows = []
    for case in select(ops):
        for shape in case.check_shapes:
            inputs = case.make_inputs(shape, dtype, torch.device("cpu"), torch.Generator().manual_seed(0))
            try:
                result = check_grads(case, inputs, shape.fields()["rows"])
            except Exception as exc:  # noqa: BLE001 - a crash is a failed check, shown in the table
                result = {"ok": False, "max_err": None, "bound": None, "report": harness.error_string(exc)}
            rows.append((f"{case.name} backward", shape.label, DTYPE_NAMES[dtype], result["max_err"], result["bound"],
                         "ok" if result["ok"] else f"FAIL {result['report']}"))
    return report.finish_check(console, rows, "ops-backward-check", DTYPE_NAMES[dtype],
                               "onetrip's gradients were only checked against float64")
