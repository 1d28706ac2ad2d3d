"""``onetrip generate``: load a checkpoint or build a preset, generate, and say how fast.

The summary gives prefill time, decode tok/s and ms per token, kernels per decode step
(counted by onetrip's profiler over a few extra steps), and the achieved bandwidth: the
bytes a decode step must read (``budget.py``: weights once + the KV cache) over the
measured step time, against the copy bandwidth measured on the same device.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch

from ..models import Model, get_config, load_model
from ..models.config import PRESETS
from .budget import decode_budget
from .generate import Engine, GenerationResult
from .sampling import SamplingParams
from .tokenizer import IncrementalDecoder, Tokenizer

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def load(spec: str, dtype: Optional[torch.dtype], device: str, seed: int = 0) -> tuple[Model, Optional[Tokenizer], str]:
    """A Hugging Face directory (weights, and its tokenizer when there is a tokenizer.json)
    or a preset name (random weights, no tokenizer). Returns (model, tokenizer, label)."""
    path = Path(spec)
    if path.is_dir():
        model = load_model(path, dtype, device)
        tok = Tokenizer.from_dir(path) if (path / "tokenizer.json").is_file() else None
        return model, tok, path.name
    if spec in PRESETS:
        return Model.random(get_config(spec), dtype or torch.float32, device, seed=seed), None, spec
    raise ValueError(f"--model {spec!r} is neither a directory nor a preset; presets: {', '.join(PRESETS)}")


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


def decode_kernels(engine: Engine, prompts: list[list[int]], steps: int = 4) -> Optional[float]:
    """Median GPU kernels per decode step over ``steps`` profiled steps (None on a CPU)."""
    if engine.model.device.type != "cuda":
        return None
    from ..profile.run import kernels_per_step

    return kernels_per_step(engine.stepper(prompts, steps + 2), steps=steps)[0]


def summarize(result: GenerationResult, model: Model, label: str, backend: str, kernels: Optional[float],
              bandwidth: Optional[float], page_size: Optional[int] = None) -> GenerateSummary:
    b = len(result.tokens)
    budget = decode_budget(model.config, model.dtype, b, result.prompt_lens, result.decode_steps, bandwidth)
    ms = result.ms_per_step
    return GenerateSummary(
        model=label, backend=backend, graphs=result.graphs, page_size=page_size,
        dtype=str(model.dtype).removeprefix("torch."), batch=b,
        prompt_tokens=max(result.prompt_lens), new_tokens=result.decode_steps + 1, prefill_ms=result.prefill_ms,
        decode_tok_s=result.decode_tok_per_s, ms_per_token=ms, kernels_per_step=kernels,
        achieved_gbs=budget.achieved_gbs(ms) if result.decode_steps else 0.0, bandwidth_gbs=bandwidth,
        pct_of_limit=budget.pct_of_limit(ms) if result.decode_steps else None, limit_tok_s=budget.limit_tok_s,
        device=torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else "cpu")


def run_generate(args, console) -> int:
    """The body of ``onetrip generate`` (arguments as parsed in cli.py)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device == "cuda" else torch.float32)
    model, tok, label = load(args.model, None if args.dtype is None and Path(args.model).is_dir() else dtype,
                             device, seed=args.seed)
    model.backend = args.backend
    prompts = build_prompts(tok, args.prompt, args.prompt_tokens, args.batch, args.chat, model.config.vocab_size,
                            seed=args.seed)
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    if args.page_size is not None and not args.paged:
        raise ValueError(f"--page-size {args.page_size} applies to a paged KV cache; add --paged")
    engine = Engine(model, max_seq=max(map(len, prompts)) + args.max_new_tokens + 8, max_batch=args.batch,
                    graphs=not args.no_graphs, paged=args.paged, page_size=args.page_size)
    if device == "cpu":
        console.print("[yellow]No CUDA GPU: running on the CPU"
                      + (" with the fused kernels through Triton's interpreter" if args.backend == "fused" else "")
                      + ". Timings need a GPU.[/]")

    stream = tok is not None and args.batch == 1 and not args.quiet
    decoder = IncrementalDecoder(tok) if stream else None
    with Progress(TextColumn("[bold]generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=stream or args.quiet) as bar:
        task = bar.add_task("decode", total=args.max_new_tokens)

        def on_token(i: int, toks: list[int]) -> None:
            console.print(decoder.push(toks[0]), end="", soft_wrap=True, highlight=False)

        def on_step(i: int) -> None:
            bar.update(task, completed=i)

        result = engine.generate(prompts, args.max_new_tokens, sampling=sampling,
                                 eos_ids=tok.eos_ids if tok is not None else (),
                                 on_token=on_token if stream else None, on_step=on_step)
    if stream:
        console.print(decoder.flush(), highlight=False)
    elif tok is not None and not args.quiet:
        for i, toks in enumerate(result.tokens):
            console.print(f"[bold]{i}:[/] {tok.decode(toks)}", highlight=False)

    bandwidth = None
    if device == "cuda":
        from ..bench.harness import copy_bandwidth_gbs
        bandwidth = copy_bandwidth_gbs(device)
    kernels = decode_kernels(engine, prompts)
    s = summarize(result, model, label, args.backend, kernels, bandwidth, engine.page_size)

    paging = f" · paged KV ({s.page_size}-token pages)" if s.page_size else ""
    table = Table(title=f"{label} · {s.backend}{' + CUDA graphs' if s.graphs else ''}{paging} · {s.dtype} · "
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
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(s), indent=2) + os.linesep)
    return 0
