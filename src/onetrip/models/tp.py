"""Tensor parallelism: one model split over the ranks of a process group (Megatron-style).

    tp = TensorParallel.from_env()                      # under torchrun: NCCL on CUDA, gloo on the CPU
    model = load_model_tp("path/to/Llama-3.1-70B", tp, torch.bfloat16, env_device())
    model.backend = "fused"
    Engine(model, ...).generate(prompts, 64)            # every rank runs this; every rank gets the tokens

Each rank holds a ``llama.Model`` whose ``config`` is ``tp.local_config(config)`` and whose
``tp`` is ``tp`` (None on a single GPU). Its weights, of the full model's (out, in) layouts:

    wqkv     column-parallel: this rank's heads/world query heads and their KV heads, rows
             [q | k | v] of its slice (q/k/v biases alike)
    wo       row-parallel: the matching columns; its product is this rank's partial sum
    w_gate_up  column-parallel: intermediate/world rows of gate, then of up
    w_down   row-parallel: the matching columns
    lm_head  this rank's ceil(vocab/world) rows [start, stop) of the head (the embedding's
             when tied); rows past the vocabulary are zero with a -inf bias, so their logits
             are -inf and never drawn
    embed, the norms, q_norm/k_norm   replicated

The KV cache follows the heads: a rank caches only its KV heads. With fewer KV heads than
ranks (GQA, ``world % kv_heads == 0``) each KV head is replicated on world/kv_heads ranks:
rank r holds KV head r * kv_heads // world, the one its query heads read.

A layer sums the ranks' partial products twice: after the o projection and after the down
projection, each in the ``add_rms_norm`` that follows (``fused.py``; the eager backend
all-reduces and adds op by op). The LM head gives each rank its own vocabulary columns;
``engine.sampling.sample_tp`` draws from them exchanging (value, id) pairs, not logits.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist

from .config import ModelConfig
from .fused import FusedOptions
from .llama import Model
from .loader import checkpoint_slices, fused_names, hf_shapes, hf_state_dict, open_checkpoint

ALLREDUCE_MODES = ("auto", "nccl", "fused")
# dist.all_gather_single is the name from torch 2.13 on (all_gather_into_tensor warns
# there); 2.11 has only all_gather_into_tensor. Same arguments.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in a tensor-parallel group.

    rank, world: this rank and the group's size (rank in [0, world)).
    group: the process group (None: the default group, ``dist.group.WORLD``).
    allreduce: how the fused backend reduces a layer's partial sums (``ops.allreduce_norm.
        make_comm``'s mode): "fused", one kernel for the all-reduce, residual add and norm
        (CUDA, 2-8 ranks); "nccl", NCCL's all-reduce then ``add_rms_norm`` (also gloo on
        the CPU); "auto", fused where it can serve, else nccl.
    """

    rank: int
    world: int
    group: Optional[dist.ProcessGroup] = None
    allreduce: str = "auto"

    def __post_init__(self):
        for name in ("rank", "world"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"TensorParallel.{name} must be an int, got {value!r}")
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"TensorParallel needs world >= 1 and 0 <= rank < world, got rank {self.rank} "
                             f"of world {self.world}")
        if self.allreduce not in ALLREDUCE_MODES:
            raise ValueError(f"TensorParallel.allreduce must be one of {', '.join(ALLREDUCE_MODES)}, "
                             f"got {self.allreduce!r}")
        if dist.is_available() and dist.is_initialized():
            size, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
            if (size, rank) != (self.world, self.rank):
                raise ValueError(f"TensorParallel(rank={self.rank}, world={self.world}) does not match its process "
                                 f"group, where this process is rank {rank} of {size}")

    @classmethod
    def from_env(cls, allreduce: str = "auto") -> "TensorParallel":
        """The default group of a torchrun launch (RANK, WORLD_SIZE, LOCAL_RANK; MASTER_ADDR
        and MASTER_PORT for the rendezvous). Initializes it when needed: NCCL with this
        process on CUDA device LOCAL_RANK (made current), gloo where there is no GPU."""
        missing = [v for v in ("RANK", "WORLD_SIZE") if v not in os.environ]
        if missing and not dist.is_initialized():
            raise ValueError(f"TensorParallel.from_env: {', '.join(missing)} not set; start the processes with "
                             f"torchrun (python -m torch.distributed.run --nproc-per-node N ...)")
        device = env_device()
        if not dist.is_initialized():
            if device.type == "cuda":
                torch.cuda.set_device(device)
                dist.init_process_group("nccl", device_id=device)
            else:
                dist.init_process_group("gloo")
        elif device.type == "cuda":
            torch.cuda.set_device(device)
        return cls(dist.get_rank(), dist.get_world_size(), None, allreduce)

    # ---- shapes ----------------------------------------------------------------------------

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """The config of this rank's model: num_heads / world query heads, max(1, kv_heads /
        world) KV heads, intermediate_size / world. vocab_size stays the full vocabulary
        (the embedding is replicated); tie_word_embeddings is False, the head being this
        rank's own rows (``vocab_range``). Raises ValueError for sizes that do not split."""
        w, c = self.world, config
        if c.num_heads % w:
            raise ValueError(f"num_heads ({c.num_heads}) is not a multiple of the tensor-parallel world size ({w}); "
                             f"world sizes that divide it split the heads")
        if c.intermediate_size % w:
            raise ValueError(f"intermediate_size ({c.intermediate_size}) is not a multiple of the tensor-parallel "
                             f"world size ({w})")
        kv = c.num_kv_heads
        if (kv >= w and kv % w) or (kv < w and w % kv):
            raise ValueError(f"num_kv_heads ({kv}) and the tensor-parallel world size ({w}) do not split: the KV "
                             f"heads need to be a multiple of the world size, or the world size a multiple of them "
                             f"(each KV head then replicated on world / kv_heads ranks)")
        return dataclasses.replace(c, num_heads=c.num_heads // w, num_kv_heads=max(1, kv // w),
                                   intermediate_size=c.intermediate_size // w, tie_word_embeddings=False)

    def kv_heads(self, config: ModelConfig) -> tuple[int, int]:
        """(first, count): the full model's KV heads this rank holds."""
        kv, w = config.num_kv_heads, self.world
        return (self.rank * kv // w, kv // w) if kv >= w else (self.rank * kv // w, 1)

    def vocab_range(self, vocab: int) -> tuple[int, int]:
        """This rank's rows [start, stop) of the LM head: ceil(vocab / world) on every rank,
        so the last rank's may run past ``vocab`` (padding, with -inf logits)."""
        shard = -(-vocab // self.world)
        return self.rank * shard, (self.rank + 1) * shard

    # ---- collectives (on the current stream: capturable in a CUDA graph) -------------------

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """x reduced over the group in place ("sum" or "max"); returns x."""
        dist.all_reduce(x, op=_REDUCE_OPS[op], group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """(world, *x.shape): every rank's x, in rank order."""
        x = x.contiguous()
        out = x.new_empty((self.world * x.shape[0], *x.shape[1:]) if x.dim() else (self.world,))
        _all_gather_flat(out, x if x.dim() else x.view(1), group=self.group)
        return out.view(self.world, *x.shape)


def env_device() -> torch.device:
    """The device of a torchrun process: CUDA device LOCAL_RANK, or the CPU without a GPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


# ---- which slice of each tensor a rank holds ----------------------------------------------------

Piece = tuple[str, Optional[int], int, int]  # (Hugging Face name, dim or None for all of it, lo, hi)


def _pieces(config: ModelConfig, tp: TensorParallel) -> dict[str, list[Piece]]:
    """Local parameter name -> the slices of Hugging Face tensors stacked (along dim 0) into
    it: rows (dim 0) of the column-parallel projections, columns (dim 1) of the
    row-parallel ones, whole tensors for the replicated ones."""
    c, w, r = config, tp.world, tp.rank
    q = c.num_heads // w * c.head_dim
    kv_first, kv_count = tp.kv_heads(c)
    kv_lo, kv_hi = kv_first * c.head_dim, (kv_first + kv_count) * c.head_dim
    inter = c.intermediate_size // w
    split = {"q_proj": (0, r * q, (r + 1) * q), "k_proj": (0, kv_lo, kv_hi), "v_proj": (0, kv_lo, kv_hi),
             "o_proj": (1, r * q, (r + 1) * q), "gate_proj": (0, r * inter, (r + 1) * inter),
             "up_proj": (0, r * inter, (r + 1) * inter), "down_proj": (1, r * inter, (r + 1) * inter)}
    out = {}
    for target, sources in fused_names(c).items():
        # "model.layers.0.self_attn.q_proj.weight" -> "q_proj"
        out[target] = [(name, *split[name.split(".")[-2]]) if name.split(".")[-2] in split else (name, None, 0, 0)
                       for name in sources]
    start, stop = tp.vocab_range(c.vocab_size)
    head = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    out["lm_head.weight"] = [(head, 0, start, min(stop, c.vocab_size))] if start < c.vocab_size else []
    return out


def _empty_local(config: ModelConfig, tp: TensorParallel, dtype: torch.dtype, device,
                 fused_options: FusedOptions) -> Model:
    """This rank's model with uninitialised weights on ``device`` (built on the meta device:
    nothing of the full model is allocated)."""
    local = tp.local_config(config)
    start, stop = tp.vocab_range(config.vocab_size)
    with torch.device("meta"):
        model = Model(local, dtype, fused_options=fused_options)
        model.lm_head = torch.nn.Linear(local.hidden_size, stop - start, bias=stop > config.vocab_size, dtype=dtype)
    model = model.to_empty(device=device)
    model.tp = tp
    return model


@torch.no_grad()
def _fill(model: Model, pieces: dict[str, list[Piece]], source: Mapping[str, Any]) -> None:
    """Copy into each local parameter whose pieces all come from ``source`` (Hugging Face
    name -> a tensor, or a safetensors slice: anything indexed by [lo:hi] and [:, lo:hi])."""
    params = dict(model.named_parameters())
    for target, plan in pieces.items():
        if not plan or not all(name in source for name, *_ in plan):
            continue
        dst, row = params[target], 0
        for name, dim, lo, hi in plan:
            src = source[name]
            t = src[:] if dim is None else src[lo:hi] if dim == 0 else src[:, lo:hi]
            dst[row:row + t.shape[0]].copy_(t)
            row += t.shape[0]


@torch.no_grad()
def _pad_head(model: Model, config: ModelConfig, tp: TensorParallel) -> None:
    """Zero the head's rows past the vocabulary and give them a -inf bias."""
    start, stop = tp.vocab_range(config.vocab_size)
    real = max(0, min(stop, config.vocab_size) - start)
    head = model.lm_head
    head.weight[real:].zero_()
    if head.bias is not None:
        head.bias.zero_()
        head.bias[real:] = float("-inf")


def _finish(model: Model, config: ModelConfig, tp: TensorParallel) -> Model:
    _pad_head(model, config, tp)
    return model.requires_grad_(False)


# ---- building a rank's model ---------------------------------------------------------------------

@torch.no_grad()
def shard_model(model: Model, tp: TensorParallel, device=None) -> Model:
    """This rank's model sliced from a full ``model`` (any device), on ``device`` (default:
    the full model's); backend and fused options carried over."""
    if model.tp is not None:
        raise ValueError("shard_model takes a full model; this one is already a tensor-parallel shard")
    config = model.config
    local = _empty_local(config, tp, model.dtype, device or model.device, model.fused_options)
    _fill(local, _pieces(config, tp), hf_state_dict(model))
    local.backend = model.backend
    return _finish(local, config, tp)


@torch.no_grad()
def random_model_tp(config: ModelConfig, tp: TensorParallel, dtype: torch.dtype = torch.float32, device=None,
                    seed: int = 0, *, fused_options: FusedOptions = FusedOptions()) -> Model:
    """This rank's slice of ``Model.random(config, dtype, device, seed)``, the same numbers
    bit for bit on the same kind of device: each full parameter is drawn in turn from the
    same generator on ``device``, sliced, and dropped: every rank draws every number, and
    holds one full parameter in float32 at a time (the largest, a 70B model's embedding,
    is 4.2 GB)."""
    device = torch.device(device or "cpu")
    with torch.device("meta"):
        full = Model(config, dtype)
    local = _empty_local(config, tp, dtype, device, fused_options)
    pieces, sources, shapes = _pieces(config, tp), fused_names(config), hf_shapes(config)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in full.named_parameters():  # Model.random's order, transform and rounding
        r = torch.randn(p.shape, generator=gen, device=device)
        t = (1 + 0.1 * r if p.ndim == 1 and "bias" not in name else 0.02 * r).to(dtype)
        del r
        parts = t.split([shapes[n][0] for n in sources[name]], dim=0)
        _fill(local, pieces, dict(zip(sources[name], parts)))
    return _finish(local, config, tp)


@torch.no_grad()
def load_model_tp(path, tp: TensorParallel, dtype: Optional[torch.dtype] = None, device=None, *,
                  fused_options: FusedOptions = FusedOptions()) -> Model:
    """This rank's model read from a Hugging Face directory (as ``loader.load_model``, whose
    checks and errors it shares): only this rank's slices are read (``safe_open`` slices,
    memory-mapped), so neither the host nor the device holds a full projection."""
    ckpt = open_checkpoint(path, dtype)
    local = _empty_local(ckpt.config, tp, ckpt.dtype, device or "cpu", fused_options)
    with checkpoint_slices(ckpt) as slices:
        _fill(local, _pieces(ckpt.config, tp), slices)
    return _finish(local, ckpt.config, tp)
