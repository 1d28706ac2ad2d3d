"""The sections over many requests or many GPUs: serving, the tensor-parallel all-reduce, TP decode."""

from __future__ import annotations

import re

from .common import figure, first_line, header, pct, table

DECODE_TP_PROVIDERS = ("gptfast-tp", "onetrip-tp-nccl", "onetrip-tp")
SERVE_PROVIDERS = ("onetrip", "transformers-cb", "onetrip-static")
SERVE_BAR_PRESETS, SERVE_BAR_C = ("llama-3.2-1b", "llama-3.1-8b"), 64  # the bars hold at 64 streams, closed loop
SERVE_BARS = (  # (onetrip's record key, the peer it needs, label, "at least" (else "at most"), the bar)
    ("vs_transformers_cb", "transformers-cb", "output tok/s / transformers-cb's", True, 10.0),
    ("vs_static", "onetrip-static", "output tok/s / onetrip-static's", True, 0.8),
    ("itl_p50_over_static_step", "onetrip-static", "ITL p50 / static step", False, 1.3))

SERVE_TEXT = """\
## Serving (`onetrip bench serve`)

A seeded load on random bf16 weights (the same for every provider): requests of random token
ids, prompt lengths uniform over a range, exactly a fixed number of new tokens each (greedy, EOS
ignored), sent either with C requests in flight (a new one when one finishes: a closed loop) or
at Poisson arrivals of a given rate (an open loop); C is also each engine's batch cap.
Providers: **onetrip** (the continuous-batching `Scheduler` driven in-process: fused kernels,
the decode step replayed as CUDA graphs), **transformers-cb** (transformers' continuous batching
manager, what `generate_batch` runs, with its defaults) and **onetrip-static** (`Engine.generate`
on batches of C prompts, all ready at t = 0: the ceiling continuous batching aims at). Metrics:
output tok/s (generated tokens over the run, first send to last token), req/s, TTFT p50 / p99
(first token's time minus the request's send time), ITL p50 / p99 (the gaps between a
request's consecutive tokens), ITL / step (ITL p50 over onetrip-static's median decode step at
batch C), and tok/s over transformers-cb's and onetrip-static's. Tokens: every request got its
count, and the share of its greedy tokens equal to onetrip-static's (random weights leave
near-ties that bf16 rounding flips, and a sequence differs from its first flip on). Bars: at 64
concurrent streams, onetrip's output tok/s at least 10x transformers-cb's and at least 80% of
onetrip-static's at the same batch, for Llama-3.2-1B and Llama-3.1-8B; its ITL p50 at most 1.3x
the static decode step.
"""

ALLREDUCE_TEXT = """\
## Tensor-parallel all-reduce + residual add + RMSNorm (`onetrip bench allreduce --world N`)

Each rank holds a bf16 partial (batch x hidden); every provider returns h = the sum over ranks +
the residual, and RMSNorm(h): **nccl+add_rms_norm** (`dist.all_reduce` in place, then onetrip's
`add_rms_norm`), **symm-one-shot+add_rms_norm** (PyTorch's symmetric-memory
`one_shot_all_reduce` of a partial already in symmetric memory, then `add_rms_norm`) and
**onetrip-fused** (`allreduce_add_rms_norm`: one kernel stores the rows into every peer's buffer
over NVLink, meets its peers at per-program flags, sums in rank order and normalizes). Timing: a
CUDA graph of 100 back-to-back calls, us a call = the replays' median / 100, the max over ranks
(the slowest rank sets a TP step's pace); payload: a rank's partial. Check: one eager call's
outputs against a float64 evaluation, at most twice PyTorch's own bf16 error. Bar:
onetrip-fused at least 1.2x nccl+add_rms_norm at hidden 8192, batch 1-64.
"""

DECODE_TP_TEXT = """\
## Tensor-parallel decode (`onetrip bench decode --tp N`)

Llama-shaped models with random bf16 weights sharded over N GPUs, one process each
(column-parallel q/k/v and gate/up, row-parallel o and down, the LM head split over the
vocabulary), a 32-token prompt and 128 new tokens, greedy: **onetrip-tp** (onetrip's engine,
the step one CUDA graph, a layer's two all-reduces fused with the residual add and RMSNorm) and
**onetrip-tp-nccl** (the same with NCCL, then the add + norm kernel). tok/s: rank 0's. % of
floor: the floor over the step time, the floor being the max over ranks of (its weights + its
KV cache, bytes) / its copy bandwidth measured in the run (the aggregate bandwidth limit). AR: a
layer's two all-reduces timed alone in a CUDA graph, us a layer, and layers x that as a share of
the step. vs TP 1: tok/s over onetrip's TP-1 run (the one-GPU engine) of the same build and day.
Bars: Llama-3.1-8B at TP 2 at least 1.7x onetrip's own TP 1 tok/s at batch 1; a 70B-shaped model
at TP 4 and 8 at least 75% of the aggregate bandwidth limit and ahead of the gpt-fast-style
decoder.

From another run (the previous build, the same day, its fused all-reduce pulling peers' rows
instead of pushing them): **gptfast-tp** (gpt-fast's TP recipe on the same shard tensors:
`torch.compile(mode="reduce-overhead")`, NCCL all-reduce) decoded Llama-3.1-8B at TP 2 at 232
tok/s at batch 1 and 3913 at batch 32, onetrip-tp at 350 and 9385 there: vs gptfast-tp 1.51x /
2.40x. The curated runs leave gptfast-tp out (its compile takes minutes a rank).
"""


def serve_section(gpu: str, data: dict) -> str:
    """A table per (preset, load point): a row per provider, onetrip-static's row (it ignores
    arrivals) under every load point of its concurrency; then the bars."""
    meta, res = data["meta"], data["results"]
    out = [header(meta), "",
           f"{meta.get('num_requests')} requests, prompts {meta.get('prompt_lo')}-{meta.get('prompt_hi')} tokens, "
           f"{meta.get('output_len')} new tokens each; {meta.get('arrivals')}.", ""]
    order = {p: i for i, p in enumerate(SERVE_PROVIDERS)}
    static = {(r["preset"], r["concurrency"]): r for r in res if r["provider"] == "onetrip-static"}
    points = {(r["preset"], r["concurrency"], r.get("rate")) for r in res if r["provider"] != "onetrip-static"}
    points |= {(preset, c, None) for preset, c in static if not any(k[:2] == (preset, c) for k in points)}
    presets = list(dict.fromkeys(r["preset"] for r in res))  # in the run's order
    points = sorted(points, key=lambda k: (presets.index(k[0]), k[1], k[2] or 0.0))
    for preset, c, rate in points:
        rows = [r for r in res if (r["preset"], r["concurrency"], r.get("rate")) == (preset, c, rate)
                and r["provider"] != "onetrip-static"]
        if (preset, c) in static:
            rows.append(static[(preset, c)])
        table_rows, failed = [], []
        for r in sorted(rows, key=lambda r: order.get(r["provider"], len(order))):
            if r.get("error"):
                table_rows.append([r["provider"], *["—"] * 8])
                failed.append(f"{r['provider']}: {first_line(r['error'])}")
                continue
            num = lambda key, fmt, unit="": "—" if r.get(key) is None else format(r[key], fmt) + unit
            pair = lambda key: "—" if r.get(f"{key}_p50_ms") is None else \
                f"{r[f'{key}_p50_ms']:.1f} / {r[f'{key}_p99_ms']:.1f}"
            tok = num("output_tok_s", ".0f")
            agree = r.get("tokens_agree_static")
            tokens = ("ok" if r.get("tokens_ok") else "WRONG count") + \
                ("" if agree is None or r["provider"] == "onetrip-static" else f", {100 * agree:.0f}% same as static")
            table_rows.append([r["provider"], f"**{tok}**" if r["provider"] == "onetrip" else tok,
                               num("requests_s", ".1f"), pair("ttft"), pair("itl"),
                               num("itl_p50_over_static_step", ".2f", "x"), num("vs_transformers_cb", ".2f", "x"),
                               num("vs_static", ".2f", "x"), tokens])
        step = static.get((preset, c), {}).get("static_step_ms")
        load = f"C={c}" + ("" if rate is None else f", {rate:g} req/s")
        out += [f"{preset}, {load}" + ("" if step is None else f"; static decode step {step:.2f} ms") + ":", "",
                table(["provider", "output tok/s", "req/s", "TTFT ms p50 / p99", "ITL ms p50 / p99", "ITL / step",
                       "vs transformers-cb", "vs static", "tokens"], table_rows), ""]
        settings = next((r["settings"] for r in rows if r.get("settings")), None)
        if settings:
            out += [f"transformers-cb: {settings}.", ""]
        if failed:
            out += ["Failed: " + "; ".join(failed) + ".", ""]
    out += figure(gpu, "serve.png", "output tok/s, TTFT and ITL against the load")
    return "\n".join(out) + "\n" + serve_bars(res)


def serve_bars(res: list[dict]) -> str:
    """The bars per preset at 64 streams, closed loop: met, not met, or not measured (why)."""
    lines = []
    for preset in SERVE_BAR_PRESETS:
        point = (preset, SERVE_BAR_C, None)
        at = {r["provider"]: r for r in res if (r["preset"], r["concurrency"], r.get("rate")) == point}
        mine = at.get("onetrip")
        if mine is None or mine.get("error"):
            lines.append(f"- {preset}: not measured ({'no run' if mine is None else first_line(mine['error'])}).")
            continue
        cells = []
        for key, peer, label, at_least, bar in SERVE_BARS:
            value, other = mine.get(key), at.get(peer)
            if value is None:
                why = f"{peer}: {first_line(other['error'])}" if other and other.get("error") else f"no {peer} run"
                cells.append(f"{label} not measured ({why})")
                continue
            met = value >= bar if at_least else value <= bar
            cells.append(f"{label} {value:.2f}x (bar {'>=' if at_least else '<='} {bar:g}x: "
                         f"{'met' if met else 'not met'})")
        lines.append(f"- {preset}: " + "; ".join(cells) + ".")
    return f"Against the bars (C={SERVE_BAR_C}, closed loop):\n\n" + "\n".join(lines) + "\n"


# --------------------------------------------------------------------- tensor parallel

def allreduce_section(gpu: str, data: dict) -> str:
    res = data["results"]
    provs = list(dict.fromkeys(r["provider"] for r in res))
    out = [header(data["meta"]), ""]
    for hidden in dict.fromkeys(r["hidden"] for r in res):
        rows = []
        for batch in dict.fromkeys(r["batch"] for r in res if r["hidden"] == hidden):
            by = {r["provider"]: r for r in res if (r["hidden"], r["batch"]) == (hidden, batch)}
            cells = ["—" if by.get(p) is None or by[p].get("us_max") is None else
                     (f"**{by[p]['us_max']:.1f}**" if p == "onetrip-fused" else f"{by[p]['us_max']:.1f}")
                     for p in provs]
            mine = by.get("onetrip-fused") or {}
            check = "—" if mine.get("ok") is None else \
                f"{'ok' if mine['ok'] else 'FAIL'} ({mine['max_err']:.1e} / {mine['bound']:.1e})"
            payload = next(r["payload_bytes"] for r in by.values())
            rows.append([str(batch), f"{payload // 1024} KiB", *cells,
                         f"{mine['speedup']:.2f}x" if mine.get("speedup") else "—", check])
        out += [f"hidden {hidden}, us a call (max over ranks):", "",
                table(["batch", "payload", *provs, "fused / nccl", "fused check (max err / bound)"], rows), ""]
    failed = [f"{r['provider']} {r['hidden']} x {r['batch']}: {r['error']}" for r in res if r.get("error")]
    if failed:
        out += ["Failed: " + "; ".join(failed) + ".", ""]
    bar = [r for r in res if r["provider"] == "onetrip-fused" and r["hidden"] == 8192 and 1 <= r["batch"] <= 64]
    if bar:
        speed = [r.get("speedup") or 0.0 for r in bar]
        out += [f"Against the bar (hidden 8192, batch {min(r['batch'] for r in bar)}-{max(r['batch'] for r in bar)}): "
                f"onetrip-fused {min(speed):.2f}-{max(speed):.2f}x nccl+add_rms_norm, "
                f"{'met' if min(speed) >= 1.2 else 'not met'}.", ""]
    return "\n".join(out)


def natural(text: str) -> list:
    """Sort key that puts llama-3.1-8b before llama-3.1-70b."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def decode_tp_section(gpu: str, runs: list[dict]) -> str:
    """One table over every run of the folder: a row per (preset, TP, batch, provider)."""
    recs = [r for data in runs for r in data["results"]]
    out = []
    for data in sorted(runs, key=lambda d: (d["meta"]["tp"], d["meta"]["date"])):
        presets = ", ".join(dict.fromkeys(r["preset"] for r in data["results"]))
        out.append(f"- TP {data['meta']['tp']}, {presets}: {header(data['meta'])}")
    order = {p: i for i, p in enumerate(DECODE_TP_PROVIDERS)}
    rows = []
    for r in sorted(recs, key=lambda r: (natural(r["preset"]), r["tp"], r["batch"], order.get(r["provider"], -1))):
        num = lambda key, fmt: "—" if r.get(key) is None else format(r[key], fmt)
        tok = num("tok_s", ".0f")
        rows.append([r["preset"], str(r["tp"]), str(r["batch"]), r["provider"],
                     f"**{tok}**" if r["provider"] == "onetrip-tp" and r.get("tok_s") else tok,
                     num("ms_per_step", ".2f"), pct(r.get("pct_of_floor")), num("allreduce_us_per_layer", ".1f"),
                     pct(r.get("allreduce_pct_of_step")), num("vs_tp1", ".2f") + "x" * (r.get("vs_tp1") is not None),
                     num("vs_gptfast", ".2f") + "x" * (r.get("vs_gptfast") is not None)])
    out += ["", table(["preset", "TP", "batch", "provider", "tok/s", "ms / step", "% of floor", "AR us / layer",
                       "AR % of step", "vs TP 1", "vs gptfast-tp"], rows), ""]
    failed = [f"{r['preset']} TP {r['tp']} batch {r['batch']} {r['provider']}: {r['error']}" for r in recs
              if r.get("error")]
    if failed:
        out += ["Failed: " + "; ".join(failed) + ".", ""]
    return "\n".join(out)


def decode_tp_bars(runs: list[dict]) -> str:
    """The issue's bars against the runs of every GPU folder."""
    mine = [r for data in runs for r in data["results"] if r["provider"] == "onetrip-tp" and r.get("tok_s")]
    small = next((r for r in mine if r["preset"] == "llama-3.1-8b" and r["tp"] == 2 and r["batch"] == 1
                  and r.get("vs_tp1")), None)
    first = "Llama-3.1-8B, TP 2, batch 1: " + ("not measured" if small is None else
                                               f"{small['vs_tp1']:.2f}x onetrip's TP 1 tok/s "
                                               f"(bar 1.7x: {'met' if small['vs_tp1'] >= 1.7 else 'not met'})")
    big = lambda tp: [r for r in mine if "70b" in r["preset"] and r["tp"] == tp]
    cells = []
    for tp in (2, 4, 8):
        for r in big(tp):
            peer = f", {r['vs_gptfast']:.2f}x gptfast-tp" if r.get("vs_gptfast") else ", gptfast-tp not run"
            cells.append(f"TP {tp} batch {r['batch']}: {pct(r.get('pct_of_floor'))} of the floor{peer}")
    if not big(4) and not big(8):
        cells.append("TP 4 / 8: not measured, no 4- or 8-GPU machine lent")
    return f"Against the bars: {first}. 70B-shaped (bar: TP 4 and 8, 75% of the floor): {'; '.join(cells)}.\n"
