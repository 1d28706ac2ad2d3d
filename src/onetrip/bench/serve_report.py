"""The metrics, the table, the plot and the JSON line of ``onetrip bench serve`` (``serve``'s
docstring defines the metrics)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from .harness import quantile

if TYPE_CHECKING:
    from .serve import Trace

SERVE_STYLE = {  # provider: colour
    "onetrip": "#d62728",
    "transformers-cb": "#7f7f7f",
    "onetrip-static": "#ff7f0e",
}
ORDER = tuple(SERVE_STYLE)
ITL_BAR = 1.3  # the bar: onetrip's ITL p50 <= 1.3 x the static decode step at the same batch


def summarize(traces: list[Trace], start: float, output_len: int) -> dict:
    """One run's metrics from its traces (``start``: the run's first send, perf_counter
    seconds). TTFT, ITL and latency are None when the provider gave no per-token times."""
    end = max(t.done for t in traces)
    dur = max(end - start, 1e-9)
    n_tok = sum(len(t.tokens) for t in traces)
    rec = {"duration_s": dur, "output_tokens": n_tok, "output_tok_s": n_tok / dur, "requests_s": len(traces) / dur,
           "tokens_ok": all(len(t.tokens) == output_len for t in traces)}
    timed = [t for t in traces if t.token_times]
    ttft = sorted(t.token_times[0] - t.arrival for t in timed)
    itl = sorted(b - a for t in timed for a, b in zip(t.token_times, t.token_times[1:]))
    for name, values in (("ttft", ttft), ("itl", itl)):
        for q in (50, 99):
            rec[f"{name}_p{q}_ms"] = quantile(values, q / 100) * 1e3 if values else None
    lat = sorted(t.token_times[-1] - t.arrival for t in timed)
    rec["latency_p50_s"] = quantile(lat, 0.5) if lat else None
    return rec


def tokens_agree(mine: dict[str, list[int]], ref: Optional[dict[str, list[int]]]) -> Optional[float]:
    """Share of the reference's token positions where ``mine`` (request id -> tokens) has
    the same token; None without a reference."""
    if not ref:
        return None
    same = sum(a == b for rid, toks in mine.items() for a, b in zip(toks, ref.get(rid, [])))
    return same / max(1, sum(len(t) for t in ref.values()))


def _num(x, fmt: str, unit: str = "") -> str:
    return "—" if x is None else format(x, fmt) + unit


def _pair(r: dict, key: str) -> str:
    p50, p99 = r.get(f"{key}_p50_ms"), r.get(f"{key}_p99_ms")
    return "—" if p50 is None else f"{p50:.1f} / {p99:.1f}"


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["concurrency"], r.get("rate") or 0.0,
                                       ORDER.index(r["provider"]) if r["provider"] in ORDER else 9))


def print_serve_table(con, records: list[dict], meta: dict) -> None:
    """One table per preset: a row per (load point, provider) with output tok/s,
    requests/s, TTFT and ITL p50 / p99, ITL p50 over the static step, the throughput
    ratios and the token check; then what the columns leave out."""
    from rich.table import Table

    for preset in dict.fromkeys(r["preset"] for r in records):
        rows = _sorted([r for r in records if r["preset"] == preset])
        t = Table(title=f"{preset}: serving {meta.get('num_requests')} requests, prompts {meta.get('prompt_lo')}-"
                        f"{meta.get('prompt_hi')} tokens, {meta.get('output_len')} new tokens each, {meta.get('dtype')}"
                        f" · {meta.get('gpu')}", title_justify="left")
        for col in ("load", "provider", "tok/s", "req/s", "TTFT ms p50/p99", "ITL ms p50/p99", "ITL / step",
                    "vs tf-cb", "vs static", "tokens"):
            left = col in ("load", "provider")
            t.add_column(col, justify="left" if left else "right", no_wrap=left)
        for r in rows:
            if "error" in r:
                t.add_row(r["load"], r["provider"], f"[red]{r['error'][:70]}[/]", *[""] * 7)
                continue
            ratio = r.get("itl_p50_over_static_step")
            bar = "—" if ratio is None else f"[{'green' if ratio <= ITL_BAR else 'red'}]{ratio:.2f}x[/]"
            ok = "[green]ok[/]" if r["tokens_ok"] else "[red]WRONG[/]"
            agree = r.get("tokens_agree_static")
            if agree is not None and r["provider"] != "onetrip-static":
                ok += f" {100 * agree:.0f}%"
            t.add_row(r["load"], r["provider"], f"{r['output_tok_s']:.0f}", f"{r['requests_s']:.2f}",
                      _pair(r, "ttft"), _pair(r, "itl"), bar, _num(r.get("vs_transformers_cb"), ".2f", "x"),
                      _num(r.get("vs_static"), ".2f", "x"), ok)
        con.print(t)
        steps = {r["concurrency"]: r["static_step_ms"] for r in rows if r.get("static_step_ms")}
        if steps:
            con.print("  static step (onetrip-static's median decode step at batch C): "
                      + ", ".join(f"C={c}: {ms:.2f} ms" for c, ms in sorted(steps.items())))
        for r in rows:
            if r.get("settings"):
                con.print(f"  transformers-cb ({r['load']}): {r['settings']}", highlight=False)
                break
    con.print(f"  tok/s: output tokens / s. ITL / step: ITL p50 over the static step (bar {ITL_BAR:g}x). vs tf-cb, "
              "vs static: tok/s over transformers-cb's, onetrip-static's. tokens: every request got its count, and the "
              "% of its greedy tokens equal to onetrip-static's (random weights leave near-ties that bf16 rounding "
              "flips: under 100% on a GPU is expected). —: not measured (onetrip-static runs whole batches; "
              "transformers-cb without per-token timestamps).", highlight=False)


def plot_serve(records: list[dict], meta: dict, path: Path) -> Optional[Path]:
    """PNG with, per preset, output tok/s, TTFT and ITL (p50 solid, p99 dashed) against the
    load: the rate when rates were given (onetrip-static, which ignores arrivals, is then a
    dashed ceiling per concurrency), else the concurrency. The ITL panel draws the bar,
    1.3 x the static step, dotted. None, and nothing written, with fewer than two load points."""
    from matplotlib.figure import Figure

    ok = [r for r in records if "error" not in r]
    by_rate = any(r.get("rate") is not None for r in ok)
    x = (lambda r: r["rate"]) if by_rate else (lambda r: r["concurrency"])
    several_c = by_rate and len({r["concurrency"] for r in ok}) > 1
    curves = [r for r in ok if not (by_rate and r["provider"] == "onetrip-static")]
    ticks = sorted({x(r) for r in curves})
    if len(ticks) < 2:
        return None
    presets = list(dict.fromkeys(r["preset"] for r in ok))
    fig = Figure(figsize=(15, 3.8 * len(presets) + 0.6), layout="constrained")
    axes = fig.subplots(len(presets), 3, squeeze=False)
    for (tput, ttft, itl), preset in zip(axes, presets):
        series: dict[str, list[dict]] = {}
        for r in _sorted([r for r in curves if r["preset"] == preset]):
            series.setdefault(r["provider"] + (f" C={r['concurrency']}" if several_c else ""), []).append(r)
        for label, pts in series.items():
            pts.sort(key=x)
            color = SERVE_STYLE.get(pts[0]["provider"])
            tput.plot([x(r) for r in pts], [r["output_tok_s"] for r in pts], color=color, marker="o", label=label)
            for ax, key in ((ttft, "ttft"), (itl, "itl")):
                timed = [r for r in pts if r.get(f"{key}_p50_ms") is not None]
                if timed:
                    ax.plot([x(r) for r in timed], [r[f"{key}_p50_ms"] for r in timed], color=color, marker="o",
                            label=f"{label} p50")
                    ax.plot([x(r) for r in timed], [r[f"{key}_p99_ms"] for r in timed], color=color, marker="x",
                            linestyle="--", label=f"{label} p99")
            if pts[0]["provider"] == "onetrip-static":
                itl.plot([x(r) for r in pts], [ITL_BAR * r["static_step_ms"] for r in pts], color="black",
                         linestyle=":", label=f"{ITL_BAR:g} x static step")
        for r in (r for r in ok if r["preset"] == preset and by_rate and r["provider"] == "onetrip-static"):
            c = f" C={r['concurrency']}" if several_c else ""
            tput.axhline(r["output_tok_s"], color=SERVE_STYLE["onetrip-static"], linestyle="--",
                         label=f"onetrip-static{c}")
            itl.axhline(ITL_BAR * r["static_step_ms"], color="black", linestyle=":",
                        label=f"{ITL_BAR:g} x static step{c}")
        for ax, ylabel in ((tput, "output tokens / s"), (ttft, "TTFT ms"), (itl, "inter-token latency ms")):
            ax.set_xlabel("requests / s (Poisson arrivals)" if by_rate else "concurrency (requests in flight)")
            if not by_rate:
                ax.set_xscale("log", base=2)
                ax.set_xticks(ticks, [str(v) for v in ticks])
            ax.set_ylabel(ylabel)
            ax.set_title(f"{preset}: {ylabel}", fontsize=10)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"serving on {meta.get('gpu')}, {meta.get('dtype')}: {meta.get('num_requests')} requests, prompts "
                 f"{meta.get('prompt_lo')}-{meta.get('prompt_hi')} tokens, {meta.get('output_len')} new tokens; "
                 f"{str(meta.get('date', ''))[:10]}", fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def summary_line(records: list[dict], meta: dict, json_path) -> dict:
    """The JSON line for scripts: per preset and load point, onetrip's output tok/s, TTFT and
    ITL p50, and its ratios."""
    keys = ("output_tok_s", "ttft_p50_ms", "itl_p50_ms", "itl_p50_over_static_step", "vs_transformers_cb", "vs_static")
    points = [{"preset": r["preset"], "load": r["load"], **{k: (round(r[k], 3) if r.get(k) is not None else None)
                                                              for k in keys}}
              for r in _sorted(records) if r["provider"] == "onetrip" and "error" not in r]
    return {"bench": "serve", "gpu": meta.get("gpu"), "dtype": meta.get("dtype"), "results": str(json_path),
            "onetrip_errors": sum("error" in r for r in records if r["provider"].startswith("onetrip")),
            "onetrip": points}
