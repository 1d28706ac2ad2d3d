"""The attention suites' pure parts on the CPU: FLOP and byte counts, cells, skips, summaries,
plots; the provider wiring with a fake timer (kernels through Triton's interpreter); the CLI.

The timed runs need a GPU (tests marked ``gpu``, on tiny cells).
"""

import json
import math

import pytest
import torch

from onetrip.bench import attention, decode_attn, harness, providers
from onetrip.bench.attention import AttnCell
from onetrip.bench.decode_attn import DecodeCell
from onetrip.cli import main

from conftest import ON_GPU

FAKE_MS = 2.0


def fake_timer(fn):
    fn()
    return harness.Timing(FAKE_MS, 0.9 * FAKE_MS, 1.1 * FAKE_MS, True)


def by_provider(records):
    return {r["provider"]: r for r in records}


# ---------------------------------------------------------------------------- counting


def test_flops_by_hand():
    # 4 * seq^2 * heads * head_dim per sequence: Q K^T and P V, 2 FLOPs a multiply-add each.
    assert attention.flops(AttnCell("dense", 32, 512, 32, 32, 64, False)) == 4 * 32 * 512**2 * 32 * 64
    assert attention.flops(AttnCell("dense", 32, 512, 32, 32, 64, True)) == 2 * 32 * 512**2 * 32 * 64
    assert attention.flops(AttnCell("gqa", 4, 4096, 32, 8, 128, True)) == 2 * 4 * 4096**2 * 32 * 128  # kv heads: no
    varlen = AttnCell("varlen", 3, 7, 2, 2, 16, True, (7, 1, 3))
    assert attention.flops(varlen) == 2 * (49 + 1 + 9) * 2 * 16
    assert attention.flops(AttnCell("dense", 1, 16384, 16, 16, 128, False)) / 1e12 == pytest.approx(2.199, abs=1e-3)


def test_attention_cells():
    full, quick = attention.cells(), attention.cells(quick=True)
    dense = [c for c in full if c.kind == "dense"]
    assert len(dense) == 2 * 6 * 2 and len(full) == len(dense) + 2
    assert {(c.head_dim, c.heads) for c in dense} == {(64, 32), (128, 16)}
    assert sorted({c.seq for c in dense}) == [512, 1024, 2048, 4096, 8192, 16384]
    assert all(sum(c.seqlens) == 16384 for c in full + quick)
    assert all(c.heads * c.head_dim == 2048 for c in full if c.kind != "gqa")
    gqa, varlen = full[-2], full[-1]
    assert (gqa.heads, gqa.kv_heads, gqa.head_dim, gqa.seq, gqa.causal) == (32, 8, 128, 4096, True)
    assert varlen.causal and min(varlen.lengths) == 1 and max(varlen.lengths) > 2 * sorted(varlen.lengths)[-2]
    assert {c.seq for c in quick if c.kind == "dense"} == {1024, 8192} and set(quick) < set(full)
    assert len({c.label for c in full}) == len(full)


def test_eager_estimate():
    cell = AttnCell("dense", 1, 16384, 16, 16, 128, False)
    scores = 16 * 16384**2 * 2  # bf16 scores of the whole batch: 8 GiB
    assert attention.eager_peak_estimate(cell, torch.bfloat16) == attention.EAGER_PEAK_SCORES * scores
    varlen = AttnCell("varlen", 2, 10, 2, 2, 16, True, (10, 3))  # per sequence: the longest one counts
    assert attention.eager_peak_estimate(varlen, torch.float16) == attention.EAGER_PEAK_SCORES * 2 * 100 * 2


def test_decode_bytes_by_hand():
    cell = DecodeCell("decode", "contiguous", 3, 100, heads=4, kv_heads=2, head_dim=32, lengths=(1, 37, 100))
    # K and V of 138 tokens x 2 kv heads x 32, q and out 3 x 4 x 32; bf16.
    assert decode_attn.decode_bytes(cell) == (2 * 138 * 2 * 32 + 2 * 3 * 4 * 32) * 2
    paged = DecodeCell("decode", "paged-64", 2, 100, heads=4, kv_heads=2, head_dim=32)
    assert paged.max_seq == 128 and decode_attn.cache_bytes(paged) == 2 * 2 * 128 * 2 * 32 * 2
    assert decode_attn.decode_bytes(paged) == (2 * 200 * 2 * 32 + 2 * 2 * 4 * 32) * 2  # not the padding
    big = DecodeCell("decode", "contiguous", 64, 131072)
    assert decode_attn.cache_bytes(big) == 32 << 30
    app = DecodeCell("append_kv", "contiguous", 2, 40, q_len=3, heads=4, kv_heads=2, head_dim=32)
    # per token: q (4 x 32) read + written, k, v (2 x 32) read + written, bf16; cos, sin 16 float32 each.
    assert decode_attn.append_bytes(app) == 6 * ((2 * 4 * 32 + 4 * 2 * 32) * 2 + 2 * 16 * 4)
    assert app.seqlens == (37, 37) and app.tokens == 6


def test_decode_cells():
    full, quick = decode_attn.decode_cells(), decode_attn.decode_cells(quick=True)
    assert len(full) == 3 * (16 + 1) and {c.layout for c in full} == {"contiguous", "paged-64", "paged-256"}
    assert {(c.batch, c.context) for c in full} >= {(1, 4096), (64, 131072), (1, 1024)}
    assert all((c.heads, c.kv_heads, c.head_dim) == (32, 8, 128) for c in full)
    assert {(c.batch, c.context) for c in quick} == set(decode_attn.QUICK_CELLS) and (1, 4096) in decode_attn.QUICK_CELLS
    apps = decode_attn.append_cells()
    assert {c.batch for c in apps} == {1, 4, 16, 64} and any(decode_attn.append_bytes(c) >= 64 << 20 for c in apps)
    assert len({c.label for c in full + apps}) == len(full + apps)


def test_naive_versions_match_the_references():
    from onetrip.ops import append_kv_ref, decode_attention_ref

    for cell in decode_attn.CHECK_CELLS:
        t = decode_attn.make_inputs(cell, torch.float64, "cpu", torch.Generator().manual_seed(3))
        if cell.kind == "decode":
            args = [t[n] for n in ("q", "k_cache", "v_cache", "cache_seqlens", "block_table")]
            torch.testing.assert_close(decode_attn.naive_decode(*args), decode_attention_ref(*args))
        else:
            args = decode_attn._append_args(t, t["q"])
            want = append_kv_ref(*args)
            q_rot = decode_attn.naive_append_kv(*args)
            for got, exp in zip((q_rot, t["k_cache"], t["v_cache"]), want):
                torch.testing.assert_close(got, exp)


# ---------------------------------------------------------------------------- providers on the CPU


def test_attention_cell_wiring_on_cpu():
    """Every provider on a tiny cell: SDPA's CPU flash runs, cuDNN and efficient raise
    (recorded), eager and onetrip run; diffs against sdpa-flash; onetrip within the noise."""
    for cell in (attention.CHECK_CELLS[1], attention.CHECK_CELLS[3]):
        recs = attention.bench_cell(cell, torch.bfloat16, "cpu", fake_timer)
        by = by_provider(recs)
        assert list(by) == list(attention.PROVIDERS)
        assert by["sdpa-cudnn"]["error"] and by["sdpa-cudnn"]["tflops"] is None
        mine = by["onetrip"]
        assert mine["error"] is None and mine["ok"] is True and mine["diff_base"] == "sdpa-flash"
        assert mine["tflops"] == pytest.approx(attention.flops(cell) / (FAKE_MS * 1e9))
        assert mine["vs_fa2"] == pytest.approx(1.0) and mine["vs_cudnn"] is None
        assert by["eager"]["max_diff"] is not None and by["sdpa-flash"]["max_diff"] == 0.0


def test_attention_eager_skipped_when_too_big():
    recs = attention.bench_cell(attention.CHECK_CELLS[0], torch.float32, "cpu", fake_timer, free=lambda: 1000)
    eager = by_provider(recs)["eager"]
    assert eager["skipped"].startswith("too big") and eager["median_ms"] is None
    assert by_provider(recs)["onetrip"]["ok"] is True


def test_decode_cell_wiring_on_cpu():
    for cell in decode_attn.CHECK_CELLS:
        recs = decode_attn.bench_cell(cell, "cpu", fake_timer, copy_gbs=1.0)
        by = by_provider(recs)
        mine = by["onetrip"]
        assert mine["error"] is None and mine["ok"] is True, mine
        assert mine["gbs"] == pytest.approx(mine["bytes"] / 1e9 / (FAKE_MS / 1e3))
        assert mine["pct_of_copy"] == pytest.approx(100 * mine["gbs"])
        if cell.kind == "decode":
            assert by["sdpa"]["skipped"].startswith("n/a") and mine["diff_base"] == "eager"
            assert mine["num_splits"] >= 1
        else:
            assert list(by) == ["eager", "onetrip"]
    uniform = DecodeCell("decode", "contiguous", 2, 64, heads=4, kv_heads=2, head_dim=32)
    by = by_provider(decode_attn.bench_cell(uniform, "cpu", fake_timer, copy_gbs=None))
    assert by["sdpa"]["error"] is None and by["onetrip"]["diff_base"] == "sdpa" and by["onetrip"]["ok"]
    assert by["onetrip"]["pct_of_copy"] is None


def test_decode_skips_by_memory():
    cell = DecodeCell("decode", "paged-16", 2, 64, heads=4, kv_heads=2, head_dim=32)
    recs = decode_attn.bench_cell(cell, "cpu", fake_timer, 1.0, free=lambda: 100)
    assert all(r["skipped"].startswith("too big: K and V") for r in recs)
    need = decode_attn.cache_bytes(cell)  # fits, but the eager copies (2 caches when paged) do not
    recs = decode_attn.bench_cell(cell, "cpu", fake_timer, 1.0, free=lambda: int(1.5 * need / decode_attn.MEMORY_SHARE))
    assert by_provider(recs)["eager"]["skipped"].startswith("too big: its copies")
    assert by_provider(recs)["onetrip"]["median_ms"] == FAKE_MS


def test_run_provider_records_failures():
    rec = dict.fromkeys(providers.RECORD_KEYS)

    def not_applicable():
        raise providers.NotApplicable("no paged entry")

    assert providers.run_provider(rec, not_applicable, fake_timer, torch.device("cpu")) is None
    assert rec["skipped"] == "n/a: no paged entry" and rec["error"] is None
    rec = dict.fromkeys(providers.RECORD_KEYS)
    boom = lambda: (lambda: torch.ones(2) @ torch.ones(3), lambda o: o)
    assert providers.run_provider(rec, boom, fake_timer, torch.device("cpu")) is None
    assert rec["error"].startswith("RuntimeError") and rec["median_ms"] is None


def test_add_diffs_bound():
    recs = [{"provider": p, **dict.fromkeys(providers.RECORD_KEYS)} for p in ("a", "b", "onetrip")]
    base = torch.ones(4)
    outs = {"a": base, "b": base + 0.01, "onetrip": base + 0.02}
    providers.add_diffs(recs, outs, torch.float32, ("a", "b"))
    assert [r["diff_base"] for r in recs] == ["a"] * 3 and recs[1]["max_diff"] == pytest.approx(0.01)
    assert recs[2]["ok"] is True  # 0.02 <= 2 * 0.01 + 4 eps
    outs["onetrip"] = base + 0.03
    providers.add_diffs(recs, outs, torch.float32, ("a", "b"))
    assert recs[2]["ok"] is False


# ---------------------------------------------------------------------------- summaries, plots


def _onetrip(cell, **kw):
    return {"provider": "onetrip", "cell": cell, "error": None, "ok": True, "max_diff": 1e-3, **kw}


def test_attention_summary():
    recs = [_onetrip("a", tflops=400.0, vs_fa2=1.6, vs_cudnn=0.8), _onetrip("b", tflops=300.0, vs_fa2=0.9,
            vs_cudnn=None), _onetrip("c", tflops=None, vs_fa2=None, vs_cudnn=None, error="boom", ok=None)]
    line = attention.summary(recs, {"gpu": "G", "dtype": "bf16"}, "x.json")
    assert line["vs_fa2_geomean"] == pytest.approx(math.sqrt(1.6 * 0.9), abs=1e-3) and line["vs_fa2_min"] == 0.9
    assert line["vs_cudnn_geomean"] == 0.8 and line["onetrip_errors"] == 1 and line["checks_failed"] == 0
    assert line["cells"]["a"] == {"tflops": 400.0, "vs_fa2": 1.6, "vs_cudnn": 0.8, "max_diff": 0.001, "ok": True}
    assert json.loads(json.dumps(line)) == line


def _decode(layout, batch, context, pct, kind="decode", nbytes=1 << 30):
    tokens = batch * context
    return {"provider": "onetrip", "kind": kind, "layout": layout, "batch": batch, "context": context,
            "tokens": tokens, "cell": f"{kind} {layout} {batch}x{context}", "pct_of_copy": pct, "bytes": nbytes,
            "gbs": 40.0 * pct, "speedup_vs_best_peer": 1.2, "error": None, "ok": True}


def test_decode_summary_bars():
    recs = [_decode("contiguous", 1, 4096, 80.0), _decode("contiguous", 16, 4096, 92.0),  # 64K tokens: counts
            _decode("contiguous", 4, 8192, 50.0),  # 32K tokens: below the 90% bar's range
            _decode("paged-64", 64, 1024, 91.0), _decode("paged-64", 1, 4096, 70.0),
            _decode("contiguous", 1, 1, 30.0, kind="append_kv", nbytes=30_000),
            _decode("contiguous", 64, 64, 85.0, kind="append_kv", nbytes=100 << 20)]
    line = decode_attn.summary(recs, {"gpu": "G", "dtype": "bf16", "copy_gbs": 4000.0}, "x.json")
    assert line["min_pct_at_64k_tokens"] == {"contiguous": 92.0, "paged-64": 91.0}
    assert line["batch1_4k_pct"] == {"contiguous": 80.0, "paged-64": 70.0}
    assert line["append_kv_min_pct_64mib"] == 85.0 and len(line["append_kv_pct"]) == 2
    assert list(line["bars"].values()) == [True, False, True]
    assert line["batch1_4k_plain_read_pct"] == {}  # no plain read measured in these records
    recs[0]["read_gbs"] = 2600.0
    line = decode_attn.summary(recs, {"gpu": "G", "dtype": "bf16", "copy_gbs": 4000.0}, "x.json")
    assert line["batch1_4k_plain_read_pct"] == {"contiguous": 65.0}
    assert line["speedup_vs_best_peer_geomean"] == 1.2 and json.loads(json.dumps(line)) == line
    empty = decode_attn.summary([], {}, "x.json")
    assert list(empty["bars"].values()) == [None, None, None]


def test_plots_and_files_from_fake_records(tmp_path):
    att = []
    for cell in attention.cells(quick=True):
        for i, p in enumerate(attention.PROVIDERS):
            att.append({**cell.fields(), "provider": p, "tflops": None if p == "eager" and cell.seq > 4096
                        else 100.0 * (i + 1) * math.log2(cell.seq)})
    png = attention.plot(att, {"gpu": "Fake", "dtype": "bf16", "date": "2026-11-22"}, tmp_path / "a.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    dec = []
    for cell in decode_attn.decode_cells(quick=True) + decode_attn.append_cells(quick=True):
        for p in (decode_attn.APPEND_PROVIDERS if cell.kind == "append_kv" else decode_attn.PROVIDERS):
            dec.append({**cell.fields(), "provider": p, "gbs": None if p == "sdpa" and cell.page else 3000.0})
    meta = {"gpu": "Fake", "dtype": "bf16", "date": "2026-11-22", "copy_gbs": 4000.0}
    png = decode_attn.plot(dec, meta, tmp_path / "d.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json_path, csv_path = harness.write_results(dec, meta, tmp_path / "decode")
    assert len(json.loads(json_path.read_text())["results"]) == len(dec)


# ---------------------------------------------------------------------------- CLI


@pytest.mark.skipif(ON_GPU, reason="on a GPU this would run the timed benchmark")
@pytest.mark.parametrize("suite, checks", [("attention", len(attention.CHECK_CELLS)),
                                           ("decode-attention", 2 * len(decode_attn.CHECK_CELLS))])
def test_cli_check_without_gpu(suite, checks, capsys):
    assert main(["bench", suite]) == 0
    out = capsys.readouterr().out
    assert "need a CUDA GPU" in out and "FAIL" not in out
    assert json.loads(out.strip().splitlines()[-1]) == {"bench": f"{suite}-check", "dtype": "bf16",
                                                        "checks": checks, "failed": 0}


def test_check_catches_a_wrong_kernel(monkeypatch, capsys):
    zeros = lambda cell, q, k, v: ((lambda: torch.zeros_like(q)), lambda o: o)
    monkeypatch.setattr(attention, "_onetrip", zeros)
    assert attention.run_attention_check(torch.bfloat16) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["bench", "attention", "--dtype", "fp32"], ["bench", "decode-attention", "--dtype",
                                                                              "bf16"]])
def test_cli_argument_errors(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_harness_helpers_on_cpu():
    assert harness.peak_extra_bytes(lambda: 7, "cpu") == (7, None)
    assert harness.free_bytes("cpu") > 1 << 40
    assert harness.error_string(ValueError("a\nb")) == "ValueError: a"


# ---------------------------------------------------------------------------- GPU smoke tests


@pytest.mark.gpu
def test_attention_bench_on_gpu(tmp_path, monkeypatch, capsys):
    tiny = [AttnCell("dense", 2, 256, 4, 4, 64, True), AttnCell("varlen", 3, 300, 4, 4, 128, True, (300, 17, 1))]
    monkeypatch.setattr(attention, "cells", lambda quick: tiny)
    assert main(["bench", "attention", "--quick", "--out", str(tmp_path)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["bench"] == "attention" and line["checks_failed"] == 0 and line["onetrip_errors"] == 0
    assert {p.suffix for p in tmp_path.iterdir()} == {".json", ".csv", ".png"}
    recs = json.loads(next(tmp_path.glob("*.json")).read_text())["results"]
    assert all(r["peak_extra_bytes"] is not None for r in recs if r["median_ms"])


@pytest.mark.gpu
def test_decode_bench_on_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(decode_attn, "decode_cells", lambda quick: [DecodeCell("decode", "contiguous", 1, 4096),
                                                                    DecodeCell("decode", "paged-64", 2, 1000)])
    monkeypatch.setattr(decode_attn, "append_cells", lambda quick: [DecodeCell("append_kv", "paged-64", 4, 4096)])
    assert main(["bench", "decode-attention", "--quick", "--out", str(tmp_path)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["bench"] == "decode-attention" and line["checks_failed"] == 0 and line["onetrip_errors"] == 0
    assert set(line["batch1_4k_pct"]) == {"contiguous"} and line["copy_gbs"] > 100
    assert 0 < line["batch1_4k_plain_read_pct"]["contiguous"] < 110  # what a plain read of that cell reaches
    recs = json.loads(next(tmp_path.glob("*.json")).read_text())["results"]
    assert all(r["read_gbs"] > 0 and r["pct_of_read"] > 0 for r in recs if r["kind"] == "decode" and r["gbs"])
