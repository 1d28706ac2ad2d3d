"""The decode engine's A/B runs (``ab_next.py --only engine engine_traces``): the batch-1
step, one CUDA graph, under each of ENGINE_VARIANTS (module settings applied around the run),
and per-kernel traces of the variants named in AB_TRACE_VARIANTS.

Environment: AB_PRESETS (default both presets), AB_NEW_TOKENS (128; the bench's 256 to
compare with it), AB_ROUNDS (1: the variant list timed that many times in turn),
AB_TRACE_VARIANTS ("|"-separated labels). Rounds 12-23 (benchmarks/NOTES.md) were timed
here; each round's variants are in git history beside its results file.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from pathlib import Path

import torch

sm = importlib.import_module("onetrip.ops.skinny_matmul")  # the module (onetrip.ops re-exports the op)
ENGINE_PRESETS = tuple(os.environ.get("AB_PRESETS", "llama-3.2-1b llama-3.1-8b").split())


def _gemv(base: dict, **entries) -> dict:
    """``base`` with launches set in ``skinny_matmul._TUNED_GEMV`` (and taken out of every GPU
    model's table): qkv=, o=, down=, gate_up=, head= (the 1B's), down8=, gate_up8=, head8=
    (the 8B's), each (block_n, block_k, warps[, early]), or None for the rule's launch."""
    keys = {"qkv": (3072, 2048, "norm"), "o": (2048, 2048, "residual"), "down": (2048, 8192, "silu_residual"),
            "gate_up": (16384, 2048, "norm"), "gate_up8": (28672, 4096, "norm"), "head": (128256, 2048, "norm"),
            "head8": (128256, 4096, "norm"), "down8": (4096, 14336, "silu_residual")}
    table = dict(base.get("skinny_matmul._TUNED_GEMV", sm._TUNED_GEMV))
    per_gpu = {gpu: dict(t) for gpu, t in base.get("skinny_matmul._TUNED_GEMV_GPU", sm._TUNED_GEMV_GPU).items()}
    for name, launch in entries.items():
        for t in (table, *per_gpu.values()):  # out of every GPU model's table too
            t.pop(keys[name], None)
        if launch is not None:
            table[keys[name]] = launch
    return {**base, "skinny_matmul._TUNED_GEMV": table, "skinny_matmul._TUNED_GEMV_GPU": per_gpu}


# Round 21 (sixteenth session) timed the attention's trigger and the o, gate_up, qkv and down
# launches here; round 22 the GEMV's chunk prefetch (experiments/gemv-prefetch.patch); round
# 23 the L2 eviction policy of the weights (and of the cached K/V: nothing, taken out).
# These are the variants to time on a GPU model the session's changes were not timed on.
ENGINE_VARIANTS = (  # label -> settings ("module.NAME" in onetrip.models / .engine / .ops) for the run
    ("default", {}),
    ("weights at default L2 priority", {"skinny_matmul.WEIGHT_EVICT": ""}),
    ("round 21 off", _gemv({"fused.TRIGGER_O": False}, o=None)),
    ("H100 table on", {"skinny_matmul._TUNED_GEMV_GPU": {"": sm._TUNED_GEMV_GPU["H100"]}}),
    ("default (again)", {}),
)


def _engine_modules() -> dict:
    from onetrip.engine import generate
    from onetrip.models import fused
    return {"fused": fused, "generate": generate,
            **{m: importlib.import_module(f"onetrip.ops.{m}") for m in ("skinny_matmul", "decode_attention")}}


@contextlib.contextmanager
def _settings(settings: dict):
    """Set "module.NAME" (bare names: models.fused's) for the duration; restored after."""
    modules = _engine_modules()

    def target(name):
        mod, _, attr = name.rpartition(".")
        return modules[mod or "fused"], attr

    default = {k: getattr(*target(k)) for k in settings}
    try:
        for k, v in settings.items():
            setattr(*target(k), v)
        yield
    finally:
        for k, v in default.items():
            setattr(*target(k), v)


def engine_ab(flush, copy, dev="cuda", new_tokens=None, prompt=32):
    """The decode step at batch 1 (one graph) under each of ENGINE_VARIANTS; new_tokens
    from env AB_NEW_TOKENS (default 128; the bench's 256 to compare with it). The variant
    list runs AB_ROUNDS times in turn (default 1), two timed runs a variant each round; each
    variant keeps its fastest run (``ms_per_step``) and every round's (``rounds_ms``)."""
    new_tokens = new_tokens or int(os.environ.get("AB_NEW_TOKENS", "128"))
    rounds = int(os.environ.get("AB_ROUNDS", "1"))
    from onetrip.bench.decode import _prompts, build, run_engine
    from onetrip.engine.budget import decode_budget

    rows = []
    for preset in ENGINE_PRESETS:
        model, _ = build(preset, torch.bfloat16, dev, False)
        prompts = _prompts(1, prompt, model.config.vocab_size)
        steps = new_tokens - 1
        budget = decode_budget(model.config, model.dtype, 1, [prompt], steps, copy)
        row = {"preset": preset, "limit_tok_s": budget.limit_tok_s}
        ref = None
        for _ in range(rounds):
            for label, settings in ENGINE_VARIANTS:
                try:
                    with _settings(settings):
                        best = None
                        for _ in range(2):  # two timed runs, the faster kept
                            toks, _, decode, _ = run_engine(model, prompts, new_tokens, graphs=True)
                            best = decode if best is None else min(best, decode)
                    ms = best * 1e3 / steps
                    ref = toks if ref is None else ref
                    past = row.get(label, {}).get("rounds_ms", [])
                    row[label] = {"ms_per_step": min([ms, *past]), "rounds_ms": [*past, ms],
                                  "same_tokens": toks == ref,
                                  "settings": {k: v if isinstance(v, (bool, int, float, str)) else repr(v)
                                               for k, v in settings.items()}}
                    row[label]["tok_s"] = 1e3 / row[label]["ms_per_step"]
                    row[label]["pct_of_limit"] = budget.pct_of_limit(row[label]["ms_per_step"])
                except Exception as exc:  # noqa: BLE001 - recorded
                    row[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        rows.append(row)
        print(f"engine {preset}: " + ", ".join(
            f"{v}: " + (f"{r['ms_per_step']:.3f} ms ({r['pct_of_limit']:.1f}%, same {r['same_tokens']}; rounds "
                        + "/".join(f"{x:.3f}" for x in r["rounds_ms"]) + ")"
                        if "ms_per_step" in r else r["error"])
            for v, r in row.items() if isinstance(r, dict)), flush=True)
        del model
        torch.cuda.empty_cache()
    return rows


def engine_traces(flush, copy, dev="cuda", steps=12, out_dir=None):
    """Per-kernel cost of the batch-1 step (one graph) under the ENGINE_VARIANTS named in env
    AB_TRACE_VARIANTS ("|"-separated labels; default: the first two): each kernel's end
    minus the previous kernel's end, median over the traced steps, then per layer
    (benchmarks/step_kernels.py's reading). Traces saved under out_dir when given."""
    from onetrip.bench.decode import build
    from onetrip.engine.generate import Engine
    from onetrip.profile import run as profile_run
    from step_kernels import _kernels, _period, per_layer, step_table

    wanted = os.environ.get("AB_TRACE_VARIANTS", "").split("|") if os.environ.get("AB_TRACE_VARIANTS") else \
        [label for label, _ in ENGINE_VARIANTS[:2]]
    variants = [(label, settings) for label, settings in ENGINE_VARIANTS if label in wanted]
    rows = []
    for preset in ENGINE_PRESETS:
        model, _ = build(preset, torch.bfloat16, dev, False)
        model.backend = "fused"
        prompts = torch.randint(0, model.config.vocab_size, (1, 32),
                                generator=torch.Generator().manual_seed(0)).tolist()
        row = {"preset": preset}
        for label, settings in variants:
            with _settings(settings):
                engine = Engine(model, max_seq=32 + steps + 16, max_batch=1, graphs=True)
                path = Path(out_dir or "/tmp") / f"trace-{preset}-{label.replace(' ', '_')}.json"
                profile_run(engine.stepper(prompts, steps + 4), steps=steps, warmup=2, trace_path=path)
            ev = _kernels(path)
            per = _period([e["name"] for e in ev])
            table = step_table(ev, per)
            layers, medians = per_layer(table)
            row[label] = {"kernels": per, "step_us": sum(r[2] for r in table), "per_layer_us": medians,
                          "outside_layers_us": sum(r[2] for r in table) - sum(
                              table[j + k][2] for j in layers for k in range(len(medians)))}
            print(f"trace {preset} {label}: {per} kernels, step {row[label]['step_us']:.1f} us; per layer "
                  + ", ".join(f"{n[:18]} {t:.2f}" for n, t in medians)
                  + f"; outside the layers {row[label]['outside_layers_us']:.1f} us", flush=True)
        rows.append(row)
        del model
        torch.cuda.empty_cache()
    return rows
