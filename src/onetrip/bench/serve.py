"""``onetrip bench serve``: a load generator for the continuous-batching Scheduler, measured
against transformers' continuous batching and onetrip's own static-batch decode.

    records = run_serve_bench("benchmarks/results", presets=("llama-3.2-1b",),
                              workloads=load_points((16, 64, 128), num_requests=256))

The workload (``Workload``, seeded): ``num_requests`` requests of random token ids, prompt
lengths uniform in [prompt_lo, prompt_hi], exactly ``output_len`` new tokens each (greedy,
EOS ignored). Arrivals: with ``rate`` None every request is ready at t = 0 and the client
keeps ``concurrency`` of them in flight (a new one is sent when one finishes: a closed
loop); with a rate, request i is sent at the i-th arrival of a Poisson process of that
many requests/s (an open loop), whatever is in flight. ``concurrency`` is also the engines'
batch cap: the Scheduler's max_batch, transformers' max_requests_per_batch, the static
batch.

Providers, on the same weights (transformers' parameters are views of onetrip's):

    onetrip          ``Scheduler`` driven in-process: ``add_request`` when the client sends a
                     request, ``step()`` in a loop; a token's time is when ``step()`` returns
                     it (the step ends with a host read, so the token is on the host). Fused
                     backend and CUDA graphs on a GPU; eager on the CPU.
    transformers-cb  transformers' ContinuousBatchingManager (what ``generate_batch`` runs)
                     fed by the same client; a token's time is transformers' own timestamp
                     (``record_timestamps``), taken by its host loop as it appends the token.
                     Its defaults otherwise (attention, CUDA graphs, cache size).
    onetrip-static   ``Engine.generate`` on batches of ``concurrency`` prompts one after the
                     other, all prompts ready at t = 0: the ceiling continuous batching aims at.

Metrics (``summarize``), per provider and load point:

    output tok/s     generated tokens / the run's duration (first send to last token).
    requests/s       requests / the same duration.
    TTFT             first token's time - the request's send time (closed loop: when a slot
                     freed; open loop: its scheduled arrival, so queueing counts); p50, p99.
    ITL              gaps between consecutive tokens of a request, over all requests (two
                     tokens delivered by one step give a gap of 0); p50, p99.
    static step      onetrip-static's median decode step at batch ``concurrency``; the bar:
                     onetrip's ITL p50 <= 1.3 x it.
    vs ...           output tok/s over transformers-cb's and over onetrip-static's.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import inspect
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from ..engine.generate import Engine
from ..engine.sampling import SamplingParams
from ..engine.scheduler import Scheduler
from ..models import Model
from .harness import sync

PROVIDERS = ("onetrip", "transformers-cb", "onetrip-static")


@dataclass(frozen=True)
class Request:
    id: str
    prompt: list[int]
    arrival: float  # seconds after the run's start (open loop); 0 in a closed loop


@dataclass(frozen=True)
class Workload:
    """The load (module docstring). ``rate``: requests/s of Poisson arrivals, None for all at
    t = 0 with ``concurrency`` in flight."""

    num_requests: int = 256
    prompt_lo: int = 64
    prompt_hi: int = 511
    output_len: int = 256
    concurrency: int = 64
    rate: Optional[float] = None
    seed: int = 0

    def __post_init__(self):
        for name in ("num_requests", "prompt_lo", "prompt_hi", "output_len", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Workload.{name} must be an int >= 1, got {value!r}")
        if self.prompt_hi < self.prompt_lo:
            raise ValueError(f"Workload.prompt_hi ({self.prompt_hi}) must be >= prompt_lo ({self.prompt_lo})")
        if self.rate is not None and (isinstance(self.rate, bool) or not isinstance(self.rate, (int, float))
                                      or not 0 < self.rate < float("inf")):
            raise ValueError(f"Workload.rate must be a finite number of requests/s > 0 or None, got {self.rate!r}")

    @property
    def max_seq(self) -> int:
        return self.prompt_hi + self.output_len

    @property
    def label(self) -> str:
        return f"C={self.concurrency}" + (f", {self.rate:g} req/s" if self.rate is not None else "")

    def requests(self, vocab: int) -> list[Request]:
        """The requests, the same for the same fields and vocab. Prompts and arrivals come from
        two generators seeded by ``seed``, so every load point of a sweep sends the same prompts."""
        prompts, gaps = random.Random(self.seed), random.Random(f"arrivals {self.seed}")
        out, t = [], 0.0
        for i in range(self.num_requests):
            n = prompts.randint(self.prompt_lo, self.prompt_hi)
            out.append(Request(f"r{i}", [prompts.randrange(vocab) for _ in range(n)], t))
            if self.rate is not None:
                t += gaps.expovariate(self.rate)
        return out


def load_points(concurrency: Sequence[int] = (64,), rates: Sequence[float] = (), **fields) -> list[Workload]:
    """One Workload per (concurrency, rate); no rates: closed loops only."""
    return [Workload(concurrency=c, rate=r, **fields) for c in concurrency for r in (tuple(rates) or (None,))]


# -- what a provider observed ----------------------------------------------------------------------

@dataclass
class Trace:
    """One request as the client saw it; times are ``time.perf_counter()`` seconds."""

    id: str
    arrival: float                                        # when the client sent it
    tokens: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # one per token; empty when not measured
    done: float = 0.0                                     # when the client saw it finish


class _Client:
    """The load generator: which requests are due at a time, closed or open loop."""

    def __init__(self, workload: Workload, requests: list[Request], start: float):
        self.w, self.start = workload, start
        self.pending = collections.deque(sorted(requests, key=lambda r: r.arrival))
        self.in_flight = 0

    def due(self, now: float) -> list[tuple[Request, float]]:
        """(request, send time) of every request to send now."""
        out = []
        while self.pending:
            if self.w.rate is None:
                if self.in_flight >= self.w.concurrency:
                    break
                sent = now
            else:
                sent = self.start + self.pending[0].arrival
                if sent > now:
                    break
            out.append((self.pending.popleft(), sent))
            self.in_flight += 1
        return out

    def wait_s(self, now: float) -> Optional[float]:
        """Seconds until the next scheduled arrival (>= 0); None in a closed loop or when
        every request is sent."""
        if self.w.rate is None or not self.pending:
            return None
        return max(0.0, self.start + self.pending[0].arrival - now)


def _nothing(n: int) -> None:
    pass


# -- providers: each returns (traces, start time) ------------------------------------------------

def _warm_requests(workload: Workload, vocab: int, max_tokens: int) -> list[tuple[Request, SamplingParams]]:
    """``concurrency`` requests of the workload's prompt lengths (another seed)."""
    w = dataclasses.replace(workload, num_requests=workload.concurrency, rate=None, seed=workload.seed + 1)
    return [(r, SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for r in w.requests(vocab)]


def run_onetrip(model: Model, workload: Workload, requests: list[Request], *, graphs: bool = True,
                warmup: bool = True, done: Callable[[int], None] = _nothing) -> tuple[list[Trace], float]:
    """The Scheduler under the client (module docstring). Warm-up: ``concurrency`` requests
    long enough that the batch ramps through every bucket (graphs captured, kernels compiled)."""
    sched = Scheduler(model, max_batch=workload.concurrency, max_seq=workload.max_seq, graphs=graphs)
    params = SamplingParams(max_tokens=workload.output_len, ignore_eos=True)
    if warmup:
        ramp = min(workload.output_len, 2 * workload.concurrency + 8)  # one admission a step, two for a 2-chunk prompt
        for r, p in _warm_requests(workload, model.config.vocab_size, ramp):
            sched.add_request("warm-" + r.id, r.prompt, p)
        while sched.has_unfinished():
            sched.step()
    traces: dict[str, Trace] = {}
    sync(model.device)
    start = time.perf_counter()
    client = _Client(workload, requests, start)
    while client.pending or sched.has_unfinished():
        for r, sent in client.due(time.perf_counter()):
            sched.add_request(r.id, r.prompt, params)
            traces[r.id] = Trace(r.id, sent)
        if not sched.has_unfinished():
            time.sleep(client.wait_s(time.perf_counter()) or 0.0)
            continue
        outs = sched.step()
        now = time.perf_counter()
        for o in outs:
            t = traces[o.request_id]
            t.tokens += o.new_token_ids
            t.token_times += [now] * len(o.new_token_ids)
            if o.finished:
                t.done = now
                client.in_flight -= 1
                done(1)
    del sched
    model.reset_cache()
    return [traces[r.id] for r in requests], start


def run_static(model: Model, workload: Workload, requests: list[Request], *, graphs: bool = True,
               warmup: bool = True, done: Callable[[int], None] = _nothing) -> tuple[list[Trace], float, float]:
    """``Engine.generate`` on consecutive batches of ``concurrency`` prompts, all ready at
    t = 0. Returns (traces without token times, start, median ms per decode step of the
    full batches)."""
    c = workload.concurrency
    engine = Engine(model, max_seq=workload.max_seq + 8, max_batch=c, graphs=graphs)
    batches = [requests[i:i + c] for i in range(0, len(requests), c)]
    if warmup:  # compiles kernels, captures the full batch's graph and the last one's
        for batch in {len(b): b for b in batches}.values():
            engine.generate([r.prompt for r in batch], min(4, workload.output_len))
    traces, steps = [], []
    sync(model.device)
    start = time.perf_counter()
    for batch in batches:
        res = engine.generate([r.prompt for r in batch], workload.output_len)  # synchronised at its end
        now = time.perf_counter()
        traces += [Trace(r.id, start, toks, [], now) for r, toks in zip(batch, res.tokens)]
        if len(batch) == c or len(batches) == 1:
            steps.append(res.ms_per_step)
        done(len(batch))
    del engine
    model.reset_cache()
    return traces, start, sorted(steps)[len(steps) // 2]


def cb_api_missing(hf) -> Optional[str]:
    """Why transformers' continuous batching cannot run here, or None."""
    import transformers

    if not hasattr(hf, "continuous_batching_context_manager"):
        return (f"transformers {transformers.__version__} has no continuous batching "
                "(ContinuousMixin.continuous_batching_context_manager; transformers 5.x has it)")
    return None


def _accepted(fn, kwargs: dict) -> dict:
    """The keyword arguments ``fn`` takes (the manager's API grew over transformers 5.x)."""
    names = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in names}


def _cb_config(workload: Workload, device: torch.device):
    """transformers' ContinuousBatchingConfig: at most ``concurrency`` requests a batch; on the
    CPU also a cache sized to the workload (its default sizing from memory takes ~12 s)."""
    try:
        from transformers.generation import ContinuousBatchingConfig
    except ImportError:
        return None
    kw = {"max_requests_per_batch": workload.concurrency}
    if device.type != "cuda":
        page = 16
        kw.update(page_size=page, max_batch_tokens=max(256, workload.prompt_hi + workload.concurrency),
                  num_blocks=workload.concurrency * -(-workload.max_seq // page) + 1)
    return ContinuousBatchingConfig(**_accepted(ContinuousBatchingConfig, kw))


def run_transformers_cb(hf, workload: Workload, requests: list[Request], *, warmup: bool = True,
                        done: Callable[[int], None] = _nothing, stall_s: float = 300.0):
    """transformers' ContinuousBatchingManager under the client. Returns (traces, start,
    settings: a short string of what its manager resolved). Raises RuntimeError when its
    generation thread dies, a request errors, or nothing finishes for ``stall_s``."""
    from transformers import GenerationConfig

    why = cb_api_missing(hf)
    if why:
        raise RuntimeError(why)
    gen = GenerationConfig(do_sample=False, max_new_tokens=workload.output_len, eos_token_id=-1, pad_token_id=0)
    kw = {"generation_config": gen, "continuous_batching_config": _cb_config(workload, hf.device),
          "warmup": warmup, "block": True}
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints
        kw["workload_hints"] = WorkloadHints(max_prompt_length=workload.prompt_hi,
                                             max_generated_length=workload.output_len,
                                             num_requests=workload.num_requests)
    except (ImportError, TypeError):
        pass
    kw = {k: v for k, v in _accepted(hf.continuous_batching_context_manager, kw).items() if v is not None}
    # Not inference mode: the manager allocates its tensors here (warm-up) and its thread updates them in
    # place, outside inference mode in transformers 5.17; its step runs under no_grad itself.
    with torch.no_grad(), hf.continuous_batching_context_manager(**kw) as man:
        stamped = "record_timestamps" in inspect.signature(man.add_request).parameters

        def send(rid, prompt, n):
            man.add_request(prompt, **_accepted(man.add_request, {"request_id": rid, "max_new_tokens": n,
                                                                  "record_timestamps": stamped}))

        def drain(traces, client, finished):
            """Send what is due and collect finished results until every request is done."""
            last = time.perf_counter()
            while client.pending or client.in_flight:
                now = time.perf_counter()
                for r, sent in client.due(now):
                    send(r.id, r.prompt, client.w.output_len)
                    traces[r.id] = Trace(r.id, sent)
                wait = client.wait_s(time.perf_counter())
                res = man.get_result(timeout=0.05 if wait is None else min(0.05, max(wait, 1e-4)))
                now = time.perf_counter()
                if res is None or not res.is_finished():
                    if not man.is_running():
                        raise RuntimeError("transformers' generation thread stopped")
                    if now - last > stall_s:
                        raise RuntimeError(f"no request finished for {stall_s:.0f} s")
                    continue
                if res.error:
                    raise RuntimeError(f"transformers request {res.request_id}: {res.error}")
                t = traces[res.request_id]
                t.tokens, t.done, last = list(res.generated_tokens), now, now
                t.token_times = list(getattr(res, "timestamps", None) or [])
                client.in_flight -= 1
                finished(1)

        if warmup:  # the first steps of a fresh manager allocate and tune: keep them out of the timing
            w = dataclasses.replace(workload, num_requests=workload.concurrency, rate=None, seed=workload.seed + 1,
                                    output_len=min(16, workload.output_len))
            warm = [dataclasses.replace(r, id="warm-" + r.id) for r in w.requests(hf.config.vocab_size)]
            drain({}, _Client(w, warm, time.perf_counter()), _nothing)
        traces: dict[str, Trace] = {}
        sync(hf.device)
        start = time.perf_counter()
        drain(traces, _Client(workload, requests, start), done)
        cfg = getattr(man, "continuous_batching_config", None)
        settings = f"attention {hf.config._attn_implementation}" + "".join(
            f", {name} {getattr(cfg, name)}" for name in ("use_cuda_graph", "use_async_batching", "max_batch_tokens",
                                                          "num_blocks") if hasattr(cfg, name))
        settings += "" if stamped else "; no per-token timestamps in this version"
    return [traces[r.id] for r in requests], start, settings


# -- the suite -------------------------------------------------------------------------------------

def bench_preset(preset: str, model: Model, hf, workloads: Sequence[Workload], providers: Sequence[str], *,
                 graphs: bool, warmup: bool, task: Callable[[str, int], Callable[[int], None]]) -> list[dict]:
    """Every provider at every load point on one model: one record per (load, provider);
    onetrip-static once per concurrency (it ignores arrival times). A failing provider is
    recorded with its error and the run goes on."""
    from .harness import error_string
    from .serve_report import summarize, tokens_agree

    records, static = [], {}  # static: concurrency -> (record, tokens)
    for w in workloads:
        reqs = w.requests(model.config.vocab_size)
        point, tokens = [], {}
        for name in providers:
            if name == "onetrip-static" and w.concurrency in static:
                continue
            rec = {"preset": preset, "provider": name, "load": w.label, "concurrency": w.concurrency, "rate": w.rate,
                   "num_requests": w.num_requests, "prompt_lo": w.prompt_lo, "prompt_hi": w.prompt_hi,
                   "output_len": w.output_len}
            done = task(f"{preset} {w.label} {name}", w.num_requests)
            try:
                if name == "onetrip":
                    traces, start = run_onetrip(model, w, reqs, graphs=graphs, warmup=warmup, done=done)
                    rec["timing"] = "per token: when Scheduler.step() returns it"
                elif name == "onetrip-static":
                    traces, start, rec["static_step_ms"] = run_static(model, w, reqs, graphs=graphs, warmup=warmup,
                                                                      done=done)
                    rec.update(load=f"C={w.concurrency}", rate=None, timing="batches: no per-token clock")
                elif name == "transformers-cb":
                    if hf is None:
                        raise RuntimeError("transformers is not installed")
                    traces, start, rec["settings"] = run_transformers_cb(hf, w, reqs, warmup=warmup, done=done)
                    rec["timing"] = "per token: transformers' record_timestamps" \
                        if traces[0].token_times else "completions only"
                else:
                    raise ValueError(f"provider must be one of {', '.join(PROVIDERS)}, got {name!r}")
            except Exception as exc:  # recorded, the run goes on
                rec["error"] = error_string(exc)
                records.append(rec)
                continue
            finally:
                if model.device.type == "cuda":  # the next provider sizes its KV cache from free memory
                    gc.collect()
                    torch.cuda.empty_cache()
            rec.update(summarize(traces, start, w.output_len))
            tokens[name] = {t.id: t.tokens for t in traces}
            if name == "onetrip-static":
                static[w.concurrency] = (rec, tokens[name])
            point.append(rec)
        base, ref = static.get(w.concurrency, (None, None))
        cb = next((r for r in point if r["provider"] == "transformers-cb"), None)
        for rec in point:
            rec["tokens_agree_static"] = tokens_agree(tokens[rec["provider"]], ref)
            if base is not None:
                rec["static_step_ms"] = base["static_step_ms"]
                rec["vs_static"] = rec["output_tok_s"] / base["output_tok_s"]
                if rec.get("itl_p50_ms") is not None:
                    rec["itl_p50_over_static_step"] = rec["itl_p50_ms"] / base["static_step_ms"]
            if cb is not None:
                rec["vs_transformers_cb"] = rec["output_tok_s"] / cb["output_tok_s"]
        records += point
    return records


def run_serve_bench(out_dir, *, presets: Sequence[str], workloads: Sequence[Workload],
                    providers: Sequence[str] = PROVIDERS, device=None, dtype: Optional[torch.dtype] = None,
                    warmup: Optional[bool] = None, con=None) -> dict:
    """The suite: every preset (random weights) x load point x provider; writes
    ``serve-<gpu>-<dtype>-<date>`` .json/.csv (and .png with several load points) under
    ``out_dir``, prints the table and one JSON summary line. On a GPU: bf16, the fused
    backend, CUDA graphs, warm-ups; on the CPU (a smoke run for the plumbing): float32, the
    eager backend, no warm-up. Returns {"records", "meta", "json", "png"}."""
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .decode import build
    from .harness import device_info, slug, write_results
    from .report import console
    from .serve_report import plot_serve, print_serve_table, summary_line

    con = con or console()
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
    warmup = cuda if warmup is None else warmup
    meta = device_info(device)
    try:
        import transformers
        meta["transformers"] = transformers.__version__
    except ImportError:
        meta["transformers"] = None
    w0 = workloads[0]
    meta.update(suite="serve", dtype=str(dtype).removeprefix("torch."), backend="fused" if cuda else "eager",
                graphs=cuda, warmup=warmup, presets=list(presets), num_requests=w0.num_requests,
                prompt_lo=w0.prompt_lo, prompt_hi=w0.prompt_hi, output_len=w0.output_len, seed=w0.seed,
                concurrency=sorted({w.concurrency for w in workloads}),
                rates=sorted({w.rate for w in workloads if w.rate is not None}),
                arrivals="closed loop: all at t=0, C in flight" if w0.rate is None else "Poisson (open loop)",
                sampling="greedy, EOS ignored, exactly output_len new tokens")
    con.print(f"[bold]{meta['gpu']}[/]: torch {meta['torch']}, triton {meta['triton']}, "
              f"transformers {meta['transformers']}")
    records = []
    columns = (TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with torch.no_grad(), Progress(*columns, console=con, refresh_per_second=2) as bar:
        def task(description: str, total: int) -> Callable[[int], None]:
            tid = bar.add_task(description, total=total)
            return lambda n: bar.advance(tid, n)

        for preset in presets:
            model, hf = build(preset, dtype, device, "transformers-cb" in providers)
            model.backend = meta["backend"]
            records += bench_preset(preset, model, hf, workloads, providers, graphs=cuda, warmup=warmup, task=task)
            del model, hf
            if cuda:
                torch.cuda.empty_cache()
    stem = Path(out_dir) / f"serve-{slug(meta['gpu'])}-{meta['dtype']}-{meta['date'][:10].replace('-', '')}"
    json_path, _ = write_results(records, meta, stem)
    print_serve_table(con, records, meta)
    png = plot_serve(records, meta, stem.with_suffix(".png"))
    con.print(f"results: {json_path}, {stem.with_suffix('.csv')}" + (f", {png}" if png else ""))
    print(json.dumps(summary_line(records, meta, json_path)), flush=True)
    return {"records": records, "meta": meta, "json": json_path, "png": png}


def main(args) -> int:
    """``onetrip bench serve``: the arguments of ``cli.py`` to workloads; 1 when an onetrip
    provider failed or gave a wrong token count, 2 for a bad argument."""
    import sys

    cuda = torch.cuda.is_available()
    if cuda:
        presets = args.preset or (("llama-3.2-1b",) if args.quick else ("llama-3.2-1b", "llama-3.1-8b"))
        n, out, prompt, conc = 64 if args.quick else 256, 128 if args.quick else 256, (64, 511), (64,)
    else:  # the smoke run: the tiny preset's 512 positions, a few eager steps
        presets, n, out, prompt, conc = args.preset or ("tiny",), 8, 8, (4, 24), (4,)
    try:
        lo, hi = args.prompt_len or prompt
        workloads = load_points(tuple(args.concurrency or conc), tuple(args.rate or ()),
                                num_requests=args.requests or n, prompt_lo=lo, prompt_hi=hi,
                                output_len=args.output_len or out, seed=args.seed)
    except ValueError as exc:
        print(f"onetrip bench serve: {exc}", file=sys.stderr)
        return 2
    result = run_serve_bench(args.out, presets=presets, workloads=workloads,
                             providers=tuple(args.provider or PROVIDERS))
    bad = [r for r in result["records"] if r["provider"].startswith("onetrip")
           and ("error" in r or not r.get("tokens_ok", False))]
    return 1 if bad else 0
