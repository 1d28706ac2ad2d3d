"""Cross-entropy of a linear layer's output, x @ weight.T + bias, without the (tokens, V) logits.

A language model's head turns N tokens of width H into N x V logits: at N = 16K tokens and
Llama-3's V = 128256 that is 4 GB in bfloat16 (8 GB more for a float32 loss and its
gradient), the largest activation of the step. Here the tokens go through in chunks: per
chunk of C tokens

    logits_c = x_c @ W.T (+ b)            torch.mm into one reused (C, V) buffer
    loss_c, dlogits_c (in place)          cross_entropy_grad_, one kernel, 1/n_valid on the device
    dx[chunk] = dlogits_c @ W             torch.mm(out=dx[chunk])
    dW += dlogits_c.T @ x_c               float32 accumulator (or the weight's dtype)
    db += sum over rows of dlogits_c

so the forward computes the gradients too, and the backward only scales them by the
upstream gradient (``scale_grads_``: nothing moves when it is exactly 1.0). FLOPs: three
matmuls of 2 N H V each (four for reduction="none", whose backward recomputes the
logits). Memory: one (C, V) buffer, dx, and the (V, H) gradient accumulator.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton

from ._common import check_dtype_match, check_same_device, check_shape, check_tensor, needs_grad
from .cross_entropy import (
    REDUCTIONS,
    check_loss_options,
    check_target,
    cross_entropy,
    cross_entropy_grad_,
    cross_entropy_ref,
    mean_scale,
    reduce_loss,
    scale_saved_grads_once_,
)

ACCUMULATIONS = ("float32", "weight_dtype")
CPU_CHUNK_BYTES = 256 * 2**20  # the logits buffer off CUDA, where no free-memory figure steers it
FREE_SHARE = 0.5  # of the device's free memory (driver's and PyTorch's cache) for the logits buffer
WEIGHT_SHARE = 4  # the logits buffer is at most 1 / WEIGHT_SHARE of the weight's bytes (chunk_tokens_for)


# A host query, constant to torch.compile: a traced call chunks as it did when traced.
@torch.compiler.assume_constant_result
def _free_bytes(index: int) -> int:
    free, _ = torch.cuda.mem_get_info(index)
    return free + torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)


def chunk_tokens_for(tokens: int, V: int, H: int, itemsize: int, device: torch.device) -> int:
    """Tokens a chunk: the fewest chunks whose (C, V) logits buffer fits the budget, then
    balanced (C = ceil(tokens / chunks)). Budget: a quarter of the weight's bytes (V H
    itemsize), so the buffer adds at most a quarter of the weight gradient that must exist
    anyway; and at most half the free memory on CUDA (the driver's free bytes plus
    PyTorch's cached unused blocks, read when called), 256 MiB elsewhere. On an H200 at
    (8192, 4096, 128256) bf16, weight-dtype accumulation: 1024-token chunks (this rule)
    42.8 ms and 1.29 GiB at peak, 256-token chunks 55.6 ms and 1.10 GiB, one chunk 40.8 ms
    and 3.0 GiB: each chunk re-reads and re-writes dW (2 V H x 2 or 4 bytes)."""
    if tokens <= 0:
        return 1
    budget = V * H * itemsize // WEIGHT_SHARE
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        budget = min(budget, int(_free_bytes(index) * FREE_SHARE))
    else:
        budget = min(budget, CPU_CHUNK_BYTES)
    fit = max(1, budget // (V * itemsize))
    return triton.cdiv(tokens, triton.cdiv(tokens, fit))


def _accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, first: bool) -> None:
    """acc (+)= a @ b, acc float32 or a's dtype; ``first`` writes instead of adding, so the
    accumulator needs no zero fill (beta=0 ignores its contents)."""
    beta = 0 if first else 1
    if acc.dtype == a.dtype:
        torch.addmm(acc, a, b, beta=beta, out=acc)
    elif acc.is_cuda:  # bfloat16/float16 operands, float32 output and accumulation in cuBLAS
        torch.addmm(acc, a, b, beta=beta, out_dtype=torch.float32, out=acc)
    else:  # no mixed-dtype matmul off CUDA: float32 copies of the chunk's operands
        torch.addmm(acc, a.float(), b.float(), beta=beta, out=acc)


def _logits(buf: torch.Tensor, xc: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    lc = buf[: xc.shape[0]]
    if bias is None:
        torch.mm(xc, weight.t(), out=lc)
    else:
        torch.addmm(bias, xc, weight.t(), out=lc)
    return lc


def _grad_chunks(x2, weight, bias, t1, kwargs, chunk, grads, *, scale=None, go=None, lse=None):
    """The chunk loop with gradients: per chunk the logits, the cross-entropy gradient in
    place (times ``scale`` (1,), or ``go`` (N,) per row with ``lse`` given), then dx, dW,
    db into ``grads`` = (dx (N, H) or None, dW accumulator or None, db accumulator or None).
    Returns the chunks' (loss, lse) lists (loss None with ``lse`` given)."""
    N, V = x2.shape[0], weight.shape[0]
    dx, dw, db = grads
    buf = torch.empty((min(chunk, N), V), dtype=x2.dtype, device=x2.device)
    losses, lses = [], []
    for s in range(0, N, chunk):
        e = min(N, s + chunk)
        xc = x2[s:e]
        lc = _logits(buf, xc, weight, bias)
        row_scale = scale if go is None else go[s:e]
        loss, lse_c = cross_entropy_grad_(lc, t1[s:e], row_scale, lse=None if lse is None else lse[s:e], **kwargs)
        losses.append(loss)
        lses.append(lse_c)
        if dx is not None:
            torch.mm(lc, weight, out=dx[s:e])
        if dw is not None:
            _accumulate(dw, lc.t(), xc, first=s == 0)
        if db is not None:
            part = lc.sum(0, dtype=torch.float32)
            if s == 0:
                db.copy_(part)
            else:
                db.add_(part)
    return losses, lses


def _loss_chunks(x2, weight, bias, t1, kwargs, chunk) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row loss and lse, (N,) float32 each, chunk by chunk without gradients."""
    N, V = x2.shape[0], weight.shape[0]
    buf = torch.empty((min(chunk, N), V), dtype=x2.dtype, device=x2.device)
    losses, lses = [], []
    for s in range(0, N, chunk):
        e = min(N, s + chunk)
        loss, lse = cross_entropy(_logits(buf, x2[s:e], weight, bias), t1[s:e], reduction="none", return_lse=True,
                                  **kwargs)
        losses.append(loss)
        lses.append(lse)
    empty = x2.new_empty(0, dtype=torch.float32)
    return (torch.cat(losses), torch.cat(lses)) if losses else (empty, empty)


def _accumulators(x2, weight, bias, needs, accumulation):
    """dx (N, H), and the dW, db accumulators (float32, or the parameter's dtype), each only
    where a gradient is asked for. With no tokens the accumulators are zeros."""
    need_x, need_w, need_b = needs
    alloc = torch.empty if x2.shape[0] else torch.zeros

    def accumulator(p):
        return alloc(p.shape, dtype=torch.float32 if accumulation == "float32" else p.dtype, device=x2.device)

    dx = torch.empty_like(x2, memory_format=torch.contiguous_format) if need_x else None
    return dx, accumulator(weight) if need_w else None, accumulator(bias) if need_b else None


class _LinearCrossEntropyFunction(torch.autograd.Function):
    """mean/sum: the forward runs the chunk loop with gradients and saves dx, dW, db; the
    backward scales them in place. none: the forward saves x, W, b, lse; the backward runs
    the loop again (a fourth matmul) with the upstream gradient per row."""

    @staticmethod
    def forward(ctx, x, weight, target, bias, kwargs, reduction, accumulation, chunk):
        H = x.shape[-1]
        x2, t1 = x.reshape(-1, H), target.reshape(-1).contiguous()
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[3])
        ctx.args = (kwargs, reduction, accumulation, chunk, x.shape, needs)
        ctx.set_materialize_grads(False)
        if reduction == "none":
            loss_rows, lse = _loss_chunks(x2, weight, bias, t1, kwargs, chunk)
            ctx.save_for_backward(x, weight, bias, target, lse)
            lse = lse.view(target.shape)
            ctx.mark_non_differentiable(lse)
            return loss_rows.view(target.shape), lse
        scale, n_valid = mean_scale(t1, kwargs["ignore_index"]) if reduction == "mean" else (None, None)
        dx, dw, db = _accumulators(x2, weight, bias, needs, accumulation)
        losses, lses = _grad_chunks(x2, weight, bias, t1, kwargs, chunk, (dx, dw, db), scale=scale)
        loss_rows = torch.cat(losses) if losses else x2.new_zeros(0, dtype=torch.float32)
        lse = torch.cat(lses) if lses else x2.new_zeros(0, dtype=torch.float32)
        dw = None if dw is None else dw.to(weight.dtype)
        db = None if db is None else db.to(bias.dtype)
        ctx.save_for_backward(dx, dw, db)
        lse = lse.view(target.shape)
        ctx.mark_non_differentiable(lse)
        return reduce_loss(loss_rows, reduction, n_valid), lse

    @staticmethod
    def backward(ctx, dloss, dlse=None):
        kwargs, reduction, accumulation, chunk, shape, needs = ctx.args
        if dloss is None:
            return (None,) * 8
        if reduction == "none":
            x, weight, bias, target, lse = ctx.saved_tensors
            x2, t1 = x.reshape(-1, shape[-1]), target.reshape(-1).contiguous()
            dx, dw, db = _accumulators(x2, weight, bias, needs, accumulation)
            _grad_chunks(x2, weight, bias, t1, kwargs, chunk, (dx, dw, db), go=dloss.reshape(-1).float(), lse=lse)
            dw = None if dw is None else dw.to(weight.dtype)
            db = None if db is None else db.to(bias.dtype)
        else:
            dx, dw, db = ctx.saved_tensors
            scale_saved_grads_once_(ctx, "linear_cross_entropy", [dx, dw, db], dloss)
        return None if dx is None else dx.view(shape), dw, None, db, None, None, None, None


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    reduction: str = "mean",
    return_lse: bool = False,
    accumulation: str = "float32",
    chunk_tokens: Optional[int] = None,
):
    """``cross_entropy(x @ weight.T + bias, target, ...)`` without holding the (tokens, V) logits.

    Args:
        x: (..., H) float32, float16 or bfloat16; any strides.
        weight: (V, H) of x's dtype. bias: (V,) of x's dtype, or None. The matmuls run in
            this dtype with float32 accumulation (cuBLAS); autocast does not apply.
        target, ignore_index, label_smoothing, z_loss, softcap, reduction, return_lse: as in
            ``cross_entropy`` (an out-of-range target gives a NaN loss and NaN gradients).
        accumulation: how dW and db sum over chunks. "float32" (default): a float32
            accumulator (V x H x 4 bytes), rounded to the weight's dtype once at the end.
            "weight_dtype": addmm into a gradient of the weight's dtype (beta=1), the least
            memory, one rounding a chunk. The same for float32 weights.
        chunk_tokens: tokens a chunk; None picks the fewest chunks whose (C, V) logits buffer
            fits a quarter of the weight's bytes and half the free device memory
            (``chunk_tokens_for``). The gradients' sums
            depend on the chunking: pass it for bit-reproducible runs.

    Returns:
        loss float32 (scalar, or (...) for "none"); with ``return_lse``, (loss, lse (...)
        float32). No host synchronisation besides the free-memory query when
        ``chunk_tokens`` is None (give it under CUDA-graph capture).

    Differentiable with respect to x, weight and bias (gradients in their dtypes).
    mean/sum: the gradients are computed in the forward (3 matmuls of 2 N H V FLOPs in
    all) and the backward scales them in place by the upstream gradient (no work at
    exactly 1.0); it runs once (no retain_graph). "none": the forward computes losses and
    lse only; the backward recomputes each chunk's logits (4 matmuls in all).
    """
    check_tensor("x", x)
    check_tensor("weight", weight, min_ndim=2)
    H = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != H or weight.shape[0] == 0:
        raise ValueError(f"weight has shape {tuple(weight.shape)}; expected (V, {H}) with V >= 1 "
                         f"(x's last dimension is {H})")
    V = weight.shape[0]
    check_dtype_match("weight", weight, "x", x)
    if bias is not None:
        check_tensor("bias", bias)
        check_shape("bias", bias, (V,), "weight's first dimension, V")
        check_dtype_match("bias", bias, "x", x)
    check_target(target, x.shape[:-1])
    check_same_device("x", x, weight=weight, bias=bias, target=target)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if accumulation not in ACCUMULATIONS:
        raise ValueError(f"accumulation must be one of {ACCUMULATIONS}, got {accumulation!r}")
    if chunk_tokens is not None and (isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int)
                                     or chunk_tokens < 1):
        raise ValueError(f"chunk_tokens must be None or an int >= 1, got {chunk_tokens!r}")
    check_loss_options(ignore_index, label_smoothing, z_loss, softcap)
    kwargs = dict(ignore_index=ignore_index, label_smoothing=float(label_smoothing), z_loss=float(z_loss),
                  softcap=softcap)
    tokens = target.numel()
    chunk = chunk_tokens or chunk_tokens_for(tokens, V, weight.shape[1], x.element_size(), x.device)
    if needs_grad(x, weight, bias):
        loss, lse = _LinearCrossEntropyFunction.apply(x, weight, target, bias, kwargs, reduction, accumulation, chunk)
    else:
        x2, t1 = x.reshape(-1, H), target.reshape(-1).contiguous()
        loss_rows, lse = _loss_chunks(x2, weight, bias, t1, kwargs, chunk)
        lse = lse.view(target.shape)
        if reduction == "none":
            loss = loss_rows.view(target.shape)
        else:
            loss = reduce_loss(loss_rows, reduction, None, target=t1, ignore_index=ignore_index)  # counts for a mean
    return (loss, lse) if return_lse else loss


def linear_cross_entropy_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    **kwargs,
):
    """Unfused: the (tokens, V) logits x @ weight.T + bias, then ``cross_entropy_ref``."""
    logits = x @ weight.t()
    if bias is not None:
        logits = logits + bias
    return cross_entropy_ref(logits, target, **kwargs)
