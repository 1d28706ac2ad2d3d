"""BENCHMARKS.md is generated from the curated results: a figure there cannot drift from its data."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_benchmarks_md_matches_results():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "benchmarks_md.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_curated_results_stay_small():
    results = ROOT / "benchmarks" / "results"
    tracked = [*results.glob("*/*.json"), *results.glob("*/*.png")]  # what .gitignore lets in
    assert len(tracked) <= 40, f"{len(tracked)} result files: keep the latest run of each suite on each GPU"
    assert sum(p.stat().st_size for p in tracked) <= 8 << 20


@pytest.fixture
def md(monkeypatch):
    """The tool as a module, its folder on sys.path as running it as a script puts it there."""
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    import benchmarks_md

    return benchmarks_md


def test_train_section_renders_a_run(md):
    rec = dict(model="llama-3.2-1b", seq=4096, batch=4, losses=[11.9, 11.2], error=None, skipped=None,
               max_batch=7, max_batch_exact=True, max_tokens_vs_eager=None, tokens_per_s=30000.0,
               speedup_vs_eager=None, peak_bytes=100 * 2**30, peak_vs_eager=None, max_loss_diff=0.0)
    mine = dict(rec, provider="onetrip", max_batch=23, max_batch_exact=False, max_tokens_vs_eager=23 / 7,
                tokens_per_s=45000.0, speedup_vs_eager=1.5, peak_bytes=40 * 2**30, peak_vs_eager=0.4,
                max_loss_diff=0.0123)
    data = {"meta": {"gpu": "NVIDIA H200", "date": "2026-11-29T12:00:00+00:00", "torch": "2.11.0",
                     "transformers": "5.17.0", "suite": "train", "settings": {"seq": 4096}},
            "results": [dict(rec, provider="eager"), mine,
                        dict(rec, provider="liger", losses=[], skipped="liger-kernel is not installed")]}
    text = md.decode.train_section("h200", data)
    assert "| llama-3.2-1b | onetrip | 4 | **45,000** (1.50x) | **40.0** (0.40x) | 23+ x 4096 (3.29x) | 1.2e-02 |" \
        in text, text
    assert "| llama-3.2-1b | eager | 4 | 30,000 | 100.0 | 7 x 4096 | 0.0e+00 |" in text, text
    assert "Not measured: llama-3.2-1b liger: liger-kernel is not installed." in text
    assert "transformers 5.17.0" in text


META = {"sm_count": 132, "torch": "2.11.0", "triton": "3.6.0", "cuda": "13.0", "date": "2026-11-29T17:39:19+00:00"}


def _allreduce_run() -> dict:
    rec = dict(hidden=8192, world=2, dtype="bf16", payload_bytes=16384, link_bytes=16384, ok=True, max_err=0.05,
               bound=0.1, error=None)
    results = []
    for batch, fused_us in ((1, 7.0), (64, 12.0)):
        results += [dict(rec, batch=batch, provider="nccl+add_rms_norm", us=8.4, us_max=8.5 + batch / 8, speedup=1.0),
                    dict(rec, batch=batch, provider="onetrip-fused", us=fused_us, us_max=fused_us,
                         speedup=(8.5 + batch / 8) / fused_us, max_err=0.0156, bound=0.0625)]
    results.append(dict(rec, hidden=4096, batch=17, provider="nccl+add_rms_norm", us=None, us_max=None, speedup=None,
                        ok=None, error="RuntimeError: NCCL timeout"))
    return {"meta": dict(META, gpu="NVIDIA H200", suite="allreduce", world=2, nccl="2.28.9"), "results": results}


def _decode_tp_run(tp: int, preset: str, **extra) -> dict:
    rec = dict(preset=preset, tp=tp, batch=1, provider="onetrip-tp", tok_s=111.0, ms_per_step=9.009,
               pct_of_floor=81.64, allreduce_us_per_layer=None if tp == 1 else 16.59,
               allreduce_pct_of_step=None if tp == 1 else 6.66, **extra)
    meta = dict(META, gpu=f"NVIDIA H200 x {tp}", gpu_name="NVIDIA H200", tp=tp, copy_gbs=4249.0,
                copy_gbs_per_rank=[4250.0, 4249.0][:tp], nccl="2.28.9" if tp > 1 else None)
    return {"meta": meta, "results": [rec]}


def test_take_files_multi_gpu_runs_by_gpu_and_rank_count(md, tmp_path, monkeypatch):
    monkeypatch.setattr(md.common, "RESULTS", tmp_path / "results")
    runs = {"allreduce-nvidia-h200-x2-20261129.json": _allreduce_run(),
            "decode-tp2-nvidia-h200-bfloat16-20261129.json": _decode_tp_run(2, "llama-3.1-8b"),
            "decode-tp1-nvidia-h200-bfloat16-20261129.json": _decode_tp_run(1, "llama-3.1-8b")}
    for name, data in runs.items():
        (tmp_path / name).write_text(json.dumps(data))
    took = lambda name, *args: md.take(tmp_path / name, *args).relative_to(tmp_path / "results").as_posix()
    assert took("allreduce-nvidia-h200-x2-20261129.json", None) == "h200x2/allreduce.json"
    assert took("decode-tp2-nvidia-h200-bfloat16-20261129.json", "tp2-8b") == "h200x2/decode-tp-tp2-8b.json"
    assert took("decode-tp1-nvidia-h200-bfloat16-20261129.json", "tp1-8b") == "h200/decode-tp-tp1-8b.json"
    assert took("decode-tp1-nvidia-h200-bfloat16-20261129.json", "tp1-8b", "h200x2") == "h200x2/decode-tp-tp1-8b.json"
    with pytest.raises(SystemExit, match="h100x2"):
        md.take(tmp_path / "decode-tp1-nvidia-h200-bfloat16-20261129.json", "tp1-8b", "h100x2")
    # the decode section keeps to decode's files, the decode-tp section to decode-tp's
    assert [md.suite_of(s) for s in ("decode-8b", "decode-tp-tp2-8b", "decode-attention", "ops-backward")] == \
        ["decode", "decode-tp", "decode-attention", "ops-backward"]
    assert len(md.runs_of("h200x2", "decode-tp")) == 2 and md.runs_of("h200x2", "decode") == []


def test_allreduce_section_renders_a_run(md):
    text = md.serve_tp.allreduce_section("h200x2", _allreduce_run())
    assert "**NVIDIA H200 x 2**, 2026-11-29 17:39 UTC; torch 2.11.0, Triton 3.6.0, CUDA 13.0, NCCL 2.28.9." in text
    assert "| 1 | 16 KiB | 8.6 | **7.0** | 1.23x | ok (1.6e-02 / 6.2e-02) |" in text, text
    assert "| 64 | 16 KiB | 16.5 | **12.0** | 1.38x | ok (1.6e-02 / 6.2e-02) |" in text, text
    assert "| 17 | 16 KiB | — | — | — |" in text and "Failed: nccl+add_rms_norm 4096 x 17: RuntimeError" in text
    assert "Against the bar (hidden 8192, batch 1-64): onetrip-fused 1.23-1.38x nccl+add_rms_norm, met." in text


def test_decode_tp_section_and_bars(md):
    runs = [_decode_tp_run(2, "llama-3.1-70b"), _decode_tp_run(2, "llama-3.1-8b", vs_tp1=1.413),
            _decode_tp_run(1, "llama-3.1-8b")]
    text = md.serve_tp.decode_tp_section("h200x2", runs)
    assert "- TP 1, llama-3.1-8b: **NVIDIA H200 x 1**" in text and "copy 4249 GB/s a GPU (the slowest)" in text
    rows = [line for line in text.splitlines() if line.startswith("| llama")]
    assert rows == ["| llama-3.1-8b | 1 | 1 | onetrip-tp | **111** | 9.01 | 81.6% | — | — | — | — |",
                    "| llama-3.1-8b | 2 | 1 | onetrip-tp | **111** | 9.01 | 81.6% | 16.6 | 6.7% | 1.41x | — |",
                    "| llama-3.1-70b | 2 | 1 | onetrip-tp | **111** | 9.01 | 81.6% | 16.6 | 6.7% | — | — |"], text
    bars = md.serve_tp.decode_tp_bars(runs)
    assert "Llama-3.1-8B, TP 2, batch 1: 1.41x onetrip's TP 1 tok/s (bar 1.7x: not met)" in bars
    assert "TP 4 / 8: not measured, no 4- or 8-GPU machine lent" in bars
    bars = md.serve_tp.decode_tp_bars(runs + [_decode_tp_run(4, "llama-3.1-70b", vs_gptfast=1.25)])
    assert "TP 4 batch 1: 81.6% of the floor, 1.25x gptfast-tp" in bars and "not measured, no 4-" not in bars


def _serve_run() -> dict:
    """llama-3.2-1b at C=64 (transformers-cb failed) and at 8 req/s; llama-3.1-8b at C=64, every bar met."""
    def rec(preset, provider, tok_s, rate=None, **extra):
        timed = provider != "onetrip-static"
        return dict(preset=preset, provider=provider, concurrency=64, rate=rate, output_tok_s=tok_s,
                    requests_s=tok_s / 128, tokens_ok=True, ttft_p50_ms=80.0 if timed else None,
                    ttft_p99_ms=300.25 if timed else None, itl_p50_ms=9.0 if timed else None,
                    itl_p99_ms=30.0 if timed else None, **extra)

    results = [rec("llama-3.2-1b", "onetrip", 4126.4, tokens_agree_static=0.374, static_step_ms=1.4,
                   vs_static=0.1455, itl_p50_over_static_step=1.431),
               dict(preset="llama-3.2-1b", provider="transformers-cb", concurrency=64, rate=None,
                    error="RuntimeError: Inplace update to inference tensor outside InferenceMode is not allowed.\n"
                          "second line"),
               rec("llama-3.2-1b", "onetrip-static", 28369.5, static_step_ms=1.4, vs_static=1.0),
               rec("llama-3.2-1b", "onetrip", 1000.0, rate=8.0, static_step_ms=1.4, vs_static=0.035,
                   vs_transformers_cb=2.0, itl_p50_over_static_step=1.0),
               rec("llama-3.2-1b", "transformers-cb", 500.0, rate=8.0, settings="attention paged|sdpa"),
               rec("llama-3.1-8b", "onetrip", 9000.0, static_step_ms=5.0, vs_static=0.9, vs_transformers_cb=12.0,
                   itl_p50_over_static_step=1.2),
               rec("llama-3.1-8b", "transformers-cb", 750.0),
               rec("llama-3.1-8b", "onetrip-static", 10000.0, static_step_ms=5.0)]
    meta = dict(META, gpu="NVIDIA H200", suite="serve", transformers="5.17.0", num_requests=64, prompt_lo=64,
                prompt_hi=511, output_len=128, arrivals="closed loop: all at t=0, C in flight")
    return {"meta": meta, "results": results}


def test_serve_section_and_bars(md, tmp_path, monkeypatch):
    monkeypatch.setattr(md.common, "RESULTS", tmp_path / "results")
    (tmp_path / "serve-nvidia-h200-bfloat16-20261129.json").write_text(json.dumps(_serve_run()))
    assert md.take(tmp_path / "serve-nvidia-h200-bfloat16-20261129.json", None).name == "serve.json"
    text = md.serve_tp.serve_section("h200", md.common.load("h200", "serve"))
    assert "64 requests, prompts 64-511 tokens, 128 new tokens each; closed loop" in text
    tables = [line for line in text.splitlines() if line.startswith("llama")]
    assert tables == ["llama-3.2-1b, C=64; static decode step 1.40 ms:", "llama-3.2-1b, C=64, 8 req/s; static "
                      "decode step 1.40 ms:", "llama-3.1-8b, C=64; static decode step 5.00 ms:"], text
    assert "| onetrip | **4126** | 32.2 | 80.0 / 300.2 | 9.0 / 30.0 | 1.43x | — | 0.15x | ok, 37% same as static |" \
        in text, text
    assert "| transformers-cb | — | — | — | — | — | — | — | — |" in text
    assert text.count("| onetrip-static | 28370 | 221.6 | — | — |") == 2  # under both load points of C=64
    assert "transformers-cb: attention paged|sdpa." in text
    assert "Failed: transformers-cb: RuntimeError: Inplace update to inference tensor outside InferenceMode is not " \
           "allowed." in text and "second line" not in text
    assert ("- llama-3.2-1b: output tok/s / transformers-cb's not measured (transformers-cb: RuntimeError: Inplace "
            "update to inference tensor outside InferenceMode is not allowed); output tok/s / onetrip-static's 0.15x "
            "(bar >= 0.8x: not met); ITL p50 / static step 1.43x (bar <= 1.3x: not met).") in text, text
    assert ("- llama-3.1-8b: output tok/s / transformers-cb's 12.00x (bar >= 10x: met); output tok/s / "
            "onetrip-static's 0.90x (bar >= 0.8x: met); ITL p50 / static step 1.20x (bar <= 1.3x: met).") in text
    one_preset = [r for r in _serve_run()["results"] if "8b" not in r["preset"]]
    assert "not measured (no run)" in md.serve_tp.serve_bars(one_preset)


def _host_run(scale: float, **errors) -> dict:
    cases = (("x + r", "torch", 7.0), ("F.rms_norm fwd+bwd", "torch", 120.0), ("bias_gelu", "forward", 19.5),
             ("rms_norm", "forward", 24.0), ("cross_entropy", "forward", 70.0), ("rms_norm fwd+bwd", "fwd+bwd", 340.0))
    results = [dict(case=case, kind=kind, host_us=None if case in errors else us * (1.0 if kind == "torch" else scale),
                    error=errors.get(case)) for case, kind, us in cases]
    return {"meta": dict(META, gpu="NVIDIA H200", suite="host", calls=1000, repeats=5), "results": results}


def test_host_section_takes_both_launch_paths_and_states_the_bar(md, tmp_path, monkeypatch):
    monkeypatch.setattr(md.common, "RESULTS", tmp_path / "results")
    (tmp_path / "host-nvidia-h200-20261129.json").write_text(json.dumps(
        _host_run(1.0, cross_entropy="RuntimeError: out of memory\nsecond line")))
    triton = _host_run(3.0)
    triton["results"][0]["host_us"] = 7.7  # the host's noise between processes: 10%
    (tmp_path / "host-triton.json").write_text(json.dumps(triton))
    assert md.take(tmp_path / "host-nvidia-h200-20261129.json", None).name == "host.json"
    assert md.take(tmp_path / "host-triton.json", "triton").name == "host-triton.json"
    assert md.runs_of("h200", "host") and md.suite_of("host-triton") == "host"
    (tmp_path / "other.json").write_text(json.dumps({"meta": dict(META, gpu="NVIDIA H200", suite="hots"),
                                                     "results": []}))
    with pytest.raises(SystemExit, match="'hots'"):  # a suite no section shows is refused, not stored unseen
        md.take(tmp_path / "other.json", None)
    text = md.host.host_section("h200", md.common.load("h200", "host"))
    assert "| x + r | torch | 7.0 | 7.7 |" in text and "| rms_norm | forward | 24.0 | 72.0 |" in text, text
    assert "| cross_entropy | forward | — | 210.0 |" in text, text
    assert "torch's own rows move 0-10% between the two processes" in text, text
    assert "Failed: default cross_entropy: RuntimeError: out of memory." in text and "second line" not in text
    assert ("Against the bar (a forward call at most 20 us): met by 1 of 3 ops (bias_gelu 19.5); not met by "
            "rms_norm 24.0; not measured: cross_entropy. Through Triton's launch path: met by 0 (none). "
            "torch's own, us: x + r 7.0, F.rms_norm fwd+bwd 120.0.") in text, text
    # without the Triton run: one column, no A/B line
    (tmp_path / "results" / "h200" / "host-triton.json").unlink()
    text = md.host.host_section("h200", md.common.load("h200", "host"))
    assert "| rms_norm | forward | 24.0 |\n" in text and "Triton's launch path" not in text, text
