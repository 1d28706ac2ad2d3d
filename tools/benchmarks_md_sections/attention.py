"""The attention sections: prefill attention, its backward, decode attention."""

from __future__ import annotations

from .common import figure, header, table

ATTN_PEERS = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "onetrip")

ATTN_TEXT = """\
## Prefill attention (`onetrip bench attention`)

`flash_attention` against SDPA's FlashAttention-2 (`sdpa-flash`), cuDNN (`sdpa-cudnn`) and
memory-efficient (`sdpa-efficient`) backends, 16K tokens a batch, heads x head_dim = 2048,
bf16. Floor: FLOPs over the bf16 matmul rate (~750-790 TFLOP/s measured on an H200 at
8192^3). SDPA runs on (batch, heads, seq, head_dim) copies made before timing; the varlen cell
times one SDPA call per sequence, all in one CUDA graph.
"""

ATTN_BWD_TEXT = """\
## Attention backward (`onetrip bench attention --backward`)

The same cells, with autograd: fwd+bwd (the forward recording autograd and
`torch.autograd.grad` of its output) and bwd (fwd+bwd minus the forward alone). FLOPs as
FlashAttention counts them: the backward 2.5x the forward's, fwd+bwd 3.5x. Peers: SDPA's
FlashAttention-2, cuDNN and memory-efficient backends. onetrip in its default mode (dQ summed with
float32 atomics) and `onetrip-det` (`deterministic=True`: no atomics, bit-identical runs).
"""

DATTN_TEXT = """\
## Decode attention (`onetrip bench decode-attention`)

`decode_attention` (split-KV, one query token, 32 query heads over 8 KV heads of 128, bf16) on
a contiguous cache and on paged caches of 64- and 256-token pages, against SDPA
(`enable_gqa=True`, on transposed views of the cache) and a naive eager version. Bytes: K and V
of the cached tokens read once, plus q and the output. Floor: those bytes / copy bandwidth.
Small cells (batch 1, 4K context: 16.8 MB) cannot fill the GPU; `read %` is what a kernel that
only reads the same bytes reaches, timed alike. `append_kv` (RoPE on q and k, k and v written
into the cache) against rotary + `index_copy_`.
"""


def attention_section(gpu: str, data: dict) -> str:
    res = data["results"]
    by = {(r["cell"], r["provider"]): r for r in res}
    cells = list(dict.fromkeys(r["cell"] for r in res))
    rows = []
    for cell in cells:
        vals = [by.get((cell, p)) for p in ATTN_PEERS]
        tf = ["—" if v is None or not v.get("tflops") else f"{v['tflops']:.0f}" for v in vals]
        me = vals[-1]
        if me is None or not me.get("tflops"):
            continue
        tf[-1] = f"**{tf[-1]}**"
        ratio = [f"{me[k]:.2f}x" if me.get(k) else "—" for k in ("vs_fa2", "vs_cudnn")]
        rows.append([cell, *tf, *ratio])
    out = [header(data["meta"]), "",
           table(["cell (TFLOP/s)", *ATTN_PEERS, "vs FA2", "vs cuDNN"], rows), ""]
    out += figure(gpu, "attention.png", "TFLOP/s per cell and provider")
    return "\n".join(out)


def attention_backward_section(gpu: str, data: dict) -> str:
    res = data["results"]
    provs = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "onetrip-det", "onetrip")
    rows = []
    for cell in dict.fromkeys(r["cell"] for r in res):
        for p in ("bwd", "fwd+bwd"):
            by = {r["provider"]: r for r in res if r["cell"] == cell and r["pass"] == p}
            me = by.get("onetrip")
            if me is None or not me.get("tflops"):
                continue
            tf = ["—" if by.get(x) is None or not by[x].get("tflops") else f"{by[x]['tflops']:.0f}" for x in provs]
            tf[-1] = f"**{tf[-1]}**"
            rows.append([cell, p, *tf, *(f"{me[k]:.2f}x" if me.get(k) else "—" for k in ("vs_fa2", "vs_cudnn"))])
    out = [header(data["meta"]), "", table(["cell (TFLOP/s)", "pass", *provs, "vs FA2", "vs cuDNN"], rows), ""]
    out += figure(gpu, "attention-backward.png", "backward TFLOP/s per cell and provider")
    return "\n".join(out)


def decode_attention_section(gpu: str, data: dict) -> str:
    res = data["results"]
    by = {(r["kind"], r["layout"], r["batch"], r.get("context"), r.get("q_len"), r["provider"]): r for r in res}
    layouts = sorted({r["layout"] for r in res if r["kind"] == "decode"}, key=lambda s: (s != "contiguous", s))
    pairs = sorted({(r["batch"], r["context"]) for r in res if r["kind"] == "decode"})
    rows = []
    for b, ctx in pairs:
        row = [f"{b} x {ctx // 1024}K"]
        for layout in layouts:
            me = by.get(("decode", layout, b, ctx, 1, "onetrip"))
            row.append("—" if me is None or not me.get("gbs") else
                       f"**{me['pct_of_copy']:.1f}%**" + (f" (read {me['pct_of_read']:.0f}%)"
                                                          if layout == "contiguous" and me.get("pct_of_read") else ""))
        for prov in ("sdpa", "eager"):
            peer = by.get(("decode", "contiguous", b, ctx, 1, prov))
            row.append("—" if peer is None or not peer.get("gbs") else f"{peer['pct_of_copy']:.1f}%")
        rows.append(row)
    out = [header(data["meta"]), "",
           table(["batch x context", *[f"onetrip {lay}" for lay in layouts], "SDPA (contiguous)", "eager"], rows), ""]
    appends = [r for r in res if r["kind"] == "append_kv" and r["provider"] == "onetrip" and r.get("gbs")]
    if appends:
        arows = []
        for r in appends:
            peer = next((p for p in res if p["cell"] == r["cell"] and p["provider"] == "eager" and p.get("gbs")), None)
            arows.append([r["cell"], f"**{r['gbs']:.0f}** ({r['pct_of_copy']:.1f}%)",
                          "—" if peer is None else f"{peer['gbs']:.0f} ({peer['pct_of_copy']:.1f}%)"])
        out += ["`append_kv`, GB/s (% of copy):", "", table(["cell", "onetrip", "eager"], arows), ""]
    return "\n".join(out)
