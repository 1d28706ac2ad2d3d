import dataclasses

import pytest
import torch

import onetrip
from onetrip.ops import _norm_picks as norm_picks
from onetrip.ops import norm as norm_mod
from onetrip.ops.norm import (CacheHints, LoadOrder, NormConfig, Reuse, Split, add_layer_norm_ref,
                              add_rms_norm_ref)
from onetrip.testing import assert_close, poison_, strided_like, upcast

from conftest import DTYPES, LAYOUTS, ON_GPU, WIDE, WIDTHS

KINDS = ["rms", "gemma", "layer"]
KEEP = CacheHints(keep_row=True)  # the L2 hints
H_EARLY = Reuse(store_h_early=True)


def _loop(block_m=1, block_n=128, **fields):
    """A mode "loop" config of 4 warps."""
    return NormConfig("loop", block_m, block_n, 4, **fields)


def _run(kind, x, r, w, b, eps, **kw):
    if kind == "layer":
        return onetrip.add_layer_norm(x, r, w, b, eps, **kw)
    return onetrip.add_rms_norm(x, r, w, eps, gemma=kind == "gemma", **kw)


def _ref(kind, x, r, w, b, eps, round_to=None):
    if kind == "layer":
        return add_layer_norm_ref(x, r, w, b, eps)
    return add_rms_norm_ref(x, r, w, eps, gemma=kind == "gemma", round_to=round_to)


def _params(kind, width, dtype, device, gen):
    w = strided_like((width,), dtype, device, generator=gen)
    b = strided_like((width,), dtype, device, generator=gen) if kind == "layer" else None
    return w, b


def _check(kind, x, r, w, b, eps, normed, h):
    # Llama's convention rounds the normalized value to x's dtype before the weight: the
    # exact evaluation does that rounding too (it is the op's definition, not an error).
    exact_y, exact_h = _ref(kind, *upcast(x, r, w, b), eps, round_to=x.dtype)
    torch_y, torch_h = _ref(kind, x, r, w, b, eps)
    assert_close(f"{kind} normed", normed, exact_y, torch_y)
    if r is not None:
        assert_close(f"{kind} residual", h, exact_h, torch_h)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS + [WIDE])
@pytest.mark.parametrize("kind", KINDS)
def test_matches_reference(device, gen, kind, dtype, width):
    rows = 2 if width > 5000 else 19
    x = strided_like((rows, width), dtype, device, generator=gen)
    # An offset mean makes LayerNorm's variance a small difference of large numbers.
    r = strided_like((rows, width), dtype, device, generator=gen) + (3.0 if kind == "layer" else 0.0)
    w, b = _params(kind, width, dtype, device, gen)
    out = poison_(torch.empty_like(x))
    res_out = poison_(torch.empty_like(x))
    normed, h = _run(kind, x, r, w, b, 1e-6, out=out, residual_out=res_out)
    assert normed is out and h is res_out
    _check(kind, x, r, w, b, 1e-6, normed, h)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("width", [17, 5000])
def test_no_residual(device, gen, kind, width):
    x = strided_like((7, width), torch.bfloat16, device, generator=gen)
    w, b = _params(kind, width, torch.bfloat16, device, gen)
    normed, h = _run(kind, x, None, w, b, 1e-5)
    assert h is x
    _check(kind, x, None, w, b, 1e-5, normed, None)
    single = (onetrip.layer_norm(x, w, b, 1e-5) if kind == "layer"
              else onetrip.rms_norm(x, w, 1e-5, gemma=kind == "gemma"))
    assert torch.equal(single, normed)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", KINDS)
def test_layouts(device, gen, kind, layout):
    x = strided_like((3, 5, 111), torch.float16, device, layout, generator=gen)
    r = strided_like((3, 5, 111), torch.float16, device, "rows" if layout != "rows" else "padded", generator=gen)
    w, b = _params(kind, 111, torch.float16, device, gen)
    normed, h = _run(kind, x, r, w, b, 1e-6)
    assert normed.shape == x.shape and h.shape == x.shape
    _check(kind, x, r, w, b, 1e-6, normed, h)


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_no_weight_and_fp32_weight(device, gen, kind):
    x = strided_like((6, 300), torch.bfloat16, device, generator=gen)
    r = strided_like((6, 300), torch.bfloat16, device, generator=gen)
    _check(kind, x, r, None, None, 1e-6, *_run(kind, x, r, None, None, 1e-6))
    w = strided_like((300,), torch.float32, device, generator=gen)
    b = strided_like((300,), torch.float32, device, generator=gen) if kind == "layer" else None
    _check(kind, x, r, w, b, 1e-6, *_run(kind, x, r, w, b, 1e-6))


MODES = (["rows", "rows late", "rows const", "two_pass", "loop", "loop hints", "loop h early", "loop unroll",
          "loop const", "loop split", "loop split const", "loop 2 rows", "loop 4 rows const", "loop held",
          "loop held 2 const", "loop held split", "loop split cluster", "loop fma", "loop early weight",
          "loop early weight split", "loop keep weight"]
         # (on the CPU a cluster config is the split above: one of them shows the fallback)
         + (["coop", "loop split const cluster", "loop held split cluster", "loop early weight cluster"] if ON_GPU else []))
# Gemma differs from RMSNorm only in the epilogue (1 + w): on the CPU it runs where that epilogue
# takes another path (whole rows, two launches, streamed and held chunks); fma is LayerNorm's
GEMMA_MODES = ("rows", "two_pass", "loop", "loop held", "loop split")
MODE_CASES = [(kind, mode) for mode in MODES for kind in KINDS
              if ON_GPU or ((kind != "gemma" or mode in GEMMA_MODES) and (kind == "layer" or mode != "loop fma"))]


@pytest.mark.parametrize("kind, mode", MODE_CASES)
def test_modes(device, gen, kind, mode):
    """Every mode on one awkward width: tiles of 2 rows (the last half past the end; "late":
    the weight and bias loaded after the statistics; "const": the width and row strides
    compile-time constants); chunks of 128 split 1023 into 8 with a ragged last one. "h
    early": pass 1 stores h, pass 2 re-reads it (with a residual; without one it is plain
    "loop"). "split": 3 programs a row over segments of 3, 3 and 2 chunks (the last ragged),
    8 of one chunk (with the constant width); on a GPU they wait on each other, under the
    interpreter the passes are two launches. "2 rows" / "4 rows": a program over several rows
    (the last block ragged: 11 rows). "held": the first chunk(s) kept in registers for pass 2
    (h as stored, or without it in float32). "cluster": a split row's programs one
    thread-block cluster on a Hopper GPU, their sums exchanged through shared memory
    (elsewhere the config falls back to the split above). "fma": LayerNorm's affine as FMAs,
    held and streamed chunks. "early weight": pass 2's first chunks' weight and bias loaded
    before the exchange of sums (more chunks than are held; the last segment has fewer chunks
    than that, its extra ones past the row; "keep weight": those loads with an L1 eviction
    hint)."""
    rows, width = 11, 1023
    x = strided_like((rows, width), torch.bfloat16, device, generator=gen)
    r = strided_like((rows, width), torch.bfloat16, device, generator=gen) + 2.0
    w, b = _params(kind, width, torch.bfloat16, device, gen)
    held1 = Reuse(held_chunks=1, store_h_early=True)
    held2 = Reuse(held_chunks=2, store_h_early=True)
    early3 = LoadOrder(early_weight_chunks=3)
    cfg = {"rows": NormConfig("rows", 2, 1024, 4),
           "rows late": NormConfig("rows", 2, 1024, 4, late_weight=True),
           "rows const": NormConfig("rows", 2, 1024, 4, const_n=True),
           "two_pass": NormConfig("two_pass", 1, 128, 4), "coop": NormConfig("coop", 1, 128, 4),
           "loop": _loop(), "loop hints": _loop(hints=KEEP),
           "loop h early": _loop(hints=KEEP, reuse=H_EARLY),
           "loop unroll": _loop(unroll=3, hints=KEEP, reuse=H_EARLY),
           "loop const": _loop(const_n=True, unroll=2, hints=KEEP),
           "loop split": _loop(split=Split(3), hints=KEEP, reuse=H_EARLY),
           "loop split const": _loop(const_n=True, split=Split(8), hints=KEEP, reuse=H_EARLY),
           "loop 2 rows": _loop(2, hints=KEEP, reuse=H_EARLY),
           "loop 4 rows const": _loop(4, const_n=True, unroll=2, hints=KEEP),
           "loop held": _loop(2, hints=KEEP, reuse=held1),
           "loop held 2 const": _loop(const_n=True, hints=KEEP, reuse=Reuse(held_chunks=2)),
           "loop held split": _loop(split=Split(3), hints=KEEP, reuse=held2),
           "loop split cluster": _loop(split=Split(3, cluster=True), hints=KEEP, reuse=H_EARLY),
           "loop fma": _loop(affine_fma=True, split=Split(3), hints=KEEP, reuse=held1),
           "loop split const cluster": _loop(const_n=True, split=Split(8, cluster=True), hints=KEEP, reuse=H_EARLY),
           "loop held split cluster": _loop(split=Split(3, cluster=True), hints=KEEP, reuse=held2),
           "loop early weight": _loop(2, hints=KEEP, reuse=held1, order=early3),
           "loop early weight split": _loop(affine_fma=True, split=Split(3), reuse=held1, order=early3),
           "loop keep weight": _loop(affine_fma=True, split=Split(3), hints=CacheHints(keep_weight=True),
                                     reuse=held1, order=early3),
           "loop early weight cluster": _loop(split=Split(3, cluster=True), reuse=held1, order=early3)}[mode]
    for res in (r, None):  # with and without the residual add
        y = poison_(torch.empty_like(x))
        h = poison_(torch.empty_like(x)) if res is not None else None
        norm_mod._launch(x, res, w, b, y, h, 1e-6, kind != "layer", kind == "gemma", cfg)
        _check(kind, x, res, w, b, 1e-6, y, h)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [17, 1023, 5000])
def test_layer_norm_far_from_zero(device, gen, width, dtype):
    """Rows whose mean is 100 standard deviations from zero: the variance must not cancel."""
    x = strided_like((6, width), dtype, device, generator=gen) + 100.0
    r = strided_like((6, width), dtype, device, generator=gen)
    w, b = _params("layer", width, dtype, device, gen)
    _check("layer", x, r, w, b, 1e-5, *_run("layer", x, r, w, b, 1e-5))
    _check("layer", x, None, w, b, 1e-5, *_run("layer", x, None, w, b, 1e-5))
    # Split rows (chunks combined with Chan's formula) must hold up as well: chunks of 128
    # up to 1023 wide (8 a row), of 1024 at 5000 (5 a row; 40 of 128 took the interpreter
    # ~30 s a dtype in CI for no path the narrower rows do not take).
    c = 128 if width <= 1023 else 1024
    for cfg in (NormConfig("two_pass", 1, c, 4), _loop(block_n=c), _loop(block_n=c, reuse=H_EARLY),
                _loop(block_n=c, split=Split(4), reuse=H_EARLY), _loop(2, c),
                _loop(block_n=c, reuse=Reuse(held_chunks=2)), _loop(block_n=c, reuse=Reuse(1, True)),
                *([_loop(block_n=c, split=Split(4, cluster=True), reuse=H_EARLY)] if ON_GPU else [])):
        y, h = poison_(torch.empty_like(x)), poison_(torch.empty_like(x))
        norm_mod._launch(x, r, w, b, y, h, 1e-5, False, False, cfg)
        _check("layer", x, r, w, b, 1e-5, y, h)


@pytest.mark.parametrize("residual", [False, True])
def test_layer_norm_float32_shift(device, gen, residual):
    """float32 LayerNorm in mode "loop" on rows whose first value is 4 standard deviations
    out: shifted by that value, the sums cancelled (4-7x PyTorch's error); the segment's
    first chunk's mean is the shift for float32 inputs."""
    x = strided_like((6, 1023), torch.float32, device, generator=gen)
    x[:, 0] = 4.0
    r = 0.01 * strided_like((6, 1023), torch.float32, device, generator=gen) if residual else None
    w, b = _params("layer", 1023, torch.float32, device, gen)
    for cfg in (_loop(), _loop(2), _loop(split=Split(3), hints=KEEP, reuse=Reuse(1, True)),
                *([_loop(split=Split(4, cluster=True))] if ON_GPU else [])):
        y = poison_(torch.empty_like(x))
        h = poison_(torch.empty_like(x)) if residual else None
        norm_mod._launch(x, r, w, b, y, h, 1e-5, False, False, cfg)
        _check("layer", x, r, w, b, 1e-5, y, h)


def test_in_place_residual(device, gen):
    x = strided_like((4, 64), torch.float32, device, generator=gen)
    r = strided_like((4, 64), torch.float32, device, generator=gen)
    w = strided_like((64,), torch.float32, device, generator=gen)
    expected_y, expected_h = add_rms_norm_ref(x, r, w, 1e-6)
    y, h = onetrip.add_rms_norm(x, r, w, 1e-6, residual_out=r)
    assert h is r
    torch.testing.assert_close(h, expected_h)
    torch.testing.assert_close(y, expected_y, rtol=1e-5, atol=1e-5)


def test_config_rule():
    cpu = torch.device("cpu")  # sm_count: 4 "SMs" on the CPU
    picks = norm_mod.LOOP_PICKS
    assert norm_mod.norm_config(64, 4096, cpu).mode == "rows"
    assert norm_mod.norm_config(64, 32768, cpu).mode == "rows"  # add + RMSNorm: whole rows to 32K
    assert norm_mod.norm_config(64, 32768, cpu, has_residual=False) == picks[(True, False)][32768]
    assert norm_mod.norm_config(64, 20000, cpu, has_residual=False) == picks[(True, False)][32768]
    assert norm_mod.norm_config(3, 32768, cpu, has_residual=False).mode == "rows"  # fewer rows than SMs
    # RMSNorm at 8K: the loop with the width a constant, so dense rows only
    assert norm_mod.norm_config(64, 8192, cpu, has_residual=False) == picks[(True, False)][8192]
    assert norm_mod.norm_config(64, 8192, cpu, has_residual=False, dense=False).mode == "rows"
    assert norm_mod.norm_config(64, 8192, cpu, is_rms=False, has_residual=False).mode == "rows"
    # LayerNorm without a residual from 16K wide: a program per row; the widest pick serves wider rows
    assert norm_mod.norm_config(64, 16384, cpu, is_rms=False, has_residual=False) == picks[(False, False)][16384]
    assert norm_mod.norm_config(64, 524288, cpu, is_rms=False, has_residual=False) == picks[(False, False)][262144]
    assert norm_mod.norm_config(3, 65536, cpu, is_rms=False, has_residual=False).mode == "two_pass"  # < 4 SMs' rows
    assert norm_mod.norm_config(64, 16384, cpu, is_rms=False).mode == "rows"
    # With a residual: h stored in pass 1; 256K rows split over programs, wider ones coop
    assert norm_mod.norm_config(64, 32768, cpu, is_rms=False) == picks[(False, True)][32768]
    assert norm_mod.norm_config(64, 131072, cpu).reuse.store_h_early
    assert norm_mod.norm_config(64, 262144, cpu).split.programs > 1
    # Whole rows from ROWS_PICKS where it has the width (a non-power-of-two width rounds up);
    # its rows a program never pass the rows there are
    assert norm_mod.norm_config(64, 3000, cpu, is_rms=False) == norm_mod.ROWS_PICKS[(False, True)][4096]
    assert norm_mod.norm_config(64, 4096, cpu, has_residual=False) == norm_mod.ROWS_PICKS[(True, False)][4096]
    assert norm_mod.norm_config(1, 2048, cpu, has_residual=False).block_m == 1
    assert norm_mod.norm_config(64, 4096, cpu, is_rms=False, has_residual=False).block_m == 2  # the rule
    # The streamed y evict_first (drop_y) only with the hints it extends
    assert all(c.hints.keep_row for table in picks.values() for c in table.values() if c.hints.drop_y)
    assert norm_mod.norm_config(64, 524288, cpu).mode == "two_pass"  # coop needs a GPU
    assert norm_mod.norm_config(3, 65536, cpu, is_rms=False).mode == "two_pass"
    # a split row's programs fill the chip from half the SMs (2 here): 1 row of 256K in 2-8
    assert norm_mod.norm_config(1, 262144, cpu).mode == "loop"
    for table in picks.values():  # every pick a loop whose chunk is narrower than its rows
        assert all(c.mode == "loop" and c.block_n < w for w, c in table.items())


def test_segments():
    """A split row's programs: segments of whole chunks, none empty; a cluster never 9-15."""
    loop = NormConfig("loop", 1, 4096, 16, split=Split(16))
    assert norm_picks.segments(262144, loop) == (16, 16384)
    assert norm_picks.segments(140000, loop) == (12, 12288)  # the global exchange takes any count
    assert norm_picks.segments(140000, dataclasses.replace(loop, split=Split(16, cluster=True))) == (7, 20480)
    assert norm_picks.segments(5000, dataclasses.replace(loop, split=Split(16, cluster=True))) == (2, 4096)
    assert norm_picks.segments(5000, dataclasses.replace(loop, split=Split(1))) == (1, 5000)


def test_gpu_model_picks(monkeypatch):
    """A GPU model's own picks replace LOOP_PICKS' / ROWS_PICKS' (or the rule's) on the
    models whose tables hold them (the H100's; the H200 shares its wide "loop" ones), under
    the same rows-per-SM rule; each fits its width."""
    cpu = torch.device("cpu")
    h100 = norm_picks.PICKS_GPU["H100"]
    def config(name, is_rms, residual, width):
        monkeypatch.setattr(norm_picks, "gpu_name", lambda device: name)
        return norm_mod.norm_config(256, width, cpu, is_rms=is_rms, has_residual=residual)
    for (mode, is_rms, residual, width), pick in h100.items():
        assert pick.mode == mode
        if mode == "loop":
            # the held chunks inside a segment (a segment may be held whole), and launch_segments' checks
            assert pick.block_n * pick.split.programs * pick.reuse.held_chunks <= width
            norm_picks.launch_segments(width, pick)
            assert width in norm_mod.LOOP_PICKS[(is_rms, residual)]  # a replacement, never a new width
            if pick.split.cluster:  # a cluster size that launches (2-8, or 16), the row cut into exactly that many
                n = pick.split.programs
                assert norm_picks.segments(width, pick)[0] == n and (2 <= n <= 8 or n == 16)
        else:
            assert pick.block_n == width
        assert config("NVIDIA H100 80GB HBM3", is_rms, residual, width) == pick
        # the H200 has wide "loop" picks (64K-256K) from the H100's table, and only those
        h200 = norm_picks.PICKS_GPU["H200"].get((mode, is_rms, residual, width))
        assert (h200 is not None) == (mode == "loop" and width >= 65536)
        if h200 is not None:
            assert config("NVIDIA H200", is_rms, residual, width) == h200
        else:
            assert config("NVIDIA H200", is_rms, residual, width) != pick
        assert config("NVIDIA A100-SXM4-80GB", is_rms, residual, width) != pick


def test_gpu_few_rows_picks(monkeypatch):
    """FEW_ROWS_GPU's entries replace a GPU model's pick for the same key under their row
    count only, and launch as their mode needs (clusters of 2-8 or 16, the row cut into
    exactly that many)."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(norm_picks, "gpu_name", lambda device: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(norm_picks, "sm_count", lambda device: 132)
    for (mode, is_rms, residual, width), (rows, few) in norm_picks.FEW_ROWS_GPU["H100"].items():
        assert mode == "loop" == few.mode and width in norm_mod.LOOP_PICKS[(is_rms, residual)]
        if few.split.cluster:
            n = few.split.programs
            assert norm_picks.segments(width, few)[0] == n and (2 <= n <= 8 or n == 16)
        def config(m):
            return norm_mod.norm_config(m, width, cpu, is_rms=is_rms, has_residual=residual)
        assert config(64) == config(rows - 1) == few
        many = norm_picks.PICKS_GPU["H100"].get((mode, is_rms, residual, width)) \
            or norm_mod.LOOP_PICKS[(is_rms, residual)][width]
        assert config(rows) == config(4 * rows) == many != few


def test_chunks_past_segment(device):
    """A config whose held or early-weight chunks would reach past a program's segment into
    the next program's columns is refused at the launch, naming both; each group's fields
    are checked when the config is made, naming the field."""
    x = torch.randn(2, 1024, device=device)
    w = torch.ones(1024, device=device)
    for cfg in (_loop(split=Split(8), reuse=Reuse(held_chunks=2)),
                _loop(split=Split(4), order=LoadOrder(early_weight_chunks=3))):
        with pytest.raises(ValueError, match=r"held_chunks=\d / order.early_weight_chunks=\d chunks of 128 do not "
                                             r"fit the \d+ columns"):
            norm_mod._launch(x, None, w, None, torch.empty_like(x), None, 1e-6, True, False, cfg)
    bad = [(lambda: LoadOrder(early_weight_chunks=5), r"LoadOrder.early_weight_chunks=5 must be 0-4"),
           (lambda: LoadOrder(next_before_store=4), r"LoadOrder.next_before_store=4 must be 0-3 \(1: pass 1"),
           (lambda: LoadOrder(half_steps=True, next_before_store=2), r"half_steps=True replaces pass 2's"),
           (lambda: _loop(reuse=Reuse(held_chunks=1), order=LoadOrder(half_steps=True)), "takes no held chunks"),
           (lambda: Reuse(held_chunks=3), r"Reuse.held_chunks=3 must be 0-2"),
           (lambda: Reuse(smem_sum_per_chunk=True), "smem_sum_per_chunk=True needs smem_segment=True"),
           (lambda: Split(17), r"Split.programs=17 must be 1-16"),
           (lambda: NormConfig("rows", 1, 1024, 4, split=Split(2)), "applies to mode 'loop' only"),
           (lambda: _loop(2, split=Split(2)), "block_m=2 with split.programs=2"),
           (lambda: NormConfig("loop", 1, 100, 4), r"block_n=100 must be a power of two"),
           (lambda: NormConfig("flat", 1, 128, 4), "mode='flat' must be one of"),
           (lambda: NormConfig("loop", 1, 128, 3), "num_warps=3")]
    for make, message in bad:
        with pytest.raises(ValueError, match=message):
            make()
    with pytest.raises(TypeError, match="NormConfig.split must be a Split"):
        NormConfig("loop", 1, 128, 4, split=4)


@pytest.mark.skipif(not ON_GPU, reason="one launch with its programs waiting on each other: a GPU")
@pytest.mark.parametrize("width", [65536, 131072, 262144])
@pytest.mark.parametrize("is_rms, residual", [(True, False), (False, False), (True, True), (False, True)])
def test_load_order_same_y(gen, width, is_rms, residual):
    """Pass 2's weight and bias loaded before the exchange (``early_weight_chunks`` 1, 2, 4;
    from shared memory also ``weight_with_copies``), the next chunk's loads before this
    chunk's stores (``next_before_store``), pass 2 in half-chunk steps (``half_steps``) and the
    weight's L1 hint (``keep_weight``) change when loads are issued or how long lines are
    kept, not the arithmetic: y and h bitwise equal to the pick's without them, with the
    GPU's own picks at 7, 64 and 128 rows (FEW_ROWS_GPU's below 128, PICKS_GPU's from there)."""
    device = torch.device("cuda")
    kind = "rms" if is_rms else "layer"
    for rows in (7, 64, 128):
        pick = norm_mod.norm_config(rows, width, device, is_rms=is_rms, has_residual=residual)
        if pick.mode != "loop":  # (a few rows of 64K may take "coop")
            continue
        x = torch.randn(rows, width, device=device, generator=gen).to(torch.bfloat16)
        r = torch.randn_like(x) if residual else None
        w, b = _params(kind, width, torch.bfloat16, device, gen)
        outs = []
        plain = dataclasses.replace(pick.order, half_steps=False)
        orders = [dataclasses.replace(plain, early_weight_chunks=pre, weight_with_copies=copies)
                  for pre, copies in ((0, False), (1, False), (2, False), (2, True), (4, True))]
        orders += [dataclasses.replace(plain, next_before_store=n) for n in (1, 2, 3)]
        variants = [dataclasses.replace(pick, order=o) for o in orders]
        none_held = dataclasses.replace(pick.reuse, held_chunks=0)  # (half steps hold nothing)
        variants += [dataclasses.replace(pick, reuse=none_held, order=LoadOrder(1, True, half_steps=h))
                     for h in (False, True)]
        variants += [dataclasses.replace(pick, hints=dataclasses.replace(pick.hints,
                                                                         keep_weight=not pick.hints.keep_weight))]
        for cfg in [pick] + variants:
            try:
                norm_picks.launch_segments(width, cfg)
            except ValueError:  # more early chunks than a segment has
                continue
            y, h = poison_(torch.empty_like(x)), poison_(torch.empty_like(x)) if residual else None
            norm_mod._launch(x, r, w, b, y, h, 1e-6, is_rms, False, cfg)
            outs.append((y, h))
        _check(kind, x, r, w, b, 1e-6, *outs[0])
        for y, h in outs[1:]:
            assert torch.equal(y, outs[0][0]) and (h is None or torch.equal(h, outs[0][1]))


def test_empty(device):
    for shape in [(0, 8), (3, 0)]:
        x = torch.empty(shape, device=device)
        y, h = onetrip.add_rms_norm(x, x.clone(), torch.ones(shape[-1], device=device))
        assert y.shape == shape and h.shape == shape


def test_bad_input(device):
    x = torch.randn(4, 8, device=device)
    w = torch.ones(8, device=device)
    with pytest.raises(ValueError, match=r"residual has shape \(4, 7\)"):
        onetrip.add_rms_norm(x, torch.randn(4, 7, device=device), w)
    with pytest.raises(TypeError, match="residual has dtype torch.float16 but x has torch.float32"):
        onetrip.add_rms_norm(x, x.half(), w)
    with pytest.raises(ValueError, match=r"weight has shape \(9,\)"):
        onetrip.add_layer_norm(x, None, torch.ones(9, device=device), None)
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        onetrip.rms_norm(x.long(), w)
    with pytest.raises(ValueError, match="gemma=True"):
        onetrip.rms_norm(x, None, gemma=True)
    with pytest.raises(ValueError, match="eps must be"):
        onetrip.rms_norm(x, w, eps=-1.0)
    with pytest.raises(ValueError, match="residual_out was given"):
        onetrip.add_rms_norm(x, None, w, residual_out=torch.empty_like(x))
    with pytest.raises(TypeError, match="out has dtype torch.float16"):
        onetrip.rms_norm(x, w, out=torch.empty(4, 8, device=device, dtype=torch.float16))


@pytest.mark.parametrize("kind", KINDS)
def test_loop_h_early_in_place(device, gen, kind):
    """Mode "loop" with ``store_h_early``: pass 1 writes h over the residual it is still reading
    (``residual_out=residual``), pass 2 re-reads h; chunks of 16 over 111 columns, a
    program a row and 3 a row (each segment's LayerNorm shift read before its own h is
    stored, never another's), and with two chunks held in registers."""
    x = strided_like((5, 111), torch.bfloat16, device, generator=gen)
    r = strided_like((5, 111), torch.bfloat16, device, generator=gen)
    w, b = _params(kind, 111, torch.bfloat16, device, gen)
    x0, r0 = x.clone(), r.clone()
    configs = ((1, 0, False), (3, 0, False), (1, 2, False), (7, 1, True)) + (((3, 0, True),) if ON_GPU else ())
    for split, hold, cluster in configs:
        r.copy_(r0)
        y = poison_(torch.empty_like(x))
        norm_mod._launch(x, r, w, b, y, r, 1e-6, kind != "layer", kind == "gemma",
                         _loop(block_n=16, split=Split(split, cluster), hints=KEEP, reuse=Reuse(hold, True)))
        _check(kind, x0, r0, w, b, 1e-6, y, r)


@pytest.mark.parametrize("kind", KINDS if ON_GPU else ["rms"])  # gemma, layer: rms's pipe; layer's mean: test_modes
def test_loop_pipe(device, gen, kind):
    """Mode "loop" with the next chunk's loads issued before this chunk's stores in both
    passes (``next_before_store=3``): the same y and h, bitwise, as without, over 111 columns in chunks
    of 16 (the last ragged) and 128 in chunks of 32 with the width a constant, a program a
    row (two chunks held) and 3 a row (held on a GPU; the interpreter's two launches hold
    none), weights loaded early, with and without a residual (re-read, or stored early and
    written over: ``residual_out=residual``)."""
    w111, b111 = _params(kind, 111, torch.bfloat16, device, gen)
    w128, b128 = _params(kind, 128, torch.bfloat16, device, gen)
    cases = [(111, dict(split=1, hold=2, pre=0)), (111, dict(split=3, hold=1, pre=0)),
             (111, dict(split=3, hold=0, pre=2)), (128, dict(split=2, const_n=True, hold=1, pre=2))]
    if not ON_GPU:  # the interpreter: the ragged split and the constant width (32 s for all four on 2 cores)
        cases = cases[2:]
    for width, flags in cases:
        w, b = (w111, b111) if width == 111 else (w128, b128)
        chunk = 16 if width == 111 else 32
        x = strided_like((5, width), torch.bfloat16, device, generator=gen)
        r0 = torch.randn(5, width, generator=gen, device=device).to(torch.bfloat16)
        for residual, h_early, in_place in ((False, False, False), (True, False, False), (True, True, True)):
            outs = []
            for pipe in (0, 3):  # (1 and 2 each take one of 3's two loops)
                cfg = _loop(block_n=chunk, const_n=flags.get("const_n", False), split=Split(flags["split"]),
                            hints=KEEP, reuse=Reuse(flags["hold"], h_early),
                            order=LoadOrder(early_weight_chunks=flags["pre"], next_before_store=pipe))
                r = r0.clone() if residual else None
                y = poison_(torch.empty_like(x))
                h = (r if in_place else poison_(torch.empty_like(x))) if residual else None
                norm_mod._launch(x, r, w, b, y, h, 1e-6, kind != "layer", kind == "gemma", cfg)
                outs.append((y, h))
            _check(kind, x, r0 if residual else None, w, b, 1e-6, *outs[0])
            for y, h in outs[1:]:
                same = torch.equal(y, outs[0][0]) and (h is None or torch.equal(h, outs[0][1]))
                assert same, (width, flags, residual)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("width, split", [(1023, 1), (1024, 4)])
def test_loop_const_n(device, gen, kind, width, split):
    """Mode "loop" with the width as a constant: dense rows take it (1023 wide, chunks of
    128, two an iteration; 1024 in 4 segments of whole chunks, where the masks fold away),
    a strided x falls back to runtime strides."""
    w, b = _params(kind, width, torch.bfloat16, device, gen)
    cfg = _loop(const_n=True, unroll=2, split=Split(split), hints=KEEP, reuse=H_EARLY)
    for x in (torch.randn(7, width, generator=gen, device=device).to(torch.bfloat16),
              strided_like((7, width), torch.bfloat16, device, generator=gen)):
        r = torch.randn(7, width, generator=gen, device=device).to(torch.bfloat16)
        y, h = poison_(torch.empty_like(r)), poison_(torch.empty_like(r))
        norm_mod._launch(x, r, w, b, y, h, 1e-6, kind != "layer", kind == "gemma", cfg)
        _check(kind, x, r, w, b, 1e-6, y, h)
        y = poison_(torch.empty_like(r))
        norm_mod._launch(x, None, w, b, y, None, 1e-6, kind != "layer", kind == "gemma", cfg)
        _check(kind, x, None, w, b, 1e-6, y, None)


@pytest.mark.skipif(not ON_GPU or torch.cuda.get_device_capability()[0] < 9, reason="thread-block clusters: Hopper")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("width, chunk, split, ranks", [(70001, 1024, 8, 8), (262144, 8192, 16, 16),
                                                        (140000, 4096, 16, 7)])
def test_cluster_split_gpu(gen, kind, width, chunk, split, ranks):
    """The cluster path is taken (its compiled kernel launches clusters of ``ranks``), right
    on wide rows (70001: 8 segments of 9 chunks of 1024, the last ragged; 256K in 16;
    140000 asked in 16 would be 12, which no cluster launches: 7 wider ones instead), eagerly
    and replayed from a CUDA graph with new inputs."""
    device = torch.device("cuda")
    cfg = NormConfig("loop", 1, chunk, 16, const_n=True, split=Split(split, cluster=True),
                     hints=CacheHints(keep_row=True, drop_y=True), reuse=Reuse(held_chunks=1, store_h_early=True))
    x = torch.randn(5, width, generator=gen, device=device).to(torch.bfloat16)
    r = torch.randn(5, width, generator=gen, device=device).to(torch.bfloat16)
    w, b = _params(kind, width, torch.bfloat16, device, gen)
    y, h = poison_(torch.empty_like(x)), poison_(torch.empty_like(x))
    kernel = norm_mod._launch(x, r, w, b, y, h, 1e-6, kind != "layer", kind == "gemma", cfg)
    assert kernel.packed_metadata[1] == ranks
    _check(kind, x, r, w, b, 1e-6, y, h)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        norm_mod._launch(x, r, w, b, y, h, 1e-6, kind != "layer", kind == "gemma", cfg)
    x.copy_(torch.randn(5, width, generator=gen, device=device))
    poison_(y)
    poison_(h)
    graph.replay()
    torch.cuda.synchronize()
    _check(kind, x, r, w, b, 1e-6, y, h)
