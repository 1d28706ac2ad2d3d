#!/usr/bin/env bash
# The GPU runs that the next device session owes, in stages of under 10 minutes each
# (the device tool's limit per command). Run from the repository root on the device:
#
#   benchmarks/gpu_session.sh STAGE[:SECONDS] ...   # writes under $OUT (or ./gpu-out)
#
# Each stage runs under its own time limit (default 540 s), so that one command can hold
# several and still end inside the tool's 10 minutes; everything is packed into
# $OUT/gpu.tgz at the end (the tool brings back at most 8 files).
#
# Stages, in order of what they unblock:
#   tests      the whole suite on the GPU (TESTS="files" for a subset)   ~6 min (930 of 945 in 5)
#   quick      bench attention/decode-attention --quick, demo, bench decode 1B batch 1  ~2 min
#   attention  autotune sweep (with TMA tiles), then full bench attention (bf16)  ~5 min
#   decode     full bench decode-attention                                         ~1 min
#   engine1    bench decode at batch 1 (1B, 8B), then the demo                     ~3 min
#   engine     full bench decode (1B and 8B, batch 1/8/32, TTFT)   ~8 min: ENGINE_ARGS="--preset X"
#              splits it (1B ~3 min, 8B ~5 min: its gpt-fast compile alone is ~2)
#   traces     1B decode traces: transformers, eager, fused, fused + graphs (untimed yet)
#   gemv       bench gemv (cuBLAS vs onetrip's skinny matmul)                      ~1 min
#   ops        bench ops (OPS_ARGS="--op NAME" for one op)                         ~8 min
#   sh=FILE    a script taking --out (benchmarks/sweep_gemv.py ~1 min, ab_next.py ~4 min, gemv_chain.py <1 min)
# Times measured on an H200, 2026-11-21. While helpers edit the tree, run from a snapshot:
#   git archive HEAD | gzip > .snap/head.tgz; carry .snap; command "tar -xzf .snap/head.tgz && ..."
# Liger-Kernel comes from .whl (carry it): installed into /tmp/site first.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: benchmarks/gpu_session.sh tests|quick|attention|decode|engine|gemv[:SECONDS] ..." >&2; exit 2; }
final="${OUT:-gpu-out}"
out=/tmp/gpu-session
rm -rf "$out"; mkdir -p "$out/results" "$out/logs" "$final"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Autotune picks persist on the warm machine between calls, and come home in the archive.
export ONETRIP_CACHE_DIR=/tmp/onetrip-cache
mkdir -p "$ONETRIP_CACHE_DIR"
pack() {
    cp -r "$ONETRIP_CACHE_DIR" "$out/cache" 2>/dev/null
    tar -czf "$final/gpu.tgz" -C "$out" . && cp "$out/logs/summary.txt" "$final/" 2>/dev/null
}
trap pack EXIT
# Each python run gets what is left of its stage's limit (at least 5 s).
py() {
    local left=$((limit - SECONDS)); [ "$left" -lt 5 ] && left=5
    timeout --signal=INT --kill-after=10 "$left" python3 "$@"
}
log() { echo "== $* ($(date +%T))" | tee -a "$out/logs/summary.txt" >&2; }

for arg in "$@"; do
    stage="${arg%%:*}"
    limit=540; [ "$arg" != "$stage" ] && limit="${arg#*:}"
    log "stage $stage (limit ${limit}s)"
    SECONDS=0
    case "$stage" in
    tests)
        nvidia-smi --query-gpu=name,clocks.max.memory,memory.total,driver_version --format=csv | tee "$out/logs/gpu.txt"
        ONETRIP_FAILLOG="$out/logs/failures.txt" py -m pytest -q -n 8 -p no:cacheprovider -rfE ${TESTS:-} 2>&1 | tee "$out/logs/pytest-gpu.txt" | tail -60
        ;;
    quick)
        export ONETRIP_AUTOTUNE=0  # heuristic configs: the first figures, no tuning time
        py -m onetrip bench attention --quick --out "$out/results" 2>&1 | tee "$out/logs/attention-quick.txt"
        py -m onetrip bench decode-attention --quick --out "$out/results" 2>&1 | tee "$out/logs/decode-attention-quick.txt"
        py -m onetrip demo --out "$out/demo" 2>&1 | tee "$out/logs/demo.txt"
        py -m onetrip bench decode --preset llama-3.2-1b --batch 1 --new-tokens 128 --ttft 512 \
            --out "$out/results" 2>&1 | tee "$out/logs/decode-quick.txt"
        unset ONETRIP_AUTOTUNE
        ;;
    attention)
        # Tune first (fills the cache), then the bench reads the picks.
        py benchmarks/tune_attention.py --out "$out/results/tune-attention.json" --write-cache \
            2>&1 | tee "$out/logs/tune-attention.txt"
        py -m onetrip bench attention --out "$out/results" 2>&1 | tee "$out/logs/attention.txt"
        ;;
    decode)
        py -m onetrip bench decode-attention --out "$out/results" 2>&1 | tee "$out/logs/decode-attention.txt"
        ;;
    engine1)
        # batch 1 only (the issue's bar), then the demo
        py -m onetrip bench decode --batch 1 --out "$out/results" 2>&1 | tee "$out/logs/decode-b1.txt"
        py -m onetrip demo --out "$out/demo" 2>&1 | tee "$out/logs/demo.txt"
        ;;
    traces)
        # issue 6: real traces for tests/data (gzip them there), and the profiler's report of each
        mkdir -p "$out/traces"
        for b in transformers eager fused; do
            py -m onetrip profile --model llama-3.2-1b --backend "$b" --no-graphs --steps 5 \
                --trace-out "$out/traces/$b.json" 2>&1 | tee "$out/logs/profile-$b.txt"
        done
        py -m onetrip profile --model llama-3.2-1b --backend fused --steps 5 \
            --trace-out "$out/traces/fused-graphs.json" 2>&1 | tee "$out/logs/profile-fused-graphs.txt"
        gzip -9 "$out"/traces/*.json
        ;;
    engine)
        # ENGINE_ARGS narrows it, e.g. ENGINE_ARGS="--preset llama-3.2-1b" (one preset a call)
        py -m onetrip bench decode ${ENGINE_ARGS:-} --out "$out/results" 2>&1 | tee "$out/logs/decode${ENGINE_ARGS:+-$(echo $ENGINE_ARGS | tr -c 'a-z0-9.\n-' _)}.txt"
        ;;
    gemv)
        py -m onetrip bench gemv --out "$out/results" 2>&1 | tee "$out/logs/gemv.txt"
        ;;
    ops)
        # OPS_ARGS narrows it, e.g. OPS_ARGS="--op layer_norm"
        py -m onetrip bench ops ${OPS_ARGS:-} --out "$out/results" 2>&1 | tee "$out/logs/ops.txt"
        ;;
    sh=*)
        # An ad-hoc command (a diagnosis script), e.g. sh=benchmarks/diag.py
        py "${stage#sh=}" --out "$out/results" 2>&1 | tee "$out/logs/$(basename "${stage#sh=}").txt"
        ;;
    *)
        echo "unknown stage $stage" >&2
        ;;
    esac
    log "stage $stage done in ${SECONDS}s"
done
