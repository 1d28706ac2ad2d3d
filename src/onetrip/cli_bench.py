"""``onetrip bench SUITE``: the suites' argument parsers (``add_bench``) and the commands that
run them. ``cli.py`` builds the rest of the ``onetrip`` command around them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._argtypes import positive as _positive

# bench.decode.PROVIDERS, spelled here so that building the parser imports no torch
DECODE_PROVIDERS = ("transformers", "gpt-fast", "onetrip-eager", "onetrip-fused", "onetrip-graphs", "onetrip-paged")
# bench.decode_tp.PROVIDERS
DECODE_TP_PROVIDERS = ("onetrip-tp", "onetrip-tp-nccl", "gptfast-tp")
# bench.serve.PROVIDERS
SERVE_PROVIDERS = ("onetrip", "transformers-cb", "onetrip-static")


def add_bench(commands, op_names: tuple[str, ...], dtype_names: tuple[str, ...], presets: tuple[str, ...]) -> None:
    """``onetrip bench`` and its suites, on the ``onetrip`` command's subparsers."""
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
