#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/*.cpp, clang, ASan + UBSan) in build-fuzz and runs each
# for SECONDS (default 60), one after the other, on its committed seed corpus.
#   scripts/fuzz.sh [SECONDS] [HARNESS...]      e.g. scripts/fuzz.sh 300 npy image
# New inputs go to build-fuzz/corpus/<harness> (kept between runs, never committed); inputs
# that crash go to fuzz/crashes/<harness>/ (reproduce: build-fuzz/fuzz/fuzz_<harness> FILE).
# Prints executions and coverage (libFuzzer's cov/ft) per harness; exits non-zero when any
# harness crashed, leaked, hit undefined behaviour, ran out of memory or timed out.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS] [HARNESS...]" >&2; exit 2; }
if [ $# -gt 0 ]; then
  harnesses=("$@")
else
  harnesses=()
  for f in fuzz/*.cpp; do harnesses+=("$(basename "$f" .cpp)"); done
fi
for h in "${harnesses[@]}"; do
  [ -f "fuzz/$h.cpp" ] || { echo "fuzz.sh: no harness fuzz/$h.cpp" >&2; exit 2; }
done

# Tests and tools are not needed here; only the engine and the harnesses are built.
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DKLEIN_FUZZ=ON -DKLEIN_BUILD_TESTS=OFF >/dev/null
cmake --build build-fuzz -j2 --target "${harnesses[@]/#/fuzz_}"

# Any sanitizer report is fatal (the code is also built with -fno-sanitize-recover=all).
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

mkdir -p build-fuzz/logs
failed=()
printf '%-20s %12s %8s %8s %8s  %s\n' harness executions cov ft corpus result > build-fuzz/logs/summary.txt
for h in "${harnesses[@]}"; do
  work=build-fuzz/corpus/$h crashes=fuzz/crashes/$h log=build-fuzz/logs/$h.log
  mkdir -p "$work" "$crashes"
  echo "== fuzz_$h for ${seconds}s (log: $log)"
  rc=0
  # Every input that ever crashed this harness first (each fixed bug stays fixed).
  mapfile -t saved < <(find "$crashes" -type f | sort)
  if [ ${#saved[@]} -gt 0 ] && ! "build-fuzz/fuzz/fuzz_$h" -rss_limit_mb=2048 -malloc_limit_mb=2048 \
        "${saved[@]}" >"$log.replay" 2>&1; then
    echo "fuzz.sh: fuzz_$h: a saved input in $crashes crashes again (log: $log.replay)" >&2
    failed+=("$h")
    continue
  fi
  # New units go to the first corpus folder only, so the committed seeds stay as they are.
  # -timeout: one input running 30 s is a hang; -rss_limit_mb/-malloc_limit_mb: a parser that
  # believes a header and allocates gigabytes is a finding, not a reason to swap.
  "build-fuzz/fuzz/fuzz_$h" "$work" "fuzz/corpus/$h" \
    -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$crashes/" >"$log" 2>&1 || rc=$?
  stats=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1 || true)
  execs=$(grep -E '^stat::number_of_executed_units:' "$log" | tail -n 1 | awk '{print $2}' || true)
  [ -n "$execs" ] || execs=$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$stats")
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$stats")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$stats")
  corp=$(sed -nE 's/.* corp: ([0-9]+).*/\1/p' <<<"$stats")
  if [ "$rc" -eq 0 ]; then
    result=ok
  else
    artifact=$(sed -nE 's/.*Test unit written to (.*)$/\1/p' "$log" | tail -n 1)
    result="FAILED (rc $rc${artifact:+, input: $artifact})"
    failed+=("$h")
    # The report's first lines and the top of the stack, so CI logs show what broke.
    grep -m1 -E 'ERROR: |runtime error:|==[0-9]+==|Uncaught|terminate called|deadly signal|out-of-memory|timeout' "$log" || true
    grep -m6 -E '^    #[0-9]+ ' "$log" || true
  fi
  printf '%-20s %12s %8s %8s %8s  %s\n' "$h" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result" \
    | tee -a build-fuzz/logs/summary.txt
done
echo
cat build-fuzz/logs/summary.txt
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: ${#failed[@]} harness(es) failed: ${failed[*]} (inputs in fuzz/crashes/)" >&2
  exit 1
fi
