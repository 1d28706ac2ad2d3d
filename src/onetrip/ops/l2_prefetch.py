"""Ask the L2 for a tensor's first bytes, from a kernel that only issues the requests.

A batch-1 decode step is a chain of GEMVs with an attention kernel between qkv and o:
8-64 programs that wait on one dependent load after another for ~0.3 MB, while the HBM
idles (~5 us a layer on an H200 for Llama-3.2-1B). The o projection's weight is known
before the step starts, so the engine launches this kernel on a side stream beside the
attention kernel for W_o (``models.fused.L2_PREFETCH``); the o GEMV then finds it in the
L2 (50 MB on an H100/H200). (Round 10 launched it beside every kernel, for the next
GEMV's weight: there it took bandwidth from the GEMV streaming beside it, slower in every
variant; benchmarks/NOTES.md.)

    mode "bulk": cp.async.bulk.prefetch.L2.global, one 4 KB request a thread (sm_90+,
                 served by the TMA unit)
    mode "line": prefetch.global.L2::evict_last, one 128-byte line a request (sm_80+),
                 marked to stay in the L2 ahead of lines streamed with the normal policy

Neither loads into registers nor writes memory, so a program exits once its requests are
issued (one warp, 128 requests: a few hundred cycles). The op has no result and changes
nothing: its reference is a no-op, and on the CPU (or under the interpreter, which has no
inline PTX) it only checks its arguments.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import is_interpreting

MODES = ("bulk", "line")
_REQUEST = {"bulk": 4096, "line": 128}  # bytes a request asks for
_PER_PROGRAM = 128  # requests a program issues: 4 per thread of one warp


@triton.jit
def _l2_prefetch_kernel(
    p_ptr,            # uint8 view of the bytes, 16-byte aligned
    nbytes,           # a multiple of the request size
    PER_PROGRAM: tl.constexpr,
    BULK: tl.constexpr,
):
    REQUEST: tl.constexpr = 4096 if BULK else 128
    i = tl.program_id(0) * PER_PROGRAM + tl.arange(0, PER_PROGRAM)
    # Past the end, a request repeats the last one (in bounds, and free: it is a hint).
    off = tl.minimum(i.to(tl.int64) * REQUEST, nbytes - REQUEST)
    if BULK:
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], 4096; mov.u32 $0, 0;", "=r,l",
                                  [p_ptr + off], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l",
                                  [p_ptr + off], dtype=tl.int32, is_pure=False, pack=1)


def _check(t: torch.Tensor, nbytes: int, mode: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(f"t must be contiguous (its first bytes are prefetched), got strides {t.stride()}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be an int >= 0, got {nbytes!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


@torch.library.custom_op("onetrip::l2_prefetch", mutates_args=())
def _prefetch_op(t: torch.Tensor, nbytes: int, mode: str) -> None:
    if not t.is_cuda or is_interpreting():
        return
    if mode == "bulk" and torch.cuda.get_device_capability(t.device) < (9, 0):
        mode = "line"  # the bulk form is Hopper's
    size = _REQUEST[mode]
    flat = t.reshape(-1).view(torch.uint8)
    skip = (-t.data_ptr()) % 16  # bulk requests start on 16 bytes
    n = (min(nbytes, flat.numel() - skip) // size) * size
    if n <= 0:
        return
    _l2_prefetch_kernel[(triton.cdiv(n // size, _PER_PROGRAM),)](
        flat[skip:], n, PER_PROGRAM=_PER_PROGRAM, BULK=mode == "bulk", num_warps=1)


@_prefetch_op.register_fake
def _(t, nbytes, mode):
    return None


def l2_prefetch(t: torch.Tensor, nbytes: int | None = None, *, mode: str = "bulk") -> None:
    """Ask the L2 for the first ``nbytes`` of ``t`` (all of it by default); returns at once.

    Args:
        t: a contiguous tensor of any dtype (a weight about to be streamed).
        nbytes: how many of its bytes, from the start (rounded down to whole requests:
            4 KB in "bulk" mode, 128 bytes in "line" mode). None: the whole tensor.
        mode: "bulk" (Hopper's bulk prefetch; "line" on older GPUs) or "line".

    One launch of ceil(requests / 128) one-warp programs on the current stream; nothing is
    read into registers or written, so it is capturable and changes no result. Meant for a
    side stream beside another kernel: see ``models.fused``'s batch-1 decode step.
    """
    nbytes = t.numel() * t.element_size() if nbytes is None and isinstance(t, torch.Tensor) else nbytes
    _check(t, nbytes, mode)
    if nbytes and t.numel():
        _prefetch_op(t, nbytes, mode)


def l2_prefetch_ref(t: torch.Tensor, nbytes: int | None = None, *, mode: str = "bulk") -> None:
    """A hint has no unfused form: nothing to compute, so nothing happens."""
    return None
