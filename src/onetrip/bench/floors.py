"""What a plain kernel moving the same bytes reaches: the practical ceiling of a cell, timed
exactly as the providers are (same graph of calls over the same number of input copies).

The copy bandwidth of the suites (``device.copy_bandwidth_gbs``: 1 GiB, device to device)
is what a long kernel reaches. A short one pays its ramp-up and tail on top: on an H200 a
kernel moving 64 MiB runs ~16 us and reaches ~88% of that copy, one reading the 16.8 MB of
K and V of a batch-1 x 4K decode cell ~63-69%. These references put that ceiling beside
every cell:

    size_copy_gbs   an element-wise kernel (``torch.neg`` on bf16): half the bytes read, half
                    written, as the row ops move them
    read_gbs        a grid-stride sum over two tensors (a decode cell's K and V caches):
                    every byte read once, next to nothing written, as decode attention
    read_chain_ms   that read, one launch a tensor, over a decode step's weight matrices in
                    the order the step reads them, as one CUDA graph: what a step of that
                    many kernels can reach if each of them were a perfect read

Both return None where they cannot run (out of memory, no GPU). Not ``copy_``: captured
in a graph it becomes a copy-engine memcpy node (~2.7 TB/s on an H200, against ~4.25
for a kernel).
"""

from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from . import harness

READ_BLOCK = 4096  # elements a program reads a step (8 KB of bf16, 16 bytes a thread at 8 warps)
READ_PROGRAMS_PER_SM = 8  # H200: 16.8 MB read at 63% of copy, against 53% at 4 a SM and 54% at 16


@triton.jit
def _read_kernel(a_ptr, b_ptr, part_ptr, n, BLOCK: tl.constexpr):
    """part[pid] = sum of this program's blocks of a and b (n elements each), grid-stride:
    programs that run together read neighbouring blocks."""
    pid = tl.program_id(0)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    acc = tl.zeros((BLOCK,), tl.float32)
    start = pid.to(tl.int64) * BLOCK
    while start < n:
        offs = start + tl.arange(0, BLOCK)
        ok = offs < n
        acc += tl.load(a_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        acc += tl.load(b_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        start += step
    tl.store(part_ptr + pid, tl.sum(acc))


def read_gbs(pairs: list[tuple[torch.Tensor, torch.Tensor]], timer: Callable) -> float | None:
    """GB/s of reading both (contiguous, equally sized) tensors of a pair once: one call reads
    every pair, a launch each, and ``timer`` (the suite's, which divides by the input
    copies as it does for the providers) gives the time of one pair."""
    a0 = pairs[0][0]
    if a0.device.type != "cuda" or any(not (a.is_contiguous() and b.is_contiguous()) or a.shape != b.shape
                                       for a, b in pairs):
        return None
    n = a0.numel()
    programs = max(1, min(READ_PROGRAMS_PER_SM * torch.cuda.get_device_properties(a0.device).multi_processor_count,
                          triton.cdiv(n, READ_BLOCK)))
    part = torch.empty(programs, dtype=torch.float32, device=a0.device)

    def call():
        for a, b in pairs:
            _read_kernel[(programs,)](a, b, part, n, BLOCK=READ_BLOCK, num_warps=8)
    try:
        t = timer(call)
    except (RuntimeError, torch.cuda.OutOfMemoryError):
        return None
    return harness.gbs(2 * n * a0.element_size(), t.median_ms)


def size_copy_gbs(nbytes: int, n_sets: int, n_calls: int, flush: torch.Tensor) -> float | None:
    """GB/s of an element-wise kernel moving ``nbytes`` (half read, half written: ``torch.neg``
    on bf16), ``n_calls`` calls back to back over ``n_sets`` copies, as the ops bench times."""
    n = max(1, nbytes // 4)  # bf16 elements in each of source and destination
    try:
        pairs = [(torch.ones(n, dtype=torch.bfloat16, device="cuda"), torch.empty(n, dtype=torch.bfloat16,
                                                                                  device="cuda"))
                 for _ in range(n_sets)]

        def replay():
            for i in range(n_calls):
                src, dst = pairs[i % n_sets]
                torch.neg(src, out=dst)
        t = harness.per_call(harness.time_ms(replay, flush=flush), n_calls)
    except (RuntimeError, torch.cuda.OutOfMemoryError):
        return None
    return harness.gbs(4 * n, t.median_ms)


def read_chain_ms(tensors: list[torch.Tensor], flush: torch.Tensor | None = None) -> float | None:
    """Median ms of one graph reading each (contiguous) tensor once, a launch each, in order,
    after an L2 flush (``harness.time_ms``); None where it cannot run."""
    if not tensors or tensors[0].device.type != "cuda":
        return None
    sms = torch.cuda.get_device_properties(tensors[0].device).multi_processor_count
    part = torch.empty(READ_PROGRAMS_PER_SM * sms, dtype=torch.float32, device=tensors[0].device)
    launches = []
    for t in tensors:
        flat = t.detach().reshape(-1)
        half = flat.numel() // 2  # the kernel reads two equal halves (an odd last element is left out)
        programs = max(1, min(part.numel(), triton.cdiv(half, READ_BLOCK)))
        launches.append((flat[:half], flat[half:2 * half], half, programs))

    def call():
        for a, b, n, programs in launches:
            _read_kernel[(programs,)](a, b, part, n, BLOCK=READ_BLOCK, num_warps=8)
    try:
        return harness.time_ms(call, flush=flush).median_ms
    except (RuntimeError, torch.cuda.OutOfMemoryError):
        return None


def matmul_tflops(dtype: torch.dtype = torch.bfloat16, n: int = 8192) -> float | None:
    """TFLOP/s of one n x n x n matmul of ``dtype`` through torch (cuBLAS) on the current GPU:
    the compute roof a prefill's floor is reckoned against, measured in the same run (an
    H200's bf16 ~750). None without a GPU."""
    if not torch.cuda.is_available():
        return None
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=200)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def prefill_flops(config, tokens: int) -> float:
    """FLOPs of a batch-1 prefill of ``tokens`` that returns the last token's logits: every
    layer's projections (2 x their parameters a token), causal attention (QK^T and PV over
    half the square: 2 x tokens^2 x head_dim a head), the LM head for one token."""
    c = config
    h = c.hidden_size
    layer = h * c.qkv_size + c.num_heads * c.head_dim * h + 3 * h * c.intermediate_size
    attention = 2 * tokens * tokens * c.head_dim * c.num_heads
    return c.num_layers * (2 * layer * tokens + attention) + 2 * c.vocab_size * h
