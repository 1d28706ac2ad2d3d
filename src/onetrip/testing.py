"""The accuracy rule every onetrip kernel is held to.

    err(onetrip, exact) <= 2 * err(PyTorch in the input dtype, exact) + atol

"exact" is the op's reference evaluated on float64 copies of the inputs; "PyTorch in the
input dtype" is the same reference evaluated on the original inputs, i.e. what a user
gets from the unfused op-by-op code. Errors are max-abs over all elements. NaN or Inf
where the exact result is finite always fails (an unwritten, NaN-poisoned output shows
up this way).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Far below one unit in the last place of any output we produce (bf16's ulp at 1.0 is
# 7.8e-3, fp16's 9.8e-4, fp32's 1.2e-7), so it only matters where PyTorch's own error is
# exactly zero (width-1 rows, outputs that round exactly).
DEFAULT_ATOL = {torch.float32: 1e-6, torch.float16: 1e-5, torch.bfloat16: 1e-5}


def upcast(*tensors):
    """float64 copies of the floating-point tensors (None and integer tensors pass through)."""
    out = tuple(
        t.detach().to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in tensors
    )
    return out if len(out) != 1 else out[0]


@dataclass(frozen=True)
class ErrorReport:
    name: str
    max_err: float
    mean_err: float
    torch_max_err: float
    bound: float
    worst_index: tuple[int, ...]
    nonfinite: int

    @property
    def ok(self) -> bool:
        return self.nonfinite == 0 and self.max_err <= self.bound

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "FAIL"
        extra = f", {self.nonfinite} non-finite" if self.nonfinite else ""
        return (
            f"{self.name}: {verdict}: max err {self.max_err:.3e} (mean {self.mean_err:.3e}, worst at {self.worst_index}) "
            f"vs bound {self.bound:.3e} = 2 x PyTorch's {self.torch_max_err:.3e} + atol{extra}"
        )


def error_report(
    name: str, out: torch.Tensor, exact: torch.Tensor, torch_out: torch.Tensor, atol: float | None = None
) -> ErrorReport:
    if out.shape != exact.shape:
        raise AssertionError(f"{name}: shape {tuple(out.shape)} != expected {tuple(exact.shape)}")
    if atol is None:
        atol = DEFAULT_ATOL.get(out.dtype, 1e-6)
    exact = exact.detach().double().cpu()
    o = out.detach().double().cpu()
    t = torch_out.detach().double().cpu()
    finite = torch.isfinite(exact)
    nonfinite = int((~torch.isfinite(o) & finite).sum())
    err = torch.where(finite, (o - exact).abs(), torch.zeros_like(o)).nan_to_num(nan=float("inf"))
    terr = torch.where(finite, (t - exact).abs(), torch.zeros_like(t)).nan_to_num(nan=0.0)
    if err.numel() == 0:
        return ErrorReport(name, 0.0, 0.0, 0.0, atol, (), 0)
    flat = int(err.argmax())
    worst = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape))
    tmax = float(terr.max())
    return ErrorReport(name, float(err.max()), float(err.mean()), tmax, 2 * tmax + atol, worst, nonfinite)


def assert_close(
    name: str, out: torch.Tensor, exact: torch.Tensor, torch_out: torch.Tensor, atol: float | None = None
) -> ErrorReport:
    """Assert the rule; the message gives max and mean error and the worst index."""
    report = error_report(name, out, exact, torch_out, atol)
    if not report.ok:
        raise AssertionError(str(report))
    return report


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with NaN so that an element the kernel fails to write fails the check."""
    return t.fill_(float("nan"))


def strided_like(shape, dtype, device, kind: str = "contiguous", generator=None) -> torch.Tensor:
    """Fresh normal random data of ``shape`` in one of a few memory layouts.

    kind: "contiguous"; "rows" (every other row of a taller buffer, so rows have a
    larger stride); "transposed" (leading dims swapped, a layout no single row stride
    describes, so ops must copy it once); "padded" (each row sits in a wider buffer).
    """
    shape = tuple(shape)

    def randn(s):
        return torch.randn(s, dtype=torch.float32, device=device, generator=generator).to(dtype)

    if kind == "contiguous":
        return randn(shape)
    if kind == "rows":
        if len(shape) < 2:
            return randn(shape + (2,))[..., 0]
        return randn(shape[:-2] + (2 * shape[-2], shape[-1]))[..., ::2, :]
    if kind == "padded":
        return randn(shape[:-1] + (shape[-1] + 7,))[..., : shape[-1]]
    if kind == "transposed":
        if len(shape) < 3:
            return randn(shape[::-1]).t() if len(shape) == 2 else randn(shape)
        return randn((shape[1], shape[0]) + shape[2:]).transpose(0, 1)
    raise ValueError(f"kind must be one of contiguous, rows, padded, transposed; got {kind!r}")


def grads(fn, inputs: dict, grad_outputs) -> dict:
    """The gradients of ``fn(**inputs)`` (a tensor or a tuple of them) with respect to the
    floating-point tensors of ``inputs`` that require a gradient, given ``grad_outputs``
    (a tensor or tuple matching the outputs; None entries are skipped). Returns {name: grad}."""
    outs = fn(**inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    gos = grad_outputs if isinstance(grad_outputs, tuple) else (grad_outputs,)
    pairs = [(o, g) for o, g in zip(outs, gos) if g is not None]
    names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.requires_grad]
    got = torch.autograd.grad([o for o, _ in pairs], [inputs[k] for k in names], [g for _, g in pairs],
                              allow_unused=True)
    return dict(zip(names, got))


def assert_grads_close(name: str, fn, ref, inputs: dict, grad_outputs, atol: float | None = None) -> dict:
    """The accuracy rule for gradients: ``fn``'s gradients against ``ref``'s on float64 copies
    of ``inputs`` (exact) and ``ref``'s on the inputs themselves (PyTorch in the input dtype).

    ``inputs`` maps argument names to values; tensors that should get a gradient must require
    one. ``grad_outputs`` is the upstream gradient (a tensor, or a tuple for several outputs,
    None for an output that gets none), given in the outputs' dtype. Returns {name: report}.
    """
    def leaf(v, dtype=None):
        if not isinstance(v, torch.Tensor) or not v.is_floating_point():
            return v
        t = v.detach().to(dtype or v.dtype)
        return t.requires_grad_(v.requires_grad)

    def up(g):
        return tuple(None if t is None else t.double() for t in g) if isinstance(g, tuple) else g.double()

    mine = grads(fn, {k: leaf(v) for k, v in inputs.items()}, grad_outputs)
    exact = grads(ref, {k: leaf(v, torch.float64) for k, v in inputs.items()}, up(grad_outputs))
    theirs = grads(ref, {k: leaf(v) for k, v in inputs.items()}, grad_outputs)
    reports = {}
    for k, g in mine.items():
        if g is None or exact[k] is None:
            if (g is None) != (exact[k] is None):
                raise AssertionError(f"{name}: d{k} is {'missing' if g is None else 'unexpected'}")
            continue
        if g.dtype != inputs[k].dtype:
            raise AssertionError(f"{name}: d{k} has dtype {g.dtype}, its input {inputs[k].dtype}")
        reports[k] = assert_close(f"{name} d{k}", g, exact[k], theirs[k], atol)
    return reports
