"""An interactive timeline page: one self-contained HTML file, SVG inline, no script and no
external resource, so it opens offline and can be attached to an issue.

    write_html_timeline("trace.json.gz", "timeline.html")
    write_html_timeline(["eager.json", "fused.json"], "compare.html", labels=["eager", "fused"])

The picture is the PNG's (``draw.py``: a lane per (device, stream), bars coloured by
category, idle stretches shaded, dashed step starts), drawn on one time scale for all runs
and wide enough to scroll through (about 6 px per kernel of the busiest lane, 1,200 to
40,000 px). Hovering a bar shows the kernel's name, duration, category, launching
operator, step and start; hovering a shaded gap shows its length. Bars narrower than 1 px
are drawn 1 px wide (the legend says how many µs that is).
"""

from __future__ import annotations

from collections import Counter
from html import escape
from pathlib import Path
from typing import Sequence

from .kinds import short_name
from .lanes import COLORS, GAP_COLOR, Source, TimelineLayout, layout_timeline, nice_step
from .timeline import Thresholds
from .trace import Trace

LANE_PX = 22
TOP_PX = 18  # step names
AXIS_PX = 26
LABEL_PX = 140
PX_PER_KERNEL = 6
MIN_PX, MAX_PX = 1200, 40000

STYLE = """
body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; } h2 { font-size: 15px; margin: 18px 0 4px; }
.summary { margin: 2px 0 6px; color: #444; }
.row { display: flex; border: 1px solid #ccc; }
.labels { flex: none; background: #fafafa; border-right: 1px solid #ccc; }
.scroll { overflow-x: auto; flex: auto; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
rect.k:hover { stroke: #000; stroke-width: 1.5; }
rect.gap:hover { fill-opacity: 1; }
.legend span.sw { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 14px; vertical-align: -2px; }
.note { color: #555; margin-left: 14px; }
"""


def _us(x: float) -> str:
    return f"{x / 1000:.3f} ms" if x >= 1000 else f"{x:.2f} µs"


def write_html_timeline(runs: Source | Sequence[Source], path: str | Path, *, labels: Sequence[str] | None = None,
                        steps: Sequence[int | str] | None = None, title: str | None = None,
                        thresholds: Thresholds = Thresholds()) -> Path:
    """Write the timeline of one run, or of a list of runs one above the other, to the
    HTML file at ``path``; returns ``Path(path)``.

    runs: a ``TraceIndex``, ``Trace`` or trace path, or a list (or tuple) of them.
    labels: one per run (default: the files' names). steps: see ``lanes.select_steps``
    (default: two steps after the first). title: the page's heading (default: "GPU timeline").
    """
    runs = list(runs) if isinstance(runs, (list, tuple)) and not isinstance(runs, Trace) else [runs]
    if not runs:
        raise ValueError("runs: give at least one trace to draw, got an empty list")
    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"labels: give one per trace ({len(runs)}), got {len(labels)}")
    layouts = [layout_timeline(r, steps, None if labels is None else labels[i], thresholds)
               for i, r in enumerate(runs)]
    longest = max(lay.span_us for lay in layouts)
    busiest = max(max(Counter(b.lane for b in lay.bars).values()) for lay in layouts)
    px_per_us = min(MAX_PX, max(MIN_PX, PX_PER_KERNEL * busiest)) / longest if longest > 0 else 1.0
    heading = title or "GPU timeline"
    present = [c for c in COLORS if any(c in lay.categories() for lay in layouts)]
    parts = [f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(heading)}</title>',
             f"<style>{STYLE}", *(f".c-{c} {{ fill: {COLORS[c]}; }}" for c in COLORS),
             f".gap {{ fill: {GAP_COLOR}; fill-opacity: 0.7; }}</style></head><body>", f"<h1>{escape(heading)}</h1>",
             '<p class="legend">' + "".join(f'<span class="sw" style="background:{COLORS[c]}"></span>{c}'
                                            for c in present)
             + f'<span class="sw" style="background:{GAP_COLOR}"></span>idle within a step (no kernel on the device)'
             + f'<span class="note">bars narrower than 1 px drawn 1 px wide (1 px = {_us(1 / px_per_us)}); '
             "hover a bar for the kernel, its duration and operator</span></p>"]
    for lay in layouts:
        parts += _run(lay, px_per_us)
    parts.append("</body></html>\n")
    path = Path(path)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def _run(lay: TimelineLayout, px_per_us: float) -> list[str]:
    s = lay.summary
    height = TOP_PX + LANE_PX * len(lay.lanes) + AXIS_PX
    width = lay.span_us * px_per_us + 40
    out = [f"<h2>{escape(lay.title)}</h2>",
           f'<p class="summary">{escape(", ".join(s.steps))}: {s.kernels_per_step:.0f} kernels/step, '
           f"busy {s.busy_fraction:.0%}, launch overhead {s.launch_overhead_share:.0%} of "
           f"{_us(s.wall_us)} GPU wall time</p>",
           '<div class="row">',
           f'<svg class="labels" width="{LABEL_PX}" height="{height}">']
    for i, lane in enumerate(lay.lanes):
        out.append(f'<text x="6" y="{TOP_PX + LANE_PX * i + LANE_PX / 2 + 4:.0f}">{escape(lane.label)}</text>')
    out += ["</svg>", '<div class="scroll">', f'<svg width="{width:.0f}" height="{height}" role="img">']
    for device in sorted({lane.device for lane in lay.lanes}):
        rows = [i for i, lane in enumerate(lay.lanes) if lane.device == device]
        y, h = TOP_PX + LANE_PX * rows[0], LANE_PX * len(rows)
        for g in lay.gaps:
            if g.device == device:
                out.append(f'<rect class="gap" x="{g.start_us * px_per_us:.2f}" y="{y}" '
                           f'width="{(g.end_us - g.start_us) * px_per_us:.2f}" height="{h}">'
                           f"<title>idle {_us(g.end_us - g.start_us)} on GPU {device}</title></rect>")
    for b in lay.bars:
        lane = lay.lanes[b.lane]
        tip = (f"{short_name(b.name, 160)}\n{_us(b.dur_us)} · {b.category}\noperator: {b.op or 'unknown'}\n"
               f"{b.step} · {lane.label} · starts at {_us(b.start_us)}")
        out.append(f'<rect class="k c-{b.category}" x="{b.start_us * px_per_us:.2f}" '
                   f'y="{TOP_PX + LANE_PX * b.lane + 3}" width="{max(1.0, b.dur_us * px_per_us):.2f}" '
                   f'height="{LANE_PX - 6}"><title>{escape(tip)}</title></rect>')
    for name, x in lay.step_marks:
        out.append(f'<line x1="{x * px_per_us:.2f}" x2="{x * px_per_us:.2f}" y1="0" y2="{height - AXIS_PX}" '
                   f'stroke="#444" stroke-dasharray="4 3"/><text x="{x * px_per_us + 3:.2f}" y="12">'
                   f"{escape(name)}</text>")
    axis_y = height - AXIS_PX
    out.append(f'<line x1="0" x2="{width:.0f}" y1="{axis_y}" y2="{axis_y}" stroke="#888"/>')
    step = nice_step(lay.span_us, max(2, round(width / 150)))  # a labelled tick every ~150 px
    for n in range(int(lay.span_us // step) + 1):
        x = n * step * px_per_us
        out.append(f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{axis_y}" y2="{axis_y + 5}" stroke="#888"/>'
                   f'<text x="{x + 2:.2f}" y="{axis_y + 17}">{_us(n * step)}</text>')
    out += ["</svg></div></div>"]
    return out


__all__ = ["write_html_timeline"]
