"""The sections of the memory-bound ops and of training: ops, ops-backward, loss, optim."""

from __future__ import annotations

from .common import figure, header, pct, span, table

OP_ORDER = ("bias_gelu", "silu_mul", "gelu_mul", "rms_norm", "add_rms_norm", "layer_norm", "add_layer_norm",
            "rotary")
OPS_PEERS = ("eager", "torch.compile", "liger", "onetrip")

OPS_TEXT = """\
## Memory-bound fused ops (`onetrip bench ops`)

Peers, timed on the same inputs: **eager** (the op's `*_ref`, op by op as a user writes it:
HF-style RMSNorm, `x + r` then `F.layer_norm`, `F.silu(g) * u`, rotate-half RoPE),
**torch.compile** of that reference (default mode, static shapes) and **Liger-Kernel** where it
has the op. Timing "rotate": each replay runs the call 4-6 times back to back over 2-4 copies
of its inputs (>= 256 MiB together), so every call reads HBM, as a layer does in a model. The
sweep has rows x width = 2^26 elements (128 MiB a bf16 tensor); 4096 x 4096 and 64 x 262144
are the anchor shapes (32 MiB a tensor; 64 rows are fewer than the 132 SMs). Floor: bytes /
copy bandwidth, i.e. 100% of copy; the GLUs read two bytes for each one they write, and HBM
reads run faster than a copy's mix, hence above 100%. "Same-bytes copy" is a plain
element-wise kernel moving exactly the shape's bytes, timed alike: at 64 MiB it reaches only
~87-97% of the big copy, which bounds the anchors.
"""

BACKWARD_TEXT = """\
## Training passes of the fused ops (`onetrip bench ops --backward`)

The same ops, shapes and peers as above, with autograd: **fwd+bwd** is one replay of the
forward (recording autograd) and `torch.autograd.grad` against random upstream gradients;
**bwd** is fwd+bwd minus the forward alone, timed alike. Bytes: the backward reads the
upstream gradients, the saved inputs and the weight once and writes each gradient once
(per-program partial sums of a weight gradient not counted); fwd+bwd adds the forward's.
One call a replay (no rotation over input copies), L2 flushed before each.
"""

LOSS_TEXT = """\
## Losses (`onetrip bench loss`)

`cross_entropy` over bf16 logits (tokens x vocab = 2^28, 512 MiB), forward and backward:
bytes = logits read once + their gradient written once; peers: eager
`F.cross_entropy(logits.float(), t)` (what a Hugging Face model runs), torch.compile of it,
Liger-Kernel's `LigerCrossEntropyLoss` (gradient written over the logits). `inplace` is
onetrip with `inplace_backward=True`, the same trade. `linear_cross_entropy`: the LM head and
its loss together, time and the peak memory a fwd+bwd call adds (its gradients included),
against eager (`x @ W.T`, upcast, cross-entropy), torch.compile of it and Liger's
`LigerFusedLinearCrossEntropyLoss` (weight gradient accumulated in bf16 by default; `fp32-acc`
with `accum_dtype=float32`). onetrip accumulates the weight gradient in float32 by default;
`weight-dtype-acc` in the weight's dtype.
"""

OPTIM_TEXT = """\
## Optimizer (`onetrip bench optim`)

One AdamW step over Llama-3.1-8B's parameter shapes (embedding, head and the first 8 layers:
2.8 B parameters), random gradients. fp32: float32 parameters, gradients and state, against
`torch.optim.AdamW(fused=True)` and `(foreach=True)` (both `capturable=True`, so all three run
as CUDA-graph replays). bf16+master: bfloat16 parameters and gradients, float32 master weights
and state (onetrip only: torch's AdamW keeps bf16 state for bf16 parameters). Bytes per
parameter: 28 (fp32) and 30 (bf16+master), each read and write once.
"""


def ops_section(gpu: str, data: dict) -> str:
    res = data["results"]
    by = {(r["op"], r["shape"], r["provider"]): r for r in res}
    ops = [op for op in OP_ORDER if any(r["op"] == op for r in res)]
    summary = []
    for op in ops:
        mine = [r for r in res if r["op"] == op and r["provider"] == "onetrip" and r.get("gbs")]
        if op == "rotary":  # shapes are head layouts, not widths
            narrow, wide, anchors = [r["pct_of_copy"] for r in mine], [], []
        else:
            narrow = [r["pct_of_copy"] for r in mine if r.get("sweep") and r["width"] <= 32768]
            wide = [f"{r['width'] // 1024}K {r['pct_of_copy']:.1f}" for r in sorted(mine, key=lambda r: r["width"])
                    if r.get("sweep") and r["width"] > 32768]
            anchors = [f"{r['shape']} {r['pct_of_copy']:.1f}" for r in mine if not r.get("sweep")]
        speed = [(r["speedup_vs_best_peer"], r["best_peer"]) for r in mine if r.get("speedup_vs_best_peer")]
        low = min(speed) if speed else None
        vs = f"{low[0]:.3f}-{max(speed)[0]:.3f}x (lowest: {low[1]})" if low else "—"
        summary.append([op, span(narrow), ", ".join(wide) or "—", ", ".join(anchors) or "—", vs])
    out = [header(data["meta"]), "",
           table(["op", "% of copy, widths <= 32K", "wider (% of copy)", "anchors (% of copy)",
                  "onetrip / best peer"], summary), ""]
    rows = []
    for op in ops:
        for shape in sorted({r["shape"] for r in res if r["op"] == op and not r.get("sweep")} or
                            {r["shape"] for r in res if r["op"] == op}):
            cells = [by.get((op, shape, p)) for p in OPS_PEERS]
            if cells[-1] is None:
                continue
            gbs = ["—" if c is None or not c.get("gbs") else f"{c['gbs']:.0f}" for c in cells]
            gbs[-1] = f"**{gbs[-1]}** ({cells[-1]['pct_of_copy']:.1f}%)"
            same = cells[-1].get("pct_of_size_copy")
            rows.append([op, shape, *gbs, pct(same)])
    out += ["GB/s at the anchor shapes (rotary: every shape), every provider of the same run:", "",
            table(["op", "shape", *OPS_PEERS, "onetrip, % of same-bytes copy"], rows), ""]
    out += figure(gpu, "ops.png", "GB/s against width, every op and provider")
    return "\n".join(out)


def backward_section(gpu: str, data: dict) -> str:
    res = data["results"]
    ops = [op for op in OP_ORDER if any(r["op"] == op for r in res)]
    rows = []
    for op in ops:
        for p in ("fwd+bwd", "bwd"):
            mine = [r for r in res if r["op"] == op and r["pass"] == p and r["provider"] == "onetrip" and r.get("gbs")]
            narrow = [r["pct_of_copy"] for r in mine if r.get("width") is None or r["width"] <= 16384]
            speed = sorted((r["speedup_vs_best_peer"], r["best_peer"]) for r in mine if r.get("speedup_vs_best_peer"))
            vs = f"{speed[0][0]:.2f}-{speed[-1][0]:.2f}x (lowest: {speed[0][1]})" if speed else "—"
            peers = {}
            for r in res:
                if r["op"] == op and r["pass"] == p and r["provider"] != "onetrip" and r.get("pct_of_copy"):
                    peers.setdefault(r["provider"], []).append(r["pct_of_copy"])
            rows.append([op, p, span(narrow), span([r["pct_of_copy"] for r in mine]), vs,
                         "; ".join(f"{k} {span(v)}" for k, v in peers.items()) or "—"])
    out = [header(data["meta"]), "",
           table(["op", "pass", "onetrip % of copy, widths <= 16K", "all shapes", "onetrip / best peer",
                  "peers' % of copy"], rows), ""]
    out += figure(gpu, "ops-backward.png", "GB/s against width, fwd+bwd and bwd")
    return "\n".join(out)


def loss_section(gpu: str, data: dict) -> str:
    res = data["results"]
    ce = [r for r in res if r["part"] == "cross_entropy"]
    provs = list(dict.fromkeys(r["provider"] for r in ce))
    rows = []
    for shape in dict.fromkeys(r["shape"] for r in ce):
        by = {r["provider"]: r for r in ce if r["shape"] == shape}
        rows.append([f"V={by[provs[0]]['vocab']} ({shape})"] + [
            "—" if by.get(p) is None or not by[p].get("gbs") else
            (f"**{by[p]['pct_of_copy']:.1f}%**" if p.startswith("onetrip") else f"{by[p]['pct_of_copy']:.1f}%")
            for p in provs])
    out = [header(data["meta"]), "", "cross_entropy fwd+bwd, % of copy bandwidth:", "",
           table(["shape", *provs], rows), ""]
    lce = [r for r in res if r["part"] == "linear_cross_entropy"]
    provs = list(dict.fromkeys(r["provider"] for r in lce))
    rows = []
    for shape in dict.fromkeys(r["shape"] for r in lce):
        by = {r["provider"]: r for r in lce if r["shape"] == shape}
        rows.append([shape] + ["—" if by.get(p) is None or not by[p].get("median_ms") else
                               f"{by[p]['median_ms']:.1f} ms, {by[p]['peak_extra_bytes'] / 2**30:.2f} GiB"
                               for p in provs])
    out += ["linear_cross_entropy fwd+bwd (tokens x hidden x vocab): time, peak memory added:", "",
            table(["shape", *provs], rows), ""]
    out += figure(gpu, "loss.png", "losses: GB/s, time and peak memory")
    return "\n".join(out)


def optim_section(gpu: str, data: dict) -> str:
    rows = [[r["config"], r["provider"], "—" if not r.get("median_ms") else f"{r['median_ms']:.2f}",
             "—" if not r.get("gbs") else f"{r['gbs']:.0f}", pct(r.get("pct_of_copy")),
             f"{r['speedup_vs_best_peer']:.2f}x" if r.get("speedup_vs_best_peer") else "—"]
            for r in data["results"]]
    return "\n".join([header(data["meta"]), "", table(["config", "provider", "ms", "GB/s", "% of copy",
                                                      "onetrip / best peer"], rows), ""])
