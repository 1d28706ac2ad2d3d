"""Pick a kernel's launch config by timing a few candidates once, and remember the pick on disk.

Usage, from an op's GPU path (``flash_attention.py`` is the one user today)::

    cache = TuneCache("flash_attention")                  # ~/.cache/onetrip/tune-flash_attention.json
    key = tune_key("flash_attention", bucket, q.device)   # bucket: a tuple of ints/bools/strs
    cfg = tune(key, [asdict(c) for c in candidates], bench_fn, cache=cache, default=asdict(heuristic))

``bench_fn(config)`` launches the kernel once with ``config`` and returns what the Triton
launcher returned (the compiled kernel, whose ``n_regs`` and ``n_spills`` are read), or
None. ``tune`` times ``bench_fn`` with ``triton.testing.do_bench`` (median of a short run)
and keeps the fastest candidate that neither raised nor spilled registers.

What is cached where, and why:

* **Key**: (op, GPU name, compute capability, Triton version, shape bucket). The best tile
  changes with the chip (SM count, shared memory) and with the compiler (register
  allocation), so a pick made on an H100 with one Triton is not reused on an H200 or after
  an upgrade; the bucket groups shapes that share a best config (e.g. seq_q rounded up
  to a power of two) so a server tunes a handful of buckets, not every length.
* **Memory**: ``TuneCache`` keeps the file's entries in a dict after the first read, so
  the steady-state cost of a lookup is one dict access.
* **Disk**: JSON at ``$ONETRIP_CACHE_DIR/tune-<op>.json``, else
  ``~/.cache/onetrip/tune-<op>.json``. A second process (the next server start, a
  benchmark, a test) reads it and does not tune again: tuning costs seconds per bucket
  (compiling every candidate), the lookup microseconds. Writes go to a temporary file
  that ``os.replace`` renames over the old one, so a reader never sees half a file; before
  writing, the file is re-read and merged, so two processes tuning different buckets keep
  both picks (the same bucket: the last writer wins, either pick is valid). An unreadable
  or corrupt file is ignored with a warning and overwritten on the next pick.

When ``tune`` does not tune, it returns the cached pick if there is one, else ``default``
(the op's heuristic):

* ``ONETRIP_AUTOTUNE`` unset or 0 (the default, ``autotune_enabled`` says why): never tunes,
  never reads the cache: heuristic only, reproducible. ``ONETRIP_AUTOTUNE=1`` tunes.
* Triton's interpreter or no CUDA: heuristic (timings on the CPU say nothing about a GPU).
* during CUDA-graph capture (``torch.cuda.is_current_stream_capturing()``): the cached pick
  or the heuristic. Tuning would launch, synchronise and allocate, none of which a capture
  allows; warm the op up on the shapes you capture (as ``tests/conftest.capture`` does) and
  the captured launch uses the tuned config.
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import torch

from ._common import is_interpreting

ENV_CACHE_DIR = "ONETRIP_CACHE_DIR"
ENV_AUTOTUNE = "ONETRIP_AUTOTUNE"

Config = dict[str, Any]


def cache_dir() -> Path:
    """``$ONETRIP_CACHE_DIR`` if set, else ``~/.cache/onetrip``."""
    env = os.environ.get(ENV_CACHE_DIR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "onetrip"


@dataclass(frozen=True)
class TuneKey:
    """Everything a pick depends on. ``bucket`` holds ints, bools and strings only (JSON-able)."""

    op: str
    gpu: str
    capability: str  # "sm_90"
    triton: str
    bucket: tuple

    def as_str(self) -> str:
        # The op names the file; the rest is one readable string per entry.
        return json.dumps([self.gpu, self.capability, self.triton, list(self.bucket)])


@functools.lru_cache(maxsize=None)
def _device_facts(index: int) -> tuple[str, str]:
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), f"sm_{major}{minor}"


def tune_key(op: str, bucket: tuple, device: torch.device) -> TuneKey:
    """The key for ``bucket`` on ``device`` (the GPU facts are read once per device)."""
    import triton

    if device.type == "cuda":
        gpu, cap = _device_facts(device.index if device.index is not None else torch.cuda.current_device())
    else:
        gpu, cap = device.type, "none"
    return TuneKey(op, gpu, cap, triton.__version__, tuple(bucket))


class TuneCache:
    """Picks of one op, ``TuneKey -> config dict``, in memory and in ``<dir>/tune-<op>.json``.

    The file is a JSON object ``{"op": ..., "entries": {key.as_str(): config}}``. It is read
    lazily (on the first ``get``), so constructing a cache does no I/O.
    """

    def __init__(self, op: str, directory: Optional[os.PathLike | str] = None):
        self.op = op
        self.path = Path(directory).expanduser() if directory is not None else cache_dir()
        self.path = self.path / f"tune-{op}.json"
        self._entries: Optional[dict[str, Config]] = None

    def _read(self) -> dict[str, Config]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
            entries = data["entries"]
            if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
                raise ValueError("'entries' is not an object of config objects")
            return entries
        except (OSError, ValueError, KeyError, TypeError) as e:
            warnings.warn(f"ignoring the tuning cache {self.path} ({type(e).__name__}: {e}); "
                          "it is rewritten on the next pick", RuntimeWarning, stacklevel=3)
            return {}

    def get(self, key: TuneKey) -> Optional[Config]:
        """The cached pick for ``key`` (a copy), or None."""
        if self._entries is None:
            self._entries = self._read()
        hit = self._entries.get(key.as_str())
        return dict(hit) if hit is not None else None

    def put(self, key: TuneKey, config: Config) -> None:
        """Store ``config`` for ``key`` in memory and on disk (merged with the file, atomic).

        A cache that cannot be written (read-only home, full disk) keeps the pick in
        memory and warns: the process still avoids re-tuning.
        """
        entries = self._read()
        if self._entries:
            entries = {**self._entries, **entries}
        entries[key.as_str()] = dict(config)
        self._entries = entries
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=self.path.name, suffix=".tmp", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"op": self.op, "entries": entries}, f, indent=1, sort_keys=True)
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as e:
            warnings.warn(f"could not write the tuning cache {self.path}: {e}", RuntimeWarning, stacklevel=2)


def autotune_enabled() -> bool:
    """True when ``ONETRIP_AUTOTUNE`` is 1/true/on/yes. Off by default: on an H200 (Triton
    3.6) a flash_attention candidate faulted (an illegal address that poisons the CUDA
    context) in first-use tuning; it is found and left out (``_attention_picks._FAULTING``),
    and tuning stays opt-in until a whole tuning run has passed on a GPU."""
    return os.environ.get(ENV_AUTOTUNE, "0").strip().lower() in ("1", "true", "on", "yes")


def median_ms(fn: Callable[[], object]) -> float:
    """Median time of ``fn`` in ms: ``do_bench`` with a short run (~5 ms warm-up, ~25 ms timed),
    enough to rank tiles of one kernel whose times differ by more than a few percent."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=5, rep=25, return_mode="median"))


def compiled_report(kernel: object) -> dict:
    """The compiler's report of a launched kernel: registers per thread, spilled bytes, shared memory.

    Values are None when the launcher returned nothing or an object without them.
    """
    meta = getattr(kernel, "metadata", None)
    return {"n_regs": getattr(kernel, "n_regs", None), "n_spills": getattr(kernel, "n_spills", None),
            "shared": getattr(meta, "shared", None)}


def search(candidates: Iterable[Config], bench_fn: Callable[[Config], object],
           timer: Optional[Callable[[Callable[[], object]], float]] = None) -> tuple[Optional[Config], list[dict]]:
    """Time every candidate; return (fastest valid config or None, one record per candidate).

    A candidate is skipped (its record has ``skipped``) when its first launch raises (out
    of shared memory, too many registers, an unsupported shape) or its compiled kernel
    spills registers: a spilling tile may time well on one shape and fall off a cliff on
    another, and the spill count is a property of the compiled code, not of the timing.
    """
    timer = timer or median_ms
    best, best_ms, records = None, math.inf, []
    for cfg in candidates:
        rec = {"config": dict(cfg)}
        records.append(rec)
        try:
            kernel = bench_fn(cfg)  # compiles on the first call; a failure here skips the tile
            rec.update(compiled_report(kernel))
            if rec["n_spills"]:
                rec["skipped"] = f"spills {rec['n_spills']} bytes"
                continue
            rec["ms"] = timer(lambda: bench_fn(cfg))
        except Exception as e:  # noqa: BLE001 - any failing candidate is skipped, the rest still compete
            rec["skipped"] = f"{type(e).__name__}: {str(e)[:200]}"
            continue
        if rec["ms"] < best_ms:
            best, best_ms = dict(cfg), rec["ms"]
    return best, records


def tune(key: TuneKey, candidates: Iterable[Config], bench_fn: Callable[[Config], object], *,
         cache: TuneCache, default: Config,
         timer: Optional[Callable[[Callable[[], object]], float]] = None) -> Config:
    """The config to launch with for ``key``: cached, else tuned now and cached, else ``default``.

    Tunes only with autotuning enabled, on a GPU, outside graph capture (see the module docstring).
    When every candidate fails, ``default`` is stored, so the failure is not re-timed on
    every call or in the next process. ``bench_fn`` may write the op's output tensors:
    it is called with the real arguments, and the caller launches once more afterwards.
    """
    if not autotune_enabled() or is_interpreting() or not torch.cuda.is_available():
        return dict(default)
    hit = cache.get(key)
    if hit is not None:
        return hit
    if torch.cuda.is_current_stream_capturing():
        return dict(default)
    best, _ = search(candidates, bench_fn, timer)
    best = best if best is not None else dict(default)
    cache.put(key, best)
    return best
