"""Gradients of add_rms_norm / rms_norm (Llama and Gemma), add_layer_norm / layer_norm
against PyTorch autograd through the references, by the 2 x PyTorch rule."""

import pytest
import torch

import onetrip
from onetrip.ops import _norm_backward
from onetrip.ops._norm_backward import NormBackwardConfig
from onetrip.ops.norm import _norm_backward_op, add_layer_norm_ref, add_rms_norm_ref, layer_norm_ref, rms_norm_ref
from onetrip.testing import assert_grads_close, strided_like

from conftest import ON_GPU, assert_replay_matches

KINDS = ["rms", "gemma", "layer"]


def _fns(kind, eps=1e-6):
    """(op, reference) of the add_* form, taking x, r, w, b (b unused by RMSNorm)."""
    if kind == "layer":
        return (lambda x, r, w, b: onetrip.add_layer_norm(x, r, w, b, eps),
                lambda x, r, w, b: add_layer_norm_ref(x, r, w, b, eps))
    gemma = kind == "gemma"
    return (lambda x, r, w, b: onetrip.add_rms_norm(x, r, w, eps, gemma=gemma),
            lambda x, r, w, b: add_rms_norm_ref(x, r, w, eps, gemma))


def _inputs(kind, rows, width, dtype, device, gen, params=True, layout="contiguous", wdtype=None):
    """x, r, w, b requiring gradients. r holds x's values (in another layout): h = 2x is then
    exact, so the rule judges the backward, not the rounding of h that it and PyTorch's
    reference both differentiate at (with one row, dw = dy * hn has no sum to average that
    rounding away: 2 in 100 seeds failed at 1 x 111 bfloat16)."""
    # an offset mean: LayerNorm's centering must not cancel
    x = strided_like((rows, width), dtype, device, layout, generator=gen) + (1.0 if kind == "layer" else 0.0)
    r = strided_like((rows, width), dtype, device, "rows" if layout == "contiguous" else "padded", generator=gen)
    r.copy_(x)
    w = strided_like((width,), wdtype or dtype, device, generator=gen).requires_grad_() if params else None
    b = (strided_like((width,), wdtype or dtype, device, generator=gen).requires_grad_()
         if params and kind == "layer" else None)
    return dict(x=x.requires_grad_(), r=r.requires_grad_(), w=w, b=b)


def _douts(rows, width, dtype, device, gen):
    return (strided_like((rows, width), dtype, device, generator=gen),
            strided_like((rows, width), dtype, device, generator=gen))


# RMSNorm of one element is sign(h); its gradient g * eps / (h^2 + eps)^1.5 is a float32
# cancellation of condition h^2 / eps in any formula: ours is 2x closer to exact than PyTorch's
# on average, but the worst of 37 rows compare by chance (5 in 80 seeds failed), so width 1
# runs in bfloat16 only there.
ADD_CASES = [(kind, rows, width, dtype) for kind in KINDS for rows, width in [(37, 1), (17, 17), (1, 111), (17, 1023)]
             for dtype in (torch.bfloat16, torch.float32)
             if not (width == 1 and dtype == torch.float32 and kind != "layer")]


@pytest.mark.parametrize("kind, rows, width, dtype", ADD_CASES,
                         ids=[f"{k}-{m}x{n}-{str(d)[6:]}" for k, m, n, d in ADD_CASES])
def test_add_norm_grads(device, gen, kind, rows, width, dtype):
    """dx, dresidual, dw (db) with gradients into both outputs (normed and h)."""
    fn, ref = _fns(kind)
    inputs = _inputs(kind, rows, width, dtype, device, gen)
    assert_grads_close(kind, fn, ref, inputs, _douts(rows, width, dtype, device, gen))


@pytest.mark.parametrize("kind", KINDS)
def test_plain_norm_grads(device, gen, kind):
    """rms_norm / layer_norm (no residual), with the weight (and bias), with a float32 weight
    of a bfloat16 x, and without them."""
    x = strided_like((37, 111), torch.bfloat16, device, generator=gen).requires_grad_()
    dy = strided_like((37, 111), torch.bfloat16, device, generator=gen)
    for wdtype in (torch.bfloat16, torch.float32):
        w = strided_like((111,), wdtype, device, generator=gen).requires_grad_()
        if kind == "layer":
            b = strided_like((111,), wdtype, device, generator=gen).requires_grad_()
            assert_grads_close("layer_norm", lambda x, w, b: onetrip.layer_norm(x, w, b, 1e-5),
                               lambda x, w, b: layer_norm_ref(x, w, b, 1e-5), dict(x=x, w=w, b=b), dy)
        else:
            gemma = kind == "gemma"
            assert_grads_close("rms_norm", lambda x, w: onetrip.rms_norm(x, w, 1e-6, gemma=gemma),
                               lambda x, w: rms_norm_ref(x, w, 1e-6, gemma), dict(x=x, w=w), dy)
    if kind == "gemma":
        return
    if kind == "layer":  # weight without bias, then neither
        w = strided_like((111,), torch.bfloat16, device, generator=gen).requires_grad_()
        assert_grads_close("layer_norm w", lambda x, w: onetrip.layer_norm(x, w, None, 1e-5),
                           lambda x, w: layer_norm_ref(x, w, None, 1e-5), dict(x=x, w=w), dy)
        assert_grads_close("layer_norm", lambda x: onetrip.layer_norm(x, None, None, 1e-5),
                           lambda x: layer_norm_ref(x, None, None, 1e-5), dict(x=x), dy)
    else:
        assert_grads_close("rms_norm", lambda x: onetrip.rms_norm(x, None, 1e-6),
                           lambda x: rms_norm_ref(x, None, 1e-6), dict(x=x), dy)


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_one_output_and_layouts(device, gen, kind):
    """Only normed gets a gradient, then only h; strided and transposed inputs and dy; a
    weight that needs no gradient; add_* without a residual."""
    fn, ref = _fns(kind)
    inputs = _inputs(kind, 17, 111, torch.bfloat16, device, gen, layout="transposed")
    dy, dh = _douts(17, 111, torch.bfloat16, device, gen)
    assert_grads_close(f"{kind} dy only", fn, ref, inputs, (dy, None))
    assert_grads_close(f"{kind} dh only", fn, ref, inputs, (None, dh))
    inputs = _inputs(kind, 17, 111, torch.float16, device, gen, layout="rows")
    inputs["w"].requires_grad_(False)
    dy = strided_like((17, 111), torch.float16, device, "padded", generator=gen)
    dh = strided_like((17, 111), torch.float16, device, "transposed", generator=gen)
    assert_grads_close(f"{kind} strided", fn, ref, inputs, (dy, dh))
    inputs["r"] = None
    assert_grads_close(f"{kind} no residual", fn, ref, inputs, (dy, dh))


@pytest.mark.parametrize("kind", KINDS)
def test_wide_rows(device, gen, monkeypatch, kind):
    """Segments (the wide-row path: statistics, then (band, segment) programs) forced on 9 x 300
    in segments of 128 (the last ragged), 2 rows a step, the next prefetched (on 4 SMs: 2
    bands, the last ragged); then 5000 wide (whole rows in registers) at 3 rows and, for
    LayerNorm (Chan's formula across chunks), the wide-row path the chooser takes past ROW_MAX."""
    fn, ref = _fns(kind)
    inputs = _inputs(kind, 9, 300, torch.float32, device, gen)
    douts = _douts(9, 300, torch.float32, device, gen)
    with monkeypatch.context() as m:
        m.setattr(_norm_backward, "backward_config", lambda M, N, device, itemsize: NormBackwardConfig(
            rows=2, num_warps=4, programs_per_sm=1, segment=128))
        assert_grads_close(f"{kind} segments", fn, ref, inputs, douts)
    for rows, width in ((3, 5000), (1, _norm_backward.ROW_MAX + 3)) if kind == "layer" else ((3, 5000),):
        assert _norm_backward.backward_config(rows, width, torch.device(device)).wide == (width > 5000)
        inputs = _inputs(kind, rows, width, torch.bfloat16, device, gen)
        assert_grads_close(f"{kind} {width}", fn, ref, inputs, _douts(rows, width, torch.bfloat16, device, gen))


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_wave_layout(device, gen, monkeypatch, kind):
    """The one-wave layout off its usual shapes (4 SMs on any device): 17 x 1000 in 10 bands of
    2 rows (the ninth of 1, the tenth past M with zero partials), the next row prefetched, the
    partials added in two passes; then 17 x 64 at the pick, 16 rows a step (the second step
    15 rows past the band)."""
    fn, ref = _fns(kind)
    monkeypatch.setattr(_norm_backward, "sm_count", lambda device: 4)
    monkeypatch.setattr(_norm_backward, "_ONE_PASS", 4)  # two passes from 5 partial rows
    cfg = NormBackwardConfig(rows=1, num_warps=1, programs_per_sm=3)
    assert _norm_backward.backward_plan(17, 1000, cfg, 4) == _norm_backward.BackwardPlan(1024, 1, 2, 10, 2)
    inputs = _inputs(kind, 17, 1000, torch.bfloat16, device, gen)
    with monkeypatch.context() as m:
        m.setattr(_norm_backward, "backward_config", lambda M, N, device, itemsize: cfg)
        assert_grads_close(f"{kind} 17 x 1000", fn, ref, inputs, _douts(17, 1000, torch.bfloat16, device, gen))
    assert _norm_backward.backward_config(17, 64, torch.device(device)).rows == 16
    inputs = _inputs(kind, 17, 64, torch.bfloat16, device, gen)
    assert_grads_close(f"{kind} 17 x 64", fn, ref, inputs, _douts(17, 64, torch.bfloat16, device, gen))


def test_layer_norm_width_one_exact(device, gen):
    """LayerNorm of one element is its bias: h - mean is exactly 0, so dx is exactly the
    gradient of h and dweight exactly 0 (float32 rows and a float32 weight of bfloat16 rows)."""
    for dtype, wdtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32)):
        inputs = _inputs("layer", 37, 1, dtype, device, gen, wdtype=wdtype)
        dy, dh = _douts(37, 1, dtype, device, gen)
        dx, dw = torch.autograd.grad(onetrip.add_layer_norm(inputs["x"], inputs["r"], inputs["w"], inputs["b"]),
                                     (inputs["x"], inputs["w"]), (dy, dh))
        assert torch.equal(dx, dh) and torch.equal(dw, torch.zeros_like(dw))


def _grads_of(fn, inputs, douts):
    outs = fn(**inputs)
    names = [k for k, v in inputs.items() if v is not None and v.requires_grad]
    return torch.autograd.grad(outs, [inputs[k] for k in names], douts)


def test_deterministic(device, gen):
    """Two backward runs give the same bits (dw, db: fixed-order partial sums, no atomics)."""
    fn, _ = _fns("layer")
    inputs = _inputs("layer", 17, 1023, torch.bfloat16, device, gen)
    douts = _douts(17, 1023, torch.bfloat16, device, gen)
    for a, b in zip(_grads_of(fn, inputs, douts), _grads_of(fn, inputs, douts)):
        assert torch.equal(a, b)


def test_out_with_grad_raises(device):
    x = torch.randn(4, 8, device=device, requires_grad=True)
    w = torch.ones(8, device=device)
    with pytest.raises(ValueError, match="out= is not supported when an input requires a gradient"):
        onetrip.rms_norm(x, w, out=torch.empty(4, 8, device=device))
    with pytest.raises(ValueError, match="residual_out= is not supported"):
        onetrip.add_layer_norm(x.detach(), torch.randn(4, 8, device=device), w.requires_grad_(), None,
                               residual_out=torch.empty(4, 8, device=device))
    with torch.no_grad():  # no gradient recorded: out= as before
        onetrip.rms_norm(x, w, out=torch.empty(4, 8, device=device))


def test_compile_fwd_bwd(device, gen):
    """torch.compile(fullgraph=True) of the forward, its backward through AOTAutograd: the
    eager bits."""
    fn, _ = _fns("rms")
    inputs = _inputs("rms", 5, 64, torch.bfloat16, device, gen)
    douts = _douts(5, 64, torch.bfloat16, device, gen)
    eager = _grads_of(fn, inputs, douts)
    torch._dynamo.reset()
    # aot_eager on the CPU, as tests/test_compile.py: Inductor's C++ code generation would dominate
    compiled = _grads_of(torch.compile(fn, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager"),
                         inputs, douts)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def test_custom_op_registration(device, gen):
    """onetrip::norm_backward's schema, mutations and fake implementation (torch.library.opcheck)."""
    dy, h, dh = (strided_like((5, 17), torch.float32, device, generator=gen) for _ in range(3))
    w = strided_like((17,), torch.bfloat16, device, generator=gen)
    torch.library.opcheck(_norm_backward_op, (dy, h, dh, w, torch.empty_like(dy), torch.empty_like(w),
                                              torch.empty_like(w), 1e-6, False, False))


def test_cpu_without_interpreter(monkeypatch):
    """No GPU, no interpreter: the forward reference and the unfused backward."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    gen = torch.Generator().manual_seed(0)  # a CPU generator (the fixture's is the test device's)
    for kind in ("gemma", "layer"):
        fn, ref = _fns(kind)
        inputs = _inputs(kind, 17, 111, torch.bfloat16, "cpu", gen)
        assert_grads_close(f"{kind} cpu", fn, ref, inputs, _douts(17, 111, torch.bfloat16, "cpu", gen))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_sweep(gen, kind):
    """bfloat16 at 1K-16K (whole rows to ROW_MAX, segments above) and one far wider row,
    rows from one to several bands a program; then fwd + bwd in one CUDA graph."""
    fn, ref = _fns(kind)
    for width in (1024, 2048, 3000, 4096, 8192, 12288, 16384, 70001):
        for rows in (1, 133, 1031):
            if rows * width > 2**24:
                continue
            inputs = _inputs(kind, rows, width, torch.bfloat16, "cuda", gen)
            douts = _douts(rows, width, torch.bfloat16, "cuda", gen)
            assert_grads_close(f"{kind} {rows}x{width}", fn, ref, inputs, douts)
    inputs = _inputs(kind, 515, 4096, torch.bfloat16, "cuda", gen)
    douts = _douts(515, 4096, torch.bfloat16, "cuda", gen)
    assert_replay_matches(lambda: _grads_of(fn, inputs, douts))
