"""The ``onetrip`` command.

    onetrip bench ops [--op NAME ...] [--dtype bf16|fp16|fp32] [--out DIR] [--quick]
    onetrip profile TRACE.json[.gz] [--json OUT]
    onetrip env

``bench ops`` times each fused op against eager PyTorch, torch.compile and Liger-Kernel
on a CUDA GPU and writes JSON, CSV and a PNG plot; on a machine without a GPU it checks
onetrip's kernels against their references through Triton's interpreter instead.
``profile`` reads a PyTorch profiler (Kineto) trace and reports the seams between kernels:
kernels per step, idle gaps, launch overhead, element-wise chains, N x N intermediates.
``env`` prints the device, the versions involved, and how kernels will run.
Also runnable as ``python -m onetrip ...``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _build_parser(op_names: tuple[str, ...], dtype_names: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onetrip", description="Fused Triton kernels for transformer inference.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    bench = commands.add_parser("bench", help="run a benchmark suite", description="Run a benchmark suite.")
    suites = bench.add_subparsers(dest="suite", required=True, metavar="SUITE")
    ops = suites.add_parser(
        "ops",
        help="fused ops vs eager, torch.compile and Liger-Kernel, in GB/s",
        description="Time each fused op against its peers under CUDA graphs with a cold L2; report GB/s and "
        "%% of the measured copy bandwidth. Without a GPU, check the kernels through Triton's interpreter.",
    )
    ops.add_argument("--op", action="extend", nargs="+", choices=op_names, metavar="NAME",
                     help=f"ops to run (repeatable; default: all): {', '.join(op_names)}")
    ops.add_argument("--dtype", choices=dtype_names, default="bf16", help="element type (default: bf16)")
    ops.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                     help="folder for the JSON, CSV and PNG results (default: benchmarks/results)")
    ops.add_argument("--quick", action="store_true", help="widths 1K, 4K, 16K, 64K and 256K only")
    ops.set_defaults(func=_bench_ops)

    prof = commands.add_parser(
        "profile", help="report the seams between kernels in a PyTorch profiler trace",
        description="Stream a PyTorch profiler (Kineto / Chrome trace) JSON file, optionally gzipped, and report "
        "kernels per step, idle gaps, launch overhead, element-wise chains, N x N intermediates and casts.")
    prof.add_argument("trace", type=Path, help="trace file (.json or .json.gz)")
    prof.add_argument("--json", type=Path, metavar="OUT", help="also write the report as JSON to OUT")
    prof.set_defaults(func=_profile)

    env = commands.add_parser("env", help="the device, versions, and how kernels will run",
                              description="Print the device, the versions involved, and how kernels will run.")
    env.set_defaults(func=_env)
    return parser


def _bench_ops(args: argparse.Namespace) -> int:
    import torch

    from .bench.ops import DTYPES, run_ops_bench, run_ops_check

    dtype = DTYPES[args.dtype]
    if not torch.cuda.is_available():
        return run_ops_check(args.op, dtype)
    records = run_ops_bench(args.op, dtype, args.out, args.quick)
    failed = [r for r in records if r["provider"] == "onetrip" and (r["ok"] is False or r["error"])]
    return 1 if failed else 0


def _profile(args: argparse.Namespace) -> int:
    from .profile import analyze_trace, render_report

    try:
        report = analyze_trace(args.trace)
    except (OSError, ValueError) as exc:
        print(f"onetrip profile: {exc}", file=sys.stderr)
        return 2
    render_report(report)
    if args.json:
        args.json.write_text(report.to_json())
        print(f"wrote {args.json}")
    return 0


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

    args = _build_parser(OP_NAMES, tuple(DTYPES)).parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
