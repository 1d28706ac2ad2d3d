"""Experiment: the wide-row norms as a CUDA C++ kernel on Hopper's bulk copies (issue 2's
256K rows; NOTES.md, twenty-third session). The kernels and why are in ``bulk_norm.cu``
(BulkConfig: a row over a cluster of ``ranks`` CTAs, each segment bulk-copied into shared
memory, summed there, the statistics exchanged through distributed shared memory, y written
over the segment and bulk-stored; x crosses L2 -> SM once) and ``bulk_norm_ws.cu``
(WsConfig: the same persistent and warp-specialized, the weight held in shared memory).
Outcome: at best level with the Triton pick at rms_norm 256 x 256K (88.5%), +3 points on 64
rows, under it for layer_norm; not taken (results/bulk-norm-h100-20261126-session23-*).

The .cu is compiled here by nvcc (the GPU machine has it; CI never runs this) into a cubin
cached beside the build, loaded by the driver (``cuModuleLoadData``) and launched with a
cluster dimension by ``cuLaunchKernelEx`` on torch's current stream, so it is timed and
captured into CUDA graphs as the Triton kernels are.
    python benchmarks/bulk_norm.py --out DIR      # on an H100
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_room import blocks_per_sm, cluster_config, max_clusters  # noqa: E402

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "bulk_norm.cu", HERE / "bulk_norm_ws.cu", HERE / "grid_norm.cu")  # all include bulk_ptx.cuh
MAX_SMEM = 227 * 1024  # an H100 CTA's dynamic shared memory limit


@dataclass(frozen=True)
class BulkConfig:
    """One compiled variant (``bulk_norm.cu``'s BOTH list) and its cluster size.

    ranks: CTAs a row (cluster size, <= 16); threads: a CTA; nbuf: row segments in flight a
    CTA (2: persistent grid of the clusters that fit); chunks: mbarriers a segment;
    wsmem: weight (and bias) bulk-loaded into shared memory once; hint: L2 evict-first for
    x and y, evict-last for the weight; early: the row's weight (and bias) loaded in pass 2
    (0), into registers before x's copy is waited for (1), or prefetched into the L1 then
    (2); xch: the statistics exchanged by a cluster barrier (0), by st.async on mbarriers
    (1), or not at all (2: each segment by its own statistics, a wrong y: the diagnostic of
    what the exchange costs); pb: pass 2's batch of vectors a thread (default all); copy:
    the same bulk loads and stores with nothing between them (y = x, the design's ceiling).
    A thread's 16-byte vectors a segment (VPT, a template constant) follow from the width:
    seg / (8 * threads)."""
    ranks: int = 16
    threads: int = 256
    nbuf: int = 1
    chunks: int = 4
    wsmem: bool = False
    hint: bool = True
    early: int = 1
    xch: int = 1
    pb: int | None = None
    copy: bool = False
    source = 0  # SOURCES[0]

    @property
    def persistent(self) -> bool:
        return self.nbuf > 1

    @property
    def unit(self) -> int:
        """The segment's columns must be a multiple of this."""
        return 8 * self.threads * self.chunks

    def name(self, rms: bool, seg: int) -> str:
        kind = "copy" if self.copy else "rms" if rms else "layer"
        e, x = (0, 0) if self.copy else (self.early, self.xch)
        vpt = seg // (8 * self.threads)
        return (f"bulk_{kind}_t{self.threads}_v{vpt}_b{self.nbuf}_c{self.chunks}"
                f"_w{int(self.wsmem)}_h{int(self.hint)}_e{e}_x{x}_p{self.pb or vpt}")

    def smem(self, seg: int, rms: bool) -> int:
        """Dynamic shared bytes a CTA: the row buffers and the held weight (and bias)."""
        return 2 * seg * (self.nbuf + (self.wsmem * (1 if rms or self.copy else 2)))

    def label(self) -> str:
        return (f"bulk{' COPY' if self.copy else ''} r{self.ranks} t{self.threads} buf{self.nbuf} ch{self.chunks}"
                f"{' w-smem' if self.wsmem else ''}{'' if self.hint else ' nohint'}"
                f"{'' if self.copy else ('', ' early', ' L1pf')[self.early]}"
                f"{'' if self.copy else (' csync', ' st.async', ' NOXCH')[self.xch]}"
                f"{f' pb{self.pb}' if self.pb else ''}")


@dataclass(frozen=True)
class WsConfig:
    """A variant of ``bulk_norm_ws.cu`` (persistent, one producer warp and ``cw`` consumer
    warps; the grid is the clusters that fit): ranks, nbuf, wsmem, early and pb as
    BulkConfig's; look: row i + 1's pass 1 and send before row i's exchange is waited for;
    xw: each consumer warp exchanges its own statistics (no CTA barrier on a row's path);
    prod: producer warps (1, or nbuf: one a buffer); copy: y = x, the consumers only hand
    each buffer back (the pipeline's ceiling); hint: x and y evict-first in L2 (False: the
    session-24 variants, name suffix _h0)."""
    ranks: int = 16
    cw: int = 8
    nbuf: int = 2
    wsmem: bool = True
    early: int = 0
    pb: int | None = None
    look: int = 1
    xw: int = 1
    prod: int = 1
    copy: bool = False
    hint: bool = True
    source = 1  # SOURCES[1]
    persistent = True

    @property
    def threads(self) -> int:
        return 32 * (self.cw + self.prod)

    @property
    def unit(self) -> int:
        return 8 * 32 * self.cw

    def name(self, rms: bool, seg: int) -> str:
        vpt, h = seg // (8 * 32 * self.cw), "" if self.hint else "_h0"
        if self.copy:
            return f"ws_copy_w{self.cw}_v{vpt}_b{self.nbuf}_s0_e0_p{vpt}_l0_x0_q{self.prod}{h}"
        return (f"ws_{'rms' if rms else 'layer'}_w{self.cw}_v{vpt}_b{self.nbuf}_s{int(self.wsmem)}_e{self.early}"
                f"_p{self.pb or vpt}_l{self.look}_x{self.xw}_q{self.prod}{h}")

    def smem(self, seg: int, rms: bool) -> int:
        return 2 * seg * (self.nbuf + (0 if self.copy else self.wsmem * (1 if rms else 2)))

    def label(self) -> str:
        h = "" if self.hint else " nohint"
        if self.copy:  # (the earlier runs' labels also named the flags a copy ignores)
            return f"ws COPY r{self.ranks} {self.cw}+{self.prod} warps buf{self.nbuf}{h}"
        return (f"ws r{self.ranks} {self.cw}+{self.prod} warps buf{self.nbuf}{' w-smem' if self.wsmem else ''}"
                f"{('', ' early', ' L1pf')[self.early]}{f' pb{self.pb}' if self.pb else ''}"
                f"{' look' if self.look else ''}{' xw' if self.xw else ''}{h}")


_cu = None
_modules: dict[int, ctypes.c_void_p] = {}
_functions: dict[str, tuple[ctypes.c_void_p, int]] = {}  # name: (CUfunction, its static shared bytes)
_sized: set[tuple[str, int]] = set()  # (name, dynamic shared bytes) the driver has allowed
_fits: dict[tuple[str, int, int], int | None] = {}  # (name, dynamic shared bytes, ranks): clusters that fit


def _driver():
    global _cu
    if _cu is None:
        _cu = ctypes.CDLL("libcuda.so.1")
    return _cu


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed with CUresult {rc}")


def build(source: int = 0) -> Path:
    """The cubin of ``SOURCES[source]`` for sm_90a, compiled once per text of it and of
    bulk_ptx.cuh (cached by hash)."""
    src = SOURCES[source]
    digest = hashlib.sha1(src.read_bytes() + (HERE / "bulk_ptx.cuh").read_bytes()).hexdigest()[:12]
    cubin = Path(tempfile.gettempdir()) / f"onetrip-{src.stem}-{digest}.cubin"
    if cubin.exists():
        return cubin
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        raise RuntimeError(f"bulk_norm needs nvcc (CUDA 12.x or later) to build {src.name}")
    subprocess.run([nvcc, "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-O3", f"-I{HERE}", str(src),
                    "-o", str(cubin)], check=True)
    return cubin


def _function(name: str, smem: int, source: int) -> ctypes.c_void_p:
    """The loaded kernel ``name``, allowed ``smem`` dynamic shared bytes: the driver queries
    run once per kernel and size, not on every launch."""
    cu = _driver()
    if source not in _modules:
        torch.cuda.init()
        torch.empty(1, device="cuda")  # the primary context current on this thread
        module = ctypes.c_void_p()
        _check(cu.cuModuleLoadData(ctypes.byref(module), build(source).read_bytes()), "cuModuleLoadData")
        _modules[source] = module
    if name not in _functions:
        fn = ctypes.c_void_p()
        if cu.cuModuleGetFunction(ctypes.byref(fn), _modules[source], name.encode()) != 0:
            raise ValueError(f"no compiled variant {name}: add it to {SOURCES[source].name}'s list")
        _check(cu.cuFuncSetAttribute(fn, 14, 1), "non-portable cluster size")  # clusters of 16
        static = ctypes.c_int(0)
        _check(cu.cuFuncGetAttribute(ctypes.byref(static), 1, fn), "static shared memory")  # SHARED_SIZE_BYTES
        _functions[name] = (fn, static.value)
    fn, static = _functions[name]
    if smem + static > MAX_SMEM:
        raise ValueError(f"{name} needs {smem} + {static} bytes of shared memory a CTA; at most {MAX_SMEM}")
    if (name, smem) not in _sized:
        _check(cu.cuFuncSetAttribute(fn, 8, smem), "dynamic shared memory")  # MAX_DYNAMIC_SHARED_SIZE_BYTES
        _sized.add((name, smem))
    return fn


def _clusters_fit(fn: ctypes.c_void_p, name: str, cfg, smem: int) -> int | None:
    """Clusters of ``cfg.ranks`` CTAs of the kernel that the GPU holds at once (cached; the
    name leaves out the cluster size, so the key holds it: one kernel serves 256K over 16
    ranks and 128K over 8)."""
    key = (name, smem, cfg.ranks)
    if key not in _fits:
        _fits[key] = max_clusters(SimpleNamespace(function=fn.value), cfg.ranks, cfg.threads // 32, smem)
    return _fits[key]


def _check_wb(w: torch.Tensor, b: torch.Tensor | None, n: int) -> None:
    """The weight (and bias) of an n-wide row: shape (n,) each (bulk_norm's, grid_norm's)."""
    if w.shape != (n,) or (b is not None and b.shape != (n,)):
        raise ValueError(f"w and b must have shape ({n},), got {tuple(w.shape)} and "
                         f"{None if b is None else tuple(b.shape)}")


def _launch(fn: ctypes.c_void_p, launch, args: list) -> None:
    """``fn`` launched by ``cuLaunchKernelEx`` with ``launch`` (a cluster_room.LaunchConfig on
    torch's current stream) and ``args`` (ctypes values in the kernel's parameter order)."""
    params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
    _check(_driver().cuLaunchKernelEx(ctypes.byref(launch), fn, params, None), "cuLaunchKernelEx")


def bulk_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float, y: torch.Tensor,
              cfg: BulkConfig | WsConfig = BulkConfig(), clusters: int | None = None) -> torch.Tensor:
    """y = RMSNorm(x) * w (``b`` None; Llama convention) or LayerNorm(x) * w + b of (M, N)
    bf16 rows with unit column stride. ``clusters``: cap on a persistent grid (BulkConfig
    with nbuf > 1, WsConfig; default: as many as fit at once)."""
    rms = b is None
    M, N = x.shape
    seg = N // cfg.ranks
    if not 1 <= cfg.ranks <= 16 or N % cfg.ranks or seg % cfg.unit:
        raise ValueError(f"width {N} must cut into ranks={cfg.ranks} (1-16) segments of a multiple of "
                         f"{cfg.unit} columns (8 a 16-byte vector, by the threads and chunks of {cfg})")
    if x.stride(0) % 8 or y.stride(0) % 8 or y.shape != x.shape:
        raise ValueError(f"y {tuple(y.shape)} must match x {tuple(x.shape)}; row strides a multiple of 8")
    _check_wb(w, b, N)
    smem = cfg.smem(seg, rms)
    if smem > MAX_SMEM:
        raise ValueError(f"{cfg} needs {smem} bytes of shared memory a CTA for width {N}; at most {MAX_SMEM}")
    tensors = [("x", x), ("w", w), ("y", y)] + ([] if rms else [("b", b)])
    for label, t in tensors:
        if t.dtype != torch.bfloat16 or not t.is_cuda or t.stride(-1) != 1:
            raise ValueError(f"{label} must be a CUDA bfloat16 tensor with unit column stride, got {t.dtype} "
                             f"on {t.device} with strides {tuple(t.stride())}")
        if t.data_ptr() % 16:
            raise ValueError(f"{label} must be 16-byte aligned (the bulk copies' rule)")
    name = cfg.name(rms, seg)
    fn = _function(name, smem, cfg.source)
    n_clusters = M
    if cfg.persistent:
        n_clusters = min(M, _clusters_fit(fn, name, cfg, smem) or M, clusters or M)
    stream = torch.cuda.current_stream().cuda_stream
    launch, _attr = cluster_config(n_clusters * cfg.ranks, cfg.ranks, cfg.threads, smem, stream)
    args = [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(w.data_ptr()),
            ctypes.c_void_p(0 if rms else b.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_int(M),
            ctypes.c_int(seg), ctypes.c_longlong(x.stride(0)), ctypes.c_longlong(y.stride(0)), ctypes.c_float(eps)]
    _launch(fn, launch, args)
    return y


def occupancy(cfg: BulkConfig | WsConfig, width: int, rms: bool) -> dict:
    """CTAs an SM (by shared memory and threads) and clusters that fit, for the record."""
    seg = width // cfg.ranks
    smem, name = cfg.smem(seg, rms), cfg.name(rms, seg)
    fn = _function(name, smem, cfg.source)
    per_sm = blocks_per_sm(SimpleNamespace(function=fn.value), cfg.threads // 32, smem)
    return {"smem": smem, "ctas_per_sm": per_sm, "clusters_fit": _clusters_fit(fn, name, cfg, smem)}


# (rows, width): the variants timed there (the first sessions' losers dropped: NOTES)
_C, _W = BulkConfig, WsConfig


def _ws(r):
    return [_W(r, 8, 4, True, look=0, xw=0), _W(r, 8, 5, True, xw=0), _W(r, 8, 5, True), _W(r, 8, 3, True),
            _W(r, 8, 3, False, 1), _W(r, 8, 5, copy=True)]


# The session's last table: the best of each form beside the copies (earlier variants: NOTES)
_WIDE = [_C(16), _C(16, copy=True), *_ws(16)]
VARIANTS = {(256, 262144): _WIDE, (64, 262144): _WIDE, (512, 131072): [_C(8), _C(8, copy=True), *_ws(8)]}


def _hint_ab(r):
    """Session 24: the best warp-specialized forms and their copies with the L2 hints on x
    and y, then without (LayerNorm's five buffers and exchange slots do not fit beside w and
    b: four, one producer a buffer)."""
    forms = [_W(r, 8, 5, True), _W(r, 8, 5, True, prod=5), _W(r, 8, 4, True, prod=4), _W(r, 8, 5, copy=True),
             _W(r, 8, 5, copy=True, prod=5)]
    return [replace(f, hint=h) for f in forms for h in (True, False)]


if os.environ.get("BULK_SET") == "hint":  # BULK_SET=hint python benchmarks/bulk_norm.py --out DIR
    VARIANTS = {(256, 262144): _hint_ab(16), (64, 262144): _hint_ab(16), (512, 131072): _hint_ab(8)}


def _variants(rows, width, is_rms, w, b, eps):
    # A copy of the same bytes by an element-wise kernel (torch.neg; y = -x), timed as the rest:
    # what any one-read-one-write kernel of this shape reaches (copy_ in a graph would run on
    # the copy engines).
    out = [("torch.neg (same bytes)", lambda x, y: torch.neg(x, out=y))] if is_rms else []
    for cfg in VARIANTS[(rows, width)]:
        if cfg.copy and not is_rms:
            continue
        try:
            occ = occupancy(cfg, width, is_rms)
        except ValueError as exc:  # more shared memory than a CTA has
            print(f"skipped: {exc}", flush=True)
            continue
        label = f"{cfg.label()} [{occ['ctas_per_sm']}/SM, {occ['clusters_fit']} cl]"
        out.append((label, lambda x, y, cfg=cfg: bulk_norm(x, w, b, eps, y, cfg)))
    return out


def main() -> int:
    from norm_variants import rows_main  # noqa: PLC0415
    return rows_main(list(VARIANTS), _variants, "bulk-norm.json")


if __name__ == "__main__":
    raise SystemExit(main())
