#!/usr/bin/env bash
# klein on a CPU without AVX-512, wherever the tests run: the CLI under `qemu-x86_64 -cpu max`
# (QEMU 7.2+'s TCG emulates AVX2 and FMA but no AVX-512, and reports so through CPUID, so klein's
# dispatch sees an AVX2-only CPU). Every code path a run takes must avoid the ISAs the CPU lacks,
# not only the kernels it selects: a table initialised with zmm stores in an AVX-512 file, run
# on every CPU, once crashed model open on AVX2-only machines while every test passed on the
# AVX-512 machines the suite ran on. Each emulated run must also give the same bytes as the
# native run capped at --isa avx2 (the same kernels), in both precisions and every weight format.
#
#   avx2_only_cpu.sh KLEIN_BIN DATA_DIR     (exit 77: no qemu-x86_64, Debian's qemu-user, or an
#                                            AVX2-only host)
set -euo pipefail
klein=$1
data=$2
qemu=$(command -v qemu-x86_64 || true)
[ -n "$qemu" ] || { echo "SKIP: no qemu-x86_64 (Debian package qemu-user)"; exit 77; }
# On a host that is itself AVX2-only every other test already ran there natively (an AVX-512
# instruction anywhere would have stopped them), and the emulation takes minutes of CI's time.
if "$klein" info --cpu | grep -qx 'isas: scalar avx2'; then
  echo "SKIP: this CPU is AVX2-only itself: the whole suite ran natively on one"; exit 77
fi
out=$(mktemp -d /tmp/klein_avx2only_XXXX)
trap 'rm -rf "$out"' EXIT
emu() { "$qemu" -cpu max "$klein" "$@" 2>"$out/qemu.err" || { cat "$out/qemu.err" >&2; return 1; }; }

info=$(emu info --cpu)
grep -qx 'isas: scalar avx2' <<<"$info" || { echo "expected an emulated AVX2-only CPU, got:"; echo "$info"; exit 1; }

"$klein" quantize --model "$data/tiny" --type q8 -o "$out/q8" -q >/dev/null
"$klein" quantize --model "$data/tiny" --type q4 -o "$out/q4" -q >/dev/null
ref=$data/ref/edit1_auto/ref0.png
n=0
check() {  # model precision [extra generate args...]
  local model=$1 precision=$2
  shift 2
  n=$((n + 1))
  local args=(generate --model "$model" -p "a red fox" -W 32 -H 32 --steps 2 --seed 3 -t 2 -q --precision "$precision" "$@")
  emu "${args[@]}" -o "$out/emu$n.png"
  "$klein" "${args[@]}" --isa avx2 -o "$out/nat$n.png"
  if ! "$klein" compare "$out/emu$n.png" "$out/nat$n.png" | grep -q identical; then
    echo "run $n ($model, $precision $*): emulated AVX2-only CPU and native --isa avx2 differ"
    "$klein" compare "$out/emu$n.png" "$out/nat$n.png"
    exit 1
  fi
  echo "ok: $(basename "$model") $precision $*"
}
check "$data/tiny" fp32
check "$data/tiny" fast --ref "$ref"
check "$out/q8" fast
check "$out/q4" fast --ref "$ref"
