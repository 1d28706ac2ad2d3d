"""Registers and spills of the engine's decode-step kernels, compiled for sm_90a without a GPU:
the batch-1 GEMV variants and decode_attention's launch configs (and its TMA experiment:
shared memory, and whether the pipeliner keeps tiles in flight); then flash_attention's TMA
tiles beside their pointer twins.

    python tools/ptxas_report.py      # needs triton (3.6 = the GPU image's) and CUDA's ptxas

Triton compiles the kernel to PTX for a Hopper target on any machine; ptxas -v then gives
the resource report the device would. A fused kernel that spills is unfused in disguise.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

PTXAS = os.environ.get("PTXAS", "/usr/local/cuda/bin/ptxas")
POINTERS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "y_ptr": "*bf16", "res_ptr": "*bf16",
            "ss_out_ptr": "*fp32", "ss_in_ptr": "*fp32", "nw_ptr": "*bf16",  # the GEMV
            "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "o_ptr": "*bf16", "seqlens_ptr": "*i32",
            "table_ptr": "*i32", "ws_o_ptr": "*fp32", "ws_lse_ptr": "*fp32",
            "kn_ptr": "*bf16", "vn_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32"}  # decode attention
FLOATS = ("eps", "qk_scale", "softcap_log2")
BASE = dict(W_EVICT="evict_first", HAS_BIAS=False, RES_OUT=False, NORM_IN=False, NORM_LATE=False, BLOCK_SS=512,
            SPLIT=False, USE_DOT=False, EVEN_K=True, SILU_MUL=False, BLOCK_M=1, BLOCK_N=8, BLOCK_K=1024,
            ACC=tl.float32, PDL=0, EARLY=0)
VARIANTS = {  # (constexprs, num_warps): the engine's configs at batch 1 (_gemv_config)
    "qkv/o/down plain, 8 x 1024": ({}, 8),
    "qkv + RMSNorm prologue": ({"NORM_IN": True}, 8),
    "qkv + RMSNorm, rsqrt late": ({"NORM_IN": True, "NORM_LATE": True}, 8),
    "o + residual epilogue, 4 x 1024": ({"RES_OUT": True, "BLOCK_N": 4}, 8),
    "down + SwiGLU prologue + residual, 4 x 1024": ({"RES_OUT": True, "SILU_MUL": True, "BLOCK_N": 4}, 8),
    "gate_up / lm_head + RMSNorm, 16 x 256": ({"NORM_IN": True, "BLOCK_N": 16, "BLOCK_K": 256}, 4),
    "qkv + RMSNorm, PDL wait": ({"NORM_IN": True, "PDL": 1}, 8),
    "qkv + RMSNorm, PDL, one weight chunk before the wait": ({"NORM_IN": True, "PDL": 1, "EARLY": 1}, 8),
    # the launch table (skinny_matmul._TUNED_GEMV)
    "table: 1B gate_up + RMSNorm, 16 x 256": ({"NORM_IN": True, "BLOCK_N": 16, "BLOCK_K": 256}, 8),
    "table: 1B gate_up plain, 32 x 256": ({"BLOCK_N": 32, "BLOCK_K": 256}, 4),
    "table: 8B qkv (+ RMSNorm), 8 x 512": ({"NORM_IN": True, "BLOCK_K": 512}, 4),
    "table: 8B o + residual, 16 x 1024": ({"RES_OUT": True, "BLOCK_N": 16}, 8),
    "table: 8B down + SwiGLU + residual, 8 x 1024": ({"RES_OUT": True, "SILU_MUL": True}, 4),
}


def _compile_marked(fn, sig: dict, const: dict, attrs: dict, warps: int, stages=None, maxnreg: int = 0):
    """Compile ``fn`` for sm_90a with the signature, constexprs (by name) and divisibility
    marks (by argument index) that a launch would give it; ``maxnreg``: ptxas's register cap
    (0: none), as a launch option gives it."""
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
                    attrs=attrs)
    options = {"num_warps": warps} if stages is None else {"num_warps": warps, "num_stages": stages}
    if maxnreg:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def _ptxas(ptx: str) -> tuple[str, str, str]:
    """(registers, the spill-store figure, the whole spill line) of ptxas -v for sm_90a."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    err = subprocess.run([PTXAS, "--gpu-name", "sm_90a", "-v", f.name, "-o", os.devnull],
                         capture_output=True, text=True).stderr
    regs = next((ln.split("Used ")[1].split(" registers")[0] for ln in err.splitlines() if "registers" in ln), "?")
    stores = next((p.strip() for ln in err.splitlines() for p in ln.split(",") if "spill stores" in p), "?")
    line = next((ln.strip() for ln in err.splitlines() if "spill" in ln), "?")
    return regs, stores, line


def bf16_report(fn, constexprs: dict, num_warps: int, types: dict | None = None) -> str:
    """Registers and spills of ``fn`` with every ``*_ptr`` a 16-byte-aligned bf16 pointer (as
    a launch on dense torch tensors marks it) unless ``types`` names another type, ``eps`` a
    float and the other ints runtime values (the norm experiments' kernels)."""
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        sig[n] = "constexpr" if n in constexprs else (types or {}).get(n) or (
            "*bf16" if n.endswith("_ptr") else "fp32" if n == "eps" else "i32")
        if n.endswith("_ptr"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    regs, _, line = _ptxas(_compile_marked(fn, sig, constexprs, attrs, num_warps).asm["ptx"])
    return f"{regs} registers; {line}"


def report(fn, constexprs: dict, num_warps: int) -> str:
    """Registers and spills of ``fn`` compiled without divisibility marks (what a launch
    whose ints are not multiples of 16 gets)."""
    sig = {n: "constexpr" if n in constexprs else POINTERS.get(n, "fp32" if n in FLOATS else "i32")
           for n in fn.arg_names}
    regs, _, line = _ptxas(_compile_marked(fn, sig, constexprs, {}, num_warps).asm["ptx"])
    return f"{regs} registers; {line}"


# decode_attention at 32 query / 8 kv heads, q_len 1 (16 score rows: tl.dot's minimum), split-KV
DECODE = dict(GROUP=4, Q_LEN=1, PAGED=False, PAGE_SIZE=1, SOFTCAP=False, HAS_WINDOW=False, SPLIT=True,
              PRECISION="tf32", BLOCK_M=16, BLOCK_D=128, MIN_TILES=4, APPEND=False, INTERLEAVED=False,
              BLOCK_Q=16, TABLE_AHEAD=False, USE_TMA=False, TRIGGER=False,  # constexprs with defaults are passed too
              k_desc=None, v_desc=None)                      # (ASTSource needs them); no descriptors


# decode_attention as launched at batch 1 x 4K (bf16, 32 / 8 heads, head dim 128, 8 splits):
# the ints Triton marks divisible by 16 at a launch get the mark here too (num_splits = 8
# not). It matters: with head_dim and the strides marked, the pointer path's K/V loads
# become 16-byte cp.async copies that the pipeliner double-buffers (128-key tiles, 8 warps,
# 3 stages: 80 registers, 136 KiB shared); the unmarked compile of the rows above keeps
# them as 137 scalar loads, not pipelined (207 registers). Those rows say what a head dim
# that is not a multiple of 16 gets.
DECODE_INTS = dict(kv_heads=8, num_splits=8, head_dim=128, half=0, stride_qb=4096, stride_qs=4096, stride_qh=128,
                   stride_kb=4096 * 1024, stride_ks=1024, stride_kh=128, stride_vb=4096 * 1024, stride_vs=1024,
                   stride_vh=128, stride_ob=4096, stride_os=4096, stride_oh=128, stride_tb=0, stride_knb=0,
                   stride_kns=0, stride_knh=0, stride_vnb=0, stride_vns=0, stride_vnh=0, stride_cos=0, stride_sin=0,
                   window_left=0)


def decode_launch_report(block_n: int, warps: int, stages: int, use_tma: bool, **constexprs) -> str:
    """Registers, spills and shared memory of ``_decode_kernel`` (contiguous, split, q_len 1,
    group 4, DECODE_INTS' marks) at this tile and ``num_stages``, and its pipeline as
    compiled: the asynchronous copies in the PTX (cp.async.bulk.tensor for TMA, cp.async
    for pointers), the buffers per K/V tile (the leading dim of the key loop's shared
    allocations; none: one tile at a time) and the copies issued inside the loop.
    ``constexprs`` override DECODE's (PAGED, PAGE_SIZE, APPEND, TABLE_AHEAD, ...)."""
    fn = importlib.import_module("onetrip.ops.decode_attention")._decode_kernel
    const = {**DECODE, "BLOCK_N": block_n, "USE_TMA": use_tma, **constexprs}
    bd = const["BLOCK_D"]
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n.endswith("_desc") and use_tma:  # (1, BLOCK_N, 1, BLOCK_D) blocks, see _decode_tma
            sig[n] = f"tensordesc<bf16[1,{block_n},1,{bd}]>"
            const.pop(n)
        elif n in const:
            sig[n] = "constexpr"
        else:
            sig[n] = POINTERS.get(n, "fp32" if n in FLOATS else "i32")
        if n.endswith("_ptr") or (sig[n] == "i32" and DECODE_INTS[n] % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = _compile_marked(fn, sig, const, attrs, warps, stages)
    regs, spill, _ = _ptxas(k.asm["ptx"])
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    loop = ttgir[ttgir.find("scf.for"):]
    loop = loop[:loop.find("scf.yield")]
    tile = f"1x{block_n}x1x{bd}" if use_tma else f"{block_n}x{bd}"
    buffers = sorted({int(b) for b in re.findall(rf"memdesc<(\d+)x{tile}xbf16", ttgir)})
    copy = "cp.async.bulk.tensor" if use_tma else "cp.async.commit_group"
    return (f"{regs:>3s} registers, {spill}, {k.metadata.shared // 1024:3d} KiB shared; "
            f"{ptx.count(copy):2d} {copy}, K/V buffers {'/'.join(map(str, buffers)) or 'none'}, "
            f"{loop.count('_copy_global_to_local')} copies issued in the loop")


# flash_attention as launched at seq 2048, 2048 / head_dim heads, no GQA, causal. Triton turns
# an int equal to 1 into a constant and marks pointers and ints divisible by 16; without the
# marks, 128 x 64 at head dim 64 compiled to 255 registers + 96 bytes of spills, not the 230
# the H200 sweep reported.
def attention_report(head_dim: int, tile: tuple, use_tma: bool) -> str:
    fn = importlib.import_module("onetrip.ops._attention_jit")._attn_fwd_kernel
    (bm, bn, warps, stages), bd, seq, heads = tile, triton.next_power_of_2(head_dim), 2048, 2048 // head_dim
    const = dict(HEAD_DIM=head_dim, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, IS_VARLEN=False, HAS_LEFT=False,
                 HAS_RIGHT=True, HAS_SOFTCAP=False, STORE_LSE=False, DOT_PRECISION="tf32", USE_TMA=use_tma, group=1)
    ints = dict(seqlen_q=seq, seqlen_k=seq, window_left=-1, window_right=0, stride_lb=0, stride_lh=0)
    for t in "qkvo":
        ints.update({f"stride_{t}b": seq * heads * head_dim, f"stride_{t}s": heads * head_dim, f"stride_{t}h": head_dim})
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n.endswith("_desc") and use_tma:  # (1, rows, 1, head dims) blocks, see _attention_tma
            sig[n] = f"tensordesc<bf16[1,{bm if n[0] in 'qo' else bn},1,{bd}]>"
        elif n.endswith("_desc"):
            sig[n], const[n] = "constexpr", None
        elif n in const:
            sig[n] = "constexpr"
        elif n.endswith("_ptr"):
            sig[n] = "*i32" if n.startswith("cu_") else "*fp32" if n == "lse_ptr" else "*bf16"
        else:
            sig[n] = "fp32" if n in ("qk_scale", "cap_in", "cap_out") else "i32"
        if n.endswith("_ptr") or (sig[n] == "i32" and ints[n] % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = _compile_marked(fn, sig, const, attrs, warps, stages)
    regs, spill, _ = _ptxas(k.asm["ptx"])
    return f"{regs:>3s} registers, {spill}, {k.metadata.shared // 1024} KiB shared"


# Split-row norms as launched on rows of 65536 bf16 (2**26 elements: M = 1024, C = 8 chunks
# of 8192): the ints Triton marks divisible by 16 get the mark here too; C = 8 does not.
NORM_INTS = dict(M=1024, N=65536, C=8, seg_n=65536, stride_xm=65536, stride_rm=65536, stride_ym=65536,
                 stride_hm=65536)


def _even(const_n: int, split: int, block_n: int) -> bool:
    """The launcher's ``even`` for a dense row of ``const_n`` columns (0: a runtime width)."""
    if not const_n:
        return False
    picks = importlib.import_module("onetrip.ops._norm_picks")
    parts, seg = picks.segments(const_n, picks.NormConfig("loop", 1, block_n, 4, split=split))
    return const_n == parts * seg and seg % block_n == 0


def norm_report(phase: int, is_rms: bool, residual: bool, warps: int, block_n: int = 8192,
                hints: bool = False, stash: bool = False, vec: bool = False, unroll: int = 1,
                const_n: int = 0, split: int = 1, block_m: int = 1, hold: int = 0, drop_y: bool = False,
                cluster: bool = False, shelf: bool = False, fold: bool = False, pf: int = 0, maxnreg: int = 0,
                wb_pre: int = 0, wb_early: bool = False, pipe: int = 0) -> str:
    """The split-row norm kernel at ``phase`` (norm._COOP, _STATS, _APPLY, _LOOP); ``split``
    programs a row of ``const_n`` (or 65536) columns in mode "loop", waiting on each other;
    ``block_m`` rows a program; ``hold`` chunks held in registers between the passes."""
    fn = importlib.import_module("onetrip.ops.norm")._norm_kernel
    const = dict(IS_RMS=is_rms, GEMMA=False, HAS_RESIDUAL=residual, HAS_WEIGHT=True, HAS_BIAS=not is_rms,
                 PHASE=phase, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_C=max(2, NORM_INTS["N"] // block_n),
                 HINTS=hints, STASH=stash and residual, VEC=vec, UNROLL=unroll, CONST_N=const_n, SPLIT=split,
                 SEG_N=(const_n // split if const_n else 0), LOOP_PART=0, HOLD=hold, DROP_Y=drop_y, CLUSTER=cluster,
                 LATE_WB=False, SHELF=shelf, FOLD=fold,  # every constexpr: ASTSource binds no defaults
                 EVEN=_even(const_n, split, block_n), PF=pf, PF_LANES=32 * warps if pf else 32,  # as _launch
                 WB_PRE=wb_pre, WB_EARLY=wb_early and shelf, PIPE=pipe)
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in const:
            sig[n] = "constexpr"
        elif n.endswith("_ptr"):
            sig[n] = {"part_ptr": "*fp32", "sync_ptr": "*i32"}.get(n, "*bf16")
        else:
            sig[n] = "fp32" if n == "eps" else "i32"
        if n.endswith("_ptr") or (sig[n] == "i32" and NORM_INTS[n] % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = _compile_marked(fn, sig, const, attrs, warps, None, maxnreg)
    regs, spill, line = _ptxas(k.asm["ptx"])
    smem = re.search(r"(\d+) bytes smem", line)
    return f"{regs:>3s} registers, {spill}" + (f", {smem.group(1)} bytes static shared" if shelf and smem else "")


def norm_main() -> None:
    """``python tools/ptxas_report.py norm`` runs this part alone."""
    kinds = ((True, False), (True, True), (False, False), (False, True))
    for phase, mode in ((1, "coop"), (2, "two_pass stats"), (3, "two_pass apply"), (4, "loop")):
        for is_rms, residual in kinds:
            for warps in (4, 8):
                label = f"{'add_' if residual else ''}{'rms' if is_rms else 'layer'}_norm {mode} 8192"
                print(f"norm {label:40s} {warps} warps: {norm_report(phase, is_rms, residual, warps)}")
    norm = importlib.import_module("onetrip.ops.norm")
    loop_picks = [("", key[0], key[1], width, c) for key, picks in norm.LOOP_PICKS.items() for width, c in picks.items()]
    loop_picks += [(f"{gpu} ", is_rms, residual, width, c) for gpu, table in norm.PICKS_GPU.items()
                   for (mode, is_rms, residual, width), c in table.items() if mode == "loop"]
    loop_picks += [(f"{gpu} <{rows} rows ", is_rms, residual, width, c) for gpu, table in norm.FEW_ROWS_GPU.items()
                   for (mode, is_rms, residual, width), (rows, c) in table.items()]
    for gpu, is_rms, residual, width, c in loop_picks:  # the loop configs norm_config launches
        label = f"{gpu}{'add_' if residual else ''}{'rms' if is_rms else 'layer'}_norm loop {width // 1024}K: " \
            f"{c.block_n}{' hints' if c.hints else ''}{' stash' if c.stash else ''}{' vec' if c.vec else ''}" \
            f"{' unroll ' + str(c.unroll) if c.unroll > 1 else ''}{' const' if c.const_n else ''}" \
            f"{' split ' + str(c.split) if c.split > 1 else ''}{' hold ' + str(c.hold) if c.hold else ''}" \
            f"{' drop_y' if c.drop_y else ''}{' cluster' if c.cluster else ''}{' shelf' if c.shelf else ''}" \
            f"{' fold' if c.fold else ''}{f' pf {c.pf}' if c.pf else ''}{f' maxnreg {c.maxnreg}' if c.maxnreg else ''}" \
            f"{f' wb_pre {c.wb_pre}' if c.wb_pre else ''}{' early' if c.wb_early else ''}" \
            f"{f' pipe {c.pipe}' if c.pipe else ''}"
        shelf = c.shelf and not residual  # as the launcher takes it (the shelf holds nothing)
        regs = norm_report(4, is_rms, residual, c.num_warps, c.block_n, c.hints, c.stash, c.vec, c.unroll,
                           width if c.const_n else 0, c.split, c.block_m, 0 if shelf else c.hold, c.drop_y,
                           c.cluster, shelf, c.fold, c.pf, c.maxnreg, c.wb_pre, c.wb_early,
                           c.pipe)  # pf as from c.pf_rows rows
        print(f"norm {label:60s} {c.num_warps:2d} warps: {regs}")
    for is_rms, residual in kinds:  # "loop" split: 4 programs a 256K row, 16 warps, chunks of 8192
        for const_n in (0, 262144):
            label = f"{'add_' if residual else ''}{'rms' if is_rms else 'layer'}_norm loop split 4 256K" \
                f"{' const' if const_n else ''}"
            print(f"norm {label:52s} 16 warps: "
                  f"{norm_report(4, is_rms, residual, 16, 8192, True, True, True, 1, const_n, 4)}")
    for is_rms, residual in kinds:  # "loop" split as clusters of 16: 256K rows, 16 warps, chunks of 8192
        for hold in (0, 1):
            label = f"{'add_' if residual else ''}{'rms' if is_rms else 'layer'}_norm loop cluster 16 hold {hold} 256K"
            print(f"norm {label:52s} 16 warps: "
                  f"{norm_report(4, is_rms, residual, 16, 8192, True, True, True, 1, 262144, 16, 1, hold, True, True)}")
    for is_rms, residual in kinds:  # "loop", 2 rows a program: 64K rows, 32 warps, chunks of 8192
        label = f"{'add_' if residual else ''}{'rms' if is_rms else 'layer'}_norm loop 2 rows 64K const"
        print(f"norm {label:52s} 32 warps: "
              f"{norm_report(4, is_rms, residual, 32, 8192, True, True, True, 1, 65536, 1, 2)}")
    for is_rms, residual in kinds:  # "loop", chunks held in registers: 128K rows, 32 warps, chunks of 16384
        for hold in (1, 2):
            label = f"{'add_' if residual else ''}{'rms' if is_rms else 'layer'}_norm loop hold {hold} 128K const"
            print(f"norm {label:52s} 32 warps: "
                  f"{norm_report(4, is_rms, residual, 32, 16384, True, True, True, 1, 131072, 1, 1, hold)}")


def main() -> int:
    print(f"triton {triton.__version__}, sm_90a")
    if sys.argv[1:] == ["norm"]:
        norm_main()
        return 0
    norm_main()
    fn = importlib.import_module("onetrip.ops.skinny_matmul")._skinny_matmul_kernel
    for label, (const, warps) in VARIANTS.items():
        print(f"GEMV {label:50s} {warps} warps: {report(fn, {**BASE, **const}, warps)}")
    fn = importlib.import_module("onetrip.ops.decode_attention")._decode_kernel
    for append, page in ((False, 0), (False, 64), (False, 256), (True, 0), (True, 64)):  # page 0: contiguous
        for warps in (4, 8):
            for block_n in (32, 64, 128):
                label = f"block_n {block_n:3d}{f', paged-{page}' if page else ''}{', append' if append else ''}"
                const = {**DECODE, "BLOCK_N": block_n, "PAGED": page > 0, "PAGE_SIZE": max(page, 1), "APPEND": append}
                print(f"decode_attention {label:42s} {warps} warps: {report(fn, const, warps)}")
    for append, page in ((False, 64), (False, 256), (True, 64)):  # the paged rule, as launched (3 stages)
        label = f"block_n  64, paged-{page}{', append' if append else ''}, table ahead, launch marks"
        print(f"decode_attention {label:42s} 8 warps: "
              f"{decode_launch_report(64, 8, 3, False, PAGED=True, PAGE_SIZE=page, APPEND=append, TABLE_AHEAD=True)}")
    for block_n in (64, 128):  # launch-marked; the TMA experiment (DecodeConfig.use_tma), head dim 128
        for use_tma in (False, True):
            for stages in (1, 2, 3, 4):  # the pointer path launches at Triton's default, 3
                label = f"block_n {block_n:3d}, {'TMA' if use_tma else 'pointer'}, {stages} stages, launch marks"
                print(f"decode_attention {label:42s} 8 warps: {decode_launch_report(block_n, 8, stages, use_tma)}")
    tiles = importlib.import_module("onetrip.ops._attention_tma").TMA_TILES
    for head_dim, configs in tiles.items():
        for tile in configs:
            label = f"flash_attention d{head_dim} {tile[0]}x{tile[1]} {tile[3]} stages"
            for use_tma in (False, True):
                print(f"{label:40s} {'TMA' if use_tma else 'pointer':7s} {tile[2]} warps: "
                      f"{attention_report(head_dim, tile, use_tma)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
