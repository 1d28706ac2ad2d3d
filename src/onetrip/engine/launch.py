"""Starting a tensor-parallel command: one process per GPU under torchrun.

    if needs_relaunch(tp):                         # WORLD_SIZE unset: not under torchrun yet
        return relaunch_under_torchrun(tp, ["bench", "decode", "--tp", str(tp), ...])

The child processes run ``python -m onetrip <argv>`` with this process's environment plus
``CHILD_ENV``: NVLink multicast (NVLS) stays off on every machine onetrip runs on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Sequence

# NCCL's NVLS algorithms and symmetric memory's multicast objects use NVLink multicast,
# which must never be enabled on the machines onetrip is benchmarked on.
CHILD_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def under_torchrun() -> bool:
    """Whether this process was started by torchrun (it sets WORLD_SIZE)."""
    return "WORLD_SIZE" in os.environ


def needs_relaunch(nproc: int) -> bool:
    """More than one process is wanted and this one is not one of them yet."""
    return nproc > 1 and not under_torchrun()


def torchrun_command(nproc: int, argv: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m onetrip <argv>``
    (``--standalone``: a local rendezvous on a free port, so two jobs never collide)."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an int >= 1 (processes, one per GPU), got {nproc!r}")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "onetrip", *map(str, argv)]


def relaunch_under_torchrun(nproc: int, argv: Sequence[str]) -> int:
    """Run ``onetrip <argv>`` as ``nproc`` processes under torchrun and wait for them;
    returns torchrun's exit status (non-zero when any process failed)."""
    env = {**os.environ, **CHILD_ENV}
    return subprocess.run(torchrun_command(nproc, argv), env=env, check=False).returncode
