"""``onetrip generate``: load a checkpoint or build a preset, generate, and say how fast.

The summary gives prefill time, decode tok/s and ms per token, kernels per decode step
(counted by onetrip's profiler over a few extra steps), and the achieved bandwidth: the
bytes a decode step must read (``budget.py``: weights once + the KV cache) over the
measured step time, against the copy bandwidth measured on the same device.

With ``--tp N`` the command runs in N processes under torchrun (``cli.py`` relaunches
itself), one tensor-parallel rank each (``models.tp``) on CUDA device LOCAL_RANK (gloo on
the CPU); every rank generates, rank 0 prints. Kernels, bytes and bandwidth are then one
rank's: its slices of the weights and KV cache against its own GPU's copy bandwidth.

``--model`` takes a checkpoint directory, a preset name or a Hugging Face Hub id
(``org/name``, ``org/name@revision``; ``models.hub``), in that order.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Union

import torch

from ..device import copy_bandwidth_gbs
from ..models import Model, get_config, load_model
from ..models.config import PRESETS
from ..models.hub import HubId, hub_offline, parse_hub_id, snapshot
from ..models.tp import TensorParallel, env_device, load_model_tp, random_model_tp
from .budget import decode_budget
from .generate import Engine, GenerationResult
from .sampling import SamplingParams
from .tokenizer import IncrementalDecoder, Tokenizer

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def load(spec: str, dtype: Optional[torch.dtype], device: str, seed: int = 0,
         tp: Optional[TensorParallel] = None) -> tuple[Model, Optional[Tokenizer], str]:
    """The model ``spec`` names (``model_source``). A directory with a config.json, or a Hub
    id (its snapshot in the hub cache, downloaded first unless HF_HUB_OFFLINE=1): its
    weights, and its tokenizer when there is a tokenizer.json. A preset: random weights, no
    tokenizer. Returns (model, tokenizer, label: the directory's, repository's or preset's
    name). dtype None: config.json's torch_dtype (float32 for a preset). Raises ValueError
    naming ``spec`` and the three forms for anything else, or saying why a Hub id's files
    cannot be had.
    With ``tp``, this rank's shard (read slice by slice, or this rank's part of the
    preset's random weights)."""
    source = model_source(spec)
    if isinstance(source, str):
        if tp is not None:
            return random_model_tp(get_config(spec), tp, dtype or torch.float32, device, seed=seed), None, spec
        return Model.random(get_config(spec), dtype or torch.float32, device, seed=seed), None, spec
    path = source if isinstance(source, Path) else snapshot(source)
    model = load_model(path, dtype, device) if tp is None else load_model_tp(path, tp, dtype, device)
    tok = Tokenizer.from_dir(path) if (path / "tokenizer.json").is_file() else None
    return model, tok, source.name


def model_source(spec: str) -> Union[Path, str, HubId]:
    """What ``--model spec`` names, tried in this order: an existing directory with a
    config.json (its Path), a preset (its name), a Hugging Face Hub id ``org/name`` or
    ``org/name@revision`` (a HubId). Raises a ValueError naming ``spec`` and the three forms
    for anything else. Reads no network."""
    path = Path(spec)
    if (path / "config.json").is_file():
        return path
    if spec in PRESETS:
        return spec
    hub = None if path.is_dir() else parse_hub_id(spec)  # a local directory is never a Hub id
    if hub is None:
        raise ValueError(f"--model {spec!r} is neither a directory with config.json nor a preset; "
                         f"presets: {', '.join(PRESETS)}; nor a Hugging Face Hub id (org/name or "
                         f"org/name@revision)")
    return hub


def check_model(spec: str) -> None:
    """Raise ``model_source``'s ValueError before anything slow; for a Hub id with
    HF_HUB_OFFLINE=1, also when the hub cache lacks it (a look at the cache; nothing is
    downloaded)."""
    source = model_source(spec)
    if isinstance(source, HubId) and hub_offline():
        snapshot(source)


def cpu_warning(spec: str, backend: str) -> str:
    """The line a run on the CPU starts with: how the kernels run, what to expect of the
    time, and (beyond the tiny preset) what is quicker."""
    how = ", the fused kernels through Triton's interpreter" if backend == "fused" else ""
    if spec == "tiny":
        return f"No CUDA GPU: {spec} runs on the CPU{how}; tok/s here says nothing about GPU speed."
    return f"No CUDA GPU: {spec} runs on the CPU{how}; expect minutes. For a quick check: --model tiny."


def build_prompts(tokenizer: Optional[Tokenizer], text: Optional[str], n_tokens: Optional[int], batch: int,
                  chat: bool, vocab: int, seed: int = 0) -> list[list[int]]:
    """``batch`` prompts: ``text`` encoded (through the chat template with ``chat``), or
    ``n_tokens`` random ids per sequence (different per sequence, seeded)."""
    if text is not None:
        if tokenizer is None:
            raise ValueError("--prompt needs a tokenizer (a model directory with tokenizer.json); "
                             "with a preset use --prompt-tokens N")
        if chat:
            ids = tokenizer.encode_chat([{"role": "user", "content": text}])
        else:
            ids = tokenizer.encode(text)
        return [ids] * batch
    if chat:
        raise ValueError("--chat needs --prompt TEXT")
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, n_tokens or 32), generator=gen).tolist()


@dataclass(frozen=True)
class GenerateSummary:
    model: str
    backend: str
    graphs: bool
    page_size: Optional[int]  # None: a contiguous KV cache
    dtype: str
    batch: int
    prompt_tokens: int
    new_tokens: int
    prefill_ms: float
    decode_tok_s: float
    ms_per_token: float
    kernels_per_step: Optional[float]
    achieved_gbs: float
    bandwidth_gbs: Optional[float]
    pct_of_limit: Optional[float]
    limit_tok_s: Optional[float]
    device: str
    tp: int = 1  # tensor-parallel ranks; kernels, bytes and bandwidth are then one rank's


def decode_kernels(engine: Engine, prompts: list[list[int]], steps: int = 4) -> Optional[float]:
    """Median GPU kernels per decode step over ``steps`` profiled steps (None on a CPU)."""
    if engine.model.device.type != "cuda":
        return None
    from ..profile.run import kernels_per_step

    return kernels_per_step(engine.stepper(prompts, steps + 2), steps=steps)[0]


def summarize(result: GenerationResult, model: Model, label: str, backend: str, kernels: Optional[float],
              bandwidth: Optional[float], page_size: Optional[int] = None) -> GenerateSummary:
    b = len(result.tokens)
    config = model.config
    if model.tp is not None:  # a rank reads its own head rows, not the vocabulary's
        config = dataclasses.replace(config, vocab_size=model.head_weight.shape[0])
    budget = decode_budget(config, model.dtype, b, result.prompt_lens, result.decode_steps, bandwidth)
    ms = result.ms_per_step
    return GenerateSummary(
        model=label, backend=backend, graphs=result.graphs, page_size=page_size,
        dtype=str(model.dtype).removeprefix("torch."), batch=b,
        prompt_tokens=max(result.prompt_lens), new_tokens=result.decode_steps + 1, prefill_ms=result.prefill_ms,
        decode_tok_s=result.decode_tok_per_s, ms_per_token=ms, kernels_per_step=kernels,
        achieved_gbs=budget.achieved_gbs(ms) if result.decode_steps else 0.0, bandwidth_gbs=bandwidth,
        pct_of_limit=budget.pct_of_limit(ms) if result.decode_steps else None, limit_tok_s=budget.limit_tok_s,
        device=torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else "cpu",
        tp=1 if model.tp is None else model.tp.world)


class GenerateProgress:
    """Progress of one ``generate`` call on ``status`` (a rich console): the prefill, then
    the decoded tokens. A bar on a terminal; elsewhere, with ``lines``, a line at the
    prefill's end and at every eighth of the tokens. ``tokens(n)``: n new tokens so far
    (the first one ends the prefill)."""

    def __init__(self, status, prompt_tokens: int, new_tokens: int, enabled: bool = True, lines: bool = False):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.status, self.new_tokens, self.enabled = status, new_tokens, enabled
        self.live = enabled and status.is_terminal
        self.lines = enabled and lines and not self.live
        self.every = max(1, new_tokens // 8)
        self.done = 0
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=status, transient=True, disable=not self.live)
        self.prefill = self.bar.add_task(f"prefill ({prompt_tokens} prompt tokens)", total=None)  # pulses
        self.decode = self.bar.add_task("decode", total=new_tokens, start=False)
        self.start = 0.0

    def __enter__(self) -> "GenerateProgress":
        self.start = time.perf_counter()
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def tokens(self, n: int) -> None:
        if not self.enabled or n <= self.done:
            return
        if self.done == 0:
            self.bar.update(self.prefill, total=1, completed=1)
            self.bar.start_task(self.decode)
        self.bar.update(self.decode, completed=n)
        if self.lines and (self.done == 0 or n // self.every > self.done // self.every or n == self.new_tokens):
            what = "prefill done, " if self.done == 0 else ""
            self.status.print(f"generate: {what}{n}/{self.new_tokens} tokens, {time.perf_counter() - self.start:.1f} s")
        self.done = n


def run_generate(args, console, status=None) -> int:
    """The body of ``onetrip generate`` (arguments as parsed in cli.py). The summary goes to
    ``console``; warnings and progress to ``status`` (default: stderr), so that stdout
    holds the tokens and the summary only."""
    from rich.console import Console

    status = status or Console(stderr=True, soft_wrap=True)
    check_model(args.model)
    world = getattr(args, "tp", 1)
    if world == 1:
        return _generate(args, console, status, None, "cuda" if torch.cuda.is_available() else "cpu")
    env_world = os.environ.get("WORLD_SIZE")
    if env_world != str(world):
        raise ValueError(f"--tp {world} runs under torchrun with WORLD_SIZE={world}; here WORLD_SIZE is "
                         f"{env_world!r} (run `onetrip generate --tp {world} ...` without torchrun: it launches it)")
    tp = TensorParallel.from_env()
    try:
        if tp.rank:  # rank 0 speaks for all
            console = status = Console(quiet=True)
        return _generate(args, console, status, tp, str(env_device()))
    finally:
        torch.distributed.destroy_process_group()


def _generate(args, console, status, tp: Optional[TensorParallel], device: str) -> int:
    from rich.table import Table

    if args.page_size is not None and not args.paged:
        raise ValueError(f"--page-size {args.page_size} applies to a paged KV cache; add --paged")
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    if device == "cpu":
        status.print(f"[yellow]{cpu_warning(args.model, args.backend)}[/]")
    on_gpu = device.startswith("cuda")
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if on_gpu else torch.float32)
    checkpoint = not isinstance(model_source(args.model), str)  # a directory or a hub id: its own dtype by default
    model, tok, label = load(args.model, None if args.dtype is None and checkpoint else dtype, device, seed=args.seed,
                             tp=tp)
    model.backend = args.backend
    prompts = build_prompts(tok, args.prompt, args.prompt_tokens, args.batch, args.chat, model.config.vocab_size,
                            seed=args.seed)
    engine = Engine(model, max_seq=max(map(len, prompts)) + args.max_new_tokens + 8, max_batch=args.batch,
                    graphs=not args.no_graphs, paged=args.paged, page_size=args.page_size)

    # Every rank takes the same branches below: a host read that decides to stop early must
    # happen at the same step on all of them, or one runs a step (and its collectives) alone.
    stream = tok is not None and args.batch == 1 and not args.quiet
    show = not (stream or args.quiet)
    decoder = IncrementalDecoder(tok) if stream else None
    with GenerateProgress(status, sum(map(len, prompts)), args.max_new_tokens,
                          enabled=show and (tp is None or tp.rank == 0), lines=not on_gpu) as progress:

        def on_token(i: int, toks: list[int]) -> None:
            if stream:
                console.print(decoder.push(toks[0]), end="", soft_wrap=True, highlight=False)
            else:
                progress.tokens(i + 1)

        # On a GPU, on_step (every check_every steps) keeps the host off the device; on a
        # CPU a host read costs nothing and a step of a 1B model takes seconds: every token.
        per_token = stream or (show and not on_gpu)
        result = engine.generate(prompts, args.max_new_tokens, sampling=sampling,
                                 eos_ids=tok.eos_ids if tok is not None else (),
                                 on_token=on_token if per_token else None,
                                 on_step=(lambda i: progress.tokens(i + 1)) if show else None)
    if stream:
        console.print(decoder.flush(), highlight=False)
    elif tok is not None and not args.quiet:
        for i, toks in enumerate(result.tokens):
            console.print(f"[bold]{i}:[/] {tok.decode(toks)}", highlight=False)

    bandwidth = copy_bandwidth_gbs(device) if on_gpu else None
    kernels = decode_kernels(engine, prompts)
    s = summarize(result, model, label, args.backend, kernels, bandwidth, engine.page_size)

    paging = f" · paged KV ({s.page_size}-token pages)" if s.page_size else ""
    ranks = f" · TP {s.tp} (per rank)" if s.tp > 1 else ""
    table = Table(title=f"{label} · {s.backend}{' + CUDA graphs' if s.graphs else ''}{paging}{ranks} · {s.dtype} · "
                  f"{s.device}")
    for col in ("batch", "prompt", "new tokens", "prefill ms", "decode tok/s", "ms / token", "kernels / step",
                "GB/s", "% of limit"):
        table.add_column(col, justify="right")
    table.add_row(str(s.batch), str(s.prompt_tokens), str(s.new_tokens), f"{s.prefill_ms:.1f}",
                  f"{s.decode_tok_s:.1f}", f"{s.ms_per_token:.2f}",
                  "n/a" if s.kernels_per_step is None else f"{s.kernels_per_step:.0f}",
                  f"{s.achieved_gbs:.0f}", "n/a" if s.pct_of_limit is None else f"{s.pct_of_limit:.0f}%")
    console.print(table)
    if s.bandwidth_gbs:
        console.print(f"limit: {s.limit_tok_s:.0f} tok/s = {s.batch} x {s.bandwidth_gbs:.0f} GB/s copy bandwidth "
                      f"/ bytes per step (weights once + KV cache)")
    if args.json and (tp is None or tp.rank == 0):
        Path(args.json).write_text(json.dumps(asdict(s), indent=2) + os.linesep)
    return 0
