#!/usr/bin/env bash
# Fidelity of the fast and quantized paths against klein.cpp's exact float32 path, on the
# full-size random-weight FLUX.2 [klein] 4B (issue 8's bars): one `klein generate` per format at
# 256², seed 42, 4 steps, every run dumping prompt_embeds and each step's velocity; then
# `klein compare` of the final image (PSNR / SSIM / correlation) and of each dump (cosine,
# relative L2) against the float32 run. Markdown rows for bench/results.md. No Python needed.
#
#   bench/fidelity.sh [MODEL_DIR] [BUILD_DIR]
#
#   KLEIN_FID_FORMATS  runs as FORMAT:PRECISION (FORMAT: bf16 = MODEL_DIR itself, q8, q4 =
#                      MODEL_DIR-q8 / -q4, quantized once); default "bf16:fast q8:fast q4:fast"
#   KLEIN_FID_SIZE     default 256x256
#   KLEIN_FID_THREADS  default: all cores
#
# The velocities of the first table come from the free-running loop (each format's own text
# encoder and latents), so they include the drift of everything before them. The second table is
# the transformer alone: every format denoises from the float32 run's prompt_embeds
# (`--prompt-embeds`) and the same noise, so step 1's velocity differs only by the transformer's
# weights and arithmetic (seed 004's "DiT cosine"); compared with float32 and with bf16 / fast.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
model=${1:-/tmp/klein-random-4b}
build=${2:-$root/build}
formats=${KLEIN_FID_FORMATS:-bf16:fast q8:fast q4:fast}
size=${KLEIN_FID_SIZE:-256x256}
threads=${KLEIN_FID_THREADS:-$(nproc)}
w=${size%x*}; h=${size#*x}
prompt="a photo of a cat on a red sofa"
steps=4
work=$(mktemp -d /tmp/klein_fid_XXXX)
trap 'rm -rf "$work"' EXIT

[ -x "$build/klein" ] || { echo "build first: cmake -S . -B build -G Ninja && cmake --build build" >&2; exit 1; }
[ -f "$model/model_index.json" ] || { echo "no model at $model (make one: build/klein-make_random_model --out $model)" >&2; exit 1; }

folder_of() {  # format -> model folder, quantizing once
  case $1 in
    bf16) echo "$model" ;;
    q8|q4)
      local out=$model-$1
      if [ ! -f "$out/model_index.json" ]; then
        echo "quantizing $model -> $out ($1) ..." >&2
        "$build/klein" quantize --model "$model" --type "$1" -o "$out" -t "$threads" >&2
      fi
      echo "$out" ;;
    *) echo "unknown format $1" >&2; exit 1 ;;
  esac
}

run() {  # name folder precision [extra generate arguments...]
  local name=$1 folder=$2 prec=$3
  shift 3
  "$build/klein" generate --model "$folder" -W "$w" -H "$h" --steps $steps --seed 42 -t "$threads" \
      --precision "$prec" -q --dump "$work/$name" --dump-filter prompt_embeds,velocity_step -o "$work/$name.png" "$@"
}
field() { awk -v k="$1" '$1 == k { print $2 }'; }  # a value of `klein compare`'s output

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
echo "# $(date -u +%FT%TZ) $cpu, $threads threads; klein $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?');" \
     "$w x $h, $steps steps, seed 42; against klein --precision fp32 on $model"
run ref "$model" fp32 -p "$prompt"
echo
header="| weights / precision | PSNR dB | SSIM | correlation | prompt_embeds cosine"
sep="|---|---|---|---|---"
for ((k = 1; k <= steps; k++)); do header+=" | velocity $k cosine"; sep+="|---"; done
echo "$header |"
echo "$sep|"
for fp in $formats; do
  fmt=${fp%%:*}; prec=${fp#*:}
  name=${fmt}_$prec
  run "$name" "$(folder_of "$fmt")" "$prec" -p "$prompt"
  img=$("$build/klein" compare "$work/ref.png" "$work/$name.png")
  row="| $fmt / $prec | $(field psnr <<<"$img") | $(field ssim <<<"$img") | $(field correlation <<<"$img")"
  row+=" | $("$build/klein" compare "$work/ref/prompt_embeds.npy" "$work/$name/prompt_embeds.npy" | field cosine)"
  for ((k = 1; k <= steps; k++)); do
    row+=" | $("$build/klein" compare "$work/ref/velocity_step$k.npy" "$work/$name/velocity_step$k.npy" | field cosine)"
  done
  echo "$row |"
done

echo
echo "Transformer alone (the float32 run's prompt_embeds, the same noise): step 1 velocity cosine"
echo
echo "| weights / precision | vs fp32 | vs bf16 / fast |"
echo "|---|---|---|"
embeds=$work/ref/prompt_embeds.npy
run tf_bf16_fast "$model" fast --prompt-embeds "$embeds"
for fp in $formats; do
  fmt=${fp%%:*}; prec=${fp#*:}
  name=tf_${fmt}_$prec
  [ "$name" = tf_bf16_fast ] || run "$name" "$(folder_of "$fmt")" "$prec" --prompt-embeds "$embeds"
  v=velocity_step1.npy
  echo "| $fmt / $prec | $("$build/klein" compare "$work/ref/$v" "$work/$name/$v" | field cosine)" \
       "| $("$build/klein" compare "$work/tf_bf16_fast/$v" "$work/$name/$v" | field cosine) |"
done
