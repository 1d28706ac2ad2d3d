"""The host time of ``Scheduler.step()`` in steady decode, without the model: on the CPU,
with the model's forward replaced by a stub that returns fixed logits at once.

    PYTHONPATH=src python tools/scheduler_host.py [--vocab 256 128256] [--running 16 64 128]
                                                  [--tokens 256] [--steps 300]

Each case admits ``running`` greedy requests of 8-token prompts (max_tokens past the run,
so none finishes; half carry a stop_token_id), steps until all decode and each has
``tokens`` tokens, then times ``steps`` steps. A step splits into:

    pre      _grow, _admit, _prefill (nothing to prefill here)
    upload   the changed rows to the device buffers (none in steady decode but new pages)
    launch   the rest of _decode: mode, step function, graph look-up
    compute  the stub forward and the sampling ops; on a GPU with graphs a replay whose
             work runs on the device, so it is left out of ``host``
    after    the one host read, the mirror update, the stops, the RequestOutputs
    host     everything but ``compute``: what the GPU waits for between two steps

Prints mean and p99 microseconds per part, a table per vocabulary, then one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time

import torch

from onetrip.bench.harness import cpu_name
from onetrip.engine.sampling import SamplingParams
from onetrip.engine.scheduler import Scheduler
from onetrip.models import Model, get_config

PARTS = ("pre", "upload", "launch", "compute", "after", "host")
TOKEN = 5  # every step's argmax: neither the EOS (2) nor the stop id (3)


def _stub_model(vocab: int) -> Model:
    config = dataclasses.replace(get_config("tiny"), vocab_size=vocab, max_position_embeddings=8192)
    model = Model.random(config, torch.float32, "cpu")
    fixed = torch.zeros(256, 1, vocab)  # (rows, 1, vocab): enough rows for a prefill block or a bucket
    fixed[:, :, TOKEN] = 1.0
    model.forward = lambda tokens, cache_seqlens=None, logits_index=None, **kw: fixed[: tokens.shape[0]]
    return model


def _instrument(sched: Scheduler, t: dict) -> None:
    """Wrap the step's parts on this instance; each adds its nanoseconds to ``t``."""

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                t[name] += time.perf_counter_ns() - t0
        return wrapper

    for name in ("_grow", "_admit", "_prefill"):
        setattr(sched, name, timed("pre", getattr(sched, name)))
    sched._upload = timed("upload", sched._upload)
    sched._decode = timed("decode", sched._decode)
    step_fn = sched._step_fn
    sched._step_fn = lambda bucket, mode: timed("compute", step_fn(bucket, mode))


def measure(vocab: int, running: int, tokens: int, steps: int) -> dict:
    model = _stub_model(vocab)
    sched = Scheduler(model, max_batch=running, max_seq=tokens + steps + 64, page_size=64,
                      eos_ids=(2,), graphs=False)
    for i in range(running):
        sched.add_request(str(i), [7] * 8, SamplingParams(max_tokens=tokens + steps + 8,
                                                          stop_token_ids=(3,) if i % 2 else ()))
    t = dict.fromkeys(("pre", "upload", "decode", "compute"), 0)
    _instrument(sched, t)  # before the first step: the step functions are made (and kept) there
    while sched.num_waiting or sched._prefilling or len(sched._running[0].tokens) < tokens:
        sched.step()
    rows = {p: [] for p in PARTS}
    for _ in range(steps):
        for k in t:
            t[k] = 0
        t0 = time.perf_counter_ns()
        outs = sched.step()
        total = time.perf_counter_ns() - t0
        assert len(outs) == running and not any(o.finished for o in outs)
        part = dict(pre=t["pre"], upload=t["upload"], launch=t["decode"] - t["upload"] - t["compute"],
                    compute=t["compute"], after=total - t["pre"] - t["decode"])
        part["host"] = total - t["compute"]
        for p in PARTS:
            rows[p].append(part[p] / 1e3)
    out = {}
    for p in PARTS:
        xs = sorted(rows[p])
        out[p] = (statistics.fmean(xs), xs[min(len(xs) - 1, int(0.99 * len(xs)))])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[256, 128256])
    ap.add_argument("--running", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--tokens", type=int, default=256, help="tokens each request has when timing starts")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)  # the host's own cost, not intra-op threads spinning
    cpu, results = cpu_name() or platform.processor() or "unknown CPU", []
    print(f"Scheduler.step() host time, stub model, greedy, {args.tokens}+ tokens per request; "
          f"{cpu}, torch {torch.__version__}; us mean / p99")
    for vocab in args.vocab:
        print(f"\nvocab {vocab}")
        print(f"{'running':>8} " + " ".join(f"{p:>15}" for p in PARTS))
        for n in args.running:
            r = measure(vocab, n, args.tokens, args.steps)
            print(f"{n:>8} " + " ".join(f"{r[p][0]:>7.1f} /{r[p][1]:>6.1f}" for p in PARTS))
            results.append(dict(vocab=vocab, running=n, **{p: dict(mean=round(r[p][0], 1), p99=round(r[p][1], 1))
                                                            for p in PARTS}))
    print(json.dumps(dict(cpu=cpu, torch=torch.__version__, tokens=args.tokens, results=results)))


if __name__ == "__main__":
    main()
