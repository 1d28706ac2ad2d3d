"""Thread-block clusters from Triton (Hopper): the launch that makes a grid of clusters.

A row split over SPLIT programs needs every program's partial sums before any can
normalize. Through global memory that is a store, an atomic and a poll while HBM idles;
launched as one cluster, the SPLIT programs are co-scheduled and send their sums into each
other's shared memory (``_ptx.cluster_share3``). On an H100, rms_norm 256 x 256K 84.3 -> 94.1%
of copy.

Triton has no cluster API, so the kernel is compiled as usual and its compiled form launched
with a cluster dimension: ``launch_clusters`` sets the ``num_ctas`` field of the compiled
kernel's launch metadata, from which Triton's launcher passes
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION (and multiplies the grid by it). CTA k is then rank
k % SPLIT of cluster k // SPLIT. A kernel built for the exchange but launched without the
matching cluster size traps: a loud error, never a row normalized by part of its sums. The
exchange's mbarrier has one phase: one exchange a CTA.
"""

from __future__ import annotations

import torch

from ._common import is_interpreting
from ._ptx import MAX_RANKS


def cluster_ok(device: torch.device, ranks: int) -> bool:
    """A cluster of ``ranks`` can be launched here: a Hopper-or-newer GPU (not Triton's
    interpreter), 2-8 ranks or 16. (Whether this Triton's launcher takes a cluster size is
    known at the launch: ``launch_clusters`` returns None when it does not.)"""
    if device.type != "cuda" or not (2 <= ranks <= 8 or ranks == MAX_RANKS):
        return False
    return not is_interpreting() and torch.cuda.get_device_capability(device)[0] >= 9


def launch_clusters(kernel, clusters: int, ranks: int, *args, **kwargs):
    """Launch ``kernel`` (a ``triton.jit`` function) as ``clusters`` clusters of ``ranks``
    CTAs (program ids 0 .. clusters * ranks - 1). The compiled kernel this call runs is
    fetched (compiled if new) first and its launch metadata patched once; it is the one in
    Triton's cache, so the launch below runs it. Returns it, or None without launching when
    this Triton's compiled kernels carry no (num_warps, num_ctas, shared) metadata."""
    compiled = kernel.warmup(*args, grid=(clusters * ranks,), **kwargs)
    meta = getattr(compiled, "packed_metadata", None)
    if not (isinstance(meta, tuple) and len(meta) == 3 and meta[1] in (1, ranks)):
        return None
    if meta[1] != ranks:
        compiled.packed_metadata = (meta[0], ranks, meta[2])  # (num_warps, cluster size, shared memory)
    kernel[(clusters,)](*args, **kwargs)
    return compiled
