"""``onetrip serve MODEL``: load the model, start the engine thread, run uvicorn until Ctrl-C.

The arguments are those ``cli.py`` parses: model, host, port, dtype, device, max_batch,
served_model_name, warm_up, and the Scheduler's max_seq, prefill_tokens, page_size,
memory_fraction.
The backend is the fused one on a GPU and the eager one on the CPU (where the fused kernels
would run through Triton's interpreter).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from typing import Optional

import torch

from ..engine.scheduler import Scheduler
from .runner import EngineRunner

MISSING_EXTRA = "onetrip serve needs fastapi and uvicorn: pip install 'onetrip[serve]'"


def missing_extra() -> Optional[str]:
    """The message to print when fastapi or uvicorn is not installed, else None."""
    if any(importlib.util.find_spec(name) is None for name in ("fastapi", "uvicorn")):
        return MISSING_EXTRA
    return None


def _warm_up(scheduler: Scheduler) -> None:
    """``Scheduler.warm_up`` under a progress bar on stderr, then its time."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    t0 = time.perf_counter()
    what = "warming up: 2 prefills" + (", every decode bucket's CUDA graph" if scheduler.graphs else "")
    with Progress(TextColumn(f"onetrip serve: {what}"), BarColumn(), MofNCompleteColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("warm-up", total=None)
        captured = scheduler.warm_up(progress=lambda done, total: bar.update(task, completed=done, total=total))
    print(f"onetrip serve: warmed up in {time.perf_counter() - t0:.1f} s ({captured} decode graphs captured)",
          file=sys.stderr)


def run_serve(args) -> int:
    """The body of ``onetrip serve``; returns the exit status."""
    import uvicorn

    from ..engine.commands import DTYPES, load
    from ..models.config import PRESETS
    from .app import create_app

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = DTYPES[args.dtype] if args.dtype else None  # None: the checkpoint's own
    if dtype is None and args.model in PRESETS:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model, tokenizer, label = load(args.model, dtype, device)
    model.backend = "fused" if model.device.type == "cuda" else "eager"
    name = args.served_model_name or label
    scheduler = Scheduler(model, max_batch=args.max_batch, max_seq=args.max_seq, page_size=args.page_size,
                          prefill_tokens=args.prefill_tokens, memory_fraction=args.memory_fraction,
                          eos_ids=tokenizer.eos_ids if tokenizer else ())
    if args.warm_up:
        _warm_up(scheduler)
    runner = EngineRunner(scheduler, tokenizer).start()
    what = "chat and completions" if tokenizer else "completions of token-id prompts (no tokenizer)"
    print(f"onetrip serve: {name} ({what}; context {runner.max_model_len} tokens, batch up to {args.max_batch}, "
          f"{model.backend} backend on {model.device}) at http://{args.host}:{args.port}/v1", file=sys.stderr)
    try:
        # Ctrl-C waits 5 s for open streams, not for their max_tokens (minutes at a few tok/s).
        uvicorn.run(create_app(runner, name), host=args.host, port=args.port, log_level="info",
                    timeout_graceful_shutdown=5)
    finally:
        runner.shutdown()
    return 0
