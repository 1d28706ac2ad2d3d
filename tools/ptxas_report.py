"""Registers and spills of the engine's kernels, compiled for sm_90a without a GPU: the norm's
split modes and "loop" picks, the batch-1 GEMV variants and decode_attention's launch configs
(shared memory, and whether the pipeliner keeps tiles in flight); then flash_attention's TMA
tiles beside their pointer twins.

    python tools/ptxas_report.py [norm]   # needs triton (3.6 = the GPU image's) and a ptxas

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

# the ptxas Triton ships that reads the PTX version this Triton writes (a system CUDA's may not)
_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
PTXAS = os.environ.get("PTXAS", str(_BIN / "ptxas-blackwell" if (_BIN / "ptxas-blackwell").exists() else _BIN / "ptxas"))
POINTERS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "y_ptr": "*bf16", "res_ptr": "*bf16",
            "ss_out_ptr": "*fp32", "ss_in_ptr": "*fp32", "nw_ptr": "*bf16",  # the GEMV
            "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "o_ptr": "*bf16", "seqlens_ptr": "*i32",
            "table_ptr": "*i32", "ws_o_ptr": "*fp32", "ws_lse_ptr": "*fp32",
            "kn_ptr": "*bf16", "vn_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32"}  # decode attention
FLOATS = ("eps", "qk_scale", "softcap_log2")
BASE = dict(W_EVICT="evict_first", HAS_BIAS=False, RES_OUT=False, NORM_IN=False, BLOCK_SS=512,
            SPLIT=False, USE_DOT=False, EVEN_K=True, SILU_MUL=False, BLOCK_M=1, BLOCK_N=8, BLOCK_K=1024,
            ACC=tl.float32, PDL=0, EARLY=0)
VARIANTS = {  # (constexprs, num_warps): the engine's configs at batch 1 (_gemv_launch.gemv_config)
    "qkv/o/down plain, 8 x 1024": ({}, 8),
    "qkv + RMSNorm prologue": ({"NORM_IN": True}, 8),
    "o + residual epilogue, 4 x 1024": ({"RES_OUT": True, "BLOCK_N": 4}, 8),
    "down + SwiGLU prologue + residual, 4 x 1024": ({"RES_OUT": True, "SILU_MUL": True, "BLOCK_N": 4}, 8),
    "gate_up / lm_head + RMSNorm, 16 x 256": ({"NORM_IN": True, "BLOCK_N": 16, "BLOCK_K": 256}, 4),
    "qkv + RMSNorm, PDL wait": ({"NORM_IN": True, "PDL": 1}, 8),
    "qkv + RMSNorm, PDL, one weight chunk before the wait": ({"NORM_IN": True, "PDL": 1, "EARLY": 1}, 8),
    # the launch table (_gemv_picks.TUNED_GEMV)
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
              BLOCK_Q=16, TABLE_AHEAD=False, TRIGGER=False)  # constexprs with defaults are passed too


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


def decode_launch_report(block_n: int, warps: int, stages: int, **constexprs) -> str:
    """Registers, spills and shared memory of ``_decode_kernel`` (contiguous, split, q_len 1,
    group 4, DECODE_INTS' marks) at this tile and ``num_stages``, and its pipeline as
    compiled: the asynchronous copies in the PTX (cp.async), the buffers per K/V tile (the leading dim of the key loop's shared
    allocations; none: one tile at a time) and the copies issued inside the loop.
    ``constexprs`` override DECODE's (PAGED, PAGE_SIZE, APPEND, TABLE_AHEAD, ...)."""
    fn = importlib.import_module("onetrip.ops._decode_jit")._decode_kernel
    const = {**DECODE, "BLOCK_N": block_n, **constexprs}
    bd = const["BLOCK_D"]
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in const:
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
    tile = f"{block_n}x{bd}"
    buffers = sorted({int(b) for b in re.findall(rf"memdesc<(\d+)x{tile}xbf16", ttgir)})
    copy = "cp.async.commit_group"
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


# Split-row norms as launched on dense bf16 rows: the ints Triton marks divisible by 16 get
# the mark here too (the chunk count C gets it where it is a multiple of 16).
def _norm_meta(cfg, phase: int, is_rms: bool, residual: bool, width: int) -> dict:
    """The constexprs ``norm._launch`` gives ``cfg`` on a Hopper GPU (PDL on, clusters
    launchable) for dense, 16-byte-aligned bf16 rows of ``width``, the L2 read-ahead as from
    ``ahead_min_rows`` rows."""
    picks = importlib.import_module("onetrip.ops._norm_picks")
    fits = importlib.import_module("onetrip.ops._norm_smem").smem_fits
    l2 = importlib.import_module("onetrip.ops._norm_l2")
    split, seg = picks.segments(width, cfg)
    loop = cfg.mode == "loop"
    const_n = width if cfg.const_n else 0
    even = const_n > 0 and const_n == seg * split and seg % cfg.block_n == 0
    smem = cfg.reuse.smem_segment and loop and not residual and even and fits(seg, cfg.block_n, cfg.num_warps, 2)
    half = cfg.order.half_steps and smem and fits(seg, cfg.block_n // 2, cfg.num_warps, 2)
    whole = loop and cfg.block_m == 1 and even
    ahead = cfg.l2.ahead_rows if whole and (2 * seg) % l2.L2_REQUEST.value == 0 else 0
    first = min(seg, cfg.l2.first_chunks * cfg.block_n)
    if not (whole and (cfg.split.cluster or split == 1) and (2 * first) % l2.L2_REQUEST.value == 0):
        first = 0
    C = triton.cdiv(width, cfg.block_n)
    return dict(IS_RMS=is_rms, GEMMA=False, HAS_RESIDUAL=residual, HAS_WEIGHT=True, HAS_BIAS=not is_rms,
                PHASE=phase, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_C=max(2, triton.next_power_of_2(C)),
                CONST_N=const_n, LATE_WB=cfg.late_weight, PDL=1, UNROLL=cfg.unroll, SPLIT=split,
                SEG_N=seg if const_n else 0, CLUSTER=cfg.split.cluster and split > 1, PASSES=0,
                KEEP_ROW=cfg.hints.keep_row, DROP_Y=cfg.hints.drop_y, KEEP_WB=cfg.hints.keep_weight,
                HOLD=0 if smem else cfg.reuse.held_chunks, STORE_H=cfg.reuse.store_h_early and residual, SMEM=smem,
                SMEM_PER_CHUNK=cfg.reuse.smem_sum_per_chunk and smem, WB_EARLY=cfg.order.early_weight_chunks,
                WB_WITH_COPIES=cfg.order.weight_with_copies, HALF_STEPS=half,
                NEXT_FIRST=cfg.order.next_before_store, FMA=cfg.affine_fma, L2_FIRST=first, AHEAD=ahead,
                LANES=32 * cfg.num_warps if ahead or first else 32)


def norm_report(phase: int, is_rms: bool, residual: bool, cfg, width: int = 65536, rows: int = 1024) -> str:
    """Registers and spills of the norm kernel at ``phase`` (_norm_kernel._ROWS .. _LOOP) launched with
    NormConfig ``cfg`` on ``rows`` dense bf16 rows of ``width`` (``_norm_meta``)."""
    fn = importlib.import_module("onetrip.ops._norm_kernel")._norm_kernel
    const = _norm_meta(cfg, phase, is_rms, residual, width)
    split, seg = importlib.import_module("onetrip.ops._norm_picks").segments(width, cfg)
    ints = dict(M=rows, N=width, C=triton.cdiv(width, cfg.block_n), seg_n=seg, stride_xm=width, stride_rm=width,
                stride_ym=width, stride_hm=width)
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in const:
            sig[n] = "constexpr"
        elif n.endswith("_ptr"):
            sig[n] = {"part_ptr": "*fp32", "sync_ptr": "*i32"}.get(n, "*bf16")
        else:
            sig[n] = "fp32" if n == "eps" else "i32"
        if n.endswith("_ptr") or (sig[n] == "i32" and ints[n] % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = _compile_marked(fn, sig, const, attrs, cfg.num_warps, None, cfg.maxnreg)
    regs, spill, line = _ptxas(k.asm["ptx"])
    smem = re.search(r"(\d+) bytes smem", line)
    return f"{regs:>3s} registers, {spill}" + (f", {smem.group(1)} bytes static shared" if const["SMEM"] and smem else "")


def norm_main() -> None:
    """``python tools/ptxas_report.py norm`` runs this part alone: the split modes at chunks of
    8192 on 64K rows, then every "loop" pick of the tables as ``norm_config`` launches it."""
    norm = importlib.import_module("onetrip.ops.norm")
    kinds = ((True, False), (True, True), (False, False), (False, True))
    for phase, mode in ((1, "coop"), (2, "two_pass stats"), (3, "two_pass apply")):
        for is_rms, residual in kinds:
            for warps in (4, 8):
                label = f"{'add_' if residual else ''}{'rms' if is_rms else 'layer'}_norm {mode} 8192"
                cfg = norm.NormConfig("two_pass" if phase > 1 else "coop", 1, 8192, warps)
                print(f"norm {label:40s} {warps} warps: {norm_report(phase, is_rms, residual, cfg)}")
    loop_picks = [("", key[0], key[1], width, c) for key, picks in norm.LOOP_PICKS.items() for width, c in picks.items()]
    loop_picks += [(f"{gpu} ", is_rms, residual, width, c) for gpu, table in norm.PICKS_GPU.items()
                   for (mode, is_rms, residual, width), c in table.items() if mode == "loop"]
    loop_picks += [(f"{gpu} <{rows} rows ", is_rms, residual, width, c) for gpu, table in norm.FEW_ROWS_GPU.items()
                   for (mode, is_rms, residual, width), (rows, c) in table.items()]
    for gpu, is_rms, residual, width, c in loop_picks:
        label = f"{gpu}{'add_' if residual else ''}{'rms' if is_rms else 'layer'}_norm loop {width // 1024}K"
        print(f"norm {label:44s} {c.num_warps:2d} warps: {norm_report(4, is_rms, residual, c, width)}  {c}")


def main() -> int:
    print(f"triton {triton.__version__}, sm_90a")
    if sys.argv[1:] == ["norm"]:
        norm_main()
        return 0
    norm_main()
    fn = importlib.import_module("onetrip.ops._gemv_jit")._skinny_matmul_kernel
    for label, (const, warps) in VARIANTS.items():
        print(f"GEMV {label:50s} {warps} warps: {report(fn, {**BASE, **const}, warps)}")
    fn = importlib.import_module("onetrip.ops._decode_jit")._decode_kernel
    for append, page in ((False, 0), (False, 64), (False, 256), (True, 0), (True, 64)):  # page 0: contiguous
        for warps in (4, 8):
            for block_n in (32, 64, 128):
                label = f"block_n {block_n:3d}{f', paged-{page}' if page else ''}{', append' if append else ''}"
                const = {**DECODE, "BLOCK_N": block_n, "PAGED": page > 0, "PAGE_SIZE": max(page, 1), "APPEND": append}
                print(f"decode_attention {label:42s} {warps} warps: {report(fn, const, warps)}")
    for append, page in ((False, 64), (False, 256), (True, 64)):  # the paged rule, as launched (3 stages)
        label = f"block_n  64, paged-{page}{', append' if append else ''}, table ahead, launch marks"
        print(f"decode_attention {label:42s} 8 warps: "
              f"{decode_launch_report(64, 8, 3, PAGED=True, PAGE_SIZE=page, APPEND=append, TABLE_AHEAD=True)}")
    for block_n in (64, 128):  # launch-marked, head dim 128
        for stages in (1, 2, 3, 4):  # the launch takes Triton's default, 3
            label = f"block_n {block_n:3d}, {stages} stages, launch marks"
            print(f"decode_attention {label:42s} 8 warps: {decode_launch_report(block_n, 8, stages)}")
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
