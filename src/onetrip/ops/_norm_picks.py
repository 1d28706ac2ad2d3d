"""Launch configs of the residual-add + norm kernel (``norm.py``): ``NormConfig``, how a
config cuts a row into segments, the tables of measured picks, and ``norm_config``, which
chooses from them. Figures are % of a plain copy's bandwidth, bf16, moving the same bytes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from ._common import cdiv, device_type, gpu_name, gpu_table_entry, is_interpreting, next_pow2, sm_count

MODES = ("rows", "coop", "two_pass", "loop")


def _short_repr(obj) -> str:
    """``Name(field=value, ...)`` of a dataclass with only the fields that differ from their
    defaults (NormConfig's tile fields always, positionally): readable, and ``eval``-able with
    the classes in scope."""
    parts = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            parts.append(repr(value))
        elif value != (f.default if f.default is not dataclasses.MISSING else f.default_factory()):
            parts.append(f"{f.name}={value!r}")
    return f"{type(obj).__name__}({', '.join(parts)})"


def _check_range(owner: str, name: str, value: int, lo: int, hi: int, what: str) -> None:
    if not lo <= value <= hi:
        raise ValueError(f"{owner}.{name}={value!r} must be {lo}-{hi} ({what})")


@dataclass(frozen=True, repr=False)
class Split:
    """A mode "loop" row over several programs, which exchange their partial sums once
    between the passes, so each keeps a fraction of the row in L2."""

    programs: int = 1  # programs a row, each over a segment of whole chunks (1-16)
    cluster: bool = False  # Hopper: the row's programs one thread-block cluster, sums through shared memory

    __repr__ = _short_repr

    def __post_init__(self):
        _check_range("Split", "programs", self.programs, 1, 16, "programs a row")


@dataclass(frozen=True, repr=False)
class CacheHints:
    """Eviction hints of mode "loop"'s loads and stores."""

    keep_row: bool = False  # L2: pass 1 loads evict_last, what is never read again evict_first
    drop_y: bool = False  # with keep_row: the streamed y stored evict_first too
    keep_weight: bool = False  # L1: weight and bias loaded evict_last, ahead of the row's own lines

    __repr__ = _short_repr


@dataclass(frozen=True, repr=False)
class Reuse:
    """Where mode "loop"'s pass 2 finds the row; by default it re-reads x (and r) from L2."""

    held_chunks: int = 0  # the segment's first chunks kept in registers between the passes (0-2)
    store_h_early: bool = False  # with a residual: pass 1 stores h, pass 2 re-reads h alone (half the bytes)
    smem_segment: bool = False  # no residual, 16-bit: the segment copied to shared memory, both passes read it
    smem_sum_per_chunk: bool = False  # with smem_segment: each chunk summed as soon as its copies land

    __repr__ = _short_repr

    def __post_init__(self):
        _check_range("Reuse", "held_chunks", self.held_chunks, 0, 2, "chunks")
        if self.smem_sum_per_chunk and not self.smem_segment:
            raise ValueError("Reuse.smem_sum_per_chunk=True needs smem_segment=True")


@dataclass(frozen=True, repr=False)
class LoadOrder:
    """Mode "loop"'s loads issued before what would otherwise hold them back: a store (which
    may alias them) or the wait for the row's sums."""

    early_weight_chunks: int = 0  # pass 2's first chunks' weight and bias loaded before the exchange of sums (0-4)
    weight_with_copies: bool = False  # with smem_segment: those loaded right after the segment's copies are issued
    half_steps: bool = False  # with smem_segment: pass 2 in half chunks, each one's weight 2 x early chunks ahead
    next_before_store: int = 0  # chunk k + 1's loads before chunk k's stores (1: pass 1, 2: pass 2, 3: both)

    __repr__ = _short_repr

    def __post_init__(self):
        _check_range("LoadOrder", "early_weight_chunks", self.early_weight_chunks, 0, 4, "chunks")
        _check_range("LoadOrder", "next_before_store", self.next_before_store, 0, 3, "1: pass 1, 2: pass 2, 3: both")
        if self.half_steps and self.next_before_store >= 2:
            raise ValueError(f"LoadOrder.half_steps=True replaces pass 2's next_before_store (got "
                             f"next_before_store={self.next_before_store})")


@dataclass(frozen=True, repr=False)
class L2Requests:
    """Hopper bulk prefetches into the L2 (``_norm_l2.py``): hints that change no value."""

    first_chunks: int = 0  # (PDL) chunks of the program's own segment asked for before it waits on the previous kernel
    ahead_rows: int = 0  # after pass 1, the program's segment of the row this many rows on
    ahead_min_rows: int = 0  # ahead_rows only from this many rows (fewer: none)

    __repr__ = _short_repr

    def __post_init__(self):
        for name in ("first_chunks", "ahead_rows", "ahead_min_rows"):
            if getattr(self, name) < 0:
                raise ValueError(f"L2Requests.{name}={getattr(self, name)} must be >= 0 (0: none)")


@dataclass(frozen=True, repr=False)
class NormConfig:
    """How the kernel covers rows (norm.py's docstring describes the modes): the tile, then
    mode "loop"'s groups of knobs.

    "rows": a program normalizes ``block_m`` whole rows (``block_n`` >= the width); the other
    modes walk a row in chunks of ``block_n`` columns.
    """

    mode: str  # "rows" | "coop" | "two_pass" | "loop"
    block_m: int  # rows a program
    block_n: int  # columns held at once: the whole row ("rows") or a chunk
    num_warps: int
    const_n: bool = False  # "rows", "loop": the width (and dense rows' strides) compiled in
    unroll: int = 1  # "loop": chunks an iteration
    maxnreg: int = 0  # ptxas's register cap (0: none); it also fixes how CUDA 13's ptxas schedules
    late_weight: bool = False  # "rows": the weight and bias loaded after the statistics, not live during them
    affine_fma: bool = False  # "loop" LayerNorm, 16-bit y: y = (h - mean) * (rstd * w) + b, FMAs
    split: Split = field(default_factory=Split)
    hints: CacheHints = field(default_factory=CacheHints)
    reuse: Reuse = field(default_factory=Reuse)
    order: LoadOrder = field(default_factory=LoadOrder)
    l2: L2Requests = field(default_factory=L2Requests)

    __repr__ = _short_repr

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"NormConfig.mode={self.mode!r} must be one of {MODES}")
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"NormConfig.{name}={v} must be a power of two")
        if self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"NormConfig.num_warps={self.num_warps} must be a power of two from 1 to 32")
        if self.unroll < 1:
            raise ValueError(f"NormConfig.unroll={self.unroll} must be >= 1")
        if self.maxnreg and not 16 <= self.maxnreg <= 255:  # else ptxas fails deep inside Triton's compile
            raise ValueError(f"NormConfig.maxnreg={self.maxnreg} must be 0 (no cap) or 16-255 registers")
        for name, group in (("split", Split), ("hints", CacheHints), ("reuse", Reuse), ("order", LoadOrder),
                            ("l2", L2Requests)):
            value = getattr(self, name)
            if not isinstance(value, group):
                raise TypeError(f"NormConfig.{name} must be a {group.__name__}, got {value!r}")
            if self.mode != "loop" and value != group():
                raise ValueError(f"NormConfig.{name}={value!r} applies to mode 'loop' only, not {self.mode!r}")
        if self.split.programs > 1 and self.block_m != 1:
            raise ValueError(f"NormConfig.block_m={self.block_m} with split.programs={self.split.programs}: a "
                             f"split row is one row a program")
        if self.order.half_steps and self.reuse.held_chunks:
            raise ValueError(f"LoadOrder.half_steps=True takes no held chunks (got reuse.held_chunks="
                             f"{self.reuse.held_chunks})")


def segments(N: int, cfg: NormConfig) -> tuple[int, int]:
    """(programs, columns) a row of N is cut into by "loop" ``cfg``: segments of whole chunks,
    none empty, so a row may take fewer programs than asked. A cluster has 2-8 ranks or 16:
    a count of 9-15 takes 8 wider segments instead."""
    if cfg.mode != "loop" or cfg.split.programs == 1:
        return 1, N
    for parts in (cfg.split.programs, 8):
        seg = cdiv(cdiv(N, parts), cfg.block_n) * cfg.block_n
        split = cdiv(N, seg)
        if not (cfg.split.cluster and 8 < split < 16):
            break
    return split, seg


def launch_segments(N: int, cfg: NormConfig) -> tuple[int, int]:
    """``segments(N, cfg)``, once ``cfg`` is checked against the width: a "rows" tile covers
    it, and held or early-weight chunks of a split row start inside its segment (past it they
    would be the next program's columns). Raises ValueError naming the field."""
    if cfg.mode == "rows" and N > cfg.block_n:
        raise ValueError(f"config.block_n={cfg.block_n} must cover the width {N} in mode 'rows'")
    split, seg = segments(N, cfg)
    early = max(cfg.reuse.held_chunks, cfg.order.early_weight_chunks)
    if cfg.mode == "loop" and split > 1 and (early - 1) * cfg.block_n >= seg:
        raise ValueError(f"config.reuse.held_chunks={cfg.reuse.held_chunks} / order.early_weight_chunks="
                         f"{cfg.order.early_weight_chunks} chunks of {cfg.block_n} do not fit the {seg} columns of a "
                         f"program's segment at width {N}")
    return split, seg


def _loop(block_n: int, warps: int, **fields) -> NormConfig:
    return NormConfig("loop", 1, block_n, warps, **fields)


def _rows(block_m: int, block_n: int, warps: int, **fields) -> NormConfig:
    return NormConfig("rows", block_m, block_n, warps, **fields)


# the recurring groups of the picks below
KEEP = CacheHints(keep_row=True)
KEEP_DROP = CacheHints(keep_row=True, drop_y=True)
KEEP_W = CacheHints(keep_weight=True)
H_EARLY = Reuse(store_h_early=True)
SMEM = Reuse(smem_segment=True)


def _c(programs: int) -> Split:
    return Split(programs, cluster=True)


def _held(chunks: int, store_h_early: bool = False) -> Reuse:
    return Reuse(held_chunks=chunks, store_h_early=store_h_early)


# Mode "loop" by (is_rms, has_residual) and row width rounded up to a power of two; H200
# sweeps at 2**26 elements, the next best in parentheses.
LOOP_PICKS = {
    (True, False): {
        8192: _loop(4096, 16, const_n=True, hints=KEEP),  # H200: 95 (whole rows) -> 97%
        16384: _loop(8192, 16, const_n=True, hints=KEEP),  # H200: 94 (whole rows) -> 96%
        32768: _loop(8192, 32, const_n=True, unroll=2, hints=KEEP),  # H200: 91 (runtime width) -> 95%
        65536: _loop(16384, 32, const_n=True, hints=KEEP_DROP),  # H200: 88.3 -> 90.4% (drop_y)
        131072: _loop(16384, 32, const_n=True, hints=KEEP_DROP, reuse=_held(2)),  # H200: 80 -> 82% (held 2)
        262144: _loop(8192, 16, const_n=True, split=Split(4), hints=KEEP_DROP, reuse=_held(2)),  # H200: 71.5 -> 75.0%
    },
    (False, False): {
        16384: _loop(4096, 16, const_n=True, hints=KEEP_DROP),  # H200: 86 (whole rows) -> 94%
        32768: _loop(8192, 32, const_n=True, hints=KEEP_DROP),  # H200: 77 (whole rows) -> 93%
        65536: _loop(16384, 32, const_n=True, hints=KEEP_DROP),  # H200: 75 (whole rows) -> 82.5%
        131072: _loop(16384, 32, const_n=True, hints=KEEP_DROP, reuse=_held(2)),  # H200: 72 -> 77% (held 2)
        262144: _loop(8192, 16, const_n=True, split=Split(4), hints=KEEP_DROP, reuse=_held(1)),  # H200: 68.7 -> 69.3%
    },
    (True, True): {
        65536: _loop(16384, 32, const_n=True, unroll=4, hints=KEEP, reuse=H_EARLY),  # H200: 89 -> 92%
        131072: _loop(16384, 32, const_n=True, hints=KEEP, reuse=H_EARLY),  # H200: 88 (runtime width) -> 89%
        # H200: 44-71 (coop) -> 50-81% at 64 rows
        262144: _loop(8192, 16, const_n=True, split=Split(4), hints=KEEP_DROP, reuse=H_EARLY),
    },
    (False, True): {
        32768: _loop(8192, 16, const_n=True, reuse=H_EARLY),  # H200: 85 (runtime width) -> 91%
        65536: _loop(16384, 32, const_n=True, unroll=2, hints=KEEP, reuse=H_EARLY),  # H200: 86 -> 89%
        131072: _loop(16384, 32, const_n=True, hints=KEEP, reuse=H_EARLY),  # H200: 84 -> 85%
        262144: _loop(16384, 32, const_n=True, split=Split(2), hints=KEEP_DROP, reuse=H_EARLY),  # H200: 79.8 -> 80.2%
    },
}


# Per GPU model (a substring of the device's name): picks that replace LOOP_PICKS' and
# ROWS_PICKS' (or the rule's), keyed by (mode, is_rms, has_residual, width rounded up to a
# power of two). Cluster picks take no L2 hints: their row is read once into shared memory
# or re-read while still in L2 (on an H100, layer_norm 128K 88.0 -> 89.8% without them).
PICKS_GPU = {
    "H100": {
        # H100: 89.7 -> 90.9% at 1024 x 64K
        ("loop", False, False, 65536): _loop(4096, 16, const_n=True, split=_c(4), hints=KEEP_DROP),
        # H100: 94.4 -> 97.5% (16384 x 32 warps)
        ("loop", False, True, 32768): _loop(16384, 32, const_n=True, reuse=H_EARLY),
        ("loop", True, False, 131072): _loop(  # H100: 87.8 -> 91.7% at 128 x 128K
            4096, 8, const_n=True, maxnreg=48, split=_c(8), reuse=SMEM,
            order=LoadOrder(early_weight_chunks=2, weight_with_copies=True, next_before_store=2)),
        ("loop", True, False, 262144): _loop(  # H100: 94.8 -> 96.7% at 256 x 256K
            4096, 8, const_n=True, maxnreg=48, split=_c(16), reuse=SMEM, l2=L2Requests(first_chunks=1),
            order=LoadOrder(early_weight_chunks=2, weight_with_copies=True, next_before_store=2)),
        ("loop", False, False, 131072): _loop(
            4096, 8, const_n=True, maxnreg=48, affine_fma=True, split=_c(8), hints=KEEP_W, reuse=SMEM,
            order=LoadOrder(early_weight_chunks=1, weight_with_copies=True, half_steps=True),
            l2=L2Requests(ahead_rows=32, ahead_min_rows=384)),  # H100: 89.7 -> 91.0% at 512 x 128K (ahead_rows)
        ("loop", False, False, 262144): _loop(  # H100: 88.0 -> 89.4% at 64 x 256K (half_steps)
            4096, 8, const_n=True, maxnreg=48, affine_fma=True, split=_c(16), hints=KEEP_W,
            reuse=Reuse(smem_segment=True, smem_sum_per_chunk=True), l2=L2Requests(first_chunks=2),
            order=LoadOrder(early_weight_chunks=1, weight_with_copies=True, half_steps=True)),
        # H100: 91.8 -> 93.8% (a cluster)
        ("loop", True, True, 131072): _loop(4096, 8, const_n=True, split=_c(16), hints=KEEP_W, reuse=H_EARLY),
        ("loop", False, True, 131072): _loop(  # H100: 89.2 -> 92.8% (a cluster)
            4096, 8, const_n=True, affine_fma=True, split=_c(16), hints=KEEP_W, reuse=H_EARLY),
        ("loop", False, True, 262144): _loop(  # H100: 88.3 -> 92.4% at 256 x 256K
            8192, 16, const_n=True, affine_fma=True, split=_c(16), hints=KEEP_W, reuse=H_EARLY,
            order=LoadOrder(early_weight_chunks=2, next_before_store=1), l2=L2Requests(first_chunks=2)),
        ("loop", True, True, 262144): _loop(  # H100: 88.5 -> 93.3% at 256 x 256K
            8192, 16, const_n=True, split=_c(16), hints=KEEP_W, reuse=_held(2, store_h_early=True),
            order=LoadOrder(early_weight_chunks=2, next_before_store=1), l2=L2Requests(first_chunks=1)),
        ("rows", False, False, 4096): _rows(1, 4096, 8, const_n=True),  # H100: 96.5 -> 97.9% (the rule's two rows)
        ("rows", False, False, 8192): _rows(1, 8192, 4),  # H100: 97.4 -> 98.3% (the rule's two rows at 16 warps)
        ("rows", True, False, 1024): _rows(2, 1024, 8, const_n=True),  # H100: 98.1 -> 99.4% (4 warps)
        ("rows", True, True, 1024): _rows(1, 1024, 8, const_n=True),  # H100: 0.998 -> 1.002-1.005x torch.compile
        ("rows", False, False, 1024): _rows(1, 1024, 4, late_weight=True),  # H100: 98.0 -> 99.0% (the rule's two rows)
        ("rows", True, False, 2048): _rows(1, 2048, 8, const_n=True),  # H100: 0.996-0.999 -> 1.002-1.008x Liger
    },
}


# Per GPU model: (rows, config) where fewer than ``rows`` rows take ``config`` in place of
# the pick PICKS_GPU (or LOOP_PICKS) has for the same key.
FEW_ROWS_GPU = {
    "H100": {
        ("loop", False, True, 262144): (128, _loop(  # H100: 83.8 (16 ranks) -> 90.2% at 64 x 256K
            16384, 32, const_n=True, unroll=2, split=_c(2), hints=CacheHints(True, True, True), reuse=H_EARLY,
            order=LoadOrder(next_before_store=2), l2=L2Requests(first_chunks=1))),
    },
}

# The H200 takes the H100's wide "loop" picks: rms_norm 64 x 256K 63.0 -> 78.7% over its own.
PICKS_GPU["H200"] = {key: cfg for key, cfg in PICKS_GPU["H100"].items() if key[0] == "loop" and key[3] >= 65536}
FEW_ROWS_GPU["H200"] = dict(FEW_ROWS_GPU["H100"])


# Mode "rows" with a row a program where the rule's two rows lost (H200, 2**26 elements).
_RESIDUAL_ROWS = {2048: _rows(1, 2048, 4),  # H200: add_layer_norm 96.1 -> 98.2%
                  4096: _rows(1, 4096, 4),  # H200: add_layer_norm 94.9 -> 95.8%, add_rms_norm 95.3 -> 95.7
                  8192: _rows(1, 8192, 16)}  # H200: add_layer_norm 95.3 -> 97.3%, add_rms_norm 95.5 -> 96.1
ROWS_PICKS = {
    (True, False): {2048: _rows(1, 2048, 4),  # H200: 94.0 -> 96.3%
                    4096: _rows(1, 4096, 8)},  # H200: 94.7 -> 95.1%
    (False, False): {},
    (True, True): _RESIDUAL_ROWS,
    (False, True): _RESIDUAL_ROWS,
}


def can_wait(device: torch.device) -> bool:
    """Programs may spin on a sibling's counter ("coop", a split "loop" row): on a GPU, not
    under the interpreter, which runs programs one after another."""
    return not is_interpreting() and device_type(device) == "cuda"


def norm_config(rows: int, width: int, device: torch.device, *, is_rms: bool = True,
                has_residual: bool = True, chunk: int = 8192, chunk_warps: int = 4,
                dense: bool = True) -> NormConfig:
    """The config for ``rows`` rows of ``width``: a program per row ("loop") where
    ``LOOP_PICKS`` (or this GPU model's ``PICKS_GPU`` / ``FEW_ROWS_GPU``) has the width and
    there is a row for every SM (half the SMs' worth of programs for a split row); else whole
    rows up to 16K elements (32K for RMSNorm), ``ROWS_PICKS`` where it has the width, else two
    rows a program up to 4K at ~32 elements a thread; else chunks of ``chunk`` ("coop" where
    its programs fit on the GPU at once, else "two_pass").

    "loop" needs a row for every SM: 64 rows of 256K (64 programs on 132 SMs) ran at 27% of
    copy against coop's 41% (H200). ``dense``: every row stride equals the width; the 8K
    pick gains only with the width a constant, so strided rows of 8K stay whole (88 vs 95%).
    ``norm._launch`` keeps the plan made of a pick (``norm.PLANS``), so this runs once a shape.
    """
    gpu, sms = gpu_name(device), sm_count(device)
    block_n = next_pow2(max(width, 1))
    picks = LOOP_PICKS[(is_rms, has_residual)]
    key = block_n if has_residual else min(block_n, max(picks))
    pick = gpu_table_entry(PICKS_GPU, gpu, ("loop", is_rms, has_residual, key)) or picks.get(key)
    few = gpu_table_entry(FEW_ROWS_GPU, gpu, ("loop", is_rms, has_residual, key))
    if few is not None and rows < few[0]:
        pick = few[1]
    if pick is not None:
        split = pick.split.programs
        if rows * split >= (sms if split == 1 else sms // 2) and (dense or block_n > 8192):
            return pick
    if block_n <= 16384 or (block_n == 32768 and is_rms):
        row_pick = (gpu_table_entry(PICKS_GPU, gpu, ("rows", is_rms, has_residual, block_n))
                    or ROWS_PICKS[(is_rms, has_residual)].get(block_n))
        if row_pick is not None:
            return dataclasses.replace(row_pick, block_m=min(row_pick.block_m, next_pow2(max(rows, 1))))
        pair = 2 if block_n <= 4096 or not is_rms else 1
        block_m = max(1, min(next_pow2(max(rows, 1)), max(pair, 2048 // block_n)))
        warps = max(4, min(16 if block_n <= 16384 else 32, block_m * block_n // 1024))
        return NormConfig("rows", block_m, block_n, warps)
    n_chunks = cdiv(width, chunk)
    coop = can_wait(device) and n_chunks <= sms
    return NormConfig("coop" if coop else "two_pass", 1, chunk, chunk_warps)

