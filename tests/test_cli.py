"""The ``onetrip`` command's subcommands that need no GPU."""

import json
from pathlib import Path

import pytest

from onetrip.cli import main

from profile_traces import TraceBuilder

DATA = Path(__file__).parent / "data"


def test_profile_report_and_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["profile", str(DATA / "cpu_attention.json.gz"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "N x N intermediates" in text and "Verdict" in text
    report = json.loads(out.read_text())
    assert report["square_intermediates"], report.keys()


def test_profile_missing_file(tmp_path, capsys):
    assert main(["profile", str(tmp_path / "nope.json")]) == 2
    assert "no such trace file" in capsys.readouterr().err


def test_profile_empty_trace(tmp_path, capsys):
    path = tmp_path / "empty.json"
    path.write_text('{"traceEvents": []}')
    assert main(["profile", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"onetrip profile: {path}: empty trace: traceEvents holds no events, " \
                                "so there is nothing to analyse\n"


def cpu_only(tmp_path) -> Path:
    b = TraceBuilder()
    b.step(1, 0, 90)
    b.op("aten::add", 10, 5, dims=[[8, 64], [8, 64]])
    return b.write(tmp_path / "cpu.json")


def test_profile_png_of_a_cpu_trace_says_why_not(tmp_path, capsys):
    """The report is printed; the timeline, which draws GPU kernels, is refused in one line."""
    trace, png = cpu_only(tmp_path), tmp_path / "t.png"
    assert main(["profile", str(trace), "--png", str(png), "--html", str(tmp_path / "t.html")]) == 1
    out, err = capsys.readouterr()
    assert "No GPU kernels in this trace" in out and "Verdict: none" in out
    assert err.splitlines() == [
        f"onetrip profile: --png {png} not written: no GPU kernels to draw in {trace} (the timeline needs a "
        "CUDA trace; see the note above)",
        f"onetrip profile: --html {tmp_path / 't.html'} not written: no GPU kernels to draw in {trace} (the "
        "timeline needs a CUDA trace; see the note above)"]
    assert not png.exists()


def test_profile_diff_of_cpu_traces_says_what_is_missing(tmp_path, capsys):
    trace = cpu_only(tmp_path)
    assert main(["profile", str(trace), "--diff", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "A: No GPU kernels in this trace" in out and "B: No GPU kernels in this trace" in out


@pytest.mark.parametrize("argv, bad", [
    (["demo", "--preset", "nope"], "argument --preset: invalid choice: 'nope'"),
    (["bench", "decode", "--preset", "nope"], "argument --preset: invalid choice: 'nope'"),
])
def test_bad_preset_names_the_argument_and_the_choices(argv, bad, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert bad in err and "'tiny'" in err and "'llama-3.2-1b'" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["generate", "profile"])
def test_bad_model_names_the_value_and_the_presets(tmp_path, command, capsys):
    for spec in ("no-such-model", str(tmp_path)):  # a directory without config.json is not a checkpoint
        assert main([command, "--model", spec]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"onetrip {command}: --model {spec!r} is neither a directory with config.json nor "
                              "a preset; presets: llama-3.2-1b, ")


def test_env_runs(capsys):
    assert main(["env"]) == 0
    assert "kernels" in capsys.readouterr().out
