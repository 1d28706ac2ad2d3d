"""The engine's commands on the CPU (tiny preset; fused kernels through the interpreter):
generate, profile --model, demo, bench decode."""

import io
import json

import pytest
import torch

from conftest import ON_GPU
from onetrip.cli import main

# These check what a machine without a GPU prints and records; on a GPU the same commands
# time, count kernels and capture graphs.
cpu_only = pytest.mark.skipif(ON_GPU, reason="checks the CPU-only output")


@cpu_only
def test_generate_writes_a_summary(tmp_path, capsys):
    out = tmp_path / "g.json"
    assert main(["generate", "--model", "tiny", "--max-new-tokens", "3", "--batch", "3", "--prompt-tokens", "9",
                 "--quiet", "--json", str(out)]) == 0
    s = json.loads(out.read_text())
    assert (s["batch"], s["new_tokens"], s["prompt_tokens"], s["backend"], s["page_size"]) == (3, 3, 9, "fused", None)
    assert s["decode_tok_s"] > 0 and s["pct_of_limit"] is None  # no bandwidth on a CPU
    out, err = capsys.readouterr()
    assert "No CUDA GPU: tiny runs on the CPU, the fused kernels through Triton's interpreter" in err
    assert "No CUDA GPU" not in out and "tiny · fused" in out  # stdout: the summary only


@cpu_only
def test_generate_shows_progress_on_stderr(tmp_path, capsys):
    out = tmp_path / "g.json"
    assert main(["generate", "--model", "tiny", "--backend", "eager", "--max-new-tokens", "16",
                 "--json", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    lines = stderr.splitlines()
    assert lines[0] == "No CUDA GPU: tiny runs on the CPU; tok/s here says nothing about GPU speed."
    assert lines[1].startswith("generate: prefill done, 1/16 tokens, ")
    assert [line.split(",")[0] for line in lines[2:]] == [f"generate: {n}/16 tokens" for n in range(2, 17, 2)]
    assert "generate:" not in stdout and json.loads(out.read_text())["new_tokens"] == 16


def test_progress_and_the_cpu_warning():
    from rich.console import Console

    from onetrip.engine.commands import GenerateProgress, cpu_warning

    assert cpu_warning("llama-3.2-1b", "fused") == ("No CUDA GPU: llama-3.2-1b runs on the CPU, the fused kernels "
                                                    "through Triton's interpreter; expect minutes. For a quick "
                                                    "check: --model tiny.")
    status = Console(file=io.StringIO(), width=200)  # not a terminal: lines, no bar
    with GenerateProgress(status, 32, 5, lines=True) as progress:
        for n in (1, 1, 2, 3, 5):
            progress.tokens(n)
    lines = status.file.getvalue().splitlines()
    assert [line.rsplit(",", 1)[0] for line in lines] == [
        "generate: prefill done, 1/5 tokens", "generate: 2/5 tokens", "generate: 3/5 tokens", "generate: 5/5 tokens"]


@cpu_only
def test_generate_paged(tmp_path, capsys):
    out = tmp_path / "g.json"
    assert main(["generate", "--model", "tiny", "--backend", "eager", "--max-new-tokens", "4", "--batch", "2",
                 "--paged", "--page-size", "16", "--quiet", "--json", str(out)]) == 0
    s = json.loads(out.read_text())
    assert (s["batch"], s["new_tokens"], s["page_size"]) == (2, 4, 16)
    assert "paged KV (16-token pages)" in capsys.readouterr().out


def test_generate_errors(capsys):
    assert main(["generate", "--model", "no-such-model", "--max-new-tokens", "2"]) == 2
    assert "neither a directory with config.json nor a preset; presets: llama-3.2-1b" in capsys.readouterr().err
    assert main(["generate", "--model", "tiny", "--prompt", "hello"]) == 2
    assert "--prompt needs a tokenizer" in capsys.readouterr().err
    assert main(["generate", "--model", "tiny", "--page-size", "16"]) == 2
    assert "--page-size 16 applies to a paged KV cache; add --paged" in capsys.readouterr().err


@cpu_only
def test_profile_model_records_a_trace(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main(["profile", "--model", "tiny", "--backend", "eager", "--steps", "2", "--trace-out", str(trace)]) == 0
    assert trace.exists() and "No GPU kernels in this trace" in capsys.readouterr().out
    assert main(["profile"]) == 2
    assert "give a TRACE file or --model" in capsys.readouterr().err


@cpu_only
def test_demo_on_the_cpu(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--new-tokens", "2"]) == 0
    out = capsys.readouterr().out
    for column in ("operators / step: ", "non-GEMM bytes / step: ", "tok/s (CPU): ", "same prefix: "):
        assert f"\n{column}" in out, column  # a legend line per column
    words = " ".join(out.split())  # the console wraps long lines
    assert "kernels run through Triton's interpreter" in words and "the GPU figures are in README.md" in words
    assert f"wrote {tmp_path / 'demo.json'}" in words and str(tmp_path / "demo-trace-fused.json") in words
    rows = json.loads((tmp_path / "demo.json").read_text())
    assert [r["mode"] for r in rows] == ["eager", "fused"]
    assert all(r["same_prefix"] == 2 for r in rows)
    # The fused step calls far fewer operators than the eager one.
    assert rows[1]["ops_per_step"] < 0.5 * rows[0]["ops_per_step"]


@cpu_only  # on a GPU this is the full bench (minutes), and it writes into benchmarks/results
def test_bench_decode_checks_tokens_on_the_cpu(capsys):
    assert main(["bench", "decode", "--new-tokens", "2"]) == 0
    assert "same as transformers" in capsys.readouterr().out


@cpu_only
def test_profile_transformers_decode(tmp_path, capsys):
    """The same weights run by transformers' own decode loop, profiled: the baseline trace
    the profiler is meant to read (on a GPU: launch-bound, element-wise chains)."""
    trace = tmp_path / "hf.json"
    assert main(["profile", "--model", "tiny", "--backend", "transformers", "--steps", "2",
                 "--trace-out", str(trace)]) == 0
    assert "No GPU kernels in this trace" in capsys.readouterr().out  # a CPU trace: operators only
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["name"] for e in events if e["name"].startswith("ProfilerStep#")} == {"ProfilerStep#0", "ProfilerStep#1"}
    assert any(e["name"] == "aten::linear" for e in events)


@cpu_only
def test_static_providers_return_a_callable_step():
    """run_static hands back a zero-argument step for the kernel count: the gpt-fast
    provider's compiled function must not be shadowed by it (on an H100 the count failed
    with "step() takes 0 positional arguments but 2 were given")."""
    from onetrip.bench.decode import _prompts, build, run_static

    model, _ = build("tiny", torch.float32, "cpu", False)
    for compiled in (False, True):
        tokens, _, _, step = run_static(model, _prompts(1, 4, model.config.vocab_size), 3, compiled)
        assert len(tokens[0]) == 3
        step()


def test_decode_provider_names_agree():
    """The CLI spells the decode providers without importing torch; they must stay the bench's."""
    from onetrip.bench.decode import PROVIDERS
    from onetrip.cli_bench import DECODE_PROVIDERS

    assert DECODE_PROVIDERS == PROVIDERS


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if ON_GPU else []))
def test_read_chain_floor(device, capsys):
    """bench decode's floor: the step's weight matrices in order (qkv, o, gate-up, down per
    layer, then the head), read by a chain of plain kernels on a GPU; on the CPU only the
    count and the bytes."""
    import torch

    from onetrip.bench.decode import read_chain, step_weights
    from onetrip.bench.decode_report import print_decode_table
    from onetrip.bench.report import console
    from onetrip.models import Model, get_config

    model = Model.random(get_config("tiny"), torch.bfloat16, device)
    weights = step_weights(model)
    layer = model.layers[0]
    assert len(weights) == 4 * len(model.layers) + 1
    assert weights[:4] == [layer.attn.wqkv.weight, layer.attn.wo.weight, layer.mlp.w_gate_up.weight,
                           layer.mlp.w_down.weight]
    chain = read_chain(model, 4000.0)
    assert chain["launches"] == len(weights) and chain["bytes"] == sum(w.numel() * 2 for w in weights)
    if device == "cpu":
        assert chain["ms"] is None
        chain.update(ms=0.5, pct_of_copy=12.0)  # as a GPU run records it
    else:
        assert chain["ms"] > 0 and chain["pct_of_copy"] > 0
    rec = {"preset": "tiny", "batch": 1, "provider": "onetrip-graphs", "tok_s": 100.0, "pct_of_limit": 50.0,
           "ms_per_step": 1.0, "prefill_ms": 1.0, "limit_tok_s": 200.0, "same_prefix": 4}
    print_decode_table(console(), [rec], [], {"read_chain": {"tiny": chain}, "copy_gbs": 4000.0, "new_tokens": 4})
    assert f"a chain of {chain['launches']} plain-read kernels" in capsys.readouterr().out
    # a run without batch 1 (--batch 8 32) states the limit at its smallest batch
    print_decode_table(console(), [dict(rec, batch=8, limit_tok_s=1600.0), dict(rec, batch=32, limit_tok_s=6000.0)], [],
                       {"copy_gbs": 4000.0, "new_tokens": 4})
    assert "limit at batch 8: 1600 tok/s" in capsys.readouterr().out
