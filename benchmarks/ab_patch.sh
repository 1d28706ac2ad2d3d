#!/usr/bin/env bash
# A/B of a kernel change kept as a patch (benchmarks/experiments/*.patch) against the tree
# as it is, interleaved so that a machine drifting during the run moves both alike:
#
#   benchmarks/ab_patch.sh PATCH ROUNDS OUT -- TUNE_OPS_ARGS...
#
# Each round runs benchmarks/tune_ops.py TUNE_OPS_ARGS --out OUT/base-N, applies PATCH
# (patch -p1: the device's copy of the tree is not a git checkout), runs it again into
# OUT/patched-N and takes the patch back out. Triton keys its cache by the kernel's source,
# so the two builds never share a binary. Use --focus --picks to time today's picks alone.
set -euo pipefail
[ $# -ge 4 ] && [ "$4" = "--" ] || { echo "usage: $0 PATCH ROUNDS OUT -- TUNE_OPS_ARGS..." >&2; exit 2; }
patch_file=$1 rounds=$2 out=$3
shift 4
mkdir -p "$out"
trap 'patch -R -p1 -s --dry-run < "$patch_file" >/dev/null 2>&1 && patch -R -p1 -s < "$patch_file"' EXIT
for n in $(seq 1 "$rounds"); do
    python3 benchmarks/tune_ops.py "$@" --out "$out/base-$n"
    patch -p1 -s < "$patch_file"
    python3 benchmarks/tune_ops.py "$@" --out "$out/patched-$n"
    patch -R -p1 -s < "$patch_file"
done
