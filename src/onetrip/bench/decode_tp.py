"""``onetrip bench decode --tp N``: tensor-parallel decode over N GPUs, one process per GPU.

    onetrip bench decode --tp 4 --preset llama-3.1-70b --batch 1 32    # relaunches under torchrun
    onetrip bench decode --tp 2 --check                                 # CPU: 2 gloo processes, tiny preset

Every rank holds its shard (``models.tp``: column-parallel q/k/v and gate/up, row-parallel
o and down, the LM head split over the vocabulary) of the same random weights. Providers:

    onetrip-tp        onetrip's engine (fused kernels, the step one CUDA graph), its two
                      all-reduces a layer in allreduce mode "fused"
    onetrip-tp-nccl   the same with allreduce mode "nccl" (NCCL, then the add + norm kernel)
    gptfast-tp        gpt-fast's TP recipe on the same shard tensors: a plain PyTorch decoder
                      (static KV cache, the eager layers' math), one NCCL all-reduce after o
                      and after down (``_functional_collectives``), greedy by a vocab-split
                      argmax, the decode step under torch.compile(mode="reduce-overhead",
                      fullgraph=True)

Metrics per (preset, batch, provider), prompt of ``prompt`` tokens, ``new_tokens`` new ones:

    tok/s             rank 0's batch x (new_tokens - 1) / decode time; the ranks start each
                      timed run together (a barrier) and run in lock step (the collectives).
    % of floor        step floor / step time. A rank must read its weights once and its KV
                      cache at the run's mean length each step: bytes_r. The floor is
                      max over ranks of bytes_r / copy_r, copy_r the copy bandwidth measured
                      on rank r in this run (the aggregate limit: every GPU streaming at once).
    all-reduce        the two all-reduces of a layer, (batch, hidden) each, timed alone: 2 x
                      layers calls captured in one CUDA graph, replayed; microseconds a layer
                      and their share of the step (the step itself is timed with them inside).

``--tp 1`` runs one process through the same code on the plain single-GPU model (no
``tp``: the engine's own one-GPU path, batch-1 GEMVs carrying the residual adds included;
onetrip-tp-nccl is left out, having nothing to reduce). The TP-N / TP-1 ratio comes from
two invocations of the same build in one job: a TP-N run reads the TP-1 results file of the
same GPU, dtype and day from ``out_dir`` and prints the ratio (``vs_tp1`` in its records).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from ..engine.generate import Engine, common_prefix
from ..engine.launch import CHILD_ENV, needs_relaunch, relaunch_under_torchrun
from ..models import Model
from ..models.config import ModelConfig, get_config
from .gptfast_tp import GptFastTP
from .harness import sync

PROVIDERS = ("onetrip-tp", "onetrip-tp-nccl", "gptfast-tp")
ALLREDUCE = {"onetrip-tp": "fused", "onetrip-tp-nccl": "nccl", "gptfast-tp": "nccl"}


def prompts_for(batch: int, n: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """(batch, n) int64 random prompt ids, the same on every rank (a seeded CPU generator)."""
    return torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------- ranks


class Ranks:
    """The bench's view of the process group: this rank, the world, a barrier and a gather
    of Python objects; one process (world 1) needs no group."""

    def __init__(self, tp):
        self.tp = tp
        self.rank, self.world = (0, 1) if tp is None else (tp.rank, tp.world)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier(group=self.tp.group)

    def gather(self, obj) -> list:
        """[obj of rank 0, obj of rank 1, ...] on every rank."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj, group=self.tp.group)
        return out


def build_model(config: ModelConfig, tp, dtype: torch.dtype, device) -> Model:
    """This rank's shard of ``Model.random(config, seed=0)`` drawn on ``device``; at TP 1
    the plain single-GPU model (no ``tp``: the engine's own fastest path)."""
    if tp is None:
        return Model.random(config, dtype, device, seed=0)
    from ..models.tp import random_model_tp

    return random_model_tp(config, tp, dtype, device, seed=0)


# ---------------------------------------------------------------------------- providers


def _set_allreduce(model: Model, mode: str) -> None:
    """Make the shard's fused step all-reduce in ``mode``: its ``tp_comm`` is made in the
    shard's mode on the next forward (``fused._comm``), so the old one goes."""
    if model.tp is not None and model.tp.allreduce != mode:
        model.tp = dataclasses.replace(model.tp, allreduce=mode)
        model.tp_comm = None


@torch.no_grad()
def run_onetrip(model: Model, prompts: torch.Tensor, new_tokens: int, mode: str, ranks: Ranks,
                warmup: bool = True):
    """onetrip-tp / onetrip-tp-nccl: the engine (fused backend, the step a CUDA graph on a
    GPU) on the local model; (tokens, prefill s, decode s)."""
    _set_allreduce(model, mode)
    model.backend = "fused"
    b, p = prompts.shape
    engine = Engine(model, max_seq=p + new_tokens + 16, max_batch=b, graphs=True)
    rows = prompts.tolist()
    if warmup:
        engine.generate(rows, min(new_tokens, 4))  # compiles the kernels, captures the step
    ranks.barrier()
    r = engine.generate(rows, new_tokens)
    model.reset_cache()
    return r.tokens, r.prefill_ms / 1e3, r.decode_ms / 1e3


@torch.no_grad()
def run_gptfast(model: Model, prompts: torch.Tensor, new_tokens: int, compiled: bool, ranks: Ranks,
                warmup: bool = True):
    """gptfast-tp: the prefill eager, each decode step the compiled module (gpt-fast
    compiles the step only; ``compiled`` False: eager, for the CPU check); (tokens,
    prefill s, decode s)."""
    b, p = prompts.shape
    dev = model.device
    gpt = GptFastTP(model, b, p + new_tokens + 8)
    step = gpt
    if compiled:
        # dynamic=False: one static graph per batch size, as gpt-fast (a process per size) gets
        compiled_step = torch.compile(gpt, mode="reduce-overhead", fullgraph=True, dynamic=False)

        def step(tok, lens):
            # A CUDA-graph tree reuses its outputs at the next replay: keep a copy (as gpt-fast does).
            torch.compiler.cudagraph_mark_step_begin()
            return compiled_step(tok, lens).clone()

    def loop(n: int):
        ranks.barrier()
        sync(dev)
        t0 = time.perf_counter()
        lens = torch.zeros(b, dtype=torch.int32, device=dev)
        tok = gpt(prompts.to(dev), lens)
        lens += p
        sync(dev)
        t1 = time.perf_counter()
        out = [tok]
        for _ in range(n - 1):
            tok = step(tok, lens)
            lens += 1
            out.append(tok)
        sync(dev)
        t2 = time.perf_counter()
        return torch.cat(out, 1).tolist(), t1 - t0, t2 - t1

    if warmup:
        # the compilation, with inductor's default tuning as the one-GPU gpt-fast provider has it (coordinate-descent
        # tuning, which gpt-fast turns on, took over 2 minutes a rank for Llama-3.1-8B at TP 2 on H200s)
        loop(min(new_tokens, 4))
    return loop(new_tokens)


# ---------------------------------------------------------------------------- floor and all-reduce


def rank_step_bytes(model: Model, batch: int, mean_context: float) -> float:
    """Bytes one decode step reads on this rank: its parameters once (of the input
    embedding only the ``batch`` rows fed in, unless it is also the head) + its KV cache at
    ``mean_context`` tokens a sequence (``engine.budget``'s count, on the local shard)."""
    c = model.config
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if model.lm_head is not None:
        w = model.embed.weight
        nbytes -= (w.shape[0] - batch) * w.shape[1] * w.element_size()
    elem = model.embed.weight.element_size()
    return nbytes + 2 * c.num_layers * c.num_kv_heads * c.head_dim * elem * mean_context * batch


def allreduce_us_per_layer(model: Model, batch: int, ranks: Ranks, reps: int = 20) -> dict:
    """Microseconds of a layer's two all-reduces of (batch, hidden) in the model dtype, 2 x
    layers calls captured in one CUDA graph, the median replay over the layers, for each
    way a provider runs them: "nccl" (``dist.all_reduce`` alone: gptfast-tp), "op-nccl" and
    "op-fused" (``allreduce_add_rms_norm`` in either mode, with its residual add and norm:
    onetrip-tp-nccl, onetrip-tp). Empty off CUDA or at TP 1; a mode that fails: None, and
    its error under "<mode>_error"."""
    tp, c = model.tp, model.config
    if model.device.type != "cuda" or tp is None or tp.world == 1:
        return {}
    from ..graphs import capture

    dev, n = model.device, 2 * c.num_layers
    x = torch.zeros(batch, c.hidden_size, dtype=model.dtype, device=dev)
    residual = torch.zeros_like(x)
    weight = torch.ones(c.hidden_size, dtype=model.dtype, device=dev)
    out = {}
    for name in ("nccl", "op-nccl", "op-fused"):
        try:
            if name == "nccl":
                def call():
                    dist.all_reduce(x, group=tp.group)
            else:
                from ..models.fused import FUSED_ALLREDUCE_ROWS
                from ..ops.allreduce_norm import allreduce_add_rms_norm, make_comm

                # the step's comm: fused._comm's size, in this mode
                comm = make_comm(tp.group, tp.rank, tp.world, c.hidden_size, FUSED_ALLREDUCE_ROWS, model.dtype, dev,
                                 name.removeprefix("op-"))

                def call(comm=comm):
                    allreduce_add_rms_norm(x, residual, weight, c.rms_norm_eps, comm)
            graph, _ = capture(lambda: [call() for _ in range(n)])
            ranks.barrier()
            times = []
            for _ in range(reps + 2):  # the first replays absorb the ranks' skew
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            del graph
            out[name] = 1e3 * sorted(times[2:])[reps // 2] / c.num_layers
        except Exception as exc:  # noqa: BLE001 - recorded as unmeasured; every rank fails alike
            from .harness import error_string

            out[name], out[f"{name}_error"] = None, error_string(exc)
    return out


# ---------------------------------------------------------------------------- the run on each rank


def run_case(model: Model, preset: str, batch: int, prompt: int, new_tokens: int, providers, ranks: Ranks,
             copy_gbs: Optional[float], log=print) -> list[dict]:
    """Every provider on one (preset, batch): a record each, the same on every rank. A
    provider that fails on any rank is recorded with the first rank's error. ``log``: a
    line as each provider starts."""
    prompts = prompts_for(batch, prompt, model.config.vocab_size)
    steps = new_tokens - 1
    mean_ctx = prompt + (steps + 1) / 2  # engine.budget's mean context over the decode steps
    per_rank = ranks.gather((rank_step_bytes(model, batch, mean_ctx), copy_gbs))
    floor_ms = max(b / (g * 1e6) for b, g in per_rank) if all(g for _, g in per_rank) else None
    ar = allreduce_us_per_layer(model, batch, ranks)
    records, ref = [], None
    for name in providers:
        log(f"  {preset} batch {batch}: {name} ...")
        rec = {"preset": preset, "tp": ranks.world, "batch": batch, "prompt": prompt, "new_tokens": new_tokens,
               "provider": name}
        error, toks = None, None
        try:
            if name == "gptfast-tp":
                toks, prefill, decode = run_gptfast(model, prompts, new_tokens, True, ranks)
            else:
                toks, prefill, decode = run_onetrip(model, prompts, new_tokens, ALLREDUCE[name], ranks)
        except Exception as exc:  # recorded, the run goes on
            from .harness import error_string

            error = error_string(exc)
        errors = [e for e in ranks.gather(error) if e]
        if errors:
            records.append(dict(rec, error=errors[0]))
            log(f"  {preset} batch {batch}: {name} failed: {errors[0][:200]}")
            continue
        ms = decode * 1e3 / steps
        rec.update(prefill_ms=prefill * 1e3, decode_ms=decode * 1e3, ms_per_step=ms, tok_s=batch * steps / decode,
                   bytes_per_rank=max(b for b, _ in per_rank),
                   aggregate_gbs=sum(b for b, _ in per_rank) / 1e9 / (ms / 1e3), floor_ms=floor_ms,
                   pct_of_floor=100 * floor_ms / ms if floor_ms else None,
                   limit_tok_s=batch * 1e3 / floor_ms if floor_ms else None)
        kind = {"onetrip-tp": "op-fused", "onetrip-tp-nccl": "op-nccl", "gptfast-tp": "nccl"}[name]
        us = ar.get(kind)
        rec.update(allreduce=kind if ar else None, allreduce_us_per_layer=us,
                   allreduce_pct_of_step=100 * us * model.config.num_layers / 1e3 / ms if us else None)
        if ar.get(f"{kind}_error"):
            rec["allreduce_error"] = ar[f"{kind}_error"]
        rec["ranks_agree"] = all(t == toks for t in ranks.gather(toks))  # every rank drew the same tokens
        ref = ref or toks
        same = sum(a == b for ra, rb in zip(toks, ref) for a, b in zip(ra, rb))
        rec["tokens_agree"] = same / max(1, sum(len(r) for r in ref))  # vs the first provider
        rec["same_prefix"] = min(common_prefix(ra, rb) for ra, rb in zip(toks, ref))
        records.append(rec)
        log(f"  {preset} batch {batch}: {name} {rec['tok_s']:.0f} tok/s, {ms:.3f} ms a step")
    by = {r["provider"]: r for r in records if "tok_s" in r}
    for r in by.values():
        if "gptfast-tp" in by and r["provider"] != "gptfast-tp":
            r["vs_gptfast"] = r["tok_s"] / by["gptfast-tp"]["tok_s"]
    return records


def bench_decode_tp(out_dir, *, presets=("llama-3.1-8b",), batches=(1, 32), providers=PROVIDERS,
                    new_tokens: int = 128, prompt: int = 32, dtype=torch.bfloat16) -> dict:
    """The GPU benchmark on this rank (under torchrun, or alone at TP 1): every preset,
    batch and provider; rank 0 prints the table and writes the results files."""
    from rich.console import Console

    from .harness import copy_bandwidth_gbs, device_info, slug, utc_now, write_results
    from .report import console

    world = int(os.environ.get("WORLD_SIZE", "1"))
    tp = None
    if world > 1:
        from ..models.tp import TensorParallel

        os.environ.update(CHILD_ENV)  # before NCCL starts: never NVLink multicast
        tp = TensorParallel.from_env()
    ranks = Ranks(tp)
    device = torch.device("cuda", torch.cuda.current_device())
    con = console() if ranks.rank == 0 else Console(quiet=True)
    if world == 1:
        providers = [p for p in providers if p != "onetrip-tp-nccl"]  # one GPU: no all-reduce to choose
    meta = device_info(device)
    copies = ranks.gather(copy_bandwidth_gbs(device))
    meta.update(gpu_name=meta["gpu"], gpu=f"{meta['gpu']} x {world}", tp=world, copy_gbs=min(copies),
                copy_gbs_per_rank=copies, dtype=str(dtype).removeprefix("torch."), prompt=prompt,
                new_tokens=new_tokens, nccl=".".join(map(str, torch.cuda.nccl.version())) if world > 1 else None)
    con.print(f"[bold]{meta['gpu']}[/], TP {world}: copy {min(copies):.0f}-{max(copies):.0f} GB/s per GPU; "
              f"torch {meta['torch']}, triton {meta['triton']}, NCCL {meta['nccl'] or '-'}")
    records = []
    for preset in presets:
        config = get_config(preset)
        with con.status(f"{preset}: drawing random weights, {config.num_parameters() / world / 1e9:.1f} B "
                        f"parameters a GPU ..."):
            t = time.perf_counter()
            model = build_model(config, tp, dtype, device)
            ranks.barrier()
        con.print(f"{preset}: shards built in {time.perf_counter() - t:.1f} s")
        for batch in batches:
            with con.status(f"{preset} TP {world} batch {batch} (gptfast-tp compiles its step first: "
                            f"a minute or more) ..."):
                records += run_case(model, preset, batch, prompt, new_tokens, providers, ranks, copies[ranks.rank],
                                    log=con.print)
            done = ", ".join(f"{r['provider']} {r['tok_s']:.0f} tok/s" for r in records[-len(providers):]
                             if "tok_s" in r)
            con.print(f"{preset} batch {batch}: {done}")
        del model
        torch.cuda.empty_cache()
    if ranks.rank == 0:
        stem = Path(out_dir) / f"decode-tp{world}-{slug(meta['gpu_name'])}-{meta['dtype']}-{utc_now():%Y%m%d}"
        tp1 = attach_tp1_ratio(records, stem) if world > 1 else None
        json_path, _ = write_results(records, meta, stem)
        from .decode_tp_report import print_tp_table

        print_tp_table(con, records, meta, tp1)
        con.print(f"results: {json_path}, {stem.with_suffix('.csv')}")
    if tp is not None:
        dist.destroy_process_group()
    return {"records": records, "meta": meta}


def attach_tp1_ratio(records: list[dict], stem: Path) -> Optional[Path]:
    """Put ``vs_tp1`` (tok/s over the TP-1 run's, same preset, batch and provider) on each
    record, from the TP-1 results file of the same GPU, dtype and day beside ``stem``;
    that file's path, or None when there is none."""
    if not records:
        return None
    path = stem.with_name(stem.name.replace(f"decode-tp{records[0]['tp']}-", "decode-tp1-", 1)).with_suffix(".json")
    if not path.is_file():
        return None
    base = {(r["preset"], r["batch"], r["provider"]): r.get("tok_s") for r in json.loads(path.read_text())["results"]}
    for r in records:
        # onetrip-tp-nccl's TP-1 run is onetrip-tp's (one GPU has nothing to all-reduce)
        key = (r["preset"], r["batch"], "onetrip-tp" if r["provider"] == "onetrip-tp-nccl" else r["provider"])
        if r.get("tok_s") and base.get(key):
            r["vs_tp1"] = r["tok_s"] / base[key]
    return path


# ---------------------------------------------------------------------------- the CPU check

# onetrip-tp's fused all-reduce needs CUDA (symmetric memory): on the CPU it would be
# onetrip-tp-nccl again, through gloo.
CHECK_PROVIDERS = ("onetrip-tp-nccl", "gptfast-tp")


def check_decode_tp(world: int = 2, new_tokens: int = 6, batch: int = 2, con=None) -> int:
    """Without a GPU: ``world`` gloo processes on the CPU shard the tiny preset (fp32) and
    run ``CHECK_PROVIDERS`` (the fused kernels through Triton's interpreter, gptfast-tp
    uncompiled) on ``batch`` prompts of 3 tokens; each must draw the full model's greedy
    tokens on every rank. Returns 0 when all agree, else 1."""
    from .decode_tp_report import print_check_table
    from .report import console

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tokens.json"
        # fork: the children start with onetrip imported (spawn re-imports torch: ~10 s a process)
        method = "spawn" if torch.cuda.is_initialized() else "fork"
        torch.multiprocessing.start_processes(_check_rank, args=(world, port, new_tokens, batch, str(out)),
                                              nprocs=world, start_method=method)
        data = json.loads(out.read_text())
    bad = print_check_table(con or console(), world, data["results"], data["ref"])
    return 1 if bad else 0


def _check_rank(rank: int, world: int, port: int, new_tokens: int, batch: int, out: str) -> None:
    from ..models.llama import greedy_generate
    from ..models.tp import TensorParallel, shard_model

    torch.set_num_threads(1)  # the ranks share the CPU
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        full = Model.random(get_config("tiny"), torch.float32, "cpu", seed=0)
        prompts = prompts_for(batch, 3, full.config.vocab_size)
        ref = greedy_generate(full, prompts, new_tokens).tolist()
        full.reset_cache()
        ranks = Ranks(TensorParallel(rank, world))
        local = shard_model(full, ranks.tp)
        results = {}
        for name in CHECK_PROVIDERS:
            if name == "gptfast-tp":
                toks = run_gptfast(local, prompts, new_tokens, False, ranks, warmup=False)[0]
            else:
                toks = run_onetrip(local, prompts, new_tokens, ALLREDUCE[name], ranks, warmup=False)[0]
            same = all(t == toks for t in ranks.gather(toks))
            results[name if same else f"{name} (ranks differ)"] = toks
        if rank == 0:
            Path(out).write_text(json.dumps({"ref": ref, "results": results}))
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------- the command


def tp_argv(args) -> list[str]:
    """The ``onetrip`` arguments that rerun ``args`` (as cli.py parses them) under torchrun."""
    argv = ["bench", "decode", "--tp", str(args.tp), "--new-tokens", str(args.new_tokens or 128),
            "--prompt-tokens", str(args.prompt_tokens), "--out", str(args.out)]
    for flag, values in (("--preset", args.preset), ("--batch", args.batch), ("--provider", args.provider)):
        if values:
            argv += [flag, *map(str, values)]
    return argv


def main(args) -> int:
    """``onetrip bench decode --tp N ...``: the CPU check without a GPU (or with --check),
    else the benchmark, relaunched under torchrun when N > 1 and this is not a torchrun
    process yet. Exit status 1 when an onetrip provider failed, 2 for bad arguments."""
    import sys

    bad = [p for p in args.provider or () if p not in PROVIDERS]
    if bad:
        print(f"onetrip bench decode: --provider {' '.join(bad)} does not go with --tp; TP providers: "
              f"{', '.join(PROVIDERS)}", file=sys.stderr)
        return 2
    if args.check or not torch.cuda.is_available():
        return check_decode_tp(args.tp)
    if args.tp > torch.cuda.device_count():
        print(f"onetrip bench decode: --tp {args.tp} needs {args.tp} GPUs, this machine has "
              f"{torch.cuda.device_count()}", file=sys.stderr)
        return 2
    if needs_relaunch(args.tp):
        return relaunch_under_torchrun(args.tp, tp_argv(args))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != args.tp:
        print(f"onetrip bench decode: --tp {args.tp} in a torchrun job of {world} processes; give --tp {world} "
              f"or run it outside torchrun (it starts the processes itself)", file=sys.stderr)
        return 2
    result = bench_decode_tp(args.out, presets=tuple(args.preset or ("llama-3.1-8b",)),
                             batches=tuple(args.batch or (1, 32)), providers=tuple(args.provider or PROVIDERS),
                             new_tokens=args.new_tokens or 128, prompt=args.prompt_tokens)
    return 1 if any("error" in r and r["provider"].startswith("onetrip") for r in result["records"]) else 0
