"""The section of the host cost of an eager call: ``onetrip bench host``, and its Triton-launch A/B run."""

from __future__ import annotations

from .common import first_line, header, load, table

BAR_US = 20.0  # the bar: a forward call of every op costs the host at most this
TRITON_TAG = "triton"  # host-triton.json: the same job under ONETRIP_LAUNCH=triton (`--take ... --tag triton`)

HOST_TEXT = """\
## Host cost of an eager call (`onetrip bench host`)

What a call costs the CPU from the call to its return, the GPU never the limit: tensors of a few
KB, 1,000 calls back to back, one synchronisation, wall time a call, median of 5 such loops;
forward calls, and forward + `torch.autograd.grad` for the differentiable ops, beside torch's
own ops of the same shapes. The bar: at most 20 us a forward call of every op (torch's own ops
cost ~5-10 us). Where the time goes and what the launch path does: `docs/host.md`.
"""


def _us(rec: dict | None) -> str:
    return "—" if rec is None or rec.get("host_us") is None else f"{rec['host_us']:.1f}"


def host_section(gpu: str, data: dict) -> str:
    """A row per case: the curated run's us a call, and beside it the Triton-launch run's where kept."""
    res, other = data["results"], load(gpu, f"host-{TRITON_TAG}")
    theirs = {} if other is None else {r["case"]: r for r in other["results"]}
    head = ["case", "kind", "us a call, onetrip's launch path (default)"]
    if other is not None:
        head.append("us a call, Triton's launch path, same job, another process")
    rows = [[r["case"], r["kind"], _us(r)] + ([_us(theirs.get(r["case"]))] if other is not None else [])
            for r in res]
    out = [header(data["meta"]), "", table(head, rows), ""]
    if other is not None:
        noise = [abs(theirs[r["case"]]["host_us"] / r["host_us"] - 1) * 100 for r in res
                 if r["kind"] == "torch" and r.get("host_us") and (theirs.get(r["case"]) or {}).get("host_us")]
        moved = f"; torch's own rows move {min(noise):.0f}-{max(noise):.0f}% between the two processes, " \
                "the host's noise" if noise else ""
        out += [f"Second column: `ONETRIP_LAUNCH=triton` (every call through Triton's own `kernel[grid]` path), "
                f"run {other['meta']['date'][:16].replace('T', ' ')} UTC{moved}.", ""]
    failed = [f"{name} {r['case']}: {first_line(r['error'])}" for name, run in (("default", res),
              ("triton", other["results"] if other else [])) for r in run if r.get("error")]
    if failed:
        out += ["Failed: " + "; ".join(failed) + ".", ""]
    return "\n".join(out) + "\n" + host_bar(res, other["results"] if other else None)


def host_bar(res: list[dict], triton: list[dict] | None = None) -> str:
    """Which ops' forward calls meet the bar, in the curated run (and, given, through Triton's path)."""
    def split(run: list[dict]) -> tuple[list[str], list[str]]:
        fwd = [r for r in run if r["kind"] == "forward" and r.get("host_us") is not None]
        return ([f"{r['case']} {r['host_us']:.1f}" for r in fwd if r["host_us"] <= BAR_US],
                [f"{r['case']} {r['host_us']:.1f}" for r in fwd if r["host_us"] > BAR_US])

    met, missed = split(res)
    unmeasured = [r["case"] for r in res if r["kind"] == "forward" and r.get("host_us") is None]
    cells = [f"met by {len(met)} of {len(met) + len(missed) + len(unmeasured)} ops ({', '.join(met) or 'none'})",
             f"not met by {', '.join(missed)}" if missed else "",
             f"not measured: {', '.join(unmeasured)}" if unmeasured else ""]
    anchors = ", ".join(f"{r['case']} {r['host_us']:.1f}" for r in res
                        if r["kind"] == "torch" and r.get("host_us") is not None)
    line = f"Against the bar (a forward call at most {BAR_US:g} us): " + "; ".join(c for c in cells if c) + "."
    if triton is not None:
        met_t, _ = split(triton)
        line += f" Through Triton's launch path: met by {len(met_t)} ({', '.join(met_t) or 'none'})."
    return line + (f" torch's own, us: {anchors}." if anchors else "") + "\n"
