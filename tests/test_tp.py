"""Tensor parallelism (models/tp.py, sampling.sample_tp, the engine on a shard).

On the CPU: gloo groups of 2 and 4 forked processes on tiny configs in float32 generate
the tokens one process generates (greedy through the fused backend; top-k, top-p and
temperature draws; biases, a tied head, one KV head replicated over the ranks, a
vocabulary that does not split evenly); a shard read from a checkpoint or drawn at random
equals the slice of the full model. On two GPUs: NCCL, the decode step captured in a CUDA
graph with its collectives, and ``onetrip generate --tp 2``.
"""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from onetrip.cli import main
from onetrip.engine import Engine, SamplingParams, launch
from onetrip.models import Model, get_config, save_model
from onetrip.models.tp import TensorParallel, load_model_tp, random_model_tp, shard_model

from conftest import ON_GPU
from test_models import TINY, VARIANTS

PROMPTS = [[5, 17, 111, 3, 9], [200, 1]]
GREEDY = SamplingParams()
TOP_K = SamplingParams(temperature=0.8, top_k=5, seed=3)
TOP_P = SamplingParams(temperature=0.8, top_p=0.9, seed=3)
TEMPERATURE = SamplingParams(temperature=0.8, seed=3)
# 250 rows over 4 ranks: 63 a rank, the last rank's two past the vocabulary are padding.
PADDED = dataclasses.replace(TINY, vocab_size=250)


def _cases(world: int) -> list[tuple]:
    """(name, config, backend, sampling, prompts, new tokens) a group of ``world`` ranks
    runs. The fused backend goes through Triton's interpreter (1-2.5 s of CPU a run and a
    rank): one run each, the prefill and one or two decode steps; the draws, whose code
    the backends share, eager."""
    if world == 2:
        return [("fused greedy", TINY, "fused", GREEDY, PROMPTS, 3),
                ("eager top_k", TINY, "eager", TOP_K, PROMPTS, 4),
                ("eager top_p", TINY, "eager", TOP_P, PROMPTS, 4),
                *[(f"eager {v}", VARIANTS[v], "eager", GREEDY, PROMPTS, 4) for v in ("qwen2", "qwen3", "llama3-tied")]]
    # 2 KV heads over 4 ranks, each replicated twice (batch 1 through the GEMVs: the GPU test)
    return [("fused greedy", PADDED, "fused", GREEDY, PROMPTS[:1], 2),
            ("eager padded", PADDED, "eager", GREEDY, PROMPTS, 4),
            ("eager padded temperature", PADDED, "eager", TEMPERATURE, PROMPTS, 4)]


def _generate(model: Model, backend: str, sampling: SamplingParams, prompts: list, new: int) -> list[list[int]]:
    model.backend = backend
    return Engine(model, max_seq=16, max_batch=2, graphs=False).generate(prompts, new, sampling=sampling).tokens


def _worker(rank: int, world: int, store: str, out_dir: str) -> None:
    torch.set_num_threads(1)  # the group shares two cores; and no OpenMP pool carried across the fork
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        tp = TensorParallel(rank, world)
        out = {name: _generate(random_model_tp(config, tp, seed=1), *run) for name, config, *run in _cases(world)}
        try:
            TensorParallel(rank, world + 1)
        except ValueError as exc:
            out["group check"] = str(exc)
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


# Forked children of a process holding a CUDA context may not touch CUDA: on GPUs the NCCL test below runs instead.
@pytest.mark.skipif(ON_GPU, reason="the CPU check (gloo, forked processes)")
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_generate_what_one_process_does(world, tmp_path):
    want = {name: _generate(Model.random(config, torch.float32, "cpu", seed=1), *run)
            for name, config, *run in _cases(world)}
    # fork: the children inherit the imported modules (a spawn re-imports torch: ~5 s a process)
    mp.start_processes(_worker, args=(world, str(tmp_path / "store"), str(tmp_path)), nprocs=world,
                       start_method="fork")
    for rank in range(world):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got.pop("group check").endswith(f"where this process is rank {rank} of {world}")
        assert got == want, f"rank {rank}"


TIED_PADDED = dataclasses.replace(PADDED, tie_word_embeddings=True)


@pytest.mark.parametrize("config, world", [(VARIANTS["qwen2"], 2), (TIED_PADDED, 4), (VARIANTS["qwen3"], 4)],
                         ids=["qwen2-2", "tied-padded-4", "qwen3-4"])
def test_loaded_and_random_shards_equal_the_slice(config, world, tmp_path):
    """load_model_tp (from a sharded checkpoint) and random_model_tp give shard_model's
    tensors exactly; the local shapes; the padding rows' -inf bias."""
    full = Model.random(config, torch.float32, "cpu", seed=2)
    save_model(full, tmp_path, max_shard_bytes=64 * 1024)
    for rank in range(world):
        tp = TensorParallel(rank, world)
        want = shard_model(full, tp)
        local = tp.local_config(config)
        assert want.config == local and want.tp == tp and want.layers[0].attn.wqkv.weight.shape[0] == local.qkv_size
        start, stop = tp.vocab_range(config.vocab_size)
        assert want.head_weight.shape[0] == stop - start == -(-config.vocab_size // world)
        if stop > config.vocab_size:
            pad = stop - config.vocab_size
            assert (want.head_bias[-pad:] == float("-inf")).all() and (want.head_bias[:-pad] == 0).all()
        else:
            assert want.head_bias is None
        for got in (load_model_tp(tmp_path, tp), random_model_tp(config, tp, seed=2)):
            a, b = dict(got.named_parameters()), dict(want.named_parameters())
            assert a.keys() == b.keys()
            for name in a:
                assert torch.equal(a[name], b[name]), name


def test_sizes_that_do_not_split_raise():
    with pytest.raises(ValueError, match=r"num_heads \(4\) is not a multiple of the tensor-parallel world size \(3\)"):
        TensorParallel(0, 3).local_config(TINY)
    with pytest.raises(ValueError, match=r"intermediate_size \(102\) is not a multiple .* world size \(4\)"):
        TensorParallel(0, 4).local_config(dataclasses.replace(TINY, intermediate_size=102))
    with pytest.raises(ValueError, match=r"num_kv_heads \(3\) and the tensor-parallel world size \(2\) do not split"):
        TensorParallel(0, 2).local_config(dataclasses.replace(TINY, num_heads=6, num_kv_heads=3))
    with pytest.raises(ValueError, match=r"num_kv_heads \(4\) and the tensor-parallel world size \(6\) do not split"):
        TensorParallel(0, 6).local_config(dataclasses.replace(TINY, num_heads=12, num_kv_heads=4,
                                                              intermediate_size=132))
    with pytest.raises(ValueError, match="0 <= rank < world, got rank 2 of world 2"):
        TensorParallel(2, 2)
    with pytest.raises(ValueError, match="allreduce must be one of auto, nccl, fused, got 'ring'"):
        TensorParallel(0, 2, allreduce="ring")


def test_generate_tp_relaunches_under_torchrun(monkeypatch, capsys):
    calls = []
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(launch, "relaunch_under_torchrun", lambda n, argv: calls.append((n, argv)) or 0)
    argv = ["generate", "--model", "tiny", "--tp", "2", "--max-new-tokens", "3"]
    assert main(argv) == 0 and calls == [(2, argv)]  # the same command, in 2 processes
    monkeypatch.setenv("WORLD_SIZE", "4")  # under a torchrun of another size: refused before anything starts
    assert main(["generate", "--model", "tiny", "--tp", "2"]) == 2
    assert "--tp 2 runs under torchrun with WORLD_SIZE=2; here WORLD_SIZE is '4'" in capsys.readouterr().err


# ---- two GPUs ---------------------------------------------------------------------------------

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")


def _gpu_worker(rank: int, world: int, store: str, out_dir: str) -> None:
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world, device_id=device)
    try:
        tp = TensorParallel(rank, world)
        out = {}
        tiny = random_model_tp(TINY, tp, torch.float32, device, seed=1)
        for name, sampling in (("greedy", GREEDY), ("top_k", TOP_K), ("top_p", TOP_P)):
            tiny.backend = "fused"
            out[name] = Engine(tiny, max_seq=64, max_batch=2).generate(PROMPTS, 24, sampling=sampling).tokens
        big = random_model_tp(get_config("llama-3.2-1b"), tp, torch.bfloat16, device, seed=1)
        big.backend = "fused"
        for batch in (1, 3):  # GEMVs, then cuBLAS; graphs on and off: the same kernels, the same bits
            prompts = [p * 4 for p in (PROMPTS * 2)[:batch]]
            runs = [Engine(big, max_seq=96, max_batch=batch, graphs=g).generate(prompts, 32).tokens
                    for g in (True, False)]
            out[f"1b graphs batch {batch}"] = runs
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@two_gpus
def test_two_gpus_nccl_graphs(tmp_path):
    full = Model.random(TINY, torch.float32, "cuda", seed=1)
    full.backend = "fused"
    want = {name: Engine(full, max_seq=64, max_batch=2).generate(PROMPTS, 24, sampling=s).tokens
            for name, s in (("greedy", GREEDY), ("top_k", TOP_K), ("top_p", TOP_P))}
    mp.start_processes(_gpu_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, start_method="spawn")
    outs = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert outs[0] == outs[1]
    for name in want:
        assert outs[0][name] == want[name], name
    for batch in (1, 3):
        graphs, plain = outs[0][f"1b graphs batch {batch}"]
        assert graphs == plain, f"batch {batch}"


@pytest.mark.gpu
@two_gpus
def test_generate_tp_two_gpus(tmp_path):
    out = tmp_path / "g.json"
    run = subprocess.run([sys.executable, "-m", "onetrip", "generate", "--model", "llama-3.2-1b", "--tp", "2",
                          "--max-new-tokens", "32", "--quiet", "--json", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    s = json.loads(out.read_text())
    assert s["tp"] == 2 and s["graphs"] and s["new_tokens"] == 32 and s["kernels_per_step"] > 0
    assert "TP 2 (per rank)" in run.stdout
