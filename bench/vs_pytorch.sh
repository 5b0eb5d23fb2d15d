#!/usr/bin/env bash
# klein.cpp beside PyTorch/diffusers on one machine, in one run, on the full-size random-weight
# FLUX.2 [klein] 4B (real architecture and layout): per-phase times, whole-image wall time and
# peak RSS, as markdown rows for bench/results.md; then each klein run's whole image as a
# multiple of PyTorch's and of the q8 run's.
#
#   bench/vs_pytorch.sh [MODEL_DIR] [BUILD_DIR]
#
# Needs the pinned oracle venv (scripts/reference/requirements.txt; never installed by CI):
#   KLEIN_ORACLE_PY   its python (default ~/klein-oracle/bin/python)
#   KLEIN_VS_SIZES    e.g. "256x256 512x512" (default 256x256)
#   KLEIN_VS_MODES    "t2i edit" (editing uses one reference of the output size; default both)
#   KLEIN_VS_FORMATS  klein runs, as FORMAT:PRECISION, FORMAT one of bf16 (MODEL_DIR itself), q8, q4
#                     (quantized once into MODEL_DIR-q8 / -q4 by `klein quantize`);
#                     default "bf16:fast q8:fast q4:fast"
#   KLEIN_VS_REPS     runs per engine and case; the best whole-image time is kept (default 2:
#                     the first also warms the page cache for the second)
#   KLEIN_VS_PT_REPS  runs of PyTorch per case (default KLEIN_VS_REPS; 0: no PyTorch row). Without
#                     AVX512_BF16, PyTorch's bf16 takes ~27 min per 256² image on 2 cores (Zen 3)
#   KLEIN_VS_THREADS  threads for both engines (default: all cores)
# Each run is a fresh process (load included): "wall" is process start to image written.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
model=${1:-/tmp/klein-random-4b}
build=${2:-$root/build}
py=${KLEIN_ORACLE_PY:-$HOME/klein-oracle/bin/python}
sizes=${KLEIN_VS_SIZES:-256x256}
modes=${KLEIN_VS_MODES:-t2i edit}
formats=${KLEIN_VS_FORMATS:-bf16:fast q8:fast q4:fast}
reps=${KLEIN_VS_REPS:-2}
pt_reps=${KLEIN_VS_PT_REPS:-$reps}
threads=${KLEIN_VS_THREADS:-$(nproc)}
prompt="a photo of a cat on a red sofa"
seed=42
work=$(mktemp -d /tmp/klein_vs_XXXX)
trap 'rm -rf "$work"' EXIT

[ -x "$build/klein" ] || { echo "build first: cmake -S . -B build -G Ninja && cmake --build build" >&2; exit 1; }
[ -x "$py" ] || { echo "no oracle python at $py (set KLEIN_ORACLE_PY; see scripts/reference/requirements.txt)" >&2; exit 1; }
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

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx512_bf16|avx_vnni|amx_bf16|amx_int8)$' | tr '\n' ' ')
echo "# $(date -u +%FT%TZ) $cpu, $threads threads; flags: $flags; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# klein $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'); $("$py" -c 'import torch,diffusers,transformers;print("torch",torch.__version__,"diffusers",diffusers.__version__,"transformers",transformers.__version__,"torch cpu",torch.backends.cpu.get_cpu_capability())')"
echo "# peaks (klein-bench_kernels --quick, per $threads threads):"
"$build/klein-bench_kernels" --quick --threads "$threads" 2>&1 | grep -iE 'peak' | sed 's/^/#   /' || true

# Phase lines of either engine -> "encode ref step(median) decode x rss" (x: PyTorch's call time,
# klein's denoise time). Plain python3 (awk dialects differ on sorting).
parse() {  # engine log
  python3 - "$1" "$2" <<'PY'
import re, statistics, sys
engine, text = sys.argv[1], open(sys.argv[2]).read().splitlines()
def total(name):
    v = [float(l.split()[-1]) for l in text if l.split()[:1] == [name] and len(l.split()) == 2]
    return sum(v) if v else None
def summary(name):  # klein's end-of-run table: "  name   1.23 s"
    m = [float(x) for x in re.findall(r"^  %s +([0-9.]+) s$" % re.escape(name), "\n".join(text), re.M)]
    return m[-1] if m else None
if engine == "pytorch":
    enc, ref, dec, x = total("encode"), total("vae_encode"), total("decode"), total("call")
    steps = [float(l.split()[1]) for l in text if l.startswith("step ")]
    rss = total("maxrss_gib")
else:
    enc, ref, dec, x = summary("encode"), summary("vae_encode"), summary("decode"), summary("denoise")
    # progress lines "denoise i/N t.tts" carry the time since the phase began
    marks = [float(m.group(2)) for m in (re.match(r"^denoise (\d+)/\d+ ([0-9.]+)s$", l) for l in text) if m]
    steps = [b - a for a, b in zip(marks, marks[1:])]
    rss = next((float(l.split()[2]) for l in text if l.startswith("peak RSS")), None)
f = lambda v: "-" if v is None else "%.2f" % v
print(f(enc), f(ref), f(statistics.median(steps) if steps else None), f(dec), f(x), f(rss))
PY
}

ratios=()  # "size mode format/precision wall ratio", for the summary after the table
echo
echo "| size | mode | engine | weights / precision | text encode s | ref encode s | step s (median) | VAE decode s | whole image wall s | peak RSS GiB |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for size in $sizes; do
  w=${size%x*}; h=${size#*x}
  for mode in $modes; do
    refargs=()
    if [ "$mode" = edit ]; then
      # The reference: a deterministic picture of the output size (klein's own t2i output of the
      # tiny model would do as well; any RGB image is a valid reference).
      "$py" -c "from PIL import Image; import numpy as np; r=np.random.default_rng(7); Image.fromarray((r.random(($h,$w,3))*255).astype('uint8')).save('$work/ref.png')"
      refargs=(--ref "$work/ref.png")
    fi
    best=""
    for ((i = 0; i < pt_reps; i++)); do
      /usr/bin/time -f 'WALL %e' "$py" "$here/pytorch_run.py" --model "$model" -W "$w" -H "$h" --steps 4 \
          --seed $seed --threads "$threads" --prompt "$prompt" "${refargs[@]}" -o "$work/pt.png" > "$work/pt.log" 2>&1
      wall=$(awk '$1=="WALL"{print $2}' "$work/pt.log")
      if [ -z "$best" ] || awk "BEGIN{exit !($wall < ${best%% *})}"; then best="$wall $(parse pytorch "$work/pt.log")"; fi
    done
    pt_wall=""
    if [ -n "$best" ]; then
      read -r wall enc ref step dec call rss <<<"$best"
      pt_wall=$wall
      echo "| ${w}x${h} | $mode | PyTorch + diffusers | bf16 | $enc | $ref | $step | $dec | $wall (call $call) | $rss |"
    fi
    for fp in $formats; do
      fmt=${fp%%:*}; prec=${fp#*:}
      dir=$(folder_of "$fmt")
      best=""
      for ((i = 0; i < reps; i++)); do
        /usr/bin/time -f 'WALL %e' "$build/klein" generate --model "$dir" -p "$prompt" -W "$w" -H "$h" --steps 4 \
            --seed $seed -t "$threads" --precision "$prec" "${refargs[@]}" -o "$work/k.png" > "$work/k.log" 2>&1
        wall=$(awk '$1=="WALL"{print $2}' "$work/k.log")
        if [ -z "$best" ] || awk "BEGIN{exit !($wall < ${best%% *})}"; then best="$wall $(parse klein "$work/k.log")"; fi
      done
      read -r wall enc ref step dec den rss <<<"$best"
      echo "| ${w}x${h} | $mode | klein.cpp | $fmt / $prec | $enc | $ref | $step | $dec | $wall | $rss |"
      ratios+=("${w}x${h} $mode $fmt/$prec $wall ${pt_wall:--}")
    done
  done
done

# Whole image as a multiple of PyTorch's wall time (the issue's 0.65× bar), and each run against
# the q8 run of its case (the 1.3× bar for q4), so the table need not be divided by hand.
echo
echo "| size | mode | weights / precision | × PyTorch's whole image | × q8's |"
echo "|---|---|---|---|---|"
for r in "${ratios[@]}"; do
  read -r sz md fp wall ptw <<<"$r"
  q8=""
  for o in "${ratios[@]}"; do
    read -r sz2 md2 fp2 wall2 _ <<<"$o"
    if [ "$sz2 $md2" = "$sz $md" ] && [ "${fp2%%/*}" = q8 ] && [ "${fp2#*/}" = "${fp#*/}" ]; then q8=$wall2; fi
  done
  awk -v s="$sz" -v m="$md" -v f="$fp" -v w="$wall" -v p="$ptw" -v q="$q8" 'BEGIN {
    pt = (p == "-" || p == "") ? "-" : sprintf("%.2f×", w / p)
    q8 = (q == "") ? "-" : sprintf("%.2f×", w / q)
    sub("/", " / ", f)
    printf "| %s | %s | %s | %s | %s |\n", s, m, f, pt, q8 }'
done
