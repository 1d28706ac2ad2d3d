"""The one-GPU model sections: decode engine, batch-1 projections, the demo, the training step."""

from __future__ import annotations

from .common import figure, header, table

DECODE_PROVIDERS = ("transformers", "gpt-fast", "onetrip-eager", "onetrip-fused", "onetrip-graphs", "onetrip-paged")

DECODE_TEXT = """\
## Decode engine (`onetrip bench decode`)

Whole-model decode with random weights (bf16), a 32-token prompt and 256 new tokens, the same
weights for every provider: transformers' `generate`, a gpt-fast-style decoder under
`torch.compile(mode="reduce-overhead")`, and onetrip's engine eager (op by op), fused (onetrip's
kernels) and fused with the whole decode step replayed as one CUDA graph (contiguous and paged
KV cache). Limit: copy bandwidth / bytes read per token (the weights, plus the KV cache);
`% limit` is tok/s against it. Time to first token (TTFT) at batch 1 (the prefill forward and
the first token's argmax; median of 3 after a warm-up), with onetrip-graphs replaying prompts of
up to 2,048 padded tokens from a CUDA graph, beside the compute floor: the prefill's FLOPs
(2 x parameters x tokens plus attention's) at the bf16 matmul rate measured in the same run.
A run with only some providers or batches (`decode-ttft.json`: the TTFT run, batch 1) shows
what it measured.
"""

GEMV_TEXT = """\
## Batch-1 projections (`onetrip bench gemv`)

Every projection of a decode step as `x (1, K) @ W.T`, bf16: cuBLAS through `F.linear` against
onetrip's `skinny_matmul`, each call on its own copy of the weight so each reads HBM. Floor:
weight bytes / copy bandwidth.
"""

DEMO_TEXT = """\
## The demo (`onetrip demo`)

One decode step of Llama-3.2-1B (random weights, batch 1) three ways, each profiled by
`onetrip profile`: kernels per step, the share of the step the GPU sits idle, and the verdict.
"""

TRAIN_TEXT = """\
## Training step (`onetrip bench train`)

A whole training step (forward, backward, AdamW) of transformers' LlamaForCausalLM with
Llama-3.2-1B's shapes and Qwen2ForCausalLM with Qwen2.5-0.5B's, random weights (the same for
every provider), bf16 parameters, activations and gradients with float32 master weights and
AdamW state: transformers **eager** (SDPA attention; the loss over every logit, upcast to
float32), **torch.compile** of it, **Liger-Kernel** (`apply_liger_kernel_to_llama` / `_qwen2`
defaults: RMSNorm, SwiGLU, RoPE, fused linear cross-entropy) and **onetrip** (`onetrip.patch`
with `onetrip.optim.AdamW(master_weights=True)`; the others step torch's fused AdamW on float32
master copies). Tokens/s: batch x seq over the median step time (CUDA events, after 3 warm-up
steps). Peak: everything the step holds (`torch.cuda.max_memory_allocated`: weights, grads,
optimizer state, activations), at the largest batch eager fits, so that memory compares at the
same batch. Largest batch: the most sequences a step fits in the GPU's memory (`+`: a lower
bound). Loss: the largest |loss - eager's loss| over 20 steps on the same data.
"""


def decode_section(gpu: str, runs: list[dict]) -> str:
    out = []
    for data in runs:
        res = data["results"]
        steps = [r for r in res if r.get("kind") != "ttft"]
        provs = [p for p in DECODE_PROVIDERS if any(r["provider"] == p for r in steps)]
        by = {(r["preset"], r["batch"], r["provider"]): r for r in steps}
        rows = []
        for preset, batch in sorted({(r["preset"], r["batch"]) for r in steps}):
            row = [f"{preset}, batch {batch}"]
            for p in provs:
                r = by.get((preset, batch, p))
                text = "—" if r is None or not r.get("tok_s") else f"{r['tok_s']:.0f}"
                if r is not None and p == "onetrip-graphs" and r.get("pct_of_limit"):
                    text = f"**{text}** ({r['pct_of_limit']:.0f}%)"
                row.append(text)
            lim = next((r["limit_tok_s"] for r in steps if r["preset"] == preset and r["batch"] == batch
                        and r.get("limit_tok_s")), None)
            row.append("—" if lim is None else f"{lim:.0f}")
            rows.append(row)
        out += [header(data["meta"]), "", table(["tok/s", *provs, "limit"], rows), ""]
        ttft = [r for r in res if r.get("kind") == "ttft"]
        if ttft:
            tprovs = [p for p in DECODE_PROVIDERS if any(r["provider"] == p for r in ttft)]
            tby = {(r["preset"], r["prompt"], r["provider"]): r for r in ttft}
            trows, rate = [], data["meta"].get("matmul_tflops")
            for preset, prompt in sorted({(r["preset"], r["prompt"]) for r in ttft}):
                floor = next((r["floor_ms"] for r in ttft if r["preset"] == preset and r["prompt"] == prompt
                              and r.get("floor_ms")), None)
                trows.append([f"{preset}, {prompt} tokens",
                              *["—" if (preset, prompt, p) not in tby or not tby[(preset, prompt, p)].get("ttft_ms")
                                else f"{tby[(preset, prompt, p)]['ttft_ms']:.1f}" for p in tprovs],
                              *([] if not rate else ["—" if floor is None else f"{floor:.1f}"])])
            note = (f" (floor: the prefill's FLOPs at the matmul rate measured in the run, {rate:.0f} TFLOP/s)"
                    if rate else "")
            out += [f"Time to first token, ms{note}:", "",
                    table(["prompt", *tprovs, *(["floor"] if rate else [])], trows), ""]
            bars = _ttft_bars(tby)
            if bars:
                out += ["Against the bar (onetrip-graphs' TTFT at most the larger of half of transformers' and "
                        "1.25x the floor): " + "; ".join(bars) + ".", ""]
    return "\n".join(out)


def _ttft_bars(tby: dict) -> list[str]:
    """One clause a (preset, prompt) that has onetrip-graphs, transformers and a floor."""
    out = []
    for preset, prompt in sorted({(k[0], k[1]) for k in tby}):
        ours, hf = tby.get((preset, prompt, "onetrip-graphs")), tby.get((preset, prompt, "transformers"))
        if not ours or not hf or not ours.get("ttft_ms") or not hf.get("ttft_ms") or not ours.get("floor_ms"):
            continue
        bar = max(hf["ttft_ms"] / 2, 1.25 * ours["floor_ms"])
        verdict = "met" if ours["ttft_ms"] <= bar else "not met"
        out.append(f"{preset} at {prompt} tokens {ours['ttft_ms']:.1f} ms against {bar:.1f} "
                   f"({ours['ttft_ms'] / ours['floor_ms']:.2f}x the floor): {verdict}")
    return out


def gemv_section(gpu: str, data: dict) -> str:
    res = [r for r in data["results"] if r["rows"] == 1]
    by = {(r["preset"], r["proj"], r["provider"]): r for r in res}
    rows = []
    for preset, proj in dict.fromkeys((r["preset"], r["proj"]) for r in res):
        cub, me = by.get((preset, proj, "cublas")), by.get((preset, proj, "onetrip"))
        if not (cub and me and cub.get("gbs") and me.get("gbs")):
            continue
        rows.append([preset, me["shape"], f"{cub['gbs']:.0f} ({cub['pct_of_copy']:.0f}%)",
                     f"**{me['gbs']:.0f}** ({me['pct_of_copy']:.0f}%)", f"{me['speedup_vs_cublas']:.2f}x"])
    return "\n".join([header(data["meta"]), "",
                      table(["model", "projection (N x K)", "cuBLAS GB/s", "onetrip GB/s", "speedup"], rows), ""])


def train_section(gpu: str, data: dict) -> str:
    seq = data["meta"].get("settings", {}).get("seq")
    rows, missing = [], []
    for r in data["results"]:
        if r.get("error") or not r.get("losses"):
            missing.append(f"{r['model']} {r['provider']}: {r.get('error') or r.get('skipped')}")
            continue
        vs = lambda key: f" ({r[key]:.2f}x)" if r.get(key) else ""
        star = (lambda text: f"**{text}**") if r["provider"] == "onetrip" else (lambda text: text)
        largest = "—" if r.get("max_batch") is None else \
            f"{r['max_batch']}{'' if r['max_batch_exact'] else '+'} x {r['seq']}{vs('max_tokens_vs_eager')}"
        rows.append([r["model"], r["provider"], str(r["batch"]),
                     "—" if not r.get("tokens_per_s") else star(f"{r['tokens_per_s']:,.0f}") + vs("speedup_vs_eager"),
                     "—" if not r.get("peak_bytes") else star(f"{r['peak_bytes'] / 2**30:.1f}") + vs("peak_vs_eager"),
                     largest, "—" if r.get("max_loss_diff") is None else f"{r['max_loss_diff']:.1e}"])
    out = [header(data["meta"]), "",
           table(["model", "provider", "batch", f"tokens/s (vs eager), seq {seq}", "peak GiB (vs eager)",
                  "largest batch (vs eager)", "max loss diff"], rows), ""]
    if missing:
        out += ["Not measured: " + "; ".join(missing) + ".", ""]
    out += figure(gpu, "train.png", "loss curves, peak memory and tokens/s per provider")
    return "\n".join(out)


def demo_section(gpu: str, data: dict) -> str:
    rows = [[r["mode"], f"{r['tok_s']:.0f}", f"{r['pct_of_limit']:.0f}%", str(r["kernels_per_step"]),
             f"{100 * r['idle_share']:.0f}%", r["verdict"]] for r in data["results"]]
    out = [header(data["meta"]), "",
           table(["mode", "tok/s", "% of limit", "kernels / step", "idle share", "verdict"], rows), ""]
    out += figure(gpu, "demo-timelines.png", "the three timelines")
    return "\n".join(out)
