#!/bin/sh
# ctest InstallAndPkgConfig: install into a temporary prefix; compile examples/c/generate.c
# against the installed files with `cc $(pkg-config --cflags --libs klein)`; run it on the tiny
# model; check the PNG; then the same through find_package(klein). Usage: install_test.sh BUILD_DIR SOURCE_DIR C_COMPILER
set -eu
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
cc=$3
prefix=$(mktemp -d "${TMPDIR:-/tmp}/klein_install.XXXXXX")
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
"$cc" -std=c11 -Wall -Werror -o "$prefix/gen" "$src/examples/c/generate.c" \
  $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs klein) -Wl,-rpath,"$libdir"
run "$prefix/gen" "$src/tests/data/tiny" "$prefix/out.png" 7 >/dev/null 2>&1
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
cmake -S "$prefix/consumer" -B "$prefix/consumer/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer/build" >/dev/null
run "$prefix/consumer/build/gen" "$src/tests/data/tiny" "$prefix/out2.png" 7 >/dev/null 2>&1
cmp -s "$prefix/out.png" "$prefix/out2.png" || { echo "find_package build gave a different image"; exit 1; }
echo "install + pkg-config + find_package + C example: ok"
