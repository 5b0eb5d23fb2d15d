#!/usr/bin/env bash
# Loading the full-size random 4B transformer from each form users hold, beside the diffusers
# folder it came from: the BFL single file, the same under ComfyUI's prefix, BFL's fp8 file
# (bench/make_load_forms.py writes them) and klein's q8 folder. Per form: opening with every
# component resident (klein-bench_load: layout, detection, configs, the three models bound; the
# median of 3 warm runs), and `klein generate` with fixed prompt embeddings (no text encoder),
# 256², one step, --precision fast, run twice (the first fills the page cache; the second is
# reported): its total time and peak RSS.
#
#   bench/load_forms.sh [MODEL_DIR] [FORMS_DIR] [BUILD_DIR]      (KLEIN_ORACLE_PYTHON: torch's python)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=${1:-/tmp/klein-random-4b}
forms=${2:-$model-forms}
build=${3:-$root/build}
py=${KLEIN_ORACLE_PYTHON:-python3}
threads=${KLEIN_BENCH_THREADS:-$(nproc)}
if [ ! -f "$model/model_index.json" ]; then
  # 27 text-encoder layers: the deepest one klein reads (no text encoding runs here anyway).
  "$build/klein-make_random_model" --out "$model" --seed 0 --tokenizer "$root/tests/data/tiny/tokenizer" --text-layers 27
fi
[ -f "$forms/flux-2-klein-4b-fp8.safetensors" ] || "$py" "$root/bench/make_load_forms.py" "$model" "$forms"
[ -f "$model-q8/model_index.json" ] || "$build/klein" quantize --model "$model" --type q8 -o "$model-q8" -q
[ -f "$forms/embeds.npy" ] || "$py" -c "import numpy as np; np.save('$forms/embeds.npy', np.random.default_rng(0).standard_normal((1, 512, 7680), dtype=np.float32))"

[ "${KLEIN_BENCH_PREPARE_ONLY:-0}" = 1 ] && { echo "prepared $model, $forms, $model-q8"; exit 0; }
run() {  # label, model args
  local label=$1; shift
  local log rss open total
  for pass in 1 2; do
    log=$(mktemp)
    /usr/bin/time -f 'MAXRSS_KB %M' "$build/klein" generate "$@" --prompt-embeds "$forms/embeds.npy" -W 256 -H 256 \
        --steps 1 --seed 0 --precision fast -t "$threads" -o "$forms/out.png" 2> "$log"
  done
  open=$("$build/klein-bench_load" "$@" --repeat 4 | awk '$1=="median"{print $2}')
  total=$(awk '$1=="total"{print $2}' "$log")
  rss=$(awk '$1=="MAXRSS_KB"{printf "%.2f", $2/1048576}' "$log")
  printf '| %s | %s | %s | %s |\n' "$label" "$open" "$total" "$rss"
  rm -f "$log"
}
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), threads $threads"
echo "| form | open, all resident (s) | generate 256², 1 step (s) | peak RSS (GiB) |"
echo "|---|---|---|---|"
run "diffusers folder, bf16 (sharded)" --model "$model"
run "BFL single file, bf16" --model "$model" --diffusion-model "$forms/flux-2-klein-4b.safetensors"
run "ComfyUI single file (model.diffusion_model.), bf16" --model "$model" --diffusion-model "$forms/flux-2-klein-4b-comfy.safetensors"
run "BFL fp8 single file (F8_E4M3 + scales)" --model "$model" --diffusion-model "$forms/flux-2-klein-4b-fp8.safetensors"
run "klein q8 folder" --model "$model-q8"
# Hashing for manifests / --verify: every file of the folder, the second pass from the page cache.
for pass in 1 2; do
  t0=$(date +%s.%N)
  "$build/klein" manifest --model "$model" -t "$threads" -o "$forms/manifest.json" 2> /dev/null
  t1=$(date +%s.%N)
done
bytes=$(du -sb "$model" | cut -f1)
awk -v b="$bytes" -v t0="$t0" -v t1="$t1" 'BEGIN{printf "manifest of the folder: %.1f GB in %.2f s = %.2f GB/s\n", b/1e9, t1-t0, b/1e9/(t1-t0)}'
