#!/bin/sh
# ctest InstallAndPkgConfig: install into a temporary prefix; compile examples/c/generate.c
# against the installed files with `cc $(pkg-config --cflags --libs klein)`; run it on the tiny
# model; check the PNG; then the same through find_package(klein); then the installed `klein`
# with no --model. Every installed program runs as a user would run it: no LD_LIBRARY_PATH, no
# rpath added here, from a folder outside the source and build trees.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR C_COMPILER
set -eu
unset LD_LIBRARY_PATH
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
cc=$3
# Without symlinks: the installed klein names its model by its own resolved path (/proc/self/exe).
prefix=$(cd "$(mktemp -d "${TMPDIR:-/tmp}/klein_install.XXXXXX")" && pwd -P)
trap 'rm -rf "$prefix"' EXIT
# The example runs with $KLEIN_TEST_PRELOAD preloaded where that is set: in a ThreadSanitizer
# build the runtime must start before the instrumented libklein.so, which an uninstrumented
# program loads too late (tests/CMakeLists.txt sets it to libtsan.so there).
run() { if [ -n "${KLEIN_TEST_PRELOAD:-}" ]; then LD_PRELOAD=$KLEIN_TEST_PRELOAD "$@"; else "$@"; fi; }
cmake --install "$build" --prefix "$prefix" >/dev/null
pc=$(dirname "$(find "$prefix" -name klein.pc | head -n 1)")
test -f "$pc/klein.pc" || { echo "klein.pc not installed"; exit 1; }
test -f "$prefix/include/klein/klein_c.h" || { echo "klein_c.h not installed"; exit 1; }
libdir=$(PKG_CONFIG_PATH="$pc" pkg-config --variable=libdir klein)
ls "$libdir"/libklein.so.0 >/dev/null || { echo "libklein.so.0 (SOVERSION) not installed"; exit 1; }
test -f "$libdir/cmake/klein/kleinConfig.cmake" || { echo "CMake package config not installed"; exit 1; }
# shellcheck disable=SC2046
# KLEIN_TEST_CFLAGS / KLEIN_TEST_LIBS: the sanitizer flags and libraries of an instrumented build
# (tests/CMakeLists.txt).
# shellcheck disable=SC2086
"$cc" ${KLEIN_TEST_CFLAGS:-} -std=c11 -Wall -Werror -o "$prefix/gen" "$src/examples/c/generate.c" \
  $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs klein) ${KLEIN_TEST_LIBS:-}
mkdir "$prefix/work"
cd "$prefix/work"
run "$prefix/gen" "$src/tests/data/tiny" "$prefix/out.png" 7 >"$prefix/gen.log" 2>&1 ||
  { echo "the pkg-config-built program does not run:"; cat "$prefix/gen.log"; exit 1; }
head -c 8 "$prefix/out.png" | od -An -c | grep -q 'P   N   G' || { echo "out.png is not a PNG"; exit 1; }
# find_package(klein) -> klein::klein from the installed CMake package.
mkdir "$prefix/consumer"
cat >"$prefix/consumer/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.20)
project(consumer C)
find_package(klein 0.1 REQUIRED)
add_executable(gen "$src/examples/c/generate.c")
target_link_libraries(gen PRIVATE klein::klein)
CM
cmake -S "$prefix/consumer" -B "$prefix/consumer/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="${KLEIN_TEST_CFLAGS:-}" \
  -DCMAKE_EXE_LINKER_FLAGS="${KLEIN_TEST_LIBS:-}" >/dev/null
cmake --build "$prefix/consumer/build" >/dev/null
run "$prefix/consumer/build/gen" "$src/tests/data/tiny" "$prefix/out2.png" 7 >/dev/null 2>&1
cmp -s "$prefix/out.png" "$prefix/out2.png" || { echo "find_package build gave a different image"; exit 1; }
# The installed CLI: it loads the installed libklein.so, and without --model runs the installed
# tiny model (not the source tree's), writing to a bare relative name in the working folder.
run "$prefix/bin/klein" --version >"$prefix/version.log" 2>&1 ||
  { echo "the installed klein does not run:"; cat "$prefix/version.log"; exit 1; }
test -f "$prefix/share/klein/models/tiny/model_index.json" || { echo "the tiny model is not installed"; exit 1; }
run "$prefix/bin/klein" generate --prompt "a cat" -W 32 -H 32 --steps 1 -o cat.png 2>"$prefix/klein.log" ||
  { echo "installed klein generate failed:"; cat "$prefix/klein.log"; exit 1; }
grep -qF "($prefix/share/klein/models/tiny)" "$prefix/klein.log" ||
  { echo "installed klein generate did not default to the installed model:"; cat "$prefix/klein.log"; exit 1; }
head -c 8 cat.png | od -An -c | grep -q 'P   N   G' || { echo "cat.png is not a PNG"; exit 1; }
# `klein serve` resolves the same default; an unusable --host ends it after the note.
run "$prefix/bin/klein" serve --host 256.0.0.1 --port 1 2>"$prefix/serve.log" >/dev/null || true
grep -qF "($prefix/share/klein/models/tiny)" "$prefix/serve.log" ||
  { echo "installed klein serve did not default to the installed model:"; cat "$prefix/serve.log"; exit 1; }
echo "install + pkg-config + find_package + C example + installed CLI: ok"
