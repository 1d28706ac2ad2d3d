"""``onetrip bench decode-attention`` without a GPU: onetrip's ``decode_attention`` and
``append_kv`` (through Triton's interpreter) and the suite's naive versions on
``decode_attn.CHECK_CELLS``, against the accuracy rule of ``onetrip.testing``."""

from __future__ import annotations

import math

import torch

from . import harness
from .cases import DTYPE_NAMES
from .decode_attn import CHECK_CELLS, DTYPE, DecodeCell, _append_args, make_inputs
from .decode_naive import naive_append_kv, naive_decode


def _check(cell: DecodeCell, dtype: torch.dtype) -> list[tuple[str, object]]:
    """(name, worst ErrorReport) for onetrip's op and the suite's naive version on one check cell."""
    from onetrip.ops import append_kv, append_kv_ref, decode_attention, decode_attention_ref
    from onetrip.testing import error_report, upcast

    t = make_inputs(cell, dtype, "cpu", torch.Generator().manual_seed(0))
    if cell.kind == "decode":
        args = tuple(t[n] for n in ("q", "k_cache", "v_cache", "cache_seqlens", "block_table"))
        exact, torch_out = (decode_attention_ref(*upcast(*args)),), (decode_attention_ref(*args),)
        ours = {"decode_attention": (decode_attention(*args[:4], block_table=args[4]),),
                "naive_decode (bench eager)": (naive_decode(*args),)}
    else:
        args = _append_args(t, t["q"])
        exact, torch_out = append_kv_ref(*upcast(*args)), append_kv_ref(*args)
        fresh = lambda: (t["q"].clone(), *args[1:3], t["k_cache"].clone(), t["v_cache"].clone(), *args[5:])
        a = fresh()
        append_kv(*a[:8], block_table=a[8])
        b = fresh()
        ours = {"append_kv": (a[0], a[3], a[4]), "naive_append_kv (bench eager)": (naive_append_kv(*b), b[3], b[4])}
    results = []
    for name, outs in ours.items():
        reports = [error_report(f"{name}[{i}]", o, e, r) for i, (o, e, r) in enumerate(zip(outs, exact, torch_out))]
        results.append((name, max(reports, key=lambda r: math.inf if not r.ok else r.max_err / r.bound)))
    return results


def run_decode_check(console=None, dtype: torch.dtype = DTYPE) -> int:
    """Without a GPU: ``decode_attention`` and ``append_kv`` (through Triton's interpreter)
    and the suite's naive versions on CHECK_CELLS, against the accuracy rule of
    ``onetrip.testing``. Prints a table and one JSON line; 1 if a check failed."""
    from . import report

    console = console or report.console()
    rows = []
    for cell in CHECK_CELLS:
        try:
            results = [(name, rep.max_err, rep.bound, "ok" if rep.ok else f"FAIL {rep}")
                       for name, rep in _check(cell, dtype)]
        except Exception as exc:  # noqa: BLE001 - a crash is a failed check, shown in the table
            results = [(cell.kind, None, None, f"FAIL {harness.error_string(exc)}")]
        for name, err, bound, verdict in results:
            rows.append((name, cell.label, DTYPE_NAMES[dtype], err, bound, verdict))
    return report.finish_check(console, rows, "decode-attention-check", DTYPE_NAMES[dtype],
                               "onetrip's decode_attention and append_kv were only checked against their references")
