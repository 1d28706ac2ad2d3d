"""Residual add + RMSNorm / LayerNorm in one pass over HBM.

    h = x + residual                      (returned: the next residual stream)
    RMSNorm:   y = h / sqrt(mean(h^2) + eps) * w            (Llama: w applied after the
                                                             cast to x's dtype; Gemma: * (1 + w))
    LayerNorm: y = (h - mean(h)) / sqrt(var(h) + eps) * w + b

Bytes, for rows x N elements of b bytes each: the unfused reference reads x and r and
writes h (add kernel), then reads h and writes y (norm kernel): 5 passes. Fused: read x
and r, write h and y: 4 passes, the minimum. Without a residual the saving is in launches
and intermediates: HF's RMSNorm is ~7 kernels moving ~8 passes where one kernel moves 2.
The backward (``_norm_backward.py``, ``onetrip::norm_backward``) runs when an input requires a
gradient.

How rows are covered (``NormConfig.mode``):
  * "rows": a program holds ``block_m`` whole rows in registers (``block_n`` >= N). One
    read of each byte.
  * "coop": a wider row is split into C chunks of ``block_n`` held by C programs at once.
    Each writes its chunk's partial statistics, waits on a per-row counter until all C are
    in, combines them (Chan's formula for the variance) and normalizes the chunk it still
    holds. Programs take work in the order they start (a ticket counter), so a program only
    waits for chunks that are running or can start: no deadlock while C programs fit on the
    GPU at once, which is why "coop" is chosen only for C <= the number of SMs.
  * "two_pass": the same split in two launches (statistics, then apply), re-reading the
    chunk: under Triton's interpreter (which runs programs one after another and so cannot
    wait on a sibling) and for C above the SM count.
  * "loop": a program per row (or per segment of a row, ``split``) walks its chunks twice,
    statistics then apply; the second pass finds the row in L2, or in registers or shared
    memory (``_norm_jit.py`` describes each knob). Chosen where the tables of
    ``_norm_picks.py`` have the width and there is a row for every SM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ._cluster import cluster_ok, launch_clusters
from ._common import (
    FLOAT_DTYPES,
    acc_dtype,
    as_rows,
    call_op,
    cdiv,
    check_dtype_match,
    check_no_out,
    check_same_device,
    check_shape,
    check_tensor,
    empty_as,
    is_interpreting,
    needs_grad,
    next_pow2,
    output_like,
    pdl_args,
    pdl_mode,
    rows_out,
    use_triton,
)
from ._launch import launch, meta_key
from ._norm_backward import backward_unfused, launch_backward
from ._norm_kernel import _APPLY, _COOP, _LOOP, _ROWS, _STATS, _norm_kernel
from ._norm_l2 import requests as l2_requests
from ._norm_picks import (FEW_ROWS_GPU, LOOP_PICKS, PICKS_GPU, ROWS_PICKS, CacheHints, L2Requests, LoadOrder,
                          NormConfig, Reuse, Split, can_wait, launch_segments, norm_config)
from ._norm_smem import smem_fits


@dataclass(frozen=True)
class _Plan:
    """A launch of ``cfg`` as ``_plan`` lays it out: the split and segment, the
    buffers a split row needs, and each launch's (grid, meta, meta's key)."""

    cfg: NormConfig  # held, so that no other object takes the id of a given config, which keys the plan
    C: int  # chunks a row ("coop", "two_pass")
    seg: int  # a "loop" segment's columns
    part: Optional[tuple]  # the float32 partials' shape, or None
    sync: int  # int32 counters zeroed before the launch (0: none)
    cluster: Optional[tuple]  # a grid of clusters first: (clusters, ranks, meta), or None
    launches: tuple  # ((grid, meta, meta_key(meta)), ...), in order


MAX_PLANS = 4096  # past it the plans start over (a plan a row count, config and layout)
PLANS: dict = {}  # _launch's plans by call key


def clear_plans() -> None:
    """Forget the launch plans, so the next calls ask ``norm_config`` again (after a pick table
    is changed at run time, as ``tools/norm_ab.py`` does)."""
    PLANS.clear()


def _launch(x, residual, weight, bias, y, h, eps: float, is_rms: bool, gemma: bool,
            config: NormConfig | None = None):
    """Launch on validated 2-D views (unit column stride); ``h`` is None without a residual.
    Returns the compiled kernel of the last launch (its ``n_regs``, ``n_spills``) or None.

    The launches of a (config, rows, width, layout, device) are laid out once (``_plan``) and
    kept in ``PLANS`` (``clear_plans()`` empties it): a call then costs the key
    below, a dict lookup and the launches."""
    M, N = x.shape
    if M == 0 or N == 0:
        return None
    sx, sy = x.stride()[0], y.stride()[0]  # stride(0) parses its argument: twice stride()'s cost
    sr = residual.stride()[0] if residual is not None else 0
    sh = h.stride()[0] if h is not None else 0
    dense = sx == N and sy == N and (residual is None or sr == N) and (h is None or sh == N)
    # 16-byte alignment of x, y, residual: "loop" plans read it (the shared-memory segment, L2 requests)
    aligned = (not x.data_ptr() & 15) | (not y.data_ptr() & 15) << 1 | \
        (residual is None or not residual.data_ptr() & 15) << 2
    # a given config by id (its plan holds it, so no other object takes the id); else norm_config's
    key = (None if config is None else id(config), M, N, dense, x.dtype, x.get_device(), aligned, residual is None,
           weight is None, bias is None, is_rms, gemma, pdl_mode())
    plan = PLANS.get(key)
    if plan is None:
        cfg = config or norm_config(M, N, x.device, is_rms=is_rms, has_residual=residual is not None, dense=dense)
        plan = _plan(cfg, x, residual, weight, bias, y, h, dense, is_rms, gemma)
        if len(PLANS) >= MAX_PLANS:
            PLANS.clear()
        PLANS[key] = plan
    part = sync = x
    tail = (M, N, plan.C, plan.seg, sx, sr, sy, sh, eps)
    head = (x, residual if residual is not None else x, weight if weight is not None else x,
            bias if bias is not None else x, y, h if h is not None else x)
    if plan.cluster is not None:
        clusters, ranks, meta = plan.cluster
        kernel = launch_clusters(_norm_kernel, clusters, ranks, *head, part, sync, *tail, **meta)
        if kernel is not None:  # None when this Triton's launcher cannot be given a cluster size
            return kernel
    if plan.part is not None:
        part = torch.empty(plan.part, dtype=torch.float32, device=x.device)
    if plan.sync:
        sync = torch.zeros(plan.sync, dtype=torch.int32, device=x.device)
    args = (*head, part, sync, *tail)
    for grid, meta, meta_id in plan.launches:
        kernel = launch(_norm_kernel, grid, args, meta, meta_id)
    return kernel


def _plan(cfg: NormConfig, x, residual, weight, bias, y, h, dense: bool, is_rms: bool, gemma: bool) -> _Plan:
    """Lay out the launches of ``cfg`` over these views (``_launch``'s); raises ValueError
    for a config that does not fit the width (``launch_segments``)."""
    M, N = x.shape
    C = cdiv(N, cfg.block_n)
    split, seg = launch_segments(N, cfg)
    loop = cfg.mode == "loop"
    # A split row's programs wait on each other in one launch on a GPU; the interpreter runs
    # programs one at a time, so there the passes are two launches.
    wait = can_wait(x.device)
    # a cluster where one of `split` can be launched (Hopper); elsewhere the sums go through global memory
    cluster = loop and cfg.split.cluster and split > 1 and wait and cluster_ok(x.device, split)
    const_n = N if cfg.const_n and dense else 0
    # the shared-memory segment where a compiled kernel runs both passes, over dense rows of a
    # constant width cut into whole chunks (no masks: the copies have none), every row 16-byte
    # aligned (pass 2 reads 16-byte runs) and the segment fits (smem_fits); elsewhere pass 2 reads L2
    even = const_n > 0 and const_n == seg * split and seg % cfg.block_n == 0
    smem = bool(cfg.reuse.smem_segment and loop and cfg.block_m == 1 and residual is None and x.is_cuda
                and not is_interpreting() and (split == 1 or wait) and even
                and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0
                and smem_fits(seg, cfg.block_n, cfg.num_warps, x.element_size()))
    # half steps where shared memory serves and half a chunk still gives each thread runs of 8
    half_steps = cfg.order.half_steps and smem and smem_fits(seg, cfg.block_n // 2, cfg.num_warps, x.element_size())
    pdl = pdl_args(x)  # the launch's PDL arguments, also whether L2 requests may go before the wait
    ahead, first = l2_requests(cfg, x, residual, M, seg, even, cluster or split == 1, bool(pdl))

    def meta(phase, passes, clusters):
        return dict(
            IS_RMS=is_rms, GEMMA=gemma,
            HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            PHASE=phase.value, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_C=max(2, next_pow2(C)),
            CONST_N=const_n, LATE_WB=cfg.late_weight, PDL=pdl.get("PDL", 0),
            UNROLL=cfg.unroll, SPLIT=split, SEG_N=seg if const_n else 0, CLUSTER=clusters, PASSES=passes,
            KEEP_ROW=cfg.hints.keep_row, DROP_Y=cfg.hints.drop_y, KEEP_WB=cfg.hints.keep_weight,
            # (two launches: pass 2 cannot take pass 1's registers; shared memory holds the whole segment)
            HOLD=cfg.reuse.held_chunks if passes == 0 and not smem else 0,
            STORE_H=cfg.reuse.store_h_early and residual is not None, SMEM=smem,
            SMEM_PER_CHUNK=cfg.reuse.smem_sum_per_chunk and smem,
            WB_EARLY=cfg.order.early_weight_chunks if passes != 1 else 0,
            WB_WITH_COPIES=cfg.order.weight_with_copies, HALF_STEPS=half_steps and passes == 0,
            NEXT_FIRST=cfg.order.next_before_store, FMA=cfg.affine_fma,
            L2_FIRST=first, AHEAD=ahead if passes == 0 else 0, LANES=32 * cfg.num_warps if ahead or first else 32,
            num_warps=cfg.num_warps, **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}),
            **({"launch_pdl": pdl["launch_pdl"]} if pdl else {}),
        )

    part = None
    if cfg.mode in ("coop", "two_pass"):
        part = (M, C, 2)
    elif split > 1:
        part = (M, split, 3)
    sync = 1 + M if cfg.mode == "coop" or (split > 1 and wait) else 0
    phases = {"rows": ((_ROWS, 0),), "coop": ((_COOP, 0),), "two_pass": ((_STATS, 0), (_APPLY, 0)),
              "loop": ((_LOOP, 0),) if split == 1 or wait else ((_LOOP, 1), (_LOOP, 2))}[cfg.mode]
    grid = (cdiv(M, cfg.block_m) * (split if loop else C),)
    launches = []
    for phase, passes in phases:
        m = meta(phase, passes, False)
        launches.append((grid, m, meta_key(m)))
    return _Plan(cfg, C, seg, part, sync, (M, split, meta(_LOOP, 0, True)) if cluster else None, tuple(launches))


@torch.library.custom_op("onetrip::norm", mutates_args=("out", "residual_out"))
def _norm_op(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
             bias: Optional[torch.Tensor], out: torch.Tensor, residual_out: Optional[torch.Tensor],
             eps: float, is_rms: bool, gemma: bool) -> None:
    if use_triton(x):
        _launch(x, residual, weight, bias, out, residual_out, eps, is_rms, gemma)
        return
    if is_rms:
        y, h = add_rms_norm_ref(x, residual, weight, eps, gemma)
    else:
        y, h = add_layer_norm_ref(x, residual, weight, bias, eps)
    out.copy_(y)
    if residual_out is not None:
        residual_out.copy_(h)


@_norm_op.register_fake
def _(x, residual, weight, bias, out, residual_out, eps, is_rms, gemma):
    return None


@torch.library.custom_op("onetrip::norm_backward", mutates_args=("dx", "dweight", "dbias"))
def _norm_backward_op(dy: torch.Tensor, h: torch.Tensor, dh_out: Optional[torch.Tensor],
                      weight: Optional[torch.Tensor], dx: Optional[torch.Tensor], dweight: Optional[torch.Tensor],
                      dbias: Optional[torch.Tensor], eps: float, is_rms: bool, gemma: bool) -> None:
    if use_triton(h):
        launch_backward(dy, h, dh_out, weight, dx, dweight, dbias, eps, is_rms, gemma)
        return
    dh, dw, db = backward_unfused(dy, h, dh_out, weight, eps, is_rms, gemma)
    for grad, value in ((dx, dh), (dweight, dw), (dbias, db)):
        if grad is not None:
            grad.copy_(value)


@_norm_backward_op.register_fake
def _(dy, h, dh_out, weight, dx, dweight, dbias, eps, is_rms, gemma):
    return None


class _NormFunction(torch.autograd.Function):
    """The autograd path of the four ops: the forward op, then ``onetrip::norm_backward``.
    Saves h (x without a residual) and the weight; the statistics are recomputed."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, is_rms, gemma):
        y, h = _norm_forward(x, residual, weight, bias, eps, is_rms, gemma, None, None)
        ctx.save_for_backward(h, weight)
        ctx.args = (float(eps), is_rms, gemma, None if bias is None else bias.dtype)
        ctx.set_materialize_grads(False)  # an output without a gradient is neither read nor zero-filled
        return (y, h) if residual is not None else y

    @staticmethod
    def backward(ctx, dy, dh_out=None):
        h, weight = ctx.saved_tensors
        eps, is_rms, gemma, bias_dtype = ctx.args
        need_x, need_r, need_w, need_b = ctx.needs_input_grad[:4]
        N = h.shape[-1]
        if dy is None:  # only h was used: dx = dh_out; none for the weight and bias (as PyTorch gives)
            return (dh_out if need_x else None), (dh_out if need_r else None), None, None, None, None, None
        dx = empty_as(h) if need_x or need_r else None
        dw = torch.empty_like(weight) if need_w else None
        db = torch.empty(N, dtype=bias_dtype, device=h.device) if need_b else None
        call_op(_norm_backward_op, as_rows(dy, N), as_rows(h, N), as_rows(dh_out, N) if dh_out is not None else None,
                weight.contiguous() if weight is not None else None, as_rows(dx, N) if dx is not None else None,
                dw, db, eps, is_rms, gemma)
        return dx if need_x else None, dx if need_r else None, dw, db, None, None, None


def _norm(x, residual, weight, bias, eps, is_rms, gemma, out, residual_out):
    check_tensor("x", x)
    N = x.shape[-1]
    if residual is not None:
        check_tensor("residual", residual)
        check_shape("residual", residual, x.shape, "the shape of x")
        check_dtype_match("residual", residual, "x", x)
    elif residual_out is not None:
        raise ValueError("residual_out was given but residual is None; there is no sum to write")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            check_tensor(name, p, dtypes=FLOAT_DTYPES)
            check_shape(name, p, (N,), "the last dimension of x")
    if gemma and weight is None:
        raise ValueError("gemma=True scales by (1 + weight), so weight must not be None")
    if not isinstance(eps, (int, float)) or eps < 0:
        raise ValueError(f"eps must be a non-negative float, got {eps!r}")
    check_same_device("x", x, residual=residual, weight=weight, bias=bias)
    if needs_grad(x, residual, weight, bias):
        check_no_out("out", out)
        check_no_out("residual_out", residual_out)
        if residual is None:
            return _NormFunction.apply(x, None, weight, bias, eps, is_rms, gemma), x
        return _NormFunction.apply(x, residual, weight, bias, eps, is_rms, gemma)
    return _norm_forward(x, residual, weight, bias, eps, is_rms, gemma, out, residual_out)


def _norm_forward(x, residual, weight, bias, eps, is_rms, gemma, out, residual_out):
    """The forward on checked inputs: (normed, h), h being x without a residual."""
    N = x.shape[-1]
    out = output_like("out", out, x)
    y2, y_scratch = rows_out(out, N)
    h2 = h_scratch = None
    if residual is not None:
        residual_out = output_like("residual_out", residual_out, x)
        h2, h_scratch = rows_out(residual_out, N)
    call_op(_norm_op, as_rows(x, N), as_rows(residual, N) if residual is not None else None,
            weight.contiguous() if weight is not None else None, bias.contiguous() if bias is not None else None,
            y2, h2, float(eps), is_rms, gemma)
    if y_scratch:
        out.copy_(y2.view(out.shape))
    if h_scratch:
        residual_out.copy_(h2.view(residual_out.shape))
    return out, (residual_out if residual is not None else x)


def add_rms_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                 eps: float = 1e-6, *, gemma: bool = False, out: Optional[torch.Tensor] = None,
                 residual_out: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) * weight, x + residual) in one kernel.

    Args:
        x, residual: (..., N) float32/float16/bfloat16 of one dtype, any strides;
            ``residual=None`` gives plain RMSNorm of x.
        weight: (N,) any float dtype, or None for no scale.
        eps: added to mean(h^2) under the square root.
        gemma: False for Llama's convention, y = weight * (h * rstd).to(x.dtype);
            True for Gemma's, y = (h * rstd * (1 + weight)).to(x.dtype).
        out, residual_out: optional (..., N) outputs of x's dtype (``residual_out=residual``
            updates the residual stream in place).

    Returns:
        (normed, h) of x's dtype; h is x itself when residual is None. Statistics in
        float32 from the unrounded sum. One launch (two for rows wider than 16384 under the
        interpreter or past the SM count); no host synchronisation: CUDA-graph capturable.

    Differentiable with respect to x, residual and weight (``out``/``residual_out`` must then
    be None). Gradients flow into both outputs: dx = dresidual = dh + the gradient of h, with
    dh = rstd * (g - hn * mean(g * hn)), hn = h * rstd, g = dy * weight (Gemma: dy * (1 + weight));
    dweight = sum over rows of dy * hn, in the weight's dtype, the same bits run to run.
    The backward recomputes rstd from the saved h in float32 (``_norm_backward``).
    """
    return _norm(x, residual, weight, None, eps, True, gemma, out, residual_out)


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float = 1e-6, *, gemma: bool = False,
             out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """RMSNorm(x) * weight; ``add_rms_norm`` with no residual (differentiable in x and weight)."""
    return _norm(x, None, weight, None, eps, True, gemma, out, None)[0]


def add_layer_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                   bias: Optional[torch.Tensor], eps: float = 1e-5, *, out: Optional[torch.Tensor] = None,
                   residual_out: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(LayerNorm(x + residual) * weight + bias, x + residual) in one kernel.

    Same contract as ``add_rms_norm``; weight and bias (N,) or None. Mean and variance in
    float32 (per-chunk mean and M2 combined exactly for split rows), biased variance as in
    ``torch.nn.functional.layer_norm``.

    Differentiable with respect to x, residual, weight and bias: with hn = (h - mean) * rstd,
    g = dy * weight, dh = rstd * (g - mean(g) - hn * mean(g * hn)) plus h's gradient,
    dweight = sum over rows of dy * hn, dbias = sum over rows of dy.
    """
    return _norm(x, residual, weight, bias, eps, False, False, out, residual_out)


def layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float = 1e-5,
               *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """LayerNorm(x) * weight + bias; ``add_layer_norm`` with no residual (differentiable in x,
    weight and bias)."""
    return _norm(x, None, weight, bias, eps, False, False, out, None)[0]


# -- references: op by op, as a user would write them (HF transformers' modules) -------------

def add_rms_norm_ref(x, residual, weight, eps=1e-6, gemma=False, round_to=None):
    """Unfused: the add rounds to x's dtype, then HF's LlamaRMSNorm / GemmaRMSNorm.

    ``round_to``: the dtype the normalized value is cast to before Llama's weight multiply
    (default: x's dtype). The cast is part of that convention's definition, so an exact
    (float64) evaluation of a bf16 op passes ``round_to=torch.bfloat16``.
    """
    h = x if residual is None else x + residual
    hf = h.to(acc_dtype(h))
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is None:
        return y.to(h.dtype), h
    if gemma:
        return (y * (1.0 + weight.to(hf.dtype))).to(h.dtype), h
    return (weight * y.to(round_to or h.dtype)).to(h.dtype), h


def rms_norm_ref(x, weight, eps=1e-6, gemma=False, round_to=None):
    return add_rms_norm_ref(x, None, weight, eps, gemma, round_to)[0]


def add_layer_norm_ref(x, residual, weight, bias, eps=1e-5):
    """Unfused: the add rounds to x's dtype, then ``F.layer_norm`` (upcast if dtypes are mixed)."""
    h = x if residual is None else x + residual
    params = [p for p in (weight, bias) if p is not None]
    if all(p.dtype == h.dtype for p in params):
        return F.layer_norm(h, (h.shape[-1],), weight, bias, eps), h
    acc = acc_dtype(h)
    y = F.layer_norm(h.to(acc), (h.shape[-1],), weight.to(acc) if weight is not None else None,
                     bias.to(acc) if bias is not None else None, eps)
    return y.to(h.dtype), h


def layer_norm_ref(x, weight, bias, eps=1e-5):
    return add_layer_norm_ref(x, None, weight, bias, eps)[0]


# the ops and references, and (for tests and benchmarks) the config chooser and its tables
__all__ = ["add_rms_norm", "add_rms_norm_ref", "rms_norm", "rms_norm_ref", "add_layer_norm", "add_layer_norm_ref",
           "layer_norm", "layer_norm_ref", "norm_config", "NormConfig", "Split", "CacheHints", "Reuse", "LoadOrder",
           "L2Requests", "LOOP_PICKS", "ROWS_PICKS", "PICKS_GPU", "FEW_ROWS_GPU"]
