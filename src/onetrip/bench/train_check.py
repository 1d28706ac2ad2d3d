"""``onetrip bench train`` without a GPU: a few float32 training steps of tiny models of each
preset's family on the CPU, eager transformers against onetrip.patch + onetrip.optim.AdamW, both
measured against a float64 run (onetrip's kernels through Triton's interpreter)."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import torch

from . import harness
from .train import ADAMW, MODELS, batches, build_model, hf_config, setup, snapshot, train_step

# Tiny models (~20K parameters: an interpreted AdamW step takes ~0.5 s), each keeping its
# preset's family, tying and rope scaling.
TINY = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
            head_dim=16)

def check_losses(preset: str, steps: int = 3, batch: int = 2, seq: int = 17, layers: int = 2) -> dict[str, list]:
    """The losses of ``steps`` float32 training steps of eager transformers and of onetrip
    (patch + AdamW), and of eager in float64 (its loss too: transformers' upcasts to float32),
    on the CPU with a TINY model of ``preset``'s family (``layers`` layers) from the same
    float32 initial weights: {"eager": [...], "onetrip": [...], "float64": [...]}."""
    import torch.nn.functional as F

    config = hf_config(preset, **{**TINY, "num_layers": layers})
    init = snapshot(build_model(config, torch.float32, "cpu"))
    data = batches(steps, batch, seq, config.vocab_size, 1, "cpu")
    out = {}
    for name, dtype in (("float64", torch.float64), ("eager", torch.float32), ("onetrip", torch.float32)):
        model = build_model(config, dtype, "cpu", init)
        forward, opt = model, torch.optim.AdamW(model.parameters(), **ADAMW)
        if name == "onetrip":
            forward, opt, _ = setup("onetrip", model)
        elif name == "float64":
            def forward(input_ids, labels, use_cache, model=model):
                logits = model(input_ids=input_ids, use_cache=use_cache).logits  # (batch, seq, vocab)
                loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
                return SimpleNamespace(loss=loss)
        out[name] = [float(train_step(forward, model, opt, ids)) for ids in data]
    return out


def run_train_check(console=None, models=MODELS, steps: int = 3) -> int:
    """``check_losses`` for each model: onetrip's largest loss error against the float64 run
    must be at most twice eager float32's plus 1e-5 (~20 float32 ulps of a loss near 5);
    a table, one JSON line, the exit status."""
    from . import report

    con = console or report.console()
    rows = []
    for preset in models:
        shape = f"{preset} tiny, 2 x 17, {steps} steps"
        if importlib.util.find_spec("onetrip.patch") is None:
            rows.append(("train", shape, "fp32", None, None, "not written yet (no onetrip.patch)"))
            continue
        try:
            losses = check_losses(preset, steps)
        except Exception as exc:  # noqa: BLE001 - the row's failure
            rows.append(("train", shape, "fp32", None, None, f"FAIL: {harness.error_string(exc)}"))
            continue
        err = lambda name: max(abs(a - b) for a, b in zip(losses[name], losses["float64"]))
        bound = 2 * err("eager") + 1e-5
        rows.append(("train", shape, "fp32", err("onetrip"), bound, "ok" if err("onetrip") <= bound else "FAIL"))
    report.print_check_table(con, rows)
    con.print("Throughput and memory need a CUDA GPU; this checks that onetrip's patched model trains "
              "like transformers' (float32, on the CPU).")
    failed = sum(r[5].startswith("FAIL") for r in rows)
    print(json.dumps({"bench": "train", "dtype": "fp32", "checks": len(rows), "failed": failed}), flush=True)
    return 1 if failed else 0
