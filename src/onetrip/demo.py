"""``onetrip demo``: the seams between kernels, and the same decode without them.

One model, three ways of running its decode step, the same greedy tokens asked of each:

    eager            the decoder op by op, every kernel launched from the host
    fused            onetrip's kernels (residual + norm, RoPE + cache append, split-KV
                     attention, SwiGLU), still launched one by one
    fused + graphs   the whole step (all layers, norm, LM head, sampling) replayed as one
                     CUDA graph: one launch per token

Each is timed (tok/s and % of the bandwidth limit, ``engine.budget``) and profiled
(kernels per step, idle-gap share, verdict, from onetrip's trace analysis); the three
timelines are drawn one above the other into one PNG. Without a GPU the ``tiny`` preset
runs on the CPU (the fused kernels through Triton's interpreter) and the table shows what
the CPU profiler can say: operators per step and the bytes the non-GEMM operators move.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch

from .device import copy_bandwidth_gbs
from .engine.budget import decode_budget
from .engine.generate import Engine, common_prefix
from .models import Model, get_config
from .profile import TraceReport, draw_timelines
from .profile import run as profile_run
from .profile.bandwidth import MATMUL_OUT, op_bytes
from .profile.trace import read_trace

MODES = (("eager", "eager", False), ("fused", "fused", False), ("fused + graphs", "fused", True))

# Under the table: one line per column.
SAME_PREFIX = ("same prefix: greedy tokens equal to eager's before the first difference. Random weights leave the "
               "top logits near ties, so a different rounding (fused kernels, another GEMM split) can flip a pick "
               "after a few tokens in 16-bit; in float32 the modes agree token for token (tests).")
GPU_LEGEND = (
    "tok/s: decode tokens per second, batch 1; % of limit: of the tok/s allowed by reading the weights and the "
    "KV cache once per token at the measured copy bandwidth",
    "kernels / step: GPU kernels per decode step (median of 5 profiled steps); from graphs: of them, those "
    "replayed from a CUDA graph",
    "idle share: of a step's GPU span, the gaps where no kernel runs; verdict: launch-bound, memory-bound "
    "(missing fusion) or neither, as `onetrip profile` decides",
    SAME_PREFIX,
)
CPU_LEGEND = (
    "operators / step: top-level PyTorch operators one decode step calls (on a GPU each launches one kernel or "
    "more); median of 5 profiled steps",
    "non-GEMM bytes / step: bytes the operators other than matrix products read and write, from the recorded "
    "shapes (a lower bound)",
    "tok/s (CPU): decode tokens per second on this CPU",
    SAME_PREFIX,
)


@dataclass(frozen=True)
class ModeResult:
    """One row of the demo's table (None where the device cannot say)."""

    mode: str
    tok_s: float
    ms_per_token: float
    pct_of_limit: Optional[float]
    kernels_per_step: Optional[float]
    graph_kernels_per_step: Optional[float]
    idle_share: Optional[float]
    launch_share: Optional[float]
    verdict: Optional[str]
    ops_per_step: float
    non_gemm_bytes_per_step: Optional[float]
    same_prefix: int  # leading tokens equal to the first mode's (eager)
    trace: str


def _median(xs) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# Operators that only make views or allocate: no kernel, no bytes.
NO_KERNEL = frozenset(f"aten::{n}" for n in (
    "view", "reshape", "_unsafe_view", "split", "split_with_sizes", "chunk", "slice", "select", "narrow", "expand",
    "as_strided", "unsqueeze", "squeeze", "transpose", "permute", "t", "detach", "alias", "unbind", "empty",
    "empty_like", "empty_strided", "resize_", "lift_fresh", "contiguous", "_reshape_alias", "view_as", "expand_as",
    "numpy_T", "result_type", "is_nonzero", "item", "_local_scalar_dense", "to", "clone"))


def cpu_op_stats(trace_path: str | Path) -> tuple[float, Optional[float]]:
    """(median top-level operators per profiler step, median bytes moved per step by those
    that are not matrix products), from the CPU side of a trace. A top-level operator is one
    not nested in another on its thread (what the model code called); views and allocations
    (``NO_KERNEL``) are not counted, and ``aten::to`` / ``clone`` only through the copies
    they run. Ops whose bytes the shapes cannot give (tensor lists) are left out of the
    byte sum, which is therefore a lower bound."""
    trace = read_trace(trace_path)
    counts, nbytes = [], []
    for step in trace.steps:
        end = step.ts + step.dur
        top: dict[int, float] = {}  # tid -> end of the current top-level op
        n, b = 0, 0
        for op in trace.cpu_ops:
            if op.ts < step.ts or op.ts > end or op.name.startswith("ProfilerStep"):
                continue
            if op.ts < top.get(op.tid, -1.0):
                continue  # nested in a counted op
            if op.name in NO_KERNEL:
                continue  # look inside: a to() or clone() that copies counts its copy_
            top[op.tid] = op.ts + op.dur
            n += 1
            if op.name not in MATMUL_OUT and op.name != "aten::linear":
                b += op_bytes(op) or 0
        counts.append(n)
        nbytes.append(b)
    return _median(counts) or 0.0, _median(nbytes)


def run_mode(model: Model, mode: str, backend: str, graphs: bool, prompts: list[list[int]], new_tokens: int,
             out_dir: Path, bandwidth: Optional[float], steps: int = 5) -> tuple[ModeResult, list[list[int]]]:
    model.backend = backend
    engine = Engine(model, max_seq=max(map(len, prompts)) + new_tokens + steps + 8, graphs=graphs)
    engine.generate(prompts, min(4, new_tokens))  # warm-up: kernels compiled, graph captured
    result = engine.generate(prompts, new_tokens)
    trace = out_dir / f"demo-trace-{mode.replace(' + ', '-').replace(' ', '-')}.json"
    report: TraceReport = profile_run(engine.stepper(prompts, steps + 2), steps=steps, warmup=2, trace_path=trace)
    budget = decode_budget(model.config, model.dtype, len(prompts), result.prompt_lens, result.decode_steps, bandwidth)
    gpu = model.device.type == "cuda"
    walls = [s.wall_us for s in report.steps]
    ops, nbytes = cpu_op_stats(trace)
    row = ModeResult(
        mode=mode, tok_s=result.decode_tok_per_s, ms_per_token=result.ms_per_step,
        pct_of_limit=budget.pct_of_limit(result.ms_per_step) if gpu else None,
        kernels_per_step=_median(s.kernels for s in report.steps) if gpu else None,
        graph_kernels_per_step=_median(s.graph_kernels for s in report.steps) if gpu else None,
        idle_share=(_median(s.idle_us / s.wall_us for s in report.steps if s.wall_us) if gpu and walls else None),
        launch_share=_median(s.launch_overhead_share for s in report.steps) if gpu else None,
        verdict=report.verdict.kind if gpu else None, ops_per_step=ops, non_gemm_bytes_per_step=nbytes,
        same_prefix=len(result.tokens[0]), trace=str(trace))
    return row, result.tokens


def run_demo(out_dir: Path = Path("demo"), preset: Optional[str] = None, new_tokens: Optional[int] = None,
             con=None) -> list[ModeResult]:
    """Run the three modes, print the table, draw the timelines; returns the rows."""
    from rich.table import Table

    from .bench.report import console

    con = con or console()
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    preset = preset or ("llama-3.2-1b" if gpu else "tiny")
    new_tokens = new_tokens or (128 if gpu else 16)
    dtype = torch.bfloat16 if gpu else torch.float32
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bandwidth = None
    if gpu:
        bandwidth = copy_bandwidth_gbs(device)
    else:
        con.print(f"[yellow]No CUDA GPU: the {preset} preset on the CPU, fused kernels through Triton's interpreter. "
                  "Timings, kernel counts and idle gaps need a GPU; the CPU profiler shows operators and bytes.[/]")
    model = Model.random(get_config(preset), dtype, device, seed=0)
    prompts = torch.randint(0, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0)).tolist()

    rows, first = [], None
    for mode, backend, graphs in MODES:
        if graphs and not gpu:
            continue
        con.print(f"{mode} ...")
        row, tokens = run_mode(model, mode, backend, graphs, prompts, new_tokens, out_dir, bandwidth)
        first = first or tokens
        rows.append(ModeResult(**{**asdict(row), "same_prefix": common_prefix(tokens[0], first[0])}))

    table = Table(title=f"onetrip demo: {preset}, batch 1, {new_tokens} new tokens, {str(dtype)[6:]}, "
                        f"{torch.cuda.get_device_name() if gpu else 'CPU'}")
    cols = ["mode", "tok/s", "% of limit", "kernels / step", "from graphs", "idle share", "verdict"] if gpu else \
        ["mode", "operators / step", "non-GEMM bytes / step", "tok/s (CPU)"]
    for c in cols + ["same prefix"]:
        table.add_column(c, justify="left" if c in ("mode", "verdict") else "right")
    fmt = lambda x, f: "—" if x is None else format(x, f)  # noqa: E731
    for r in rows:
        cells = [r.mode, f"{r.tok_s:.0f}", fmt(r.pct_of_limit, ".0f") + "%", fmt(r.kernels_per_step, ".0f"),
                 fmt(r.graph_kernels_per_step, ".0f"), fmt(None if r.idle_share is None else 100 * r.idle_share, ".0f")
                 + "%", r.verdict or "—"] if gpu else \
            [r.mode, f"{r.ops_per_step:.0f}", fmt(r.non_gemm_bytes_per_step, ",.0f"), f"{r.tok_s:.1f}"]
        table.add_row(*cells, f"{r.same_prefix}/{new_tokens}")
    con.print(table)
    for line in GPU_LEGEND if gpu else CPU_LEGEND:
        con.print(line, highlight=False)
    if not gpu:
        con.print("[yellow]On a CPU the fused kernels run through Triton's interpreter (Python, one program "
                  "instance at a time), so tok/s here says nothing about speed; the GPU figures are in README.md.[/]")
    summary = out_dir / "demo.json"
    summary.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    wrote = f"wrote {summary} (the table as JSON)"
    if gpu:
        png = draw_timelines([r.trace for r in rows], out_dir / "demo-timelines.png", [r.mode for r in rows],
                             title=f"one decode step of {preset}: eager, fused, fused + CUDA graphs")
        wrote += f", {png} (the three timelines)"
    con.print(wrote, highlight=False)
    con.print(f"traces (open in https://ui.perfetto.dev, or `onetrip profile {rows[0].trace}`): "
              + ", ".join(r.trace for r in rows), highlight=False)
    return rows
