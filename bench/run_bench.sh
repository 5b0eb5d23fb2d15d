#!/usr/bin/env bash
# Benchmarks `klein generate` on a full-size random-weight FLUX.2 [klein] 4B (real architecture,
# real diffusers layout) and appends per-phase times, total and peak RSS to bench/results.md.
#
#   bench/run_bench.sh [MODEL_DIR] [BUILD_DIR]
#
# MODEL_DIR defaults to /tmp/klein-random-4b and is generated (about 16 GB, a few minutes) with
# klein-make_random_model if missing. Set KLEIN_BENCH_SIZES="256x256 512x512" to change sizes,
# KLEIN_BENCH_MODES="t2i edit" to choose text-to-image and/or editing (one reference of the output size).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
model=${1:-/tmp/klein-random-4b}
build=${2:-$root/build}
sizes=${KLEIN_BENCH_SIZES:-256x256}
threads=${KLEIN_BENCH_THREADS:-$(nproc)}
results=$here/results.md

[ -x "$build/klein" ] || { echo "build first: cmake -S . -B build -G Ninja && cmake --build build" >&2; exit 1; }
if [ ! -f "$model/model_index.json" ]; then
  echo "generating the random 4B model into $model ..." >&2
  "$build/klein-make_random_model" --out "$model" --seed 0 --tokenizer "$root/tests/data/tiny/tokenizer"
fi

# The commit column: KLEIN_BENCH_LABEL when the binary is not this checkout's build.
sha=${KLEIN_BENCH_LABEL:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
[ -f "$results" ] || printf '# klein.cpp benchmark results\n\nFull-size random-weight FLUX.2 [klein] 4B (bf16 files, fp32 compute), `klein generate`, 4 steps.\nTimes in seconds; RSS = peak resident set (mmapped weights count when touched).\n\n| date | commit | cpu | threads | size | mode | text encode | ref encode | load dit | denoise | decode | total | peak RSS GiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n' > "$results"

run_one() {  # size, extra-args, mode label
  local size=$1 extra=$2 mode=$3 w h log
  w=${size%x*}; h=${size#*x}
  log=$(mktemp)
  /usr/bin/time -f 'MAXRSS_KB %M' "$build/klein" generate --model "$model" --prompt "A cat holding a sign that says hello world" \
      -W "$w" -H "$h" --steps 4 --seed 0 -t "$threads" $extra -o "$(mktemp -u /tmp/klein_bench_XXXX).png" 2> "$log"
  local enc ref dit den dec tot rss
  enc=$(awk '$1=="encode"{print $2}' "$log" | tail -1)
  ref=$(awk '$1=="vae_encode" && NF==3 {print $2}' "$log" | tail -1)
  dit=$(awk '$1=="load" && $2=="transformer"{print $3}' "$log" | tail -1)
  den=$(awk '$1=="denoise" && NF==3 {print $2}' "$log" | tail -1)
  dec=$(awk '$1=="decode" && NF==3 {print $2}' "$log" | tail -1)
  tot=$(awk '$1=="total"{print $2}' "$log" | tail -1)
  rss=$(awk '$1=="MAXRSS_KB"{printf "%.2f", $2/1048576}' "$log")
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$(date -u +%F)" "$sha" "$cpu" "$threads" \
      "$size" "$mode" "${enc:-?}" "${ref:--}" "${dit:-?}" "${den:-?}" "${dec:-?}" "${tot:-?}" "$rss" | tee -a "$results"
  rm -f "$log"
}

modes=${KLEIN_BENCH_MODES:-t2i edit}
for s in $sizes; do
  for m in $modes; do
    if [ "$m" = t2i ]; then
      run_one "$s" "" "t2i"
    else
      # Editing with one reference of the output size: any PNG will do; the tiny model makes one.
      ref=/tmp/klein_bench_ref_$s.png
      [ -f "$ref" ] || "$build/klein" generate -q --prompt reference -W "${s%x*}" -H "${s#*x}" -o "$ref"
      run_one "$s" "--ref $ref" "edit (1 ref ${s})"
    fi
  done
done
