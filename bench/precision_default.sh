#!/usr/bin/env bash
# The default command before and after `fast` became the default precision: `klein generate` on the
# full-size random 4B (bf16 folder as downloaded, and its q8 folder), 256², 4 steps, with a prompt
# (the text encoder runs), under --precision fp32 (the old default) and fast (the new one), at this
# CPU's best ISA and capped at AVX2 (a CPU without bf16 or int8 dot products: fast must not be
# slower than fp32 there). Per run: wall time and peak RSS, the second of two runs (page cache warm).
#
#   bench/precision_default.sh [MODEL_DIR] [BUILD_DIR]     (MODEL_DIR as bench/load_forms.sh makes it)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=${1:-/tmp/klein-random-4b}
build=${2:-$root/build}
threads=${KLEIN_BENCH_THREADS:-$(nproc)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() {  # label, args
  local label=$1; shift
  local log
  for pass in 1 2; do
    log=$(/usr/bin/time -f 'MAXRSS_KB %M WALL %e' "$build/klein" generate "$@" --prompt "a red circle on a blue background" \
          -W 256 -H 256 --steps 4 --seed 0 -t "$threads" -q -o "$out/x.png" 2>&1 >/dev/null | tail -1)
  done
  awk -v l="$label" '{printf "| %s | %.1f | %.2f |\n", l, $4, $2/1048576}' <<<"$log"
}
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), threads $threads"
echo "| run (256², 4 steps, with the text encoder) | wall (s) | peak RSS (GiB) |"
echo "|---|---|---|"
run "bf16 folder, --precision fp32 (old default)" --model "$model" --precision fp32
run "bf16 folder, default (fast)" --model "$model"
run "q8 folder, default (fast)" --model "$model-q8"
run "bf16 folder, --isa avx2 --precision fp32" --model "$model" --isa avx2 --precision fp32
run "bf16 folder, --isa avx2, default (fast)" --model "$model" --isa avx2
