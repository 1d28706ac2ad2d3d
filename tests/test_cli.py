"""The ``onetrip`` command's subcommands that need no GPU."""

import json
from pathlib import Path

from onetrip.cli import main

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


def test_env_runs(capsys):
    assert main(["env"]) == 0
    assert "kernels" in capsys.readouterr().out
