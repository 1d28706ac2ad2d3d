"""The ``onetrip`` command.

    onetrip bench ops [--op NAME ...] [--dtype bf16|fp16|fp32] [--out DIR] [--quick] [--timing rotate|single]
                      [--backward]
    onetrip bench loss [--out DIR] [--quick]
    onetrip bench optim [--layers N] [--out DIR]
    onetrip bench host [--out DIR]
    onetrip bench train [--model NAME ...] [--provider NAME ...] [--seq N] [--budget-s S] [--out DIR] [--quick]
                        [--check]
    onetrip bench allreduce [--world N] [--out DIR] [--quick]    (under torchrun, or relaunched on N GPUs)
    onetrip bench attention [--dtype bf16|fp16] [--out DIR] [--quick] [--backward]
    onetrip bench decode-attention [--out DIR] [--quick]
    onetrip bench gemv [--compile] [--out DIR] [--quick]
    onetrip profile TRACE.json[.gz] [--json OUT] [--bandwidth GBS] [--png OUT.png] [--html OUT.html]
    onetrip profile A.json --diff B.json [--json OUT] [--png OUT.png] [--html OUT.html]
    onetrip bench decode [--preset NAME ...] [--batch N ...] [--provider NAME ...] [--new-tokens N]
                         [--tp N [--check]]
    onetrip bench serve [--preset NAME ...] [--provider NAME ...] [--requests N] [--concurrency C ...] [--rate R ...]
                        [--prompt-len LO HI] [--output-len N] [--seed S] [--out DIR] [--quick]
    onetrip demo [--out DIR] [--preset NAME] [--new-tokens N]
    onetrip profile --model PATH|PRESET [--backend eager|fused|transformers] [--no-graphs] [--steps N] [--png OUT.png]
    onetrip generate --model PATH|PRESET [--prompt TEXT | --prompt-tokens N] [--max-new-tokens N]
                     [--batch N] [--backend eager|fused] [--no-graphs] [--paged [--page-size N]]
                     [--chat] [--json OUT] [--tp N]
    onetrip serve MODEL [--host 127.0.0.1] [--port 8000] [--dtype bf16|fp16|fp32] [--device DEV] [--max-batch 64]
                        [--served-model-name NAME] [--max-seq N] [--prefill-tokens N] [--page-size N]
                        [--memory-fraction F] [--no-warm-up]
    onetrip env

``bench ops`` times each fused op against eager PyTorch, torch.compile and Liger-Kernel
on a CUDA GPU and writes JSON, CSV and a PNG plot; on a machine without a GPU it checks
onetrip's kernels against their references through Triton's interpreter instead. With
``--backward`` it times fwd+bwd and the backward alone, and checks gradients.
``bench loss`` times cross_entropy and linear_cross_entropy (fwd+bwd, peak memory) against
eager PyTorch, torch.compile and Liger-Kernel; ``bench optim`` one AdamW step over a
Llama-3.1-8B-shaped parameter list against torch's fused and foreach AdamW; ``bench host``
the host (CPU) time of an eager call of each op, forward and forward + backward, beside
torch's own ops.
``bench train`` trains transformers' Llama-3.2-1B- and Qwen2.5-0.5B-shaped models eager, under
torch.compile, with Liger-Kernel and with onetrip.patch: tokens/s, peak memory, the largest batch
and the loss of 20 steps, with a PNG of loss and memory; without a GPU it checks on tiny models
that onetrip's patched model trains as transformers' does.
``bench attention`` reports prefill attention in TFLOP/s against SDPA's FlashAttention-2,
cuDNN and memory-efficient backends and the naive reference; ``bench decode-attention``
reports decode attention (contiguous and paged caches) and append_kv in GB/s and % of the
copy bandwidth against SDPA and naive eager versions. Both write JSON, CSV and a PNG, and
without a GPU check their kernels through the interpreter like ``bench ops``.
``bench serve`` loads the continuous-batching Scheduler with a seeded workload (random prompts of
64-511 tokens, 256 new tokens each, C requests in flight or Poisson arrivals) and reports output
tok/s, requests/s, TTFT and inter-token latency p50/p99 against transformers' continuous batching
and onetrip's static-batch decode on the same weights, with JSON, CSV and a PNG over several loads;
without a GPU it runs the tiny preset for a few steps (a smoke run).
``profile`` reads a PyTorch profiler (Kineto) trace and reports the seams between kernels:
kernels per step, idle gaps, launch overhead, element-wise chains, N x N intermediates,
and per operator the achieved GB/s as a % of ``--bandwidth GBS`` (default: the nominal
datasheet peak of the GPU named in the trace). ``--png`` / ``--html`` also draw the kernels
on a timeline (a PNG; a self-contained HTML page with hover details). ``--diff B.json``
compares the trace (A) with B instead: kernels per step, step time, idle and launch-overhead
shares, GPU time per kernel category, chains and verdicts of both, with B - A and B / A;
then ``--json`` writes the comparison, and ``--png`` / ``--html`` draw A above B. A trace
without GPU kernels (a CPU-only recording) gets what its operators show and a note on how
to record a CUDA trace; its timeline is not drawn (exit 1). An empty trace is an error (exit 2).
``generate`` runs the decode engine on a checkpoint directory or a preset with random
weights and reports prefill ms, decode tok/s, kernels per decode step and the achieved
bandwidth as a % of the device's copy bandwidth; ``--tp N`` splits the model over N GPUs
(tensor parallel), the command relaunching itself under torchrun.
``serve`` runs an OpenAI-compatible HTTP server (``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``) over the continuous-batching scheduler (docs/serving-http.md); it needs the
``serve`` extra (fastapi, uvicorn).
``env`` prints the device, the versions involved, and how kernels will run.
Also runnable as ``python -m onetrip ...``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ._argtypes import fraction as _fraction, gbs as _gbs, port as _port, positive as _positive
from .cli_bench import add_bench


def _build_parser(op_names: tuple[str, ...], dtype_names: tuple[str, ...],
                  presets: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onetrip", description="Fused Triton kernels for transformer inference.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_bench(commands, op_names, dtype_names, presets)

    prof = commands.add_parser(
        "profile", help="report the seams between kernels in a PyTorch profiler trace",
        description="Stream a PyTorch profiler (Kineto / Chrome trace) JSON file, optionally gzipped, and report "
        "kernels per step, idle gaps, launch overhead, element-wise chains, N x N intermediates, casts and "
        "achieved bandwidth per operator; or compare two traces (--diff); optionally draw the timeline.")
    prof.add_argument("trace", type=Path, nargs="?", help="trace file (.json or .json.gz)")
    prof.add_argument("--model", metavar="PATH|PRESET",
                      help="instead of a trace: profile decode steps of the engine on this checkpoint directory "
                      f"or preset ({', '.join(presets)})")
    prof.add_argument("--backend", choices=("eager", "fused", "transformers"), default="fused",
                      help="with --model (default fused); transformers: the same weights run by HF transformers "
                           "with its dynamic cache")
    prof.add_argument("--no-graphs", action="store_true", help="with --model: no CUDA graph for the decode step")
    prof.add_argument("--steps", type=_positive, default=5, metavar="N", help="with --model: steps (default 5)")
    prof.add_argument("--batch", type=_positive, default=1, metavar="N", help="with --model: batch (default 1)")
    prof.add_argument("--trace-out", type=Path, metavar="OUT.json",
                      help="with --model: keep the recorded trace here (default: profile-<model>.json)")
    prof.add_argument("--json", type=Path, metavar="OUT",
                      help="also write the report (with --diff: the comparison) as JSON to OUT")
    prof.add_argument("--diff", type=Path, metavar="B",
                      help="compare TRACE (A) with the trace B instead of reporting TRACE alone")
    prof.add_argument("--bandwidth", type=_gbs, metavar="GBS",
                      help="device bandwidth in GB/s that per-operator achieved bandwidth is compared with "
                      "(default: the nominal datasheet peak of the GPU named in the trace)")
    prof.add_argument("--png", type=Path, metavar="OUT.png", help="draw the kernel timeline to a PNG")
    prof.add_argument("--html", type=Path, metavar="OUT.html",
                      help="write the kernel timeline as a self-contained HTML page (hover for details)")
    prof.set_defaults(func=_profile)

    demo = commands.add_parser(
        "demo", help="the main job: decode eager, fused, fused + CUDA graphs; profile each, side by side",
        description="Generate the same tokens with the default preset three ways (eager, fused kernels, fused "
        "kernels + one CUDA graph per token), profile each, and print one table (tok/s, % of the bandwidth "
        "limit, kernels per step, idle share, verdict) with the three timelines in one PNG. Without a GPU: "
        "the tiny preset on the CPU, operators and bytes per step from the CPU profiler.")
    demo.add_argument("--out", type=Path, default=Path("demo"), help="folder for traces, PNG, JSON (default demo/)")
    demo.add_argument("--preset", choices=presets, metavar="NAME",
                      help=f"default: llama-3.2-1b on a GPU, tiny on a CPU; one of {', '.join(presets)}")
    demo.add_argument("--new-tokens", type=_positive, metavar="N", help="default: 128 on a GPU, 16 on a CPU")
    demo.set_defaults(func=_demo)

    gen = commands.add_parser(
        "generate", help="generate tokens with the decode engine and report tok/s and bandwidth",
        description="Generate with a Llama/Qwen checkpoint directory or a preset (random weights), then report "
        "prefill time, decode tok/s, kernels per decode step and the achieved bandwidth against the copy "
        "bandwidth of the device.")
    gen.add_argument("--model", required=True, metavar="PATH|PRESET",
                     help=f"Hugging Face model directory (with config.json), or a preset (random weights): "
                     f"{', '.join(presets)}")
    what = gen.add_mutually_exclusive_group()
    what.add_argument("--prompt", metavar="TEXT", help="prompt text (needs the directory's tokenizer)")
    what.add_argument("--prompt-tokens", type=_positive, metavar="N", help="N random prompt tokens (default 32)")
    gen.add_argument("--max-new-tokens", type=_positive, default=128, metavar="N", help="default 128")
    gen.add_argument("--batch", type=_positive, default=1, metavar="N", help="sequences at once (default 1)")
    gen.add_argument("--backend", choices=("eager", "fused"), default="fused", help="default fused")
    gen.add_argument("--no-graphs", action="store_true", help="launch every kernel of a decode step from the host")
    gen.add_argument("--paged", action="store_true",
                     help="a paged KV cache: each sequence holds only the pages its prompt and new tokens need")
    gen.add_argument("--page-size", type=_positive, metavar="N", help="tokens per page with --paged (default 64)")
    gen.add_argument("--chat", action="store_true", help="wrap --prompt in the model's chat template")
    gen.add_argument("--dtype", choices=("bf16", "fp16", "fp32"),
                     help="default: the checkpoint's, or bf16 on a GPU / fp32 on a CPU for presets")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="0 = off")
    gen.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed, and the preset's random weights")
    gen.add_argument("--quiet", action="store_true", help="print only the summary")
    gen.add_argument("--json", type=Path, metavar="OUT", help="also write the summary as JSON to OUT")
    gen.add_argument("--tp", type=_positive, default=1, metavar="N",
                     help="tensor parallel over N GPUs (default 1): relaunches itself in N processes under torchrun")
    gen.set_defaults(func=_generate)

    serve = commands.add_parser(
        "serve", help="an OpenAI-compatible HTTP server over the continuous-batching scheduler",
        description="Serve a model over HTTP with OpenAI's API: POST /v1/chat/completions and /v1/completions "
        "(streaming or not), GET /v1/models. Requests run together in the continuous-batching scheduler. The "
        "fused backend on a GPU, the eager one on the CPU. Needs fastapi and uvicorn: pip install 'onetrip[serve]'.")
    serve.add_argument("model", metavar="MODEL",
                       help=f"Hugging Face model directory (with config.json), Hub id (org/name), or a preset "
                       f"(random weights, no tokenizer: token-id prompts only): {', '.join(presets)}")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8000, help="default 8000")
    serve.add_argument("--dtype", choices=("bf16", "fp16", "fp32"),
                       help="default: the checkpoint's, or bf16 on a GPU / fp32 on a CPU for presets")
    serve.add_argument("--device", help="default: cuda when there is a GPU, else cpu")
    serve.add_argument("--max-batch", type=_positive, default=64, metavar="N",
                       help="sequences decoded together at most (default 64)")
    serve.add_argument("--served-model-name", metavar="NAME",
                       help="the name clients pass as 'model' (default: the directory's, repository's or "
                       "preset's name)")
    serve.add_argument("--max-seq", type=_positive, metavar="N",
                       help="context length a request may reach, prompt + output (default: the model's)")
    serve.add_argument("--prefill-tokens", type=_positive, default=4096, metavar="N",
                       help="padded prompt tokens prefilled in one step, over all requests (default 4096): more "
                       "fills the batch sooner, less stalls the running streams less")
    serve.add_argument("--page-size", type=_positive, default=64, metavar="N",
                       help="tokens a KV-cache page holds (default 64)")
    serve.add_argument("--memory-fraction", type=_fraction, default=0.9, metavar="F",
                       help="share of the GPU's free memory the KV-cache pool takes (default 0.9)")
    serve.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                       help="skip the start-up warm-up (two prefills and every decode bucket's CUDA graph): "
                       "the first requests then pay Triton's compiles and the captures")
    serve.set_defaults(func=_serve)

    env = commands.add_parser("env", help="the device, versions, and how kernels will run",
                              description="Print the device, the versions involved, and how kernels will run.")
    env.set_defaults(func=_env)
    return parser




def _serve(args: argparse.Namespace) -> int:
    from .serve.command import missing_extra, run_serve

    missing = missing_extra()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    try:
        return run_serve(args)
    except (OSError, ValueError) as exc:  # a bad MODEL, --dtype for its weights, a port in use, ...
        print(f"onetrip serve: {exc}", file=sys.stderr)
        return 2


def _generate(args: argparse.Namespace) -> int:
    from .bench.report import console
    from .engine.commands import run_generate
    from .engine.launch import needs_relaunch, relaunch_under_torchrun

    if needs_relaunch(args.tp):  # one process a GPU, this command in each (NVLink multicast off)
        return relaunch_under_torchrun(args.tp, args.argv)
    try:
        return run_generate(args, console())
    except (OSError, ValueError) as exc:  # a bad --model, --prompt without a tokenizer, ...
        print(f"onetrip generate: {exc}", file=sys.stderr)
        return 2


def _profile(args: argparse.Namespace) -> int:
    from .profile import (TraceIndex, analyze_index, diff_reports, draw_timelines, read_trace, render_diff,
                          render_report, write_html_timeline)
    from .bench.report import console
    from .profile.report import hints

    if (args.trace is None) == (args.model is None):
        print("onetrip profile: give a TRACE file or --model PATH|PRESET (one of the two)", file=sys.stderr)
        return 2
    if args.model is not None:
        try:
            args.trace = _record_model_trace(args)
        except (OSError, ValueError) as exc:
            print(f"onetrip profile: {exc}", file=sys.stderr)
            return 2
        print(f"trace: {args.trace}")
    paths = [args.trace] + ([args.diff] if args.diff else [])
    try:
        indexes = [TraceIndex(read_trace(p)) for p in paths]
        reports = [analyze_index(index, bandwidth_gbs=args.bandwidth) for index in indexes]
    except (OSError, ValueError) as exc:
        print(f"onetrip profile: {exc}", file=sys.stderr)
        return 2
    if args.diff:
        result = diff_reports(*reports)
        render_diff(result, console())
        for tag, report in zip("AB", reports):
            for line in hints(report):
                print(f"{tag}: {line}")
    else:
        result = reports[0]
        render_report(result, console())
    if args.json:
        args.json.write_text(result.to_json())
        print(f"wrote {args.json}")
    labels = [f"{tag}{p.name}" for tag, p in zip(("A: ", "B: ") if args.diff else ("",), paths)]
    status = 0
    for flag, out, draw in (("--png", args.png, draw_timelines), ("--html", args.html, write_html_timeline)):
        if out is None:
            continue
        bare = [str(p) for p, report in zip(paths, reports) if not report.gpu_activities]
        if bare:  # the timeline draws GPU kernels per stream; a CPU-only trace has none
            print(f"onetrip profile: {flag} {out} not written: no GPU kernels to draw in {', '.join(bare)} "
                  "(the timeline needs a CUDA trace; see the note above)", file=sys.stderr)
            status = 1
            continue
        try:
            draw(indexes, out, labels=labels)
        except (OSError, ValueError) as exc:
            print(f"onetrip profile: {flag} {out} not written: {exc}", file=sys.stderr)
            status = 1
            continue
        print(f"wrote {out}")
    return status


def _record_model_trace(args: argparse.Namespace) -> Path:
    """Profile ``args.steps`` decode steps of the engine on ``args.model``; the trace's path."""
    import torch

    from .engine.commands import check_model, cpu_warning, load
    from .engine.generate import Engine
    from .profile import run as profile_run

    device = "cuda" if torch.cuda.is_available() else "cpu"
    check_model(args.model)
    if device == "cpu" and args.model != "tiny":
        print(cpu_warning(args.model, "fused" if args.backend == "fused" else "eager"), file=sys.stderr)
    model, _, label = load(args.model, torch.bfloat16 if device == "cuda" else torch.float32, device)
    prompts = torch.randint(0, model.config.vocab_size, (args.batch, 32),
                            generator=torch.Generator().manual_seed(0)).tolist()
    if args.backend == "transformers":  # HF's own decode loop on the same weights (views, no copy)
        from .models.hf import decode_stepper, to_transformers

        step = decode_stepper(to_transformers(model), torch.tensor(prompts, device=device))
        step()  # the prefill, outside the profiled steps
        out = args.trace_out or Path(f"profile-{label}-transformers.json")
        profile_run(step, steps=args.steps, warmup=2, trace_path=out)
        return out
    model.backend = args.backend
    engine = Engine(model, max_seq=32 + args.steps + 16, max_batch=args.batch, graphs=not args.no_graphs)
    out = args.trace_out or Path(f"profile-{label}-{args.backend}{'-graphs' if engine.graphs else ''}.json")
    profile_run(engine.stepper(prompts, args.steps + 4), steps=args.steps, warmup=2, trace_path=out)
    return out


def _demo(args: argparse.Namespace) -> int:
    import torch

    from .demo import run_demo

    rows = run_demo(args.out, args.preset, args.new_tokens)
    if torch.cuda.is_available():  # bf16 on random weights: near ties may flip (see the note)
        return 0
    # float32 on the CPU: every mode must give eager's tokens
    return 0 if all(r.same_prefix == rows[0].same_prefix for r in rows) else 1


def kernel_mode() -> str:
    """How onetrip's kernels run in this process: compiled for the GPU, interpreted, or not at all."""
    import torch

    from .ops._common import is_interpreting

    if is_interpreting():
        return "through Triton's interpreter (TRITON_INTERPRET=1): correct but slow, for checking only"
    if torch.cuda.is_available():
        return f"compiled by Triton for {torch.cuda.get_device_name()}"
    return "not at all: no GPU and TRITON_INTERPRET is off, so each op runs its PyTorch reference"


def _env(args: argparse.Namespace) -> int:
    import torch
    from rich.table import Table

    from .bench.harness import device_info
    from .bench.report import console

    con = console()
    table = Table(title="onetrip env", title_justify="left", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    info = device_info("cuda" if torch.cuda.is_available() else "cpu")
    for key, value in info.items():
        table.add_row(key, "—" if value is None else str(value))
    table.add_row("kernels", kernel_mode())
    con.print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``onetrip`` console script; returns the exit status."""
    # Before anything defines a kernel: without a GPU, kernels can only run interpreted.
    # onetrip's ops are imported lazily so that this line comes first.
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from .bench.ops import DTYPES, OP_NAMES
    from .models.config import PRESETS

    args = _build_parser(OP_NAMES, tuple(DTYPES), tuple(PRESETS)).parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # generate --tp relaunches itself with them
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
