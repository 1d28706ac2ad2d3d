"""``onetrip bench train``: whole training steps (forward, backward, AdamW) of Llama-3.2-1B and
Qwen2.5-0.5B shapes through transformers, four ways, on one GPU.

    onetrip bench train --quick --out DIR                  # ~4 min on an H200; torch.compile cut by the budget
    onetrip bench train --quick --budget-s 480 --out DIR   # all four providers, ~7 min
    onetrip bench train --check                            # the CPU check (train_check.py): tiny models

Models: transformers' LlamaForCausalLM and Qwen2ForCausalLM from onetrip's presets
``llama-3.2-1b`` (hidden 2048, 16 layers, 32/8 heads, intermediate 8192, vocab 128256, tied,
llama3 rope scaling) and ``qwen2.5-0.5b`` (896, 24 layers, 14/2 heads, 4864, 151936, tied, q/k/v
biases), random weights from a fixed seed, no network. Every provider starts from the same
weights (copied from one initialisation) on a fresh model and runs the same loop on the same
data: ``loss = model(input_ids=ids, labels=ids).loss; loss.backward(); opt.step();
model.zero_grad(set_to_none=True)`` (the torch default, as transformers' Trainer does).

    eager          attn_implementation="sdpa"; the loss as transformers computes it (every
                   logit, upcast to float32)
    torch.compile  torch.compile(model) of the same, default mode
    liger          Liger-Kernel's apply_liger_kernel_to_llama / _qwen2 with its defaults
                   (RMSNorm, SwiGLU, RoPE, fused linear cross-entropy)
    onetrip        onetrip.patch.patch(model) (norms, SwiGLU, RoPE, attention, fused linear
                   cross-entropy) and onetrip.optim.AdamW
    onetrip-sdpa   the same with attention=False: SDPA's attention (whichever backend torch
                   picks), onetrip's everything else

Precision, one scheme for all: bf16 parameters, activations and gradients; float32 master
weights and AdamW state (16 bytes a parameter: 2 param + 2 grad + 4 master + 8 moments; lr 3e-4,
betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every tensor). onetrip steps with
``onetrip.optim.AdamW(..., master_weights=True)``; the others with ``MasterAdamW``:
torch.optim.AdamW(fused=True) over float32 masters, the bf16 grads converted 64M elements at a
time and the masters copied back (~14 bytes a parameter more than a fused master-weight step:
~5 ms a step at 1.2 B parameters). Not float32 parameters under torch.autocast: there the
residual stream and the norms stay float32 for every provider and each step casts every weight
to bf16 (onetrip's custom ops are not autocast-aware; onetrip.patch casts attention and the LM
head by hand, the rest runs in float32), so a step would measure float32 traffic and casts
rather than the bf16 step the kernels are built for.

Per model and provider:

- **loss**: 20 steps at the common batch (the largest batch eager fits, so memory
  compares at the same batch; ``--quick``: at most 4). Step i trains on its own (batch, seq)
  token ids drawn uniformly from a fixed random set of 4096 ids, the same for every provider:
  the loss can fall from ln(vocab) toward ln(4096), so a provider that trains differently shows.
  ``max_loss_diff``: the largest |loss - eager's loss| over the steps; onetrip's ``loss_ok``:
  at most twice the peers' (torch.compile, Liger) own largest difference, or bf16's unit
  roundoff (2^-8) times eager's mean loss, whichever is larger.
- **speed**: those steps after the first 3, each timed with CUDA events; tokens/s
  = batch x seq / median step time; ``first_step_s``: the first step's wall time (compilation).
- **memory**: ``torch.cuda.max_memory_allocated`` over those steps: weights, grads, masters,
  moments and activations, everything the step holds.
- **largest batch** at seq: one step each at batch 1 and 2 gives peak(b) = fixed + b x
  per_sequence; the batch that line puts at the device's capacity is tried, then larger (or
  smaller) ones until one fits and the next runs out of memory (``search_largest``). At most
  ``probes`` large steps; ``max_batch_exact`` false marks a lower bound. ``--quick``: eager's
  and onetrip's only (the issue's bar compares those two).

Order: per model eager, onetrip, liger; then torch.compile for both (its first step compiles
for ~1 min): what ``budget_s`` cuts first. A provider or search that would not end by the
budget is recorded as skipped; results are written after every provider.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import importlib.util
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from . import harness
from .train_report import bars, plot, print_table, relate

MODELS = ("llama-3.2-1b", "qwen2.5-0.5b")  # onetrip presets, built as transformers models
PROVIDERS = ("eager", "torch.compile", "liger", "onetrip", "onetrip-sdpa")
ADAMW = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
SUBSET = 4096  # token ids the data draws from
MASTER_CHUNK = 1 << 26  # elements MasterAdamW converts to float32 at once: 256 MiB of grads
COMPILE_S = 90.0  # what the budget sets aside for a cold torch.compile of a step (fwd + bwd)
STEPS, WARMUP = 20, 3  # steps on the same data per provider; the first WARMUP are not timed
MAX_BATCH = 1024  # the largest-batch search's ceiling
SEED = 0


@dataclass(frozen=True)
class TrainSettings:
    """What a run measures. ``probes``: large steps the largest-batch search may take per
    provider (after batches 1 and 2); ``common_cap``: the most the common batch may be;
    ``search``: the providers whose largest batch is searched (eager's always is: it sets the
    common batch; under torch.compile the first new batch shape recompiles, ~1 min)."""

    seq: int = 4096
    probes: int = 8
    common_cap: Optional[int] = None
    search: tuple[str, ...] = PROVIDERS
    budget_s: float = 540.0


FULL = TrainSettings()
# The bars need eager's and onetrip's largest batches only.
QUICK = TrainSettings(probes=3, common_cap=4, search=("eager", "onetrip"), budget_s=240.0)


class Skip(Exception):
    """A provider that cannot run here for a reason that is no failure (not installed, budget)."""


# ------------------------------------------------------------------------ models and data


def hf_config(preset: str, **overrides):
    """transformers' config for onetrip's ``preset`` with ``overrides`` (ModelConfig fields)."""
    import transformers

    from onetrip.models.config import get_config

    hf = dataclasses.replace(get_config(preset), **overrides).to_hf()
    hf.pop("architectures", None)
    config = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
    config.use_cache = False
    return config


def build_model(config, dtype: torch.dtype, device: str, init: Optional[dict] = None, seed: int = 0):
    """A transformers causal LM in training mode: random weights from ``seed``, or ``init``'s."""
    import transformers

    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    if init is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(init[name])
    return model.train()


def snapshot(model) -> dict[str, torch.Tensor]:
    """The parameters on the host by name (a tied weight once), pinned where CUDA is."""
    pin = torch.cuda.is_available()
    return {n: (p.detach().cpu().pin_memory() if pin else p.detach().cpu().clone()) for n, p in
            model.named_parameters()}


def batches(steps: int, batch: int, seq: int, vocab: int, seed: int, device) -> list[torch.Tensor]:
    """``steps`` (batch, seq) int64 token ids drawn uniformly from a fixed random set of
    min(4096, vocab // 4) ids; made on the host, so every device gets the same."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(vocab, generator=gen)[:min(SUBSET, vocab // 4)]
    return [ids[torch.randint(0, len(ids), (batch, seq), generator=gen)].to(device) for _ in range(steps)]


class MasterAdamW:
    """torch.optim.AdamW(fused=True) over float32 master copies of 16-bit params: a step
    converts the grads to float32 for one chunk of <= MASTER_CHUNK elements at a time (the
    float32 grads never all exist at once), steps the chunk, and copies its masters back to
    the params (rounded to nearest even). Same state as onetrip.optim.AdamW(master_weights=True):
    4 bytes of master and 8 of moments a parameter."""

    def __init__(self, params, **adamw):
        self.params = [p for p in params if p.requires_grad]
        self.masters = [p.detach().float() for p in self.params]
        fused = all(p.is_cuda for p in self.params)
        self.chunks, size = [[]], 0
        for i, p in enumerate(self.params):
            if size and size + p.numel() > MASTER_CHUNK:
                self.chunks.append([])
                size = 0
            self.chunks[-1].append(i)
            size += p.numel()
        self.optims = [torch.optim.AdamW([self.masters[i] for i in c], fused=fused or None, **adamw)
                       for c in self.chunks]

    @torch.no_grad()
    def step(self) -> None:
        for chunk, opt in zip(self.chunks, self.optims):
            live = [i for i in chunk if self.params[i].grad is not None]
            for i in live:
                self.masters[i].grad = self.params[i].grad.float()
            opt.step()
            for i in live:
                self.params[i].copy_(self.masters[i])
                self.masters[i].grad = None


def _is_oom(exc: BaseException) -> bool:
    """torch's OutOfMemoryError, or an allocation failure cuBLAS or Triton report as a RuntimeError."""
    text = str(exc).lower()
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text or "alloc_failed" in text


def train_step(forward: Callable, model, opt, ids: torch.Tensor) -> torch.Tensor:
    """One step on (batch, seq) ids as their own labels (transformers shifts them); the loss, detached."""
    loss = forward(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    opt.step()
    model.zero_grad(set_to_none=True)
    return loss.detach()


# ------------------------------------------------------------------------------ providers


def preflight(name: str) -> None:
    """Raise Skip (Liger not installed) or RuntimeError (no onetrip.patch) before a model is built."""
    if name == "liger" and importlib.util.find_spec("liger_kernel") is None:
        raise Skip("liger-kernel is not installed")
    if name.startswith("onetrip") and importlib.util.find_spec("onetrip.patch") is None:
        raise RuntimeError("onetrip.patch is not available (no module onetrip.patch)")


def setup(name: str, model) -> tuple[Callable, object, Callable[[], None]]:
    """(forward, optimizer, undo) of provider ``name`` on ``model``: undo reverts what outlives
    the model (Liger's names in transformers' modeling module, dynamo's caches, onetrip's patch)."""
    if name == "eager":
        return model, MasterAdamW(model.parameters(), **ADAMW), lambda: None
    if name == "torch.compile":
        return torch.compile(model), MasterAdamW(model.parameters(), **ADAMW), torch._dynamo.reset
    preflight(name)
    if name == "liger":
        import liger_kernel.transformers as liger

        module = importlib.import_module(type(model).__module__)  # e.g. transformers...modeling_llama
        saved = dict(vars(module))
        apply = {"llama": liger.apply_liger_kernel_to_llama, "qwen2": liger.apply_liger_kernel_to_qwen2}
        apply[model.config.model_type](model=model)

        def undo():
            for key in set(vars(module)) - set(saved):
                delattr(module, key)
            for key, value in saved.items():
                if vars(module)[key] is not value:
                    setattr(module, key, value)

        return model, MasterAdamW(model.parameters(), **ADAMW), undo
    if name in ("onetrip", "onetrip-sdpa"):
        from onetrip.optim import AdamW

        patch = importlib.import_module("onetrip.patch")
        model = patch.patch(model, attention=name == "onetrip")
        return model, AdamW(model.parameters(), master_weights=True, **ADAMW), lambda: patch.unpatch(model)
    raise ValueError(f"provider {name!r}; allowed: {', '.join(PROVIDERS)}")


# ------------------------------------------------------------------------------- measuring


def search_largest(fits: Callable[[int], Optional[int]], capacity: int, *, probes: int, ceiling: int,
                   may_try: Callable[[int], bool] = lambda b: True) -> tuple[int, bool, dict]:
    """The largest batch for which ``fits(b)`` (one training step: its peak bytes, or None when
    it ran out of memory) succeeds: (batch, exact, {batch: peak or None}).

    Batches 1 and 2 give the line peak(b) = fixed + b x per; the first guess is the batch that
    line puts at ``capacity`` bytes. While the answer stays the same the search gallops from
    it (strides 1, 2, 4, ...) up while steps fit, down while they fail; once both a fit and a
    miss bracket the answer it halves the gap. At most ``probes`` steps past batch 2, none
    above ``ceiling`` and none that ``may_try`` refuses (the time budget); ``exact`` says the
    batch one above the answer was seen to fail.
    """
    tried: dict[int, Optional[int]] = {}

    def ok(b: int) -> bool:
        tried[b] = fits(b)
        return tried[b] is not None

    if not ok(1):
        return 0, True, tried
    if ceiling < 2 or not may_try(2):
        return 1, False, tried
    if not ok(2):
        return 1, True, tried
    per = max(1, tried[2] - tried[1])
    lo, hi = 2, None
    b, stride, first = min(max(3, (capacity - tried[1] + per) // per), ceiling), 1, None
    for _ in range(probes):
        if not lo < b <= ceiling or (hi is not None and b >= hi) or not may_try(b):
            break
        fit = ok(b)
        lo, hi = (b, hi) if fit else (lo, b)
        if hi is not None and hi - lo <= 1:
            break
        first = fit if first is None else first
        if fit == first:  # still on the guess's side of the answer
            b = min(lo + stride, ceiling) if fit else max(lo + 1, hi - stride)
            stride *= 2
        else:
            b = (lo + hi) // 2
    return lo, hi is not None and hi - lo == 1, tried


def _release() -> None:
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def peak_of_step(step: Callable[[], object]) -> Optional[int]:
    """max_memory_allocated over one call of ``step`` (from a clean cache), or None when it ran
    out of memory; either way the memory it held is released."""
    _release()
    oom = False
    try:
        step()
        torch.cuda.synchronize()
    except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
        if not _is_oom(exc):
            raise
        oom = True  # the frames holding the step's tensors go with exc at the end of this block
    peak = torch.cuda.max_memory_allocated()
    _release()
    return None if oom else peak


def loss_phase(forward, model, opt, data: list[torch.Tensor], warmup: int, deadline: float,
               on_step: Callable[[int], None]) -> dict:
    """Train on ``data`` one step each (stopping at ``deadline``): losses, step times, peak memory."""
    _release()
    losses, events, first_s = [], [], None
    start_wall = time.perf_counter()
    for i, ids in enumerate(data):
        if time.perf_counter() > deadline:
            break
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        losses.append(train_step(forward, model, opt, ids))
        end.record()
        events.append((start, end))
        if i == 0:
            torch.cuda.synchronize()
            first_s = time.perf_counter() - start_wall
        on_step(i + 1)
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in events[warmup:])
    return {"losses": [float(x) for x in losses], "first_step_s": first_s, "timed_steps": len(ms),
            "step_ms": statistics.median(ms) if ms else None,
            "step_ms_p20": harness.quantile(ms, 0.2) if ms else None,
            "step_ms_p80": harness.quantile(ms, 0.8) if ms else None,
            "peak_bytes": torch.cuda.max_memory_allocated() if losses else None}


# --------------------------------------------------------------------------------- the run


def _record(preset: str, provider: str, seq: int) -> dict:
    return {"model": preset, "provider": provider, "seq": seq, "batch": None, "tokens_per_step": None,
            "step_ms": None, "step_ms_p20": None, "step_ms_p80": None, "timed_steps": None, "tokens_per_s": None,
            "speedup_vs_eager": None, "peak_bytes": None, "peak_vs_eager": None, "max_batch": None,
            "max_batch_exact": None, "max_tokens": None, "max_tokens_vs_eager": None, "search": None,
            "losses": [], "max_loss_diff": None, "loss_tolerance": None, "loss_ok": None, "first_step_s": None,
            "setup_s": None, "wall_s": None, "skipped": None, "error": None}


class _Run:
    """One ``bench train`` run: per model the config, the initial weights, the common batch and
    eager's wall time (the estimate for the other providers); the clock."""

    def __init__(self, settings: TrainSettings, say: Callable[[str], None], device: str = "cuda"):
        self.s, self.say, self.device = settings, say, device
        self.start = time.perf_counter()
        self.deadline = self.start + settings.budget_s
        self.configs: dict[str, object] = {}
        self.init: dict[str, dict] = {}
        self.common: dict[str, int] = {}
        self.cost: dict[str, float] = {}

    def bench(self, preset: str, provider: str) -> dict:
        rec = _record(preset, provider, self.s.seq)
        t0 = time.perf_counter()
        try:
            self._bench(preset, provider, rec)
        except Skip as why:
            rec["skipped"] = str(why)
        except Exception as exc:  # noqa: BLE001 - recorded, the suite goes on
            rec["error"] = harness.error_string(exc)
            self.say(f"{preset} {provider}: failed: {rec['error']}")
        rec["wall_s"] = time.perf_counter() - t0
        if provider == "eager" and not rec["error"]:
            self.cost[preset] = rec["wall_s"]
        _release()
        return rec

    def _model(self, preset: str):
        """A fresh bf16 model of ``preset`` with the run's initial weights (made on first use)."""
        if preset not in self.init:
            self.configs[preset] = hf_config(preset)
            model = build_model(self.configs[preset], torch.bfloat16, self.device, seed=SEED)
            self.init[preset] = snapshot(model)
            return model
        return build_model(self.configs[preset], torch.bfloat16, self.device, self.init[preset])

    def _bench(self, preset: str, provider: str, rec: dict) -> None:
        preflight(provider)
        left = self.deadline - time.perf_counter()
        need = self.cost.get(preset, 0.0) + (COMPILE_S if provider == "torch.compile" else 0.0)
        if left <= 0 or need > left:
            raise Skip(f"budget: ~{need:.0f} s needed, {max(left, 0):.0f} s of {self.s.budget_s:.0f} s left")
        if provider != "eager" and preset not in self.common:
            raise Skip("no common batch: eager did not run")
        self.say(f"{preset} {provider}: building")
        t0 = time.perf_counter()
        model = self._model(preset)
        forward = opt = undo = None
        try:
            forward, opt, undo = setup(provider, model)
            rec["setup_s"] = time.perf_counter() - t0
            if provider == "eager":  # eager's largest batch is the common batch: searched first
                self._search(preset, provider, forward, model, opt, rec)
                opt = None
                _release()
                with torch.no_grad():
                    for name, p in model.named_parameters():
                        p.copy_(self.init[preset][name])
                forward, opt, undo = setup(provider, model)
                largest = max(1, rec["max_batch"] or 0)
                self.common[preset] = min(largest, self.s.common_cap or largest)
            self._losses(preset, provider, forward, model, opt, rec)
            if provider not in self.s.search:
                rec["search"] = "skipped (--quick)"
            elif provider != "eager" and not rec["error"]:
                self._search(preset, provider, forward, model, opt, rec)
        finally:
            del forward, opt, model
            if undo is not None:
                undo()

    def _losses(self, preset: str, provider: str, forward, model, opt, rec: dict) -> None:
        batch = rec["batch"] = self.common[preset]
        rec["tokens_per_step"] = batch * self.s.seq
        data = batches(STEPS, batch, self.s.seq, model.config.vocab_size, SEED + 1, self.device)
        on_step = lambda i: self.say(f"{preset} {provider}: step {i}/{STEPS} at batch {batch}")
        try:
            rec.update(loss_phase(forward, model, opt, data, WARMUP, self.deadline, on_step))
        except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
            if not _is_oom(exc):
                raise
            rec["error"] = f"out of memory at the common batch, {batch} x {self.s.seq}"
        if rec["step_ms"]:
            rec["tokens_per_s"] = rec["tokens_per_step"] / (rec["step_ms"] / 1e3)
        if len(rec["losses"]) < STEPS and not rec["error"]:
            rec["skipped"] = f"budget: stopped after {len(rec['losses'])} of {STEPS} steps"

    def _search(self, preset: str, provider: str, forward, model, opt, rec: dict) -> None:
        seq, vocab = self.s.seq, model.config.vocab_size
        per_token_s = []  # seconds a token of each step so far: what the next one will take

        def fits(b: int) -> Optional[int]:
            self.say(f"{preset} {provider}: largest batch, trying {b} x {seq}")
            ids = batches(1, b, seq, vocab, SEED + 2, self.device)[0]
            t0 = time.perf_counter()
            try:
                peak = peak_of_step(lambda: train_step(forward, model, opt, ids))
            finally:  # a step that ran out of memory in the backward leaves grads behind
                model.zero_grad(set_to_none=True)
            per_token_s.append((time.perf_counter() - t0) / (b * seq))
            return peak

        def may_try(b: int) -> bool:
            return time.perf_counter() + 1.5 * b * seq * min(per_token_s, default=0.0) < self.deadline

        fits(1)  # the optimizer state exists before the steps the line is drawn through
        _release()
        free, _ = torch.cuda.mem_get_info()
        largest, exact, tried = search_largest(fits, free + torch.cuda.memory_reserved(), probes=self.s.probes,
                                               ceiling=MAX_BATCH, may_try=may_try)
        rec.update(max_batch=largest, max_batch_exact=exact, max_tokens=largest * seq,
                   search=" ".join(f"{b}:{'oom' if p is None else f'{p / 2**30:.1f}G'}"
                                   for b, p in sorted(tried.items())))


def run_train_bench(out_dir: Path, quick: bool = False, models=MODELS, providers=PROVIDERS, console=None,
                    **overrides) -> list[dict]:
    """Every (model, provider) on the current CUDA device with QUICK or FULL settings
    (``overrides``: TrainSettings fields, e.g. budget_s, seq); JSON, CSV and PNG under
    ``out_dir`` named ``train-<gpu>-<YYYYMMDD>``; a table, then one JSON summary line."""
    import transformers
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from . import report

    settings = dataclasses.replace(QUICK if quick else FULL, **overrides)
    console = console or report.console()
    meta = {**harness.device_info("cuda"), "suite": "train", "transformers": transformers.__version__,
            "quick": quick, "settings": dataclasses.asdict(settings),
            "precision": "bf16 params, activations and grads; float32 master weights and AdamW state",
            "optimizer": "onetrip: onetrip.optim.AdamW(master_weights=True); others: torch.optim.AdamW(fused=True) "
                         f"over float32 masters; {ADAMW}",
            "timing": f"CUDA events around each step after the first {WARMUP}, median",
            "peak": "torch.cuda.max_memory_allocated over the loss steps (weights, grads, state, activations)",
            "allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "default"}
    stem = Path(out_dir) / f"train-{harness.slug(meta['gpu'])}-{meta['date'][:10].replace('-', '')}"
    order = [(m, p) for m in models for p in ("eager", "onetrip", "liger", "onetrip-sdpa")
             if p in providers or p == "eager"]
    order += [(m, "torch.compile") for m in models if "torch.compile" in providers]
    records = []
    columns = (SpinnerColumn(), TextColumn("{task.description:<60}"), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("train", total=len(order))
        run = _Run(settings, lambda text: progress.update(task, description=text))
        for preset, provider in order:
            records.append(run.bench(preset, provider))
            records.sort(key=lambda r: (models.index(r["model"]), PROVIDERS.index(r["provider"])))
            relate(records)
            meta["elapsed_s"] = time.perf_counter() - run.start
            harness.write_results(records, meta, stem)
            progress.advance(task)
    json_path, csv_path = harness.write_results(records, meta, stem)
    png = plot(records, meta, stem.with_suffix(".png"))
    print_table(console, records)
    console.print(f"wrote {json_path}, {csv_path}, {png}")
    print(json.dumps({"bench": "train", "gpu": meta["gpu"], "results": str(json_path),
                      "elapsed_s": round(meta["elapsed_s"], 1), "errors": sum(bool(r["error"]) for r in records),
                      "skipped": [f"{r['model']} {r['provider']}: {r['skipped']}" for r in records if r["skipped"]],
                      "bars": bars(records)}), flush=True)
    return records
