"""``onetrip bench decode --tp N``: the CPU check (2 gloo processes, tiny preset), the
gpt-fast-style decoder on one process, and the torchrun relaunch command."""

import argparse
import sys
from pathlib import Path

import pytest
import torch

tp_module = pytest.importorskip("onetrip.models.tp", reason="models/tp.py (tensor parallelism) is not in this tree yet")

from onetrip.bench import decode_tp  # noqa: E402
from onetrip.engine.launch import CHILD_ENV, torchrun_command  # noqa: E402
from onetrip.models import Model, get_config  # noqa: E402
from onetrip.models.llama import greedy_generate  # noqa: E402


@pytest.mark.slow  # ~20 s on 2 cores; test_tp.py runs the same two-rank greedy check in CI
def test_check_two_ranks_draw_the_full_models_tokens():
    """2 gloo processes: onetrip-tp-nccl (fused kernels, interpreted) and gptfast-tp (eager)
    each give the unsharded model's greedy tokens, on both ranks."""
    assert decode_tp.check_decode_tp(2, new_tokens=3) == 0


def test_gptfast_one_process_matches_greedy_generate():
    model = Model.random(get_config("tiny"), torch.float32, "cpu", seed=1)
    prompts = decode_tp.prompts_for(3, 5, model.config.vocab_size, seed=2)
    want = greedy_generate(model, prompts, 5).tolist()
    model.reset_cache()
    got = decode_tp.run_gptfast(model, prompts, 5, False, decode_tp.Ranks(None), warmup=False)[0]
    assert got == want


def test_rank_step_bytes_counts_weights_once_and_the_kv_cache():
    config = get_config("tiny")
    model = Model.random(config, torch.float32, "cpu")
    elem = 4
    head_only = config.num_parameters() - (config.vocab_size - 2) * config.hidden_size  # 2 rows of the input table
    kv = 2 * config.num_layers * config.num_kv_heads * config.head_dim * elem * 10.5 * 2
    assert decode_tp.rank_step_bytes(model, 2, 10.5) == head_only * elem + kv


def test_relaunch_command_and_argv(tmp_path: Path):
    args = argparse.Namespace(tp=4, new_tokens=None, prompt_tokens=32, out=tmp_path, preset=["llama-3.1-70b"],
                              batch=[1, 32], provider=None, check=False)
    argv = decode_tp.tp_argv(args)
    assert argv[:4] == ["bench", "decode", "--tp", "4"]
    assert argv[argv.index("--batch") + 1:argv.index("--batch") + 3] == ["1", "32"]
    cmd = torchrun_command(4, argv)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc-per-node=4" in cmd and cmd[cmd.index("-m", 3):cmd.index("-m", 3) + 2] == ["-m", "onetrip"]
    assert CHILD_ENV == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    with pytest.raises(ValueError, match="nproc"):
        torchrun_command(0, argv)


def test_tp1_ratio_reads_the_tp1_file(tmp_path: Path):
    import json

    stem = tmp_path / "decode-tp2-nvidia-h200-bfloat16-20261129"
    base = [{"preset": "p", "batch": 1, "provider": "onetrip-tp", "tok_s": 100.0}]
    (tmp_path / "decode-tp1-nvidia-h200-bfloat16-20261129.json").write_text(json.dumps({"results": base}))
    records = [{"preset": "p", "tp": 2, "batch": 1, "provider": "onetrip-tp-nccl", "tok_s": 180.0},
               {"preset": "p", "tp": 2, "batch": 32, "provider": "onetrip-tp", "tok_s": 900.0}]
    assert decode_tp.attach_tp1_ratio(records, stem).name.startswith("decode-tp1-")
    assert records[0]["vs_tp1"] == pytest.approx(1.8) and "vs_tp1" not in records[1]
