"""What the norm experiments share (norm_cluster, norm_stream, norm_wbheld, norm_wb): one
variant checked against the library's output, timed over its input sets, printed and
recorded; and the two ways they time (GPU runs only)."""

from __future__ import annotations

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
