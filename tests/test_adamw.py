"""onetrip.optim.AdamW against torch.optim.AdamW (foreach=False): the 2x rule per param after
several steps (onetrip's error against a float64 run of torch's AdamW at most twice the error
of torch's AdamW in the params' dtype, plus atol); with master weights the float32 master is
held against torch's float32 run."""

import io

import pytest
import torch

from onetrip.ops.adamw import adamw_table, is_dense
from onetrip.optim import AdamW
from onetrip.testing import assert_close

from conftest import DEVICE, capture

STEPS = 10


def make_params(dtype, gen, shapes=((1,), (17,), (111,), (1023,))):
    """Params of odd sizes and one (33, 7) transposed view: dense, not contiguous."""
    ps = [torch.randn(s, generator=gen, device=DEVICE).to(dtype) for s in shapes]
    return ps + [torch.randn(7, 33, generator=gen, device=DEVICE).to(dtype).t()]


def make_grads(params, steps, gen, scale=1.0):
    """grads[k][i] for step k and param i, in the param's dtype and strides."""
    return [[torch.empty_like(p).copy_(scale * torch.randn(p.shape, generator=gen, device=DEVICE)) for p in params]
            for _ in range(steps)]


def copy_param(p, dtype):
    """A copy of p in dtype with p's strides and, for a 1-D view, p's offset into its buffer."""
    if p.dim() == 1 and p.storage_offset():
        buf = torch.zeros(p.storage_offset() + p.numel(), dtype=dtype, device=p.device)
        return buf[p.storage_offset():].copy_(p)
    return p.detach().to(dtype, copy=True)


def train(make_opt, params0, grads, dtype=None, step_kwargs=None):
    """Copies of params0 (cast to dtype if given) stepped once per grads[k] (None: no grad)."""
    ps = [copy_param(p, dtype or p.dtype) for p in params0]
    opt = make_opt(ps)
    for k, gs in enumerate(grads):
        for p, g in zip(ps, gs):
            p.grad = None if g is None else g.to(p.dtype, copy=True)
        opt.step(**(step_kwargs(k) if step_kwargs else {}))
    return ps, opt


def torch_adamw(groups, **hyper):
    """A maker of torch.optim.AdamW(foreach=False) over params split into ``groups`` (lists of
    indices, each with its own hyperparameters) or one group."""
    def make(ps):
        if groups is None:
            return torch.optim.AdamW(ps, foreach=False, **hyper)
        return torch.optim.AdamW([{"params": [ps[i] for i in idx], **kw} for idx, kw in groups], foreach=False)
    return make


def check(name, mine, opt, params0, grads, groups=None, master_idx=(), **hyper):
    """The 2x rule for every param: against torch in the param's dtype, or, for the params in
    ``master_idx``, their float32 master against torch in float32 (and the param = its
    master rounded)."""
    exact, _ = train(torch_adamw(groups, **hyper), params0, grads, torch.float64)
    theirs, _ = train(torch_adamw(groups, **hyper), params0, grads)
    theirs32, _ = train(torch_adamw(groups, **hyper), params0, grads, torch.float32)
    for i, p in enumerate(mine):
        if i in master_idx:
            master = opt.state[p]["master"]
            assert torch.equal(p, master.to(p.dtype)), f"{name} param {i} is not its master rounded"
            assert_close(f"{name} master {i}", master, exact[i], theirs32[i])
        else:
            assert_close(f"{name} param {i}", p, exact[i], theirs[i])


CASES = {
    "fp32": (torch.float32, dict(lr=1e-2, weight_decay=0.1)),
    "fp32_amsgrad_maximize": (torch.float32, dict(lr=1e-2, weight_decay=0.0, amsgrad=True, maximize=True)),
    "bf16_master_amsgrad": (torch.bfloat16, dict(lr=1e-2, weight_decay=0.1, amsgrad=True, master_weights=True)),
    "fp16_master": (torch.float16, dict(lr=1e-3, betas=(0.8, 0.99), weight_decay=0.01, master_weights=True)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_adamw_matches_torch(case, gen):
    dtype, hyper = CASES[case]
    hyper = dict(hyper)
    params0 = make_params(dtype, gen)
    grads = make_grads(params0, STEPS, gen)
    mine, opt = train(lambda ps: AdamW(ps, **hyper), params0, grads)
    master = hyper.pop("master_weights", False)
    check(case, mine, opt, params0, grads, master_idx=range(len(mine)) if master else (), **hyper)
    assert all(float(opt.state[p]["step"]) == STEPS for p in mine)
    assert all(opt.state[p]["exp_avg"].dtype == torch.float32 for p in mine)


def test_adamw_16bit_params_step_by_step(gen):
    """bfloat16 params without master weights, judged a step at a time from onetrip's own state
    (torch's in-dtype run gets that state rounded to bfloat16): after 10 steps the error of
    either is a random walk of roundings, and on a 1-element param the rule is a coin toss."""
    params0 = make_params(torch.bfloat16, gen)
    grads = make_grads(params0, STEPS, gen)
    hyper = dict(lr=1e-2, weight_decay=0.1)
    ps = [p.clone() for p in params0]
    opt = AdamW(ps, **hyper)
    for k, gs in enumerate(grads):
        before = [(p.clone(), {n: v.clone() for n, v in opt.state[p].items()}) for p in ps]
        for p, g in zip(ps, gs):
            p.grad = g
        opt.step()
        exact = torch_step(before, gs, torch.float64, k, hyper)
        theirs = torch_step(before, gs, torch.bfloat16, k, hyper)
        for i, p in enumerate(ps):
            assert_close(f"bf16 step {k} param {i}", p, exact[i], theirs[i])


def torch_step(before, grads, dtype, k, hyper):
    """One torch.optim.AdamW step in dtype from the (param, state) pairs of ``before``."""
    ps = [p.to(dtype, copy=True) for p, _ in before]
    opt = torch.optim.AdamW(ps, foreach=False, **hyper)
    for q, (_, st), g in zip(ps, before, grads):
        q.grad = g.to(dtype)
        if st:
            opt.state[q] = {"step": torch.tensor(float(k)), "exp_avg": st["exp_avg"].to(dtype),
                            "exp_avg_sq": st["exp_avg_sq"].to(dtype)}
    opt.step()
    return ps


def test_adamw_groups_missing_grads_tensor_lr(gen):
    """Two groups of their own lr/betas/wd/amsgrad, float32 and bfloat16 (master weights) in
    each, a tensor lr, a param that never gets a gradient (untouched, no state), one that gets
    one every other step (its step count follows), and one at an address off 16 bytes (the
    unaligned path)."""
    f32, b16 = torch.float32, torch.bfloat16
    offset = torch.randn(1023 + 3, generator=gen, device=DEVICE)[3:]  # 12 bytes into its buffer
    params0 = [torch.randn(17, generator=gen, device=DEVICE), torch.randn(111, generator=gen, device=DEVICE).to(b16),
               torch.randn(1, generator=gen, device=DEVICE), offset,
               torch.randn(7, 33, generator=gen, device=DEVICE).to(b16).t()]
    grads = make_grads(params0, STEPS, gen)
    for k, gs in enumerate(grads):
        gs[2] = None
        if k % 2 == 0:
            gs[3] = None
    g0 = dict(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.1)
    g1 = dict(lr=3e-3, betas=(0.8, 0.99), weight_decay=0.0, amsgrad=True)
    lr = torch.tensor(1e-2, device=DEVICE)

    def make(ps):
        return AdamW([{"params": ps[:3], **g0, "lr": lr}, {"params": ps[3:], **g1}], master_weights=True)

    mine, opt = train(make, params0, grads)
    assert any(not table.aligned for _, table in opt._plan[0].launches)
    check("groups", mine, opt, params0, grads, groups=[([0, 1, 2], g0), ([3, 4], g1)], master_idx=(1, 4))
    assert torch.equal(mine[2], params0[2]) and not opt.state[mine[2]]
    assert float(opt.state[mine[3]]["step"]) == STEPS // 2
    assert float(opt.state[mine[0]]["step"]) == STEPS


def test_adamw_grad_scale_found_inf(gen):
    """Grads scaled by 1024 and unscaled in the kernel; a nonzero found_inf skips step 3 on the
    device (params, state and step counts unchanged); the rest matches torch on the unscaled
    grads without step 3."""
    params0 = make_params(torch.bfloat16, gen)
    grads = make_grads(params0, 6, gen)
    scale = torch.tensor(1024.0, device=DEVICE)
    found = [torch.tensor(float(k == 3), device=DEVICE) for k in range(6)]
    snapshots = {}

    def step_kwargs(k):
        return dict(grad_scale=scale, found_inf=found[k])

    def snap(opt, args, kwargs):
        snapshots[len(snapshots)] = _snapshot(opt)

    def make(ps):
        opt = AdamW(ps, lr=1e-2, master_weights=True)
        opt.register_step_pre_hook(snap)
        return opt

    scaled = [[g * 1024 for g in gs] for gs in grads]
    mine, opt = train(make, params0, scaled, step_kwargs=step_kwargs)
    _assert_same(snapshots[3], snapshots[4])  # state before step 3 == state before step 4
    kept = [gs for k, gs in enumerate(grads) if k != 3]
    check("grad_scale", mine, opt, params0, kept, master_idx=range(len(mine)), lr=1e-2)
    assert all(float(opt.state[p]["step"]) == 5 for p in mine)


def _snapshot(opt):
    return [(p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items()})
            for g in opt.param_groups for p in g["params"]]


def _assert_same(a, b):
    for (pa, sa), (pb, sb) in zip(a, b):
        assert torch.equal(pa, pb) and sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_adamw_check_finite(gen):
    """check_finite finds an Inf (step 1) and a NaN (step 3) in the grads and skips those steps;
    a caller's found_inf is set, and grad_scale applies before the check."""
    params0 = make_params(torch.float32, gen)
    grads = make_grads(params0, 5, gen)
    bad = {1: float("inf"), 3: float("nan")}
    dirty = [[g.clone() for g in gs] for gs in grads]
    for k, v in bad.items():
        dirty[k][3].view(-1)[500] = v
    mine, opt = train(lambda ps: AdamW(ps, lr=1e-2, check_finite=True), params0, dirty)
    kept = [gs for k, gs in enumerate(grads) if k not in bad]
    check("check_finite", mine, opt, params0, kept, lr=1e-2)
    assert all(float(opt.state[p]["step"]) == 3 for p in mine)

    found = [torch.zeros(1, device=DEVICE) for _ in range(5)]
    scale = torch.tensor(4.0, device=DEVICE)
    train(lambda ps: AdamW(ps, check_finite=True), params0, dirty,
          step_kwargs=lambda k: dict(found_inf=found[k], grad_scale=scale))
    assert [float(f) for f in found] == [0, 1, 0, 1, 0]


def test_adamw_grad_scaler(gen):
    """torch's GradScaler drives it as it drives torch's fused optimizers (grad_scale and
    found_inf handed over as attributes): same result as plain steps on unscaled grads."""
    if DEVICE == "cpu" and not hasattr(torch.amp, "GradScaler"):
        pytest.skip("no torch.amp.GradScaler")
    params0 = make_params(torch.float32, gen)
    grads = make_grads(params0, 3, gen)
    scaler = torch.amp.GradScaler(DEVICE, init_scale=256.0)
    ps = [p.clone().requires_grad_() for p in params0]
    opt = AdamW(ps, lr=1e-2)
    for gs in grads:
        opt.zero_grad()
        scaler.scale(sum((p * g).sum() for p, g in zip(ps, gs))).backward()  # grads: g * scale
        scaler.step(opt)
        scaler.update()
    plain, _ = train(lambda q: AdamW(q, lr=1e-2), params0, grads)
    for a, b in zip(ps, plain):
        # The scale is a power of two, so the unscaled grads are exact; but the two launches are
        # separate specializations, whose float32 contractions may differ by an ulp on a GPU
        # (1.9e-9 on an H200): float32's default closeness, not bit equality.
        torch.testing.assert_close(a, b)


def test_adamw_state_dict_round_trip(gen):
    """state_dict through torch.save / torch.load into a new optimizer: the next steps are bit
    for bit those of the original; the state stays float32 (torch would cast it to bfloat16).
    A torch.optim.AdamW state dict (bfloat16 state, CPU step counts) loads too."""
    params0 = make_params(torch.bfloat16, gen)
    grads = make_grads(params0, 5, gen)
    hyper = dict(lr=1e-2, amsgrad=True, master_weights=True)
    mine, opt = train(lambda ps: AdamW(ps, **hyper), params0, grads[:3])
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    ps2 = [p.detach().clone() for p in mine]
    opt2 = AdamW(ps2, **hyper)
    opt2.load_state_dict(torch.load(buf, weights_only=True))
    assert all(v.dtype == torch.float32 for p in ps2 for v in opt2.state[p].values())
    for gs in grads[3:]:
        for p, q, g in zip(mine, ps2, gs):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        opt2.step()
    _assert_same(_snapshot(opt), _snapshot(opt2))

    theirs, topt = train(lambda ps: torch.optim.AdamW(ps, lr=1e-2), params0, grads[:2])
    opt3 = AdamW(theirs, **hyper)
    opt3.load_state_dict(topt.state_dict())
    for p, g in zip(theirs, grads[2]):
        p.grad = g.clone()
    opt3.step()
    assert all(float(opt3.state[p]["step"]) == 3 and opt3.state[p]["exp_avg"].dtype == torch.float32 for p in theirs)


def test_adamw_unfused_matches_kernel(gen, monkeypatch):
    """CPU tensors without the interpreter take adamw_ref, op by op: the kernel's result up to
    float32 rounding (torch's CPU sqrt is not always correctly rounded)."""
    if DEVICE != "cpu":
        pytest.skip("the unfused path is the CPU path")
    params0 = make_params(torch.bfloat16, gen)
    grads = make_grads(params0, 4, gen)
    grads[2][1][5] = float("inf")
    hyper = dict(lr=1e-2, amsgrad=True, master_weights=True, check_finite=True)
    scale = torch.tensor(2.0)
    fused, fopt = train(lambda ps: AdamW(ps, **hyper), params0, grads, step_kwargs=lambda k: dict(grad_scale=scale))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    plain, popt = train(lambda ps: AdamW(ps, **hyper), params0, grads, step_kwargs=lambda k: dict(grad_scale=scale))
    assert not popt._plan[0].fused
    for a, b in zip(fused, plain):
        assert float(fopt.state[a]["step"]) == float(popt.state[b]["step"]) == 3
        torch.testing.assert_close(fopt.state[a]["master"], popt.state[b]["master"], rtol=1e-6, atol=1e-7)


def test_adamw_tables_reused(gen):
    """A step with grads at the same addresses reuses the tables (no host work beyond the
    address check); a grad that moves rebuilds them."""
    ps = make_params(torch.float32, gen)
    for p in ps:
        p.grad = torch.randn_like(p)
    opt = AdamW(ps)
    opt.step()
    plan = opt._plan
    for p in ps:
        p.grad.mul_(0.5)
    opt.step()
    assert opt._plan is plan
    ps[1].grad = ps[1].grad.clone()
    opt.step()
    assert opt._plan is not plan and all(float(opt.state[p]["step"]) == 3 for p in ps)


def test_adamw_errors():
    p = torch.randn(8, device=DEVICE)
    with pytest.raises(TypeError, match="complex"):
        AdamW([torch.randn(4, dtype=torch.complex64, device=DEVICE)])
    with pytest.raises(TypeError, match="float64"):
        AdamW([torch.randn(4, dtype=torch.float64, device=DEVICE)])
    with pytest.raises(ValueError, match="betas"):
        AdamW([p], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="lr"):
        AdamW([p], lr=-1.0)
    with pytest.raises(TypeError, match="lr"):
        AdamW([p], lr=torch.tensor([1e-3, 1e-3]))
    opt = AdamW([p])
    p.grad = torch.randn(8, device=DEVICE).to_sparse()
    with pytest.raises(TypeError, match="sparse"):
        opt.step()
    p.grad = torch.randn(8, device=DEVICE)
    with pytest.raises(TypeError, match="grad_scale"):
        opt.step(grad_scale=torch.tensor(2.0, dtype=torch.float64, device=DEVICE))
    gappy = torch.randn(8, 6, device=DEVICE)[:, ::2]
    assert not is_dense(gappy) and is_dense(gappy.t().contiguous().t())
    gappy.grad = torch.zeros_like(gappy)
    with pytest.raises(ValueError, match="gaps"):
        AdamW([gappy]).step()
    q = torch.randn(7, 33, device=DEVICE).t()
    with pytest.raises(ValueError, match="strides"):
        z = torch.zeros(33, 7, device=DEVICE)
        adamw_table([q], [torch.zeros(33, 7, device=DEVICE)], [z], [z], [torch.zeros((), device=DEVICE)])


@pytest.mark.gpu
def test_adamw_cuda_graph(gen):
    """A step captured in a CUDA graph (tensor lr, grad_scale, check_finite's own found_inf) and
    replayed matches eager steps bit for bit, lr changes read at replay included."""
    params0 = make_params(torch.float32, gen) + make_params(torch.bfloat16, gen)
    grads = make_grads(params0, 1, gen)[0]
    scale = torch.tensor(2.0, device=DEVICE)

    def setup():
        ps = [p.clone() for p in params0]
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        lr = torch.tensor(1e-2, device=DEVICE)
        opt = AdamW([{"params": ps[:5]}, {"params": ps[5:], "master_weights": True}], lr=lr, weight_decay=0.1,
                    check_finite=True)
        return opt, lr

    eager, eager_lr = setup()
    graphed, graphed_lr = setup()
    graph, _ = capture(lambda: graphed.step(grad_scale=scale))  # one eager warm-up step, then captured
    eager.step(grad_scale=scale)
    for k in range(3):
        eager_lr.fill_(1e-2 / (k + 2))
        graphed_lr.fill_(1e-2 / (k + 2))
        eager.step(grad_scale=scale)
        graph.replay()
    torch.cuda.synchronize()
    _assert_same(_snapshot(eager), _snapshot(graphed))
    assert float(graphed.state[graphed.param_groups[0]["params"][0]]["step"]) == 4


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["fp32", "bf16_master_amsgrad"])
def test_adamw_large(case, gen):
    """Sizes up to 2**20 + 3 (many blocks a tensor, full and tail blocks), an unaligned view
    among them: the 2x rule against torch after 3 steps."""
    dtype, hyper = CASES[case]
    hyper = dict(hyper)
    shapes = ((1,), (5000,), (65537,), (2**20 + 3,))
    params0 = make_params(dtype, gen, shapes)
    params0.append(torch.randn(4096 + 1, generator=gen, device=DEVICE).to(dtype)[1:])
    grads = make_grads(params0, 3, gen)
    mine, opt = train(lambda ps: AdamW(ps, **hyper), params0, grads)
    master = hyper.pop("master_weights", False)
    check(case, mine, opt, params0, grads, master_idx=range(len(mine)) if master else (), **hyper)
