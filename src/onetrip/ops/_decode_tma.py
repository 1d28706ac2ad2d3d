"""decode_attention's TMA path (``DecodeConfig.use_tma``, off by default: an experiment):
the K and V tiles of a contiguous cache read through Hopper tensor descriptors, so that
Triton's software pipeliner can keep ``num_stages - 1`` tiles in flight per program.

Why: at batch 1 bytes in flight per program bound the read. At batch 1 x 4K (32 / 8 heads,
head dim 128, bf16, 16.8 MB of K + V) the kernel's 64 programs read at 29% of copy on an
H200, and a plain Triton sum over the same bytes at 25% with 132 programs, 40% with 264,
53% with 528, 63% with 1056. Compiled for sm_90a (Triton 3.6) the pointer path, as a
launch at head dim 128 specializes it, already double-buffers its tiles through cp.async
(every thread issues 16-byte copies with their own 64-bit addresses and masks), yet
num_stages 2-4 timed alike there. A descriptor load is one instruction from one thread,
signalled through an mbarrier, that the pipeliner issues ``num_stages - 1`` tiles ahead
into as many buffers per tile (the same count as cp.async; prefill's switch to descriptors,
``_attention_tma.py``, gained 10-27%). Shared memory (128-key tiles, head dim 128, bf16):
64 KiB of K + V per buffer, 72 / 136 / 200 KiB at 2 / 3 / 4 stages; 64-key: 38 / 70 / 102.
At 1 stage nothing is pipelined and V's copy is issued only after K's has landed: two
round trips a tile (the pointer path issues both loads before it waits).

The descriptors see each cache as its 4-D tensor (batch, max_seq, kv_heads, head_dim) with
(1, BLOCK_N, 1, BLOCK_D) blocks; the copy engine clips every dimension on its own, so
head dims past head_dim and slots past max_seq read as zeros. Slots in [L, max_seq) are
inside the tensor and arrive as whatever the cache holds (the tests poison them with NaN):
their scores are masked to -inf as on the pointer path, and their V rows are zeroed
before P @ V (p = 0 there, but 0 * NaN = NaN). Only a split's last tile can hold such
slots, so the kernel's loop takes whole tiles and that ragged one follows it (RAGGED). A (batch * max_seq, kv_heads * head_dim)
2-D view would instead read the next sequence's rows and, at head dims below BLOCK_D, the
next head's columns: more to mask for nothing.

Built on the host (``TensorDescriptor``: the 128-byte tensor map travels by value as a
kernel parameter, no ``triton.set_allocator``; graph capturable). TMA's rules: unit stride
along head_dim, the base and every other stride 16-byte multiples (bf16: head_dim % 8 == 0).

APPEND (append_attention) works with descriptors too: split 0's writes of the new tokens go
to slots at or past the cached length, which the loop reads only as masked rows (whatever
the copy engine sees there, old or new, is discarded).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ._common import hopper_or_newer, is_interpreting

TMA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _kv_tile_tma(k_desc, v_desc, b, n0, kvh, j_ok, RAGGED: tl.constexpr):
    """The (BLOCK_N, BLOCK_D) K and V tiles of keys n0 + arange(BLOCK_N) of sequence b,
    kv head kvh, through the descriptors. RAGGED (the tile holding a split's end): V rows
    where not ``j_ok`` are zeroed (K rows there may hold anything: their scores are
    masked). Only that one tile pays for the ``where``: compiled for sm_90a it sends V
    from the copy's buffer through registers and back to shared memory (32 KiB more at
    128 x 128 bf16) before the MMA, where an unmasked V is read from the buffer directly."""
    k = k_desc.load([b, n0, kvh, 0])  # (1, BLOCK_N, 1, BLOCK_D)
    v = v_desc.load([b, n0, kvh, 0])
    k = k.reshape(k.shape[1], k.shape[3])
    v = v.reshape(v.shape[1], v.shape[3])
    if RAGGED:
        v = tl.where(j_ok[:, None], v, tl.zeros_like(v))
    return k, v


def _why_not(k_cache: torch.Tensor, v_cache: torch.Tensor, paged: bool) -> Optional[str]:
    """Why these caches cannot be read through descriptors, or None when they can."""
    if paged:
        return "the cache is paged (block_table given); TMA tiles need a contiguous cache"
    if k_cache.dtype not in TMA_DTYPES:
        return f"the cache has dtype {k_cache.dtype}; allowed: {', '.join(map(str, TMA_DTYPES))}"
    if k_cache.is_cuda:
        if not hopper_or_newer(k_cache):
            return "the GPU's compute capability is below 9.0 (TMA needs Hopper or newer)"
    elif not is_interpreting():
        return f"the cache is on {k_cache.device} without Triton's interpreter (TRITON_INTERPRET=1)"
    elem = k_cache.element_size()
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s <= 0 or s * elem % 16 for s in t.stride()[:-1]):
            return (f"{name} (strides {t.stride()}, address {t.data_ptr():#x}) is not TMA-aligned: unit stride "
                    f"along head_dim, the address and the other strides multiples of 16 bytes")
    return None


def kv_descriptors(k_cache: torch.Tensor, v_cache: torch.Tensor, paged: bool, block_n: int,
                   block_d: int) -> tuple[TensorDescriptor, TensorDescriptor]:
    """(k, v) descriptors with (1, block_n, 1, block_d) blocks over the 4-D caches; a
    ValueError naming ``config.use_tma`` when the caches do not allow it (``_why_not``).
    ``block_d`` may exceed head_dim: the columns past it load as zeros."""
    why = _why_not(k_cache, v_cache, paged)
    if why is not None:
        raise ValueError(f"config.use_tma=True but {why}; use_tma=False reads any cache with pointer loads")
    assert block_n <= 256 and block_d <= 256, "a TMA box is at most 256 elements a side"
    return tuple(TensorDescriptor(t, list(t.shape), list(t.stride()), [1, block_n, 1, block_d])
                 for t in (k_cache, v_cache))
