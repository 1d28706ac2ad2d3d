"""The benchmark suite's pure parts on the CPU: byte counts, shapes, result files, plot, CLI.

The timing itself needs a GPU (tests marked ``gpu``); on the CPU, ``onetrip bench ops``
checks the kernels through Triton's interpreter, which is run end to end here.
"""

import dataclasses
import json
import math

import pytest
import torch

import onetrip.ops
from onetrip.bench import harness, report
from onetrip.bench.cases import (
    CASES, MIN_BYTES, OPS, QUICK_WIDTHS, WIDTHS, RotaryShape, RowShape, rotary_shapes, row_shapes,
)
from onetrip.bench.ops import add_speedup, check_accuracy, run_ops_check
from onetrip.cli import main

from conftest import ON_GPU

FUNCTION = {case.name: "apply_rotary" if case.name == "rotary" else case.name for case in CASES}


def needs_op(name):
    return pytest.mark.skipif(not hasattr(onetrip.ops, FUNCTION[name]), reason=f"onetrip.ops has no {FUNCTION[name]} yet")


# Hand counts, in bytes, for a (4, 8) bf16 problem (2 bytes per element): rows*width = 32.
HAND_BYTES = {
    "bias_gelu": (32 + 8 + 32) * 2,  # read x, bias; write y
    "rms_norm": (32 + 8 + 32) * 2,  # read x, weight; write y
    "add_rms_norm": (32 + 32 + 8 + 32 + 32) * 2,  # read x, residual, weight; write y, h
    "layer_norm": (32 + 8 + 8 + 32) * 2,  # read x, weight, bias; write y
    "add_layer_norm": (32 + 32 + 8 + 8 + 32 + 32) * 2,
    "silu_mul": (64 + 32) * 2,  # read gate_up (4, 16); write y (4, 8)
    "gelu_mul": (64 + 32) * 2,
}
TINY_ROTARY = RotaryShape("t", tokens=4, heads=2, kv_heads=1, head_dim=8, rot_dim=4)
# q 4*2*8 = 64 and k 4*1*8 = 32 elements read and written in bf16; cos, sin 4 x 2 float32 read.
HAND_ROTARY_BYTES = 2 * (64 + 32) * 2 + 2 * 4 * 2 * 4


@pytest.mark.parametrize("name", sorted(HAND_BYTES))
def test_bytes_by_hand(name):
    assert OPS[name].bytes_moved(RowShape(4, 8), torch.bfloat16) == HAND_BYTES[name]
    assert OPS[name].bytes_moved(RowShape(4, 8), torch.float32) == 2 * HAND_BYTES[name]


def test_rotary_bytes_by_hand():
    assert OPS["rotary"].bytes_moved(TINY_ROTARY, torch.bfloat16) == HAND_ROTARY_BYTES


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_bytes_match_the_tensors(name):
    """bytes_moved == bytes of the inputs made + bytes of the reference's outputs."""
    case = OPS[name]
    if not hasattr(onetrip.ops, FUNCTION[name]):
        pytest.skip(f"onetrip.ops has no {FUNCTION[name]} yet")
    shape = TINY_ROTARY if name == "rotary" else RowShape(5, 24)
    inputs = case.make_inputs(shape, torch.bfloat16, torch.device("cpu"), torch.Generator().manual_seed(0))
    out = case.ref()(*inputs)
    outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
    assert case.bytes_moved(shape, torch.bfloat16) == sum(t.nbytes for t in inputs + outs)


def test_shape_lists():
    full, quick = row_shapes(), row_shapes(quick=True)
    sweep = [s for s in full if s.sweep]
    assert [s.width for s in sweep] == list(WIDTHS) == [1024 << k for k in range(9)]
    assert [s.width for s in quick] == list(QUICK_WIDTHS) == [1024, 4096, 16384, 65536, 262144]
    assert all(s.rows * s.width == 1 << 26 for s in sweep + quick)
    assert {(s.rows, s.width) for s in full if not s.sweep} == {(4096, 4096), (64, 262144)}
    assert RowShape(8192, 8192) in full  # the anchors' third norm shape is the sweep's 8K cell
    assert len(set(full)) == len(full)
    for case in CASES:
        for shape in case.shapes(False) + case.shapes(True):
            assert case.bytes_moved(shape, torch.bfloat16) >= MIN_BYTES, (case.name, shape)
    assert {s.name for s in rotary_shapes()} == {"llama-8b", "qwen-0.5b", "partial"}
    assert all(s.rot_dim <= s.head_dim and s.rot_dim % 2 == 0 for s in rotary_shapes())


def test_quantile_slug_labels():
    assert harness.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert harness.quantile([1.0, 2.0], 0.2) == pytest.approx(1.2)
    assert harness.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert [harness.width_label(w) for w in (1024, 262144, 1000)] == ["1K", "256K", "1000"]
    assert harness.gbs(2_000_000_000, 1000.0) == pytest.approx(2.0)


def _fake_records():
    recs = []
    for op, shapes in (("rms_norm", [(4096, 4096, True), (1024, 16384, True), (8192, 8192, False)]),
                       ("rotary", [(4096, None, False)])):
        for rows, width, sweep in shapes:
            label = f"{rows}x{width}" if width else f"llama-8b T={rows}"
            for i, provider in enumerate(("eager", "torch.compile", "liger", "onetrip")):
                ms = 0.1 / (i + 1)
                recs.append({"op": op, "shape": label, "rows": rows, "width": width, "sweep": sweep, "dtype": "bf16",
                             "provider": provider, "median_ms": ms, "bytes": 64 << 20, "gbs": (64 << 20) / 1e6 / ms,
                             "pct_of_copy": 50.0 * (i + 1), "error": None, "ok": True if provider == "onetrip" else None,
                             "max_err": 0.01, "bound": 0.02, "speedup_vs_best_peer": None, "best_peer": None,
                             "graph": True, "max_diff_vs_eager": math.nan if i == 2 else 0.0})
    recs[2]["error"], recs[2]["median_ms"], recs[2]["gbs"] = "RuntimeError: too wide", None, None
    return recs


def test_write_results_round_trip_and_plot(tmp_path):
    recs = _fake_records()
    add_speedup([r for r in recs if r["op"] == "rotary"])
    meta = {"gpu": "Fake GPU", "dtype": "bf16", "date": "2026-11-21T00:00:00+00:00", "copy_gbs": 4000.0}
    json_path, csv_path = harness.write_results(recs, meta, tmp_path / "sub" / "ops-fake-bf16-20261121")
    data = json.loads(json_path.read_text())  # strict JSON: NaN became null
    assert data["meta"] == meta and len(data["results"]) == len(recs)
    assert data["results"][2]["max_diff_vs_eager"] is None and data["results"][0] == recs[0]
    lines = csv_path.read_text().splitlines()
    assert len(lines) == len(recs) + 1 and lines[0].startswith("op,shape,rows,width")
    png = harness.plot_gbs(recs, meta, tmp_path / "plot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_op_table_shows_the_same_bytes_copy():
    recs = [r for r in _fake_records() if r["op"] == "rms_norm"]
    harness.attach_floor([r for r in recs if r["shape"] == "4096x4096"], 3000.0, "size_copy_gbs", "pct_of_size_copy")
    mine = [r for r in recs if r["shape"] == "4096x4096" and r["provider"] == "onetrip"][0]
    assert mine["pct_of_size_copy"] == pytest.approx(100 * mine["gbs"] / 3000.0)
    from rich.console import Console

    con = Console(record=True, width=220)
    report.print_op_table(con, recs, "rms_norm", ["eager", "torch.compile", "liger", "onetrip"])
    text = con.export_text()
    assert "copy, same bytes" in text and f"3000 (onetrip {mine['pct_of_size_copy']:.0f}%)" in text


def test_floors_need_a_gpu():
    from onetrip.bench import floors

    a = torch.zeros(64)
    assert floors.read_gbs([(a, a)], lambda fn: None) is None  # CPU tensors: nothing is timed


def test_speedup_and_summary():
    recs = [r for r in _fake_records() if r["op"] == "rotary"]
    add_speedup(recs)
    onetrip_rec = recs[-1]
    # Fastest peer: liger at 0.1/3 ms; onetrip at 0.1/4 ms.
    assert onetrip_rec["best_peer"] == "liger" and onetrip_rec["speedup_vs_best_peer"] == pytest.approx(4 / 3)
    line = report.summary(recs, {"gpu": "Fake", "dtype": "bf16", "copy_gbs": 4000.0}, "x.json")
    assert line["ops"]["rotary"]["speedup_geomean"] == pytest.approx(4 / 3, abs=1e-3)
    assert line["checks_failed"] == 0 and json.loads(json.dumps(line)) == line


def test_cli_rejects_unknown_op(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "ops", "--op", "softmax"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "softmax" in err and all(name in err for name in OPS)


@pytest.mark.parametrize("argv", [["bench", "ops", "--dtype", "int8"], ["bench"], [], ["bench", "ops", "--oops"]])
def test_cli_argument_errors(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


@pytest.mark.skipif(ON_GPU, reason="on a GPU this would run the timed benchmark")
def test_cli_bench_ops_cpu_end_to_end(capsys):
    assert main(["bench", "ops", "--op", "bias_gelu"]) == 0
    out = capsys.readouterr().out
    assert "bias_gelu" in out and "3x5000" in out and "need a CUDA GPU" in out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary == {"bench": "ops-check", "dtype": "bf16", "checks": len(CASES[0].check_shapes), "failed": 0}


@pytest.mark.parametrize("name", [pytest.param(c.name, marks=needs_op(c.name)) for c in CASES])
def test_check_wiring_per_op(name, capsys):
    """Each case's inputs, reference and onetrip call fit together (float32: no bf16 rounding quirks)."""
    assert run_ops_check([name], torch.float32) == 0, capsys.readouterr().out


def test_check_catches_a_wrong_kernel(monkeypatch, capsys):
    broken = dataclasses.replace(OPS["bias_gelu"], fused=lambda x, bias: torch.zeros_like(x))
    monkeypatch.setattr("onetrip.bench.ops.select", lambda ops: [broken])
    assert run_ops_check(None, torch.bfloat16) == 1
    assert "FAIL" in capsys.readouterr().out


def test_check_accuracy_reports_worst_output():
    case = OPS["bias_gelu"]
    x, bias = case.make_inputs(RowShape(6, 40), torch.float32, torch.device("cpu"), torch.Generator().manual_seed(1))
    ref = case.ref()
    good = check_accuracy(case, ref, (x, bias), (ref(x, bias),), rows=6)
    assert good["ok"] and good["max_err"] <= good["bound"]
    bad = check_accuracy(case, ref, (x, bias), (ref(x, bias) + 1,), rows=6)
    assert not bad["ok"] and "FAIL" in bad["report"]


@pytest.mark.gpu
def test_time_ms_and_copy_on_gpu():
    x = torch.randn(1 << 20, device="cuda")
    t = harness.time_ms(lambda: x * 2, reps=10, warmup=2)
    assert t.graph and 0 < t.p20_ms <= t.median_ms <= t.p80_ms
    assert harness.copy_bandwidth_gbs("cuda", nbytes=64 << 20) > 100
    info = harness.device_info("cuda")
    assert info["sm_count"] > 0 and info["gpu"]


def test_timing_plan_rotates_past_l2():
    """'rotate' cycles >= 2 input copies passing 256 MiB together, >= MIN_CALLS calls a whole
    number of rounds; 'single' is one call; anything else is refused by name."""
    from onetrip.bench.ops import MIN_CALLS, timing_plan

    mib = 2**20
    assert timing_plan(64 * mib, "single") == (1, 1)
    assert timing_plan(64 * mib) == (4, 4)  # 4096 x 4096 bf16 in + out
    assert timing_plan(512 * mib) == (2, 4)  # past the rotation bytes alone: still 2 copies
    assert timing_plan(1) == (16, 16)  # capped
    for nbytes in (1, 3 * mib, 100 * mib, 300 * mib):
        sets, calls = timing_plan(nbytes)
        assert sets >= 2 and calls >= MIN_CALLS and calls % sets == 0
        assert sets * nbytes >= harness.ROTATE_BYTES or sets == 16
    with pytest.raises(ValueError, match="timing must be one of"):
        timing_plan(mib, "cold")


def test_per_call_divides_every_statistic():
    t = harness.per_call(harness.Timing(8.0, 4.0, 12.0, True), 4)
    assert (t.median_ms, t.p20_ms, t.p80_ms, t.graph) == (2.0, 1.0, 3.0, True)
    assert harness.rotation_sets(harness.ROTATE_BYTES) == 1
    assert harness.rotation_sets(harness.ROTATE_BYTES // 3 + 1) == 3
    assert harness.rotation_sets(10, max_sets=5) == 5 and harness.rotation_sets(2**40, min_sets=2) == 2


@pytest.mark.gpu
def test_bench_shape_rotates_inputs_on_gpu():
    """One small shape through every provider with each timing: records carry the plan."""
    from onetrip.bench.cases import OPS
    from onetrip.bench.ops import bench_shape, timing_plan

    case = OPS["rms_norm"]
    shape = case.shapes(True)[0]
    flush = harness.new_flush_buffer()
    for timing in ("rotate", "single"):
        recs = bench_shape(case, shape, torch.bfloat16, case.ref(), 3000.0, flush, timing=timing)
        mine = [r for r in recs if r["provider"] == "onetrip"][0]
        assert mine["ok"] and mine["median_ms"] > 0 and mine["error"] is None
        assert (mine["input_sets"], mine["calls"]) == timing_plan(case.bytes_moved(shape, torch.bfloat16), timing)
        assert mine["size_copy_gbs"] > 0 and mine["pct_of_size_copy"] > 0


def test_prefill_flops_counts_by_hand():
    """The TTFT floor's FLOPs on the tiny config (hidden 64, 2 layers, 4 heads of 16, 2 kv heads,
    intermediate 128, vocab 256) at 10 tokens, counted by hand."""
    from onetrip.bench.floors import prefill_flops
    from onetrip.models import get_config

    qkv, o, mlp = 64 * (4 + 2 * 2) * 16, 4 * 16 * 64, 3 * 64 * 128
    per_layer = 2 * (qkv + o + mlp) * 10 + 2 * 10 * 10 * 16 * 4  # projections; causal QK^T and PV
    assert prefill_flops(get_config("tiny"), 10) == 2 * per_layer + 2 * 256 * 64


@pytest.mark.skipif(ON_GPU, reason="the CPU's check of the cases; the GPU times them (onetrip bench host)")
def test_host_cases_run_on_the_cpu():
    """Every case of ``bench host`` runs (the ops through the interpreter on its tiny tensors)."""
    from onetrip.bench.host import cases

    kinds = {}
    for name, (kind, fn) in cases("cpu").items():
        fn()
        kinds[kind] = kinds.get(kind, 0) + 1
    assert kinds == {"torch": 4, "forward": 12, "step": 1, "fwd+bwd": 5}
