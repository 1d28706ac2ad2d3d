"""Launch configs of the residual-add + norm kernel (``norm.py``): ``NormConfig``, how a
config cuts a row into segments (``segments``, checked against the width by
``launch_segments``), the tables of measured picks, and ``norm_config``, which chooses from
them; kept apart from the kernel so that each table can carry the sweeps behind it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton

from ._common import gpu_name, gpu_table_entry, is_interpreting, sm_count


@dataclass(frozen=True)
class NormConfig:
    """How the kernel covers rows (see norm.py's docstring for the modes).

    "rows": each program normalizes a tile of ``block_m`` rows (``block_n`` >= the width).
    Split modes: chunks of ``block_n`` columns of one row each.
    """

    mode: str  # "rows" | "coop" | "two_pass" | "loop"
    block_m: int
    block_n: int
    num_warps: int
    hints: bool = False  # "loop": L2 eviction hints (evict_last on the pass read again)
    stash: bool = False  # "loop" with a residual: pass 1 stores h, pass 2 re-reads h alone
    vec: bool = False  # "loop": per-lane partial sums in pass 1, reduced once after it
    unroll: int = 1  # "loop": chunks per loop iteration (tl.range's loop_unroll_factor)
    const_n: bool = False  # "loop", "rows": the width as a compile-time constant where the rows are dense
    split: int = 1  # "loop": programs a row, each over a segment of whole chunks (<= 16)
    hold: int = 0  # "loop": leading chunks of a program's segment held in registers between the passes (<= 2)
    drop_y: bool = False  # "loop" with hints: pass 2's streamed y stored evict_first (y is never read again)
    cluster: bool = False  # "loop" split (Hopper): a row's programs one cluster, sums through shared memory
    late_wb: bool = False  # "rows": the weight (and bias) loaded after the statistics, not live during them
    shelf: bool = False  # "loop", no residual: the segment copied into shared memory, both passes read it there
    fold: bool = False  # "loop" LayerNorm, 16-bit y: the affine as FMAs, y = (h - mean) * (rstd * w) + b
    pf: int = 0  # "loop", dense rows (Hopper): after pass 1 a program asks the L2 for its segment of the row pf rows on
    pf_rows: int = 0  # with pf: only where there are at least this many rows (fewer: no read-ahead)
    wb_pre: int = 0  # "loop": pass 2's first wb_pre chunks' weight and bias loaded before the exchange of sums (<= 4)
    wb_early: bool = False  # with wb_pre and the shelf: loaded as soon as the shelf's copies are issued
    wb_mix: bool = False  # with wb_early: only the first chunk's then, the others' once the shelf's sums are in
    half_steps: bool = False  # with the shelf: pass 2 in half chunks, each one's weight and bias 2 * wb_pre steps ahead
    pipe: int = 0  # "loop": chunk k + 1's loads issued before chunk k's stores (1: pass 1, 2: pass 2, 3: both)
    l2_first: int = 0  # "loop", dense rows (Hopper, PDL): a program's first chunks asked of the L2 before the wait
    wb_first: int = 0  # like l2_first: the first wb_first rows' programs ask for their weight and bias segment
    carveout: int = -1  # % of the SM's L1 / shared memory asked as shared memory (-1: the driver's choice)
    shelf_pipe: bool = False  # with the shelf: each chunk's statistics summed as soon as its copies land
    wb_last: bool = False  # "loop": the weight and bias loaded L1::evict_last, kept ahead of the other lines (x, r, h)
    maxnreg: int = 0  # ptxas's register cap (.maxnreg; 0: none), which also fixes how CUDA 13's ptxas schedules

    def __post_init__(self):
        if self.maxnreg and not 16 <= self.maxnreg <= 255:  # else ptxas fails deep inside Triton's compile
            raise ValueError(f"NormConfig maxnreg={self.maxnreg} must be 0 (no cap) or 16-255 registers")
        if not 0 <= self.pipe <= 3:
            raise ValueError(f"NormConfig pipe={self.pipe} must be 0-3 (1: pass 1, 2: pass 2, 3: both)")
        if self.half_steps and (self.wb_mix or self.hold or self.pipe >= 2):
            raise ValueError(f"NormConfig half_steps=True takes no wb_mix, hold or pass 2's pipe (got wb_mix="
                             f"{self.wb_mix}, hold={self.hold}, pipe={self.pipe})")
        if self.wb_mix and not self.wb_early:
            raise ValueError("NormConfig wb_mix=True needs wb_early=True (it splits the early chunks' loads in two)")
        if not 0 <= self.wb_pre <= 4:
            raise ValueError(f"NormConfig wb_pre={self.wb_pre} must be 0-4 chunks")
        for name in ("pf", "pf_rows", "l2_first", "wb_first"):
            if getattr(self, name) < 0:
                raise ValueError(f"NormConfig {name}={getattr(self, name)} must be >= 0 (0: no read-ahead / no threshold)")


def segments(N: int, cfg: NormConfig) -> tuple[int, int]:
    """(programs, columns) a row is split into by "loop" ``cfg``: segments of whole chunks,
    none empty, so a row may take fewer programs than ``cfg.split``. A cluster has 2-8 ranks
    or 16 (``_cluster.cluster_ok``): a count of 9-15 takes 8 wider segments instead (a 140000
    wide row of 4096-chunks in 16 would be 12)."""
    if cfg.mode != "loop" or cfg.split == 1:
        return 1, N
    for parts in (cfg.split, 8):
        seg = triton.cdiv(triton.cdiv(N, parts), cfg.block_n) * cfg.block_n
        split = triton.cdiv(N, seg)
        if not (cfg.cluster and 8 < split < 16):
            break
    return split, seg


def launch_segments(N: int, cfg: NormConfig) -> tuple[int, int]:
    """``segments(N, cfg)``, once ``cfg`` is checked against the width: a "rows" tile must
    cover it, 1-16 programs a row, 0-2 chunks held, and held or early-weight (``wb_pre``)
    chunks must start inside a split row's segment (past it they would be the next
    program's columns; past the row, as a whole row's or the last segment's may be, they
    are masked). Raises ValueError naming the field."""
    if cfg.mode == "rows" and N > cfg.block_n:
        raise ValueError(f"config.block_n={cfg.block_n} must cover the width {N} in mode 'rows'")
    if not 1 <= cfg.split <= 16:
        raise ValueError(f"config.split={cfg.split} must be from 1 to 16")
    if not 0 <= cfg.hold <= 2:
        raise ValueError(f"config.hold={cfg.hold} must be 0, 1 or 2")
    split, seg = segments(N, cfg)
    if cfg.mode == "loop" and split > 1 and (max(cfg.hold, cfg.wb_pre) - 1) * cfg.block_n >= seg:
        raise ValueError(f"config.hold={cfg.hold} / wb_pre={cfg.wb_pre} chunks of {cfg.block_n} do not fit "
                         f"the {seg} columns of a program's segment at width {N}")
    return split, seg


def _loop(block_n: int, warps: int, **flags) -> NormConfig:
    return NormConfig("loop", 1, block_n, warps, **flags)


# Mode "loop" by (is_rms, has_residual) and row width rounded up to a power of two: the best
# of sweeps on an H200 at 2**26 bf16 elements (tune_ops.py --focus, tenth and eleventh
# sessions; % of copy, the sweep's own harness). With the width a compile-time constant
# (const_n: the loop's trip count, masks and row addresses folded, as torch.compile's
# kernels have them) and 16-32 warps a row: rms_norm 8K 97% (whole rows 95%), 16K 96%
# (94%), 32K 95% (runtime width 91%), 64K 83-89% (84%); layer_norm 16K 93-94% (86%), 32K
# 92-93% (77%), 64K 80% (75%). With a residual, h is stashed in pass 1, and the constant
# width with 2-4 chunks an iteration: add_rms_norm 64K 92% (runtime width, 8192 x 16
# warps: 89%), 128K 89% (88%); add_layer_norm 32K 91% (85%), 64K 89% (86%), 128K 85%
# (84%). At 128K without a residual the first two chunks stay in registers (``hold``: a
# quarter of the row out of L2): rms_norm 80 -> 82%, layer_norm 72 -> 77%. Narrower rows
# run whole (94-99%). At 256K a row is split over 2-8 programs that
# exchange their sums once (``split``): rms_norm 67 -> 71%, layer_norm 62 -> 69%, add_*
# level with coop (83% / 79%); and 64 such rows (fewer than the SMs) 44-71% (coop) ->
# 50-81%. Without a residual, 4 programs a 256K row holding their first chunks beat 8
# holding none (twelfth session, two runs alike, tune-ops-256k-split-hold-h200-20261122-*.json):
# rms_norm (hold 2) 71.5 -> 75.0%, 64 rows 61.6 -> 63.8%; layer_norm (hold 1: hold 2 takes
# 64 registers at 16 warps and lost) 68.7 -> 69.3%, 64 rows 49.7 -> 58.1%. Without a residual
# the widest entry also serves wider rows; with one, wider rows take coop. Where these
# sweeps left a pick within a point or two of another (run to run, the same config moves
# by up to 4 points on a fresh machine), the earlier pick stayed.
# Thirteenth session (ab_patch.sh, two interleaved rounds alike within a point): the streamed
# y stored evict_first too (``drop_y``) at 64K-256K without a residual, rms_norm 88.3 ->
# 90.4, 82.1 -> 85.3, 74.3 -> 75.7%, layer_norm 80.4 -> 82.5, 77.3 -> 79.0, 69.1 -> 70.0%;
# layer_norm at 16K / 32K too (93.4 -> 94.3, 91.8 -> 93.5%; rms_norm at 8K-16K lost 1 point);
# with a residual only at 256K (add_rms_norm 83.2 -> 84.0, add_layer_norm 79.8 -> 80.2%,
# 64 rows of 256K +2-3; at 64K it lost 1-1.5 points).
LOOP_PICKS = {
    (True, False): {8192: _loop(4096, 16, hints=True, vec=True, const_n=True),
                    16384: _loop(8192, 16, hints=True, vec=True, const_n=True),
                    32768: _loop(8192, 32, hints=True, vec=True, unroll=2, const_n=True),
                    65536: _loop(16384, 32, hints=True, vec=True, const_n=True, drop_y=True),
                    131072: _loop(16384, 32, hints=True, vec=True, const_n=True, hold=2, drop_y=True),
                    262144: _loop(8192, 16, hints=True, vec=True, const_n=True, split=4, hold=2, drop_y=True)},
    (False, False): {16384: _loop(4096, 16, hints=True, vec=True, const_n=True, drop_y=True),
                     32768: _loop(8192, 32, hints=True, vec=True, const_n=True, drop_y=True),
                     65536: _loop(16384, 32, hints=True, vec=True, const_n=True, drop_y=True),
                     131072: _loop(16384, 32, hints=True, vec=True, const_n=True, hold=2, drop_y=True),
                     262144: _loop(8192, 16, hints=True, vec=True, const_n=True, split=4, hold=1, drop_y=True)},
    (True, True): {65536: _loop(16384, 32, hints=True, stash=True, vec=True, unroll=4, const_n=True),
                   131072: _loop(16384, 32, hints=True, stash=True, vec=True, const_n=True),
                   262144: _loop(8192, 16, hints=True, stash=True, vec=True, const_n=True, split=4, drop_y=True)},
    (False, True): {32768: _loop(8192, 16, stash=True, vec=True, const_n=True),  # at 32K best without hints
                    65536: _loop(16384, 32, hints=True, stash=True, vec=True, unroll=2, const_n=True),
                    131072: _loop(16384, 32, hints=True, stash=True, vec=True, const_n=True),
                    262144: _loop(16384, 32, hints=True, stash=True, vec=True, const_n=True, split=2, drop_y=True)},
}


# Per GPU model (a substring of the device's name): picks that replace LOOP_PICKS' and
# ROWS_PICKS' (or the rule's) on that GPU, keyed by (mode, is_rms, has_residual, width
# rounded up to a power of two), from H100 80GB HBM3 sweeps (seventeenth session, bf16):
# - "loop": each LOOP_PICKS entry's neighbours (tune_ops.py --near --rotate 2, 2**26
#   elements, results/tune-ops-near-h100-20261125{,-64rows}.json), taken where a neighbour
#   beat the H200's pick by 3 points or more, or won at both 256K shapes (256 and 64 rows):
#   layer_norm 64K two chunks an iteration 86.7 -> 93.0%; add_layer_norm 32K 16384-wide
#   chunks at 32 warps 94.4 -> 97.5%; rms_norm 256K 8 programs a row 82.7 -> 84.0% (64
#   rows: 71.7 -> 73.7%). Not taken: neighbours within 2 points, or that won at 2**26 but
#   lost at 64 rows (layer_norm 256K split 8: +3.6 / -2.7).
# - "rows": layer_norm 4K, a row a program at 8 warps (Liger-Kernel's launch) instead of the
#   rule's two rows: 96.5 -> 97.9% at 2**26 elements, 87.0 -> 90.3% at 4096 x 4096, where
#   Liger had read 91% to our 88% in the ops bench (tune_ops.py --modes rows --rotate 4
#   --repeat 2, results/tune-ops-rows-h100-20261125{,-4096sq}.json; the other rows picks
#   at 2K-8K were within a point of their best there).
# - "loop" as thread-block clusters (``cluster``, eighteenth session: a split row's sums
#   exchanged through shared memory, ``_cluster.py``; tune_ops.py --focus --cluster
#   --rotate 2, results/tune-ops-cluster-h100-20261125-{128k,256k,64rows,64k}.json), taken
#   where the best cluster config beat the pick by 3 points, or by 2 with its neighbour
#   (the other hold) beating it too; at 256K at both shapes (256 and 64 rows):
#   rms_norm 128K 89.7 -> 92.4%, 256K 80.7 -> 88.1 (64 rows 68.3 -> 76.8);
#   layer_norm 128K 84.2 -> 89.2, 256K 77.3 -> 83.6 (67.5 -> 73.5); add_rms_norm 128K
#   91.8 -> 93.8; add_layer_norm 128K 89.2 -> 92.8, 256K (the H200's pick, two programs a
#   row, as a cluster: results/tune-ops-cluster-held-h100-20261125*.json) 86.0 -> 88.7 (64
#   rows 81.7 -> 87.2). Not taken: add_rms_norm 256K (the pick won; as a cluster it lost
#   4-11 points), layer_norm 64K (93.2 -> 91.7 at best), whole segments held in registers
#   (--held: 14-30 points lower without a residual; add_rms_norm 128K +1.9, one run).
# - "rows" at 1K, where the ops bench had onetrip at 0.994-0.999x torch.compile with the
#   rule's two rows at 4 warps (nineteenth session, tune_ops.py --focus --config --rotate 2
#   --repeat 3, 2**26 elements, two runs alike within 0.2 points,
#   results/tune-ops-rows-late-shift-h100-20261126-1k{,-b}.json): rms_norm 2 rows at 8 warps
#   98.1 -> 99.4%, add_rms_norm the same 99.0 -> 99.4, layer_norm a row at 4 warps with the
#   weight and bias loaded after the statistics (``late_wb``: not live while the row loads)
#   98.0 -> 99.0; add_layer_norm's rule stays (every variant 98.9-99.3). In the ops bench
#   (twelve runs, 00:21-00:50 UTC) layer_norm 1K went 0.999 -> 1.004-1.010x torch.compile;
#   rms_norm and add_rms_norm stayed level with it (0.997-1.001x; all three at 98-99% of
#   copy, 99.4-99.8% of a copy of the same bytes), so the sweep's gain there is not seen.
#   add_rms_norm 1K then takes one row a program at 8 warps (twenty-eighth session, the ops
#   bench judging five rows configs, two interleaved rounds, results/ops-add-rms-1k-ab-h100-
#   20261126-session28.json): two rows at 8 warps 0.998 / 1.000x torch.compile (2991 / 2997
#   GB/s against 2998), one row at 8 warps 1.002 / 1.005x (3004 / 3013); one at 4 warps
#   1.000 / 1.000, two at 4 and four at 8 0.998-0.999.
# - "rows" with the width and row strides as constants (``const_n``, as torch.compile's
#   kernels have them; two interleaved ops-bench rounds of every rows config with and
#   without it, results/ops-...-20261126-const-ab-*.json): rms_norm 1K 98.0 / 98.2 ->
#   98.8 / 98.9% (0.998 / 1.000 -> 1.005 / 1.006x torch.compile), add_rms_norm 1K 98.9 /
#   98.8 -> 99.0 / 99.0, layer_norm 4096² 89.9 / 90.6 -> 91.9 / 92.1% (0.996 / 0.997 ->
#   1.011 / 1.014x Liger); taken there. Not where it lost: layer_norm 8192² 97.5 -> 96.8
#   (the rule's rows), add_layer_norm 16K 97.1 -> 94.4. rms_norm 2K at 8 warps with it (the
#   rows sweep's best at 2K, 98.7 against 98.1%, results/tune-ops-rows-h100-20261125.json):
#   0.996-0.999x Liger over ten runs before, 1.002 / 1.008x in the two after.
# - layer_norm 64K as a cluster of 4 (4096 x 16 warps) in place of the seventeenth
#   session's pick (16384 x 32 warps, two chunks an iteration): the sweep put it 1.5 points
#   behind (91.7 vs 93.2), the ops bench 1.2 ahead in each of three interleaved rounds
#   (89.6-89.8 -> 90.8-91.0%; results/ops-...-20261125-layer64k-ab-*.json and
#   ops-...-20261126-layer64k-ab-*.json; 90.7-91.0% in the last three runs, ...-norms-*.json).
#   Taken on the bench's word, the figure the bar is read from: the two harnesses disagree
#   on the old pick (93.2% swept, 89.7% benched), not on the cluster (91.7 / 91.0); why,
#   is not known.
# - layer_norm 128K and 256K with the segment in shared memory (``shelf``, twentieth
#   session: copied by cp.async, both passes read it there; clusters of 8 / 16 programs of
#   4096 x 8 warps, where the shelf's 32 KB a program leaves room for six an SM). Two
#   interleaved ops-bench rounds (results/ops-...-20261126-shelf-ab-*.json): 256 x 256K
#   80.6 / 80.6 -> 84.3 / 84.2%, 64 x 256K 70.3 / 70.5 -> 71.3 / 71.6, 512 x 128K 88.9 / 89.1
#   -> 89.4 / 89.7. rms_norm 128K with it: 92.3 / 92.5 -> 92.0 / 92.1, not taken; at 256K
#   the shelf was level in benchmarks/norm_fetch.py (88.3 vs 88.1) and 2 points behind on
#   64 rows, not tried in the bench.
# - LayerNorm's affine as FMAs (``fold``) on the two shelf picks and add_layer_norm 128K:
#   two interleaved ops-bench rounds on each of two machines (results/ops-...-20261126-
#   fold-ab{,2}-*.json), where the unfolded shelf kernel ran 4-5 points slow: layer_norm
#   128K / 256K 84.6-84.7 / 79.8 -> 89.6-89.7 / 84.5-84.8%, add_layer_norm 128K 90.6-91.1 ->
#   91.1-91.4; the other "loop" cells within 0.3 either way, so they keep the unfolded form
#   (and the H200's, unmeasured, whose 64K pick lost 6 points folded in the fourteenth session).
# - No L2 eviction hints (``hints`` off: no evict_last on pass 1, no evict_first on pass 2
#   or y) on the shelf picks, whose segment is read once into shared memory, and on the
#   stashed 128K clusters, whose h (8K columns a program) is re-read while still in L2
#   (twenty-fourth session; the hints came from the H200's non-cluster loop, and cost a
#   CUDA C++ copy of the same rows 3 points on the H100). Flipped on every H100 cluster pick
#   (tune_ops.py --focus --picks --flip hints --flip drop_y, three interleaved rounds), then
#   two interleaved ops-bench rounds (results/ops-...-20261126-session24-hints-ab-*.json):
#   layer_norm 128K 87.9-88.1 -> 89.7-89.8%, 256K 81.4 -> 84.9-85.0, 64 x 256K 68.7-68.8 ->
#   71.4-71.6; add_rms_norm 128K 93.6-93.7 -> 95.5-95.8; add_layer_norm 128K 91.1-91.3 ->
#   93.4-93.5. Kept where pass 2 re-reads from L2 (rms_norm's held chunk: hints off lost 1.4
#   -3 points at 128K-256K; the stashed 256K picks: 11 points).
# - ``maxnreg=48`` on the two shelf picks (twenty-seventh session): Triton builds with the ptxas
#   TRITON_PTXAS_PATH names, which Inductor sets to torch's own (CUDA 13.0 in torch 2.11+cu130)
#   when it compiles a Triton kernel in the process (its compile workers set it in theirs).
#   That ptxas squeezed these kernels to 44 registers and issued pass 2's four weight and
#   bias loads two at a time (SASS: two loads, their FMAs, two more), where Triton's 12.8
#   issues all four at once with 48: 256 x 256K 85.7 -> 81.9%, 64 x 256K 71.4 -> 68.1,
#   512 x 128K 89.7 -> 89.3 (tune_ops, empty caches).
#   The cap (.maxnreg 48, still five CTAs an SM) gives 13.0 the 12.8 schedule: 85.8 / 71.9 /
#   89.7, and 12.8's build is unchanged (results/tune-ops-maxnreg-h100-20261126-session27/,
#   logs/tune-ops-maxnreg-*.log). This was the ops bench's process-to-process "slow state".
# - Read-ahead into the L2 (``pf``, ``_l2_ahead.py``): layer_norm's 128K shelf pick asks for
#   its segment of the row 32 rows on, from 384 rows (``pf_rows``). Twenty-fifth session
#   (tune_ops, pick -> pf 32 at 132 / 256 / 384 / 512 / 768 / 1024 rows: 75.5 -> 74.6, 84.8 ->
#   84.2, 88.7 -> 89.9, 91.0 -> 92.4, 92.6 -> 94.8, 93.8 -> 96.1: the gain grows with the rows
#   behind the ~80 in flight). It was dropped then because the ops bench read it 9-11 points
#   slow after torch.compile had run; that was torch's ptxas (above), and with ``maxnreg=48``
#   ptxas 13.0 gives the pf kernel 12.8's SASS (offline, every opcode alike). Twenty-eighth
#   session, two interleaved ops-bench rounds (results/ops-layer-pf-ab-h100-20261126-session28.json):
#   512 x 128K 89.7 / 89.6 -> 91.0 / 90.9%, and 90.9 with every kernel built by torch's ptxas.
#   Not at 256K: pf 12 there (tune_ops +1.9 / +1.7 at 256 / 64 rows) lost in the same bench,
#   85.8-85.9 -> 84.7-84.8, 64 x 256K 72.5-72.7 -> 70.7-70.9. Elsewhere it lost outright in
#   tune_ops: the picks that re-read their row from L2 (rms_norm; the residual picks, whose
#   stashed h fills the L2), and any pick when the request is made at the program's start.
# - add_rms_norm 256K as a cluster of 16 (8192 x 16 warps, a chunk held, no hints), from 128 rows
#   (thirtieth session, after the cluster exchange lost its GPU-scope fence: 88.5 -> 93.3% at
#   256 rows; FEW_ROWS_GPU below keeps the split through global memory under 128 rows).
# - Pass 2's first weight (and bias) chunks loaded before the exchange (``wb_pre``; thirty-first
#   session, tune_ops --picks --vary wb_pre, two runs on two H100s, results/tune-ops-wbpre-*-session31*):
#   add_rms_norm 256K two chunks 92.5 / 93.7 -> 94.3 / 94.8% (128 rows 89.2 -> 91.4); rms_norm 256K
#   one chunk 94.2 / 94.3 -> 94.9 / 94.8; layer_norm 128K's shelf one chunk, asked for with the
#   shelf's copies (``wb_early``), 94.3 -> 95.3. Elsewhere within 0.5 or lower (more registers:
#   LayerNorm's shelf under its cap of 48 lost 0.4-2.5 on 64 rows, the 32-register clusters 2-4).
#   Two interleaved ops-bench rounds (results/ops-wbpre-ab-h100-20261127-session31-*.json): rms_norm
#   256K 94.0 / 93.9 -> 94.6 / 94.5%, 64 x 256K (FEW_ROWS_GPU's shelf) 82.9 -> 85.0 / 85.1; add_rms_norm
#   256K 92.4 / 91.9 -> 94.0 / 93.7; layer_norm 128K 93.9 / 94.0 -> 95.0 / 94.9.
# - add_layer_norm 256K as a cluster of 16 (8192 x 16 warps, no L2 hints, fold, two chunks' weight
#   and bias before the exchange), from 128 rows (thirty-first session, tune_ops --config --rotate 2
#   --repeat 3, results/tune-ops-alayer-wbpre-h100-20261127-session31.json): 88.3 -> 92.3-92.5% at
#   256 rows, 88.8 -> 93.6 at 512, 88.3 -> 89.1 at 128; at 64 rows 83.8 against 90.2, so below 128
#   rows FEW_ROWS_GPU keeps the eighteenth session's pick (a cluster of 2, 16384 x 32 warps). The
#   same cluster without wb_pre had read 85.7-86.1 (thirtieth session): its two chunks' weight and
#   bias (59 registers, still two CTAs an SM) are what it lacked. Ops bench, rounds base new new base
#   (results/ops-alayer-ab-h100-20261127-session31-*.json): 256 x 256K 87.5 / 87.3 -> 92.3 / 91.8%.
# - Each chunk's loads issued before the previous chunk's stores (``pipe``; thirty-second session,
#   tune_ops on two H100s, results/tune-ops-h100-20261127-session32-run*.json): the two 256K
#   residual clusters with pass 1's (the held chunk's and the streamed chunk's x and r asked for
#   before any h is stored): add_rms_norm 94.6 -> 96.4% at 256 rows, 91.2 -> 94.2 at 128, and at 64
#   rows 90.1 against the split's 87.7, so FEW_ROWS_GPU no longer sends it to the split;
#   add_layer_norm 91.8-92.2 -> 93.5. Pass 2's (the next chunk's weight and h) on the 64-row cluster
#   of 2 of add_layer_norm (90.1 -> 90.6) and on rms_norm's 64-row shelf, there without L2 hints
#   (85.8 -> 87.1). Ops bench, rounds new base base new on one H100
#   (results/ops-pipe-ab-h100-20261127-session32-*.json): add_rms_norm 256 x 256K 94.0 / 94.0 ->
#   95.9 / 96.1%, 64 x 256K 86.2 / 86.1 -> 88.9 / 88.8; add_layer_norm 91.5 / 92.0 -> 93.2 / 93.5,
#   64 x 256K 88.6 / 87.9 -> 89.0 / 88.7; rms_norm 64 x 256K 84.3 / 85.1 -> 85.7 / 85.4. Elsewhere
#   pipe was level or lower: a segment of one or two chunks leaves it nothing to do, pass 2's
#   registers cost the 32-register clusters a CTA an SM (rms_norm 256K -2.2) and spill LayerNorm's
#   shelf under its cap of 48 (-17 to -22).
# - rms_norm 256K at every row count on the 64-row shelf form (4096 x 8 warps, two chunks' weight
#   asked for with the shelf's copies, pass 2's pipe, no L2 hints) in place of the cluster of 16
#   that held a chunk (thirty-second session, tune_ops --rotate 2 --repeat 3, runs 7-8 on one H100):
#   94.8 -> 96.7% at 256 rows, 96.8 -> 98.0 at 512, 90.4 -> 93.8 at 128. Ops bench, rounds new base
#   base new (results/ops-rms-shelf-ab-h100-20261127-session32-*.json): 256 x 256K 94.6 / 94.6 ->
#   95.9 / 95.7%; the rest within the run's noise (FEW_ROWS_GPU's entry was this form already).
#   At 128K as clusters of 8 (run 8: 96.3 -> 97.2% at 512 rows, 87.8 -> 91.7 at 128; run 9's
#   ops bench, results/ops-rms128-ab-h100-20261127-session32-*.json: 512 x 128K 95.9 / 96.0 ->
#   96.5 / 96.5%).
# - add_rms_norm 256K with both of a segment's chunks held (hold 2: pass 2 reads nothing back but
#   the weight, which wb_pre has asked for; 64 registers, still two CTAs an SM, with CUDA 13.0's
#   ptxas too): tune_ops (run 9) 96.5 -> 97.5% at 256 rows, 90.1 -> 91.6 at 64.
# - "rows": layer_norm 8K a row a program at 4 warps (155 registers, no spills) instead of the rule's
#   two rows at 16 warps, where the ops bench had it level with torch.compile (0.984-1.002x over the
#   thirty-first session's runs). Thirty-second session: tune_ops --rotate 4 --repeat 3, 97.4 -> 98.0%
#   (late_wb or const_n with it 94.8 / 96.9; a row at 8 warps 97.4); the ops bench, rounds base new
#   new base (results/ops-layer8k-ab-h100-20261127-session32-*.json): 97.5 / 97.3 -> 98.3 / 98.4%,
#   1.002 / 0.999 -> 1.011 / 1.010x torch.compile, the other cells within 0.2.
# - The 256K picks ask the L2 for their segment's first chunks before they wait for the previous
#   kernel (``l2_first``, thirty-fourth session): under PDL the next call's first wave is resident
#   while this call's tail runs, and 4-9 MB asked then start it from L2 (the whole segment, 17-64 MB,
#   delayed the previous call's drain instead: rms_norm 64 x 256K -1.5, add_layer_norm's cluster of
#   2 -14). tune_ops (run 5, 64 x 256K, chunks asked 0 / 1 / 2 / 4): rms_norm 89.0 / 93.4 / 92.8 /
#   86.3, layer_norm 80.9 / 84.1 / 85.5 / 81.8, add_rms_norm 91.5 / 93.2 / 91.6 / 91.5,
#   add_layer_norm's cluster of 2 88.5 / 88.8 / 87.2 / 84.2; add_layer_norm's 16-rank cluster (its
#   two chunks) 94.0 -> 94.5 at 256 rows, 95.1 -> 95.8 at 512. Ops bench, rounds new base base new
#   (results/ops-l2first-chunks-ab-h100-20261127-session34-*.json): 64 x 256K rms_norm 92.8 / 88.0 /
#   88.2 / 92.6%, add_rms_norm 92.4 / 90.8 / 91.0 / 92.5, layer_norm 83.9 / 80.9 / 80.4 / 84.2,
#   add_layer_norm 90.0 / 89.6 / 89.8 / 90.2; 256 x 256K +0.6-1.4; the rest within 0.5.
# - layer_norm 256K's shelf summing each chunk as its copies land (``shelf_pipe``) with its first
#   chunk's weight and bias asked for with the copies (``wb_pre=1, wb_early``), thirty-sixth
#   session: tune_ops (runs 6-7) 64 x 256K 85.9-86.0 -> 87.4-87.5%, 256 x 256K 93.1-93.2 ->
#   94.6-94.8 (either alone +0.3-0.9); ops bench, rounds new base base new (results/ops-layer-
#   shelfpipe-ab-h100-20261127-session36-*.json): 84.4 / 84.5 -> 86.4 / 86.6, 92.5 / 92.7 -> 94.3 / 94.4.
# - layer_norm 128K and 256K with pass 2's weight and bias loaded L1::evict_last (``wb_last``), kept ahead
#   of the shelf's copies, which pass the L1 (thirty-seventh session): ops bench, rounds new base base
#   new (results/ops-layer-wblast-ab-h100-20261127-session37-*.json): 64 x 256K 86.4 / 86.5 -> 87.6 / 87.7%,
#   512 x 128K 95.7 / 95.8 -> 96.2 / 96.4, 256 x 256K 94.2 -> 94.4; rms_norm level in tune_ops (not taken).
#   Thirty-eighth session, the residual picks too (add_rms_norm and add_layer_norm at 128K and 256K, and
#   FEW_ROWS_GPU's 64-row cluster of 2): tune_ops +0.2-1.3 at every row count (rms_norm's shelf -0.1 to -0.8:
#   left); ops bench, rounds new old old new (results/ops-residual-wblast-ab-h100-20261127-session38-*.json):
#   add_rms_norm 64 x 256K 92.8 / 92.7 -> 94.6 / 94.9%, 256 x 256K 98.1 / 98.0 -> 98.6 / 98.6, 512 x 128K
#   97.9 -> 98.2 / 98.3; add_layer_norm 64 x 256K 89.4 / 89.9 -> 90.9 / 90.6, 256 x 256K 94.4 / 94.2 -> 94.8 /
#   94.9, 512 x 128K 97.2 -> 97.8 / 97.7.
# - layer_norm 256K's second chunk's weight and bias asked for once the shelf's sums are in (``wb_mix``; the
#   first chunk's still with the copies), thirty-ninth session: two chunks early at once spill under the cap of
#   48 (6 bytes, 77-84%), split so they do not (48 registers, y bitwise equal). tune_ops 94.6 -> 95.1% at 256
#   rows, 87.8 -> 87.9 on 64; ops bench, rounds new old old new (results/ops-layer-wbmix-ab-h100-20261127-
#   session39-*.json): 256 x 256K 94.5 / 94.6 -> 95.1 / 95.1%, 64 x 256K 87.7 / 88.0 -> 88.1 / 88.1. At 128K
#   level (96.3-96.4 both; tune_ops -0.3 at 128 rows): not taken there. Then replaced by:
# - layer_norm 256K's pass 2 in half-chunk steps (``half_steps``: 2048 columns, one 16-byte load of
#   weight and of bias a thread), each step's weight and bias two steps ahead, the first two with the
#   shelf's copies (wb_pre=1 early): the look-ahead of pipe 2 at 48 registers, no spills (pipe 2 needs
#   56), y bitwise equal. tune_ops (thirty-ninth session, results/tune-ops-layer-half-steps-h100-20261127-
#   session39.tgz) 88.1 -> 89.2% on 64 rows, 94.9 -> 95.2 at 256; ops bench, rounds new old old new
#   (results/ops-layer-halfsteps-ab-h100-20261127-session39-*.json): 64 x 256K 88.0 / 87.9 -> 89.4 / 89.4%,
#   256 x 256K 95.1 / 95.0 -> 95.3 / 95.3, the other widths level.
# - Fortieth session, timed as the ops bench times (its input sets and calls, in one process, the variants
#   interleaved over 4 rounds; results/logs/ab-norm-*-h100-20261127-session40.log): layer_norm
#   128K's pass 2 in half steps too, 96.2-96.3 -> 96.9% at 512 rows (ops bench, rounds new old old new: 96.5 /
#   96.4 -> 96.9 / 97.0), 81.7 -> 83.1 at 128 (tune_ops); and layer_norm 256K's first two rows asking the L2 for
#   their segment's weight and bias before the PDL wait (``wb_first``; _l2_ahead): 95.2-95.3 -> 96.1 at 256
#   rows, 89.3-89.5 -> 89.8-90.0 on 64 (1, 2, 4 rows alike; 8 level, 16 -0.9, 64 -3.5).
_CLUSTER = dict(hints=True, vec=True, const_n=True, cluster=True)
_CLUSTER_NH = dict(_CLUSTER, hints=False)
PICKS_GPU = {
    "H100": {
        ("loop", False, False, 65536): _loop(4096, 16, split=4, drop_y=True, **_CLUSTER),
        ("loop", False, True, 32768): _loop(16384, 32, stash=True, vec=True, const_n=True),
        ("loop", True, False, 131072): _loop(4096, 8, split=8, shelf=True, maxnreg=48, wb_pre=2, wb_early=True,
                                             pipe=2, **_CLUSTER_NH),
        ("loop", True, False, 262144): _loop(4096, 8, split=16, shelf=True, maxnreg=48, wb_pre=2, wb_early=True,
                                             pipe=2, l2_first=1, **_CLUSTER_NH),
        ("loop", False, False, 131072): _loop(4096, 8, split=8, shelf=True, fold=True, maxnreg=48, pf=32,
                                              pf_rows=384, wb_pre=1, wb_early=True, half_steps=True, wb_last=True,
                                              **_CLUSTER_NH),
        ("loop", False, False, 262144): _loop(4096, 8, split=16, shelf=True, fold=True, maxnreg=48, l2_first=2,
                                              wb_first=2, shelf_pipe=True, wb_pre=1, wb_early=True, half_steps=True,
                                              wb_last=True, **_CLUSTER_NH),
        ("loop", True, True, 131072): _loop(4096, 8, stash=True, split=16, wb_last=True, **_CLUSTER_NH),
        ("loop", False, True, 131072): _loop(4096, 8, stash=True, split=16, fold=True, wb_last=True, **_CLUSTER_NH),
        ("loop", False, True, 262144): _loop(8192, 16, stash=True, split=16, fold=True, wb_pre=2, pipe=1,
                                             l2_first=2, wb_last=True, **_CLUSTER_NH),
        ("loop", True, True, 262144): _loop(8192, 16, stash=True, split=16, hold=2, wb_pre=2, pipe=1, l2_first=1,
                                            wb_last=True, **_CLUSTER_NH),
        ("rows", False, False, 4096): NormConfig("rows", 1, 4096, 8, const_n=True),
        ("rows", False, False, 8192): NormConfig("rows", 1, 8192, 4),
        ("rows", True, False, 1024): NormConfig("rows", 2, 1024, 8, const_n=True),
        ("rows", True, True, 1024): NormConfig("rows", 1, 1024, 8, const_n=True),
        ("rows", False, False, 1024): NormConfig("rows", 1, 1024, 4, late_wb=True),
        ("rows", True, False, 2048): NormConfig("rows", 1, 2048, 8, const_n=True),
    },
}


# Per GPU model: (rows, config) where fewer than ``rows`` rows take ``config`` in place of the
# entry that PICKS_GPU (or LOOP_PICKS) has for the same key. H100, thirtieth session (the
# st.async exchange; tune_ops.py --focus --config --rotate 2 --repeat 2, medians of two,
# results/logs/tune-ops-xasync-rows-h100-20261126-session30.log), % of copy at 256 / 128 / 64 rows:
# - add_rms_norm 256K: a cluster of 16 (8192 x 16 warps, a chunk held, no L2 hints) 93.3 / 88.8
#   / 84.4 against the split through global memory 88.5 / 87.9 / 87.4, so from 128 rows the
#   cluster (PICKS_GPU above) and below that the H200's split (LOOP_PICKS), until the
#   thirty-second session's ``pipe`` took the cluster to 90.1 on 64 rows (the split 87.7): no
#   entry now;
# - rms_norm 256K (an entry until the thirty-second session, when the form below won at every
#   row count and became PICKS_GPU's): the shelf in clusters of 16 (4096 x 8 warps) 92.8 / 87.2
#   / 86.6 against the cluster pick's 94.2 / 90.4 / 82.4 (the 128-row pair from another run on another H100,
#   results/tune-ops-xasync-rms-128rows-h100-20261126-session30.json).
#   With two chunks of its weight asked for as its copies are issued (``wb_pre``, ``wb_early``;
#   thirty-first session): 82.6 -> 85.5 on 64 rows (all four chunks, before the exchange: 80.5 -> 84.0
#   on another H100). Thirty-second session: with pass 2's ``pipe`` and no L2 hints 85.8 -> 87.1.
# - add_layer_norm 256K (thirty-first session, tune_ops --config --rotate 2 --repeat 3): the cluster
#   of 16 with two chunks' weight and bias before the exchange 92.5 / 89.1 / 83.8 against the cluster
#   of 2's 88.3 / 88.3 / 90.2, so the cluster of 2 under 128 rows. With ``pipe`` (thirty-second
#   session, run 3): the cluster of 16 (pass 1's) 90.7 / 84.7 at 128 / 64 rows, the cluster of 2
#   (pass 2's; pass 1's spills at 32 warps) 88.6 / 90.6: the same line. Pass 2 two chunks an
#   iteration beside its pipe (run 13-14): 90.4 -> 91.0 on 64 rows (88.8 at 128); ops bench, rounds
#   new base base new (results/ops-alayer-unroll-ab-h100-20261127-session32-*.json): 64 x 256K 88.5
#   / 88.6 -> 88.8 / 89.2%.
FEW_ROWS_GPU = {
    "H100": {
        ("loop", False, True, 262144): (128, _loop(16384, 32, stash=True, split=2, drop_y=True, pipe=2, unroll=2,
                                                   l2_first=1, wb_last=True, **_CLUSTER)),
    },
}

# The H200 takes the H100's wide "loop" picks (64K-256K; thirty-ninth session): its own, from the
# fourteenth session's sweeps, take no clusters, shelves or L2 requests. tune_ops on an H200
# (--rotate 4 --repeat 2, results/tune-ops-h200-h100picks-20261127-session39.tgz), % of copy, its
# own -> the H100's: rms_norm 256K 75.3 -> 89.9 (256 rows), 63.0 -> 78.7 (64), 128K 85.1 -> 91.1 (512);
# layer_norm 256K 68.2 -> 82.4, 59.0 -> 71.6, 128K 79.2 -> 85.6, 64K 81.0 -> 84.5 (1024 rows; 71.6 ->
# 71.1 on 256); add_rms_norm 256K 81.6 -> 92.9, 76.8 -> 84.9, 128K 87.4 -> 91.7; add_layer_norm 256K
# 77.7 -> 82.4, 72.0 -> 82.0, 128K 85.5 -> 89.5; at 128 rows of 128K (the H200's own pick there is
# "coop") +11 to +23. The narrower picks and the "rows" ones stay the H200's.
# Fortieth session (benchmarks/norm_ab.py, timed as the ops bench times, 4 rounds interleaved; results/ab-norm-
# layer-h200-20261127-session40.json): layer_norm's new H100 forms won there too, 256K (half steps, wb_first=2)
# 70.9 -> 73.2% on 64 rows, 82.2 -> 83.3 on 256, against the wb_mix form of the run above; 128K (half steps)
# 85.4 -> 86.2 at 512 rows. So every wide "loop" pick is the H100's.
PICKS_GPU["H200"] = {key: cfg for key, cfg in PICKS_GPU["H100"].items() if key[0] == "loop" and key[3] >= 65536}
FEW_ROWS_GPU["H200"] = dict(FEW_ROWS_GPU["H100"])


# Mode "rows" where the rule in ``norm_config`` (two rows a program up to 4K, ~32 elements a
# thread) lost in the thirteenth session's sweeps on an H200 (tune_ops.py --modes rows
# --rotate 4: the kernels timed back to back, as the ops bench now does; two runs alike
# within 0.2 points, at 2**26 and at 2**24 elements, tune-ops-rows-rotate-h200-20261122-*.json):
# a row a program from 2K, except layer_norm without a residual. At 2**26 / 2**24 elements:
# rms_norm 2K 94.0 -> 96.3% (85.9 -> 84.8: the one entry that loses at the smaller size),
# 4K 94.7 -> 95.1 (84.6 -> 85.0); add_rms_norm 4K
# 95.3 -> 95.7 (90.4 -> 90.9), 8K 95.5 -> 96.1 (90.6 -> 90.5); add_layer_norm 2K 96.1 ->
# 98.2 (91.1 -> 91.6), 4K 94.9 -> 95.8 (89.2 -> 90.4), 8K 95.3 -> 97.3 (88.4 -> 90.3). Picks
# that won only at 2**26 (add_rms_norm 4K at 32 warps: 96.7 but 89.3) lost a wave's tail on
# 4096 rows and were not taken; so was layer_norm's 4K at 4 warps, which the sweep put +0.7
# / +1.1 ahead and two ops benches -0.5 / -1.6 behind (the sweep's calls reuse one buffer).
# No spills (38-80 registers).
_RESIDUAL_ROWS = {2048: NormConfig("rows", 1, 2048, 4), 4096: NormConfig("rows", 1, 4096, 4),
                  8192: NormConfig("rows", 1, 8192, 16)}
ROWS_PICKS = {
    (True, False): {2048: NormConfig("rows", 1, 2048, 4), 4096: NormConfig("rows", 1, 4096, 8)},
    (False, False): {},
    (True, True): _RESIDUAL_ROWS,
    (False, True): _RESIDUAL_ROWS,
}


def _can_wait(device: torch.device) -> bool:
    """Programs may spin on a sibling's counter ("coop", a split "loop" row): on a GPU,
    not under the interpreter, which runs programs one after another."""
    return not is_interpreting() and device.type == "cuda"


def norm_config(rows: int, width: int, device: torch.device, *, is_rms: bool = True,
                has_residual: bool = True, chunk: int = 8192, chunk_warps: int = 4,
                dense: bool = True) -> NormConfig:
    """A program per row ("loop") where ``LOOP_PICKS`` has the width and there is a row for
    every SM (for a row split over programs, half the SMs' worth of programs); else whole
    rows up to 16K elements (32K for RMSNorm), ``ROWS_PICKS`` where it has the width; else
    chunks of ``chunk`` ("coop", "two_pass"). On a GPU model that ``PICKS_GPU`` names, its
    own "loop" and "rows" picks come first, and ``FEW_ROWS_GPU``'s under their row counts.

    Whole rows: 94-99% of copy up to 16K wide with tiles of two rows up to 4K (LayerNorm to
    16K; one row from 2K to 8K where ROWS_PICKS says) and ~32 elements a thread; add +
    RMSNorm 96% at 32K with 32 warps; wider single-row programs spill (17-62%). "loop"
    needs a row for every SM: 64 rows of 256K (64 programs on 132 SMs) fell 41% -> 27%
    (ops-nvidia-h200-bf16-20261121-layer_norm-loop.json),
    so fewer rows take coop (or whole rows where they fit); split over 2-8 programs, the
    same 64 rows ran at 50-81% against coop's 44-71% (tune-ops-split-h200-20261122-b.json).
    ``dense``: every row stride equals the width. The 8K pick gains only with the width a
    constant, which strided rows do not get (a runtime width ran at 88% against whole
    rows' 95%), so strided rows of 8K stay whole.
    """
    block_n = triton.next_power_of_2(max(width, 1))
    picks = LOOP_PICKS[(is_rms, has_residual)]
    key = block_n if has_residual else min(block_n, max(picks))
    gpu = gpu_name(device)
    pick = gpu_table_entry(PICKS_GPU, gpu, ("loop", is_rms, has_residual, key)) or picks.get(key)
    few = gpu_table_entry(FEW_ROWS_GPU, gpu, ("loop", is_rms, has_residual, key))
    if few is not None and rows < few[0]:
        pick = few[1]
    sms = sm_count(device)
    if pick is not None and rows * pick.split >= (sms if pick.split == 1 else sms // 2) \
            and (dense or block_n > 8192):
        return pick
    if block_n <= 16384 or (block_n == 32768 and is_rms):
        row_pick = (gpu_table_entry(PICKS_GPU, gpu, ("rows", is_rms, has_residual, block_n))
                    or ROWS_PICKS[(is_rms, has_residual)].get(block_n))
        if row_pick is not None:
            return dataclasses.replace(row_pick, block_m=min(row_pick.block_m, triton.next_power_of_2(max(rows, 1))))
        pair = 2 if block_n <= 4096 or not is_rms else 1
        block_m = max(1, min(triton.next_power_of_2(max(rows, 1)), max(pair, 2048 // block_n)))
        warps = max(4, min(16 if block_n <= 16384 else 32, block_m * block_n // 1024))
        return NormConfig("rows", block_m, block_n, warps)
    n_chunks = triton.cdiv(width, chunk)
    coop = _can_wait(device) and n_chunks <= sm_count(device)
    return NormConfig("coop" if coop else "two_pass", 1, chunk, chunk_warps)
