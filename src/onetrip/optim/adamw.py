"""``AdamW``: torch.optim.AdamW's update with every parameter of a (param group, dtype) in one
Triton launch (``onetrip.ops.adamw``), float32 state for any param dtype, optional float32
master weights, and gradient unscaling / step skipping decided on the device.

    opt = AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, master_weights=True)
    loss.backward(); opt.step(); opt.zero_grad()

A step, per device: [found_inf zeroed and one read-only pass over the grads a launch group,
with ``check_finite``], one launch that advances every step count, one launch a (param group,
dtype). The tables behind the launches are built on the first step and rebuilt only when a
param or grad moves (``zero_grad`` to None and a backward that allocates elsewhere) or the
param groups change; otherwise a step is a check of the addresses and the launches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from onetrip.ops._common import use_triton
from onetrip.ops.adamw import adamw_launch, adamw_ref, adamw_table, bump_steps, find_nonfinite, is_dense, step_table

_PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class _DevicePlan:
    """What a step runs on one device: launches (group index, table) and the step-count table,
    or, where Triton does not run (CPU tensors without the interpreter), (group, param) pairs
    for ``adamw_ref``."""

    device: torch.device
    fused: bool
    launches: list = field(default_factory=list)
    params: list = field(default_factory=list)
    steps: Optional[torch.Tensor] = None
    found: Optional[torch.Tensor] = None  # check_finite's own found_inf


class AdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov & Hutter), torch.optim.AdamW's math in float32, for params of
    float32, bfloat16 or float16. For each param with a gradient, at step t:

        g = grad / grad_scale, negated if maximize;  p *= 1 - lr * weight_decay
        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  vmax = max(vmax, v)   (amsgrad)
        p -= lr / (1 - b1^t) * m / (sqrt(v or vmax) / sqrt(1 - b2^t) + eps)

    State per param (float32 whatever the param's dtype, laid out like the param): ``step``
    (a 1-element device tensor, advanced on the device), ``exp_avg``, ``exp_avg_sq``,
    ``max_exp_avg_sq`` (amsgrad), ``master`` (``master_weights`` and a 16-bit param: the
    float32 value the update works on; the param gets it rounded to nearest even, and an
    element changed outside the optimizer restarts the master from the param).

    Args beyond torch's (lr, betas, eps, weight_decay, amsgrad, maximize, per param group):
        master_weights: keep a float32 master of each 16-bit param (per group; ignored for
            float32 params).
        check_finite: before each step, one read-only pass over the grads (2 or 4 more bytes
            an element) sets found_inf when a grad holds a NaN or an Inf, and the step is
            skipped on the device.

    ``lr`` is a float (a captured step keeps the value it was captured with) or a 1-element
    float32 tensor on the params' device (read at run time, so a captured step follows
    ``lr.fill_``). Params must be dense (contiguous or permuted)
    with grads of the same strides; sparse grads and complex params raise TypeError. A step
    does not synchronise with the host and can be captured in a CUDA graph once one eager step
    has built the tables (the grads must then keep their addresses). GradScaler works with it
    the way it works with torch's fused optimizers (``grad_scale`` / ``found_inf``).
    """

    _step_supports_amp_scaling = True  # GradScaler then hands over grad_scale / found_inf

    def __init__(self, params, lr: float | torch.Tensor = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, *, amsgrad: bool = False, maximize: bool = False,
                 master_weights: bool = False, check_finite: bool = False):
        self.check_finite = bool(check_finite)
        self._plan: Optional[list[_DevicePlan]] = None
        self._plan_key: Optional[list] = None
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, master_weights=master_weights)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        try:
            _check_group(self.param_groups[-1], len(self.param_groups) - 1)
        except (TypeError, ValueError):
            self.param_groups.pop()
            raise
        self._plan = self._plan_key = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            for k, v in self.defaults.items():
                group.setdefault(k, v)
        self.__dict__.setdefault("check_finite", False)
        self._plan = self._plan_key = None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch's, but floating state stays float32 (torch casts it to each param's dtype)."""
        saved = state_dict["state"]
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        super().load_state_dict(state_dict)
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, p in zip(ids, params):
            for k, v in saved.get(pid, {}).items():
                if isinstance(v, torch.Tensor) and v.is_floating_point():
                    self.state[p][k] = v.detach().to(device=p.device, dtype=torch.float32, copy=True)
        self._plan = self._plan_key = None

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None, *, grad_scale: Optional[torch.Tensor] = None,
             found_inf: Optional[torch.Tensor] = None):
        """One step of every param with a gradient. ``grad_scale`` (1-element float32 tensor on
        the params' device): the grads are divided by it on the fly (they are left as they are
        in memory). ``found_inf`` (likewise): nonzero skips the step, steps included, on the
        device; with ``check_finite`` it is set to 1 when a grad is not finite. Without them,
        the ``grad_scale`` / ``found_inf`` attributes GradScaler sets are used."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if grad_scale is None:
            grad_scale = getattr(self, "grad_scale", None)
        if found_inf is None:
            found_inf = getattr(self, "found_inf", None)
        key = self._key()
        if key is None or key != self._plan_key:
            self._plan = self._build_plan()
            self._plan_key = self._key()  # after the build, which creates state
        for dev in self._plan:
            scale = _device_scalar("grad_scale", grad_scale, dev.device)
            found = _device_scalar("found_inf", found_inf, dev.device)
            if dev.fused:
                self._step_fused(dev, scale, found)
            else:
                self._step_unfused(dev, scale, found)
        return loss

    def _key(self) -> Optional[list]:
        """What the tables depend on: each param's and grad's address and the state flags."""
        key = [id(self.state), len(self.state)]  # state replaced or cleared: rebuild
        try:
            for group in self.param_groups:
                key += (group["amsgrad"], group["master_weights"])
                for p in group["params"]:
                    g = p.grad
                    key += (p.data_ptr(), None if g is None else g.data_ptr())
        except RuntimeError:  # a sparse grad has no data pointer: the build names it
            return None
        return key

    def _step_fused(self, dev: _DevicePlan, scale, found) -> None:
        if self.check_finite:
            if found is None:
                if dev.found is None:
                    dev.found = torch.zeros(1, dtype=torch.float32, device=dev.device)
                found = dev.found.zero_()
            for _, table in dev.launches:
                find_nonfinite(table, found, scale)
        bump_steps(dev.steps, found)
        for gi, table in dev.launches:
            group = self.param_groups[gi]
            beta1, beta2 = group["betas"]
            adamw_launch(table, lr=_lr(group, gi, dev.device), beta1=beta1, beta2=beta2, eps=group["eps"],
                         weight_decay=group["weight_decay"], maximize=group["maximize"],
                         grad_scale=scale, found_inf=found)

    def _step_unfused(self, dev: _DevicePlan, scale, found) -> None:
        if self.check_finite:
            bad = any(not bool(torch.isfinite(p.grad.float() / (scale if scale is not None else 1.0)).all())
                      for _, p in dev.params)
            if found is None:
                found = torch.tensor(float(bad), device=dev.device)
            elif bad:
                found.fill_(1.0)
        for gi, p in dev.params:
            group, st = self.param_groups[gi], self.state[p]
            beta1, beta2 = group["betas"]
            adamw_ref(p, p.grad, st["exp_avg"], st["exp_avg_sq"], st["step"], lr=_lr(group, gi, dev.device),
                      beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"],
                      max_exp_avg_sq=st["max_exp_avg_sq"] if group["amsgrad"] else None,
                      master=st.get("master") if group["master_weights"] else None,
                      maximize=group["maximize"], grad_scale=scale, found_inf=found)

    def _build_plan(self) -> list[_DevicePlan]:
        devices: dict[torch.device, _DevicePlan] = {}
        steps: dict[torch.device, list] = {}
        for gi, group in enumerate(self.param_groups):
            buckets: dict[tuple, list] = {}
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                name = f"param_groups[{gi}]['params'][{pi}]"
                _check_grad(name, p)
                st = self._init_state(p, group)
                dev = devices.setdefault(p.device, _DevicePlan(p.device, use_triton(p)))
                if dev.fused:
                    buckets.setdefault((p.device, p.dtype), []).append((name, p, st))
                    steps.setdefault(p.device, []).append(st["step"])
                else:
                    dev.params.append((gi, p))
            for (device, _), entries in buckets.items():
                names, ps, sts = zip(*entries)
                master = group["master_weights"] and ps[0].dtype != torch.float32
                table = adamw_table(
                    ps, [p.grad for p in ps], [s["exp_avg"] for s in sts], [s["exp_avg_sq"] for s in sts],
                    [s["step"] for s in sts], names=names,
                    max_exp_avg_sqs=[s["max_exp_avg_sq"] for s in sts] if group["amsgrad"] else None,
                    masters=[s["master"] for s in sts] if master else None)
                devices[device].launches.append((gi, table))
        for device, dev in devices.items():
            if dev.fused:
                dev.steps = step_table(steps[device], device)
        return list(devices.values())

    def _init_state(self, p: torch.Tensor, group: dict) -> dict:
        """Create the param's state, or bring loaded state to float32 on its device in its layout."""
        st = self.state[p]
        step = st.get("step")
        if step is None:
            st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        elif step.dtype != torch.float32 or step.device != p.device or step.dim() != 0:
            st["step"] = step.detach().to(device=p.device, dtype=torch.float32).reshape(()).clone()
        keys = ["exp_avg", "exp_avg_sq"] + ["max_exp_avg_sq"] * bool(group["amsgrad"])
        if group["master_weights"] and p.dtype != torch.float32:
            keys.append("master")
        for k in keys:
            s = st.get(k)
            if s is None:
                st[k] = p.detach().float() if k == "master" else \
                    torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
            elif s.dtype != torch.float32 or s.device != p.device or s.shape != p.shape or \
                    (is_dense(p) and p.numel() > 1 and s.stride() != p.stride()):
                st[k] = torch.empty_like(p, dtype=torch.float32, memory_format=torch.preserve_format).copy_(s)
        return st


def _check_group(group: dict, index: int) -> None:
    where = f"param_groups[{index}]"
    lr = group["lr"]
    if isinstance(lr, torch.Tensor):
        if lr.dtype != torch.float32 or lr.numel() != 1:
            raise TypeError(f"{where}['lr'] is a {lr.dtype} tensor of {lr.numel()} elements; "
                            f"a tensor lr must hold one float32")
    elif isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr >= 0:
        raise ValueError(f"{where}['lr'] is {lr!r}; expected a float >= 0 or a 1-element float32 tensor")
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2 or \
            not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
        raise ValueError(f"{where}['betas'] is {betas!r}; expected two floats in [0, 1)")
    for name in ("eps", "weight_decay"):
        v = group[name]
        if not isinstance(v, (int, float)) or not v >= 0:
            raise ValueError(f"{where}['{name}'] is {v!r}; expected a float >= 0")
    for i, p in enumerate(group["params"]):
        if p.is_complex():
            raise TypeError(f"{where}['params'][{i}] is complex ({p.dtype}); complex params are not "
                            f"supported (optimize torch.view_as_real(p) instead)")
        if p.dtype not in _PARAM_DTYPES:
            raise TypeError(f"{where}['params'][{i}] has dtype {p.dtype}; allowed: float32, bfloat16, float16")


def _check_grad(name: str, p: torch.Tensor) -> None:
    g = p.grad
    if g.is_sparse or g.layout != torch.strided:
        raise TypeError(f"{name} has a sparse gradient ({g.layout}); AdamW takes dense gradients")
    if g.dtype != p.dtype or g.shape != p.shape:
        raise TypeError(f"{name}'s grad is {g.dtype} {tuple(g.shape)}; the param is {p.dtype} {tuple(p.shape)}")


def _device_scalar(name: str, t, device: torch.device) -> Optional[torch.Tensor]:
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != 1:
        what = f"a {t.dtype} tensor of {t.numel()} elements" if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name} must be a 1-element float32 tensor, got {what}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}; the params are on {device}")
    return t


def _lr(group: dict, index: int, device: torch.device) -> float | torch.Tensor:
    lr = group["lr"]
    if isinstance(lr, torch.Tensor) and lr.device != device:
        raise ValueError(f"param_groups[{index}]['lr'] is a tensor on {lr.device}; the params are on {device}")
    return lr
