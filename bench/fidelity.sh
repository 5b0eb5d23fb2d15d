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
# The velocities come from the free-running loop (each format's own latents), so later steps
# include the drift of the earlier ones; step 1 sees the same noise in every run (only the
# prompt_embeds differ), so its cosine is the closest to a transformer-output comparison.
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

run() {  # name folder precision
  "$build/klein" generate --model "$2" -p "$prompt" -W "$w" -H "$h" --steps $steps --seed 42 -t "$threads" \
      --precision "$3" -q --dump "$work/$1" --dump-filter prompt_embeds,velocity_step -o "$work/$1.png"
}
field() { awk -v k="$1" '$1 == k { print $2 }'; }  # a value of `klein compare`'s output

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
echo "# $(date -u +%FT%TZ) $cpu, $threads threads; klein $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?');" \
     "$w x $h, $steps steps, seed 42; against klein --precision fp32 on $model"
run ref "$model" fp32
echo
header="| weights / precision | PSNR dB | SSIM | correlation | prompt_embeds cosine"
sep="|---|---|---|---|---"
for ((k = 1; k <= steps; k++)); do header+=" | velocity $k cosine"; sep+="|---"; done
echo "$header |"
echo "$sep|"
for fp in $formats; do
  fmt=${fp%%:*}; prec=${fp#*:}
  name=${fmt}_$prec
  run "$name" "$(folder_of "$fmt")" "$prec"
  img=$("$build/klein" compare "$work/ref.png" "$work/$name.png")
  row="| $fmt / $prec | $(field psnr <<<"$img") | $(field ssim <<<"$img") | $(field correlation <<<"$img")"
  row+=" | $("$build/klein" compare "$work/ref/prompt_embeds.npy" "$work/$name/prompt_embeds.npy" | field cosine)"
  for ((k = 1; k <= steps; k++)); do
    row+=" | $("$build/klein" compare "$work/ref/velocity_step$k.npy" "$work/$name/velocity_step$k.npy" | field cosine)"
  done
  echo "$row |"
done
