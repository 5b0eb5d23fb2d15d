#!/bin/sh
# ctest InstallDepsSplit: scripts/install-deps.sh installs only what building and running need
# by default (the README's run command), and the test suite's tools with --test (the README's
# test command, which .ci/run's first command repeats exactly). Usage: install_deps_test.sh SOURCE_DIR
set -eu
src=$(cd "$1" && pwd)
deps=$src/scripts/install-deps.sh
base=$(bash "$deps" --list)
full=$(bash "$deps" --test --list)
for p in g++ cmake ninja-build pkg-config libgtest-dev libcli11-dev libcpp-httplib-dev; do
  echo "$base" | grep -qx "$p" || { echo "install-deps.sh: $p missing from the default set"; exit 1; }
done
for p in qemu-user chromium chromium-driver python3-venv clang libclang-rt-dev; do
  ! echo "$base" | grep -qx "$p" || { echo "install-deps.sh: test tool $p in the default set"; exit 1; }
  echo "$full" | grep -qx "$p" || { echo "install-deps.sh --test: $p missing"; exit 1; }
done
run_cmd=$(grep -m1 '^\./scripts/install-deps\.sh.*\./build/klein generate' "$src/README.md") ||
  { echo "README: no run command"; exit 1; }
test_cmd=$(grep -m1 '^\./scripts/install-deps\.sh.*ctest --test-dir build' "$src/README.md") ||
  { echo "README: no test command"; exit 1; }
case $run_cmd in "./scripts/install-deps.sh && "*) ;; *) echo "README run command: not the plain install-deps.sh: $run_cmd"; exit 1 ;; esac
case $test_cmd in "./scripts/install-deps.sh --test && "*) ;; *) echo "README test command: not install-deps.sh --test: $test_cmd"; exit 1 ;; esac
ci_cmd=$(grep -m1 '^\./scripts/install-deps\.sh' "$src/.ci/run")
[ "$ci_cmd" = "$test_cmd" ] || { echo ".ci/run's first command is not the README test command:"; echo "  $ci_cmd"; echo "  $test_cmd"; exit 1; }
echo "install-deps.sh split, README and .ci/run: ok"
