"""``onetrip bench serve`` on the CPU (tiny preset, float32, eager backend): the seeded
workload, the onetrip and onetrip-static providers' traces and records, transformers'
continuous batching where the installed transformers has it, the table and plot on
synthetic records, and the command's entry point."""

import argparse
import dataclasses
import inspect
import io
import json

import pytest
import torch
from rich.console import Console

from onetrip.bench import serve
from onetrip.bench.serve import Workload, bench_preset, run_onetrip, run_static
from onetrip.bench.serve_report import plot_serve, print_serve_table, summarize, summary_line, tokens_agree
from onetrip.models import Model, get_config

W = Workload(num_requests=6, prompt_lo=3, prompt_hi=17, output_len=5, concurrency=3, seed=1)


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: the steps are tiny, and two threads on two shared cores spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model():
    return Model.random(get_config("tiny"), torch.float32, "cpu", seed=0)


def _no_bar(description, total):
    return lambda n: None


def test_workload_is_seeded():
    a = W.requests(256)
    assert a == W.requests(256) and a != dataclasses.replace(W, seed=2).requests(256)
    assert [r.id for r in a] == [f"r{i}" for i in range(6)] and all(r.arrival == 0.0 for r in a)
    assert all(3 <= len(r.prompt) <= 17 and all(0 <= t < 256 for t in r.prompt) for r in a)
    assert len({len(r.prompt) for r in a}) > 1
    poisson = dataclasses.replace(W, rate=50.0).requests(256)
    assert [r.prompt for r in poisson] == [r.prompt for r in a]  # every load point sends the same prompts
    arrivals = [r.arrival for r in poisson]
    assert arrivals[0] == 0.0 and all(x < y for x, y in zip(arrivals, arrivals[1:]))
    with pytest.raises(ValueError, match="prompt_hi"):
        Workload(prompt_lo=9, prompt_hi=8)
    with pytest.raises(ValueError, match="rate"):
        Workload(rate=0.0)
    assert [w.label for w in serve.load_points((2, 8), (1.5,))] == ["C=2, 1.5 req/s", "C=8, 1.5 req/s"]


@pytest.mark.parametrize("rate", [None, 400.0])
def test_onetrip_traces_and_metrics(model, rate):
    """Every request gets output_len tokens, each timed no earlier than its send; the closed
    loop keeps at most C in flight, the open loop sends at the scheduled arrivals."""
    w = dataclasses.replace(W, rate=rate)
    reqs = w.requests(model.config.vocab_size)
    traces, start = run_onetrip(model, w, reqs, graphs=False, warmup=rate is None)
    for t, r in zip(traces, reqs):
        assert t.id == r.id and len(t.tokens) == len(t.token_times) == w.output_len
        assert start <= t.arrival <= t.token_times[0] and t.token_times == sorted(t.token_times)
        assert t.done == t.token_times[-1]
        if rate is not None:
            assert t.arrival == start + r.arrival
    if rate is None:
        edges = sorted([(t.arrival, 1) for t in traces] + [(t.done, -1) for t in traces], key=lambda e: (e[0], e[1]))
        flight = [sum(d for _, d in edges[: i + 1]) for i in range(len(edges))]
        assert max(flight) <= w.concurrency
    rec = summarize(traces, start, w.output_len)
    assert rec["tokens_ok"] and rec["output_tokens"] == w.num_requests * w.output_len
    assert rec["output_tok_s"] == pytest.approx(rec["output_tokens"] / rec["duration_s"])
    assert 0 < rec["ttft_p50_ms"] <= rec["ttft_p99_ms"] <= rec["duration_s"] * 1e3
    assert 0 <= rec["itl_p50_ms"] <= rec["itl_p99_ms"] <= rec["duration_s"] * 1e3
    assert rec["latency_p50_s"] <= rec["duration_s"]


def test_static_and_the_point_records(model):
    """onetrip-static runs (its greedy tokens equal the Scheduler's in float32); a point's
    records carry the static step, the ratios, and an error for a provider that cannot run."""
    reqs = W.requests(model.config.vocab_size)
    traces, start, step_ms = run_static(model, W, reqs, graphs=False, warmup=True)
    assert step_ms > 0 and all(len(t.tokens) == W.output_len and not t.token_times for t in traces)
    mine, _ = run_onetrip(model, W, reqs, graphs=False, warmup=False)
    assert tokens_agree({t.id: t.tokens for t in mine}, {t.id: t.tokens for t in traces}) == 1.0
    recs = bench_preset("tiny", model, None, [W], ("onetrip", "transformers-cb", "onetrip-static"), graphs=False,
                        warmup=False, task=_no_bar)
    by = {r["provider"]: r for r in recs}
    assert by["transformers-cb"]["error"] == "RuntimeError: transformers is not installed"
    static, ot = by["onetrip-static"], by["onetrip"]
    assert static["tokens_ok"] and static["ttft_p50_ms"] is None and static["static_step_ms"] > 0
    assert ot["tokens_agree_static"] == 1.0 and ot["static_step_ms"] == static["static_step_ms"]
    assert ot["vs_static"] == pytest.approx(ot["output_tok_s"] / static["output_tok_s"])
    assert ot["itl_p50_over_static_step"] == pytest.approx(ot["itl_p50_ms"] / static["static_step_ms"])
    assert "vs_transformers_cb" not in ot


def test_transformers_cb(model, monkeypatch):
    """transformers' ContinuousBatchingManager (transformers 5.x; 5.24 here) under the same
    client: the same greedy tokens in float32, with its per-token timestamps. With warm-up,
    the manager allocates its tensors in the caller's thread and its generation thread
    updates them in place; transformers 5.17 runs that thread outside inference mode, so
    here it is pinned outside it too (5.24 would take the caller's mode)."""
    pytest.importorskip("transformers")
    from transformers.generation.continuous_batching import continuous_api

    from onetrip.models.hf import to_transformers

    hf = to_transformers(model)
    why = serve.cb_api_missing(hf)
    if why:
        pytest.skip(why)
    loop = continuous_api.ContinuousBatchingManager._run_generation_loop
    if "use_inference_mode" in inspect.signature(loop).parameters:
        monkeypatch.setattr(continuous_api.ContinuousBatchingManager, "_run_generation_loop",
                            lambda man, use_inference_mode: loop(man, use_inference_mode=False))
    reqs = W.requests(model.config.vocab_size)
    traces, start, settings = serve.run_transformers_cb(hf, W, reqs, warmup=True)
    want, _, _ = run_static(model, W, reqs, graphs=False, warmup=False)
    assert [t.tokens for t in traces] == [t.tokens for t in want]
    assert "attention" in settings
    rec = summarize(traces, start, W.output_len)
    assert rec["tokens_ok"]
    if "no per-token timestamps" not in settings:
        assert all(len(t.token_times) == W.output_len and t.token_times[0] >= t.arrival for t in traces)
        assert 0 < rec["ttft_p50_ms"] <= rec["duration_s"] * 1e3


def _synthetic(concurrency, rate, provider, tok_s, **extra):
    rec = {"preset": "llama-3.2-1b", "provider": provider, "concurrency": concurrency, "rate": rate,
           "load": f"C={concurrency}" + (f", {rate:g} req/s" if rate else ""), "output_tok_s": tok_s,
           "requests_s": tok_s / 256, "tokens_ok": True, "ttft_p50_ms": None, "ttft_p99_ms": None,
           "itl_p50_ms": None, "itl_p99_ms": None}
    return {**rec, **extra}


def test_report_on_synthetic_records(tmp_path):
    meta = {"gpu": "NVIDIA H200", "dtype": "bfloat16", "num_requests": 256, "prompt_lo": 64, "prompt_hi": 511,
            "output_len": 256, "date": "2026-11-29T00:00:00+00:00"}
    lat = dict(ttft_p50_ms=80.0, ttft_p99_ms=300.0, itl_p50_ms=9.0, itl_p99_ms=30.0)
    records = []
    for c, k in ((16, 1.0), (64, 3.0)):
        records += [_synthetic(c, None, "onetrip", 4000 * k, **lat, itl_p50_over_static_step=1.1,
                               static_step_ms=8.0, vs_static=0.9, vs_transformers_cb=3.2, tokens_agree_static=0.4),
                    _synthetic(c, None, "transformers-cb", 1250 * k, **lat, settings="attention sdpa"),
                    _synthetic(c, None, "onetrip-static", 4400 * k, static_step_ms=8.0)]
    records.append({**_synthetic(128, None, "onetrip", 0.0), "error": "OutOfMemoryError: CUDA out of memory"})
    out = io.StringIO()
    print_serve_table(Console(file=out, width=250), records, meta)
    text = out.getvalue()
    assert "1.10x" in text and "3.20x" in text and "OutOfMemoryError" in text and "C=16: 8.00 ms" in text
    png = plot_serve(records, meta, tmp_path / "c.png")
    assert png.stat().st_size > 10_000
    rates = [_synthetic(64, r, p, t, **lat) for r in (2.0, 8.0) for p, t in (("onetrip", 900 * r),
                                                                             ("transformers-cb", 300 * r))]
    rates.append(_synthetic(64, None, "onetrip-static", 13000.0, static_step_ms=8.0))
    assert plot_serve(rates, meta, tmp_path / "r.png").stat().st_size > 10_000
    assert plot_serve(records[:3], meta, tmp_path / "one.png") is None  # one load point: no curve
    line = summary_line(records, meta, tmp_path / "x.json")
    assert line["onetrip_errors"] == 1 and [p["load"] for p in line["onetrip"]] == ["C=16", "C=64"]
    json.dumps(line)


def test_main_writes_results(tmp_path, capsys):
    args = argparse.Namespace(preset=["tiny"], provider=["onetrip", "onetrip-static"], requests=4, concurrency=[2],
                              rate=None, prompt_len=[3, 9], output_len=3, seed=0, quick=False, out=tmp_path)
    assert serve.main(args) == 0
    (path,) = tmp_path.glob("serve-*.json")
    data = json.loads(path.read_text())
    assert data["meta"]["output_len"] == 3 and {r["provider"] for r in data["results"]} == {"onetrip", "onetrip-static"}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["bench"] == "serve"
    assert serve.main(argparse.Namespace(**{**vars(args), "prompt_len": [9, 3]})) == 2
