#!/usr/bin/env bash
# Why layer_norm trails rms_norm on wide rows (64K: 80% against 88% of copy): Nsight
# Compute's warp-state (stall reasons), scheduler, occupancy and memory sections of the
# third launch of today's pick for each (family, width) of benchmarks/diag_norm_l2.py.
#
#   benchmarks/diag_norm_stalls.sh [family:width ...]      # on a GPU; CSVs under $OUT (default: 64K, 128K)
#
# One process per (family, width), so --launch-skip 2 always lands on its third launch.
set -uo pipefail
out="${OUT:-gpu-out}"; mkdir -p "$out"
NCU="${NCU:-/usr/local/cuda/bin/ncu}"
[ $# -gt 0 ] || set -- rms_norm:65536 layer_norm:65536 rms_norm:131072 layer_norm:131072
for case in "$@"; do
    "$NCU" --kernel-name regex:_norm_kernel --launch-skip 2 --launch-count 1 \
        --section WarpStateStats --section SchedulerStats --section Occupancy --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section LaunchStats --csv --page details \
        python3 benchmarks/diag_norm_l2.py "$case" > "$out/ncu-stalls-${case/:/-}.csv" 2> "$out/ncu-stalls-${case/:/-}.err"
    echo "$case: $(grep -c . "$out/ncu-stalls-${case/:/-}.csv") lines"
done
