"""Test session set-up: without a GPU, Triton kernels run through Triton's interpreter.

The variable must be set before any ``@triton.jit`` function is defined, so this file
sets it before anything imports onetrip's ops.
"""

import os
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The tests check each op with its deterministic heuristic configs; first-use autotuning
# (tens of seconds per shape bucket on a GPU) has its own tests (test_autotune.py).
os.environ.setdefault("ONETRIP_AUTOTUNE", "0")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"

# Widths the issue asks for: 1, 17, 111, 1023, 5000 and one above 65536.
WIDTHS = [1, 17, 111, 1023, 5000]
WIDE = 65537 + 2 * 1024  # 67585: odd, above 2**16, several chunks of a split row
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = ["contiguous", "rows", "padded", "transposed"]


def pytest_collection_modifyitems(config, items):
    if ON_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return DEVICE


def _seed(request) -> int:
    """The test's seed: from its id (stable run to run), or ONETRIP_TEST_SEED; one per test."""
    node = request.node
    if not hasattr(node, "onetrip_seed"):
        choice = os.environ.get("ONETRIP_TEST_SEED", "")
        if choice == "random":
            node.onetrip_seed = int.from_bytes(os.urandom(4), "little") % (2**31)
        else:
            node.onetrip_seed = int(choice) if choice else zlib.crc32(node.nodeid.encode()) % (2**31)
    return node.onetrip_seed


@pytest.fixture(autouse=True)
def _global_seed(request):
    """torch's global generator seeded per test as ``gen`` is (tests that draw without a
    generator), so a test's data does not depend on which tests ran before it in its worker."""
    torch.manual_seed(_seed(request))


@pytest.fixture
def gen(request):
    """A generator seeded from the test's id, so every run of a test draws the same data and
    CI is reproducible: the 2 x rule compares two maxima of rounding errors, and on bfloat16
    outputs a lucky draw for PyTorch fails it about once in a hundred seeds while onetrip's
    mean error is 0.6-0.7x PyTorch's (linear_cross_entropy's gradients, 300 seeds).
    ONETRIP_TEST_SEED=<int> sets another seed, =random a fresh one; the seed is printed."""
    seed = _seed(request)
    print(f"seed={seed}")
    g = torch.Generator(device=DEVICE)
    g.manual_seed(seed)
    return g


def rope_tables(max_pos, rot, device, dtype=torch.float32):
    """Real rotary frequencies: cos/sin(p * 10000 ** (-2i / rot)), computed in float64."""
    inv_freq = 10000.0 ** (-torch.arange(0, rot, 2, dtype=torch.float64, device=device) / rot)
    angles = torch.arange(max_pos, dtype=torch.float64, device=device)[:, None] * inv_freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


def check_chain_phases(x, w1, w2, mid, y, first=None, second=None, extra=()):
    """A two-GEMV chain (the experiments' gate_up -> SwiGLU -> down) by the 2 x PyTorch rule,
    each phase on its own input: ``mid`` against ``first(x, w1, *extra)`` (default
    ``w1 @ x``), then ``y`` against ``second(mid, w2, *extra)`` (default
    ``w2 @ (silu(g) * u)``) of the kernel's own rounded ``mid``; ``extra``: more inputs
    (norm weight, residual), upcast with the rest for the exact side. Judged end to end from
    the exact mid instead, mid's rounding (allowed, and the same in PyTorch's chain)
    compounds through the second GEMV and the rule turns into a coin toss on small outputs:
    2.2e-2 against a bound of 1.9e-2 for 23 outputs in a CI run; in a float64 simulation of
    the kernel's rounding, 1% of draws at 23 outputs and 0.1% at 5000 fail end to end, none
    of 20,000 by phases."""
    from onetrip.testing import assert_close, upcast

    def gemv(x, w1, *_):
        return w1 @ x

    def swiglu_gemv(mid, w2, *_):
        g, u = mid.chunk(2, dim=-1)
        return w2 @ (torch.nn.functional.silu(g) * u)

    first, second = first or gemv, second or swiglu_gemv
    assert_close("mid", mid, first(*upcast(x, w1, *extra)), first(x, w1, *extra))
    assert_close("y", y, second(*upcast(mid, w2, *extra)), second(mid, w2, *extra))


from onetrip.graphs import capture  # noqa: E402,F401  (re-exported for the tests; after TRITON_INTERPRET)


def assert_replay_matches(fn, flatten=lambda outs: outs):
    """Capture ``fn`` (returning a sequence of tensors, or what ``flatten`` makes one) in a
    CUDA graph, poison its captured outputs with NaN, replay, and require bit for bit what
    an eager call gave: the graph must rewrite every output.

    The eager outputs are kept detached: an output that kept its autograd graph would keep
    the leaves' gradient accumulators, which remember the stream of the call that made them
    (the legacy default stream here), and a captured backward's closing sync with that stream
    fails ("operation would make the legacy stream depend on a capturing blocking stream")."""
    eager = [t.detach() for t in flatten(fn())]
    graph, captured = capture(fn)
    captured = flatten(captured)
    for c in captured:
        c.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, eager):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def pytest_runtest_logreport(report):
    """With ONETRIP_FAILLOG=path, append each failure as it happens (id and traceback), so
    a run stopped at a time limit still says what failed (the device tool keeps no tty)."""
    path = os.environ.get("ONETRIP_FAILLOG")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n")


def byte_bpe(corpus, vocab_size: int, special_tokens, min_frequency: int = 0):
    """A byte-level BPE (``tokenizers.Tokenizer``) trained on ``corpus`` with ``special_tokens``,
    as the tokenizer, engine and server tests build their tiny vocabularies."""
    from tokenizers import Tokenizer as BackendTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = BackendTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return backend
