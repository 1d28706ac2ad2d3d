"""The tensor-parallel all-reduce fused with the residual add + RMSNorm that follows it.

    h      = x_0 + x_1 + ... + x_{W-1} (+ residual)       (returned: the next residual stream)
    normed = h / sqrt(mean(h^2) + eps) * weight            (Llama: the cast to x's dtype before the weight)

Each of the W ranks holds a partial x_r (the output of its slice of a row-parallel GEMV) and
gets both results. Modes (``make_comm``):
  * "nccl": ``dist.all_reduce`` of a copy of x, then ``add_rms_norm``: two launches and the
    sum rounded to x's dtype before the residual is added (any backend: gloo on the CPU).
  * "fused": one Triton kernel over symmetric memory (``torch.distributed._symmetric_memory``,
    peer-to-peer mappings only; NVLink multicast is never used). A program per row:
    1. push (the default): store this rank's row into its slot of every peer's symmetric buffer
       (the half this call uses), NVLink writes that need no reply; pull: into its own buffer;
    2. barrier with the same program on every peer: a release store of the call's epoch into
       each peer's flag slot (this rank, program), then an acquire spin until every peer's slot
       here holds it; no host barrier, no extra launch;
    3. load every rank's row (push: all in this rank's buffer; pull: from the peers' over NVLink),
       sum in float32 in rank order (the same bits on every rank), add the residual, store h
       rounded, normalize the unrounded sum, store normed.
    Rows beyond ``max_tokens`` (a prefill) take the "nccl" path.

Bytes a rank moves, for an M x N partial of b bytes: one-shot sends (push) or reads (pull)
(W - 1) M N b over NVLink (NCCL's ring: 2 (W - 1) / W M N b each way) and reads M N b (x, plus
the residual) locally, and writes 2 M N b (h, normed). At decode sizes (batch 1 x 8192 bf16:
16 KB, 36 ns of an H200's 450 GB/s of NVLink a direction) nothing of that is bandwidth: the
floor is a launch and a one-way NVLink write for the data and flags (push); pulling adds a
round trip for the loads (``docs/allreduce.md``).

Why the buffer has two halves: rank r may write its partial for call k + 1 while a slower peer
still reads r's partial of call k; the halves alternate by call, and r only writes a half again
(call k + 2) after the barrier of call k + 1 has shown that every peer started call k + 1, so
finished call k. The half is chosen on the device (an epoch counter in ``state``), not on the
host: a host counter baked into a CUDA graph repeats the same halves every replay, and a graph
with an odd number of calls would then use one half twice in a row.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from ._common import (FLOAT_DTYPES, as_rows, call_op, check_dtype_match, check_same_device, check_shape,
                      check_tensor, dtype_names, needs_grad, output, rows_out, sm_count, use_triton)
from ._jit import cast_out
from .norm import add_rms_norm, add_rms_norm_ref

MODES = ("auto", "nccl", "fused")
# A program holds its whole row in registers: at 8192 (8 warps) 76-107 registers a thread on sm_90
# (world 2-8), at 16384 (16 warps) 86; at 32768 the 128-register cap of 16 warps spills 96 bytes.
MAX_FUSED_HIDDEN = 32768
_FLAG_ALIGN = 256  # the flags start on their own 256-byte line after the data halves


@triton.jit
def _peer_ptr(table, q, DTYPE: tl.constexpr):
    """Rank q's symmetric buffer as a pointer to DTYPE. The allocations are 256-byte aligned: told so,
    the compiler moves 16-byte vectors (2-byte accesses otherwise, 8x the instructions)."""
    return tl.multiple_of(tl.load(table + q).to(tl.pointer_type(DTYPE)), 16)


@triton.jit
def _barrier(flag_table, pid, P, e, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Program ``pid``'s barrier with program ``pid`` of every peer for epoch ``e`` (int64).

    flags (WORLD, P) int64 per rank: slot [q, p] holds the last epoch rank q's program p
    signalled. Slots only grow, so a wait is ``>= e``: a fast peer may already have written
    e + 1 (it passed this barrier and started the next call)."""
    tl.debug_barrier()  # every thread's copy-in before the release below (bar.sync; the release is cumulative)
    flags_ptr = tl.load(flag_table + RANK).to(tl.pointer_type(tl.int64))
    for q in tl.static_range(WORLD):
        if q != RANK:
            peer = tl.load(flag_table + q).to(tl.pointer_type(tl.int64))
            tl.atomic_xchg(peer + RANK * P + pid, e, sem="release", scope="sys")
    for q in tl.static_range(WORLD):
        if q != RANK:
            seen = tl.atomic_add(flags_ptr + q * P + pid, 0, sem="acquire", scope="sys")
            while seen < e:
                seen = tl.atomic_add(flags_ptr + q * P + pid, 0, sem="acquire", scope="sys")
    tl.debug_barrier()  # no thread loads a peer's row before the acquire above


@triton.jit
def _allreduce_norm_kernel(
    x_ptr, r_ptr, w_ptr,              # x, r: (M, N) this rank's rows; w: (N,)
    y_ptr, h_ptr,                     # normed, h: (M, N)
    state_ptr,                        # int64 [epoch, programs finished]: this rank's call counter
    data_table,                       # int64 (WORLD,): every rank's symmetric data (2, WORLD, max_tokens, N)
    flag_table,                       # int64 (WORLD,): every rank's symmetric flags (WORLD, P) int64
    M, N, max_tokens, P,              # P: flag slots a rank (>= the grid)
    stride_xm, stride_rm, stride_ym, stride_hm,
    eps,
    RANK: tl.constexpr, WORLD: tl.constexpr,   # constexpr: the peer loop unrolls and skips this rank
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    PUSH: tl.constexpr,               # write this rank's rows into every peer's buffer (else: peers pull them)
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    col_ok = cols < N
    epoch = tl.load(state_ptr)
    # rank q's partial of a row sits in slot q of the call's half: of q's own buffer (pull), of the reader's (push)
    half = (epoch % 2) * WORLD * max_tokens * N  # the halves alternate by call
    buf_ptr = _peer_ptr(data_table, RANK, x_ptr.dtype.element_ty)
    n_rows = (M - pid + G - 1) // G  # this program's rows: pid, pid + G, ...
    # 1. this rank's rows into slot RANK of the half of this call: its own buffer's, or every peer's
    for i in range(0, n_rows):
        row = (pid + i * G).to(tl.int64)
        xr = tl.load(x_ptr + row * stride_xm + cols, mask=col_ok)
        at = half + (RANK * max_tokens + row) * N + cols
        if PUSH:
            for q in tl.static_range(WORLD):
                if q != RANK:
                    tl.store(_peer_ptr(data_table, q, x_ptr.dtype.element_ty) + at, xr, mask=col_ok)
        else:
            tl.store(buf_ptr + at, xr, mask=col_ok)
    # 2. every peer's copy-in of these rows is done
    _barrier(flag_table, pid, P, epoch + 1, RANK, WORLD)
    w = 0.0
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    # 3. sum in rank order, add, normalize
    for i in range(0, n_rows):
        row = (pid + i * G).to(tl.int64)
        acc = tl.zeros((BLOCK_N,), tl.float32)
        for q in tl.static_range(WORLD):
            if q == RANK:
                v = tl.load(x_ptr + row * stride_xm + cols, mask=col_ok, other=0.0)
            else:
                base = buf_ptr if PUSH else _peer_ptr(data_table, q, x_ptr.dtype.element_ty)
                # .cg: from the owner's L2 (over NVLink when pulling), never a stale line of this SM's L1
                v = tl.load(base + half + (q * max_tokens + row) * N + cols, mask=col_ok, other=0.0,
                            cache_modifier=".cg")
            acc += v.to(tl.float32)
        if HAS_RESIDUAL:
            acc += tl.load(r_ptr + row * stride_rm + cols, mask=col_ok, other=0.0).to(tl.float32)
        tl.store(h_ptr + row * stride_hm + cols, cast_out(acc, h_ptr.dtype.element_ty), mask=col_ok)
        y = acc * tl.rsqrt(tl.sum(acc * acc, axis=0) / N + eps)
        if HAS_WEIGHT:  # Llama: round to x's dtype, then multiply by the weight
            y = cast_out(y, y_ptr.dtype.element_ty).to(tl.float32) * w
        tl.store(y_ptr + row * stride_ym + cols, cast_out(y, y_ptr.dtype.element_ty), mask=col_ok)
    # 4. the last program to finish moves the epoch on (every program has read it by then)
    done = tl.atomic_add(state_ptr + 1, 1)
    if done == G - 1:
        tl.store(state_ptr, epoch + 1)
        tl.store(state_ptr + 1, 0)


def _num_warps(block_n: int) -> int:
    return max(1, min(16, block_n // 1024))  # 32 elements of the row a thread up to 16K wide (8192: 8 warps)


def _launch(x, residual, weight, y, h, state, data_table, flag_table, max_tokens, programs, eps, rank, world, push):
    M, N = x.shape
    block_n = triton.next_power_of_2(N)
    _allreduce_norm_kernel[(min(M, programs),)](
        x, residual if residual is not None else x, weight if weight is not None else x, y, h,
        state, data_table, flag_table,
        M, N, max_tokens, programs,
        x.stride(0), residual.stride(0) if residual is not None else 0, y.stride(0), h.stride(0),
        eps,
        RANK=rank, WORLD=world, HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None, PUSH=push,
        BLOCK_N=block_n, num_warps=_num_warps(block_n),
    )


# The symmetric buffers are reached through the address tables only, never as tensor arguments:
# under torch.compile a mutated argument may be a functional clone copied back after the op, and
# peers must see this rank's copy-in and flags in the symmetric memory while the kernel runs.
@torch.library.custom_op("onetrip::allreduce_rms_norm", mutates_args=("out", "h", "state"))
def _allreduce_norm_op(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                       out: torch.Tensor, h: torch.Tensor, state: torch.Tensor, data_table: torch.Tensor,
                       flag_table: torch.Tensor, max_tokens: int, programs: int, eps: float, rank: int,
                       world: int, push: bool) -> None:
    if not use_triton(x):
        raise RuntimeError("the fused all-reduce runs its Triton kernel only (CUDA, or TRITON_INTERPRET=1); "
                           "use make_comm(..., mode='nccl') elsewhere")
    _launch(x, residual, weight, out, h, state, data_table, flag_table, max_tokens, programs, eps, rank, world, push)


@_allreduce_norm_op.register_fake
def _(x, residual, weight, out, h, state, data_table, flag_table, max_tokens, programs, eps, rank, world, push):
    return None


@dataclass(frozen=True, eq=False)
class AllReduceComm:
    """What ``allreduce_add_rms_norm`` needs of a tensor-parallel group; built by ``make_comm``.

    mode "nccl" holds the group alone. Mode "fused" also holds this rank's symmetric memory:
    ``buf`` (2, world, max_tokens, hidden) of ``dtype`` (one half a call, a slot a rank's
    partial), ``flags`` (world, programs)
    int64 (the barrier's slots), ``state`` int64 [epoch, programs finished] (local), the
    tables of every rank's ``buf`` and ``flags`` addresses as this process maps them
    (``data_table``, ``flag_table``: int64 (world,)) and ``handle`` (the rendezvous, kept
    alive with the comm). ``programs``: the most programs a call launches (<= the SM count,
    so that all of them are resident and every spin can end). ``push``: each rank writes its
    partial into every peer's buffer before the barrier (else each reads its peers' after it).
    """

    group: Any
    rank: int
    world: int
    mode: str
    hidden: int
    max_tokens: int
    dtype: torch.dtype
    device: torch.device
    programs: int = 0
    buf: Optional[torch.Tensor] = None
    flags: Optional[torch.Tensor] = None
    state: Optional[torch.Tensor] = None
    data_table: Optional[torch.Tensor] = None
    flag_table: Optional[torch.Tensor] = None
    handle: Any = None
    push: bool = True


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _fused_problem(device: torch.device, world: int, hidden: int) -> str | None:
    """Why the fused mode cannot serve, or None."""
    if device.type != "cuda":
        return f"it needs CUDA tensors (device {device})"
    if not 2 <= world <= 8:
        return f"it serves 2 to 8 ranks of one node (world {world})"
    if hidden > MAX_FUSED_HIDDEN:
        return f"a program holds a whole row: hidden {hidden} > {MAX_FUSED_HIDDEN}"
    if not dist.is_initialized():
        return "torch.distributed is not initialized"
    return None


def _symmetric_buffers(group, rank, world, hidden, max_tokens, dtype, device):
    """Allocate and rendezvous this rank's symmetric buffer (a collective call); the fused
    fields of ``AllReduceComm``."""
    import torch.distributed._symmetric_memory as symm_mem

    # The kernel reads peers through their P2P mappings only: the rendezvous must not create a
    # multicast object (cuMulticastCreate); NVLink multicast is off on the machines it serves.
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    group = group if group is not None else dist.group.WORLD
    name = group.group_name
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None and not symm_mem.is_symm_mem_enabled_for_group(name):
        with warnings.catch_warnings():  # deprecated (no longer needed) in recent torch; required in older
            warnings.simplefilter("ignore", FutureWarning)
            enable(name)
    programs = max(1, min(max_tokens, sm_count(device)))
    elem = torch.empty((), dtype=dtype).element_size()
    data_bytes = 2 * world * max_tokens * hidden * elem
    flag_off = -(-data_bytes // _FLAG_ALIGN) * _FLAG_ALIGN
    raw = symm_mem.empty(flag_off + world * programs * 8, dtype=torch.uint8, device=device)
    raw[flag_off:].zero_()
    torch.cuda.synchronize(device)  # every rank's flags are zero before the rendezvous (a barrier) returns
    handle = symm_mem.rendezvous(raw, name)
    ptrs = list(handle.buffer_ptrs)
    if len(ptrs) != world or not all(ptrs):
        raise RuntimeError(f"symmetric memory maps {len(ptrs)} ranks' buffers ({ptrs}); all {world} are needed")
    shift = raw.data_ptr() - ptrs[rank]  # where the tensor sits in its allocation: the same on every rank
    data = [p + shift for p in ptrs]
    handle.barrier(channel=0)
    torch.cuda.synchronize(device)
    return dict(
        programs=programs,
        buf=raw[:data_bytes].view(dtype).view(2, world, max_tokens, hidden),
        flags=raw[flag_off:].view(torch.int64).view(world, programs),
        state=torch.zeros(2, dtype=torch.int64, device=device),
        data_table=torch.tensor(data, dtype=torch.int64, device=device),
        flag_table=torch.tensor([d + flag_off for d in data], dtype=torch.int64, device=device),
        handle=(handle, raw),
    )


def make_comm(group, rank: int, world: int, hidden: int, max_tokens: int, dtype: torch.dtype,
              device: torch.device | str, mode: str = "auto", *, push: bool = True) -> AllReduceComm:
    """An ``AllReduceComm`` for ``allreduce_add_rms_norm`` over ``group`` (a ProcessGroup, or
    None for the default group). A collective call in mode "fused" (and "auto" on CUDA): every
    rank makes it, with the same hidden, max_tokens and dtype.

    Args:
        rank, world: this rank's index in the group and the group's size (checked against it
            when torch.distributed is initialized; world 1 needs no group).
        hidden: the width of a row. max_tokens: the most rows a fused call takes (the symmetric
            buffer holds 2 x world x max_tokens rows: the decode batch); more rows (a prefill) go through
            NCCL.
        dtype: float32/float16/bfloat16, the dtype of every x. device: this rank's GPU.
        mode: "nccl" (``dist.all_reduce`` then ``add_rms_norm``; also the CPU / gloo path),
            "fused" (symmetric memory and one Triton kernel: CUDA, 2-8 ranks, hidden <= 32768),
            "auto" (fused where it can serve and the rendezvous works, else nccl).
        push: the fused mode's algorithm: each rank stores its partial into every peer's buffer
            before the barrier, so after it every load is local (True); or each rank loads its
            peers' partials over NVLink after the barrier (False: a round trip more).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    if not isinstance(push, bool):
        raise TypeError(f"push must be a bool, got {type(push).__name__}")
    _check_int("world", world, 1)
    _check_int("rank", rank, 0)
    if rank >= world:
        raise ValueError(f"rank {rank} is not below world {world}")
    _check_int("hidden", hidden, 1)
    _check_int("max_tokens", max_tokens, 1)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype {dtype} is not supported; allowed: {dtype_names(FLOAT_DTYPES)}")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if world > 1 and not dist.is_initialized():
        raise ValueError(f"world {world} needs torch.distributed initialized (dist.init_process_group)")
    if dist.is_initialized() and (world > 1 or group is not None):
        size, me = dist.get_world_size(group), dist.get_rank(group)
        if (size, me) != (world, rank):
            raise ValueError(f"rank {rank} of world {world} given, but the group has rank {me} of {size}")
    base = dict(group=group, rank=rank, world=world, hidden=hidden, max_tokens=max_tokens, dtype=dtype,
                device=device)
    problem = _fused_problem(device, world, hidden)
    if mode == "fused" and problem:
        raise ValueError(f"mode 'fused' cannot serve: {problem}")
    if mode == "nccl" or problem:
        return AllReduceComm(mode="nccl", **base)
    try:
        fused = _symmetric_buffers(group, rank, world, hidden, max_tokens, dtype, device)
    except RuntimeError:
        if mode == "fused":
            raise
        return AllReduceComm(mode="nccl", **base)
    return AllReduceComm(mode="fused", **base, **fused, push=push)


def _check(x, residual, weight, eps, comm, residual_out):
    if not isinstance(comm, AllReduceComm):
        raise TypeError(f"comm must be an AllReduceComm (make_comm), got {type(comm).__name__}")
    check_tensor("x", x)
    check_shape("x", x, (*x.shape[:-1], comm.hidden), f"the comm's hidden {comm.hidden} last")
    if x.dtype != comm.dtype:
        raise TypeError(f"x has dtype {x.dtype} but the comm was made for {comm.dtype}")
    if x.device != comm.device:
        raise ValueError(f"x is on {x.device} but the comm was made for {comm.device}")
    if residual is not None:
        check_tensor("residual", residual)
        check_shape("residual", residual, x.shape, "the shape of x")
        check_dtype_match("residual", residual, "x", x)
    elif residual_out is not None:
        raise ValueError("residual_out was given but residual is None; pass residual_out=None")
    if weight is not None:
        check_tensor("weight", weight)
        check_shape("weight", weight, (comm.hidden,), "the last dimension of x")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
        raise ValueError(f"eps must be a non-negative float, got {eps!r}")
    check_same_device("x", x, residual=residual, weight=weight)
    if needs_grad(x, residual, weight):
        raise ValueError("allreduce_add_rms_norm is not differentiable; call it under torch.no_grad() "
                         "or torch.inference_mode()")


def allreduce_add_rms_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                           eps: float, comm: AllReduceComm, out: Optional[torch.Tensor] = None, *,
                           residual_out: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(h) * weight, h) with h = the sum over the comm's ranks of x (+ residual).

    Args:
        x: (..., hidden) this rank's partial sum, of the comm's dtype and device, any strides.
            Not modified.
        residual: None, or like x (the same on every rank, as a TP residual stream is).
        weight: (hidden,) any float dtype, or None for no scale.
        eps: added to mean(h^2) under the square root.
        comm: from ``make_comm``. Every rank calls with the same shapes, in the same order,
            on one stream (a collective).
        out, residual_out: optional (..., hidden) outputs of x's dtype (``residual_out=residual``
            updates the residual stream in place).

    Returns:
        (normed, h) of x's dtype. Fused: the sum and the residual add in float32 in rank order,
        h rounded once, the statistics from the unrounded sum, the same bits on every rank;
        "nccl": h = (all-reduced x, rounded to x's dtype) + residual, as ``add_rms_norm``
        rounds it. The Llama convention: normed = weight * (h * rstd).to(x.dtype).

    One launch (fused) or NCCL's plus one; no host synchronisation: CUDA-graph capturable, the
    fused buffer's half chosen on the device, so a graph replays correctly any number of times.
    torch.compile(fullgraph=True) traces it (custom op ``onetrip::allreduce_rms_norm``). Not
    differentiable.
    """
    _check(x, residual, weight, eps, comm, residual_out)
    N = comm.hidden
    M = x.numel() // N
    if comm.mode == "nccl" or M > comm.max_tokens:
        return _nccl_path(x, residual, weight, eps, comm, out, residual_out)
    out = output("out", out, x.shape, x.dtype, x.device)
    h = output("residual_out", residual_out, x.shape, x.dtype, x.device)
    if M == 0:
        return out, h
    y2, y_scratch = rows_out(out, N)
    h2, h_scratch = rows_out(h, N)
    call_op(_allreduce_norm_op, as_rows(x, N), as_rows(residual, N) if residual is not None else None,
            weight.contiguous() if weight is not None else None, y2, h2, comm.state, comm.data_table,
            comm.flag_table, comm.max_tokens, comm.programs, float(eps), comm.rank, comm.world, comm.push)
    if y_scratch:
        out.copy_(y2.view(out.shape))
    if h_scratch:
        h.copy_(h2.view(h.shape))
    return out, h


def _nccl_path(x, residual, weight, eps, comm, out, residual_out):
    """dist.all_reduce of a copy of x (x is left as it was), then add_rms_norm."""
    s = x.clone(memory_format=torch.contiguous_format)
    if comm.world > 1 and s.numel():
        dist.all_reduce(s, group=comm.group)
    return add_rms_norm(s, residual, weight, eps, out=out, residual_out=residual_out)


def allreduce_add_rms_norm_ref(partials: Sequence[torch.Tensor], residual: Optional[torch.Tensor],
                               weight: Optional[torch.Tensor], eps: float = 1e-6, round_to=None):
    """Unfused, as a user writes it: the all-reduce (``sum(partials)``, every rank's x, added
    in rank order in their dtype as an all-reduce rounds), then ``add_rms_norm_ref`` (float32
    statistics). Float64 partials give the exact value; ``round_to``: the dtype of Llama's cast
    before the weight (see ``add_rms_norm_ref``)."""
    if not partials:
        raise ValueError("partials must hold every rank's x (at least one tensor)")
    total = partials[0]
    for p in partials[1:]:
        total = total + p
    return add_rms_norm_ref(total, residual, weight, eps, round_to=round_to)


__all__ = ["AllReduceComm", "make_comm", "allreduce_add_rms_norm", "allreduce_add_rms_norm_ref", "MODES",
           "MAX_FUSED_HIDDEN"]
