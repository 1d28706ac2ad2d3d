"""skinny_matmul against F.linear by the accuracy rule: few rows, awkward N and K, split-K."""

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICE, ON_GPU, capture
from onetrip.ops.skinny_matmul import (GEMV_PICKS, MAX_ROWS, GemvPicks, SkinnyConfig, silu_mul_matmul,
                                       skinny_config, skinny_matmul, skinny_matmul_ref)
from onetrip.testing import assert_close, upcast

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(gen, M, N, K, dtype, bias=True):
    def rn(*shape):
        return torch.randn(*shape, generator=gen, device=DEVICE).to(dtype)

    return rn(M, K), rn(N, K), rn(N) if bias else None


def _check(name, y, x, w, b):
    exact = skinny_matmul_ref(*upcast(x, w, b)) if b is not None else skinny_matmul_ref(*upcast(x, w))
    assert_close(name, y, exact, skinny_matmul_ref(x, w, b))


def _poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (3, 17, 111), (1, 111, 4100), (17, 111, 1023), (3, 1023, 17)])
def test_matches_linear(gen, dtype, M, N, K):
    x, w, b = _inputs(gen, M, N, K, dtype)
    out = _poisoned((M, N), dtype)
    y = skinny_matmul(x, w, b, out=out)
    assert y is out
    _check(f"skinny {M}x{N}x{K}", y, x, w, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_bias_leading_dims_noncontiguous_x(gen, dtype):
    x, w, _ = _inputs(gen, 6, 111, 1023, dtype, bias=False)
    x = x.view(2, 3, 1023)[:, :, :1000].transpose(0, 1)  # (3, 2, 1000): strided rows in a transposed view
    w = w[:, :1000]  # row stride 1023, unit stride along K
    y = skinny_matmul(x, w)
    assert y.shape == (3, 2, 111)
    _check("skinny strided", y, x, w, None)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_forced_split_k(gen, dtype, bias):
    M, N, K = 3, 40, 1500
    x, w, b = _inputs(gen, M, N, K, dtype, bias)
    cfg = SkinnyConfig(block_m=4, block_n=16, block_k=64, split_k=5)
    y = skinny_matmul(x, w, b, out=_poisoned((M, N), dtype), config=cfg)
    _check("skinny split-K", y, x, w, b)


def test_non_contiguous_out_and_empty():
    g = torch.Generator(device=DEVICE).manual_seed(1)
    x, w, b = _inputs(g, 2, 33, 70, torch.float16)
    out = _poisoned((33, 2), torch.float16).t()  # (2, 33) with column stride 2
    skinny_matmul(x, w, b, out=out)
    _check("skinny strided out", out, x, w, b)
    assert skinny_matmul(x[:0], w).shape == (0, 33)
    assert torch.equal(skinny_matmul(x[:, :0], w[:, :0], b), b.expand(2, 33))  # K = 0: the bias


def test_many_rows_fall_back_to_linear():
    g = torch.Generator(device=DEVICE).manual_seed(2)
    x, w, b = _inputs(g, MAX_ROWS + 1, 20, 30, torch.float32)
    torch.testing.assert_close(skinny_matmul(x, w, b), F.linear(x, w, b), rtol=0, atol=0)


def test_config_heuristic():
    # Batch 1, 16-bit: the H200 sweep's rule. o_proj of the 8B model: 8 columns a program
    # (512 programs), K in chunks of 1024, 8 warps, no split.
    cfg = skinny_config(1, 4096, 4096, 132)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_warps) == (1, 8, 1024, 1, 8)
    # gate_up of the 8B model: 16 x 256 tiles; K chunks divide K (EVEN_K) when they can.
    assert skinny_config(1, 28672, 4096, 132).as_list()[1:5] == [16, 256, 1, 4]
    assert skinny_config(1, 896, 896, 132).block_k == 128
    # shapes swept on the H200 since: the table, with and without the RMSNorm prologue
    assert skinny_config(1, 6144, 4096, 132).as_list()[1:5] == [8, 512, 1, 4]
    assert skinny_config(1, 16384, 2048, 132, fusion="norm").as_list()[1:5] == [16, 256, 1, 8]
    assert skinny_config(1, 4096, 14336, 132, fusion="silu_residual").as_list()[1:5] == [8, 1024, 1, 4]
    with pytest.raises(ValueError, match="fusion"):
        skinny_config(1, 64, 64, 132, fusion="gelu")
    # the weight chunks put in flight before the PDL wait, by the projection's place in a layer
    # (a value per role here, to tell the roles apart)
    by_role = {"qkv": 10, "o": 11, "gate_up": 12, "down": 13, "plain": 14}
    picks = GemvPicks(GEMV_PICKS.tuned, GEMV_PICKS.tuned_gpu, by_role)
    for (n, k, fusion), role in {(3072, 2048, "norm"): "qkv", (4608, 3584, "norm"): "qkv",
                                 (16384, 2048, "norm"): "gate_up", (128256, 2048, "norm"): "gate_up",
                                 (2048, 2048, "residual"): "o", (4096, 14336, "silu_residual"): "down",
                                 (2048, 2048, "plain"): "plain"}.items():
        assert skinny_config(1, n, k, 132, fusion=fusion, picks=picks).early == by_role[role]
        assert skinny_config(1, n, k, 132, fusion=fusion).early == GEMV_PICKS.early_chunks[role]
    assert skinny_config(4, 3072, 2048, 132, picks=picks).early == 0  # several rows: none
    # a GPU model's entry over the table, on that GPU only; its fourth value sets the early chunks
    h100 = skinny_config(1, 2048, 2048, 132, fusion="residual", gpu="NVIDIA H100 80GB HBM3")
    assert h100.as_list()[1:5] == [4, 1024, 1, 4] and h100.early == 2
    assert skinny_config(1, 2048, 2048, 132, fusion="residual", gpu="NVIDIA H200").early == 1
    assert GEMV_PICKS.with_early(2).early_chunks == dict.fromkeys(GEMV_PICKS.early_chunks, 2)
    with pytest.raises(ValueError, match="chunks must be 0, 1 or 2"):
        GEMV_PICKS.with_early(3)
    with pytest.raises(TypeError, match="picks must be a GemvPicks"):
        skinny_matmul(torch.zeros(1, 4), torch.zeros(2, 4), picks={})
    assert skinny_config(1, 16384, 2048, 132).as_list()[1:5] == [32, 256, 1, 4]
    assert skinny_config(1, 16384, 2048, 132, torch.float32, fusion="norm").num_warps == 4  # the table: 16-bit only
    # float32 at batch 1 keeps the general rule, with a split when programs are few.
    assert skinny_config(1, 4096, 4096, 132, torch.float32).split_k > 1
    for M in (1, 3, 8, 17, 32):
        cfg = skinny_config(M, 5000, 1023, 132, torch.float32)
        # one float32 row accumulates in float64: half the elements a product
        assert cfg.block_m >= M and cfg.block_m * cfg.block_n * cfg.block_k <= (4096 if M == 1 else 8192)


@pytest.mark.parametrize("call,err,words", [
    (lambda x, w, b: skinny_matmul(x.int(), w, b), TypeError, ["x", "int32", "allowed"]),
    (lambda x, w, b: skinny_matmul(x, w[0], b), ValueError, ["weight", "(N, K)"]),
    (lambda x, w, b: skinny_matmul(x[:, :5], w, b), ValueError, ["x", "K = 8"]),
    (lambda x, w, b: skinny_matmul(x, w.half(), b), TypeError, ["weight", "float16", "x"]),
    (lambda x, w, b: skinny_matmul(x, w, b[:3]), ValueError, ["bias", "(3,)", "(4,)"]),
    (lambda x, w, b: skinny_matmul(x, w, b, out=torch.empty(2, 5)), ValueError, ["out", "(2, 5)", "(2, 4)"]),
    (lambda x, w, b: skinny_matmul(x, w, b, config=(1, 2)), TypeError, ["config", "SkinnyConfig"]),
])
def test_errors_name_the_argument(call, err, words):
    x, w, b = torch.randn(2, 8), torch.randn(4, 8), torch.randn(4)
    with pytest.raises(err) as info:
        call(x, w, b)
    for word in words:
        assert word in str(info.value)


def test_fullgraph_compile():
    g = torch.Generator(device=DEVICE).manual_seed(3)
    x, w, b = _inputs(g, 3, 50, 64, torch.bfloat16)
    eager = skinny_matmul(x, w, b)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w, b: skinny_matmul(x, w, b) * 2, fullgraph=True,
                             backend="inductor" if ON_GPU else "aot_eager")
    torch.testing.assert_close(compiled(x, w, b), eager * 2, rtol=0, atol=0)
    cfg = SkinnyConfig(block_m=4, block_n=16, block_k=16, split_k=3)  # a forced config reaches the op too
    forced = torch.compile(lambda x, w: skinny_matmul(x, w, config=cfg), fullgraph=True,
                           backend="inductor" if ON_GPU else "aot_eager")
    _check("skinny compiled split-K", forced(x, w), x, w, None)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (8, 2048, 8192)])
def test_cuda_graph_capture(M, N, K):
    g = torch.Generator(device=DEVICE).manual_seed(4)
    x, w, b = _inputs(g, M, N, K, torch.bfloat16)
    eager = skinny_matmul(x, w, b)
    graph, captured = capture(lambda: skinny_matmul(x, w, b))
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, eager, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (programmatic dependent launch: Hopper)")
@pytest.mark.parametrize("N,K", [(17, 5000), (3072, 2048), (1023, 8192), (16384, 2048), (5, 40)])
def test_early_weights_bit_exact(N, K):
    """One-row GEMVs with their first 1 or 2 weight chunks loaded before the PDL wait
    (SkinnyConfig.early, GemvPicks.early_chunks) give bit for bit what the plain order
    gives: K in 1, 2 and many chunks, ragged (5000: no 16-byte-aligned chunk) and whole;
    SwiGLU's prologue too."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    g = torch.Generator(device=DEVICE).manual_seed(N + K)
    x, w, b = _inputs(g, 1, N, K, torch.bfloat16)
    gu = torch.randn((1, 2 * K), generator=g, device=DEVICE).to(torch.bfloat16)
    outs = []
    for early in (0, 1, 2):
        picks = GEMV_PICKS.with_early(early)
        outs.append((skinny_matmul(x, w, b, picks=picks), silu_mul_matmul(gu, w, picks=picks)))
    for early, (y, z) in enumerate(outs[1:], 1):
        torch.testing.assert_close(y, outs[0][0], rtol=0, atol=0, msg=f"early={early}")
        torch.testing.assert_close(z, outs[0][1], rtol=0, atol=0, msg=f"early={early}, SwiGLU")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,F_,bias", [(1, 1, False), (17, 111, True), (111, 4100, False), (1023, 17, True)])
def test_silu_mul_matmul_one_row(gen, dtype, N, F_, bias):
    """The SwiGLU product in the GEMV's prologue against silu_mul-then-linear in float64 terms."""
    gu = torch.randn((1, 1, 2 * F_ + 5), generator=gen, device=DEVICE).to(dtype)[..., 3:2 * F_ + 3]  # offset view
    _, w, b = _inputs(gen, 1, N, F_, dtype, bias)
    out = _poisoned((1, 1, N), dtype)
    y = silu_mul_matmul(gu, w, b, out=out)
    assert y is out
    args = (gu, w, b) if b is not None else (gu, w)
    exact = skinny_matmul_ref(*upcast(*args), silu_mul=True)
    assert_close(f"silu_mul_matmul 1x{N}x{F_}", y, exact, skinny_matmul_ref(gu, w, b, silu_mul=True))


def test_silu_mul_matmul_rows_and_errors(gen):
    gu = torch.randn((3, 2 * 40), generator=gen, device=DEVICE).to(torch.bfloat16)
    _, w, _ = _inputs(gen, 1, 17, 40, torch.bfloat16, bias=False)
    exact = skinny_matmul_ref(*upcast(gu, w), silu_mul=True)
    assert_close("silu_mul_matmul 3 rows", silu_mul_matmul(gu, w), exact, skinny_matmul_ref(gu, w, silu_mul=True))
    with pytest.raises(ValueError, match="must be 2 \\* F = 80"):
        silu_mul_matmul(gu[:, :79], w)
    with pytest.raises(TypeError, match="weight has dtype torch.float32"):
        silu_mul_matmul(gu, w.float())


def test_pdl_mode(monkeypatch):
    """ONETRIP_PDL: on unless set to 0; anything but 0/1 is refused clearly. On the CPU no
    launch asks for it."""
    from onetrip.ops._common import pdl_args, pdl_mode

    monkeypatch.delenv("ONETRIP_PDL", raising=False)
    assert pdl_mode() == 1
    assert pdl_args(torch.zeros(1)) == {}  # a CPU tensor (the interpreter): plain launches
    monkeypatch.setenv("ONETRIP_PDL", "0")
    assert pdl_mode() == 0
    monkeypatch.setenv("ONETRIP_PDL", "2")
    with pytest.raises(ValueError, match="ONETRIP_PDL must be 0 or 1, got '2'"):
        pdl_mode()
