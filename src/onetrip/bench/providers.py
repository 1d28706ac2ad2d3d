"""What the attention suites share: running one provider on one cell, and judging outputs.

A provider is a builder returning ``(call, common)``: ``call()`` is the zero-argument call
that gets timed (its inputs prepared by the builder, outside the timed region), and
``common(result)`` puts its first result into one layout shared by all providers, for
the comparison. A builder raises ``NotApplicable`` when the provider has no way to run the
cell (SDPA on a paged cache); that is recorded as ``skipped``, where any other exception
is recorded as ``error``. Either way the suite goes on.

Record keys filled here: median_ms, p20_ms, p80_ms, graph, graph_error (``harness.Timing``),
peak_extra_bytes (``harness.peak_extra_bytes``), max_diff, diff_base, ok, skipped, error.
"""

from __future__ import annotations

import warnings
from typing import Callable, Sequence

import torch

from . import harness

TIMING_KEYS = ("median_ms", "p20_ms", "p80_ms", "graph", "graph_error")
RECORD_KEYS = (*TIMING_KEYS, "peak_extra_bytes", "max_diff", "diff_base", "ok", "skipped", "error")
OK_FLOOR_ULPS = 4  # see add_diffs


class NotApplicable(Exception):
    """Raised by a builder when its provider cannot express the cell at all (recorded as skipped)."""


def _hint(caught: list[warnings.WarningMessage]) -> str:
    """SDPA says why a backend declined in warnings before it raises 'No available kernel'."""
    msgs = list(dict.fromkeys(str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()))
    return f" ({'; '.join(msgs)[:300]})" if msgs else ""


def run_provider(rec: dict, build: Callable[[], tuple], timer: Callable, device: torch.device) -> object | None:
    """Build the call, run it once (compiling), measure its peak extra memory, then time it.

    ``timer(call)`` returns a ``harness.Timing``. Fills ``rec`` in place; returns the first
    call's result passed through ``common``, or None when the provider did not run.
    """
    out = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call, common = build()
            out = common(call())
            _, rec["peak_extra_bytes"] = harness.peak_extra_bytes(call, device)
            if device.type == "cuda":  # the graph's private pool then gets memory without freeing mid-capture
                torch.cuda.empty_cache()
            t = timer(call)
            rec.update(zip(TIMING_KEYS, (t.median_ms, t.p20_ms, t.p80_ms, t.graph, t.graph_error)))
        except NotApplicable as exc:
            rec["skipped"] = f"n/a: {exc}"
        except Exception as exc:  # noqa: BLE001 - recorded, the suite goes on
            rec["error"] = harness.error_string(exc) + _hint(caught)
    return out


def _tensors(out) -> tuple[torch.Tensor, ...]:
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


def add_diffs(records: list[dict], outs: dict[str, object], dtype: torch.dtype, base_order: Sequence[str]) -> None:
    """Set every provider's max_diff against a base output, and onetrip's ok.

    base: the first provider of ``base_order`` that produced an output. max_diff = max
    |out - base| over all output tensors, in float32. The peers' own differences from the
    base are the noise level, so onetrip is ok when

        max_diff <= 2 * (largest peer max_diff) + OK_FLOOR_ULPS * eps(dtype) * max |base|

    (the floor matters when the base is the only peer). A sanity check on the benchmark's
    inputs, not the accuracy rule of the tests (that one needs a float64 reference).
    """
    from .ops import max_abs_diff

    base = next((p for p in base_order if p in outs), None)
    if base is None:
        return
    ref = _tensors(outs[base])
    for r in records:
        if r["provider"] in outs:
            r["max_diff"], r["diff_base"] = max_abs_diff(_tensors(outs[r["provider"]]), ref), base
    noise = max((r["max_diff"] for r in records if r["provider"] not in ("onetrip", base) and r["max_diff"] is not None),
                default=0.0)
    scale = max(float(t.abs().max()) if t.numel() else 0.0 for t in ref)
    bound = 2 * noise + OK_FLOOR_ULPS * torch.finfo(dtype).eps * scale
    for r in records:
        if r["provider"] == "onetrip" and r["max_diff"] is not None:
            r["ok"] = bool(r["max_diff"] <= bound)
