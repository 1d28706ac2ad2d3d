"""What onetrip's Python wrappers cost the host, with every kernel launch stubbed out.

    python tools/host_wrappers.py                         # every case of `onetrip bench host`, us a call
    python tools/host_wrappers.py apply_rotary append_kv  # some of them
    python tools/host_wrappers.py --profile cross_entropy # cProfile of 2,000 calls, by own time
    python tools/host_wrappers.py --prefill 512           # the engine's eager prefill, Llama-3.2-1B's 16 layers

Runs on the CPU (no GPU needed): the ops' checks, allocations, config picks, keys and the
custom-op bypass run as they do on a GPU; the launch itself (``_launch.launch`` and every
``kernel[grid]``) does nothing. So the figures are the wrappers' share of ``bench host``'s,
without the compiled kernel's launcher (a few us on an H200 host) and on this CPU's clock
(a 2-core AMD EPYC VM ran Python ~1.7x slower than the H200 host). Noisy machines: each
figure is the fastest of 15 loops of 1,000 calls. ``--prefill`` shrinks the 1B's widths
(hidden 64) and replaces its matmuls by allocations, so what remains is the host's cost of
a prefill forward: the per-layer op calls of ``models/fused.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import importlib
import os
import pkgutil
import pstats
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined; no launch runs anyway
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import torch  # noqa: E402

import onetrip.ops as ops  # noqa: E402
from onetrip.ops import _launch  # noqa: E402


def stub_launches() -> None:
    """Every launcher of onetrip.ops does nothing: ``launch`` and the ``_*_kernel`` objects."""
    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    for info in pkgutil.iter_modules(ops.__path__):
        module = importlib.import_module(f"onetrip.ops.{info.name}")
        if getattr(module, "launch", None) is _launch.launch:
            module.launch = lambda kernel, grid, args, meta, key=None: None
        for name in dir(module):
            if name.startswith("_") and name.endswith("_kernel") and hasattr(getattr(module, name), "__getitem__"):
                setattr(module, name, Kernel())


def per_call_us(fn, calls: int = 1000, loops: int = 15) -> float:
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(loops):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def prefill_ms(tokens: int) -> tuple[float, int]:
    """(host ms of one eager fused prefill of ``tokens`` at batch 1, the model's layers)
    (module docstring)."""
    from onetrip.engine.generate import Engine
    from onetrip.models import Model, get_config
    import onetrip.models.fused as fused

    class Functional:  # F.linear as an allocation: torch's CPU matmul is not what is measured
        def __getattr__(self, name):
            return getattr(torch.nn.functional, name)

        @staticmethod
        def linear(x, w, b=None):
            return torch.empty(*x.shape[:-1], w.shape[0], dtype=x.dtype)

    fused.F = Functional()
    config = dataclasses.replace(get_config("llama-3.2-1b"), vocab_size=512, hidden_size=64, intermediate_size=128,
                                 num_heads=4, num_kv_heads=1, head_dim=16)
    model = Model.random(config, torch.bfloat16, "cpu")
    model.backend = "fused"
    prompt = [[i % 500 + 1 for i in range(tokens)]]
    engine = Engine(model, max_seq=tokens + 8, graphs=False)
    for _ in range(3):
        engine.generate(prompt, 1)
    return min(engine.generate(prompt, 1).prefill_ms for _ in range(10)), config.num_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="bench host's case names (default: every onetrip case)")
    parser.add_argument("--profile", metavar="CASE", help="cProfile 2,000 calls of CASE")
    parser.add_argument("--prefill", type=int, metavar="TOKENS", help="the eager prefill's host ms instead")
    args = parser.parse_args()
    stub_launches()
    if args.prefill:
        ms, layers = prefill_ms(args.prefill)
        print(f"eager fused prefill, {args.prefill} tokens, {layers} layers: {ms:.2f} ms of host time")
        return
    from onetrip.bench.host import cases

    all_cases = cases("cpu")
    names = args.cases or [n for n, (kind, _) in all_cases.items() if kind != "torch"]
    unknown = [n for n in names + ([args.profile] if args.profile else []) if n not in all_cases]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {', '.join(all_cases)}")
    for name in names:
        print(f"{name:28s} {per_call_us(all_cases[name][1]):7.1f} us")
    if args.profile:
        fn = all_cases[args.profile][1]
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(2000):
            fn()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
