#!/usr/bin/env bash
# The KV-cached editing variant (9B-KV's pipeline) against the plain editing pipeline, on the same
# full-size random weights (the KV checkpoint is a distill of its own, but the arithmetic — what
# this measures — does not depend on the weights): MODEL_DIR as klein-make_random_model writes it,
# run once under its own model_index.json (Flux2KleinPipeline) and once under a copy of it naming
# Flux2KleinKVPipeline (symlinked components). Output SIZE², NREFS references of SIZE², random
# prompt embeddings (no text encoder), --precision fast, each run twice (the second is reported:
# page cache warm). A step after the first is (time of 4 steps − time of 1 step) / 3.
#
#   bench/kv_edit.sh MODEL_DIR [BUILD_DIR]      env: SIZE (256), NREFS (3), KLEIN_BENCH_THREADS
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=${1:?usage: bench/kv_edit.sh MODEL_DIR [BUILD_DIR]}
build=${2:-$root/build}
size=${SIZE:-256}
nrefs=${NREFS:-3}
threads=${KLEIN_BENCH_THREADS:-$(nproc)}
py=${KLEIN_ORACLE_PYTHON:-python3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
model=$(cd "$model" && pwd)
mkdir "$out/kv"
for c in scheduler text_encoder tokenizer transformer vae; do ln -s "$model/$c" "$out/kv/$c"; done
sed 's/"Flux2KleinPipeline"/"Flux2KleinKVPipeline"/' "$model/model_index.json" > "$out/kv/model_index.json"
width=$(python3 -c "import json;print(json.load(open('$model/transformer/config.json'))['joint_attention_dim'])")
"$py" - "$out" "$size" "$nrefs" "$width" <<'PY'
import sys, numpy as np
from PIL import Image
out, size, nrefs, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(0)
np.save(f"{out}/embeds.npy", rng.standard_normal((1, 512, width), dtype=np.float32))
for i in range(nrefs):
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(f"{out}/ref{i}.png")
PY
refs=()
for i in $(seq 0 $((nrefs - 1))); do refs+=(--ref "$out/ref$i.png"); done
time_of() {  # model, steps, extra args... -> wall seconds (second of two runs)
  local m=$1 steps=$2; shift 2
  local log
  for pass in 1 2; do
    log=$(/usr/bin/time -f 'MAXRSS_KB %M WALL %e' "$build/klein" generate --model "$m" --prompt-embeds "$out/embeds.npy" \
          -W "$size" -H "$size" --steps "$steps" --seed 0 -t "$threads" -q -o "$out/x.png" "$@" 2>&1 >/dev/null | tail -1)
  done
  awk '{print $4, $2/1048576}' <<<"$log"
}
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), threads $threads, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "output ${size}², $nrefs references of ${size}², fast"
echo "| run | 1 step (s) | 4 steps (s) | a later step (s) | peak RSS, 4 steps (GiB) |"
echo "|---|---|---|---|---|"
row() {  # label, model, extra args...
  local label=$1 m=$2; shift 2
  read -r t1 _ < <(time_of "$m" 1 "$@")
  read -r t4 rss < <(time_of "$m" 4 "$@")
  awk -v l="$label" -v a="$t1" -v b="$t4" -v r="$rss" 'BEGIN{printf "| %s | %.2f | %.2f | %.2f | %.2f |\n", l, a, b, (b-a)/3, r}'
}
row "text-to-image (no references)" "$model"
row "edit, plain pipeline" "$model" "${refs[@]}"
row "edit, KV pipeline" "$out/kv" "${refs[@]}"
