"""``onetrip bench allreduce``: the tensor-parallel all-reduce and the residual add + RMSNorm after it.

    python -m torch.distributed.run --nproc-per-node N -m onetrip bench allreduce [--out DIR] [--quick]
    onetrip bench allreduce --world N        (no WORLD_SIZE set: relaunches itself as above)

Each rank holds a bf16 partial (batch rows x hidden); every provider returns (normed, h) with
h = the sum over ranks + residual (``ops/allreduce_norm.py``):
  nccl+add_rms_norm           ``dist.all_reduce`` in place, then ``onetrip.add_rms_norm``;
  symm-one-shot+add_rms_norm  ``torch.ops.symm_mem.one_shot_all_reduce`` of a partial already in
                              symmetric memory (a producer would write it there), then ``add_rms_norm``;
  onetrip-fused               ``allreduce_add_rms_norm`` in mode "fused": one kernel, copy-in included.
Timing: a CUDA graph of ``CALLS`` back-to-back calls, replayed ``REPLAYS`` times after a host
barrier (all ranks start together); a replay's time / CALLS is a call's, the median over
replays per rank; reported for rank 0 and as the max over ranks (the slowest rank sets a TP
step's pace; the speedup uses it). ``payload_bytes``: a rank's partial; ``link_bytes``: what
reaches a rank over NVLink by the provider's algorithm (ring: 2 (W - 1) / W x payload; one-shot:
(W - 1) x payload). Each provider's (normed, h) of one eager call is checked against the float64
reference by the 2 x PyTorch rule first.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ..engine.launch import CHILD_ENV, relaunch_under_torchrun
from . import harness

HIDDENS = (8192, 4096)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
CALLS = 100
REPLAYS = 10
EPS = 1e-6
DTYPE = torch.bfloat16
PROVIDERS = ("nccl+add_rms_norm", "symm-one-shot+add_rms_norm", "onetrip-fused")
BASELINE = PROVIDERS[0]


def run_allreduce_bench(out_dir: Path, world: int | None = None, quick: bool = False) -> int:
    """The suite on this process's rank under torchrun, or, without WORLD_SIZE, torchrun of
    itself on ``world`` GPUs (default: all). Returns the exit status."""
    if "WORLD_SIZE" not in os.environ:
        n = world or torch.cuda.device_count()
        if not 2 <= n <= torch.cuda.device_count():
            print(f"onetrip bench allreduce: needs 2 or more GPUs (--world {n}, {torch.cuda.device_count()} "
                  "visible)", file=sys.stderr)
            return 2
        return relaunch_under_torchrun(n, ["bench", "allreduce", "--world", str(n), "--out", str(out_dir),
                                           *(["--quick"] if quick else [])])
    os.environ.update(CHILD_ENV)  # NVLink multicast stays off, whoever started this process
    rank, size, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if world is not None and world != size:
        print(f"onetrip bench allreduce: --world {world} but torchrun started {size} ranks", file=sys.stderr)
        return 2
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    records = []
    try:
        records = _sweep(rank, size, device, HIDDENS[:1] if quick else HIDDENS, (1, 8, 64) if quick else BATCHES)
        if rank == 0:
            _report(records, size, Path(out_dir))
    finally:
        dist.destroy_process_group()
    failed = [r for r in records if r["provider"] == "onetrip-fused" and (r["error"] or r["ok"] is False)]
    return 1 if failed else 0


def _sweep(rank: int, world: int, device: torch.device, hiddens, batches) -> list[dict]:
    from ..ops.allreduce_norm import make_comm

    records = []
    for hidden in hiddens:
        # made first: it also registers the group for symmetric memory (needed before torch 2.9)
        comm = make_comm(None, rank, world, hidden, max(batches), DTYPE, device, mode="fused")
        w = _partials(hidden, 1, (hidden,), device)[0]
        for batch in batches:
            xs = _partials(hidden * 1000 + batch, world, (batch, hidden), device)
            r = _partials(hidden * 1000 + batch + 500, 1, (batch, hidden), device)[0]
            payload = batch * hidden * xs[0].element_size()
            links = {BASELINE: 2 * (world - 1) * payload // world}
            shape_records = []
            for name, make in _providers(comm, xs[rank], r, w):
                rec = {"hidden": hidden, "batch": batch, "provider": name, "world": world, "dtype": "bf16",
                       "payload_bytes": payload, "link_bytes": links.get(name, (world - 1) * payload),
                       "us": None, "us_max": None, "speedup": None, "ok": None, "max_err": None, "bound": None,
                       "error": None}
                try:
                    fn, check = make()
                    rec.update(_check(check, xs, r, w))
                    rec["us"], rec["us_max"] = _time(fn, device)
                except Exception as exc:  # noqa: BLE001 - recorded, the suite goes on
                    rec["error"] = harness.error_string(exc)
                shape_records.append(rec)
            base = shape_records[0]["us_max"]  # BASELINE's
            for rec in shape_records:
                rec["speedup"] = base / rec["us_max"] if base and rec["us_max"] else None
            records += shape_records
    return records


def _partials(seed: int, n: int, shape, device) -> list[torch.Tensor]:
    """``n`` random bf16 tensors, the same on every rank (each rank knows every rank's partial)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(DTYPE).to(device) for _ in range(n)]


def _providers(comm, x, r, w):
    """(name, make) for each provider; make() gives (the timed call, a call returning (normed, h))."""
    import onetrip
    from ..ops.allreduce_norm import allreduce_add_rms_norm

    y, h = torch.empty_like(x), torch.empty_like(x)

    def nccl():
        s = x.clone()

        def call():  # in place, as a TP layer reduces its GEMV's output (the values grow; the time does not)
            dist.all_reduce(s)
            onetrip.add_rms_norm(s, r, w, EPS, out=y, residual_out=h)

        def check():
            s.copy_(x)
            return _outputs(call, y, h)

        return call, check

    def one_shot():
        import torch.distributed._symmetric_memory as symm_mem

        name = dist.group.WORLD.group_name
        inp = symm_mem.empty(x.shape, dtype=x.dtype, device=x.device)
        symm_mem.rendezvous(inp, name)
        inp.copy_(x)

        def call():
            summed = torch.ops.symm_mem.one_shot_all_reduce(inp, "sum", name)
            onetrip.add_rms_norm(summed, r, w, EPS, out=y, residual_out=h)

        return call, lambda: _outputs(call, y, h)

    def fused():
        def call():
            allreduce_add_rms_norm(x, r, w, EPS, comm, out=y, residual_out=h)

        return call, lambda: _outputs(call, y, h)

    makers = [(BASELINE, nccl), (PROVIDERS[1], one_shot), (PROVIDERS[2], fused)]
    return [m for m in makers if m[0] != PROVIDERS[1] or hasattr(torch.ops.symm_mem, "one_shot_all_reduce")]


def _outputs(call, y, h):
    call()
    return y, h


def _check(call, xs, r, w) -> dict:
    """One eager call's normed and h against the float64 reference (the 2 x PyTorch rule)."""
    from ..ops.allreduce_norm import allreduce_add_rms_norm_ref
    from ..testing import error_report, upcast

    y, h = call()
    exact = allreduce_add_rms_norm_ref(upcast(*xs), *upcast(r, w), EPS, round_to=DTYPE)
    theirs = allreduce_add_rms_norm_ref(xs, r, w, EPS)
    reports = [error_report(n, got, e, t) for n, got, e, t in zip(("normed", "h"), (y, h), exact, theirs)]
    worst = max(reports, key=lambda rep: rep.max_err / rep.bound)
    return {"ok": all(rep.ok for rep in reports), "max_err": worst.max_err, "bound": worst.bound}


def _time(fn, device) -> tuple[float, float]:
    """us a call: (this rank's median over replays, the max of the ranks' medians)."""
    from ..graphs import capture

    graph, _ = capture(lambda: [fn() for _ in range(CALLS)])
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(REPLAYS + 1):
        dist.barrier(device_ids=[device.index])  # every rank enters the replay together
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if i:  # the first replay warms up
            times.append(start.elapsed_time(end) * 1e3 / CALLS)
    mine = statistics.median(times)
    worst = torch.tensor([mine], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    del graph
    return mine, float(worst.item())


def _report(records: list[dict], world: int, out_dir: Path) -> None:
    from rich.table import Table

    from . import report

    con = report.console()
    meta = {**harness.device_info("cuda"), "suite": "allreduce", "world": world, "dtype": "bf16",
            "nccl": ".".join(map(str, torch.cuda.nccl.version())), "calls": CALLS, "replays": REPLAYS,
            "timing": f"a CUDA graph of {CALLS} calls replayed {REPLAYS} times after a host barrier; "
                      "us a call = replay time / calls, median over replays; us: rank 0, us_max: max over ranks"}
    stem = out_dir / f"allreduce-{harness.slug(meta['gpu'])}-x{world}-{meta['date'][:10].replace('-', '')}"
    json_path, _ = harness.write_results(records, meta, stem)
    providers = list(dict.fromkeys(r["provider"] for r in records))
    table = Table(title=f"all-reduce + residual add + RMSNorm, bf16, {world} x {meta['gpu']}: us a call, "
                        f"max over ranks (rank 0)", title_justify="left")
    for col in ("hidden", "batch", "payload", *providers, "fused / nccl", "fused check"):
        table.add_column(col, justify="left" if col == "fused check" else "right")
    for key in dict.fromkeys((r["hidden"], r["batch"]) for r in records):
        by = {r["provider"]: r for r in records if (r["hidden"], r["batch"]) == key}
        cells = [f"[red]{by[p]['error'][:40]}[/]" if by[p]["error"] else f"{by[p]['us_max']:.1f} ({by[p]['us']:.1f})"
                 for p in providers]
        mine = by.get("onetrip-fused", {})
        speed = f"{mine['speedup']:.2f}x" if mine.get("speedup") else "—"
        check = "—" if mine.get("ok") is None else (
            f"{'[green]ok[/]' if mine['ok'] else '[red]FAIL[/]'} {mine['max_err']:.1e} / {mine['bound']:.1e}")
        table.add_row(str(key[0]), str(key[1]), f"{by[providers[0]]['payload_bytes'] / 1024:.0f} KB", *cells,
                      speed, check)
    con.print(table)
    con.print(f"wrote {json_path}")
    print(json.dumps({"bench": "allreduce", "gpu": meta["gpu"], "world": world, "results": str(json_path),
                      "speedup": {f"{r['hidden']}x{r['batch']}": r["speedup"] and round(r["speedup"], 2)
                                  for r in records if r["provider"] == "onetrip-fused"}}), flush=True)
