"""The profiler on three real GPU traces: ``onetrip demo`` on an NVIDIA H200, 2026-11-21
(torch 2.11, triton 3.6), Llama-3.2-1B with random weights decoding at batch 1, five
``ProfilerStep#i`` decode steps each (recorded with ``onetrip.profile.run``):

    gpu_demo_eager_h200         eager PyTorch: ~826 kernels a step, ~90% of the step idle
    gpu_demo_fused_h200         onetrip's fused Triton kernels: ~157 kernels a step, still ~96% idle
    gpu_demo_fused_graphs_h200  fused, the whole decode step one CUDA graph: ~157 kernels, ~7% idle

and ``onetrip profile --backend transformers --no-graphs --steps 5`` (same GPU and versions,
transformers 5.17): Hugging Face's own LlamaForCausalLM decoding one token a step.

    gpu_profile_transformers_h200  678 kernels a step, ~96% of the wall time launch overhead

The bounds leave margin: a re-recording on another day should still pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onetrip.cli import main
from onetrip.profile import analyze_trace, diff_reports
from onetrip.profile.analyze import UNAVAILABLE

DATA = Path(__file__).parent / "data"
TRACES = {name: DATA / f"gpu_demo_{name}_h200.json.gz" for name in ("eager", "fused", "fused_graphs")}
TRACES["transformers"] = DATA / "gpu_profile_transformers_h200.json.gz"
STEPS = [f"ProfilerStep#{i}" for i in range(5)]
KERNELS_PER_STEP = {"eager": (700, 1000), "fused": (140, 180), "fused_graphs": (140, 180),
                    "transformers": (550, 850)}


@pytest.fixture(scope="module")
def reports():
    return {name: analyze_trace(path) for name, path in TRACES.items()}


def idle_share(report):
    return sum(s.idle_us for s in report.steps) / sum(s.wall_us for s in report.steps)


@pytest.mark.parametrize("name", TRACES)
def test_steps_and_kernels_per_step(reports, name):
    r = reports[name]
    assert [s.step for s in r.steps] == STEPS and {s.device for s in r.steps} == {0}
    assert r.unassigned == 0  # every kernel was launched inside a step
    lo, hi = KERNELS_PER_STEP[name]
    for s in r.steps:
        assert lo <= s.kernels <= hi, (s.step, s.kernels)
        assert s.graph_kernels == (s.kernels if name == "fused_graphs" else 0), s.step
    assert len({s.kernels for s in r.steps}) == 1  # decode steps are alike
    assert r.bandwidth.device == "NVIDIA H200"


@pytest.mark.parametrize("name", TRACES)
def test_counts_match_the_raw_trace(reports, name):
    """Kernel events counted straight from the JSON (cat "kernel") equal the report's
    count over the steps, and its busy time lies between
    the kernels' summed durations and all device events'."""
    import gzip

    with gzip.open(TRACES[name], "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    r = reports[name]
    assert sum(s.kernels for s in r.steps) == len(kernels)
    # busy = the union of device activity inside the steps: at least the kernels' time, at
    # most every device event's (a few copies fall outside the steps)
    busy = sum(s.busy_us for s in r.steps)
    assert sum(e["dur"] for e in kernels) - 1 <= busy <= sum(e["dur"] for e in device) + 1


def test_verdicts(reports):
    for name in ("eager", "fused", "transformers"):
        r = reports[name]
        assert r.verdict.kind == "launch-bound" and r.verdict.launch_overhead_share > 0.8, name
        assert {v.kind for v in r.step_verdicts} == {"launch-bound"}, name
        assert idle_share(r) > 0.8, name
        # the GPU waits on the CPU: nearly all idle time is host-wait
        assert sum(s.host_wait_us for s in r.steps) > 0.95 * sum(s.idle_us for s in r.steps), name
    g = reports["fused_graphs"]
    assert g.verdict.kind != "launch-bound" and g.verdict.launch_overhead_share < 0.2
    assert "launch-bound" not in {v.kind for v in g.step_verdicts}
    assert idle_share(g) < 0.2 and idle_share(g) < idle_share(reports["eager"]) / 5
    assert sum(s.host_wait_us for s in g.steps) < 0.05 * sum(s.idle_us for s in g.steps)
    # eager has many element-wise chains to fuse; the fused kernels leave almost none
    assert reports["eager"].verdict.fusible_share > 0.2 and reports["fused"].verdict.fusible_share < 0.05
    assert reports["eager"].chain_count > 100 > reports["fused"].chain_count


def test_transformers_chains_named(reports):
    """transformers' decode: launch-bound, and its element-wise chains named by operator.
    The top chain is LlamaRMSNorm written op by op (a residual add, then an upcast, pow,
    mean, add eps, rsqrt, mul, downcast and the weight's mul): nine kernels where one would do."""
    r = reports["transformers"]
    assert r.verdict.kind == "launch-bound" and r.verdict.fusible_share > 0.2
    assert r.chain_count > 100
    top = r.chains[0]
    assert {"aten::pow", "aten::mean", "aten::rsqrt", "aten::mul"} <= set(top.ops)
    assert top.saved_launches == top.occurrences * (len(top.ops) - 1) and top.saved_bytes > 0
    # a residual add then RMSNorm between the layers' blocks: 30 a step in this trace
    assert top.occurrences >= 5 * 2 * 15
    assert r.top_kernels[0].category == "gemm" and r.top_kernels[0].op == "aten::mm"
    assert r.casts, "the bf16 <-> fp32 casts of LlamaRMSNorm"


def test_top_kernels(reports):
    fused = {k.name: k for k in reports["fused"].top_kernels}
    assert {"_skinny_matmul_kernel", "_decode_kernel", "_norm_kernel"} <= set(fused)
    top = reports["fused"].top_kernels[0]
    assert top.name == "_skinny_matmul_kernel" and top.category == "gemm" and top.share > 0.5
    assert fused["_skinny_matmul_kernel"].op == "onetrip::skinny_matmul"
    assert fused["_norm_kernel"].op == "onetrip::norm"
    # the same kernels replayed from the graph: counted, but their operator is not in the trace
    graphs = {k.name: k for k in reports["fused_graphs"].top_kernels}
    assert graphs["_skinny_matmul_kernel"].count == fused["_skinny_matmul_kernel"].count
    assert all(k.op == UNAVAILABLE and k.graph_replays == k.count for k in graphs.values())
    eager = reports["eager"].top_kernels
    assert not any(k.name.startswith("_") and k.name.endswith("_kernel") for k in eager)  # no Triton kernels
    assert eager[0].category == "gemm"


def test_graph_replays(reports):
    g = reports["fused_graphs"].graphs
    assert g.launches == 5 and g.kernels == reports["fused_graphs"].kernels
    assert g.kernels_per_launch == reports["fused_graphs"].steps[0].kernels
    for name in ("eager", "fused"):
        assert reports[name].graphs.launches == 0 and reports[name].graphs.kernels == 0


def test_diff_eager_fused(reports):
    d = diff_reports(reports["eager"], reports["fused"])
    assert d.metric("steps").a == d.metric("steps").b == 5
    k = d.metric("kernels per step")
    assert k.b < k.a and k.ratio < 0.3
    assert d.metric("busy time per step").b < d.metric("busy time per step").a
    assert d.metric("cast time per step").b == 0 < d.metric("cast time per step").a
    assert (d.verdict_a, d.verdict_b) == ("launch-bound", "launch-bound")
    g = diff_reports(reports["fused"], reports["fused_graphs"])
    assert g.metric("median step wall time").ratio < 0.2  # the graph removes the launch gaps
    assert g.metric("kernels per step").delta == 0 and g.metric("graph-replayed kernels").b > 0


@pytest.mark.parametrize("name", TRACES)
def test_cli_profile(tmp_path, capsys, name):
    out = tmp_path / "report.json"
    assert main(["profile", str(TRACES[name]), "--json", str(out)]) == 0
    assert "Verdict:" in capsys.readouterr().out
    d = json.loads(out.read_text())
    assert [s["step"] for s in d["steps"]] == STEPS
    lo, hi = KERNELS_PER_STEP[name]
    assert all(lo <= s["kernels"] <= hi for s in d["steps"])
    assert (d["verdict"]["kind"] == "launch-bound") == (name != "fused_graphs")
    assert d["graphs"]["kernels"] == (d["kernels"] if name == "fused_graphs" else 0)


def test_cli_diff_and_timeline(tmp_path, capsys):
    out = tmp_path / "diff.json"
    assert main(["profile", str(TRACES["eager"]), "--diff", str(TRACES["fused"]), "--json", str(out)]) == 0
    assert "kernels per step" in capsys.readouterr().out
    metrics = {m["metric"]: m for m in json.loads(out.read_text())["metrics"]}
    assert metrics["kernels per step"]["b"] < metrics["kernels per step"]["a"] * 0.3
    png, html = tmp_path / "t.png", tmp_path / "t.html"
    assert main(["profile", str(TRACES["fused_graphs"]), "--png", str(png), "--html", str(html)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and html.stat().st_size > 1000
