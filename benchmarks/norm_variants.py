"""What the norm experiments share (norm_cluster, norm_stream, norm_wbheld, norm_wb,
norm_fetch, norm_fetch_res): one variant checked against the library's output, timed over
its input sets, printed and recorded; the two ways they time; and the main loop of the
row-shape experiments (GPU runs only)."""

from __future__ import annotations

import json
from typing import Callable, Sequence

import torch


def graph_ms(calls: Sequence[Callable[[], object]], flush: torch.Tensor) -> float:
    """ms a call: one CUDA graph of all the calls, after an L2 flush (``sweep_gemv.time_per_call``)."""
    from sweep_gemv import time_per_call  # noqa: PLC0415

    return time_per_call(list(calls), flush)


def bench_ms(calls: Sequence[Callable[[], object]], flush: torch.Tensor, n_calls: int) -> float:
    """ms a call as ``onetrip bench ops`` times it: ``n_calls`` back to back over the calls (one
    a set of inputs; ``bench.ops.timing_plan`` gives both numbers), after an L2 flush."""
    from onetrip.bench import harness  # noqa: PLC0415

    def replay():
        for i in range(n_calls):
            calls[i % len(calls)]()
    return harness.per_call(harness.time_ms(replay, flush=flush), n_calls).median_ms


def run_variant(res: dict, fields: dict, fn: Callable, sets: Sequence[tuple], out: torch.Tensor,
                ref: torch.Tensor | None, nbytes: int, copy: float,
                time_ms: Callable[[Sequence[Callable[[], object]]], float]) -> dict:
    """``fn(*s)`` for each s in ``sets`` is one call of the variant; ``out`` is what
    ``fn(*sets[0])`` writes: poisoned, then compared with ``ref`` (the library's output;
    None: not checked). Timed by ``time_ms`` over one call a set; the row (``fields`` and
    us, pct_of_copy, max_err_vs_library, or the error) is printed and appended to
    ``res["rows"]``. Errors are recorded, not raised."""
    row = dict(fields)
    try:
        if ref is not None:
            out.fill_(float("nan"))
            fn(*sets[0])
            torch.cuda.synchronize()
            row["max_err_vs_library"] = (out.float() - ref.float()).abs().max().item()
        us = 1e3 * time_ms([lambda s=s: fn(*s) for s in sets])
        row.update(us=us, pct_of_copy=100 * nbytes / (us * 1e3) / copy)
        err = f"  err {row['max_err_vs_library']:.3g}" if ref is not None else ""
        print(f"{row['op']:10s} {row['rows']:4d} x {row['width']:6d} {row['variant']:40s} {us:8.2f} us "
              f"{row['pct_of_copy']:5.1f}%{err}", flush=True)
    except Exception as exc:  # noqa: BLE001 - recorded
        row["error"] = repr(exc)[:300]
        print(f"{row['op']} {row['rows']} x {row['width']} {row['variant']}: {exc!r}"[:300], flush=True)
    res["rows"].append(row)
    return row


def rows_main(shapes: Sequence[tuple[int, int]], make_variants: Callable, out_name: str,
              residual: bool = False) -> int:
    """An experiment's main over (rows, width) ``shapes``, RMSNorm then LayerNorm at each
    (with ``residual``: add_rms_norm, add_layer_norm): bf16 inputs in as many sets as the
    ops bench rotates, the library's pick, ``make_variants(rows, width, is_rms, w, b, eps)``
    (a list of (label, fn); fn takes a set: (x, y), or (x, r, y, h) with a residual), the
    pick again (the run's drift); every row to ``--out``/``out_name`` after each shape."""
    from gemv_chain import chain_setup  # noqa: PLC0415

    from onetrip.bench.ops import timing_plan  # noqa: PLC0415
    from onetrip.ops import norm  # noqa: PLC0415

    args, copy, flush, res = chain_setup()
    dev, dt = torch.device("cuda"), torch.bfloat16
    print(f"copy {copy:.0f} GB/s", flush=True)
    for (rows, width), is_rms in [(s, k) for s in shapes for k in (True, False)]:
        name = ("add_" if residual else "") + ("rms_norm" if is_rms else "layer_norm")
        nbytes = (4 if residual else 2) * rows * width * 2
        n_sets, n_calls = timing_plan(nbytes)  # as the ops bench times
        if residual:
            sets = [tuple(torch.randn(rows, width, device=dev).to(dt) for _ in range(4)) for _ in range(n_sets)]
        else:
            sets = [(torch.randn(rows, width, device=dev).mul_(2).add_(0.5).to(dt),) for _ in range(n_sets)]
            sets = [(x, torch.empty_like(x)) for (x,) in sets]
        w = torch.randn(width, device=dev).to(dt)
        b = None if is_rms else torch.randn(width, device=dev).to(dt)
        eps = 1e-6 if is_rms else 1e-5
        x0, r0 = sets[0][0], (sets[0][1] if residual else None)

        def pick(x, *rest):
            r, y, h = rest if residual else (None, rest[0], None)
            if is_rms:
                return norm.add_rms_norm(x, r, w, eps, out=y, residual_out=h)
            return norm.add_layer_norm(x, r, w, b, eps, out=y, residual_out=h)
        ref = (norm.add_rms_norm(x0, r0, w, eps) if is_rms else norm.add_layer_norm(x0, r0, w, b, eps))[0]
        variants = [("library pick", pick), *make_variants(rows, width, is_rms, w, b, eps),
                    ("library pick (again)", pick)]
        out = sets[0][2 if residual else 1]
        for label, fn in variants:
            run_variant(res, {"op": name, "rows": rows, "width": width, "variant": label}, fn, sets, out, ref,
                        nbytes, copy, lambda calls: bench_ms(calls, flush, n_calls))
        del sets
        torch.cuda.empty_cache()
        (args.out / out_name).write_text(json.dumps(res, indent=1))
    return 0
