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
                        [--memory-fraction F]
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

# bench.decode.PROVIDERS, spelled here so that building the parser imports no torch
DECODE_PROVIDERS = ("transformers", "gpt-fast", "onetrip-eager", "onetrip-fused", "onetrip-graphs", "onetrip-paged")
# bench.decode_tp.PROVIDERS
DECODE_TP_PROVIDERS = ("onetrip-tp", "onetrip-tp-nccl", "gptfast-tp")
# bench.serve.PROVIDERS
SERVE_PROVIDERS = ("onetrip", "transformers-cb", "onetrip-static")


def _build_parser(op_names: tuple[str, ...], dtype_names: tuple[str, ...],
                  presets: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onetrip", description="Fused Triton kernels for transformer inference.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    bench = commands.add_parser("bench", help="run a benchmark suite", description="Run a benchmark suite.")
    suites = bench.add_subparsers(dest="suite", required=True, metavar="SUITE")
    ops = suites.add_parser(
        "ops",
        help="fused ops vs eager, torch.compile and Liger-Kernel, in GB/s",
        description="Time each fused op against its peers under CUDA graphs with a cold L2; report GB/s and "
        "% of the measured copy bandwidth. Without a GPU, check the kernels through Triton's interpreter.",
    )
    ops.add_argument("--op", action="extend", nargs="+", choices=op_names, metavar="NAME",
                     help=f"ops to run (repeatable; default: all): {', '.join(op_names)}")
    ops.add_argument("--dtype", choices=dtype_names, default="bf16", help="element type (default: bf16)")
    ops.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                     help="folder for the JSON, CSV and PNG results (default: benchmarks/results)")
    ops.add_argument("--quick", action="store_true", help="widths 1K, 4K, 16K, 64K and 256K only")
    ops.add_argument("--timing", choices=("rotate", "single"), default="rotate",
                     help="rotate (default): a graph of several calls over input copies, time per call; "
                     "single: one call a graph replay, on a clean L2")
    ops.add_argument("--backward", action="store_true",
                     help="time fwd+bwd and the backward alone (GB/s, %% of copy); check gradients")
    ops.set_defaults(func=_bench_ops)

    out_help = "folder for the JSON, CSV and PNG results (default: benchmarks/results)"
    attn = suites.add_parser(
        "attention", help="prefill flash_attention vs SDPA's backends and the naive reference, in TFLOP/s",
        description="Time flash_attention against SDPA (FlashAttention-2, cuDNN, memory-efficient) and the naive "
        "reference at 16K tokens per batch, head dims 64 and 128, seq 512 to 16K, causal and not, plus GQA and "
        "varlen cells; report TFLOP/s, peak extra memory and the max difference from SDPA's output. Without a "
        "GPU, check the kernel through Triton's interpreter.")
    attn.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16", help="element type (default: bf16)")
    attn.add_argument("--out", type=Path, default=Path("benchmarks/results"), help=out_help)
    attn.add_argument("--backward", action="store_true",
                      help="time fwd+bwd and the backward alone (TFLOP/s, backward = 2.5x the forward's FLOPs)")
    attn.add_argument("--quick", action="store_true", help="seq 1K and 8K only, plus the GQA and varlen cells")
    attn.set_defaults(func=_bench_attention)
    dec = suites.add_parser(
        "decode-attention", help="decode_attention and append_kv vs SDPA and eager, in GB/s",
        description="Time decode_attention (contiguous and paged caches, 32/8 heads of 128, bf16) against SDPA "
        "and a naive eager version for batch 1-64 and context 1K-128K, and append_kv against rotary + "
        "index_copy; report GB/s and % of the measured copy bandwidth. Without a GPU, check the kernels "
        "through Triton's interpreter.")
    dec.add_argument("--out", type=Path, default=Path("benchmarks/results"), help=out_help)
    dec.add_argument("--quick", action="store_true", help="3 cells x contiguous and paged-64, 3 append rows")
    dec.set_defaults(func=_bench_decode_attention)
    gemv = suites.add_parser(
        "gemv", help="the decode projections as skinny matmuls: cuBLAS vs onetrip, in GB/s",
        description="Time every projection (qkv, o, gate_up, down, lm_head) of four presets at M = 1, 8, 32 rows "
        "in bf16: F.linear (cuBLAS), optionally torch.compile'd F.linear, and onetrip's skinny_matmul; report GB/s "
        "and % of the measured copy bandwidth. Without a GPU, check skinny_matmul through Triton's interpreter.")
    gemv.add_argument("--compile", action="store_true", help="also time torch.compile(F.linear) (slow to compile)")
    gemv.add_argument("--out", type=Path, default=Path("benchmarks/results"), help=out_help)
    gemv.add_argument("--quick", action="store_true", help="M = 1 only")
    gemv.set_defaults(func=_bench_gemv)
    loss = suites.add_parser(
        "loss", help="cross_entropy and linear_cross_entropy fwd+bwd: time, GB/s or TFLOP/s, peak memory",
        description="Time cross_entropy (vocabularies 32K-262K) and linear_cross_entropy (the LM head and its loss "
        "at three model shapes) forward and backward against eager PyTorch, torch.compile and Liger-Kernel, "
        "with the peak memory of each call. Needs a GPU.")
    loss.add_argument("--out", type=Path, default=Path("benchmarks/results"), help=out_help)
    loss.add_argument("--quick", action="store_true", help="cross_entropy at three vocabularies only")
    loss.set_defaults(func=_bench_loss)
    optim = suites.add_parser(
        "optim", help="one AdamW step over Llama-3.1-8B-shaped parameters, in GB/s",
        description="Time one step of onetrip.optim.AdamW against torch.optim.AdamW (fused=True, foreach=True) "
        "over the parameter shapes of Llama-3.1-8B's embedding, head and first layers. Needs a GPU.")
    optim.add_argument("--layers", type=_positive, default=8, metavar="N",
                       help="decoder layers' parameters to include (default: 8, 2.8 B parameters)")
    optim.add_argument("--out", type=Path, default=Path("benchmarks/results"), help=out_help)
    optim.set_defaults(func=_bench_optim)
    train = suites.add_parser(
        "train", help="a training step of Llama-3.2-1B / Qwen2.5-0.5B shapes: tokens/s, peak memory, largest batch",
        description="Train transformers' Llama-3.2-1B- and Qwen2.5-0.5B-shaped models (random weights, bf16 with "
        "float32 master weights) eager (SDPA), under torch.compile, with Liger-Kernel and with onetrip.patch + "
        "onetrip.optim.AdamW: tokens/s and peak memory at eager's largest batch, each one's largest batch, and the "
        "loss of 20 steps on the same data. Without a GPU, or with --check: check on tiny models on the CPU that "
        "onetrip's patched model trains as transformers' does.")
    train.add_argument("--model", action="extend", nargs="+", choices=("llama-3.2-1b", "qwen2.5-0.5b"),
                       metavar="NAME", help="models (default: both): llama-3.2-1b qwen2.5-0.5b")
    train.add_argument("--provider", action="extend", nargs="+",
                       choices=("torch.compile", "liger", "onetrip", "onetrip-sdpa"),
                       metavar="NAME", help="providers besides eager, which always runs (default: torch.compile "
                       "liger onetrip onetrip-sdpa; onetrip-sdpa: onetrip.patch with attention=False)")
    train.add_argument("--seq", type=_positive, metavar="N", help="sequence length (default 4096)")
    train.add_argument("--budget-s", type=_positive, metavar="S",
                       help="what is not started by S seconds is recorded as skipped (default 540; --quick 240)")
    train.add_argument("--out", type=Path, default=Path("benchmarks/results"), help=out_help)
    train.add_argument("--quick", action="store_true",
                       help="common batch at most 4; the largest batch of eager and onetrip only, 3 steps past "
                       "batch 2; a 240 s budget")
    train.add_argument("--check", action="store_true", help="the CPU check only (tiny models, 3 steps)")
    train.set_defaults(func=_bench_train)
    host = suites.add_parser(
        "host", help="host time of an eager call of each op (tiny tensors), beside torch's ops, in us",
        description="Time 1000 back-to-back eager calls of each op on tiny tensors (the GPU never the limit) and "
        "report the host's time per call, forward and forward + backward, beside torch's own ops. Needs a GPU.")
    host.add_argument("--out", type=Path, default=Path("benchmarks/results"), help=out_help)
    host.set_defaults(func=_bench_host)
    allreduce = suites.add_parser(
        "allreduce", help="the TP all-reduce + residual add + RMSNorm: NCCL, symmetric one-shot, onetrip fused, in us",
        description="Time the all-reduce of a bf16 partial (hidden 8192 and 4096, batch 1-64) followed by the residual "
        "add + RMSNorm: dist.all_reduce then add_rms_norm, torch's symmetric-memory one-shot all-reduce then "
        "add_rms_norm, and onetrip's fused kernel, each as a CUDA graph of 100 calls on all ranks in lock step. "
        "Runs under torchrun; without it, relaunches itself on --world GPUs. Needs 2 or more GPUs.")
    allreduce.add_argument("--world", "--tp", type=_positive, metavar="N", dest="world",
                           help="GPUs (default: all visible; under torchrun: its WORLD_SIZE)")
    allreduce.add_argument("--out", type=Path, default=Path("benchmarks/results"), help=out_help)
    allreduce.add_argument("--quick", action="store_true", help="hidden 8192 at batch 1, 8 and 64 only")
    allreduce.set_defaults(func=_bench_allreduce)
    model = suites.add_parser(
        "decode", help="whole-model decode: transformers, gpt-fast-style compiled, onetrip eager/fused/graphs",
        description="Decode with Llama presets (random weights) at several batch sizes through transformers' "
        "generate, a gpt-fast-style torch.compile(mode='reduce-overhead') decoder and onetrip's eager, fused and "
        "fused + CUDA-graph engine, all on the same weights; report tok/s, % of the bandwidth limit, kernels per "
        "decode step and time to first token. Without a GPU, check on the tiny preset that the providers "
        "generate the same tokens. With --tp N: tensor-parallel over N GPUs (one process each, under torchrun, "
        "started by the command), onetrip's engine with either all-reduce against a gpt-fast-style TP decoder; "
        "tok/s, % of the aggregate bandwidth floor, all-reduce time a layer.")
    model.add_argument("--preset", action="extend", nargs="+", metavar="NAME", choices=presets,
                       help=f"presets (default: llama-3.2-1b llama-3.1-8b; with --tp, llama-3.1-8b): "
                       f"{', '.join(presets)}")
    model.add_argument("--batch", action="extend", nargs="+", type=_positive, metavar="N",
                       help="batch sizes (default: 1 8 32; with --tp, 1 32)")
    model.add_argument("--provider", action="extend", nargs="+", metavar="NAME",
                       choices=(*DECODE_PROVIDERS, *DECODE_TP_PROVIDERS),
                       help=f"providers (default: all six; with --tp all of {', '.join(DECODE_TP_PROVIDERS)})")
    model.add_argument("--new-tokens", type=_positive, metavar="N", help="default 256; 128 with --tp")
    model.add_argument("--prompt-tokens", type=_positive, default=32, metavar="N", help="default 32")
    model.add_argument("--ttft", action="extend", nargs="*", type=_positive, metavar="N",
                       help="prompt lengths for time to first token (default: 512 2048; none to skip)")
    model.add_argument("--out", type=Path, default=Path("benchmarks/results"), help=out_help)
    model.add_argument("--tp", type=_positive, metavar="N",
                       help="tensor parallel over N GPUs (N processes under torchrun; 1: one process, the same "
                       "code, for the TP-N / TP-1 ratio); without a GPU, the --check")
    model.add_argument("--check", action="store_true",
                       help="with --tp N: on the CPU, N gloo processes run onetrip-tp-nccl and gptfast-tp "
                       "(uncompiled) on the tiny preset; both must draw the full model's greedy tokens")
    model.set_defaults(func=_bench_decode)
    load = suites.add_parser(
        "serve", help="continuous batching under load: onetrip's Scheduler, transformers' CB, static batches",
        description="Serve a seeded workload (random prompts, a fixed number of new tokens each, greedy, EOS "
        "ignored) with Llama presets (random weights) through onetrip's continuous-batching Scheduler (in-process, "
        "fused kernels and CUDA graphs), transformers' continuous batching and onetrip's static-batch decode, all on "
        "the same weights; report output tok/s, requests/s, TTFT and inter-token latency p50/p99, the ITL p50 over "
        "the static decode step at the same batch, and the ratios. Without a GPU: the tiny preset for a few steps.")
    load.add_argument("--preset", action="extend", nargs="+", metavar="NAME", choices=presets,
                      help="presets (default: llama-3.2-1b llama-3.1-8b; llama-3.2-1b with --quick; tiny without a "
                      f"GPU): {', '.join(presets)}")
    load.add_argument("--provider", action="extend", nargs="+", metavar="NAME", choices=SERVE_PROVIDERS,
                      help=f"providers (default: all of {', '.join(SERVE_PROVIDERS)})")
    load.add_argument("--requests", type=_positive, metavar="N",
                      help="requests per load point (default 256; 64 with --quick; 8 without a GPU)")
    load.add_argument("--concurrency", action="extend", nargs="+", type=_positive, metavar="C",
                      help="requests in flight, and the engines' batch cap; several give a curve (default 64)")
    load.add_argument("--rate", action="extend", nargs="+", type=float, metavar="R",
                      help="Poisson arrivals at R requests/s instead of all at once (an open loop); several give a "
                      "curve")
    load.add_argument("--prompt-len", nargs=2, type=_positive, metavar=("LO", "HI"),
                      help="prompt lengths, uniform in [LO, HI] tokens (default 64 511)")
    load.add_argument("--output-len", type=_positive, metavar="N",
                      help="new tokens per request (default 256; 128 with --quick)")
    load.add_argument("--seed", type=int, default=0, help="the workload's seed (default 0)")
    load.add_argument("--out", type=Path, default=Path("benchmarks/results"), help=out_help)
    load.add_argument("--quick", action="store_true", help="llama-3.2-1b only, 64 requests of 128 new tokens")
    load.set_defaults(func=_bench_serve)

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


def _checked(parse, ok, expected: str):
    """An argparse ``type``: ``parse(text)``, kept when ``ok`` holds, else an error saying what is ``expected``."""
    def check(text: str):
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return check


# --bandwidth's value: a finite number of GB/s above 0
_gbs = _checked(float, lambda v: 0 < v < float("inf"), "GB/s as a number above 0 (e.g. 3350)")


_positive = _checked(int, lambda v: v >= 1, "an integer >= 1")
_fraction = _checked(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
_port = _checked(int, lambda v: 0 <= v <= 65535, "a port in [0, 65535] (0: any free one)")


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


def _bench_ops(args: argparse.Namespace) -> int:
    import torch

    from .bench.ops import DTYPES, run_ops_bench, run_ops_check

    dtype = DTYPES[args.dtype]
    if args.backward:
        from .bench.backward import run_backward_bench, run_backward_check

        if not torch.cuda.is_available():
            return run_backward_check(args.op, dtype)
        records = run_backward_bench(args.op, dtype, args.out, args.quick)
    elif not torch.cuda.is_available():
        return run_ops_check(args.op, dtype)
    else:
        records = run_ops_bench(args.op, dtype, args.out, args.quick, timing=args.timing)
    failed = [r for r in records if r["provider"] == "onetrip" and (r["ok"] is False or r["error"])]
    return 1 if failed else 0


def _bench_attention(args: argparse.Namespace) -> int:
    import torch

    from .bench.attention import DTYPES, run_attention_bench, run_attention_check

    if not torch.cuda.is_available():
        return run_attention_check(DTYPES[args.dtype])
    if args.backward:
        from .bench.attention_backward import run_attention_backward_bench

        records = run_attention_backward_bench(DTYPES[args.dtype], args.out, args.quick)
        return 1 if any(r["provider"] == "onetrip" and r["error"] for r in records) else 0
    records = run_attention_bench(DTYPES[args.dtype], args.out, args.quick)
    return 1 if any(r["provider"] == "onetrip" and (r["ok"] is False or r["error"]) for r in records) else 0


def _bench_decode_attention(args: argparse.Namespace) -> int:
    import torch

    from .bench.decode_attn import run_decode_bench
    from .bench.decode_check import run_decode_check

    if not torch.cuda.is_available():
        return run_decode_check()
    records = run_decode_bench(args.out, args.quick)
    return 1 if any(r["provider"] == "onetrip" and (r["ok"] is False or r["error"]) for r in records) else 0


def _bench_gemv(args: argparse.Namespace) -> int:
    import torch

    from .bench.gemv import run_gemv_bench, run_gemv_check

    if not torch.cuda.is_available():
        return run_gemv_check()
    records = run_gemv_bench(args.out, args.quick, args.compile)
    return 1 if any(r["provider"] == "onetrip" and (r["ok"] is False or r["error"]) for r in records) else 0


def _needs_gpu(suite: str) -> bool:
    import torch

    if torch.cuda.is_available():
        return False
    print(f"onetrip bench {suite}: needs a CUDA GPU (its correctness is tested by the test suite on the CPU)",
          file=sys.stderr)
    return True


def _bench_loss(args: argparse.Namespace) -> int:
    if _needs_gpu("loss"):
        return 2
    from .bench.loss import run_loss_bench

    records = run_loss_bench(args.out, args.quick)
    return 1 if any(r["provider"].startswith("onetrip") and r["error"] for r in records) else 0


def _bench_optim(args: argparse.Namespace) -> int:
    if _needs_gpu("optim"):
        return 2
    from .bench.optim import run_optim_bench

    records = run_optim_bench(args.out, args.layers)
    return 1 if any(r["provider"] == "onetrip" and r["error"] for r in records) else 0


def _bench_train(args: argparse.Namespace) -> int:
    import torch

    from .bench.train import MODELS, PROVIDERS, run_train_bench
    from .bench.train_check import run_train_check

    models = tuple(args.model or MODELS)
    if args.check or not torch.cuda.is_available():
        return run_train_check(models=models)
    overrides = {k: v for k, v in (("seq", args.seq), ("budget_s", args.budget_s)) if v is not None}
    records = run_train_bench(args.out, args.quick, models=models, providers=tuple(args.provider or PROVIDERS),
                              **overrides)
    return 1 if any(r["provider"] == "onetrip" and r["error"] for r in records) else 0


def _bench_host(args: argparse.Namespace) -> int:
    if _needs_gpu("host"):
        return 2
    from .bench.host import run_host_bench

    records = run_host_bench(args.out)
    return 1 if any(r["error"] for r in records) else 0


def _bench_allreduce(args: argparse.Namespace) -> int:
    if _needs_gpu("allreduce"):
        return 2
    from .bench.allreduce import run_allreduce_bench

    return run_allreduce_bench(args.out, args.world, args.quick)


def _bench_decode(args: argparse.Namespace) -> int:
    import torch

    if args.tp is not None:
        from .bench.decode_tp import main as bench_decode_tp

        return bench_decode_tp(args)
    tp_only = [p for p in args.provider or () if p in DECODE_TP_PROVIDERS]
    if args.check or tp_only:
        print(f"onetrip bench decode: {'--check' if args.check else '--provider ' + ' '.join(tp_only)} goes with "
              f"--tp N", file=sys.stderr)
        return 2
    from .bench.decode import PROVIDERS, bench_decode, check_decode

    if not torch.cuda.is_available():
        return check_decode(new_tokens=args.new_tokens or 12)
    result = bench_decode(args.out, presets=tuple(args.preset or ("llama-3.2-1b", "llama-3.1-8b")),
                          batches=tuple(args.batch or (1, 8, 32)), providers=tuple(args.provider or PROVIDERS),
                          new_tokens=args.new_tokens or 256, prompt=args.prompt_tokens,
                          ttft_prompts=(512, 2048) if args.ttft is None else tuple(args.ttft))
    return 1 if any("error" in r and r["provider"].startswith("onetrip") for r in result["records"]) else 0


def _bench_serve(args: argparse.Namespace) -> int:
    from .bench.serve import main as bench_serve

    return bench_serve(args)


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
