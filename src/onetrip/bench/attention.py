"""The prefill-attention suite behind ``onetrip bench attention``: onetrip's ``flash_attention``
against PyTorch SDPA's backends and the naive reference, in TFLOP/s.

Cells (bf16 or fp16), every one 16K tokens:
    dense   batch x seq = 16384 and heads x head_dim = 2048, so 32 heads of 64 or 16 heads
            of 128 (the width of a 2K-wide model either way); seq 512, 1K, 2K, 4K, 8K, 16K
            (batch 32 .. 1), causal and not. Quick: seq 1K and 8K.
    gqa     32 query heads / 8 kv heads of 128, seq 4K, batch 4, causal.
    varlen  10 packed sequences of 7919 .. 1 tokens (16384 in all), 16 heads of 128, causal.

Metrics, per (cell, provider):
    flops   4 * seq_q * seq_k * heads * head_dim per sequence (Q K^T and P V, 2 FLOPs a
            multiply-add), summed over the batch or the varlen sequences; halved when causal
            (the usual convention, not the exact (seq + 1) / (2 seq)). kv heads do not enter.
    tflops  flops / median time / 1e12; time: ``harness.time_budgeted`` (a CUDA-graph
            replay on cold L2, median of up to 100 reps, fewer for calls over 20 ms).
    peak_extra_bytes  ``harness.peak_extra_bytes``: memory a call holds beyond its inputs,
            its output included (onetrip: the output; the reference: its score tensors).
    max_diff, ok  ``providers.add_diffs`` against SDPA's FlashAttention-2 output (or the
            first SDPA backend that ran): every provider gets a diff, so cuDNN's and the
            reference's show the noise level onetrip's is judged against.
    vs_fa2, vs_cudnn (onetrip's record)  onetrip TFLOP/s / that backend's: above 1, faster.

Providers, each on inputs prepared before timing in its own native layout:
    sdpa-flash, sdpa-cudnn, sdpa-efficient  F.scaled_dot_product_attention restricted by
            ``sdpa_kernel`` to one backend, on contiguous (batch, heads, seq, head_dim) copies:
            no transpose in the timed region. SDPA has no varlen entry, so on the varlen cell
            it runs once per sequence (each on its own copy), all calls in one CUDA graph.
    eager   ``attention_ref``: the scores materialized. Skipped when its estimated peak,
            EAGER_PEAK_SCORES score-sized tensors, exceeds half the free memory. Varlen: once
            per sequence, on views of the packed tensors.
    onetrip ``flash_attention`` on (batch, seq, heads, head_dim); varlen through cu_seqlens.

Nothing here imports onetrip's ops at import time, so the CLI can choose Triton's
interpreter first. Without a GPU, ``run_attention_check`` checks the kernel against the
reference on tiny cells instead.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from . import harness
from .cases import DTYPE_NAMES
from .providers import RECORD_KEYS, add_diffs, run_provider

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # the CLI's choices; the code also takes float32
SDPA_BACKENDS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION",
                 "sdpa-efficient": "EFFICIENT_ATTENTION"}
PROVIDERS = (*SDPA_BACKENDS, "eager", "onetrip")
TOKENS = 16384  # batch x seq of every cell
WIDTH = 2048  # heads x head_dim of the dense cells
HEAD_DIMS = (64, 128)
SEQS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_SEQS = (1024, 8192)
VARLEN_LENGTHS = (7919, 3001, 2048, 1500, 1024, 517, 256, 111, 7, 1)  # 16384; odd sizes, one of 1
# attention_ref holds about 6 score-sized tensors at once, in units of the input dtype: S,
# its float32 copy and logsumexp's float32 temporary (2 units each), the softmax output.
# An estimate on paper; peak_extra_bytes records the measured one.
EAGER_PEAK_SCORES = 6
STYLE = {
    "sdpa-flash": {"color": "#1f77b4", "marker": "s"},
    "sdpa-cudnn": {"color": "#9467bd", "marker": "^"},
    "sdpa-efficient": {"color": "#8c564b", "marker": "v"},
    "eager": {"color": harness.PROVIDER_STYLE["eager"][0], "marker": harness.PROVIDER_STYLE["eager"][1]},
    "onetrip": {"color": harness.PROVIDER_STYLE["onetrip"][0], "marker": harness.PROVIDER_STYLE["onetrip"][1]},
}


@dataclass(frozen=True)
class AttnCell:
    """One problem. Dense: q (batch, seq, heads, head_dim), k and v (batch, seq, kv_heads,
    head_dim). Varlen (``lengths`` given): packed (sum(lengths), heads, head_dim), with
    batch the number of sequences and seq the longest. kind: "dense", "gqa" or "varlen"."""

    kind: str
    batch: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    lengths: tuple[int, ...] = ()

    @property
    def seqlens(self) -> tuple[int, ...]:
        return self.lengths or (self.seq,) * self.batch

    @property
    def label(self) -> str:
        mask = "causal" if self.causal else "full"
        heads = f"H={self.heads}" + (f"/{self.kv_heads}" if self.kv_heads != self.heads else "")
        if self.lengths:
            return f"varlen {len(self.lengths)} seqs T={sum(self.lengths)} {heads} D={self.head_dim} {mask}"
        return f"D={self.head_dim} S={self.seq} B={self.batch} {heads} {mask}"

    def fields(self) -> dict:
        return {"cell": self.label, "kind": self.kind, "batch": self.batch, "seq": self.seq, "heads": self.heads,
                "kv_heads": self.kv_heads, "head_dim": self.head_dim, "causal": self.causal,
                "tokens": sum(self.seqlens)}


def flops(cell: AttnCell) -> int:
    """4 * L^2 * heads * head_dim summed over the sequences; halved when causal."""
    total = sum(4 * n * n * cell.heads * cell.head_dim for n in cell.seqlens)
    return total // 2 if cell.causal else total


def eager_peak_estimate(cell: AttnCell, dtype: torch.dtype) -> int:
    """EAGER_PEAK_SCORES x the scores of one ``attention_ref`` call, in bytes: the whole
    batch when dense, the longest sequence when varlen (the reference runs per sequence)."""
    n = max(cell.seqlens)
    return EAGER_PEAK_SCORES * cell.heads * n * n * dtype.itemsize * (1 if cell.lengths else cell.batch)


def cells(quick: bool = False) -> list[AttnCell]:
    """The timed cells: dense (head dim, seq, causal) in that order, then gqa and varlen."""
    out = [AttnCell("dense", TOKENS // s, s, WIDTH // d, WIDTH // d, d, causal)
           for d in HEAD_DIMS for s in (QUICK_SEQS if quick else SEQS) for causal in (False, True)]
    out.append(AttnCell("gqa", TOKENS // 4096, 4096, 32, 8, 128, True))
    n = WIDTH // 128
    out.append(AttnCell("varlen", len(VARLEN_LENGTHS), max(VARLEN_LENGTHS), n, n, 128, True, VARLEN_LENGTHS))
    return out


CHECK_CELLS = (  # tiny and awkward, for the interpreter: 17 and 33 tokens, a sequence of 1
    AttnCell("dense", 2, 17, 4, 4, 16, False),
    AttnCell("dense", 2, 17, 4, 4, 16, True),
    AttnCell("gqa", 1, 33, 4, 2, 32, True),
    AttnCell("varlen", 4, 40, 2, 2, 16, True, (17, 1, 40, 5)),
)


def make_inputs(cell: AttnCell, dtype: torch.dtype, device, gen: torch.Generator):
    """q, k, v of unit-normal values in onetrip's layout (see AttnCell)."""
    lead = (sum(cell.lengths),) if cell.lengths else (cell.batch, cell.seq)
    return tuple(torch.randn((*lead, h, cell.head_dim), generator=gen, device=device, dtype=dtype)
                 for h in (cell.heads, cell.kv_heads, cell.kv_heads))


def spans(cell: AttnCell) -> list[tuple[int, int]]:
    """(start, end) of each varlen sequence in the packed tokens."""
    ends = list(itertools.accumulate(cell.lengths))
    return list(zip([0, *ends[:-1]], ends))


# ---------------------------------------------------------------------------- providers


def _sdpa(backend: str):
    def build(cell: AttnCell, q, k, v):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = getattr(SDPBackend, backend)
        # is_causal is top-left aligned in SDPA, bottom-right in onetrip: the same when seq_q == seq_k.
        kw = {"is_causal": cell.causal, "enable_gqa": cell.kv_heads != cell.heads}
        if cell.lengths:
            seqs = [tuple(t[a:b].transpose(0, 1).unsqueeze(0).contiguous() for t in (q, k, v)) for a, b in spans(cell)]

            def call():
                with sdpa_kernel(chosen):
                    return [F.scaled_dot_product_attention(*s, **kw) for s in seqs]

            return call, lambda outs: torch.cat([o[0].transpose(0, 1) for o in outs])
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # (batch, heads, seq, head_dim)

        def call():
            with sdpa_kernel(chosen):
                return F.scaled_dot_product_attention(qt, kt, vt, **kw)

        return call, lambda o: o.transpose(1, 2)

    return build


def _eager(cell: AttnCell, q, k, v):
    from onetrip.ops import attention_ref

    if cell.lengths:  # per sequence: attention_ref's own varlen path reads cu_seqlens on the host
        parts = [(q[None, a:b], k[None, a:b], v[None, a:b]) for a, b in spans(cell)]
        return (lambda: [attention_ref(*p, causal=cell.causal) for p in parts]), lambda outs: torch.cat(
            [o[0] for o in outs])
    return (lambda: attention_ref(q, k, v, causal=cell.causal)), lambda o: o


def _onetrip(cell: AttnCell, q, k, v):
    from onetrip.ops import flash_attention

    if cell.lengths:
        cu = torch.tensor([0, *itertools.accumulate(cell.lengths)], dtype=torch.int32, device=q.device)
        n = max(cell.lengths)
        return (lambda: flash_attention(q, k, v, causal=cell.causal, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                        max_seqlen_q=n, max_seqlen_k=n)), lambda o: o
    return (lambda: flash_attention(q, k, v, causal=cell.causal)), lambda o: o


BUILDERS = {**{name: _sdpa(backend) for name, backend in SDPA_BACKENDS.items()}, "eager": _eager, "onetrip": _onetrip}


def bench_cell(cell: AttnCell, dtype: torch.dtype, device, timer: Callable, free: Callable[[], int] | None = None,
               done: Callable[[str], None] = lambda provider: None) -> list[dict]:
    """Run, compare and time every provider on one cell; one record per provider.

    timer(call) -> harness.Timing; free() -> bytes still allocatable (default: the
    device's, ``harness.free_bytes``). ``done(provider)`` is called after each provider.
    """
    device = torch.device(device)
    free = free or (lambda: harness.free_bytes(device))
    q, k, v = make_inputs(cell, dtype, device, torch.Generator(device=device).manual_seed(0))
    records, outs = [], {}
    for provider in PROVIDERS:
        rec = {**cell.fields(), "dtype": DTYPE_NAMES[dtype], "provider": provider, "flops": flops(cell),
               **dict.fromkeys((*RECORD_KEYS, "tflops", "vs_fa2", "vs_cudnn"))}
        records.append(rec)
        if provider == "eager" and eager_peak_estimate(cell, dtype) > free() / 2:
            rec["skipped"] = (f"too big: its scores need ~{eager_peak_estimate(cell, dtype) / 2**30:.1f} GiB, "
                              f"over half the free {free() / 2**30:.1f} GiB")
        else:
            out = run_provider(rec, lambda: BUILDERS[provider](cell, q, k, v), timer, device)
            if out is not None:
                outs[provider] = out
            if rec["median_ms"]:
                rec["tflops"] = rec["flops"] / (rec["median_ms"] * 1e9)
        done(provider)
    add_diffs(records, outs, dtype, (*SDPA_BACKENDS, "eager"))
    by = {r["provider"]: r for r in records}
    for peer, key in (("sdpa-flash", "vs_fa2"), ("sdpa-cudnn", "vs_cudnn")):
        if by["onetrip"]["tflops"] and by[peer]["tflops"]:
            by["onetrip"][key] = by["onetrip"]["tflops"] / by[peer]["tflops"]
    return records


# ---------------------------------------------------------------------------- runs


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, digits)


def summary(records: list[dict], meta: dict, json_path) -> dict:
    """The one JSON line: per cell onetrip's TFLOP/s, its ratio to FA2 and to cuDNN, its
    max_diff and ok; the geometric mean and minimum of each ratio over the cells."""
    mine = [r for r in records if r["provider"] == "onetrip"]
    line = {"bench": "attention", "gpu": meta.get("gpu"), "dtype": meta.get("dtype"), "results": str(json_path),
            "cells": {r["cell"]: {"tflops": _round(r["tflops"], 1), "vs_fa2": _round(r["vs_fa2"], 3),
                                  "vs_cudnn": _round(r["vs_cudnn"], 3), "max_diff": _round(r["max_diff"], 5),
                                  "ok": r["ok"]} for r in mine}}
    for key in ("vs_fa2", "vs_cudnn"):
        vals = [r[key] for r in mine if r[key]]
        line[f"{key}_geomean"] = _round(_geomean(vals), 3)
        line[f"{key}_min"] = _round(min(vals, default=None), 3)
    line["checks_failed"] = sum(r["ok"] is False for r in mine)
    line["onetrip_errors"] = sum(bool(r["error"]) for r in mine)
    return line


def plot(records: list[dict], meta: dict, path: Path) -> Path:
    """TFLOP/s against seq, one panel per (head dim, causal), one line per provider; gqa
    and varlen as categories in a last panel."""
    def panel(r):
        if r["kind"] != "dense":
            return "GQA and varlen"
        return f"head_dim {r['head_dim']}, {'causal' if r['causal'] else 'not causal'}"

    return harness.plot_lines(
        records, path, panel=panel, x=lambda r: r["seq"] if r["kind"] == "dense" else r["kind"], y="tflops",
        series=lambda r: r["provider"], style=lambda p: STYLE.get(p, {"marker": "x"}), ylabel="TFLOP/s",
        title=f"attention · {meta.get('gpu', '?')} · {meta.get('dtype', '?')} · {str(meta.get('date', ''))[:10]}")


def run_attention_bench(dtype: torch.dtype, out_dir: Path, quick: bool, console=None) -> list[dict]:
    """Time the suite on the current CUDA device; write ``attention-<gpu>-<dtype>-<YYYYMMDD>``
    .json, .csv (rewritten after each cell) and .png under ``out_dir``; print the table and
    last one JSON summary line."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import report

    console = console or report.console()
    device = torch.device("cuda")
    meta = {**harness.device_info(device), "suite": "attention", "dtype": DTYPE_NAMES[dtype], "quick": quick,
            "timing": "median CUDA-graph replay, L2 flushed before each; up to 100 reps, ~2 s per provider",
            "flops": "4 * seq_q * seq_k * heads * head_dim per sequence, halved when causal",
            "layouts": "SDPA on (batch, heads, seq, head_dim) copies made before timing; eager and onetrip on "
                       "(batch, seq, heads, head_dim)",
            "varlen_sdpa": "one SDPA call per sequence (SDPA has no varlen entry), all in one CUDA graph"}
    stem = Path(out_dir) / f"attention-{harness.slug(meta['gpu'])}-{meta['dtype']}-{meta['date'][:10].replace('-', '')}"
    flush = harness.new_flush_buffer(device)
    records: list[dict] = []
    todo = cells(quick)
    columns = (TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with torch.inference_mode(), Progress(*columns, console=console) as progress:
        task = progress.add_task("attention", total=len(todo) * len(PROVIDERS))
        for cell in todo:
            progress.update(task, description=cell.label)
            records += bench_cell(cell, dtype, device, lambda fn: harness.time_budgeted(fn, flush=flush),
                                  done=lambda provider: progress.advance(task))
            harness.write_results(records, meta, stem)
            torch.cuda.empty_cache()
    json_path, csv_path = harness.write_results(records, meta, stem)
    png = plot(records, meta, stem.with_suffix(".png"))
    report.print_attention_table(console, records, PROVIDERS)
    console.print(f"wrote {json_path}, {csv_path}, {png}")
    print(json.dumps(summary(records, meta, json_path)), flush=True)
    return records


def _reference(cell: AttnCell, q, k, v):
    from onetrip.ops import attention_ref

    if not cell.lengths:
        return attention_ref(q, k, v, causal=cell.causal)
    cu = torch.tensor([0, *itertools.accumulate(cell.lengths)], dtype=torch.int32)
    return attention_ref(q, k, v, causal=cell.causal, cu_seqlens_q=cu, cu_seqlens_k=cu)


def run_attention_check(dtype: torch.dtype, console=None) -> int:
    """Without a GPU: ``flash_attention`` on CHECK_CELLS against the accuracy rule of
    ``onetrip.testing`` (float64 reference; bound from PyTorch's own error in ``dtype``),
    through Triton's interpreter. Prints a table and one JSON line; 1 if a check failed."""
    from onetrip.testing import error_report, upcast

    from . import report

    console = console or report.console()
    rows = []
    for cell in CHECK_CELLS:
        q, k, v = make_inputs(cell, dtype, "cpu", torch.Generator().manual_seed(0))
        try:
            call, _ = _onetrip(cell, q, k, v)
            rep = error_report(f"flash_attention {cell.label}", call(), _reference(cell, *upcast(q, k, v)),
                               _reference(cell, q, k, v))
            row = (rep.max_err, rep.bound, "ok" if rep.ok else f"FAIL {rep}")
        except Exception as exc:  # noqa: BLE001 - a crash is a failed check, shown in the table
            row = (None, None, f"FAIL {harness.error_string(exc)}")
        rows.append(("flash_attention", cell.label, DTYPE_NAMES[dtype], *row))
    return report.finish_check(console, rows, "attention-check", DTYPE_NAMES[dtype],
                               "onetrip's flash_attention was only checked against its reference")


__all__ = ["AttnCell", "CHECK_CELLS", "DTYPES", "PROVIDERS", "bench_cell", "cells", "eager_peak_estimate", "flops",
           "plot", "run_attention_bench", "run_attention_check", "summary"]
