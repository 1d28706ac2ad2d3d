"""``onetrip bench decode``: whole-model decode speed, onetrip against what users would run instead.

Providers, all on the same weights (transformers' parameters are views of onetrip's):

    transformers          HF ``generate`` (greedy, SDPA attention, its dynamic KV cache)
    gpt-fast              onetrip's eager decoder (static KV cache, fused QKV / gate-up
                          weights, attention over the whole masked cache) with its decode step
                          under ``torch.compile(mode="reduce-overhead", fullgraph=True)``:
                          inductor's fusion plus CUDA graphs, the recipe of gpt-fast
    onetrip-eager         the same decoder, uncompiled (the op-by-op reference)
    onetrip-fused         onetrip's kernels, each launched from the host
    onetrip-graphs        onetrip's kernels, the decode step replayed as one CUDA graph
    onetrip-paged         onetrip-graphs over a paged KV cache (pages of 64 tokens)

Metrics, per (preset, batch), prompt of ``prompt`` tokens and ``new_tokens`` new ones:

    decode tok/s      batch x (new_tokens - 1) / decode time. The decode time is
                      T(new_tokens) - T(1) for transformers (two generate calls; the
                      difference removes the prefill), and the timed step loop otherwise.
    % of limit        bytes a step must read (weights once + the KV cache, ``engine.budget``)
                      / step time, over the copy bandwidth measured in the same run.
    kernels / step    median GPU kernels per decode step over a few profiled steps
                      (onetrip's profiler), and whether they came from a graph replay.
    TTFT              time to the first token (prefill + one sample) at batch 1 for
                      ``ttft_prompts`` prompt lengths.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..engine.budget import decode_budget
from ..engine._prefill import STEP as PREFILL_STEP
from ..engine.generate import Engine, common_prefix
from ..models import Model, get_config
from ..models.hf import decode_stepper
from ..profile.run import kernels_per_step
from .floors import matmul_tflops, prefill_flops
from .harness import sync

PROVIDERS = ("transformers", "gpt-fast", "onetrip-eager", "onetrip-fused", "onetrip-graphs", "onetrip-paged")


@dataclass(frozen=True)
class DecodeCase:
    preset: str
    batch: int
    prompt: int = 32
    new_tokens: int = 256


def cases(presets=("llama-3.2-1b", "llama-3.1-8b"), batches=(1, 8, 32), prompt: int = 32,
          new_tokens: int = 256) -> list[DecodeCase]:
    return [DecodeCase(p, b, prompt, new_tokens) for p in presets for b in batches]


def _prompts(batch: int, n: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(seed))


# -- providers: each returns (tokens (batch, new) list, prefill_s, decode_s, step_fn or None) --

def run_transformers(hf, prompts: torch.Tensor, new_tokens: int):
    dev = hf.device
    ids = prompts.to(dev)
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)

    def gen(n):
        sync(dev)
        t = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        sync(dev)
        return out, time.perf_counter() - t

    gen(2)  # warm-up
    _, t1 = gen(1)
    out, tn = gen(new_tokens)
    tokens = out[:, prompts.shape[1]:].tolist()

    return tokens, t1, tn - t1, decode_stepper(hf, ids)  # one decode forward a call, for the kernel count


def _static_loop(model: Model, prompts: torch.Tensor, new_tokens: int, decode_one: Callable, max_seq: int = 0):
    """Prefill eagerly, then ``decode_one(tok, lens) -> next tok`` per token (lens += 1 after).
    The cache is (re)allocated only when its shape must change: a compiled step is traced
    with the cache buffers, so new ones would recompile it."""
    dev = model.device
    b, p = prompts.shape
    cache = model.layers[0].attn.cache
    want = (b, max(max_seq, p + new_tokens + 8))
    if cache is None or tuple(cache.k.shape[:2]) != want:
        model.setup_cache(*want)
    ids = prompts.to(dev)
    sync(dev)
    t0 = time.perf_counter()
    lens = torch.zeros(b, dtype=torch.int32, device=dev)
    tok = model(ids, lens, logits_index=torch.full((b,), p - 1, device=dev))[:, -1].argmax(-1, keepdim=True)
    lens += p
    sync(dev)
    t1 = time.perf_counter()
    out = [tok]
    for _ in range(new_tokens - 1):
        tok = decode_one(tok, lens)
        lens += 1
        out.append(tok)
    sync(dev)
    t2 = time.perf_counter()
    return torch.cat(out, 1).tolist(), t1 - t0, t2 - t1


def run_static(model: Model, prompts: torch.Tensor, new_tokens: int, compiled: bool):
    """onetrip-eager (compiled=False) and gpt-fast (compiled=True) on the eager decoder."""
    model.backend = "eager"

    def decode_one(tok, lens):
        return model(tok, lens)[:, -1].argmax(-1, keepdim=True)

    fn = decode_one
    if compiled:
        compiled_one = torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)

        def fn(tok, lens):
            # A CUDA-graph tree reuses its output buffers at the next replay: keep a copy
            # (gpt-fast clones its next token the same way), and mark the new step.
            torch.compiler.cudagraph_mark_step_begin()
            return compiled_one(tok, lens).clone()
    max_seq = prompts.shape[1] + new_tokens + 8
    _static_loop(model, prompts, min(new_tokens, 4), fn, max_seq)  # warm-up (and compilation)
    tokens, prefill, decode = _static_loop(model, prompts, new_tokens, fn, max_seq)
    b = prompts.shape[0]
    lens = torch.full((b,), prompts.shape[1], dtype=torch.int32, device=model.device)
    tok = torch.zeros(b, 1, dtype=torch.int64, device=model.device)

    def step():
        fn(tok, lens)

    return tokens, prefill, decode, step


def run_engine(model: Model, prompts: torch.Tensor, new_tokens: int, graphs: bool, paged: bool = False):
    """onetrip-fused / -graphs, and -paged: graphs over a paged cache (pages of 64 tokens,
    a pool of exactly what the batch needs), to show what the block table costs."""
    model.backend = "fused"
    b, p = prompts.shape
    engine = Engine(model, max_seq=p + new_tokens + 16, max_batch=b, graphs=graphs, paged=paged)
    rows = prompts.tolist()
    engine.generate(rows, min(new_tokens, 4))  # warm-up: compiles kernels, captures the graph
    r = engine.generate(rows, new_tokens)
    return r.tokens, r.prefill_ms / 1e3, r.decode_ms / 1e3, engine.stepper(rows, 8)


def bench_case(case: DecodeCase, model: Model, hf, providers, bandwidth: Optional[float],
               profile: bool = True) -> list[dict]:
    """Run every provider on one case; a provider that fails is recorded with its error."""
    prompts = _prompts(case.batch, case.prompt, model.config.vocab_size)
    records, ref_tokens = [], None
    for name in providers:
        rec = {"preset": case.preset, "batch": case.batch, "prompt": case.prompt, "new_tokens": case.new_tokens,
               "provider": name}
        try:
            if name == "transformers":
                if hf is None:
                    raise RuntimeError("transformers is not installed")
                toks, prefill, decode, step = run_transformers(hf, prompts, case.new_tokens)
            elif name in ("gpt-fast", "onetrip-eager"):
                toks, prefill, decode, step = run_static(model, prompts, case.new_tokens, name == "gpt-fast")
            else:
                toks, prefill, decode, step = run_engine(model, prompts, case.new_tokens,
                                                         graphs=name != "onetrip-fused", paged=name == "onetrip-paged")
        except Exception as exc:  # recorded, the run goes on
            rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            records.append(rec)
            continue
        steps = case.new_tokens - 1
        budget = decode_budget(model.config, model.dtype, case.batch, [case.prompt] * case.batch, steps, bandwidth)
        ms = decode * 1e3 / steps
        rec.update(prefill_ms=prefill * 1e3, decode_ms=decode * 1e3, ms_per_step=ms,
                   tok_s=case.batch * steps / decode, achieved_gbs=budget.achieved_gbs(ms),
                   pct_of_limit=budget.pct_of_limit(ms), limit_tok_s=budget.limit_tok_s)
        if ref_tokens is None:
            ref_tokens = toks
        same = sum(a == b for ra, rb in zip(toks, ref_tokens) for a, b in zip(ra, rb))
        rec["tokens_agree"] = same / max(1, sum(len(r) for r in ref_tokens))  # vs the first provider
        rec["same_prefix"] = min(common_prefix(ra, rb) for ra, rb in zip(toks, ref_tokens))
        if profile and model.device.type == "cuda":
            try:
                rec["kernels_per_step"], rec["graph_kernels_per_step"] = kernels_per_step(step)
            except Exception as exc:
                rec["kernels_error"] = f"{type(exc).__name__}: {exc}"[:200]
        records.append(rec)
    model.reset_cache()
    return records


# gpt-fast's prefill is the eager one; onetrip-graphs: the fused prefill replayed from a CUDA graph
TTFT_PROVIDERS = ("transformers", "onetrip-eager", "onetrip-fused", "onetrip-graphs")


def ttft(model: Model, hf, preset: str, prompt_lens=(512, 2048), tflops: Optional[float] = None) -> list[dict]:
    """Time to first token at batch 1 (median of 3 after a warm-up) per provider: the
    prefill forward and the first token's argmax. gpt-fast prefills like onetrip-eager. The
    onetrip engines are made once a prompt length (as a server keeps its engine): the warm-up
    captures onetrip-graphs' prefill graph where the length takes one (``engine._prefill``:
    up to 2,048 padded tokens), longer prompts prefill as onetrip-fused does. With ``tflops``
    (the run's measured matmul rate) each record holds the compute floor, ``floor_ms``."""
    out = []
    for n in prompt_lens:
        prompts = _prompts(1, n, model.config.vocab_size, seed=1)
        for name in TTFT_PROVIDERS:
            rec = {"preset": preset, "prompt": n, "provider": name}
            if tflops:
                rec["floor_ms"] = prefill_flops(model.config, n) / (tflops * 1e12) * 1e3
            try:
                times = []
                if name in ("onetrip-fused", "onetrip-graphs"):
                    model.backend = "fused"
                    # room for the padded length too, so the graph prefill takes any n up to its limit
                    eng = Engine(model, max_seq=max(n + 8, -(-n // PREFILL_STEP) * PREFILL_STEP),
                                 graphs=name == "onetrip-graphs")
                for _ in range(4):
                    if name == "transformers":
                        if hf is None:
                            raise RuntimeError("transformers is not installed")
                        times.append(_first_token_hf(hf, prompts))
                    elif name == "onetrip-eager":
                        model.backend = "eager"
                        times.append(_static_loop(model, prompts, 1, None)[1])
                    else:
                        times.append(eng.generate(prompts.tolist(), 1).prefill_ms / 1e3)
                rec["ttft_ms"] = sorted(times[1:])[1] * 1e3
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
            out.append(rec)
    model.reset_cache()
    return out


def _first_token_hf(hf, prompts: torch.Tensor) -> float:
    dev = hf.device
    sync(dev)
    t = time.perf_counter()
    hf.generate(prompts.to(dev), max_new_tokens=1, do_sample=False, eos_token_id=None, pad_token_id=0)
    sync(dev)
    return time.perf_counter() - t


def build(preset: str, dtype: torch.dtype, device, with_hf: bool):
    model = Model.random(get_config(preset), dtype, device, seed=0)
    hf = None
    if with_hf:
        try:
            from ..models.hf import to_transformers
            hf = to_transformers(model)
        except ImportError:
            hf = None
    return model, hf


def bench_decode(out_dir, *, presets=("llama-3.2-1b", "llama-3.1-8b"), batches=(1, 8, 32),
                     providers=PROVIDERS, new_tokens: int = 256, prompt: int = 32, ttft_prompts=(512, 2048),
                     dtype=torch.bfloat16, con=None) -> dict:
    """The GPU benchmark: every case and provider, TTFT, results files and a table."""
    from pathlib import Path

    from .decode_report import plot_decode, print_decode_table
    from .harness import copy_bandwidth_gbs, device_info, slug, utc_now, write_results
    from .report import console

    con = con or console()
    device = "cuda"
    meta = device_info(device)
    meta["copy_gbs"] = copy_bandwidth_gbs(device)
    meta["matmul_tflops"] = matmul_tflops(dtype) if ttft_prompts else None
    try:
        import transformers
        meta["transformers"] = transformers.__version__
    except ImportError:
        meta["transformers"] = None
    meta.update(dtype=str(dtype).removeprefix("torch."), prompt=prompt, new_tokens=new_tokens)
    con.print(f"[bold]{meta['gpu']}[/]: copy {meta['copy_gbs']:.0f} GB/s; torch {meta['torch']}, "
              f"triton {meta['triton']}, transformers {meta['transformers']}")
    records, ttfts = [], []
    meta["read_chain"] = {}
    for preset in presets:
        model, hf = build(preset, dtype, device, "transformers" in providers)
        meta["read_chain"][preset] = read_chain(model, meta["copy_gbs"])
        for case in cases((preset,), batches, prompt, new_tokens):
            con.print(f"{preset} batch {case.batch} ...")
            records += bench_case(case, model, hf, providers, meta["copy_gbs"])
        if ttft_prompts:
            ttfts += ttft(model, hf, preset, ttft_prompts, meta["matmul_tflops"])
        del model, hf
        torch.cuda.empty_cache()
    stem = Path(out_dir) / f"decode-{slug(meta['gpu'])}-{meta['dtype']}-{utc_now():%Y%m%d}"
    json_path, _ = write_results(records + [dict(r, kind="ttft") for r in ttfts], meta, stem)
    print_decode_table(con, records, ttfts, meta)
    plot_decode(records, meta, stem.with_suffix(".png"))
    con.print(f"results: {json_path}, {stem.with_suffix('.csv')}, {stem.with_suffix('.png')}")
    return {"records": records, "ttft": ttfts, "meta": meta}


def step_weights(model: Model) -> list[torch.Tensor]:
    """The weight matrices a decode step reads, in its order: per layer the fused qkv, o,
    fused gate-up and down projections, then the LM head (the embedding when tied)."""
    out = []
    for layer in model.layers:
        out += [layer.attn.wqkv.weight, layer.attn.wo.weight, layer.mlp.w_gate_up.weight, layer.mlp.w_down.weight]
    return out + [(model.lm_head or model.embed).weight]


def read_chain(model: Model, bandwidth: Optional[float]) -> dict:
    """What the step's weight reads reach as a chain of plain-read kernels (``floors``), one
    launch a matrix in one graph: the floor of a step with that many kernels, against the
    batch-1 limit (its weight bytes; the KV cache of a short prompt is under 1%)."""
    from .floors import read_chain_ms  # noqa: PLC0415 - Triton kernels: imported once the interpreter is chosen
    from .harness import new_flush_buffer

    weights = step_weights(model)
    ms = read_chain_ms(weights, new_flush_buffer(model.device)) if model.device.type == "cuda" else None
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    out = {"launches": len(weights), "bytes": nbytes, "ms": ms}
    if ms and bandwidth:
        out["pct_of_copy"] = 100 * nbytes / (ms * 1e6) / bandwidth
    return out


def check_decode(con=None, new_tokens: int = 12) -> int:
    """Without a GPU: the tiny preset through each provider on the CPU (fused kernels via
    Triton's interpreter), checking they generate the same greedy tokens; no timings."""
    from rich.table import Table

    from .report import console

    con = con or console()
    model, hf = build("tiny", torch.float32, "cpu", True)
    prompts = _prompts(2, 9, model.config.vocab_size)
    table = Table(title="decode providers on the tiny preset (CPU, fp32): greedy tokens")
    for col in ("provider", "tokens (sequence 0)", "same as transformers"):
        table.add_column(col)
    ref, bad = None, 0
    for name in ("transformers", "onetrip-eager", "onetrip-fused", "onetrip-fused paged"):
        if name == "transformers":
            if hf is None:
                continue
            toks = run_transformers(hf, prompts, new_tokens)[0]
        elif name == "onetrip-eager":
            toks = run_static(model, prompts, new_tokens, compiled=False)[0]
        else:
            toks = run_engine(model, prompts, new_tokens, graphs=False, paged=name.endswith("paged"))[0]
        ref = ref or toks
        ok = toks == ref
        bad += not ok
        table.add_row(name, " ".join(map(str, toks[0])), "[green]yes[/]" if ok else "[red]NO[/]")
    con.print(table)
    con.print("[yellow]No CUDA GPU: gpt-fast (torch.compile + CUDA graphs) and onetrip-graphs need one, and so do "
              "timings. Run `onetrip bench decode` on a GPU.[/]")
    return 1 if bad else 0
