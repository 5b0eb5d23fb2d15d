#!/usr/bin/env bash
# Builds the CUDA backend's binaries here (build-cuda: -DKLEIN_CUDA=ON, sm_90 unless
# CMAKE_CUDA_ARCHITECTURES says otherwise) and gathers what a GPU machine needs to run the
# checks of scripts/cuda_device_check.sh into .cuda-bundle/ (ignored by git; carry it):
#
#   klein, klein_tests, klein-make_random_model, klein-bench_generate, klein-bench_kernels,
#   klein-c-example, lib/libklein.so*, lib/<every shared library they load that a bare machine
#   may lack>, source_dir, build_dir
#
# Not copied: the C and C++ runtimes, the CUDA driver (libcuda.so.1, the machine's own) and
# libcublasLt.so.13 (about 540 MB, over what a call can carry): cuda_device_check.sh finds it
# in the machine's CUDA 13 toolkit or in PyTorch's nvidia-cublas package. cudart is linked
# statically. `source_dir` and `build_dir` record this checkout's and this build's paths, which
# the binaries have compiled in (the tests' data and the CLI they run, the CLI's default model);
# the device script links them to its own checkout and to the bundle.
#
#   scripts/cuda_bundle.sh [BUILD_DIR]        (default: build-cuda)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-cuda}
out=$root/.cuda-bundle

nice cmake -S "$root" -B "$build" -G Ninja -DKLEIN_CUDA=ON
nice cmake --build "$build" -j2 --target klein_tests klein_cli klein-make_random_model klein-bench_generate \
  klein-bench_kernels klein_c_example

rm -rf "$out"
mkdir -p "$out/lib"
paths="klein tests/klein_tests klein-make_random_model klein-bench_generate klein-bench_kernels klein-c-example"
bins=""
for p in $paths; do cp "$build/$p" "$out/" && bins="$bins $(basename "$p")"; done
cp -P "$build"/libklein.so* "$out/lib/"
for bin in $(printf "$out/%s " $bins) "$out"/lib/libklein.so.*.*; do
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libgcc_s.so* | libstdc++.so* | \
      libcuda.so* | libcublasLt.so* | libcublas.so* | libklein.so*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
strip --strip-unneeded $(printf "$out/%s " $bins) "$out"/lib/*.so* 2>/dev/null || true
echo "$root" >"$out/source_dir"
(cd "$build" && pwd) >"$out/build_dir"
ls -la "$out" "$out/lib"
du -sh "$out"
# What a device call carries: the tracked files and the bundle (at most 64 MiB together).
tracked=$(cd "$root" && git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
total=$((${tracked:-0} + $(du -sb "$out" | cut -f1)))
echo "repository + bundle: $((total / 1048576)) MiB (a device call carries at most 64 MiB)"
[ "$total" -le $((64 * 1048576)) ] || echo "warning: over what one device call carries; carry less" >&2
