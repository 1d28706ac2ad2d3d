"""AdamW over many parameters in one launch: a multi-tensor Triton kernel, its tables, and
``adamw_ref`` (one step of one parameter, op by op, in the kernel's order).

One step reads p, g, m, v and writes p, m, v: 28 bytes a float32 parameter, the floor.
``adamw_ref`` is a dozen PyTorch kernels a parameter, each a pass over memory;
``torch.optim.AdamW`` (foreach) groups them across parameters but still runs ~8 multi-tensor
kernels, each its own pass. Here every parameter of one (param group, dtype) is updated by one
launch that reads and writes each byte once:

    table (T, 8) int64   per tensor: addresses of param, grad, exp_avg, exp_avg_sq,
                         max_exp_avg_sq, fp32 master and step, then its element count
    work  (W, 2) int32   per program: (tensor, block); program w updates elements
                         [block * BLOCK, (block + 1) * BLOCK) of tensor work[w, 0]

The kernel casts each int64 address to a typed pointer. ``adamw_table`` builds both on the
host once; the caller reuses them while the addresses hold, so a step is launches only and a
CUDA graph can capture it. The step counts live on the device and ``bump_steps`` (one launch
for every tensor) advances them before the update reads them.

Bytes an element, read + write (the floor; the kernel moves exactly these):

    float32 param                              16 + 12 = 28
    16-bit param, float32 state                12 + 10 = 22
    16-bit param + float32 master              16 + 14 = 30
    amsgrad                                    +4 + 4
    check_finite (``find_nonfinite`` first)    + the grad again (4 or 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from ._common import cdiv, dtype_names
from ._jit import cast_out
from ._launch import cached_meta, launch

BLOCK = 2048  # elements a program; the elementwise ops' measured tile (_common.tile_config), not retuned here
NUM_WARPS = 4
_FLT_MAX = tl.constexpr(3.4028234663852886e38)  # largest finite float32
_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _update(p_ptr, g_ptr, m_ptr, v_ptr, vmax_ptr, master_ptr, offs, mask,
            decay, beta1, omb1, beta2, omb2, eps, step_size, bc2_sqrt, grad_scale,
            MASTER: tl.constexpr, AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr, HAS_SCALE: tl.constexpr):
    """One AdamW step of elements ``offs`` (``mask`` None: all in range), float32 math."""
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask)
    v = tl.load(v_ptr + offs, mask=mask)
    p_in = tl.load(p_ptr + offs, mask=mask)
    if HAS_SCALE:
        g = tl.div_rn(g, grad_scale)
    if MAXIMIZE:
        g = -g
    if MASTER:
        master = tl.load(master_ptr + offs, mask=mask)
        # An element written outside the optimizer (a model reload) no longer equals its
        # rounded master: the param is the truth and the master restarts from it.
        p = tl.where(p_in == cast_out(master, p_in.dtype), master, p_in.to(tl.float32))
    else:
        p = p_in.to(tl.float32)
    p = p * decay
    m = beta1 * m + omb1 * g
    v = beta2 * v + omb2 * g * g
    if AMSGRAD:
        vmax = tl.maximum(tl.load(vmax_ptr + offs, mask=mask), v, propagate_nan=tl.PropagateNan.ALL)
        tl.store(vmax_ptr + offs, vmax, mask=mask)
        vhat = vmax
    else:
        vhat = v
    denom = tl.div_rn(tl.sqrt_rn(vhat), bc2_sqrt) + eps
    p = p - tl.div_rn(step_size * m, denom)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    if MASTER:
        tl.store(master_ptr + offs, p, mask=mask)
    tl.store(p_ptr + offs, cast_out(p, p_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _adamw_kernel(
    table_ptr, work_ptr,                # (T, 8) int64 addresses and counts; (W, 2) int32 (tensor, block)
    lr_ptr, grad_scale_ptr, found_ptr,  # 1-element float32 device tensors, read when the flags say
    lr, decay, beta1, omb1, beta2, omb2, eps, weight_decay,  # decay = 1 - lr * weight_decay, omb = 1 - beta
    PARAM_DTYPE: tl.constexpr,
    MASTER: tl.constexpr,
    AMSGRAD: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    LR_TENSOR: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_FOUND: tl.constexpr,
    ALIGNED: tl.constexpr,  # every address 16-byte aligned
    BLOCK: tl.constexpr,
):
    w = tl.program_id(0).to(tl.int64)
    tensor = tl.load(work_ptr + 2 * w).to(tl.int64)
    start = tl.load(work_ptr + 2 * w + 1).to(tl.int64) * BLOCK
    row = table_ptr + tensor * 8
    p_ptr = tl.load(row).to(tl.pointer_type(PARAM_DTYPE))
    g_ptr = tl.load(row + 1).to(tl.pointer_type(PARAM_DTYPE))
    m_ptr = tl.load(row + 2).to(tl.pointer_type(tl.float32))
    v_ptr = tl.load(row + 3).to(tl.pointer_type(tl.float32))
    vmax_ptr = tl.load(row + 4).to(tl.pointer_type(tl.float32))
    master_ptr = tl.load(row + 5).to(tl.pointer_type(tl.float32))
    if ALIGNED:
        # A cast address has unknown alignment; the host checked 16 bytes, so accesses vectorize.
        p_ptr = tl.multiple_of(p_ptr, 16)
        g_ptr = tl.multiple_of(g_ptr, 16)
        m_ptr = tl.multiple_of(m_ptr, 16)
        v_ptr = tl.multiple_of(v_ptr, 16)
        vmax_ptr = tl.multiple_of(vmax_ptr, 16)
        master_ptr = tl.multiple_of(master_ptr, 16)
    n = tl.load(row + 7)
    # Bias corrections of this tensor's step t (already advanced): beta^t through float64
    # exp/log, so it rounds as a float32 pow would (libdevice's pow has no interpreter form).
    t = tl.load(tl.load(row + 6).to(tl.pointer_type(tl.float32))).to(tl.float64)
    bc1 = 1.0 - tl.exp(t * tl.log(tl.cast(beta1, tl.float64))).to(tl.float32)
    bc2 = 1.0 - tl.exp(t * tl.log(tl.cast(beta2, tl.float64))).to(tl.float32)
    if LR_TENSOR:
        lr = tl.load(lr_ptr)
        decay = 1.0 - lr * weight_decay
    step_size = tl.div_rn(lr, bc1)
    bc2_sqrt = tl.sqrt_rn(bc2)
    grad_scale = 1.0
    if HAS_SCALE:
        grad_scale = tl.load(grad_scale_ptr)
    offs = start + tl.arange(0, BLOCK)
    # Full blocks go unmasked: a mask against a count loaded at run time has unknown
    # alignment and would split every access to one element.
    full = start + BLOCK <= n
    tail = start + BLOCK > n
    if HAS_FOUND:
        # A non-finite gradient somewhere skips the whole step, decided on the device.
        live = tl.load(found_ptr) == 0
        full = full & live
        tail = tail & live
    if full:
        _update(p_ptr, g_ptr, m_ptr, v_ptr, vmax_ptr, master_ptr, offs, None,
                decay, beta1, omb1, beta2, omb2, eps, step_size, bc2_sqrt, grad_scale,
                MASTER, AMSGRAD, MAXIMIZE, HAS_SCALE)
    if tail:
        _update(p_ptr, g_ptr, m_ptr, v_ptr, vmax_ptr, master_ptr, offs, offs < n,
                decay, beta1, omb1, beta2, omb2, eps, step_size, bc2_sqrt, grad_scale,
                MASTER, AMSGRAD, MAXIMIZE, HAS_SCALE)


@triton.jit
def _nonfinite_kernel(table_ptr, work_ptr, grad_scale_ptr, found_ptr,
                      PARAM_DTYPE: tl.constexpr, HAS_SCALE: tl.constexpr, ALIGNED: tl.constexpr,
                      BLOCK: tl.constexpr):
    """found = 1 where a block's (unscaled) gradient holds a NaN or an Inf; a read-only pass."""
    w = tl.program_id(0).to(tl.int64)
    tensor = tl.load(work_ptr + 2 * w).to(tl.int64)
    start = tl.load(work_ptr + 2 * w + 1).to(tl.int64) * BLOCK
    row = table_ptr + tensor * 8
    g_ptr = tl.load(row + 1).to(tl.pointer_type(PARAM_DTYPE))
    if ALIGNED:
        g_ptr = tl.multiple_of(g_ptr, 16)
    n = tl.load(row + 7)
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:
        g = tl.load(g_ptr + offs).to(tl.float32)
    else:
        g = tl.load(g_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    if HAS_SCALE:
        g = tl.div_rn(g, tl.load(grad_scale_ptr))
    bad = tl.max((~(tl.abs(g) <= _FLT_MAX)).to(tl.int32), axis=0)  # NaN fails every comparison
    if bad > 0:
        tl.store(found_ptr, 1.0)  # racing programs store the same value


@triton.jit
def _bump_steps_kernel(steps_ptr, n, found_ptr, HAS_FOUND: tl.constexpr, BLOCK: tl.constexpr):
    """step += 1 (+ 0 when found_inf is set) for each address in steps_ptr[:n]."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    ptrs = tl.load(steps_ptr + i, mask=mask, other=0).to(tl.pointer_type(tl.float32))
    inc = 1.0
    if HAS_FOUND:
        inc = tl.where(tl.load(found_ptr) == 0, 1.0, 0.0)
    tl.store(ptrs, tl.load(ptrs, mask=mask) + inc, mask=mask)


@dataclass(frozen=True)
class AdamWTable:
    """The device tables of one launch (``adamw_table`` builds them): every tensor of one
    dtype, one device and one set of flags. ``keep`` holds the state tensors whose addresses
    the table stores, so they outlive it (params and grads belong to the caller)."""

    table: torch.Tensor  # (T, 8) int64
    work: torch.Tensor  # (W, 2) int32
    n_work: int
    dtype: torch.dtype
    amsgrad: bool
    master: bool
    aligned: bool
    block: int
    keep: tuple = ()


def is_dense(t: torch.Tensor) -> bool:
    """``t``'s elements fill one block of memory without gaps or overlap, in some order of
    dimensions (contiguous, transposed, permuted): an element-wise update can treat it as flat."""
    if t.numel() == 0:
        return True
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _to_device(rows, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    host = torch.as_tensor(rows, dtype=dtype)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)  # no host sync when a table is rebuilt
    return host.to(device)


def adamw_table(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor],
    steps: Sequence[torch.Tensor],
    *,
    max_exp_avg_sqs: Optional[Sequence[torch.Tensor]] = None,
    masters: Optional[Sequence[torch.Tensor]] = None,
    names: Optional[Sequence[str]] = None,
    block: int = BLOCK,
) -> AdamWTable:
    """Tables for ``adamw_launch`` over ``params`` (one dtype: float32, bfloat16 or float16;
    one device) with their ``grads`` (same dtype, shape and strides) and float32 state of
    the params' strides: exp_avgs, exp_avg_sqs, optional max_exp_avg_sqs (amsgrad) and
    masters (16-bit params), and 1-element float32 ``steps``. Every tensor must be dense
    (``is_dense``). ``names`` label the params in errors. Host work and one copy to the
    device; reuse the result while no tensor moves."""
    n = len(params)
    names = list(names) if names is not None else [f"params[{i}]" for i in range(n)]
    lists = {"grads": grads, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs, "steps": steps,
             "max_exp_avg_sqs": max_exp_avg_sqs, "masters": masters, "names": names}
    for what, seq in lists.items():
        if seq is not None and len(seq) != n:
            raise ValueError(f"{what} has {len(seq)} entries; params has {n}")
    if n == 0:
        raise ValueError("params is empty; a table needs at least one tensor")
    dtype, device = params[0].dtype, params[0].device
    if dtype not in _TL_DTYPES:
        raise TypeError(f"{names[0]} has dtype {dtype}; allowed: {dtype_names(_TL_DTYPES)}")
    rows, keep = [], []
    for i, p in enumerate(params):
        state = [exp_avgs[i], exp_avg_sqs[i]]
        state += [max_exp_avg_sqs[i]] if max_exp_avg_sqs is not None else []
        state += [masters[i]] if masters is not None else []
        _check_entry(names[i], p, grads[i], state, steps[i], dtype, device)
        rows.append([p.data_ptr(), grads[i].data_ptr(), exp_avgs[i].data_ptr(), exp_avg_sqs[i].data_ptr(),
                     max_exp_avg_sqs[i].data_ptr() if max_exp_avg_sqs is not None else 0,
                     masters[i].data_ptr() if masters is not None else 0,
                     steps[i].data_ptr(), p.numel()])
        keep += state + [steps[i]]
    aligned = all(a % 16 == 0 for row in rows for a in row[:6])
    counts = torch.tensor([cdiv(row[7], block) for row in rows], dtype=torch.int64)
    first = torch.cumsum(counts, 0) - counts
    n_work = int(counts.sum())
    work = torch.stack([torch.repeat_interleave(torch.arange(n), counts),
                        torch.arange(n_work) - torch.repeat_interleave(first, counts)], dim=1)
    return AdamWTable(
        table=_to_device(rows, torch.int64, device),
        work=_to_device(work, torch.int32, device), n_work=n_work,
        dtype=dtype, amsgrad=max_exp_avg_sqs is not None, master=masters is not None, aligned=aligned,
        block=block, keep=tuple(keep),
    )


def _check_entry(name, p, g, state, step, dtype, device):
    if p.dtype != dtype or p.device != device:
        raise TypeError(f"{name} is {p.dtype} on {p.device}; one table holds one dtype on one device "
                        f"({dtype} on {device})")
    if not isinstance(g, torch.Tensor) or g.is_sparse or g.layout != torch.strided:
        raise TypeError(f"{name}'s grad must be a dense (strided) tensor; sparse gradients are not supported")
    if g.dtype != dtype or g.shape != p.shape or g.device != device:
        raise TypeError(f"{name}'s grad is {g.dtype} {tuple(g.shape)} on {g.device}; "
                        f"the param is {dtype} {tuple(p.shape)} on {device}")
    if not is_dense(p):
        raise ValueError(f"{name} has shape {tuple(p.shape)} and strides {p.stride()}, which leave gaps; "
                         f"the optimizer needs dense params (contiguous or permuted); pass a .contiguous() copy")
    if p.numel() > 1 and g.stride() != p.stride():
        raise ValueError(f"{name}'s grad has strides {g.stride()}, the param {p.stride()}; they must match "
                         f"(autograd's grads do)")
    for s in state:
        if s.dtype != torch.float32 or s.device != device or s.shape != p.shape or \
                (p.numel() > 1 and s.stride() != p.stride()):
            raise ValueError(f"{name}'s state is {s.dtype} {tuple(s.shape)} {s.stride()} on {s.device}; "
                             f"expected float32 with the param's shape and strides on {device}")
    if step.dtype != torch.float32 or step.numel() != 1 or step.device != device:
        raise ValueError(f"{name}'s step is {step.dtype} of {step.numel()} elements on {step.device}; "
                         f"expected one float32 on {device}")


def step_table(steps: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """(S,) int64 addresses of 1-element float32 step tensors on ``device``, for ``bump_steps``."""
    return _to_device([s.data_ptr() for s in steps], torch.int64, device)


def bump_steps(steps: torch.Tensor, found_inf: Optional[torch.Tensor] = None) -> None:
    """Advance every step whose address ``steps`` holds by 1, or by 0 where ``found_inf`` is
    nonzero (a skipped step). One launch; no host synchronisation."""
    n = steps.numel()
    if n:
        launch(_bump_steps_kernel, (cdiv(n, 1024),), (steps, n, found_inf if found_inf is not None else steps),
               *cached_meta(HAS_FOUND=found_inf is not None, BLOCK=1024, num_warps=4))


def find_nonfinite(t: AdamWTable, found_inf: torch.Tensor, grad_scale: Optional[torch.Tensor] = None) -> None:
    """Set ``found_inf`` (1-element float32) to 1 if a gradient of the table, divided by
    ``grad_scale``, holds a NaN or an Inf; leave it otherwise. Reads the grads once."""
    if t.n_work:
        launch(_nonfinite_kernel, (t.n_work,),
               (t.table, t.work, grad_scale if grad_scale is not None else found_inf, found_inf),
               *cached_meta(PARAM_DTYPE=_TL_DTYPES[t.dtype], HAS_SCALE=grad_scale is not None, ALIGNED=t.aligned,
                            BLOCK=t.block, num_warps=NUM_WARPS))


def adamw_launch(
    t: AdamWTable,
    *,
    lr: float | torch.Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    maximize: bool = False,
    grad_scale: Optional[torch.Tensor] = None,
    found_inf: Optional[torch.Tensor] = None,
) -> None:
    """One AdamW step of every tensor in ``t``, in place, as ``adamw_ref`` computes it; the
    steps must already be advanced (``bump_steps``). ``lr``: a float (baked into a captured
    graph) or a 1-element float32 device tensor (read at run time). ``grad_scale``, ``found_inf``:
    1-element float32 device tensors: grads are divided by grad_scale; a nonzero found_inf
    skips the step on the device. One launch, no host synchronisation."""
    if not t.n_work:
        return
    lr_tensor = isinstance(lr, torch.Tensor)
    lr_f = 0.0 if lr_tensor else float(lr)
    dummy = t.table
    args = (t.table, t.work,
            lr if lr_tensor else dummy,
            grad_scale if grad_scale is not None else dummy,
            found_inf if found_inf is not None else dummy,
            lr_f, 1.0 - lr_f * float(weight_decay),  # decay in float64 on the host, as torch computes it
            float(beta1), 1.0 - float(beta1), float(beta2), 1.0 - float(beta2), float(eps), float(weight_decay))
    launch(_adamw_kernel, (t.n_work,), args,
           *cached_meta(PARAM_DTYPE=_TL_DTYPES[t.dtype], MASTER=t.master, AMSGRAD=t.amsgrad, MAXIMIZE=bool(maximize),
                        LR_TENSOR=lr_tensor, HAS_SCALE=grad_scale is not None, HAS_FOUND=found_inf is not None,
                        ALIGNED=t.aligned, BLOCK=t.block, num_warps=NUM_WARPS))


def adamw_ref(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: torch.Tensor,
    *,
    lr: float | torch.Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    max_exp_avg_sq: Optional[torch.Tensor] = None,
    master: Optional[torch.Tensor] = None,
    maximize: bool = False,
    grad_scale: Optional[torch.Tensor] = None,
    found_inf: Optional[torch.Tensor] = None,
) -> None:
    """One AdamW step of one parameter, in place, op by op in float32 in the kernel's order:

        t += 1;  g = grad / grad_scale (negated if maximize);  p *= 1 - lr * wd
        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g;  vmax = max(vmax, v) (amsgrad)
        p -= (lr / (1 - b1^t)) m / (sqrt(v or vmax) / sqrt(1 - b2^t) + eps)

    ``param`` float32, bfloat16 or float16; state float32 (exp_avg, exp_avg_sq, optional
    max_exp_avg_sq; ``master``, a float32 copy of a 16-bit param that the update works on, the
    param getting it rounded; a param element that no longer equals its rounded master restarts
    it); ``step`` a 1-element float32 tensor. A nonzero ``found_inf`` leaves everything as it
    was (a host check: this is the reference and the CPU path)."""
    if found_inf is not None and bool(found_inf.reshape(()) != 0):
        return
    step.add_(1)
    if isinstance(lr, torch.Tensor):
        lr = lr.reshape(())
    g = grad.float()
    if grad_scale is not None:
        g = g / grad_scale
    if maximize:
        g = -g
    if master is not None:
        master.copy_(torch.where(param == master.to(param.dtype), master, param.float()))
        p = master
    else:
        p = param if param.dtype == torch.float32 else param.float()
    p.mul_(1 - lr * weight_decay)
    exp_avg.mul_(beta1).add_((1 - beta1) * g)
    exp_avg_sq.mul_(beta2).add_((1 - beta2) * g * g)
    t = step.double().reshape(())
    bc1 = 1 - torch.pow(torch.tensor(beta1, dtype=torch.float32).double(), t).float()
    bc2 = 1 - torch.pow(torch.tensor(beta2, dtype=torch.float32).double(), t).float()
    step_size = lr / bc1
    if max_exp_avg_sq is not None:
        torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        vhat = max_exp_avg_sq
    else:
        vhat = exp_avg_sq
    denom = vhat.sqrt() / bc2.sqrt() + eps
    p.sub_(step_size * exp_avg / denom)
    if p is not param:
        param.copy_(p)
