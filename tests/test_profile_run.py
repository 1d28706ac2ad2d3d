"""onetrip.profile.run on the CPU: PyTorch's profiler around a callable, then the analysis."""

import pytest
import torch

from onetrip.profile import run


def _attention():
    q = torch.randn(2, 4, 128, 32)
    scores = q @ q.transpose(-1, -2)  # (2, 4, 128, 128): an N x N intermediate
    return torch.softmax(scores, dim=-1) @ q


def test_run_finds_the_score_matrix(tmp_path):
    path = tmp_path / "trace.json"
    report = run(_attention, steps=3, warmup=1, trace_path=path)
    assert path.exists() and report.path == str(path)
    found = {s.op for s in report.square_intermediates}
    assert any("softmax" in op for op in found) and any("matmul" in op or "bmm" in op for op in found), found


def test_run_removes_its_temporary_trace():
    report = run(_attention, steps=1, warmup=0)
    assert not __import__("os").path.exists(report.path)


def test_run_bad_arguments():
    with pytest.raises(TypeError, match="fn must be callable"):
        run(3)
    with pytest.raises(ValueError, match="steps must be an int >= 1, got 0"):
        run(_attention, steps=0)
