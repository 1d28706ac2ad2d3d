"""The op suite behind ``onetrip bench ops``: each fused op against what a user would run instead.

The ops, shapes, inputs and byte counts are data in ``cases``; this module checks and
times them. Providers, timed in this order on the same inputs:

    eager          the op's ``*_ref``, op by op (intermediates make round trips through HBM)
    torch.compile  torch.compile(ref), default mode, static shapes
    liger          Liger-Kernel's kernel, where it has one for the op and is installed
    onetrip        onetrip's fused kernel

Timing (``TIMINGS``): "rotate" (the default) replays one CUDA graph of ``calls`` calls back
to back over ``input_sets`` copies of the inputs that together pass 256 MiB, so each call
reads its inputs from HBM, and divides by ``calls``: the time of a kernel among others, as
in a model's forward, each call finding the previous one's output dirty in L2. "single"
replays a graph of one call after an L2 flush, so each call starts on a clean L2; on an
H200 the two agree within ~1% at 2**26 elements (see ``device.time_ms``). Per
(op, shape, provider) a record holds median_ms, p20_ms, p80_ms, bytes (each input read
once, each output written once), gbs, pct_of_copy (of the measured copy bandwidth),
max_diff_vs_eager (max |output - eager output|), error (why a provider could not run);
onetrip's record adds ok / max_err / bound (``onetrip.testing``'s accuracy rule, checked
on the first rows) and speedup_vs_best_peer = best peer's median time / onetrip's
(above 1: onetrip is faster), with best_peer naming that peer. Every record of a shape
also carries size_copy_gbs (``floors.size_copy_gbs``): a plain element-wise kernel moving the
shape's bytes, timed the same way, which is what any kernel of that size can hope for (at
64 MiB a kernel runs ~16 us and its ramp-up and tail are not free); pct_of_size_copy is the
record's GB/s against it.

Without a GPU, ``run_ops_check`` checks onetrip against the references on small awkward
shapes through Triton's interpreter instead.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Sequence

import torch

from . import harness
from .cases import CASES, DTYPE_NAMES, DTYPES, OP_NAMES, OPS, PROVIDERS, OpCase, Shape, liger_installed, onetrip_has

__all__ = ["CASES", "DTYPES", "OPS", "OP_NAMES", "bench_shape", "check_accuracy", "run_ops_bench", "run_ops_check"]
CHECK_ELEMENTS = 1 << 20  # accuracy is checked on the first rows holding about this many elements
TIMINGS = ("rotate", "single")
MIN_CALLS = 4  # calls a "rotate" replay runs at least, back to back


# ---------------------------------------------------------------------------- checks


def _outputs(result) -> tuple[torch.Tensor, ...]:
    return (result,) if isinstance(result, torch.Tensor) else tuple(result)


def max_abs_diff(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """Max |a - b| over all outputs (in float32); NaN where either holds NaN."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        raise ValueError(f"output shapes {[tuple(x.shape) for x in a]} differ from eager's {[tuple(y.shape) for y in b]}")
    return max((float((x.float() - y.float()).abs().max()) if x.numel() else 0.0 for x, y in zip(a, b)), default=0.0)


def check_accuracy(case: OpCase, ref: Callable, inputs: tuple, out: tuple, rows: int) -> dict:
    """onetrip's outputs against the rule on the first rows: {"ok", "max_err", "bound", "report"}.

    exact = ref on float64 copies of those rows; PyTorch's own error = ref on them in the
    input dtype. ``rows`` is the number of rows (tokens); about CHECK_ELEMENTS elements of
    the first input are checked. The output nearest its bound is reported.
    """
    from onetrip.testing import error_report, upcast

    n = max(1, min(rows, CHECK_ELEMENTS * rows // max(1, inputs[0].numel())))
    small = tuple(case.head(t, n) for t in inputs)
    wide = upcast(*small)
    exact = _outputs(ref(*(wide if isinstance(wide, tuple) else (wide,))))
    torch_out = _outputs(ref(*small))
    reports = [error_report(f"{case.name}[{i}]", case.head(o, n), e, t)
               for i, (o, e, t) in enumerate(zip(out, exact, torch_out))]
    worst = max(reports, key=lambda r: math.inf if not r.ok else r.max_err / r.bound)
    return {"ok": all(r.ok for r in reports), "max_err": worst.max_err, "bound": worst.bound, "report": str(worst)}


# ---------------------------------------------------------------------------- runs


def select(ops: Sequence[str] | None) -> list[OpCase]:
    """The cases named in ``ops`` (all when None), in suite order; unknown names raise ValueError."""
    unknown = [name for name in ops or () if name not in OPS]
    if unknown:
        raise ValueError(f"unknown op(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(OP_NAMES)}")
    return [case for case in CASES if ops is None or case.name in ops]


def providers_for(case: OpCase) -> list[str]:
    return [p for p in PROVIDERS if p != "liger" or (case.liger is not None and liger_installed())]


def _record(case: OpCase, shape: Shape, dtype: torch.dtype, provider: str) -> dict:
    keys = ("median_ms", "p20_ms", "p80_ms", "graph", "graph_error", "gbs", "pct_of_copy", "max_diff_vs_eager",
            "ok", "max_err", "bound", "check_report", "speedup_vs_best_peer", "best_peer", "error", "input_sets",
            "calls", "size_copy_gbs", "pct_of_size_copy")
    return {"op": case.name, **shape.fields(), "dtype": DTYPE_NAMES[dtype], "provider": provider,
            "bytes": case.bytes_moved(shape, dtype), **dict.fromkeys(keys)}


def timing_plan(nbytes: int, timing: str = "rotate") -> tuple[int, int]:
    """(input sets, calls a timed replay runs) for a call moving ``nbytes``: "single" (1, 1);
    "rotate" at least 2 sets passing ``harness.ROTATE_BYTES`` together, and at least
    MIN_CALLS calls, a whole number of rounds over the sets."""
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {TIMINGS}, got {timing!r}")
    if timing == "single":
        return 1, 1
    sets = harness.rotation_sets(nbytes, min_sets=2)
    return sets, sets * -(-MIN_CALLS // sets)


def bench_shape(case: OpCase, shape: Shape, dtype: torch.dtype, compiled: Callable, copy_gbs: float,
                flush: torch.Tensor, done: Callable[[str], None] = lambda provider: None,
                timing: str = "rotate") -> list[dict]:
    """Check, then time, every provider of ``case`` on one shape; one record per provider.

    A provider that raises (a compile failure, Liger past its widths) gets its error string
    recorded and the run goes on. ``done(provider)`` is called after each provider. Outputs
    are checked on the first input set; ``timing`` as in ``timing_plan``.
    """
    device = torch.device("cuda")
    n_sets, n_calls = timing_plan(case.bytes_moved(shape, dtype), timing)
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    sets = [case.make_inputs(shape, dtype, device, gen) for _ in range(n_sets)]  # fresh data in each
    inputs = sets[0]
    ref = case.ref()
    builders = {  # provider -> (inputs -> zero-argument call)
        "eager": lambda t: (lambda: ref(*t)),
        "torch.compile": lambda t: (lambda: compiled(*t)),
        "liger": case.liger,
        "onetrip": lambda t: (lambda: case.fused(*t)),
    }
    records, eager_out = [], None
    for provider in providers_for(case):
        rec = _record(case, shape, dtype, provider)
        records.append(rec)
        try:
            fns = [builders[provider](t) for t in sets]
            out = _outputs(fns[0]())  # the first call compiles
            if provider == "eager":
                eager_out = out
            elif eager_out is not None:
                rec["max_diff_vs_eager"] = max_abs_diff(out, eager_out)
            if provider == "onetrip":
                rec.update({("check_report" if k == "report" else k): v
                            for k, v in check_accuracy(case, ref, inputs, out, shape.fields()["rows"]).items()})
            del out

            def replay(fns=fns):
                for i in range(n_calls):
                    fns[i % n_sets]()
            t = harness.per_call(harness.time_ms(replay, flush=flush), n_calls)
            rate = harness.gbs(rec["bytes"], t.median_ms)
            rec.update(median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms, graph=t.graph,
                       graph_error=t.graph_error, gbs=rate, pct_of_copy=100 * rate / copy_gbs, input_sets=n_sets,
                       calls=n_calls)
        except Exception as exc:  # noqa: BLE001 - recorded, the suite goes on
            rec["error"] = harness.error_string(exc)
        done(provider)
    add_speedup(records)
    from .floors import size_copy_gbs  # noqa: PLC0415 - Triton kernels: imported once the interpreter is chosen

    harness.attach_floor(records, size_copy_gbs(case.bytes_moved(shape, dtype), n_sets, n_calls, flush),
                         "size_copy_gbs", "pct_of_size_copy")
    return records


def add_speedup(records: list[dict]) -> None:
    """Set onetrip's speedup_vs_best_peer (fastest peer's median / onetrip's) and best_peer."""
    peers = [r for r in records if r["provider"] != "onetrip" and r["median_ms"]]
    for r in records:
        if r["provider"] == "onetrip" and r["median_ms"] and peers:
            best = min(peers, key=lambda p: p["median_ms"])
            r["speedup_vs_best_peer"], r["best_peer"] = best["median_ms"] / r["median_ms"], best["provider"]


def raise_recompile_limit(n: int = 64) -> None:
    """Static shapes recompile once per shape; the default limit (8) would fall back to eager."""
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), n))


TIMING_TEXT = {
    "rotate": ("median of 100 CUDA-graph replays, L2 flushed (by reading 256 MiB) before each; a replay runs "
               "`calls` calls back to back over `input_sets` copies of the inputs (>= 256 MiB together), "
               "times divided by `calls`"),
    "single": "median of 100 CUDA-graph replays of one call, L2 flushed (by reading 256 MiB) before each",
}


def run_ops_bench(ops: Sequence[str] | None, dtype: torch.dtype, out_dir: Path, quick: bool,
                  console=None, timing: str = "rotate") -> list[dict]:
    """Time the suite on the current CUDA device; write JSON, CSV and PNG under ``out_dir``.

    Files are named ``ops-<gpu>-<dtype>-<YYYYMMDD>.{json,csv,png}`` (``-single`` before the
    suffix with that timing, see the module docstring); JSON and CSV are
    rewritten after each op, so a run cut short keeps what it measured. Prints a table
    per op, the paths, and last one JSON line summarising the run for scripts.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import report

    console = console or report.console()
    cases = select(ops)
    missing = [c.name for c in cases if not onetrip_has(c)]
    cases = [c for c in cases if c.name not in missing]
    for name in missing:
        console.print(f"[yellow]skipped {name}: onetrip has no such op yet[/]")
    device = torch.device("cuda")
    meta = {**harness.device_info(device), "suite": "ops", "dtype": DTYPE_NAMES[dtype], "quick": quick,
            "timing": TIMING_TEXT[timing],
            "bytes": "each input read once + each output written once; 1 GB = 1e9 bytes"}
    meta["copy_gbs"] = harness.copy_bandwidth_gbs(device)
    console.print(f"{meta['gpu']}: copy bandwidth {meta['copy_gbs']:.0f} GB/s (read + write)")
    stem = Path(out_dir) / (f"ops-{harness.slug(meta['gpu'])}-{meta['dtype']}-{meta['date'][:10].replace('-', '')}"
                            + ("-single" if timing == "single" else ""))
    raise_recompile_limit()
    flush = harness.new_flush_buffer(device)
    records: list[dict] = []
    columns = (TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    total = sum(len(c.shapes(quick)) * len(providers_for(c)) for c in cases)
    with torch.inference_mode(), Progress(*columns, console=console) as progress:
        task = progress.add_task("ops", total=total)
        for case in cases:
            torch._dynamo.reset()  # one op's compiled graphs are not needed by the next
            compiled = torch.compile(case.ref(), dynamic=False)
            for shape in case.shapes(quick):
                progress.update(task, description=f"{case.name} {shape.label}")
                records += bench_shape(case, shape, dtype, compiled, meta["copy_gbs"], flush,
                                       lambda provider: progress.advance(task), timing)
            harness.write_results(records, meta, stem)
    json_path, csv_path = harness.write_results(records, meta, stem)
    png = harness.plot_gbs(records, meta, stem.with_suffix(".png")) if records else None
    for case in cases:
        report.print_op_table(console, records, case.name, providers_for(case))
    console.print(f"wrote {json_path}, {csv_path}" + (f", {png}" if png else ""))
    print(json.dumps(report.summary(records, meta, json_path, skipped=missing)), flush=True)
    return records


def run_ops_check(ops: Sequence[str] | None, dtype: torch.dtype, console=None) -> int:
    """Without a GPU: onetrip against its reference on small awkward shapes, by the accuracy rule.

    The kernels run through Triton's interpreter when TRITON_INTERPRET=1 was set before
    onetrip's ops were imported (the CLI does this). Returns 1 if any check failed, else 0.
    """
    from . import report

    console = console or report.console()
    rows = []
    for case in select(ops):
        if not onetrip_has(case):
            rows.append((case.name, "—", DTYPE_NAMES[dtype], None, None, "not written yet"))
            continue
        for shape in case.check_shapes:
            gen = torch.Generator().manual_seed(0)
            inputs = case.make_inputs(shape, dtype, torch.device("cpu"), gen)
            try:
                result = check_accuracy(case, case.ref(), inputs, _outputs(case.fused(*inputs)), shape.fields()["rows"])
            except Exception as exc:  # noqa: BLE001 - a crash is a failed check, shown in the table
                result = {"ok": False, "max_err": None, "bound": None, "report": harness.error_string(exc)}
            rows.append((case.name, shape.label, DTYPE_NAMES[dtype], result["max_err"], result["bound"],
                         "ok" if result["ok"] else f"FAIL {result['report']}"))
    return report.finish_check(console, rows, "ops-check", DTYPE_NAMES[dtype],
                               "onetrip's kernels were only checked against their references")
