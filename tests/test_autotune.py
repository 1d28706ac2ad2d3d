"""The tuning cache and the tuner's decisions, on the CPU with fakes for the GPU checks.

``tune`` refuses to tune under the interpreter or without CUDA; the tests that exercise a
real search patch those checks (``gpu_like``) and pass a fake timer, so no kernel runs.
"""

import importlib
import json
from dataclasses import asdict

import pytest
import torch

from onetrip.ops import autotune
from onetrip.ops._attention_picks import (AttentionConfig, MAX_TUNED_SEQ, _tile_fits, attention_bucket,
                                          attention_candidates, attention_config)

HEAD_DIMS = [32, 64, 80, 96, 128, 192, 256]
KEY = autotune.TuneKey("toy", "NVIDIA H100 80GB HBM3", "sm_90", "3.9.0", (128, True, 4096, 4, "bfloat16"))
CANDIDATES = [{"block": 32}, {"block": 64}, {"block": 128}]
DEFAULT = {"block": 16}


class Kernel:
    """Stands in for Triton's compiled kernel: what the launcher returns."""

    def __init__(self, n_spills=0, n_regs=128):
        self.n_spills, self.n_regs = n_spills, n_regs


class Bench:
    """A fake launcher: records calls; per-block spills, failures and times."""

    def __init__(self, ms=None, spills=(), fails=()):
        self.ms = ms or {32: 3.0, 64: 1.0, 128: 2.0}
        self.spills, self.fails, self.calls = set(spills), set(fails), []

    def __call__(self, cfg):
        self.calls.append(cfg["block"])
        if cfg["block"] in self.fails:
            raise RuntimeError("out of resource: shared memory, Required: 262144, Hardware limit: 232448")
        return Kernel(n_spills=64 if cfg["block"] in self.spills else 0)

    def timer(self, fn):
        fn()
        return self.ms[self.calls[-1]]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(autotune.ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.setenv(autotune.ENV_AUTOTUNE, "1")  # tuning is opt-in
    return tmp_path


@pytest.fixture
def gpu_like(monkeypatch, cache_dir):
    """Make ``tune`` believe it runs on a GPU outside capture (no kernel is launched: fakes)."""
    monkeypatch.setattr(autotune, "is_interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def run_tune(bench, cache=None):
    cache = cache or autotune.TuneCache("toy")
    return autotune.tune(KEY, CANDIDATES, bench, cache=cache, default=DEFAULT, timer=bench.timer)


def test_cache_round_trips_through_json(cache_dir):
    cache = autotune.TuneCache("toy")
    assert cache.path == cache_dir / "tune-toy.json"
    assert cache.get(KEY) is None
    cache.put(KEY, {"block_m": 128, "num_warps": 8})
    data = json.loads(cache.path.read_text())
    assert data["op"] == "toy" and list(data["entries"].values()) == [{"block_m": 128, "num_warps": 8}]
    assert autotune.TuneCache("toy").get(KEY) == {"block_m": 128, "num_warps": 8}
    other = autotune.TuneKey(KEY.op, "NVIDIA H200", KEY.capability, KEY.triton, KEY.bucket)
    assert autotune.TuneCache("toy").get(other) is None  # another GPU tunes for itself
    assert not list(cache_dir.glob("*.tmp"))  # the temporary file was renamed, not left behind


def test_second_process_reads_the_pick_without_tuning(gpu_like):
    first = Bench()
    assert run_tune(first) == {"block": 64}
    assert first.calls  # tuned
    second = Bench()
    assert run_tune(second, autotune.TuneCache("toy")) == {"block": 64}  # a fresh instance = a new process
    assert second.calls == []


def test_puts_from_two_processes_merge(cache_dir):
    a, b = autotune.TuneCache("toy"), autotune.TuneCache("toy")
    key2 = autotune.TuneKey(KEY.op, KEY.gpu, KEY.capability, KEY.triton, (64, False, 1024, 1, "float16"))
    a.get(KEY)  # a has loaded the (empty) file before b writes
    b.put(key2, {"block": 1})
    a.put(KEY, {"block": 2})
    fresh = autotune.TuneCache("toy")
    assert fresh.get(KEY) == {"block": 2} and fresh.get(key2) == {"block": 1}


@pytest.mark.parametrize("text", ["{not json", '{"entries": [1, 2]}', '["a list"]', ""])
def test_corrupt_cache_is_ignored_with_a_warning(cache_dir, text, gpu_like):
    (cache_dir / "tune-toy.json").write_text(text)
    cache = autotune.TuneCache("toy")
    with pytest.warns(RuntimeWarning, match="ignoring the tuning cache"):
        assert cache.get(KEY) is None
    bench = Bench()
    with pytest.warns(RuntimeWarning):  # put re-reads the file before merging
        assert run_tune(bench, cache) == {"block": 64}
    assert autotune.TuneCache("toy").get(KEY) == {"block": 64}  # rewritten, readable again


def test_failing_and_spilling_candidates_are_skipped(gpu_like):
    bench = Bench(ms={32: 3.0, 64: 1.0, 128: 2.0}, fails={64})
    assert run_tune(bench) == {"block": 128}
    spilling = Bench(spills={64, 128})
    best, records = autotune.search(CANDIDATES, spilling, spilling.timer)
    assert best == {"block": 32}
    assert spilling.calls == [32, 32, 64, 128]  # spilling candidates are launched once, never timed
    assert [r.get("skipped", "").split(" ")[0] for r in records] == ["", "spills", "spills"]
    assert records[1]["n_spills"] == 64 and "ms" not in records[1]


def test_all_candidates_failing_stores_the_default(gpu_like):
    bench = Bench(fails={32, 64, 128})
    assert run_tune(bench) == DEFAULT
    again = Bench()
    assert run_tune(again) == DEFAULT and again.calls == []  # not re-timed by the next process


def test_capture_uses_the_cached_pick_or_the_default(gpu_like, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    bench = Bench()
    assert run_tune(bench) == DEFAULT and bench.calls == []
    autotune.TuneCache("toy").put(KEY, {"block": 128})
    assert run_tune(bench) == {"block": 128} and bench.calls == []


@pytest.mark.parametrize("why", ["interpreter", "no_cuda", "disabled"])
def test_no_tuning_without_a_gpu_or_when_disabled(gpu_like, monkeypatch, why):
    autotune.TuneCache("toy").put(KEY, {"block": 128})  # even a cached pick is not used
    if why == "interpreter":
        monkeypatch.setattr(autotune, "is_interpreting", lambda: True)
    elif why == "no_cuda":
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    else:
        monkeypatch.setenv(autotune.ENV_AUTOTUNE, "0")
    bench = Bench()
    assert run_tune(bench) == DEFAULT and bench.calls == []


def test_real_interpreter_run_returns_the_default(cache_dir):
    if torch.cuda.is_available():
        pytest.skip("checks the guards of a CPU run")
    bench = Bench()
    assert run_tune(bench) == DEFAULT and bench.calls == []
    assert not (cache_dir / "tune-toy.json").exists()


def test_compiled_report_reads_the_kernel():
    class Meta:
        shared = 98304
    k = Kernel(n_spills=0, n_regs=255)
    k.metadata = Meta()
    assert autotune.compiled_report(k) == {"n_regs": 255, "n_spills": 0, "shared": 98304}
    assert autotune.compiled_report(None) == {"n_regs": None, "n_spills": None, "shared": None}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_candidates_are_deterministic_nonempty_and_fit(head_dim, dtype):
    cands = attention_candidates(head_dim, dtype)
    assert cands and cands == attention_candidates(head_dim, dtype)
    assert cands[0] == attention_config(head_dim)  # the heuristic always competes
    assert len(set(cands)) == len(cands)
    elem = torch.empty((), dtype=dtype).element_size()
    assert all(_tile_fits(c, head_dim, elem) for c in cands[1:])
    if head_dim == 64:  # the tile that faults when causal on an H200 (Triton 3.6) is never timed
        assert AttentionConfig(128, 32, 4, 2) not in cands
    assert all(c.block_m in (64, 128) and c.num_warps in (4, 8) for c in cands)
    # a tuned dict turns back into the config it came from
    assert [AttentionConfig(**asdict(c)) for c in cands] == cands


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_short_queries_shrink_block_m(head_dim):
    cands = attention_candidates(head_dim, torch.bfloat16, max_seqlen_q=20)
    assert cands and all(c.block_m == 32 for c in cands)
    assert len(set(cands)) == len(cands)


def test_bucket():
    assert attention_bucket(128, True, 3000, 4, torch.bfloat16) == (128, True, 4096, 4, "bfloat16")
    assert attention_bucket(64, False, 100_000, 1, torch.float16)[2] == MAX_TUNED_SEQ
    assert attention_bucket(64, False, 0, 1, torch.float32)[2] == 1
    json.dumps(attention_bucket(80, True, 17, 8, torch.bfloat16))  # a key must be JSON-able


@pytest.mark.skipif(torch.cuda.is_available(), reason="runs the kernel on CPU tensors through the interpreter")
def test_op_path_tunes_once_then_reads_the_cache(gpu_like, monkeypatch, gen):
    """flash_attention's tuner wiring, end to end on the interpreter: every candidate is
    launched on the call's tensors and timed (fake timer), the pick is stored, a new
    process reads it without timing, and the picked config computes the right result."""
    fa = importlib.import_module("onetrip.ops.flash_attention")  # the package re-exports a function of that name
    head_dim, seq = 256, 5  # 5 bf16 candidates, block_m shrunk to 16
    q, k, v = (torch.randn(1, seq, 2, head_dim, generator=gen, dtype=torch.bfloat16) for _ in range(3))
    times = iter([5.0, 4.0, 1.0, 3.0, 2.0])
    timed = []
    monkeypatch.setattr(autotune, "median_ms", lambda fn: (fn(), timed.append(1), next(times))[2])
    fa._tune_cache.cache_clear()
    out = torch.full_like(q, float("nan"))
    args = (q, k, v, out, None, None, None, seq, head_dim ** -0.5, (-1, 0), 0.0)
    cfg = fa._tuned_config(*args)
    cands = fa.attention_candidates(head_dim, torch.bfloat16, seq)
    assert len(timed) == len(cands) == 5 and cfg == cands[2]
    fa._tune_cache.cache_clear()  # a new process: fresh in-memory cache, same file
    assert fa._tuned_config(*args) == cfg and len(timed) == 5
    fa._launch(*args[:-2], args[-2], args[-1], cfg)
    ref = fa.attention_ref(q.double(), k.double(), v.double(), causal=True)
    assert (out.double() - ref).abs().max() < 2e-2
    fa._tune_cache.cache_clear()
