"""The decode suite behind ``onetrip bench decode-attention``: onetrip's ``decode_attention`` and
``append_kv`` against SDPA and a naive eager version, in GB/s and % of the copy bandwidth.

Decode cells: batch 1, 4, 16, 64 x context 1K, 8K, 32K, 128K, plus batch 1 x 4K (the
issue's batch-1 bar); 32 query heads / 8 kv heads of 128, bf16, one new token per
sequence, every sequence holding ``context`` tokens (cache_seqlens = context, so SDPA
needs no mask). Cache layouts: contiguous (batch, context, kv_heads, head_dim) and paged
(num_blocks, block_size, kv_heads, head_dim) with block sizes 64 (the default) and 256,
the pages handed out in a random order. A cell whose K and V (64 x 128K: 32 GiB) would
need more than MEMORY_SHARE of the free memory is skipped. Quick: 3 cells x 2 layouts.

Metrics, per (cell, provider):
    bytes   what decode must move: K and V of the cache_seqlens tokens, each read once
            (2 x sum(cache_seqlens) x kv_heads x head_dim x 2 bytes), q read and out written
            (batch x heads x head_dim x 2 bytes each). The block table and the lengths
            (4 bytes a page and a sequence) are left out. 1 GB = 1e9 bytes.
    gbs, pct_of_copy  bytes / median time (``harness.time_budgeted``: CUDA-graph replay,
            cold L2), and its % of the device-to-device copy bandwidth measured in the run.
            A cell whose cache is under 256 MiB is timed as one graph of ``input_sets``
            calls on as many copies of its inputs, divided by that count: a single small
            call would time the graph's launch more than the kernel, and a decode step
            runs these back to back, one cache per layer.
    peak_extra_bytes  memory a call holds beyond its inputs, output included: a copy of
            the cache made inside a call shows up here at the cache's size.
    num_splits, block_n, num_warps  onetrip's launch, from ``decode_config``.
    read_gbs, pct_of_read  (decode cells, every record) what a plain kernel reading the cell's
            K and V caches once reaches, timed the same way (``floors.read_gbs``), and the
            record's GB/s against it: the ceiling of a cell too short to reach the copy
            bandwidth (batch 1 x 4K: 16.8 MB, a few microseconds).
    max_diff, ok  ``providers.add_diffs`` against SDPA (contiguous) or eager (paged).
    speedup_vs_best_peer  fastest peer's median time / onetrip's (``ops.add_speedup``).

Providers:
    sdpa     F.scaled_dot_product_attention(enable_gqa=True), backend chosen by PyTorch, on
             transposed views made before timing: q (B, 1, H, D) -> (B, H, 1, D), caches
             (B, S, KVH, D) -> (B, KVH, S, D). Nothing is copied outside the call; whether
             SDPA copies inside shows in peak_extra_bytes. Paged: n/a (no paged entry).
    eager    ``naive_decode``: matmul, softmax, matmul with q grouped as (B, KVH, group, D),
             so GQA needs no repeated K and V; paged caches are gathered first.
    onetrip  ``decode_attention``.

append_kv rows (contiguous and paged-64): batch 1, 4, 16, 64 with one new token each, and
batch 64 x 64 tokens (a prefill chunk), written at the end of a 4K-token cache.
    bytes    q read and written, k and v read and written into the cache: 2 x (heads + 2 x
             kv_heads) x head_dim x 2 bytes a token; plus the cos and sin rows, 2 x 64
             float32 a token.
    eager    ``naive_append_kv``: ``apply_rotary_ref``, then ``index_copy_`` of k and v into
             the cache viewed as (slots, kv_heads, head_dim); returns q rotated out of place.
    onetrip  ``append_kv`` (q rotated in place: it gets its own copy of q).

The issue's bars (in the summary): >= 90% of copy where batch x context >= 64K tokens,
>= 75% at batch 1 with 4K context, append_kv >= 80% (judged on rows moving >= 64 MiB:
a decode step's append moves 25 KB a sequence, microseconds, bound by launch latency).
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from . import harness
from .cases import DTYPE_NAMES
from .decode_naive import naive_append_kv, naive_decode, slots
from .providers import RECORD_KEYS, NotApplicable, add_diffs, run_provider

DTYPE = torch.bfloat16
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
BATCHES = (1, 4, 16, 64)
CONTEXTS = (1024, 8192, 32768, 131072)
EXTRA_CELLS = ((1, 4096),)
QUICK_CELLS = ((1, 4096), (4, 32768), (64, 8192))
LAYOUTS = ("contiguous", "paged-64", "paged-256")
QUICK_LAYOUTS = ("contiguous", "paged-64")
APPEND_CELLS = ((1, 1), (4, 1), (16, 1), (64, 1), (64, 64))  # (batch, new tokens a sequence)
QUICK_APPEND_CELLS = ((1, 1), (64, 1), (64, 64))
APPEND_LAYOUTS = ("contiguous", "paged-64")
APPEND_CONTEXT = 4096
PROVIDERS = ("sdpa", "eager", "onetrip")
APPEND_PROVIDERS = ("eager", "onetrip")
BIG_TOKENS = 64 * 1024  # the 90% bar applies where batch x context >= this
BIG_APPEND_BYTES = 64 << 20
MEMORY_SHARE = 0.8  # a cell's caches, or the eager copies, may take this share of the free memory
BARS = {"decode_big": 90.0, "decode_batch1_4k": 75.0, "append_kv": 80.0}
STYLE = {"sdpa": {"color": "#1f77b4", "marker": "s"},
         "eager": {"color": harness.PROVIDER_STYLE["eager"][0], "marker": "o"},
         "onetrip": {"color": harness.PROVIDER_STYLE["onetrip"][0], "marker": "D"}}
LINESTYLE = {"contiguous": "-", "paged-64": "--", "paged-256": ":"}


@dataclass(frozen=True)
class DecodeCell:
    """kind "decode": one new token a sequence over ``context`` cached tokens (or over
    ``lengths``, each <= context, when given). kind "append_kv": ``q_len`` new tokens a
    sequence written at the end of a ``context``-slot cache. layout: "contiguous" or
    "paged-<block size>"."""

    kind: str
    layout: str
    batch: int
    context: int
    q_len: int = 1
    heads: int = HEADS
    kv_heads: int = KV_HEADS
    head_dim: int = HEAD_DIM
    lengths: tuple[int, ...] = ()

    @property
    def page(self) -> int | None:
        return int(self.layout.split("-")[1]) if self.layout.startswith("paged-") else None

    @property
    def max_seq(self) -> int:
        """Cache slots a sequence: context rounded up to whole pages."""
        return self.context if self.page is None else math.ceil(self.context / self.page) * self.page

    @property
    def seqlens(self) -> tuple[int, ...]:
        """cache_seqlens: with the new token for decode, before the new tokens for append_kv."""
        if self.kind == "append_kv":
            return (self.context - self.q_len,) * self.batch
        return self.lengths or (self.context,) * self.batch

    @property
    def tokens(self) -> int:
        return self.batch * (self.q_len if self.kind == "append_kv" else self.context)

    @property
    def label(self) -> str:
        shape = "" if (self.heads, self.kv_heads, self.head_dim) == (HEADS, KV_HEADS, HEAD_DIM) else \
            f" H={self.heads}/{self.kv_heads} D={self.head_dim}"
        if self.kind == "append_kv":
            return f"append B={self.batch} new={self.q_len} {self.layout}{shape}"
        ctx = f"L={'/'.join(map(str, self.lengths))}" if self.lengths else f"ctx={harness.width_label(self.context)}"
        return f"B={self.batch} {ctx} {self.layout}{shape}"

    def fields(self) -> dict:
        return {"cell": self.label, "kind": self.kind, "layout": self.layout, "batch": self.batch,
                "context": self.context, "q_len": self.q_len, "tokens": self.tokens, "heads": self.heads,
                "kv_heads": self.kv_heads, "head_dim": self.head_dim}


def decode_bytes(cell: DecodeCell, dtype: torch.dtype = DTYPE) -> int:
    """K and V of the cache_seqlens tokens read once, q read, out written."""
    kv = 2 * sum(cell.seqlens) * cell.kv_heads * cell.head_dim
    return (kv + 2 * cell.batch * cell.q_len * cell.heads * cell.head_dim) * dtype.itemsize


def append_bytes(cell: DecodeCell, dtype: torch.dtype = DTYPE) -> int:
    """q read and written, k and v read and written, cos and sin rows (float32) read."""
    per_token = 2 * (cell.heads + 2 * cell.kv_heads) * cell.head_dim * dtype.itemsize + 2 * (cell.head_dim // 2) * 4
    return cell.batch * cell.q_len * per_token


def cache_bytes(cell: DecodeCell, dtype: torch.dtype = DTYPE) -> int:
    """K and V caches as allocated (every slot, whole pages)."""
    return 2 * cell.batch * cell.max_seq * cell.kv_heads * cell.head_dim * dtype.itemsize


def eager_extra_estimate(cell: DecodeCell, dtype: torch.dtype = DTYPE) -> int:
    """naive_decode's matmuls copy the transposed K and V views (one cache size), after a
    gather through the page table when paged (another); plus float32 scores."""
    return cache_bytes(cell, dtype) * (2 if cell.page else 1) + 3 * cell.batch * cell.heads * cell.max_seq * 4


def decode_cells(quick: bool = False) -> list[DecodeCell]:
    """By layout, then (batch, context)."""
    pairs = QUICK_CELLS if quick else sorted({(b, c) for b in BATCHES for c in CONTEXTS} | set(EXTRA_CELLS))
    return [DecodeCell("decode", layout, b, c) for layout in (QUICK_LAYOUTS if quick else LAYOUTS) for b, c in pairs]


def append_cells(quick: bool = False) -> list[DecodeCell]:
    return [DecodeCell("append_kv", layout, b, APPEND_CONTEXT, q_len=n)
            for layout in APPEND_LAYOUTS for b, n in (QUICK_APPEND_CELLS if quick else APPEND_CELLS)]


_TINY = {"heads": 4, "kv_heads": 2, "head_dim": 32}
CHECK_CELLS = (  # for the interpreter: lengths 1, 37, 100 in one batch; pages of 16
    DecodeCell("decode", "contiguous", 3, 100, lengths=(1, 37, 100), **_TINY),
    DecodeCell("decode", "paged-16", 3, 100, lengths=(1, 37, 100), **_TINY),
    DecodeCell("append_kv", "contiguous", 2, 40, q_len=3, **_TINY),
    DecodeCell("append_kv", "paged-16", 2, 40, q_len=3, **_TINY),
)


def make_inputs(cell: DecodeCell, dtype: torch.dtype, device, gen: torch.Generator) -> dict:
    """q, k_cache, v_cache (every slot random), cache_seqlens (int32), block_table (int32,
    a random permutation of the blocks) or None; for append_kv also the new k and v and
    rotary tables cos, sin (max_seq, head_dim / 2) float32."""
    B, D = cell.batch, cell.head_dim
    randn = lambda *shape: torch.randn(shape, generator=gen, device=device, dtype=dtype)
    table = None
    if cell.page is None:
        cache_shape = (B, cell.max_seq, cell.kv_heads, D)
    else:
        n = cell.max_seq // cell.page
        cache_shape = (B * n, cell.page, cell.kv_heads, D)
        table = torch.randperm(B * n, generator=gen, device=device).to(torch.int32).view(B, n)
    t = {"q": randn(B, cell.q_len, cell.heads, D), "k_cache": randn(*cache_shape), "v_cache": randn(*cache_shape),
         "cache_seqlens": torch.tensor(cell.seqlens, dtype=torch.int32, device=device), "block_table": table}
    if cell.kind == "append_kv":
        t["k"], t["v"] = randn(B, cell.q_len, cell.kv_heads, D), randn(B, cell.q_len, cell.kv_heads, D)
        inv_freq = 10000.0 ** (-torch.arange(0, D, 2, device=device, dtype=torch.float32) / D)
        angles = torch.arange(cell.max_seq, device=device, dtype=torch.float32)[:, None] * inv_freq
        t["cos"], t["sin"] = angles.cos(), angles.sin()
    return t


def _written(t: dict, q_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache slots append_kv writes, as (tokens, kv_heads, head_dim)."""
    positions = t["cache_seqlens"].long()[:, None] + torch.arange(q_len, device=t["q"].device)
    idx = slots(t["k_cache"], positions, t["block_table"])
    return tuple(c.view(-1, *c.shape[2:])[idx] for c in (t["k_cache"], t["v_cache"]))


# ---------------------------------------------------------------------------- providers


def _sdpa(cell: DecodeCell, t: dict):
    import torch.nn.functional as F

    if t["block_table"] is not None:
        raise NotApplicable("SDPA has no paged-cache entry")
    if set(cell.seqlens) != {t["k_cache"].shape[1]}:
        raise NotApplicable("SDPA would need a mask for lengths shorter than the cache")
    q, kc, vc = (t[name].transpose(1, 2) for name in ("q", "k_cache", "v_cache"))  # views, no copy
    return (lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)), lambda o: o.transpose(1, 2)


def _eager(cell: DecodeCell, t: dict):
    args = tuple(t[n] for n in ("q", "k_cache", "v_cache", "cache_seqlens", "block_table"))
    return (lambda: naive_decode(*args)), lambda o: o


def _onetrip(cell: DecodeCell, t: dict):
    from onetrip.ops import decode_attention

    return (lambda: decode_attention(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"],
                                     block_table=t["block_table"])), lambda o: o


def _append_args(t: dict, q: torch.Tensor) -> tuple:
    return (q, *(t[n] for n in ("k", "v", "k_cache", "v_cache", "cache_seqlens", "cos", "sin", "block_table")))


def _append_eager(cell: DecodeCell, t: dict):
    args = _append_args(t, t["q"])
    return (lambda: naive_append_kv(*args)), lambda q_rot: (q_rot, *_written(t, cell.q_len))


def _append_onetrip(cell: DecodeCell, t: dict):
    from onetrip.ops import append_kv

    q = t["q"].clone()  # rotated in place at every call
    *args, table = _append_args(t, q)
    return (lambda: append_kv(*args, block_table=table)), lambda _: (q.clone(), *_written(t, cell.q_len))


BUILDERS = {"sdpa": _sdpa, "eager": _eager, "onetrip": _onetrip}
APPEND_BUILDERS = {"eager": _append_eager, "onetrip": _append_onetrip}
EXTRA_KEYS = ("gbs", "pct_of_copy", "num_splits", "block_n", "num_warps", "speedup_vs_best_peer", "best_peer",
              "read_gbs", "pct_of_read")


MAX_INPUT_SETS = 16


def input_sets(cell: DecodeCell, dtype: torch.dtype = DTYPE) -> int:
    """How many copies of a cell's inputs one timed replay cycles through: enough that
    together they pass ``harness.ROTATE_BYTES``, so each call reads its cache from HBM as a
    decode step does (one cache per layer), at most MAX_INPUT_SETS. A graph of several calls
    also times the kernels back to back, as in a model, rather than one graph launch each."""
    return harness.rotation_sets(cache_bytes(cell, dtype), max_sets=MAX_INPUT_SETS)


def _rotating(builder: Callable, sets: list[dict]) -> Callable:
    """A builder whose call runs the provider once on every input set; the output compared
    is the first set's."""
    def build(cell: DecodeCell, t: dict):
        built = [builder(cell, s) for s in sets]

        def call():
            out = built[0][0]()
            for fn, _ in built[1:]:
                fn()
            return out
        return call, built[0][1]
    return build


def _per_call(timer: Callable, n: int) -> Callable:
    """timer for a call that runs n calls: its times divided by n."""
    return lambda fn: harness.per_call(timer(fn), n)


def bench_cell(cell: DecodeCell, device, timer: Callable, copy_gbs: float | None,
               free: Callable[[], int] | None = None, done: Callable[[str], None] = lambda provider: None,
               dtype: torch.dtype = DTYPE) -> list[dict]:
    """Run, compare and time every provider on one cell; one record per provider.

    timer(call) -> harness.Timing; free() -> bytes still allocatable (default
    ``harness.free_bytes``); copy_gbs: the ceiling for pct_of_copy (None: not set).
    """
    from .ops import add_speedup

    device = torch.device(device)
    free = free or (lambda: harness.free_bytes(device))
    append = cell.kind == "append_kv"
    nbytes = (append_bytes if append else decode_bytes)(cell, dtype)
    records = [{**cell.fields(), "dtype": DTYPE_NAMES[dtype], "provider": p, "bytes": nbytes,
                **dict.fromkeys((*RECORD_KEYS, *EXTRA_KEYS))} for p in (APPEND_PROVIDERS if append else PROVIDERS)]
    if cache_bytes(cell, dtype) > MEMORY_SHARE * free():
        for r in records:
            r["skipped"] = (f"too big: K and V need {cache_bytes(cell, dtype) / 2**30:.1f} GiB, over "
                            f"{MEMORY_SHARE:.0%} of the free {free() / 2**30:.1f} GiB")
            done(r["provider"])
        return records
    n_sets = input_sets(cell, dtype) if device.type == "cuda" else 1
    sets = [make_inputs(cell, dtype, device, torch.Generator(device=device).manual_seed(i)) for i in range(n_sets)]
    t = sets[0]
    builders, outs = APPEND_BUILDERS if append else BUILDERS, {}
    if n_sets > 1:
        builders = {p: _rotating(b, sets) for p, b in builders.items()}
        timer = _per_call(timer, n_sets)
    for rec in records:
        p = rec["provider"]
        if p == "eager" and not append and eager_extra_estimate(cell, dtype) > MEMORY_SHARE * free():
            rec["skipped"] = (f"too big: its copies of K and V need ~{eager_extra_estimate(cell, dtype) / 2**30:.1f}"
                              f" GiB, over {MEMORY_SHARE:.0%} of the free {free() / 2**30:.1f} GiB")
        else:
            out = run_provider(rec, lambda: builders[p](cell, t), timer, device)
            if out is not None:
                outs[p] = out
            rec["gbs"] = harness.gbs(nbytes, rec["median_ms"])
            if rec["gbs"] is not None and copy_gbs:
                rec["pct_of_copy"] = 100 * rec["gbs"] / copy_gbs
        rec["input_sets"] = n_sets
        done(p)
    if not append:
        cfg = importlib.import_module("onetrip.ops.decode_attention").decode_config(
            cell.batch, cell.kv_heads, cell.max_seq, cell.head_dim, device, rows=cell.q_len * cell.heads // cell.kv_heads,
            paged=cell.page is not None)
        records[-1].update(num_splits=cfg.num_splits, block_n=cfg.block_n, num_warps=cfg.num_warps)
        if device.type == "cuda":
            from .floors import read_gbs  # noqa: PLC0415 - Triton kernels: imported once the interpreter is chosen

            harness.attach_floor(records, read_gbs([(s["k_cache"], s["v_cache"]) for s in sets], timer),
                                 "read_gbs", "pct_of_read")
    add_diffs(records, outs, dtype, ("sdpa", "eager"))
    add_speedup(records)
    return records


# ---------------------------------------------------------------------------- runs


def _round(x: float | None, digits: int = 1) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, digits)


def _at_least(values: list[float], bar: float) -> bool | None:
    return None if not values else min(values) >= bar


def summary(records: list[dict], meta: dict, json_path) -> dict:
    """The one JSON line: onetrip's % of copy per cell; per layout its minimum over cells
    with batch x context >= BIG_TOKENS and its value at batch 1 x 4K, beside what a plain
    read of that cell's K and V reaches (``floors.read_gbs``); append_kv's minimum
    over rows moving >= BIG_APPEND_BYTES; whether each of the issue's bars is met (None
    when no cell measured it); the geometric mean of the decode speedup over the best peer."""
    mine = [r for r in records if r["provider"] == "onetrip"]
    dec = [r for r in mine if r["kind"] == "decode" and r["pct_of_copy"] is not None]
    app = [r for r in mine if r["kind"] == "append_kv" and r["pct_of_copy"] is not None]
    layouts = list(dict.fromkeys(r["layout"] for r in dec))
    big = {lay: [r["pct_of_copy"] for r in dec if r["layout"] == lay and r["tokens"] >= BIG_TOKENS] for lay in layouts}
    b1 = {lay: [r["pct_of_copy"] for r in dec if r["layout"] == lay and (r["batch"], r["context"]) == (1, 4096)]
          for lay in layouts}
    app_big = [r["pct_of_copy"] for r in app if r["bytes"] >= BIG_APPEND_BYTES]
    speedups = [r["speedup_vs_best_peer"] for r in mine if r["kind"] == "decode" and r["speedup_vs_best_peer"]]
    return {
        "bench": "decode-attention", "gpu": meta.get("gpu"), "dtype": meta.get("dtype"),
        "copy_gbs": _round(meta.get("copy_gbs")), "results": str(json_path),
        "pct_of_copy": {r["cell"]: _round(r["pct_of_copy"]) for r in dec},
        "min_pct_at_64k_tokens": {lay: _round(min(v)) for lay, v in big.items() if v},
        "batch1_4k_pct": {lay: _round(v[0]) for lay, v in b1.items() if v},
        "batch1_4k_plain_read_pct": {r["layout"]: _round(100 * r["read_gbs"] / meta["copy_gbs"]) for r in dec
                                     if (r["batch"], r["context"]) == (1, 4096) and r.get("read_gbs")
                                     and meta.get("copy_gbs")},
        "append_kv_pct": {r["cell"]: _round(r["pct_of_copy"]) for r in app},
        "append_kv_min_pct_64mib": _round(min(app_big, default=None)),
        "bars": {
            f"decode >= {BARS['decode_big']:.0f}% where batch x context >= 64K":
                _at_least([v for vs in big.values() for v in vs], BARS["decode_big"]),
            f"decode >= {BARS['decode_batch1_4k']:.0f}% at batch 1 x 4K":
                _at_least([v for vs in b1.values() for v in vs], BARS["decode_batch1_4k"]),
            f"append_kv >= {BARS['append_kv']:.0f}% (rows moving >= 64 MiB)": _at_least(app_big, BARS["append_kv"]),
        },
        "speedup_vs_best_peer_geomean": _round(math.exp(sum(map(math.log, speedups)) / len(speedups)), 3)
        if speedups else None,
        "checks_failed": sum(r["ok"] is False for r in mine),
        "onetrip_errors": sum(bool(r["error"]) for r in mine),
    }


def plot(records: list[dict], meta: dict, path: Path) -> Path:
    """GB/s against context, one panel per batch, a line per (provider, layout); append_kv
    against its new tokens in a last panel; the copy bandwidth and 90% of it drawn in."""
    copy = meta.get("copy_gbs")
    hlines = [(copy, f"copy {copy:.0f} GB/s", "--"), (0.9 * copy, "90% of copy", ":")] if copy else []
    return harness.plot_lines(
        records, path, y="gbs", ylabel="GB/s", hlines=hlines,
        panel=lambda r: f"decode, batch {r['batch']}" if r["kind"] == "decode" else "append_kv (x: new tokens)",
        x=lambda r: r["context"] if r["kind"] == "decode" else r["tokens"],
        series=lambda r: f"{r['provider']} {r['layout']}",
        style=lambda s: {**STYLE.get(s.split()[0], {"marker": "x"}), "linestyle": LINESTYLE.get(s.split()[1], "-.")},
        title=f"decode attention · {meta.get('gpu', '?')} · {meta.get('dtype', '?')} · {str(meta.get('date', ''))[:10]}")


def run_decode_bench(out_dir: Path, quick: bool, console=None) -> list[dict]:
    """Time the suite on the current CUDA device; write ``decode-attention-<gpu>-bf16-<YYYYMMDD>``
    .json, .csv (rewritten after each cell) and .png under ``out_dir``; print the tables and
    last one JSON summary line."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import report

    console = console or report.console()
    device = torch.device("cuda")
    meta = {**harness.device_info(device), "suite": "decode-attention", "dtype": DTYPE_NAMES[DTYPE], "quick": quick,
            "timing": "median CUDA-graph replay, L2 flushed (by reading 256 MiB+) before each; up to 100 reps; "
                      "cells under 256 MiB of cache replay a graph over input_sets copies, time per call",
            "bytes": "decode: K and V of the cache_seqlens tokens read once + q + out; append_kv: q read and "
                     "written, k and v read and written, cos/sin rows; 1 GB = 1e9 bytes",
            "sdpa": "enable_gqa=True, backend chosen by PyTorch, on transposed views of the (B, S, KVH, D) cache"}
    meta["copy_gbs"] = harness.copy_bandwidth_gbs(device)
    console.print(f"{meta['gpu']}: copy bandwidth {meta['copy_gbs']:.0f} GB/s (read + write)")
    stem = Path(out_dir) / f"decode-attention-{harness.slug(meta['gpu'])}-{meta['dtype']}-" \
                           f"{meta['date'][:10].replace('-', '')}"
    flush = harness.new_flush_buffer(device)
    todo = decode_cells(quick) + append_cells(quick)
    records: list[dict] = []
    columns = (TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with torch.inference_mode(), Progress(*columns, console=console) as progress:
        task = progress.add_task("decode", total=sum(len(APPEND_PROVIDERS if c.kind == "append_kv" else PROVIDERS)
                                                     for c in todo))
        for cell in todo:
            progress.update(task, description=cell.label)
            records += bench_cell(cell, device, lambda fn: harness.time_budgeted(fn, flush=flush), meta["copy_gbs"],
                                  done=lambda provider: progress.advance(task))
            harness.write_results(records, meta, stem)
            torch.cuda.empty_cache()  # the next cell's caches may need the whole of it (32 GiB at 64 x 128K)
    json_path, csv_path = harness.write_results(records, meta, stem)
    png = plot(records, meta, stem.with_suffix(".png"))
    report.print_decode_tables(console, records, PROVIDERS, APPEND_PROVIDERS)
    console.print(f"wrote {json_path}, {csv_path}, {png}")
    print(json.dumps(summary(records, meta, json_path)), flush=True)
    return records
