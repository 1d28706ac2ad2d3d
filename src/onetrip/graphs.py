"""CUDA-graph capture as every part of onetrip does it (engine, benchmarks, tests).

    graph, out = capture(fn)        # fn() warmed up, then captured; graph.replay() reruns it

PyTorch asks for warm-up on a side stream before capture: the first calls compile Triton
kernels and let the caching allocator and cuBLAS set up their workspaces, none of which
may happen inside a capture. The captured call is recorded, not run.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def capture(fn: Callable[[], T], warmup: int = 1, pool=None, stream=None) -> tuple[torch.cuda.CUDAGraph, T]:
    """Call ``fn`` ``warmup`` times on a side stream, then capture one call in a CUDA graph
    on that stream. Returns (graph, what the captured call returned: tensors from the
    graph's memory pool, rewritten by each replay). ``pool``: a memory pool shared with
    other graphs (``torch.cuda.graph_pool_handle()``) that never replay at the same time;
    ``stream``: the side stream, the same one for every capture into a shared pool (the
    allocator reuses a freed block only on the stream that allocated it)."""
    side = stream if stream is not None else torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=side):
        out = fn()
    return graph, out
