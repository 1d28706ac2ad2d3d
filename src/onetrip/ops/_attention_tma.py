"""flash_attention's Hopper path: when a call may read through the Tensor Memory Accelerator
(TMA), the descriptors it passes, and the tiles worth timing with it.

On sm_90 a TMA copy moves a whole (rows, head_dim) tile between global and shared memory
from one thread's instruction, signalled through an mbarrier, where the pointer path has
every thread compute 64-bit addresses and masks and issue cp.async. Compiled for sm_90a
(Triton 3.6), the TMA kernel keeps the pointer kernel's pipeline (the next K and V tiles
in flight while this tile's two MMAs run); per 64-key tile at head dim 128 (128 x 64, 8
warps) its loop body is 367 SASS instructions instead of 414 (masked tiles: 404, 466), and
it needs 16-32 KiB less shared memory (see TMA_TILES and tools/ptxas_report.py).

The kernel sees each of Q, K, V and O as a 4-D tensor (batch, seq, heads, head_dim) with
its own strides, so any layout whose strides are 16-byte multiples qualifies (contiguous,
a slice of a packed qkv projection, heads-major transposed), and the copy engine bounds
every dimension separately: rows past a sequence's end and head dims past head_dim read
as zeros and are never written, as with the pointer path's masks (a 2-D (B * S, H * D)
view would read the next batch's rows and the next head's columns instead).

Descriptors are built on the host (``triton.tools.tensor_descriptor.TensorDescriptor``):
the 128-byte tensor map travels by value as a kernel parameter, so no device allocator
(``triton.set_allocator``) is needed and a CUDA graph captures the launch like any other.
Varlen (packed) calls, float32, other devices and misaligned tensors use the pointer path.

Not here, with reasons: ``tl.range(warp_specialize=True)`` on the interior loop does not
suit this kernel on sm_90a with Triton 3.6: at 8 warps the compiler leaves the loop as it
is, at 4 warps with 128 query rows it aborts (WSDataPartition), and the tiles it does
split (64 rows, 4 warps) need 120-625 KiB of shared memory, so only some at head dim 64
fit in 227 KiB: worth timing there one day, not a candidate now. ``acc = tl.dot(p, v, acc)``
compiles to the same PTX as the kernel's ``acc * alpha + dot``: Triton folds the add already.
"""

from __future__ import annotations

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from ._common import hopper_or_newer, is_interpreting

TMA_DTYPES = (torch.float16, torch.bfloat16)

# (block_m, block_n, num_warps, num_stages) timed with TMA, by padded head dim: the three
# fastest spill-free pointer tiles of the H200 sweep at S >= 2K (tune-attention-h200-
# 20261121.json), so the tuner times each beside its pointer twin. Compiled for sm_90a
# (Triton 3.6), registers per thread causal / not, TMA (pointer), none spills:
#   64: 128x64 8w 124/124 (113/107), 128x64 4w 224/225 (230/228), 64x64 4w 124/124 (128/128)
#  128: 128x64 8w 174/170 (184/182), 128x128 8w 251/220 (255/236), 64x64 4w 170/170 (175/168)
# so no tile changes its CTAs per SM; shared memory is 16-32 KiB below the twin's (128 x 64
# at head dim 128: 96 KiB, not 128). 2 and 4 stages compile within 2 registers of these (4
# gained at most 2% over 3 with pointers: left out). 4 warps over 128 x 64 at head dim 128
# spill 92-272 bytes with or without TMA.
TMA_TILES = {
    64: ((128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3)),
    128: ((128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3)),
}
# Shorter queries are left to the pointer path: the bar (issue 3) is at seq >= 2048, and
# every TMA config costs a compile (~2 s) on the first call of a shape bucket.
TMA_MIN_SEQ = 1024


def _aligned(t: torch.Tensor) -> bool:
    """Nonempty, 4-D, unit stride along head_dim, base and other strides 16-byte multiples,
    and the dims nested in memory order (each stride at least the span of the dims inside
    it, rows padded or not), the layouts the GPU tests run through descriptors; others,
    e.g. transformers' (batch, heads, seq, head_dim) seen as (batch, seq, heads, head_dim),
    take the pointer path."""
    elem = t.element_size()
    if not (t.dim() == 4 and t.numel() > 0 and t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(s > 0 and s * elem % 16 == 0 for s in t.stride()[:-1])):
        return False
    return all(t.stride(i) >= t.shape[i + 1] * t.stride(i + 1) for i in range(3))


def tma_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, varlen: bool) -> bool:
    """True when the launch may take the USE_TMA path: dense (batch, seq, heads, head_dim)
    tensors of float16 / bfloat16 on a GPU of compute capability >= 9 (or on the CPU under
    Triton's interpreter, which emulates descriptors: the tests), every one aligned (see
    ``_aligned``). A few attribute reads: cheap enough for every launch."""
    if varlen or q.dtype not in TMA_DTYPES:
        return False
    if q.is_cuda:
        if not hopper_or_newer(q):
            return False
    elif not (q.device.type == "cpu" and is_interpreting()):
        return False
    return all(_aligned(t) for t in (q, k, v, out))


def descriptors(q, k, v, out, block_m: int, block_n: int, block_d: int) -> tuple:
    """(q, k, v, out) descriptors with (1, rows, 1, block_d) blocks: block_m query rows of
    one head for q and out, block_n key rows for k and v. ``block_d`` may exceed head_dim:
    the columns past it are zeros on load and dropped on store."""
    def desc(t, rows):
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, rows, 1, block_d])
    return desc(q, block_m), desc(k, block_n), desc(v, block_n), desc(out, block_m)
