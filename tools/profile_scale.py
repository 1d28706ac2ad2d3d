"""Measure `onetrip profile` on a large synthetic trace: wall time and peak memory.

    PYTHONPATH=src:tests python3 tools/profile_scale.py [--mb 500] [--gz]

Writes a trace of repeated eager-layer steps (tests/profile_traces.write_large_trace),
then analyses it in a fresh process and reports seconds and peak resident memory growth
(VmHWM), which is what the issue's "500 MB in under 60 s with under 3 GB" is about.
"""

import argparse
import gzip
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from profile_traces import write_large_trace

CODE = (
    "import re, sys, time; from onetrip.profile import analyze_trace\n"
    "hwm = lambda: int(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)) * 1024\n"
    "base = hwm(); t = time.perf_counter(); r = analyze_trace(sys.argv[1]); t = time.perf_counter() - t\n"
    "print(r.kernels, hwm() - base, t)\n"
)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=500)
    ap.add_argument("--gz", action="store_true", help="also analyse a gzipped copy")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "large.json"
        t0 = time.perf_counter()
        kernels = write_large_trace(path, args.mb * 1_000_000)
        print(f"wrote {path.stat().st_size / 1e6:.0f} MB, {kernels} kernels in {time.perf_counter() - t0:.0f} s")
        paths = [path]
        if args.gz:
            gz = path.with_suffix(".json.gz")
            with open(path, "rb") as src, gzip.open(gz, "wb", compresslevel=1) as dst:
                shutil.copyfileobj(src, dst)
            paths.append(gz)
        for p in paths:
            out = subprocess.run([sys.executable, "-c", CODE, str(p)], capture_output=True, text=True, check=True)
            n, grown, seconds = out.stdout.split()
            assert int(n) == kernels, (n, kernels)
            print(f"{p.name}: {p.stat().st_size / 1e6:.0f} MB analysed in {float(seconds):.1f} s, "
                  f"peak memory +{int(grown) / 1e9:.2f} GB, {n} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
