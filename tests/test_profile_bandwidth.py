"""Achieved bandwidth per operator: the byte model, the peak table, and the report's rows."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from onetrip.profile import analyze_trace, op_bytes, render_report
from onetrip.profile.bandwidth import datasheet_bandwidth
from onetrip.profile.timeline import UNAVAILABLE, UNLINKED
from onetrip.profile.trace import CpuOp

from profile_traces import BF16, EW_ADD, EW_MUL, GEMM, TraceBuilder

MiB = 1 << 20


def cpu_op(name: str, dims, types) -> CpuOp:
    tup = lambda x: tuple(tup(v) for v in x) if isinstance(x, list) else x  # noqa: E731
    return CpuOp(name, 1, 0.0, 1.0, 1, tup(dims), tup(types))


@pytest.mark.parametrize("name, dims, types, expected", [
    ("aten::add", [[1024, 1024], [1024, 1024]], ["float", "float"], 12 * MiB),          # 2 reads + 1 write
    ("aten::add", [[1024, 4096], [4096]], [BF16, BF16], 2 * 8 * MiB + 8192),            # broadcast bias
    ("aten::mul", [[17, 111], []], ["float", "Scalar"], 2 * 17 * 111 * 4),
    ("aten::add_", [[64, 64], [64, 64]], ["float", "float"], 3 * 64 * 64 * 4),          # self read and written
    ("aten::copy_", [[64, 64], [64, 64], []], [BF16, "float", "Scalar"], 64 * 64 * 6),  # dst written, src read
    ("aten::fill_", [[1000], []], ["float", "Scalar"], 4000),
    ("aten::mm", [[512, 1024], [1024, 256]], [BF16, BF16], 2 * (512 * 1024 + 1024 * 256 + 512 * 256)),
    ("aten::bmm", [[8, 128, 32], [8, 32, 128]], [BF16, BF16], 2 * (2 * 8 * 128 * 32 + 8 * 128 * 128)),
    ("aten::addmm", [[256], [512, 1024], [1024, 256]], ["float"] * 3, 4 * (256 + 512 * 1024 + 1024 * 256 + 512 * 256)),
    ("aten::linear", [[8, 4096], [11008, 4096], [11008]], [BF16] * 3,
     2 * (8 * 4096 + 11008 * 4096 + 11008 + 8 * 11008)),
    ("aten::scaled_dot_product_attention", [[1, 8, 1, 128], [1, 8, 1000, 128], [1, 8, 1000, 128], []],
     [BF16, BF16, BF16, ""], 2 * (2 * 8 * 128 + 2 * 8 * 1000 * 128)),                      # decode: q-sized output
    ("aten::sum", [[], []], ["float", "Scalar"], 8),                                       # 0-dim tensor: 4 bytes
    ("aten::cat", [[[2, 3], [2, 3]], []], ["TensorList", "Scalar"], None),                 # list sizes unknown
    ("aten::add", [[4, 4], [4, 4]], ["c10::Float4_e2m1fn_x2", "float"], None),             # unknown dtype
    ("aten::empty", [[], []], ["ScalarList", ""], None),                                    # no tensor input
    ("aten::add", None, None, None),                                                        # shapes not recorded
])
def test_op_bytes(name, dims, types, expected):
    assert op_bytes(cpu_op(name, dims, types)) == expected


@pytest.mark.parametrize("device, row, gbs", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 3350.0), ("NVIDIA H100 PCIe", "H100 PCIe", 2000.0),
    ("NVIDIA H100 NVL", "H100 NVL", 3900.0), ("NVIDIA H200", "H200", 4800.0),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 2039.0), ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1935.0),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB", 1555.0), ("NVIDIA L4", "L4", 300.0),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", 1008.0), ("NVIDIA L40S", None, None), (None, None, None),
])
def test_datasheet_table(device, row, gbs):
    assert datasheet_bandwidth(device) == (None if row is None else (row, gbs))


def bandwidth_trace(device_name: str | None = "NVIDIA H100 80GB HBM3") -> TraceBuilder:
    """Two adds of (1024, 1024) fp32 at 10 µs each (12 MiB per call: 1258.29 GB/s), one add
    of 8 MiB bf16 + bias at 2 µs (above any peak), a graph replay and an unlinked kernel."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    for t in (0, 100):
        ext = b.op("aten::add", t, 5, [[1024, 1024], [1024, 1024]], ["float", "float"])
        b.launched_kernel(EW_ADD, t + 1, t + 10, 10, ext)
    ext = b.op("aten::add", 200, 5, [[1024, 4096], [4096]], [BF16, BF16])
    b.launched_kernel(EW_ADD, 201, 210, 2, ext)
    b.kernel(GEMM, 300, 7, corr=b.launch(290, name="cudaGraphLaunch"))
    b.launched_kernel(EW_MUL, 400, 410, 3)
    if device_name is None:
        b.to_dict = lambda: {"traceEvents": b.events}  # no deviceProperties
    return b


def test_achieved_bandwidth(tmp_path):
    r = analyze_trace(bandwidth_trace().write(tmp_path / "bw.json"))
    assert (r.bandwidth.device, r.bandwidth.gbs, r.bandwidth.source) == ("NVIDIA H100 80GB HBM3", 3350.0,
                                                                          "datasheet: H100 SXM")
    rows = {(o.op, o.input_dims): o for o in r.op_bandwidth}
    add = rows[("aten::add", ((1024, 1024), (1024, 1024)))]
    assert (add.calls, add.kernels, add.gpu_us, add.category) == (2, 2, 20.0, "elementwise")
    assert add.bytes_per_call == 12 * MiB and add.bytes == 24 * MiB
    assert add.achieved_gbs == pytest.approx(24 * MiB / 20e-6 / 1e9) == pytest.approx(1258.2912)
    assert add.peak_fraction == pytest.approx(1258.2912 / 3350) and not add.unreliable and add.attributed
    fast = rows[("aten::add", ((1024, 4096), (4096,)))]
    assert fast.bytes == 2 * 8 * MiB + 8192 and fast.achieved_gbs == pytest.approx((16 * MiB + 8192) / 2e3)
    assert fast.peak_fraction > 1 and fast.unreliable
    graph, unlinked = rows[(UNAVAILABLE, None)], rows[(UNLINKED, None)]
    for row, us in ((graph, 7.0), (unlinked, 3.0)):
        assert (row.gpu_us, row.calls, row.bytes, row.achieved_gbs, row.attributed) == (us, 0, None, None, False)
    assert [o.gpu_us for o in r.op_bandwidth] == [20.0, 7.0, 3.0, 2.0]  # most GPU time first
    text = render_report(r, Console(record=True, width=220, file=io.StringIO())).export_text()
    assert "Achieved bandwidth per operator (% of 3350 GB/s, the H100 SXM's nominal datasheet peak)" in text
    assert "1024x1024 f32, 1024x1024 f32" in text and "38% " in text  # 1258 / 3350
    assert "251% !" in text and "n/a (graph)" in text  # 8393 / 3350


def test_bandwidth_argument_and_unknown_device(tmp_path):
    path = bandwidth_trace(None).write(tmp_path / "bw.json")
    r = analyze_trace(path)
    assert (r.bandwidth.device, r.bandwidth.gbs, r.bandwidth.source) == (None, None, "unknown")
    assert all(o.peak_fraction is None and not o.unreliable for o in r.op_bandwidth)
    assert any(o.achieved_gbs for o in r.op_bandwidth)  # GB/s is known without a peak
    text = render_report(r, Console(record=True, width=220, file=io.StringIO())).export_text()
    assert "pass --bandwidth GBS" in text
    r = analyze_trace(path, bandwidth_gbs=1000)
    assert (r.bandwidth.gbs, r.bandwidth.source) == (1000.0, "argument")
    add = next(o for o in r.op_bandwidth if o.bytes == 24 * MiB)
    assert add.peak_fraction == pytest.approx(1.2582912) and add.unreliable
    for bad in (0, -5.0, float("nan"), float("inf"), True, "3350"):
        with pytest.raises(ValueError, match="bandwidth_gbs must be a finite number of GB/s"):
            analyze_trace(path, bandwidth_gbs=bad)
