"""``onetrip bench train``'s figures for people and scripts: ratios to eager, the issue's bars,
the table and the plot (see ``onetrip.bench.train`` for what each record holds)."""

from __future__ import annotations

import statistics
from pathlib import Path

from . import harness


def relate(records: list[dict]) -> None:
    """Fill each record's ratios to eager's of the same model, loss differences and onetrip's loss verdict."""
    for preset in dict.fromkeys(r["model"] for r in records):
        recs = [r for r in records if r["model"] == preset]
        eager = next((r for r in recs if r["provider"] == "eager"), None)
        if eager is None or not eager["losses"]:
            continue
        for r in recs:
            n = min(len(r["losses"]), len(eager["losses"]))
            if n:
                r["max_loss_diff"] = max(abs(a - b) for a, b in zip(r["losses"][:n], eager["losses"][:n]))
            for key, base, out in (("tokens_per_s", "tokens_per_s", "speedup_vs_eager"),
                                   ("peak_bytes", "peak_bytes", "peak_vs_eager"),
                                   ("max_tokens", "max_tokens", "max_tokens_vs_eager")):
                if r[key] and eager[base]:
                    r[out] = r[key] / eager[base]
        peers = [r["max_loss_diff"] for r in recs if r["provider"] in ("torch.compile", "liger")
                 and r["max_loss_diff"] is not None]
        roundoff = 2.0 ** -8 * statistics.fmean(eager["losses"])
        for r in recs:
            if r["provider"] == "onetrip" and r["max_loss_diff"] is not None:
                r["loss_tolerance"] = max([roundoff] + [2 * d for d in peers])
                r["loss_ok"] = r["max_loss_diff"] <= r["loss_tolerance"]


def bars(records: list[dict]) -> dict:
    """Per model, onetrip against the issue's bars: tokens/s >= 1.3x eager's and above Liger's;
    peak <= 0.6x eager's and <= Liger's at the same batch; largest batch x seq >= 2x eager's;
    the loss within tolerance. A bar whose figures are missing is None."""
    out = {}
    for preset in dict.fromkeys(r["model"] for r in records):
        by = {r["provider"]: r for r in records if r["model"] == preset}
        me, liger = by.get("onetrip") or {}, by.get("liger") or {}

        def ratio(key):
            return me[key] / liger[key] if me.get(key) and liger.get(key) else None

        tps, peak, cap = me.get("speedup_vs_eager"), me.get("peak_vs_eager"), me.get("max_tokens_vs_eager")
        out[preset] = {"tokens_per_s_vs_eager": tps, "tokens_per_s_vs_liger": ratio("tokens_per_s"),
                       "peak_vs_eager": peak, "peak_vs_liger": ratio("peak_bytes"), "max_tokens_vs_eager": cap,
                       "max_loss_diff": me.get("max_loss_diff"), "loss_tolerance": me.get("loss_tolerance")}
        out[preset]["met"] = {
            "speed": None if tps is None or ratio("tokens_per_s") is None else tps >= 1.3 and ratio("tokens_per_s") > 1,
            "memory": None if peak is None or ratio("peak_bytes") is None else peak <= 0.6 and ratio("peak_bytes") <= 1,
            "largest": None if cap is None else cap >= 2, "loss": me.get("loss_ok")}
    return out


def print_table(con, records: list[dict]) -> None:
    """One row per (model, provider); errors and skips listed under the table."""
    from rich.table import Table

    gib = lambda b: "—" if not b else f"{b / 2**30:.1f}"
    times = lambda v: "" if v is None else f" ({v:.2f}x)"
    seq = records[0]["seq"] if records else "?"
    table = Table(title=f"training step at seq {seq}: bf16, float32 master weights", title_justify="left")
    for col in ("model", "provider", "batch", "tokens/s (vs eager)", "peak GiB (vs eager)",
                f"largest batch x {seq} (vs eager)", "max |loss - eager| / tol", "first step s"):
        table.add_column(col, justify="left" if col in ("model", "provider") else "right")
    for r in records:
        if r["error"] or not r["losses"]:
            table.add_row(r["model"], r["provider"], "[red]error[/]" if r["error"] else "[yellow]skipped[/]",
                          *[""] * 5)
            continue
        tps = "—" if not r["tokens_per_s"] else f"{r['tokens_per_s']:,.0f}{times(r['speedup_vs_eager'])}"
        largest = "—" if r["max_batch"] is None else f"{r['max_batch']}{'' if r['max_batch_exact'] else '+'}"
        diff = "—" if r["max_loss_diff"] is None else f"{r['max_loss_diff']:.1e}"
        if r["loss_ok"] is not None:
            diff += f" / {r['loss_tolerance']:.1e} " + ("[green]ok[/]" if r["loss_ok"] else "[red]over[/]")
        table.add_row(r["model"], r["provider"], str(r["batch"]), tps,
                      gib(r["peak_bytes"]) + times(r["peak_vs_eager"]),
                      largest + times(r["max_tokens_vs_eager"]), diff,
                      "—" if r["first_step_s"] is None else f"{r['first_step_s']:.1f}")
    con.print(table)
    con.print("largest batch '+': a lower bound (the search was cut short); tol: onetrip's loss tolerance "
              "(see onetrip.bench.train)", highlight=False)
    for r in records:
        if r["error"] or r["skipped"]:
            what = f"[red]error[/]: {r['error']}" if r["error"] else f"[yellow]skipped[/]: {r['skipped']}"
            con.print(f"  {r['model']} {r['provider']}: {what}", highlight=False)
    unsearched = sorted({r["provider"] for r in records if (r["search"] or "").startswith("skipped")})
    if unsearched:
        con.print(f"  largest batch not searched (--quick): {', '.join(unsearched)}", highlight=False)


def plot(records: list[dict], meta: dict, path: Path) -> Path:
    """Per model: the loss curves, each provider's loss minus eager's, the peak memory at the
    common batch (bars, the largest batch written above each) and tokens/s."""
    from matplotlib.figure import Figure

    presets = list(dict.fromkeys(r["model"] for r in records)) or ["(no results)"]
    fig = Figure(figsize=(20, 3.8 * len(presets) + 0.6), layout="constrained")
    axes = fig.subplots(len(presets), 4, squeeze=False)
    seq = meta.get("settings", {}).get("seq", "?")
    for (loss_ax, diff_ax, mem_ax, tps_ax), preset in zip(axes, presets):
        recs = [r for r in records if r["model"] == preset and not r["error"] and r["losses"]]
        eager = next((r["losses"] for r in recs if r["provider"] == "eager"), [])
        names = [r["provider"] for r in recs]
        looks = [harness.PROVIDER_STYLE.get(n, ("#2ca02c", "x")) for n in names]
        for r, (color, marker) in zip(recs, looks):
            steps = range(1, len(r["losses"]) + 1)
            loss_ax.plot(steps, r["losses"], color=color, marker=marker, markersize=3, label=r["provider"])
            diffs = [a - b for a, b in zip(r["losses"], eager)]
            diff_ax.plot(steps[:len(diffs)], diffs, color=color, marker=marker, markersize=3, label=r["provider"])
        batch = recs[0]["batch"] if recs else "?"
        loss_ax.set(title=f"{preset}: loss, batch {batch} x {seq}", xlabel="step", ylabel="loss")
        diff_ax.set(title="loss - eager's loss", xlabel="step")
        for ax in (loss_ax, diff_ax):
            ax.grid(True, alpha=0.3)
        if recs:
            loss_ax.legend()
        colors = [c for c, _ in looks]
        drawn = mem_ax.bar(names, [(r["peak_bytes"] or 0) / 2**30 for r in recs], color=colors)
        mem_ax.bar_label(drawn, labels=["" if r["max_batch"] is None else
                                        f"largest {r['max_batch']}{'' if r['max_batch_exact'] else '+'}"
                                        for r in recs])
        if meta.get("memory_bytes"):
            mem_ax.axhline(meta["memory_bytes"] / 2**30, color="black", linestyle="--", linewidth=1)
        mem_ax.set(title=f"peak memory at batch {batch}, GiB (dashed: the GPU's)", ylabel="GiB")
        tps_ax.bar(names, [(r["tokens_per_s"] or 0) / 1e3 for r in recs], color=colors)
        tps_ax.set(title="training tokens/s, thousands", ylabel="k tokens/s")
    fig.suptitle(f"{meta.get('gpu', '?')} · training step, bf16 with float32 master weights · "
                 f"{str(meta.get('date', ''))[:10]}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
