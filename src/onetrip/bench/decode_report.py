"""The table and the plot of ``onetrip bench decode``."""

from __future__ import annotations

from pathlib import Path

DECODE_STYLE = {  # provider: colour
    "transformers": "#7f7f7f",
    "gpt-fast": "#1f77b4",
    "onetrip-eager": "#bcbd22",
    "onetrip-fused": "#ff7f0e",
    "onetrip-graphs": "#d62728",
    "onetrip-paged": "#9467bd",
}


def _num(x, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def print_decode_table(con, records: list[dict], ttfts: list[dict], meta: dict) -> None:
    """One table per preset: a row per (batch, provider) with tok/s, % of the bandwidth
    limit, ms per step, kernels per step; then time to first token."""
    from rich.table import Table

    for preset in dict.fromkeys(r["preset"] for r in records):
        rows = [r for r in records if r["preset"] == preset]
        limit = next((r.get("limit_tok_s") for r in rows if r.get("limit_tok_s")), None)
        t = Table(title=f"{preset}: decode, {meta.get('dtype')}, prompt {meta.get('prompt')}, "
                        f"{meta.get('new_tokens')} new tokens · {meta.get('gpu')} · copy {meta.get('copy_gbs', 0):.0f} GB/s")
        for col in ("batch", "provider", "tok/s", "% of limit", "ms / step", "kernels / step", "from graphs",
                    "prefill ms", "same prefix"):
            t.add_column(col, justify="right" if col != "provider" else "left")
        for r in rows:
            if "error" in r:
                t.add_row(str(r["batch"]), r["provider"], f"[red]{r['error'][:60]}[/]", *[""] * 6)
                continue
            t.add_row(str(r["batch"]), r["provider"], f"{r['tok_s']:.0f}", _num(r.get("pct_of_limit"), ".0f") + "%",
                      f"{r['ms_per_step']:.2f}", _num(r.get("kernels_per_step"), ".0f"),
                      _num(r.get("graph_kernels_per_step"), ".0f"), f"{r['prefill_ms']:.1f}",
                      _prefix(r, meta))
        con.print(t)
        if limit:  # at the smallest batch run (a run of --batch 8 32 has no batch 1)
            b0 = min(r["batch"] for r in rows if r.get("limit_tok_s"))
            lim = min(r["limit_tok_s"] for r in rows if r["batch"] == b0 and r.get("limit_tok_s"))
            con.print(f"  limit at batch {b0}: {lim:.0f} tok/s (copy bandwidth / bytes per step: weights once + KV cache)")
        chain = (meta.get("read_chain") or {}).get(preset) or {}
        if chain.get("ms"):
            con.print(f"  a chain of {chain['launches']} plain-read kernels over the step's weight matrices "
                      f"(one graph, nothing else): {chain['ms']:.3f} ms, {chain.get('pct_of_copy', 0):.0f}% of copy "
                      f"for their {chain['bytes'] / 1e9:.2f} GB: the floor of a step of that many kernels")
        con.print("  same prefix: greedy tokens equal to the first provider's before the first difference "
                  "(shortest over the batch). Random weights leave the top logits near ties, so bf16 "
                  "rounding (another GEMM split) flips a pick within a few tokens; float32 runs on the CPU "
                  "agree token for token (tests/test_engine.py).")
    if ttfts:
        rate = meta.get("matmul_tflops")
        t = Table(title="time to first token, batch 1 (ms); floor: the prefill's FLOPs at the measured "
                        + (f"matmul rate ({rate:.0f} TFLOP/s)" if rate else "matmul rate (not measured)"))
        for col in ("preset", "prompt", "provider", "TTFT ms", "floor ms"):
            t.add_column(col)
        for r in ttfts:
            t.add_row(str(r["preset"]), str(r["prompt"]), r["provider"],
                      f"[red]{r['error'][:60]}[/]" if "error" in r else f"{r['ttft_ms']:.1f}",
                      f"{r['floor_ms']:.1f}" if r.get("floor_ms") else "—")
        con.print(t)


def _prefix(r: dict, meta: dict) -> str:
    if "same_prefix" not in r:
        return f"{100 * r.get('tokens_agree', 0):.0f}%"
    return f"{r['same_prefix']}/{meta.get('new_tokens')}"


def plot_decode(records: list[dict], meta: dict, path: Path) -> Path:
    """Grouped bars: tok/s per provider for each batch, one panel per preset, with the
    bandwidth limit of each batch drawn as a black tick."""
    from matplotlib.figure import Figure

    presets = list(dict.fromkeys(r["preset"] for r in records))
    providers = list(dict.fromkeys(r["provider"] for r in records))
    fig = Figure(figsize=(6.5 * max(1, len(presets)), 4.2), layout="constrained")
    axes = fig.subplots(1, max(1, len(presets)), squeeze=False)[0]
    width = 0.8 / max(1, len(providers))
    for ax, preset in zip(axes, presets):
        rows = [r for r in records if r["preset"] == preset]
        batches = sorted({r["batch"] for r in rows})
        for j, prov in enumerate(providers):
            xs, ys = [], []
            for i, b in enumerate(batches):
                r = next((r for r in rows if r["batch"] == b and r["provider"] == prov and "tok_s" in r), None)
                if r:
                    xs.append(i + (j - (len(providers) - 1) / 2) * width)
                    ys.append(r["tok_s"])
            ax.bar(xs, ys, width, label=prov, color=DECODE_STYLE.get(prov))
        for i, b in enumerate(batches):
            lim = next((r["limit_tok_s"] for r in rows if r["batch"] == b and r.get("limit_tok_s")), None)
            if lim:
                ax.hlines(lim, i - 0.45, i + 0.45, colors="black", linestyles="--", linewidth=1)
        ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
        ax.set_yscale("log")
        ax.set_ylabel("tokens / s (all sequences)")
        ax.set_title(f"{preset} ({meta.get('dtype')})")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"decode on {meta.get('gpu')}, {meta.get('date', '')[:10]}; dashed: bandwidth limit", fontsize=10)
    fig.savefig(path, dpi=120)
    return Path(path)
