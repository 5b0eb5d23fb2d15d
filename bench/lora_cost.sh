#!/usr/bin/env bash
# Issue 46's LoRA bars on the full-size random 4B: a rank-R LoRA on every linear of the
# transformer (bench/make_bench_lora.py), run-time on q8 (per-step cost) and merged into bf16 at
# load (load transformer time). Alternating runs, ROUNDS each; read the medians.
#   bench/lora_cost.sh MODEL_DIR(bf16 random 4B) [ROUNDS] [RANK]
set -euo pipefail
model=${1:?bf16 model folder (build/klein-make_random_model --out DIR ...)}
rounds=${2:-3}
rank=${3:-32}
bin=${KLEIN_BIN:-build/klein}
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" "$(dirname "$0")/make_bench_lora.py" "$model" "$tmp/lora.safetensors" --rank "$rank"
"$bin" quantize --model "$model" --type q8 -o "$tmp/q8" >/dev/null
grep -m1 'model name' /proc/cpuinfo; uptime
run() { "$bin" generate --prompt "a cat" -W 256 -H 256 --seed 1 -o "$tmp/out.png" "$@" 2>&1 | grep -E '^  (load transformer|denoise) '; }
for i in $(seq "$rounds"); do
  echo "q8 plain:";           run --model "$tmp/q8"
  echo "q8 runtime LoRA:";    run --model "$tmp/q8" --lora "$tmp/lora.safetensors" --lora-mode runtime
  echo "bf16 plain (1 step):"; run --model "$model" --steps 1
  echo "bf16 merged (1 step):"; run --model "$model" --steps 1 --lora "$tmp/lora.safetensors" --lora-mode merge
done
