"""The norm kernel's phase stamps (``TRACE``; ``onetrip/ops/_stamp.py``), which
``benchmarks/norm_timeline.py`` draws: they leave y and h as they are, and each program's four
stamps come once, in order, from a real SM; and the script's figures of a call."""

import sys
from pathlib import Path

import pytest
import torch

from onetrip.ops import norm as norm_mod
from onetrip.ops._norm_picks import PICKS_GPU, launch_segments
from onetrip.ops._stamp import STAMP_FIELDS
from onetrip.testing import poison_

from conftest import ON_GPU
from test_norm import _check, _params

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # norm_timeline, as other tests of scripts

HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] >= 9


def test_trace_needs_clusters():
    """A launch that is not of clusters (any launch under the interpreter) refuses a trace, as
    does a trace too small or not int64: a ValueError naming it, not a trap in the kernel."""
    x = torch.randn(3, 256, dtype=torch.float32)
    if ON_GPU:
        x = x.cuda()
    cfg = norm_mod.NormConfig("loop", 1, 128, 4)
    with pytest.raises(ValueError, match="trace: stamps are taken of a launch of clusters"):
        norm_mod._launch(x, None, None, None, torch.empty_like(x), None, 1e-6, True, False, cfg,
                         trace=torch.zeros(3, 12, dtype=torch.int64, device=x.device))


@pytest.mark.skipif(not HOPPER, reason="stamps are taken of clusters: Hopper")
@pytest.mark.parametrize("key", [("loop", True, False, 262144), ("loop", False, False, 262144),
                                 ("loop", True, True, 262144), ("loop", False, True, 262144)])
def test_trace_stamps(gen, key):
    """An H100 cluster pick traced: y (and h) as untraced, bitwise; one record a program, its
    (row, segment) its own, stamps g0 <= g1 <= g2 <= g3 on the globaltimer and the SM's clock."""
    _, is_rms, residual, width = key
    cfg = PICKS_GPU["H100"][key]
    kind = "rms" if is_rms else "layer"
    rows = 5
    x = torch.randn((rows, width), device="cuda", generator=gen).to(torch.bfloat16)
    r = torch.randn_like(x) if residual else None
    w, b = _params(kind, width, torch.bfloat16, x.device, gen)
    split, _ = launch_segments(width, cfg)
    outs = []
    for trace in (None, torch.zeros(rows * split, len(STAMP_FIELDS), dtype=torch.int64, device="cuda")):
        y = poison_(torch.empty_like(x))
        h = poison_(torch.empty_like(x)) if residual else None
        norm_mod._launch(x, r, w, b, y, h, 1e-6, is_rms, False, cfg, trace=trace)
        outs.append((y, h))
    _check(kind, x, r, w, b, 1e-6, *outs[1])
    assert torch.equal(outs[0][0], outs[1][0])
    if residual:
        assert torch.equal(outs[0][1], outs[1][1])
    t = trace.cpu()
    f = {name: t[:, i] for i, name in enumerate(STAMP_FIELDS)}
    assert torch.equal(f["pid"], torch.arange(rows * split))
    assert torch.equal(f["row"] * split + f["seg"], f["pid"])
    assert bool(((f["smid"] >= 0) & (f["smid"] < torch.cuda.get_device_properties(0).multi_processor_count)).all())
    for a, b_ in (("g0", "g1"), ("g1", "g2"), ("g2", "g3"), ("c0", "c1"), ("c1", "c2"), ("c2", "c3")):
        assert bool((f[a] > 0).all()) and bool((f[a] <= f[b_]).all()), (a, b_)


def _prog(smid, g0, g1, g2, g3):
    return {"smid": smid, "pid": 0, "row": 0, "seg": 0, "g0": g0, "g1": g1, "g2": g2, "g3": g3,
            "c0": 0, "c1": 0, "c2": 0, "c3": 0}


def test_timeline_call_stats(tmp_path):
    """benchmarks/norm_timeline.py's figures of a call, on programs laid out by hand: two SMs,
    one running two programs back to back, the other one program that ends early."""
    import norm_timeline as nt

    progs = [_prog(0, 0.0, 2.0, 3.0, 5.0), _prog(0, 5.0, 6.0, 6.5, 10.0), _prog(7, 0.5, 1.0, 1.5, 4.0)]
    rec = nt.call_stats(progs, next_start=11.0)
    assert rec["span_us"] == 10.0 and rec["gap_to_next_us"] == 1.0 and rec["programs"] == 3
    assert rec["pass1_median_us"] == 1.0 and rec["wait_median_us"] == 0.5 and rec["pass2_median_us"] == 2.5
    assert rec["peak_programs"] == 2 and rec["sms"] == 2
    assert rec["idle_sm_us"] == 6.5  # SM 7: 0.5 before its program, 6 after; SM 0 never idle
    assert rec["first_sums_us"] == 1.0 and rec["last_sums_us"] == 6.0 and rec["last_start_us"] == 5.0
    nt.plot("by hand", [progs, [_prog(1, 12.0, 13.0, 14.0, 15.0)]], tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 0


def test_timeline_set_parsing():
    """norm_timeline's ``--set FIELD=VALUE``: a NormConfig field and a Python literal, else
    argparse's error (exit 2) naming the argument."""
    import argparse

    import norm_timeline as nt

    ap = argparse.ArgumentParser()
    assert nt._parse_set(ap, "wb_last=False") == ("wb_last", False)
    assert nt._parse_set(ap, "pf=32") == ("pf", 32)
    for bad in ("foo=1", "wb_last", "wb_last=maybe"):
        with pytest.raises(SystemExit) as e:
            nt._parse_set(ap, bad)
        assert e.value.code == 2
