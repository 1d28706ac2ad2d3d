"""allreduce_add_rms_norm: the "nccl" mode over gloo in two CPU processes; the fused kernel
through the interpreter, in one process (local buffers standing in for the peers, their flags
set ahead: the math, the copy-in half, the signalled slots, the epoch) and in three forked
processes over shared memory (the barrier for real); on two GPUs the fused mode eagerly and in
a replayed CUDA graph."""

import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from onetrip.ops.allreduce_norm import (AllReduceComm, allreduce_add_rms_norm, allreduce_add_rms_norm_ref,
                                        make_comm)
from onetrip.testing import assert_close, poison_, upcast

EPS = 1e-6


def _run_ranks(fn, world, args, start_method, timeout):
    """fn(rank, world, *args) in ``world`` processes; a failure in one raises here, a hang
    past ``timeout`` seconds kills them all."""
    ctx = mp.start_processes(fn, args=(world, *args), nprocs=world, join=False, start_method=start_method)
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"{fn.__name__} did not finish in {timeout} s (a rank hung)")


def _partials(seed, world, shape, dtype, device="cpu"):
    """Every rank's x, the same on every rank (each regenerates all of them)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype).to(device) for _ in range(world)]


def _check(name, xs, r, w, y, h):
    dt = xs[0].dtype
    exact_y, exact_h = allreduce_add_rms_norm_ref(upcast(*xs), *upcast(r, w), EPS, round_to=dt)
    torch_y, torch_h = allreduce_add_rms_norm_ref(list(xs), r, w, EPS)
    assert_close(f"{name} normed", y, exact_y, torch_y)
    assert_close(f"{name} h", h, exact_h, torch_h)


# -- "nccl" mode over gloo: two forked CPU processes (fork: ~0.2 s where spawn re-imports torch, ~15 s)

def _gloo_rank(rank, world, store):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        seed = 0
        for dtype in (torch.float32, torch.bfloat16):
            for hidden in (17, 111):
                comm = make_comm(None, rank, world, hidden, 4, dtype, "cpu")
                assert comm.mode == "nccl", comm.mode  # "auto" on the CPU
                w = _partials(hidden, 1, (hidden,), dtype)[0]
                for rows, with_residual in ((1, True), (3, False), (3, True)):
                    seed += 1
                    xs = _partials(seed, world, (rows, hidden), dtype)
                    r = _partials(seed + 1000, 1, (rows, hidden), dtype)[0] if with_residual else None
                    x = xs[rank].clone()
                    y, h = allreduce_add_rms_norm(x, r, w, EPS, comm, out=poison_(torch.empty_like(x)))
                    assert torch.equal(x, xs[rank])  # x is not modified
                    _check(f"gloo {dtype} {rows}x{hidden} residual={with_residual}", xs, r, w, y, h)
        # more rows than max_tokens, a 3-D x and the residual stream updated in place
        xs = _partials(99, world, (2, 3, 17), torch.float32)
        r = _partials(98, 1, (2, 3, 17), torch.float32)[0]
        stream = r.clone()
        comm = make_comm(None, rank, world, 17, 4, torch.float32, "cpu", mode="nccl")
        y, h = allreduce_add_rms_norm(xs[rank], stream, None, EPS, comm, residual_out=stream)
        assert h is stream
        _check("gloo in place", xs, r, None, y, h)
    finally:
        dist.destroy_process_group()


def test_nccl_mode_gloo(tmp_path):
    _run_ranks(_gloo_rank, 2, (str(tmp_path / "store"),), "fork", timeout=120)


# -- the fused kernel in one process: peers are local buffers, their flags already set ---------

def _fake_comm(rank, world, hidden, max_tokens, programs, dtype, push=True):
    """A fused comm whose peers' buffers live in this process; every peer's flag here is set far
    ahead, so the barrier's waits pass and the kernel's math and signalling can be checked."""
    bufs = [torch.zeros(2, world, max_tokens, hidden, dtype=dtype) for _ in range(world)]
    flags = [torch.zeros(world, programs, dtype=torch.int64) for _ in range(world)]
    flags[rank].fill_(1 << 40)
    return AllReduceComm(None, rank, world, "fused", hidden, max_tokens, dtype, torch.device("cpu"), programs,
                         bufs[rank], flags[rank], torch.zeros(2, dtype=torch.int64),
                         torch.tensor([b.data_ptr() for b in bufs]), torch.tensor([f.data_ptr() for f in flags]),
                         (bufs, flags), push)


@pytest.mark.parametrize("world, rank, hidden, rows, dtype, with_residual, push", [
    (3, 1, 111, 3, torch.bfloat16, True, True),   # 2 programs: program 0 takes rows 0 and 2
    (3, 2, 111, 3, torch.bfloat16, True, False),
    (2, 0, 17, 1, torch.float32, False, True),
])
def test_fused_kernel_fake_peers(world, rank, hidden, rows, dtype, with_residual, push):
    comm = _fake_comm(rank, world, hidden, 4, 2, dtype, push)
    bufs, flags = comm.handle
    w = torch.randn(hidden).to(dtype)
    for call in range(3):  # the halves alternate: 0, 1, 0
        xs = _partials(call, world, (rows, hidden), dtype)
        r = _partials(call + 100, 1, (rows, hidden), dtype)[0] if with_residual else None
        half = call % 2
        for q in range(world):  # peer q's rows: pushed into this rank's buffer, or in q's own
            if q != rank:
                bufs[rank if push else q][half, q, :rows] = xs[q]
        y, h = allreduce_add_rms_norm(xs[rank], r, w, EPS, comm, out=poison_(torch.empty_like(xs[rank])))
        _check(f"fused call {call}", xs, r, w, y, h)
        for q in range(world):  # the copy-in: into every peer's buffer (push), or this rank's (pull)
            if (q != rank) == push:
                assert torch.equal(bufs[q][half, rank, :rows], xs[rank])
        programs = min(rows, comm.programs)
        for q in range(world):  # this rank signalled epoch call + 1 into every peer's slot (rank, program)
            if q != rank:
                assert flags[q][rank, :programs].tolist() == [call + 1] * programs
        assert comm.state.tolist() == [call + 1, 0]


def _shared_rank(rank, world, bufs, flags, hs, rows_per_call, push):
    """A fused comm over buffers in shared memory, mapped at the same address in every forked
    process: the barrier runs for real across processes, through the interpreter's atomics."""
    dtype, hidden, programs = torch.bfloat16, bufs[0].shape[-1], flags[0].shape[1]
    comm = AllReduceComm(None, rank, world, "fused", hidden, bufs[0].shape[2], dtype, torch.device("cpu"),
                         programs, bufs[rank], flags[rank], torch.zeros(2, dtype=torch.int64),
                         torch.tensor([b.data_ptr() for b in bufs]), torch.tensor([f.data_ptr() for f in flags]),
                         push=push)
    w = _partials(hidden, 1, (hidden,), dtype)[0]
    for call, rows in enumerate(rows_per_call):
        time.sleep(0.01 * ((rank + call) % 3))  # ranks arrive in a different order each call
        xs = _partials(call, world, (rows, hidden), dtype)
        r = _partials(call + 100, 1, (rows, hidden), dtype)[0]
        y, h = allreduce_add_rms_norm(xs[rank], r, w, EPS, comm)
        _check(f"rank {rank} call {call}", xs, r, w, y, h)
        hs[rank, call, :rows] = h.float()
    assert comm.state.tolist() == [len(rows_per_call), 0]


@pytest.mark.parametrize("push", [True, False])
def test_fused_barrier_across_processes(push):
    world, hidden, max_tokens, programs, rows_per_call = 3, 17, 3, 2, (1, 3, 2, 3)
    bufs = [torch.zeros(2, world, max_tokens, hidden, dtype=torch.bfloat16).share_memory_() for _ in range(world)]
    flags = [torch.zeros(world, programs, dtype=torch.int64).share_memory_() for _ in range(world)]
    hs = torch.full((world, len(rows_per_call), max_tokens, hidden), float("nan")).share_memory_()
    _run_ranks(_shared_rank, world, (bufs, flags, hs, rows_per_call, push), "fork", timeout=120)
    for q in range(1, world):  # the same bits of h on every rank
        torch.testing.assert_close(hs[q], hs[0], rtol=0, atol=0, equal_nan=True)


def test_fused_compiles_fullgraph():
    comm = _fake_comm(0, 2, 17, 4, 2, torch.bfloat16)
    xs = _partials(5, 2, (3, 17), torch.bfloat16)
    comm.handle[0][0][:, 1, :3] = xs[1]  # pushed into both halves: any call finds the peer's rows
    r, w = _partials(6, 2, (3, 17), torch.bfloat16)[0], torch.randn(17).to(torch.bfloat16)
    eager = allreduce_add_rms_norm(xs[0], r, w, EPS, comm)
    torch._dynamo.reset()
    # aot_eager: the question is whether Dynamo traces the custom op without a break (as test_compile.py)
    compiled = torch.compile(lambda x, r, w: allreduce_add_rms_norm(x, r, w, EPS, comm), fullgraph=True,
                             backend="aot_eager")
    for got, want in zip(compiled(xs[0], r, w), eager):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert comm.state[0].item() == 2


# -- arguments ------------------------------------------------------------------------------

def test_world_one_is_add_rms_norm():
    import onetrip

    comm = make_comm(None, 0, 1, 17, 2, torch.float32, "cpu")
    x, r, w = torch.randn(3, 17), torch.randn(3, 17), torch.randn(17)
    y, h = allreduce_add_rms_norm(x, r, w, EPS, comm)  # more rows than max_tokens: still right
    want = onetrip.add_rms_norm(x, r, w, EPS)
    assert torch.equal(y, want[0]) and torch.equal(h, want[1])


def test_bad_args():
    cpu = "cpu"
    with pytest.raises(ValueError, match="mode"):
        make_comm(None, 0, 1, 8, 2, torch.float32, cpu, mode="multimem")
    with pytest.raises(ValueError, match="rank 1 is not below world 1"):
        make_comm(None, 1, 1, 8, 2, torch.float32, cpu)
    with pytest.raises(ValueError, match="hidden"):
        make_comm(None, 0, 1, 0, 2, torch.float32, cpu)
    with pytest.raises(ValueError, match="max_tokens"):
        make_comm(None, 0, 1, 8, 0, torch.float32, cpu)
    with pytest.raises(TypeError, match="dtype"):
        make_comm(None, 0, 1, 8, 2, torch.int32, cpu)
    with pytest.raises(ValueError, match="needs CUDA"):
        make_comm(None, 0, 1, 8, 2, torch.float32, cpu, mode="fused")
    with pytest.raises(TypeError, match="group"):
        make_comm("world", 0, 1, 8, 2, torch.float32, cpu)
    with pytest.raises(TypeError, match="push"):
        make_comm(None, 0, 1, 8, 2, torch.float32, cpu, push=1)
    if not dist.is_initialized():
        with pytest.raises(ValueError, match="init_process_group"):
            make_comm(None, 0, 2, 8, 2, torch.float32, cpu)
    comm = make_comm(None, 0, 1, 8, 2, torch.float32, cpu)
    x, w = torch.randn(2, 8), torch.randn(8)
    with pytest.raises(TypeError, match="comm"):
        allreduce_add_rms_norm(x, None, w, EPS, "comm")
    with pytest.raises(ValueError, match="hidden 8"):
        allreduce_add_rms_norm(torch.randn(2, 9), None, w, EPS, comm)
    with pytest.raises(TypeError, match="made for torch.float32"):
        allreduce_add_rms_norm(x.half(), None, w, EPS, comm)
    with pytest.raises(ValueError, match="residual"):
        allreduce_add_rms_norm(x, torch.randn(3, 8), w, EPS, comm)
    with pytest.raises(ValueError, match="residual_out"):
        allreduce_add_rms_norm(x, None, w, EPS, comm, residual_out=torch.empty_like(x))
    with pytest.raises(ValueError, match="weight"):
        allreduce_add_rms_norm(x, None, torch.randn(9), EPS, comm)
    with pytest.raises(ValueError, match="eps"):
        allreduce_add_rms_norm(x, None, w, -1.0, comm)
    with pytest.raises(ValueError, match="not differentiable"):
        allreduce_add_rms_norm(x, None, w.clone().requires_grad_(), EPS, comm)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the command runs the suite")
def test_bench_command_needs_gpus(capsys):
    from onetrip.cli import main

    assert main(["bench", "allreduce", "--world", "2"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


# -- two GPUs ---------------------------------------------------------------------------------

def _gpu_rank(rank, world, store):
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world, device_id=dev)
    try:
        for dtype, hidden in ((torch.bfloat16, 8192), (torch.float32, 111)):
            _gpu_checks(rank, world, dev, dtype, hidden)  # its comm freed before the group goes
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()


def _gpu_checks(rank, world, dev, dtype, hidden):
    from onetrip.graphs import capture

    comm = make_comm(None, rank, world, hidden, 64, dtype, dev)
    assert comm.mode == "fused", comm.mode  # "auto" on GPUs with symmetric memory
    pull = make_comm(None, rank, world, hidden, 64, dtype, dev, push=False)
    nccl = make_comm(None, rank, world, hidden, 64, dtype, dev, mode="nccl")
    w = _partials(hidden, 1, (hidden,), dtype, dev)[0]
    # eager: 1, 5 and 64 rows; 65 rows take the NCCL path; then the "nccl" mode
    for seed, (rows, c) in enumerate(((1, comm), (5, comm), (64, comm), (65, comm), (1, comm), (5, pull), (64, pull),
                                      (5, nccl))):
        xs = _partials(seed, world, (rows, hidden), dtype, dev)
        r = _partials(seed + 100, 1, (rows, hidden), dtype, dev)[0]
        y, h = allreduce_add_rms_norm(xs[rank], r, w, EPS, c, out=poison_(torch.empty_like(r)))
        _check(f"eager {c.mode} {dtype} {rows}x{hidden}", xs, r, w, y, h)
        both = [torch.empty_like(h) for _ in range(world)]
        dist.all_gather(both, h)
        assert torch.equal(both[0], both[1]), "h differs between ranks"
    # a graph of 3 calls (odd: the halves come from the device epoch) replayed with new inputs
    x_in = torch.zeros(3, 7, hidden, dtype=dtype, device=dev)
    r_in = torch.zeros(7, hidden, dtype=dtype, device=dev)

    def step():
        return [allreduce_add_rms_norm(x_in[j], r_in, w, EPS, comm) for j in range(3)]

    graph, outs = capture(step)
    for replay in range(4):
        xs = _partials(1000 + replay, world, (3, 7, hidden), dtype, dev)
        r = _partials(2000 + replay, 1, (7, hidden), dtype, dev)[0]
        x_in.copy_(xs[rank])
        r_in.copy_(r)
        graph.replay()
        for j, (y, h) in enumerate(outs):
            _check(f"graph replay {replay} call {j}", [x[j] for x in xs], r, w, y, h)
        y, h = allreduce_add_rms_norm(xs[rank][0], None, w, EPS, comm)  # eager between replays
        _check(f"eager after replay {replay}", [x[0] for x in xs], None, w, y, h)
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_fused_two_gpus(tmp_path):
    _run_ranks(_gpu_rank, 2, (str(tmp_path / "store"),), "spawn", timeout=420)
