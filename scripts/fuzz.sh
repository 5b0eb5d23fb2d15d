#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/*.cpp, clang, ASan + UBSan) in build-fuzz and runs each
# for SECONDS (default 60) on its committed seed corpus, as many at once as there are cores.
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

# KLEIN_FUZZ_BUILD names a tree already configured with -DKLEIN_FUZZ=ON (CI's build-asan, which
# also runs the tests under the sanitizers); otherwise build-fuzz is configured here, with the
# engine and the harnesses only.
bdir=${KLEIN_FUZZ_BUILD:-build-fuzz}
if [ -z "${KLEIN_FUZZ_BUILD:-}" ]; then
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DKLEIN_FUZZ=ON -DKLEIN_BUILD_TESTS=OFF >/dev/null
elif ! grep -q '^KLEIN_FUZZ:BOOL=ON' "$bdir/CMakeCache.txt" 2>/dev/null; then
  echo "fuzz.sh: KLEIN_FUZZ_BUILD=$bdir is not a tree configured with -DKLEIN_FUZZ=ON" >&2; exit 2
fi
cmake --build "$bdir" -j2 --target "${harnesses[@]/#/fuzz_}"

# Any sanitizer report is fatal (the code is also built with -fno-sanitize-recover=all).
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

mkdir -p "$bdir/logs"
# Harnesses run side by side, one per core (KLEIN_FUZZ_JOBS overrides): each still gets its full
# SECONDS of its own core, and CI's fuzzing part takes SECONDS × harnesses / cores.
jobs=${KLEIN_FUZZ_JOBS:-$(nproc)}
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: KLEIN_FUZZ_JOBS must be a positive integer" >&2; exit 2; }

# One harness: replay its saved crashes, fuzz, then write its summary row to logs/<h>.row and
# exit non-zero when it failed (its report's first lines on stderr, so CI logs show what broke).
run_one() {
  local h=$1
  local work=$bdir/corpus/$h crashes=fuzz/crashes/$h log=$bdir/logs/$h.log
  mkdir -p "$work" "$crashes"
  echo "== fuzz_$h for ${seconds}s (log: $log)"
  local rc=0
  # Every input that ever crashed this harness first (each fixed bug stays fixed).
  local saved
  mapfile -t saved < <(find "$crashes" -type f | sort)
  if [ ${#saved[@]} -gt 0 ] && ! "$bdir/fuzz/fuzz_$h" -rss_limit_mb=2048 -malloc_limit_mb=2048 \
        "${saved[@]}" >"$log.replay" 2>&1; then
    echo "fuzz.sh: fuzz_$h: a saved input in $crashes crashes again (log: $log.replay)" >&2
    printf '%-20s %12s %8s %8s %8s  %s\n' "$h" - - - - "FAILED (a saved crash input)" >"$bdir/logs/$h.row"
    return 1
  fi
  # New units go to the first corpus folder only, so the committed seeds stay as they are.
  # -timeout: one input running 30 s is a hang; -rss_limit_mb/-malloc_limit_mb: a parser that
  # believes a header and allocates gigabytes is a finding, not a reason to swap.
  "$bdir/fuzz/fuzz_$h" "$work" "fuzz/corpus/$h" \
    -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$crashes/" >"$log" 2>&1 || rc=$?
  local stats execs cov ft corp result
  stats=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1 || true)
  execs=$(grep -E '^stat::number_of_executed_units:' "$log" | tail -n 1 | awk '{print $2}' || true)
  [ -n "$execs" ] || execs=$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$stats")
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$stats")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$stats")
  corp=$(sed -nE 's/.* corp: ([0-9]+).*/\1/p' <<<"$stats")
  if [ "$rc" -eq 0 ]; then
    result=ok
  else
    local artifact
    artifact=$(sed -nE 's/.*Test unit written to (.*)$/\1/p' "$log" | tail -n 1)
    result="FAILED (rc $rc${artifact:+, input: $artifact})"
    { echo "fuzz.sh: fuzz_$h failed:"
      grep -m1 -E 'ERROR: |runtime error:|==[0-9]+==|Uncaught|terminate called|deadly signal|out-of-memory|timeout' "$log" || true
      grep -m6 -E '^    #[0-9]+ ' "$log" || true; } >&2
  fi
  printf '%-20s %12s %8s %8s %8s  %s\n' "$h" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result" \
    | tee "$bdir/logs/$h.row"
  [ "$rc" -eq 0 ]
}

failed=()
declare -A pid_of=()
for h in "${harnesses[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  run_one "$h" &
  pid_of[$h]=$!
done
for h in "${harnesses[@]}"; do wait "${pid_of[$h]}" || failed+=("$h"); done

echo
{ printf '%-20s %12s %8s %8s %8s  %s\n' harness executions cov ft corpus result
  for h in "${harnesses[@]}"; do cat "$bdir/logs/$h.row"; done; } > "$bdir/logs/summary.txt"
cat "$bdir/logs/summary.txt"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: ${#failed[@]} harness(es) failed: ${failed[*]} (inputs in fuzz/crashes/)" >&2
  exit 1
fi
