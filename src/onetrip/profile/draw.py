"""Timeline pictures (PNG) of the GPU kernels in a trace: where the seams are, at a glance.

    draw_timeline("trace.json.gz", "timeline.png")                       # default steps
    draw_timeline(index, "t.png", steps=["ProfilerStep#4"], title="eager")
    draw_timelines(["eager.json", "fused.json", "graphs.json"], "compare.png",
                   labels=["eager", "fused", "fused + CUDA graphs"])      # one above the other

One lane per (device, stream); each kernel a bar coloured by its category (``kinds``);
idle stretches of a device within a step (no kernel on any of its streams) shaded;
dashed lines where each drawn step's first kernel starts. A kernel of 2 µs in a 2 ms step
would be a tenth of a pixel wide, so bars are drawn at least ``min_width`` of the time axis
wide (the legend says how wide that is): short kernels stay visible, and the idle
shading between them is then slightly understated. A box beside each run gives
kernels/step, busy % and launch-overhead % of the drawn steps (``TimelineSummary``).

Drawn with matplotlib's ``Figure`` (Agg canvas, no pyplot, nothing shown); the file is
written and its path returned. For an interactive page with hover details, see
``html_timeline.write_html_timeline``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .lanes import COLORS, GAP_COLOR, Source, TimelineLayout, layout_timeline, time_unit
from .timeline import Thresholds

LANE_IN = 0.3  # inches of figure height per lane
RUN_IN = 1.0  # inches per run for its title, step labels and axis


def draw_timeline(source: Source, path: str | Path, *, steps: Sequence[int | str] | None = None,
                  title: str | None = None, thresholds: Thresholds = Thresholds(), min_width: float = 0.002,
                  width_in: float = 14.0, dpi: int = 100) -> Path:
    """Draw the kernels of the selected steps of one trace to the PNG at ``path``.

    source: a ``TraceIndex``, a ``Trace`` or a trace file's path. steps: see
    ``lanes.select_steps`` (default: two steps after the first). title: default the file's
    name. min_width: the narrowest bar, as a fraction of the time axis. The figure is
    ``width_in`` x (0.3 in per lane + 2 in) at ``dpi``. Returns ``Path(path)``.
    """
    return draw_timelines([source], path, labels=None if title is None else [title], steps=steps,
                          thresholds=thresholds, min_width=min_width, width_in=width_in, dpi=dpi)


def draw_timelines(sources: Sequence[Source], path: str | Path, labels: Sequence[str] | None = None, *,
                   steps: Sequence[int | str] | None = None, title: str | None = None,
                   thresholds: Thresholds = Thresholds(), min_width: float = 0.002, share_time: bool = True,
                   width_in: float = 14.0, dpi: int = 100) -> Path:
    """Draw several runs one above the other into the PNG at ``path`` (e.g. eager, fused,
    fused + CUDA graphs). labels: one per run (default: the files' names); title: above
    all runs. share_time: one time scale for all runs, so a faster run is a shorter row;
    otherwise each row fills the width. Other arguments as in ``draw_timeline``."""
    sources = list(sources)
    if not sources:
        raise ValueError("sources: give at least one trace to draw, got an empty list")
    if labels is not None and len(labels) != len(sources):
        raise ValueError(f"labels: give one per trace ({len(sources)}), got {len(labels)}")
    if not 0 < min_width <= 0.05:
        raise ValueError(f"min_width must be a fraction of the time axis in (0, 0.05], got {min_width!r}")
    layouts = [layout_timeline(s, steps, None if labels is None else labels[i], thresholds)
               for i, s in enumerate(sources)]
    from matplotlib.figure import Figure  # no pyplot: no global state, the Agg canvas on savefig

    heights = [LANE_IN * len(lay.lanes) + RUN_IN for lay in layouts]
    fig = Figure(figsize=(width_in, sum(heights) + 1.0 + (0.4 if title else 0.0)), dpi=dpi, layout="constrained")
    axes = fig.subplots(len(layouts), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    longest = max(lay.span_us for lay in layouts)
    for ax, lay in zip(axes, layouts):
        _draw_run(ax, lay, longest if share_time else lay.span_us, min_width)
    axes[-1].set_xlabel(f"time since the first kernel of the drawn steps ({time_unit(longest)[0]})"
                        if share_time else "time since the first kernel of the drawn steps")
    if title:
        fig.suptitle(title)
    _legend(fig, layouts, longest if share_time else None, min_width)
    path = Path(path)
    fig.savefig(path)
    return path


def _draw_run(ax, lay: TimelineLayout, xmax_us: float, min_width: float) -> None:
    _, scale = time_unit(xmax_us)
    n = len(lay.lanes)
    min_us = min_width * xmax_us
    for device in sorted({lane.device for lane in lay.lanes}):
        rows = [i for i, lane in enumerate(lay.lanes) if lane.device == device]  # contiguous: lanes are sorted
        spans = [(g.start_us / scale, (g.end_us - g.start_us) / scale) for g in lay.gaps if g.device == device]
        if spans:
            ax.broken_barh(spans, (rows[0] - 0.5, len(rows)), facecolors=GAP_COLOR, edgecolor="none", zorder=0)
    groups: dict[tuple[int, str], list] = {}
    for b in lay.bars:
        groups.setdefault((b.lane, b.category), []).append((b.start_us / scale, max(b.dur_us, min_us) / scale))
    for (lane, category), spans in groups.items():
        ax.broken_barh(spans, (lane - 0.4, 0.8), facecolors=COLORS[category], edgecolor="none", zorder=2)
    for name, x in lay.step_marks:
        ax.axvline(x / scale, color="0.25", lw=0.7, ls="--", zorder=3)
        ax.text(x / scale, 1.0, f" {name}", transform=ax.get_xaxis_transform(), va="bottom", ha="left", fontsize=7,
                color="0.25")
    ax.set_xlim(0, xmax_us / scale * 1.01)
    ax.set_ylim(n - 0.5, -0.5)  # first lane on top
    ax.set_yticks(range(n), [lane.label for lane in lay.lanes], fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title(lay.title, loc="left", fontsize=10, pad=12)
    ax.text(1.01, 1.0, "\n".join(lay.summary.lines()), transform=ax.transAxes, va="top", ha="left", fontsize=8,
            family="monospace", bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.7"})
    ax.xaxis.get_major_formatter().set_useOffset(False)


def _legend(fig, layouts: list[TimelineLayout], shared_us: float | None, min_width: float) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    present = {c for lay in layouts for c in lay.categories()}
    handles = [Patch(facecolor=COLORS[c], label=c) for c in COLORS if c in present]
    handles.append(Patch(facecolor=GAP_COLOR, label="idle within a step (no kernel on the device)"))
    if shared_us is not None:
        w = min_width * shared_us
        note = f"kernels shorter than {w:.3g} µs drawn {w:.3g} µs wide"
    else:
        note = f"kernels shorter than {min_width:.1%} of a row drawn that wide"
    handles.append(Line2D([], [], linestyle="none", label=note))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 10), fontsize=8, frameon=False)


__all__ = ["draw_timeline", "draw_timelines"]
