"""Experiment: the wide-row norms with every SM on every row (issue 2's 256K rows; NOTES.md,
twenty-fourth session). The kernel and why are in ``grid_norm.cu``: CTA c owns a column
slice of every row, bulk-copies the rows' slices into a deep ring of shared memory, and the
row statistics are the sum of one partial a CTA, exchanged through L2 as tagged 64-bit words.
Outcome: rms_norm 256 x 256K 47-54% of copy, layer_norm 12% (the pick: 88%, 85%); not taken
(results/grid-norm-h100-20261126-session24-*).

Built and loaded as ``bulk_norm.py``'s kernels (nvcc on the GPU machine, ``cuModuleLoadData``,
``cuLaunchKernelEx`` on torch's current stream: timed and graph-captured as the Triton
kernels are). The grid must be resident at once (its CTAs wait on each other's partials):
the launcher checks that the SMs hold it.
    python benchmarks/grid_norm.py --out DIR      # on an H100
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bulk_norm import MAX_SMEM, _check_wb, _function, _launch  # noqa: E402
from cluster_room import LaunchConfig, blocks_per_sm  # noqa: E402

SOURCE = 2  # bulk_norm.SOURCES[2]: grid_norm.cu


@dataclass(frozen=True)
class GridConfig:
    """A variant of ``grid_norm.cu`` (its GRID_ALL list): ``cw`` compute warps with ``vpt``
    16-byte vectors a thread (a slice holds at most 8 * 32 * cw * vpt columns), a ring of
    ``d`` stages, y written ``lag`` rows behind the sums, ``poll`` rows polled a round
    (LayerNorm half as many), ``batch`` rows a compute iteration, ``hint``: x and y
    evict-first in L2;
    ``ctas``: the grid to aim at (default: one CTA an SM; more where the slices need it);
    ``kind``: "norm", "copy" (y = x through the same pipeline: its ceiling) or "own" (each
    CTA's own statistics, a wrong y: the exchange's cost; RMSNorm only)."""
    cw: int = 8
    vpt: int = 1
    d: int = 32
    lag: int = 8
    poll: int = 8
    batch: int = 4
    hint: bool = False
    ctas: int | None = None
    kind: str = "norm"

    @property
    def cap(self) -> int:
        return 8 * 32 * self.cw * self.vpt

    def name(self, rms: bool) -> str:
        kind = {"norm": "rms" if rms else "layer", "copy": "copy", "own": "own"}[self.kind]
        return (f"grid_{kind}_w{self.cw}_v{self.vpt}_d{self.d}_l{self.lag}_p{self.poll}_b{self.batch}"
                f"_h{int(self.hint)}")

    def label(self) -> str:
        k = {"norm": "", "copy": " COPY", "own": " OWN-STATS"}[self.kind]
        return (f"grid{k} {self.cw}+2w v{self.vpt} ring{self.d} lag{self.lag} poll{self.poll} b{self.batch}"
                f"{' hint' if self.hint else ''}{f' ctas{self.ctas}' if self.ctas else ''}")

    def slices(self, width: int) -> tuple[int, int]:
        """(S, G): S columns a slice (a multiple of 8), G = ceil(width / S) CTAs, every one
        with a non-empty slice."""
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        target = max(self.ctas or sms, -(-width // self.cap))
        s = -(-(-(-width // target)) // 8) * 8
        return s, -(-width // s)


_work: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # device: (partials, epoch and exit counter)


def _workspace(dev: torch.device, words: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed once: the partials of launch t carry tag t, so a slot's old contents never match."""
    key = dev.index or 0
    if key not in _work or _work[key][0].numel() < words:
        _work[key] = (torch.zeros(words, dtype=torch.int64, device=dev), torch.zeros(2, dtype=torch.int32, device=dev))
    return _work[key]


_fits: dict[tuple[str, int, int], int] = {}  # (name, dynamic shared bytes, device): CTAs resident at once


def _resident(fn, name: str, cfg: GridConfig, smem: int, dev: torch.device) -> int:
    """CTAs of the kernel the GPU holds at once (the occupancy query once per kernel and size)."""
    key = (name, smem, dev.index or 0)
    if key not in _fits:
        _fits[key] = blocks_per_sm(SimpleNamespace(function=fn.value), cfg.cw + 2, smem) * \
            torch.cuda.get_device_properties(dev).multi_processor_count
    return _fits[key]


def grid_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float, y: torch.Tensor,
              cfg: GridConfig = GridConfig()) -> torch.Tensor:
    """y = RMSNorm(x) * w (``b`` None; Llama convention) or LayerNorm(x) * w + b of (M, N)
    bf16 rows with unit column stride, N a multiple of 8."""
    rms = b is None
    if cfg.kind != "norm" and not rms:
        raise ValueError(f"kind={cfg.kind!r} is an RMSNorm diagnostic; LayerNorm takes kind='norm'")
    if x.dim() != 2 or y.shape != x.shape:
        raise ValueError(f"x must be (M, N) and y the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    M, N = x.shape
    if N % 8 or x.stride(0) % 8 or y.stride(0) % 8:
        raise ValueError(f"width {N} and the row strides ({x.stride(0)}, {y.stride(0)}) must be multiples of 8 "
                         "(16-byte bulk copies)")
    _check_wb(w, b, N)
    for label, t in [("x", x), ("w", w), ("y", y)] + ([] if rms else [("b", b)]):
        if t.dtype != torch.bfloat16 or not t.is_cuda or t.stride(-1) != 1 or t.data_ptr() % 16:
            raise ValueError(f"{label} must be a 16-byte aligned CUDA bfloat16 tensor with unit column stride, got "
                             f"{t.dtype} on {t.device} with strides {tuple(t.stride())}")
    s, g = cfg.slices(N)
    if g > 160:  # grid_norm.cu's KW: the partials one lane polls
        raise ValueError(f"width {N} needs {g} CTAs of {cfg}; at most 160")
    smem = 2 * s * cfg.d
    if smem > MAX_SMEM:
        raise ValueError(f"{cfg} needs {smem} bytes of ring a CTA at width {N}; at most {MAX_SMEM}")
    name = cfg.name(rms)
    fn = _function(name, smem, SOURCE)
    fits = _resident(fn, name, cfg, smem, x.device)
    if g > fits:
        raise ValueError(f"{cfg} at width {N} needs {g} resident CTAs; this GPU holds {fits}")
    if M == 0:
        return y
    part, ctl = _workspace(x.device, M * g * 2)
    stream = torch.cuda.current_stream().cuda_stream
    launch = LaunchConfig(grid=(g, 1, 1), block=(32 * (cfg.cw + 2), 1, 1), smem=smem, stream=stream, n_attrs=0)
    args = [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(w.data_ptr()),
            ctypes.c_void_p(0 if rms else b.data_ptr()), ctypes.c_void_p(y.data_ptr()),
            ctypes.c_void_p(part.data_ptr()), ctypes.c_void_p(ctl.data_ptr()), ctypes.c_int(M), ctypes.c_int(N),
            ctypes.c_int(s), ctypes.c_longlong(x.stride(0)), ctypes.c_longlong(y.stride(0)), ctypes.c_float(eps)]
    _launch(fn, launch, args)
    return y


_G = GridConfig
_FIRST = _G(poll=4, batch=1, hint=True)  # the first run's form
_BASE = [_FIRST, replace(_FIRST, kind="copy"), _G(), _G(kind="copy"), _G(kind="own"), _G(hint=True),
         _G(hint=True, kind="copy"), _G(d=40, lag=16, batch=8), _G(batch=2), _G(vpt=2, d=24, ctas=64)]
VARIANTS = {(256, 262144): _BASE, (64, 262144): _BASE, (512, 131072): [*_BASE, _G(cw=4, d=32)]}


def _variants(rows, width, is_rms, w, b, eps):
    out = [("torch.neg (same bytes)", lambda x, y: torch.neg(x, out=y))] if is_rms else []
    for cfg in VARIANTS[(rows, width)]:
        if cfg.kind != "norm" and not is_rms:
            continue
        s, g = cfg.slices(width)
        out.append((f"{cfg.label()} [{g} x {s}]", lambda x, y, cfg=cfg: grid_norm(x, w, b, eps, y, cfg)))
    return out


def main() -> int:
    from norm_variants import rows_main  # noqa: PLC0415
    return rows_main(list(VARIANTS), _variants, "grid-norm.json")


if __name__ == "__main__":
    raise SystemExit(main())
