"""linear_cross_entropy: loss and gradients against the unfused reference on float64 copies
(the 2 x PyTorch rule), chunked against one chunk, both accumulations, reduction="none"
(recomputed logits), errors; and torch.compile(fullgraph=True) of both loss ops."""

import pytest
import torch

from onetrip.ops.cross_entropy import cross_entropy
from onetrip.ops.linear_cross_entropy import chunk_tokens_for, linear_cross_entropy, linear_cross_entropy_ref
from onetrip.testing import assert_close, assert_grads_close, strided_like, upcast

from conftest import ON_GPU, assert_replay_matches
from test_cross_entropy import loss_atol


def _problem(device, gen, dtype, tokens=(17,), H=16, V=111, bias=True, ignored=0.3):
    """x (tokens..., H), weight (V, H), bias (V,) or None, target with some rows ignored; the
    weight scaled so that logits have a spread of a few units, as a trained head's."""
    x = strided_like(tokens + (H,), dtype, device, generator=gen)
    w = (torch.randn(V, H, device=device, generator=gen) * (2.0 / H**0.5)).to(dtype)
    b = strided_like((V,), dtype, device, generator=gen) if bias else None
    t = torch.randint(0, V, tokens, device=device, generator=gen)
    t = t.masked_fill(torch.rand(tokens, device=device, generator=gen) < ignored, -100)
    return x, w, b, t


def _inputs(x, w, b, t):
    inputs = {"x": x.clone().requires_grad_(), "weight": w.clone().requires_grad_(), "target": t}
    if b is not None:
        inputs["bias"] = b.clone().requires_grad_()
    return inputs


# (dtype, bias, options, chunk_tokens, grad_output)
CASES = {
    "bf16_bias_mean_3_chunks": (torch.bfloat16, True, dict(label_smoothing=0.1), 6, 1.0),
    "fp32_sum_options_4_chunks": (torch.float32, False, dict(z_loss=1e-3, softcap=3.0, reduction="sum"), 5, 0.5),
    "bf16_none_recompute": (torch.bfloat16, True, dict(reduction="none", z_loss=1e-3), 7, "rows"),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_reference(device, gen, case):
    dtype, bias, kw, chunk, go = CASES[case]
    x, w, b, t = _problem(device, gen, dtype, bias=bias)
    loss = linear_cross_entropy(x, w, t, b, chunk_tokens=chunk, **kw)
    assert loss.dtype == torch.float32
    exact = linear_cross_entropy_ref(*upcast(x, w), t, upcast(b), **kw)
    assert_close(f"{case} loss", loss, exact, linear_cross_entropy_ref(x, w, t, b, **kw), loss_atol(exact))
    grad_out = torch.randn(t.shape, device=device, generator=gen) if go == "rows" else torch.tensor(go, device=device)
    assert_grads_close(case, lambda **a: linear_cross_entropy(**a, chunk_tokens=chunk, **kw),
                       lambda **a: linear_cross_entropy_ref(**a, **kw), _inputs(x, w, b, t), grad_out)


@pytest.mark.parametrize("accumulation", ["float32", "weight_dtype"])
@pytest.mark.parametrize("bias", [False, True])
def test_chunks_equal_one_chunk(device, gen, accumulation, bias):
    """Four chunks against one: the same losses and dx (rows are independent); dW and db sum
    over chunks, so they agree to the accumulator's rounding (float32: the one final
    rounding to bfloat16; weight_dtype: one a chunk)."""
    x, w, b, t = _problem(device, gen, torch.bfloat16, tokens=(3, 6), bias=bias)
    got = {}
    for chunk in (18, 5):
        inputs = _inputs(x, w, b, t)
        loss, lse = linear_cross_entropy(**inputs, chunk_tokens=chunk, accumulation=accumulation, return_lse=True)
        assert not lse.requires_grad
        names = [k for k in inputs if k != "target"]
        grads = torch.autograd.grad(loss, [inputs[k] for k in names])
        got[chunk] = dict(loss=loss, lse=lse, **{f"d{k}": g for k, g in zip(names, grads)})
    one, four = got[18], got[5]
    for key in ("loss", "lse", "dx"):
        torch.testing.assert_close(four[key], one[key], rtol=1e-6, atol=1e-6, msg=key)
    ulps = 1 if accumulation == "float32" else 4  # bfloat16 ulps, relative to the largest element
    for key in ("dweight", "dbias") if bias else ("dweight",):
        scale = one[key].abs().max().float()
        err = (four[key].float() - one[key].float()).abs().max()
        assert err <= ulps * scale * 2**-8, f"{key}: {err} vs {ulps} ulp of {scale}"


def test_no_grad_and_frozen_weight(device, gen):
    x, w, b, t = _problem(device, gen, torch.float32, tokens=(2, 5))
    want = linear_cross_entropy_ref(x, w, t, b, reduction="none")
    with torch.no_grad():
        got = linear_cross_entropy(x.requires_grad_(), w, t, b, chunk_tokens=4, reduction="none")
    torch.testing.assert_close(got, want.float())
    x.requires_grad_(False)
    wg = w.clone().requires_grad_()  # only the weight learns (a frozen trunk): no dx
    loss = linear_cross_entropy(x, wg, t, b, chunk_tokens=4)
    loss.backward()
    wr = w.clone().requires_grad_()
    linear_cross_entropy_ref(x, wr, t, b).backward()
    torch.testing.assert_close(wg.grad, wr.grad, rtol=1e-5, atol=1e-6)


def test_all_tokens_ignored(device, gen):
    x, w, b, t = _problem(device, gen, torch.float32, tokens=(4,), bias=True)
    inputs = _inputs(x, w, b, torch.full_like(t, -100))
    loss = linear_cross_entropy(**inputs, chunk_tokens=3)
    assert torch.isnan(loss)
    loss.backward()
    for k in ("x", "weight", "bias"):
        assert torch.equal(inputs[k].grad, torch.zeros_like(inputs[k])), k


def test_chunk_rule():
    cpu = torch.device("cpu")
    assert chunk_tokens_for(1000, 32000, 4096, 2, cpu) == 1000  # 64 MB of logits: one chunk
    assert chunk_tokens_for(8192, 128256, 4096, 2, cpu) == 1024  # a quarter of the weight's 1 GiB
    c = chunk_tokens_for(16384, 128256, 65536, 2, cpu)  # 4 GB of logits: 256 MiB chunks, balanced
    chunks = -(-16384 // c)
    assert c * 128256 * 2 <= 256 * 2**20 and (chunks - 1) * c < 16384 <= chunks * c
    assert chunk_tokens_for(5, 10**9, 8, 4, cpu) == 1


def test_bad_inputs_name_the_argument(device):
    x = torch.zeros(4, 8, device=device)
    w = torch.zeros(11, 8, device=device)
    t = torch.zeros(4, dtype=torch.int64, device=device)
    bad = [
        (dict(weight=torch.zeros(11, 9, device=device)), ValueError, "weight"),
        (dict(weight=w.bfloat16()), TypeError, "weight"),
        (dict(bias=torch.zeros(10, device=device)), ValueError, "bias"),
        (dict(target=t[:3]), ValueError, "target"),
        (dict(target=t.float()), TypeError, "target"),
        (dict(x=x.long()), TypeError, "x"),
        (dict(accumulation="bf16"), ValueError, "accumulation"),
        (dict(chunk_tokens=0), ValueError, "chunk_tokens"),
        (dict(reduction="avg"), ValueError, "reduction"),
        (dict(softcap=-1.0), ValueError, "softcap"),
    ]
    for kw, err, name in bad:
        args = dict(x=x, weight=w, target=t, bias=None)
        args.update({k: v for k, v in kw.items() if k in args})
        opts = {k: v for k, v in kw.items() if k not in args}
        with pytest.raises(err, match=name):
            linear_cross_entropy(args["x"], args["weight"], args["target"], args["bias"], **opts)


def test_compile_fullgraph_both_losses(device, gen):
    """Both ops traced without a graph break, ignored tokens present: the same loss and
    gradients as eager (one compile for both ops: the CPU run's time goes to tracing)."""
    x, w, b, t = _problem(device, gen, torch.float32, tokens=(2, 7), V=111)
    logits = strided_like((14, 111), torch.float32, device, generator=gen)

    def step(x, w, b, logits):
        lce = linear_cross_entropy(x, w, t, b, chunk_tokens=5, label_smoothing=0.1)
        ce = cross_entropy(logits * 1.0, t.view(-1), z_loss=1e-3, inplace_backward=True)
        return lce + ce

    def run(fn):
        leaves = [v.clone().requires_grad_() for v in (x, w, b, logits)]
        loss = fn(*leaves)
        return [loss.detach(), *torch.autograd.grad(loss, leaves)]

    eager = run(step)
    torch._dynamo.reset()
    compiled = run(torch.compile(step, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager"))
    # Inductor (GPU) generates its own kernels for the sums around the ops: equal up to their order.
    tol = dict(rtol=1e-6, atol=1e-7) if ON_GPU else dict(rtol=0, atol=0)
    for name, a, e in zip(("loss", "dx", "dw", "db", "dlogits"), compiled, eager):
        torch.testing.assert_close(a, e, msg=name, **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("V", [32000, 128256])
@pytest.mark.parametrize("accumulation", ["float32", "weight_dtype"])
def test_real_heads(gen, V, accumulation):
    x, w, b, t = _problem("cuda", gen, torch.bfloat16, tokens=(4, 1023), H=1024, V=V, bias=False, ignored=0.1)
    chunks = [None, 1000] if accumulation == "float32" else [None]  # the free-memory rule, and forced chunks
    for chunk in chunks:
        assert_grads_close(f"V={V} {accumulation} chunk={chunk}",
                           lambda **a: linear_cross_entropy(**a, chunk_tokens=chunk, accumulation=accumulation),
                           linear_cross_entropy_ref, _inputs(x, w, b, t), torch.tensor(1.0, device="cuda"))


@pytest.mark.gpu
def test_cuda_graph_capture(gen):
    x, w, b, t = _problem("cuda", gen, torch.bfloat16, tokens=(512,), H=512, V=32000, bias=True)
    two = torch.tensor(2.0, device="cuda")  # made before capture: a host-to-device copy cannot be captured

    def step():  # chunk_tokens given: the free-memory query stays out of the capture
        leaves = [v.clone().requires_grad_() for v in (x, w, b)]
        loss = linear_cross_entropy(leaves[0], leaves[1], t, leaves[2], chunk_tokens=200, z_loss=1e-4)
        return (loss, *torch.autograd.grad(loss, leaves, two))

    assert_replay_matches(step)
