"""Trace analysis on synthetic Kineto traces: one trace per rule, with exact expected values."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from onetrip.profile import Thresholds, analyze_trace, iter_events, read_trace, render_report
from onetrip.profile import trace as trace_mod
from onetrip.profile.analyze import UNAVAILABLE, UNLINKED
from onetrip.profile.kinds import category_of_name

from profile_traces import (BF16, CAST, EW_ADD, EW_COPY, EW_MUL, FLASH, GEMM, NVJET, REDUCE, RMS, SOFTMAX,
                            TraceBuilder, write_large_trace)

DATA = Path(__file__).parent / "data"
MB = 8 * 128 * 4096 * 2  # one (8, 128, 4096) bf16 tensor: 8 MiB


def gap_trace() -> TraceBuilder:
    """Step 1 holds a known gap pattern (see test_gaps); one kernel is launched after every step."""
    b = TraceBuilder()
    b.step(1, -100, 1100)
    b.launched_kernel(GEMM, -20, 0, 10, launch_dur=5)       # k1 [0, 10]
    b.launched_kernel(GEMM, -10, 5, 6, stream=8)            # overlaps k1 on another stream: union [0, 11]
    b.launched_kernel(GEMM, 0, 12, 10)                      # queued (launch ended at 4): kernel-wait 1
    b.launched_kernel(GEMM, 40, 52, 10, launch_dur=5)       # launch ended at 45 >= 22: host-wait 30
    b.launched_kernel(GEMM, 45, 162, 10)                    # queued, gap 100 > 10: other 100
    b.kernel(GEMM, 180, 10)                                 # launch not in the trace: other 8
    b.kernel("Memcpy DtoD (Device -> Device)", 185, 10, stream=9, cat="gpu_memcpy")
    b.launched_kernel(GEMM, 5000, 5010, 10)                 # outside every step
    return b


def test_gaps(tmp_path):
    r = analyze_trace(gap_trace().write(tmp_path / "gaps.json"), Thresholds(window_us=50.0))
    assert len(r.steps) == 1 and r.unassigned == 1
    s = r.steps[0]
    assert (s.step, s.kernels, s.memcpy, s.gaps) == ("ProfilerStep#1", 6, 1, 4)
    assert s.median_us == 10.0 and s.mean_us == pytest.approx(56 / 6)
    assert s.wall_us == 195.0 and s.busy_us == 56.0 and s.idle_us == 139.0
    assert (s.host_wait_us, s.kernel_wait_us, s.other_wait_us) == (30.0, 1.0, 108.0)
    assert s.launch_overhead_us == 31.0 and s.launch_overhead_share == pytest.approx(31 / 195)
    assert s.busy_fraction == pytest.approx(56 / 195)
    assert s.dashboard_utilization == 0.75  # windows [0,50) [50,100) [150,200) busy, [100,150) idle
    assert r.kernels == 7 and r.memcpy == 1
    assert [(o.op, o.kernels) for o in r.top_ops] == [(UNLINKED, 8)]  # no cpu ops in this trace


def test_step_assignment_follows_the_launch(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.step(2, 100, 100)
    b.launched_kernel(GEMM, 10, 20, 10)
    b.launched_kernel(GEMM, 90, 150, 10)  # launched in step 1, runs during step 2's CPU span
    b.launched_kernel(GEMM, 120, 170, 10)
    r = analyze_trace(b.write(tmp_path / "t.json"))
    assert [(s.step, s.kernels) for s in r.steps] == [("ProfilerStep#1", 2), ("ProfilerStep#2", 1)]


def test_no_steps_is_one_step(tmp_path):
    b = TraceBuilder()
    for i in range(5):
        b.launched_kernel(GEMM, 10 * i, 10 * i + 5, 3)
    r = analyze_trace(b.write(tmp_path / "t.json"))
    assert [(s.step, s.kernels) for s in r.steps] == [("trace", 5)] and r.unassigned == 0


def chain_layer(b: TraceBuilder, t: float) -> None:
    """mm, then add -> rms_norm -> mul -> copy_(bf16 <- fp32) (a chain across four ops), mm,
    then two kernels with no operator (a chain of unknown bytes), then one far away."""
    x = [8, 128, 4096]
    ops = [
        (GEMM, "aten::mm", [[1024, 4096], [4096, 4096]], [BF16, BF16], 0, 20),
        (EW_ADD, "aten::add", [x, x], [BF16, BF16], 22, 8),
        (RMS, "aten::rms_norm", [x, [4096]], [BF16, BF16], 31, 9),
        (EW_MUL, "aten::mul", [x, []], [BF16, "Scalar"], 41, 9),
        (EW_COPY, "aten::copy_", [x, x], ["float", BF16], 51, 9),
        (GEMM, "aten::mm", [[1024, 4096], [4096, 4096]], [BF16, BF16], 61, 29),
    ]
    for name, op, dims, types, ts, dur in ops:
        ext = b.op(op, t + ts - 15, 10, dims, types)
        b.launched_kernel(name, t + ts - 12, t + ts, dur, ext)
    b.launched_kernel(EW_ADD, t + 80, t + 91, 4)
    b.kernel(EW_MUL, t + 96, 4, corr=b.launch(t + 85))
    b.launched_kernel(EW_ADD, t + 90, t + 300, 5)              # 200 µs after the last: not chained
    b.launched_kernel(EW_MUL, t + 20, t + 32, 1, stream=8)     # another stream: does not break the chain


def test_elementwise_chains(tmp_path):
    b = TraceBuilder()
    for i, t in enumerate((0.0, 1000.0)):
        b.step(i, t - 50, 500)
        chain_layer(b, t)
    r = analyze_trace(b.write(tmp_path / "chains.json"))
    assert r.chain_count == 4 and r.chain_saved_bytes is None
    assert len(r.chains) == 2
    known, unknown = sorted(r.chains, key=lambda p: -len(p.names))
    assert known.names == (EW_ADD, RMS, EW_MUL, EW_COPY)
    assert known.ops == ("aten::add", "aten::rms_norm", "aten::mul", "aten::copy_")
    assert known.occurrences == 2 and known.kernel_us == 2 * (8 + 9 + 9 + 9)
    assert known.saved_bytes == 2 * (2 * 3 * MB) and known.saved_launches == 6
    assert known.intermediate_sizes == (MB, MB, MB)  # add's, rms_norm's and mul's outputs
    assert unknown.names == (EW_ADD, EW_MUL) and unknown.ops == (None, None)
    assert unknown.saved_bytes is None and unknown.occurrences == 2 and unknown.intermediate_sizes == (None,)
    assert r.categories == {"gemm": 4, "elementwise": 12, "norm": 2, "cast": 2}


def test_graph_kernels_in_a_chain_have_no_operator(tmp_path):
    b = TraceBuilder()
    corr = b.launch(0, 5, name="cudaGraphLaunch")
    for i in range(3):
        b.kernel(EW_ADD, 10 + 5 * i, 4, corr=corr)
    r = analyze_trace(b.write(tmp_path / "t.json"))
    assert r.chain_count == 1 and r.chains[0].ops == (UNAVAILABLE,) * 3 and r.chains[0].saved_bytes is None


def test_steps_per_device(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.launched_kernel(GEMM, 1, 10, 10)
    b.kernel(GEMM, 12, 30, corr=b.launch(2), device=1)
    b.kernel(GEMM, 50, 30, corr=b.launch(3), device=1)
    r = analyze_trace(b.write(tmp_path / "t.json"))
    assert [(s.device, s.kernels, s.wall_us, s.busy_us) for s in r.steps] == [(0, 1, 10.0, 10.0), (1, 2, 68.0, 60.0)]


def test_step_verdicts(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 1000)
    for i in range(10):                      # 2 µs kernels launched after the last ended
        b.launched_kernel(GEMM, 10 * i, 10 * i + 6, 2)
    b.step(2, 1000, 1000)
    for i in range(10):                      # queued element-wise kernels back to back
        b.launched_kernel(EW_ADD, 1000 + i, 1100 + 101 * i, 100)
    r = analyze_trace(b.write(tmp_path / "t.json"))
    assert [v.kind for v in r.step_verdicts] == ["launch-bound", "memory-bound, missing fusion"]
    assert r.step_verdicts[1].fusible_share == 1.0


def test_chain_gap_threshold(tmp_path):
    b = TraceBuilder()
    for i in range(4):
        b.launched_kernel(EW_ADD, 0, 100 * i, 40)  # gaps of 60 µs
    path = b.write(tmp_path / "t.json")
    assert analyze_trace(path).chain_count == 0
    assert analyze_trace(path, Thresholds(chain_max_gap_us=60.0)).chains[0].saved_launches == 3


def test_square_intermediates(tmp_path):
    b = TraceBuilder()
    q, kt = [2, 8, 512, 64], [2, 8, 64, 512]
    for t in (0, 1000):
        b.op("aten::matmul", t, 50, [q, kt])
        b.op("aten::bmm", t + 5, 40, [[16, 512, 64], [16, 64, 512]])      # inside matmul: not again
        b.op("aten::softmax", t + 60, 20, [[2, 8, 512, 512], [], []], [BF16, "Scalar", ""])
        b.op("aten::_softmax", t + 61, 18, [[2, 8, 512, 512], [], []], [BF16, "Scalar", "Scalar"])
        b.op("aten::matmul", t + 100, 10, [[512, 4096], [4096, 4096]])   # (512, 4096): not square
        b.op("aten::bmm", t + 200, 10, [[4, 32, 32], [4, 32, 32]])       # N = 32 < 64
        b.op("aten::mm", t + 300, 10, [[4096, 4096], [4096, 4096]])      # 2-D weights are not intermediates
    b.op("aten::bmm", 10, 10, [[16, 128, 64], [16, 64, 128]], ["float", "float"], tid=99)
    b.launched_kernel(FLASH, 0, 10, 10)
    r = analyze_trace(b.write(tmp_path / "nxn.json"))
    got = {(s.op, s.shape, s.dtype): (s.occurrences, s.bytes, s.traffic_bytes) for s in r.square_intermediates}
    assert got == {
        ("aten::matmul", (2, 8, 512, 512), BF16): (2, MB, 4 * MB),
        ("aten::softmax", (2, 8, 512, 512), BF16): (2, MB, 4 * MB),
        ("aten::bmm", (16, 128, 128), "float"): (1, 16 * 128 * 128 * 4, 2 * 16 * 128 * 128 * 4),
    }
    assert r.verdict.kind == "memory-bound, missing fusion" and r.verdict.square_intermediates == 5


def test_casts(tmp_path):
    b = TraceBuilder()
    b.launched_kernel(EW_COPY, 0, 10, 5, b.op("aten::copy_", 0, 5, [[64, 64], [64, 64]], ["float", BF16]))
    b.launched_kernel(EW_COPY, 10, 20, 5, b.op("aten::copy_", 10, 5, [[64, 64], [64, 64]], [BF16, BF16]))
    b.launched_kernel(EW_COPY, 20, 30, 7, b.op("aten::_to_copy", 20, 5, [[1024, 1024], [], []], ["float", "", ""]))
    b.launched_kernel(CAST, 30, 40, 2)
    r = analyze_trace(b.write(tmp_path / "casts.json"))
    got = {(c.op, c.from_types): (c.count, c.total_us, c.bytes) for c in r.casts}
    assert got == {
        ("aten::_to_copy", ("float",)): (1, 7.0, 1024 * 1024 * 4),
        ("aten::copy_", ("float", BF16)): (1, 5.0, 64 * 64 * 4),
        (None, None): (1, 2.0, None),
    }
    assert r.categories == {"cast": 3, "elementwise": 1}


def test_graph_replays(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 1000)
    corr = b.launch(10, 8, name="cudaGraphLaunch")
    for i in range(5):
        b.kernel(GEMM if i % 2 == 0 else NVJET, 20 + 6 * i, 5, corr=corr)
    b.kernel(REDUCE, 60, 5, graph_id=3)                      # graph id in args, no launch in the trace
    b.launched_kernel(EW_MUL, 90, 100, 10, b.op("aten::mul", 88, 5))
    r = analyze_trace(b.write(tmp_path / "graphs.json"))
    g = r.graphs
    assert (g.launches, g.kernels, g.kernel_us, g.kernels_per_launch) == (1, 6, 30.0, 6.0)
    assert g.attribution == UNAVAILABLE
    s = r.steps[0]
    assert (s.kernels, s.graph_kernels, s.kernel_wait_us) == (7, 6, 4.0)
    ops = {k.name: k.op for k in r.top_kernels}
    assert ops == {GEMM: UNAVAILABLE, NVJET: UNAVAILABLE, REDUCE: UNAVAILABLE, EW_MUL: "aten::mul"}
    assert {(o.op, o.kernels, o.total_us) for o in r.top_ops} == {(UNAVAILABLE, 6, 30.0), ("aten::mul", 1, 10.0)}


@pytest.mark.parametrize("kind", ["launch-bound", "memory-bound, missing fusion", "neither"])
def test_verdict(tmp_path, kind):
    b = TraceBuilder()
    t = 0.0
    for i in range(20):
        if kind == "launch-bound":     # 2 µs kernels, each launched after the last ended
            b.launched_kernel(GEMM, t, t + 6, 2)
            t += 10
        else:                          # queued 100 µs kernels, 1 µs apart
            b.launched_kernel(GEMM if kind == "neither" else EW_ADD, i, t, 100)
            t += 101
    r = analyze_trace(b.write(tmp_path / "t.json"))
    assert r.verdict.kind == kind
    if kind == "launch-bound":
        assert r.verdict.launch_overhead_share == pytest.approx(19 * 8 / (19 * 10 + 2))
    else:
        assert r.steps[0].kernel_wait_us == 19.0


@pytest.mark.parametrize("name, category", [
    (EW_ADD, "elementwise"), (EW_MUL, "elementwise"), ("triton_poi_fused_add_mul_0", "elementwise"),
    (REDUCE, "norm"), (RMS, "norm"), (SOFTMAX, "norm"), ("triton_per_fused__to_copy_mean_1", "norm"),
    (GEMM, "gemm"), (NVJET, "gemm"), ("ampere_bf16_s16816gemm_bf16_128x64", "gemm"), ("triton_tem_fused_mm_2", "gemm"),
    (FLASH, "attention"), ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention"), (CAST, "cast"),
    ("void at::native::(anonymous namespace)::normal_kernel<float>", "other"), ("my_kernel", "other"),
])
def test_category_table(name, category):
    assert category_of_name(name) == category


def mixed_trace() -> TraceBuilder:
    b = gap_trace()
    chain_layer(b, 2000.0)
    b.step(2, 1950, 500)
    b.kernel(GEMM, 2600, 5, corr=b.launch(2400, name="cudaGraphLaunch"))
    b.kernel("Memset (Device)", 2700, 1, cat="gpu_memset")
    return b


def test_counts_match_the_raw_trace(tmp_path):
    path = mixed_trace().write(tmp_path / "mixed.json")
    raw = json.loads(path.read_text())["traceEvents"]
    r = analyze_trace(path)
    count = lambda cat: sum(1 for e in raw if e.get("cat") == cat)  # noqa: E731
    assert r.events == len(raw)
    assert (r.kernels, r.memcpy, r.memset) == (count("kernel"), count("gpu_memcpy"), count("gpu_memset"))
    assert r.kernel_us == sum(e["dur"] for e in raw if e.get("cat") == "kernel")
    assert sum(s.kernels for s in r.steps) + 1 == r.kernels  # one kernel is launched outside every step
    assert sum(o.kernels for o in r.top_ops) == r.kernels + r.memcpy + r.memset
    assert sum(r.categories.values()) == r.kernels + r.memcpy + r.memset
    assert sum(k.count for k in r.top_kernels) == r.kernels + r.memcpy + r.memset
    t = read_trace(path)
    assert len(t.runtime) == count("cuda_runtime") and len(t.cpu_ops) == count("cpu_op")
    assert [s.name for s in t.steps] == ["ProfilerStep#1", "ProfilerStep#2"]


def test_gzip_and_array_form(tmp_path):
    b = mixed_trace()
    plain = analyze_trace(b.write(tmp_path / "t.json")).to_dict()
    gz = analyze_trace(b.write(tmp_path / "t.json.gz")).to_dict()
    (tmp_path / "a.json").write_text(json.dumps(b.events))
    (tmp_path / "open.json").write_text(json.dumps(b.events)[:-1])  # Chrome's array form may omit the ']'
    arr = analyze_trace(tmp_path / "a.json").to_dict()
    opened = analyze_trace(tmp_path / "open.json").to_dict()
    for d in (plain, gz, arr, opened):
        d.pop("path")
    assert plain == gz
    assert plain["bandwidth"]["device"] == "NVIDIA H100 80GB HBM3"
    assert arr["bandwidth"] == {"device": None, "gbs": None, "source": "unknown"}  # no deviceProperties
    for d in (plain, arr, opened):  # so per-op peak fractions differ
        d.pop("bandwidth")
        d.pop("op_bandwidth")
    assert plain == arr == opened


def test_small_chunks_parse_like_json_load(tmp_path, monkeypatch):
    path = mixed_trace().write(tmp_path / "t.json", indent=1)
    monkeypatch.setattr(trace_mod, "CHUNK_CHARS", 7)  # every value straddles chunk boundaries
    meta: dict = {}
    events = list(iter_events(path, meta))
    whole = json.loads(path.read_text())
    assert events == whole["traceEvents"]
    assert meta == {k: v for k, v in whole.items() if k != "traceEvents"}


def _replace_once(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize("case, message", [
    ("truncated", "truncated file"), ("truncated_gz", "truncated file"), ("unclosed_object", "truncated file"),
    ("invalid", "invalid JSON"), ("no_events", "no 'traceEvents'"), ("empty", "empty file"),
    ("not_json", "expected a JSON object or array"), ("events_not_array", "expected '\\['"),
    ("missing", "no such trace file"), ("double_comma", "invalid JSON"), ("trailing_comma", "invalid JSON"),
    ("missing_comma", "invalid JSON"), ("trailing_garbage", "invalid JSON"), ("extra_data", "after the end"),
])
def test_bad_files_give_clear_errors(tmp_path, case, message):
    text = json.dumps(mixed_trace().to_dict())
    path = tmp_path / f"{case}.json"
    if case == "truncated":
        path.write_text(text[: len(text) // 2])
    elif case == "truncated_gz":
        path = tmp_path / "t.json.gz"
        path.write_bytes(gzip.compress(text.encode())[:300])
    elif case == "unclosed_object":
        path.write_text(text[: text.index("]") + 1])
    elif case == "invalid":
        path.write_text(_replace_once(text, '"ph": "X"', '"ph": X'))
    elif case == "no_events":
        path.write_text('{"schemaVersion": 1, "displayTimeUnit": "ms"}')
    elif case == "empty":
        path.write_text("  \n")
    elif case == "not_json":
        path.write_text("ProfilerStep#1 took 3 ms")
    elif case == "double_comma":
        path.write_text(_replace_once(text, "}, {", "},, {"))
    elif case == "trailing_comma":
        i = text.rindex("}]")  # the end of traceEvents
        path.write_text(text[: i + 1] + "," + text[i + 1:])
    elif case == "missing_comma":
        path.write_text(_replace_once(text, "}, {", "} {"))
    elif case == "trailing_garbage":
        path.write_text(text[:-1] + ", 5}")
    elif case == "extra_data":
        path.write_text(text + "\n" + text)
    elif case == "events_not_array":
        path.write_text('{"traceEvents": 5}')
    with pytest.raises(ValueError, match=message) as info:
        analyze_trace(path)
    assert str(path) in str(info.value)


def test_recorded_data_file():
    """tests/data/profile_eager_layer.json.gz: five steps of an eager layer, from the builder."""
    path = DATA / "profile_eager_layer.json.gz"
    raw = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    r = analyze_trace(path)
    assert r.kernels == sum(1 for e in raw if e.get("cat") == "kernel") == 160
    assert [s.kernels for s in r.steps] == [32] * 5
    assert r.chain_count == 5 * 8 and r.verdict.kind == "launch-bound"


def test_report_renders_and_json_round_trips(tmp_path):
    r = analyze_trace(mixed_trace().write(tmp_path / "t.json"))
    console = render_report(r, Console(record=True, width=200, file=io.StringIO()))
    text = console.export_text()
    assert "Verdict:" in text and "host" in text and "CUDA graphs: 1 launches replayed 1 kernels" in text
    assert "elementwise_kernel[direct_copy_kernel_cuda]" in text  # a kernel name is not rich markup
    back = json.loads(r.to_json())
    assert back["kernels"] == r.kernels and back["verdict"]["kind"] == r.verdict.kind
    assert back["chains"][0]["names"] == list(r.chains[0].names)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_streaming_memory_is_bounded(tmp_path):
    """A ~50 MB trace is analysed in a fresh process whose peak memory grows by less than the
    file's size (json.load alone would need several times it). Its time is printed, not
    judged: on an H100 host under the GPU suite's 12 workers the analysis takes 15.5 s and
    the process, start and imports included, 35 s."""
    path = tmp_path / "large.json"
    kernels = write_large_trace(path, 50_000_000)
    size = path.stat().st_size
    code = (  # VmHWM: peak resident memory of this process image (ru_maxrss would carry pytest's over)
        "import re, sys, time; from onetrip.profile import analyze_trace\n"
        "hwm = lambda: int(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)) * 1024\n"
        "base = hwm(); t = time.perf_counter(); r = analyze_trace(sys.argv[1]); t = time.perf_counter() - t\n"
        "print(r.kernels, hwm() - base, t)\n"
    )
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    n, grown, seconds = out.stdout.split()
    print(f"{size / 1e6:.0f} MB trace: {float(seconds):.1f} s, peak memory +{int(grown) / 1e6:.0f} MB")
    assert int(n) == kernels
    assert int(grown) < 1.5 * size  # measured: +46 MB for 50 MB; json.load needs about +190 MB
    print(f"the process, start and imports included: {time.perf_counter() - start:.1f} s")


ATTENTION_SQUARES = {("aten::matmul", (2, 4, 128, 128), BF16): 2, ("aten::softmax", (2, 4, 128, 128), "float"): 2}


def test_pytorch_recorded_cpu_trace():
    """tests/data/cpu_attention.json.gz, written by PyTorch's profiler (see record_cpu_attention.py):
    the steps, operators and their recorded shapes/dtypes are read as PyTorch writes them."""
    path = DATA / "cpu_attention.json.gz"
    raw = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    t = read_trace(path)
    assert [s.name for s in t.steps] == ["ProfilerStep#1", "ProfilerStep#2"]
    assert len(t.cpu_ops) == sum(1 for e in raw if e.get("cat") == "cpu_op") and t.events == len(raw)
    r = analyze_trace(path)
    assert r.kernels == 0 and r.steps == ()
    assert {(s.op, s.shape, s.dtype): s.occurrences for s in r.square_intermediates} == ATTENTION_SQUARES
    assert r.verdict.kind == "memory-bound, missing fusion"
    text = render_report(r, Console(record=True, width=160, file=io.StringIO())).export_text()
    assert "No GPU kernels in this trace" in text and "From the CPU operators alone" in text
    assert "2x4x128x128" in text


def test_live_pytorch_cpu_trace(tmp_path):
    """The same recording made now, with the installed PyTorch: guards against format drift."""
    sys.path.insert(0, str(DATA))
    try:
        from record_cpu_attention import main as record
    finally:
        sys.path.remove(str(DATA))
    record(str(tmp_path / "live.json.gz"))
    r = analyze_trace(tmp_path / "live.json.gz")
    assert {(s.op, s.shape, s.dtype): s.occurrences for s in r.square_intermediates} == ATTENTION_SQUARES


def test_short_names():
    from onetrip.profile.kinds import short_name
    assert short_name(EW_ADD) == "vectorized_elementwise_kernel[CUDAFunctor_add]"
    assert short_name(REDUCE) == "reduce_kernel[MeanOps]"
    assert short_name(FLASH) == "flash_fwd_kernel"
    assert short_name("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD (Device -> Device)"
