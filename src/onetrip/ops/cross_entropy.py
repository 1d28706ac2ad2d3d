"""Cross-entropy over a vocabulary: loss and gradient in one kernel pass per row.

Per row of logits x (V,), in float32, with z = softcap * tanh(x / softcap) when soft-capping:

    lse  = log sum_j exp(z_j)
    loss = (1 - eps) (lse - z_t) + eps (lse - mean_j z_j) + z_loss * lse^2
    dloss/dx_j = [p_j (1 + 2 z_loss lse) - eps / V - (1 - eps) [j == t]] * (1 - (z_j / softcap)^2)

with p = softmax(z), t the row's target and eps the label smoothing (as
``torch.nn.functional.cross_entropy`` defines it). A row whose target is ``ignore_index``
has loss 0 and gradient 0; "mean" divides by the number of other rows.

The kernels (``_cross_entropy_jit.py``; ``CrossEntropyConfig`` and its picks say how a row
is covered) read a row from HBM once (a wide row's gradient pass re-reads it from L2) and
write its gradient once: forward and backward move 2 x N x V x itemsize bytes (eager
PyTorch 3x that; docs/losses.md). The gradient is computed in the forward and saved (or
written over the logits); the backward multiplies it by the upstream gradient, and skips
even that when it is exactly 1.0.
"""

from __future__ import annotations

import functools
import math
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from ._cluster import cluster_ok, launch_clusters
from ._common import (as_rows, call_op, cdiv, check_same_device, check_tensor, empty_as, is_interpreting, needs_grad,
                      next_pow2, pdl_on, sm_count, use_triton)
from ._cross_entropy_jit import (_ce_loop_kernel, _ce_rows_kernel, _count_kernel, _loss_total_kernel, _rows_unfused,
                                 _scale_kernel)
from ._cross_entropy_picks import cross_entropy_config
from ._launch import launch, meta_key

REDUCTIONS = ("mean", "sum", "none")
TARGET_DTYPES = (torch.int32, torch.int64)


def _launch(x, target, scale, loss, lse, grad, ignore_index, smoothing, z_loss, softcap, overlap):
    """Launch as ``cross_entropy_config`` says; returns the compiled kernel (None under the interpreter)."""
    N, V = x.shape
    cfg = cross_entropy_config(N, V, x.element_size(), x.device)
    forward = loss is not None
    g = x if grad is None else grad
    stride_scale = scale.stride(0) if scale is not None and scale.numel() > 1 else 0
    pdl = overlap and pdl_on(x)  # the kernel before wrote scale (or nothing this one reads)
    args = (x, target, x if scale is None else scale, lse if loss is None else loss, lse, g)
    ints = (N, x.stride(0), g.stride(0), stride_scale, ignore_index, smoothing, z_loss, softcap if softcap > 0 else 1.0)
    flags = (V, softcap > 0, scale is not None, forward, grad is not None, pdl, cfg.num_warps, cfg.maxnreg)
    if cfg.mode == "rows":
        meta, key = _rows_meta(cfg.block_r, *flags)
        return launch(_ce_rows_kernel, (cdiv(N, cfg.block_r),), (*args, *ints), meta, key)
    meta = _meta(*flags)
    vec = 16 // x.element_size()
    # a row stride Triton does not mark divisible by 16: aligned steps (16-byte vectors) from before the row
    meta.update(LANES=32 * cfg.num_warps, VEC=vec, UNROLL=cfg.unroll, SHIFT=x.stride(0) % 16 != 0,
                G_ALIGNED=(g.stride(0) - x.stride(0)) % vec == 0, KEEP=cfg.keep_row and forward and grad is not None,
                SMOOTH=smoothing > 0)
    split = cfg.split
    if split > 1 and forward:  # the row's partial sums are exchanged
        if cluster_ok(x.device, split):
            kernel = launch_clusters(_ce_loop_kernel, N, split, *args, lse, *ints, SPLIT=split, CLUSTER=True,
                                     PASSES=0, **meta)
            if kernel is not None:
                return kernel
        elif is_interpreting():  # programs run one at a time: pass 1 and pass 2 as two launches
            part = torch.empty((N, split, 3), dtype=torch.float32, device=x.device)
            for passes in (1, 2):
                launch(_ce_loop_kernel, (N * split,), (*args, part, *ints),
                       dict(SPLIT=split, CLUSTER=False, PASSES=passes, **meta))
            return None
        split = 1
    return launch(_ce_loop_kernel, (N * split,), (*args, lse, *ints), dict(SPLIT=split, CLUSTER=False, PASSES=0, **meta))


def _meta(V: int, has_softcap: bool, has_scale: bool, forward: bool, write_grad: bool, pdl: bool, num_warps: int,
          maxnreg: int) -> dict:
    """Both kernels' constexprs and options."""
    return dict(V=V, HAS_SOFTCAP=has_softcap, HAS_SCALE=has_scale, FORWARD=forward, WRITE_GRAD=write_grad,
                PDL=int(pdl), num_warps=num_warps, **({"launch_pdl": True} if pdl else {}),
                **({"maxnreg": maxnreg} if maxnreg else {}))


@functools.lru_cache(maxsize=4096)
def _rows_meta(block_r: int, *flags) -> tuple[dict, int]:
    """``_meta`` of the "rows" kernel and its ``meta_key``: kept, as a launch needs them at every call."""
    meta = dict(BLOCK_R=block_r, BLOCK=next_pow2(flags[0]), **_meta(*flags))
    return meta, meta_key(meta)


def _run(x, target, scale, loss, lse, grad, ignore_index, smoothing, z_loss, softcap, overlap=False):
    if x.shape[0] == 0:
        return
    if use_triton(x):
        _launch(x, target, scale, loss, lse, grad, ignore_index, smoothing, z_loss, softcap, overlap)
        return
    l, s, g = _rows_unfused(x, target, scale, lse if loss is None else None, grad is not None,
                            ignore_index, smoothing, z_loss, softcap)
    if loss is not None:
        loss.copy_(l)
        lse.copy_(s)
    if grad is not None:
        grad.copy_(g)


@torch.library.custom_op("onetrip::cross_entropy", mutates_args=("loss", "lse", "grad"))
def _cross_entropy_op(logits: torch.Tensor, target: torch.Tensor, scale: Optional[torch.Tensor],
                      loss: Optional[torch.Tensor], lse: torch.Tensor, grad: Optional[torch.Tensor],
                      ignore_index: int, label_smoothing: float, z_loss: float, softcap: float,
                      overlap: bool = False) -> None:
    """logits (N, V) unit column stride; target (N,); scale None, (1,) or (N,) float32, the
    gradient's factor; loss (N,) float32 written with lse, or None: lse is read (the
    backward of reduction="none"); grad (N, V) written, or None. softcap 0: none. overlap:
    the last launch wrote scale and nothing else read here (``mean_scale``'s): PDL on Hopper."""
    _run(logits, target, scale, loss, lse, grad, ignore_index, label_smoothing, z_loss, softcap, overlap)


@_cross_entropy_op.register_fake
def _(logits, target, scale, loss, lse, grad, ignore_index, label_smoothing, z_loss, softcap, overlap=False):
    return None


@torch.library.custom_op("onetrip::cross_entropy_inplace_grad", mutates_args=("logits", "loss", "lse"))
def _cross_entropy_inplace_op(logits: torch.Tensor, target: torch.Tensor, scale: Optional[torch.Tensor],
                              loss: Optional[torch.Tensor], lse: torch.Tensor, ignore_index: int,
                              label_smoothing: float, z_loss: float, softcap: float, overlap: bool = False) -> None:
    """``onetrip::cross_entropy`` with the gradient written over logits."""
    _run(logits, target, scale, loss, lse, logits, ignore_index, label_smoothing, z_loss, softcap, overlap)


@_cross_entropy_inplace_op.register_fake
def _(logits, target, scale, loss, lse, ignore_index, label_smoothing, z_loss, softcap, overlap=False):
    return None


ONE_PROGRAM_ROWS = 65536  # the count and the loss total in one program up to this many rows; more: PyTorch's reductions
SMALL_BLOCK = 1024  # elements a step of those one-program kernels


@torch.library.custom_op("onetrip::count_valid", mutates_args=("out",))
def _count_op(target: torch.Tensor, out: torch.Tensor, ignore_index: int) -> None:
    """out (2,) float32 = (1 / n, n), n the targets (N,) not ignore_index."""
    N = target.shape[0]
    if use_triton(target) and N <= ONE_PROGRAM_ROWS:
        launch(_count_kernel, (1,), (target, out, N, ignore_index),
               dict(BLOCK=SMALL_BLOCK, PDL=int(pdl_on(target)), num_warps=4))
        return
    n = (target != ignore_index).sum().float()
    out.copy_(torch.stack((1.0 / n, n)))


@_count_op.register_fake
def _(target, out, ignore_index):
    return None


@torch.library.custom_op("onetrip::loss_total", mutates_args=("out",))
def _total_op(loss_rows: torch.Tensor, n_valid: Optional[torch.Tensor], target: Optional[torch.Tensor],
              out: torch.Tensor, overlap: bool, ignore_index: int) -> None:
    """out () float32 = sum of loss_rows (N,) float32, over n_valid (float32, one element) if
    given, else over the count of target (N,) not ignore_index if given."""
    N = loss_rows.shape[0]
    if use_triton(loss_rows) and N <= ONE_PROGRAM_ROWS:
        pdl = overlap and pdl_on(loss_rows)
        count = n_valid is None and target is not None
        n_ptr = n_valid if n_valid is not None else target if count else loss_rows
        launch(_loss_total_kernel, (1,), (loss_rows, n_ptr, out, N, ignore_index),
               dict(BLOCK=SMALL_BLOCK, MEAN=n_valid is not None or count, COUNT=count, PDL=int(pdl), num_warps=4,
                    **({"launch_pdl": True} if pdl else {})))
        return
    total = loss_rows.sum()
    if n_valid is None and target is not None:
        n_valid = (target != ignore_index).sum().float()
    out.copy_(total if n_valid is None else (total / n_valid).reshape(()))


@_total_op.register_fake
def _(loss_rows, n_valid, target, out, overlap, ignore_index):
    return None


SCALE_BLOCK = 4096  # elements a program of the scaling kernel a step
# Programs an SM (4 warps each: 16 fill it): one wave, which at grad_output = 1.0 exits after a
# load each, and otherwise walks the blocks at full occupancy.
SCALE_WAVE = 16


@torch.library.custom_op("onetrip::scale_grads", mutates_args=("grads",))
def _scale_grads_op(grads: List[torch.Tensor], grad_output: torch.Tensor) -> None:
    for g in grads:
        if g.numel() == 0:
            continue
        if not use_triton(g):
            g.mul_(grad_output)
            continue
        g2 = g.view(1, -1) if g.dim() < 2 else g
        M, K = g2.shape
        grid = min(M * cdiv(K, SCALE_BLOCK), SCALE_WAVE * sm_count(g.device))
        launch(_scale_kernel, (grid,), (g2, grad_output, M, K, g2.stride(0)), dict(BLOCK=SCALE_BLOCK, num_warps=4))


@_scale_grads_op.register_fake
def _(grads, grad_output):
    return None


def scale_saved_grads_once_(ctx, op: str, grads: Sequence[Optional[torch.Tensor]],
                            grad_output: torch.Tensor) -> None:
    """``scale_grads_`` on gradients an autograd.Function saved in its forward, which it scales
    in place: so only once. A second backward (``retain_graph=True``) raises, naming ``op``,
    instead of scaling them twice (checked eagerly; a traced graph runs its backward once)."""
    if not torch.compiler.is_compiling():
        if getattr(ctx, "saved_grads_scaled", False):
            raise RuntimeError(f"{op}: the saved gradients were scaled in place by the first backward; "
                               "a second backward (retain_graph=True) is not supported")
        ctx.saved_grads_scaled = True
    scale_grads_(grads, grad_output)


def scale_grads_(grads: Sequence[Optional[torch.Tensor]], grad_output: torch.Tensor) -> None:
    """Multiply each tensor of ``grads`` (None skipped; 1-D, or 2-D with unit stride along the
    last dimension) in place by the one-element ``grad_output``, read on the device: a
    saved gradient times the upstream gradient in a backward. When ``grad_output`` is
    exactly 1.0 (a loss that is the graph's root) one wave of programs reads that one value
    and moves nothing else; no host synchronisation, so capturable in a CUDA graph."""
    if grad_output.numel() != 1:
        raise ValueError(f"grad_output must have one element, got shape {tuple(grad_output.shape)}")
    todo = [g for g in grads if g is not None]
    for g in todo:
        if g.dim() > 2 or (g.dim() == 2 and g.stride(1) != 1 and g.shape[1] > 1) or (g.dim() == 1 and g.stride(0) != 1):
            raise ValueError(f"scale_grads_ takes 1-D contiguous or 2-D row-strided tensors, got shape "
                             f"{tuple(g.shape)}, strides {g.stride()}")
    if todo:
        call_op(_scale_grads_op, todo, grad_output.reshape(()))


def cross_entropy_grad_(
    logits: torch.Tensor,
    target: torch.Tensor,
    grad_scale: Optional[torch.Tensor] = None,
    *,
    lse: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
) -> tuple[Optional[torch.Tensor], torch.Tensor]:
    """Overwrite ``logits`` (N, V), float32/float16/bfloat16 with unit stride along V, with
    the gradient of the per-row loss times ``grad_scale``, in one launch: the building block
    of ``linear_cross_entropy``. Math and options as in ``cross_entropy``.

    target: (N,) int32/int64. grad_scale: None (1), or a float32 device tensor of one element
    (e.g. 1 / n_valid over all chunks) or of N (a factor a row: an upstream gradient).
    lse: None, or (N,) float32 from an earlier call on these logits: then only the gradient
    is written (one read of the row instead of two). Returns (loss, lse), (N,) float32 each
    (loss None when ``lse`` was given); ignored rows get loss, lse and gradient 0.
    """
    check_tensor("logits", logits, min_ndim=2)
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(f"logits must be (N, V) with unit stride along V, got shape {tuple(logits.shape)}, "
                         f"strides {logits.stride()}")
    N = logits.shape[0]
    check_target(target, (N,))
    check_same_device("logits", logits, target=target, grad_scale=grad_scale, lse=lse)
    if grad_scale is not None and (grad_scale.dtype != torch.float32 or grad_scale.numel() not in (1, N)):
        raise ValueError(f"grad_scale must be a float32 tensor of 1 or {N} elements, got {grad_scale.dtype} "
                         f"of shape {tuple(grad_scale.shape)}")
    loss = None
    if lse is None:
        loss = torch.empty(N, dtype=torch.float32, device=logits.device)
        lse = torch.empty(N, dtype=torch.float32, device=logits.device)
    elif lse.dtype != torch.float32 or tuple(lse.shape) != (N,):
        raise ValueError(f"lse must be ({N},) float32, got {lse.dtype} of shape {tuple(lse.shape)}")
    scale = None if grad_scale is None else grad_scale.reshape(-1)
    call_op(_cross_entropy_inplace_op, logits, target.contiguous(), scale, loss, lse.contiguous(),
            *check_loss_options(ignore_index, label_smoothing, z_loss, softcap))
    return loss, lse


def check_target(target: torch.Tensor, shape: Sequence[int]) -> None:
    """Raise naming ``target`` unless it is an int32/int64 tensor of ``shape``."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if target.dtype not in TARGET_DTYPES:
        raise TypeError(f"target has dtype {target.dtype}; allowed: int32, int64 (class indices)")
    if tuple(target.shape) != tuple(shape):
        raise ValueError(f"target has shape {tuple(target.shape)}; expected {tuple(shape)} (the logits' "
                         f"leading dimensions)")


def check_loss_options(ignore_index, label_smoothing, z_loss, softcap) -> tuple[int, float, float, float]:
    """The options checked (errors name the argument), in the custom ops' form: (ignore_index,
    label_smoothing, z_loss, softcap with 0.0 for none)."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int, got {ignore_index!r}")
    if not isinstance(label_smoothing, (int, float)) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be a float in [0, 1], got {label_smoothing!r}")
    if not isinstance(z_loss, (int, float)) or not 0.0 <= z_loss < math.inf:
        raise ValueError(f"z_loss must be a finite float >= 0, got {z_loss!r}")
    if softcap is not None and (not isinstance(softcap, (int, float)) or not 0.0 < softcap < math.inf):
        raise ValueError(f"softcap must be None or a finite float > 0, got {softcap!r}")
    return ignore_index, float(label_smoothing), float(z_loss), float(softcap or 0.0)


def _rows(logits, target):
    """logits as (N, V) rows, target as (N,), and empty float32 (N,) loss and lse rows."""
    x2, t1 = as_rows(logits, logits.shape[-1]), _flat(target)
    loss = torch.empty(x2.shape[0], dtype=torch.float32, device=logits.device)
    return x2, t1, loss, torch.empty_like(loss)


def _flat(target: torch.Tensor) -> torch.Tensor:
    """target as a contiguous (N,) tensor (itself when it is one: a reshape's view costs ~1.5 us)."""
    return target if target.dim() == 1 and target.is_contiguous() else target.reshape(-1).contiguous()


def mean_scale(target: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(1 / n_valid, n_valid), each a (1,) float32 tensor, of the
    (N,) contiguous ``target``, on the device (one kernel): no host sync. With every row
    ignored the scale is inf; the kernels give ignored rows 0, never inf x 0."""
    out = torch.empty(2, dtype=torch.float32, device=target.device)
    call_op(_count_op, _flat(target), out, ignore_index)
    return out[:1], out[1:]


def reduce_loss(loss_rows: torch.Tensor, reduction: str, n_valid: Optional[torch.Tensor],
                overlap: bool = False, target: Optional[torch.Tensor] = None, ignore_index: int = -100
                ) -> torch.Tensor:
    """Sum, or sum / n_valid (nan with every row ignored, as PyTorch gives), of float32 rows,
    in one kernel; ``overlap``: the kernel launched just before wrote ``loss_rows`` (PDL).
    "mean" without ``n_valid`` counts the (N,) contiguous ``target`` rows that are not
    ``ignore_index`` in the same kernel."""
    out = torch.empty((), dtype=torch.float32, device=loss_rows.device)
    n = None
    if reduction == "mean" and n_valid is not None:
        n = n_valid.float()
        n = n if n.dim() == 1 else n.reshape(1)
    elif reduction == "mean" and target is None:
        raise ValueError("reduce_loss: reduction='mean' needs n_valid or target")
    call_op(_total_op, loss_rows, n, target if reduction == "mean" and n is None else None, out, overlap,
            ignore_index)
    return out


class _CrossEntropyFunction(torch.autograd.Function):
    """mean/sum: the forward op writes loss and gradient; the backward scales the saved
    gradient in place. none: the forward saves logits and lse; the backward op writes the
    gradient scaled per row."""

    @staticmethod
    def forward(ctx, logits, target, options, reduction, inplace):
        x2, t1, loss_rows, lse = _rows(logits, target)
        if reduction == "none":
            call_op(_cross_entropy_op, x2, t1, None, loss_rows, lse, None, *options)
            ctx.save_for_backward(x2, t1, lse)
            loss = loss_rows.view(target.shape)
        else:
            scale, n_valid = mean_scale(t1, options[0]) if reduction == "mean" else (None, None)
            # Launches may overlap the kernel before (PDL) in eager code, where that kernel is known;
            # a traced graph may put another kernel between them.
            overlap = not torch.compiler.is_compiling()
            after_count = overlap and scale is not None  # the count kernel was the last launch
            if inplace:
                call_op(_cross_entropy_inplace_op, x2, t1, scale, loss_rows, lse, *options, after_count)
                if not torch.compiler.is_compiling():
                    # an op that saved these logits for its own backward now raises, not reads a gradient
                    torch.autograd.graph.increment_version(x2)
                grad = x2.detach()  # not a view made without grad of a tensor now modified: saveable
            else:
                grad = empty_as(x2)
                call_op(_cross_entropy_op, x2, t1, scale, loss_rows, lse, grad, *options, after_count)
            ctx.save_for_backward(grad)
            loss = reduce_loss(loss_rows, reduction, n_valid, overlap)
        ctx.args = (options, reduction, logits.shape)
        lse = lse.view(target.shape)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return loss, lse

    @staticmethod
    def backward(ctx, dloss, dlse=None):
        options, reduction, shape = ctx.args
        if dloss is None:
            return None, None, None, None, None
        if reduction == "none":
            x2, t1, lse = ctx.saved_tensors
            grad = empty_as(x2)
            call_op(_cross_entropy_op, x2, t1, dloss.reshape(-1), None, lse, grad, *options)
        else:
            (grad,) = ctx.saved_tensors
            scale_saved_grads_once_(ctx, "cross_entropy", [grad], dloss)
        return grad.view(shape), None, None, None, None


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    reduction: str = "mean",
    inplace_backward: bool = False,
    return_lse: bool = False,
):
    """Cross-entropy of ``logits`` against class indices ``target``, one kernel pass a row.

    Per row (module docstring for the gradient), in float32: z = softcap * tanh(x / softcap)
    (when ``softcap`` is given), lse = logsumexp(z), loss = (1 - eps)(lse - z[t]) +
    eps (lse - mean(z)) + z_loss * lse^2, with eps = ``label_smoothing`` as in
    ``torch.nn.functional.cross_entropy``.

    Args:
        logits: (..., V) float32, float16 or bfloat16, V >= 1; any row stride (copied once
            when the last dimension is strided).
        target: (...) int32 or int64, in [0, V) or ``ignore_index``. Not checked on the host
            (that would synchronise): a row whose target is out of range gets a NaN loss
            and a NaN gradient row, so the mean turns NaN.
        ignore_index: rows with this target give loss 0, gradient 0, lse 0, and are not read.
        reduction: "mean" (over the rows not ignored; NaN when all are, as PyTorch), "sum",
            or "none" ((...) losses).
        inplace_backward: write the gradient over ``logits`` instead of a new (N, V) buffer
            (mean/sum only). The caller gives ``logits`` up: after the call they hold the
            unscaled gradient, and an op that saved them for its backward raises there.
        return_lse: also return lse (...) float32 (not differentiable).

    Returns:
        loss: float32 whatever the logits' dtype (a scalar, or (...) for "none"); with
        ``return_lse``, (loss, lse). No host synchronisation (the count of rows not ignored
        stays on the device): capturable in a CUDA graph.

    Differentiable with respect to logits (gradient in the logits' dtype). mean/sum: the
    gradient is computed in the forward (one read of each row, plus a second from L2, and
    one write) and saved; the backward multiplies it by the upstream gradient in place
    (nothing moves when that is exactly 1.0), so it runs once (no retain_graph). "none":
    lse is saved and the backward reads the logits and writes the gradient scaled per row.
    """
    check_tensor("logits", logits)
    if logits.shape[-1] == 0:
        raise ValueError(f"logits has shape {tuple(logits.shape)}; the last dimension (classes) must be >= 1")
    check_target(target, logits.shape[:-1])
    check_same_device("logits", logits, target=target)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    options = check_loss_options(ignore_index, label_smoothing, z_loss, softcap)
    if needs_grad(logits):
        loss, lse = _CrossEntropyFunction.apply(logits, target, options, reduction, bool(inplace_backward))
        return (loss, lse) if return_lse else loss
    x2, t1, loss_rows, lse = _rows(logits, target)
    call_op(_cross_entropy_op, x2, t1, None, loss_rows, lse, None, *options)
    if reduction == "none":
        loss = loss_rows.view(target.shape)
    else:
        loss = reduce_loss(loss_rows, reduction, None, target=t1, ignore_index=ignore_index)  # counts for a mean
    return (loss, lse.view(target.shape)) if return_lse else loss


def cross_entropy_ref(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    reduction: str = "mean",
    return_lse: bool = False,
):
    """Unfused, op by op in the logits' dtype: tanh soft-capping, F.cross_entropy, and the
    z-loss from torch.logsumexp (masked and reduced as the loss). lse is float32 from the
    (capped) logits, 0 where the target is ignored."""
    z = logits if softcap is None else softcap * torch.tanh(logits / softcap)
    V = z.shape[-1]
    z2, t = z.reshape(-1, V), target.reshape(-1).long()
    loss = F.cross_entropy(z2, t, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction)
    valid = t != ignore_index
    lse = torch.logsumexp(z2, -1)
    if z_loss:
        zl = torch.where(valid, z_loss * lse * lse, 0.0)
        loss = loss + (zl if reduction == "none" else zl.sum() / valid.sum() if reduction == "mean" else zl.sum())
    if reduction == "none":
        loss = loss.view(target.shape)
    if return_lse:
        return loss, torch.where(valid, lse.float(), 0.0).view(target.shape)
    return loss
