"""What every benchmark suite shares: device facts, the copy ceiling and timing (from
``onetrip.device``, re-exported here), result files, plots.

Metrics used throughout:

- **median_ms / p20_ms / p80_ms**: the median and the 20th / 80th percentiles of one call's
  GPU time over ``reps`` timed calls, each measured with CUDA events around a single call
  (or a single replay of the call captured in a CUDA graph) that reads cold data: L2 is
  overwritten just before every call.
- **bytes**: the bytes an ideal kernel must move: each input read once, each output
  written once (1 GB = 1e9 bytes).
- **gbs**: bytes / median time, in GB/s.
- **copy_gbs**: the same figure for a device-to-device copy of 1 GiB (bytes read +
  bytes written), the practical ceiling of a memory-bound kernel on this GPU.
- **pct_of_copy**: 100 * gbs / copy_gbs.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import importlib.metadata
import json
import math
import platform
import re
from pathlib import Path
from typing import Callable, Sequence

import torch

# Re-exported: the suites and tools time through harness.
from ..device import Timing, copy_bandwidth_gbs, new_flush_buffer, quantile, time_ms  # noqa: F401


def utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _package_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cpu_name() -> str | None:
    """The host CPU's model name (host-side figures depend on it), from /proc/cpuinfo where there is one."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return None


def device_info(device: torch.device | str) -> dict:
    """Facts a benchmark result must carry: the GPU, its size, and every version involved.

    Keys: gpu, sm_count, l2_bytes, memory_bytes, compute_capability, torch, triton, cuda,
    liger_kernel (None when not installed), python, date (ISO 8601, UTC). On a machine
    without a GPU, gpu is "cpu (<processor>)" and the GPU-only keys are None.
    """
    import triton  # imported here: callers may set TRITON_INTERPRET before this module is used

    device = torch.device(device)
    info = {
        "gpu": None,
        "sm_count": None,
        "l2_bytes": None,
        "memory_bytes": None,
        "compute_capability": None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "liger_kernel": _package_version("liger-kernel", "liger_kernel", "liger-kernel-nightly"),
        "python": platform.python_version(),
        "date": utc_now().isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            sm_count=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
            memory_bytes=props.total_memory,
            compute_capability=f"{props.major}.{props.minor}",
        )
    else:
        info["gpu"] = f"cpu ({platform.processor() or platform.machine()})"
    return info


def sync(device: torch.device | str) -> None:
    """Wait for ``device``'s work (nothing to wait for off CUDA)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def slug(text: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (safe in a file name)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


ROTATE_BYTES = 256 * 2**20  # several L2s (50-60 MB on Hopper): what a timed replay cycles through


def rotation_sets(nbytes: int, *, min_sets: int = 1, max_sets: int = 16) -> int:
    """How many copies of a call's inputs a timed replay cycles through: enough that their
    ``nbytes`` each pass ROTATE_BYTES together, so every call finds its inputs evicted by
    the others' (cold L2 without a flush between calls), within [min_sets, max_sets]."""
    return max(min_sets, min(max_sets, -(-ROTATE_BYTES // max(1, nbytes))))


def per_call(timing: Timing, n: int) -> Timing:
    """The timing of a replay that ran ``n`` calls back to back, as the time of one call."""
    return dataclasses.replace(timing, median_ms=timing.median_ms / n, p20_ms=timing.p20_ms / n,
                               p80_ms=timing.p80_ms / n)


def attach_floor(records: list[dict], gbs: float | None, gbs_key: str, pct_key: str) -> None:
    """Put a cell's floor (``floors``: what a plain kernel of its bytes reaches) on every record
    of the cell as ``gbs_key``, and each record's GB/s as a % of it as ``pct_key``."""
    for r in records:
        r[gbs_key] = gbs
        if gbs and r.get("gbs"):
            r[pct_key] = 100 * r["gbs"] / gbs


def time_budgeted(fn: Callable[[], object], *, flush: torch.Tensor | None = None, budget_ms: float = 2000.0,
                  max_reps: int = 100, min_reps: int = 10) -> Timing:
    """``time_ms`` with reps cut so that a slow call takes about ``budget_ms`` in all.

    One call is timed first (after one that compiles); reps = budget_ms / its time, clamped
    to [min_reps, max_reps]. Calls under 20 ms keep 100 reps; the naive attention at 16K
    tokens (tens of ms a call) drops to a few dozen.
    """
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    reps = int(min(max_reps, max(min_reps, budget_ms / max(start.elapsed_time(end), 1e-3))))
    return time_ms(fn, reps=reps, warmup=2, flush=flush)


def peak_extra_bytes(fn: Callable[[], object], device: torch.device | str) -> tuple[object, int | None]:
    """Call ``fn`` once: (its result, the most bytes it held allocated beyond what was before).

    torch.cuda.max_memory_allocated during the call minus memory_allocated before it, so
    the call's output counts and its inputs do not. None off CUDA.
    """
    if torch.device(device).type != "cuda":
        return fn(), None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    result = fn()
    torch.cuda.synchronize(device)
    return result, torch.cuda.max_memory_allocated(device) - before


def free_bytes(device: torch.device | str) -> int:
    """Memory a new allocation can still get: free on the device plus what PyTorch caches unused."""
    device = torch.device(device)
    if device.type != "cuda":
        return 1 << 62
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def error_string(exc: BaseException) -> str:
    """'TypeName: first line of the message', at most 300 characters (for a result record)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return (text.splitlines() or [text])[0][:300]


def gbs(nbytes: int, ms: float | None) -> float | None:
    """GB/s (1e9 bytes per second) for ``nbytes`` moved in ``ms`` milliseconds."""
    return None if ms is None or ms <= 0 else nbytes / 1e9 / (ms / 1e3)


# ---------------------------------------------------------------------------- result files


def _clean(value):
    """JSON/CSV-safe value: non-finite floats become None (NaN is not JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def sweep_path(out: str | Path, info: dict, prefix: str = "tune") -> Path:
    """``out/<prefix>-<GPU>-<date>.json`` for a tuning sweep (``out`` created)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return out / f"{prefix}-{(info.get('gpu') or 'gpu').replace(' ', '_')}-{info.get('date', '')[:10]}.json"


def write_sweep(path: Path, info: dict, copy_gbs: float, results: list[dict]) -> None:
    """A sweep's records so far, with the device facts and the copy bandwidth of its run;
    sweeps call it after every step, so that a run cut off by a time limit keeps what it
    measured."""
    path.write_text(json.dumps({"meta": {**info, "copy_gbs": copy_gbs}, "results": results}, indent=1))


def write_results(records: list[dict], meta: dict, stem: Path) -> tuple[Path, Path]:
    """Write ``stem``.json ({"meta": ..., "results": [...]}) and ``stem``.csv (one row per record).

    Records are flat dicts (one per op, shape and provider); the CSV's columns are the
    union of their keys in first-seen order. Returns (json_path, csv_path).
    """
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    rows = [{k: _clean(v) for k, v in r.items()} for r in records]
    json_path, csv_path = stem.with_suffix(".json"), stem.with_suffix(".csv")
    json_path.write_text(json.dumps({"meta": {k: _clean(v) for k, v in meta.items()}, "results": rows}, indent=1) + "\n")
    fields: dict[str, None] = {}
    for r in rows:
        fields.update(dict.fromkeys(r))
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields))
        writer.writeheader()
        writer.writerows(rows)
    return json_path, csv_path


# ---------------------------------------------------------------------------- plot

PROVIDER_STYLE = {  # colour, marker
    "eager": ("#7f7f7f", "o"),
    "torch.compile": ("#1f77b4", "s"),
    "liger": ("#ff7f0e", "^"),
    "onetrip": ("#d62728", "D"),
    "onetrip-sdpa": ("#9467bd", "v"),  # onetrip.patch without its attention (bench train)
}


def width_label(width: int) -> str:
    """1024 -> '1K', 262144 -> '256K', 1000 -> '1000'."""
    return f"{width // 1024}K" if width >= 1024 and width % 1024 == 0 else str(width)


def plot_gbs(records: list[dict], meta: dict, path: Path) -> Path:
    """PNG of GB/s per provider, one subplot per op, with the copy ceiling drawn in.

    Row ops: GB/s against width (log2 axis) over the sweep shapes (records with
    ``sweep`` true); other shapes are drawn as hollow markers. Ops without a width
    (rotary) use their shape labels as categories. The dashed line is the measured copy
    bandwidth, the dotted one 90% of it.
    """
    from matplotlib.figure import Figure  # no pyplot: no global state, Agg canvas on savefig

    ops = list(dict.fromkeys(r["op"] for r in records))
    ncols = min(3, max(1, len(ops)))
    nrows = math.ceil(len(ops) / ncols) if ops else 1
    fig = Figure(figsize=(5.2 * ncols, 3.6 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    copy = meta.get("copy_gbs")
    handles = {}
    for ax, op in zip(axes, ops):
        recs = [r for r in records if r["op"] == op and r.get("gbs") is not None]
        categorical = any(r.get("width") is None for r in recs)
        labels = list(dict.fromkeys(r["shape"] for r in recs))
        for provider in dict.fromkeys(r["provider"] for r in recs):
            color, marker = PROVIDER_STYLE.get(provider, ("#2ca02c", "x"))
            mine = [r for r in recs if r["provider"] == provider]
            if categorical:
                ax.plot([labels.index(r["shape"]) for r in mine], [r["gbs"] for r in mine],
                        color=color, marker=marker, linestyle="none", label=provider)
                continue
            line = sorted((r for r in mine if r.get("sweep", True)), key=lambda r: r["width"])
            handles.setdefault(provider, ax.plot([r["width"] for r in line], [r["gbs"] for r in line],
                                                 color=color, marker=marker, label=provider)[0])
            other = [r for r in mine if not r.get("sweep", True)]
            ax.plot([r["width"] for r in other], [r["gbs"] for r in other], color=color, marker=marker,
                    markerfacecolor="none", linestyle="none")
        if categorical:
            ax.set_xticks(range(len(labels)), [lab.split(" ")[0] for lab in labels])
        else:
            widths = sorted({r["width"] for r in recs})
            extra = sorted({r["shape"] for r in recs if not r.get("sweep", True)})
            ax.set_xscale("log", base=2)
            ax.set_xticks(widths, [width_label(w) for w in widths])
            ax.set_xlabel("width" + (f" (hollow: {', '.join(extra)})" if extra else ""))
        if copy:
            handles["copy"] = ax.axhline(copy, color="black", linestyle="--", linewidth=1,
                                         label=f"copy {copy:.0f} GB/s")
            handles["90%"] = ax.axhline(0.9 * copy, color="black", linestyle=":", linewidth=1, label="90% of copy")
        ax.set_title(op)
        ax.set_ylabel("GB/s")
        ax.set_ylim(bottom=0, top=max([r["gbs"] for r in recs] + [copy or 0]) * 1.08 or None)
        ax.grid(True, alpha=0.3)
    for ax in axes[len(ops):]:
        ax.set_visible(False)
    for provider in PROVIDER_STYLE:  # ops drawn only as categories still need their legend entries
        if provider not in handles and any(r["provider"] == provider for r in records):
            color, marker = PROVIDER_STYLE[provider]
            handles[provider] = axes[0].plot([], [], color=color, marker=marker, label=provider)[0]
    order = [k for k in PROVIDER_STYLE if k in handles] + [k for k in handles if k not in PROVIDER_STYLE]
    fig.legend(handles=[handles[k] for k in order], loc="outside lower center",
               ncols=max(1, min(len(order), 2 * ncols + 1)))
    fig.suptitle(f"{meta.get('gpu', '?')} · {meta.get('dtype', '?')} · {str(meta.get('date', ''))[:10]}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def plot_lines(records: list[dict], path: Path, *, panel: Callable[[dict], str], x: Callable[[dict], object],
               y: str, series: Callable[[dict], str], style: Callable[[str], dict], ylabel: str, title: str,
               hlines: Sequence[tuple[float, str, str]] = (), ncols: int = 3) -> Path:
    """PNG with one subplot per ``panel(r)`` and, in each, one line per ``series(r)``: r[y] against x(r).

    Numeric x values go on a log2 axis labelled 1K, 16K, ...; a panel whose x values are
    strings plots them as categories (points, not joined). ``style(series)`` gives matplotlib
    keyword arguments (color, marker, linestyle). ``hlines``: (value, label, linestyle)
    drawn across every panel (a ceiling, a bar). Records whose y is None are left out.
    """
    from matplotlib.figure import Figure

    recs = [r for r in records if r.get(y) is not None]
    panels = list(dict.fromkeys(panel(r) for r in recs)) or ["(no results)"]
    ncols = min(ncols, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(5.2 * ncols, 3.6 * nrows + 0.8), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    handles: dict[str, object] = {}
    lines: dict[str, object] = {}  # the hlines, last in the legend
    for ax, name in zip(axes, panels):
        mine = [r for r in recs if panel(r) == name]
        xs = [x(r) for r in mine]
        categories = list(dict.fromkeys(v for v in xs if isinstance(v, str)))
        for s in dict.fromkeys(series(r) for r in mine):
            pts = sorted(((x(r), r[y]) for r in mine if series(r) == s),
                         key=lambda p: categories.index(p[0]) if categories else p[0])
            px = [categories.index(v) if categories else v for v, _ in pts]
            kw = {**style(s), **({"linestyle": "none"} if categories else {})}
            handles.setdefault(s, ax.plot(px, [v for _, v in pts], label=s, **kw)[0])
        if categories:
            ax.set_xticks(range(len(categories)), categories, rotation=20, fontsize=7, ha="right")
        elif xs:
            ax.set_xscale("log", base=2)
            ticks = sorted(set(xs))
            ax.set_xticks(ticks, [width_label(int(t)) for t in ticks])
        for value, label, linestyle in hlines:
            lines[label] = ax.axhline(value, color="black", linestyle=linestyle, linewidth=1, label=label)
        ax.set_title(name, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0, top=max([r[y] for r in mine] + [v for v, _, _ in hlines] + [1e-9]) * 1.08)
        ax.grid(True, alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    handles.update(lines)
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncols=max(1, min(len(handles), 5)))
    fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
