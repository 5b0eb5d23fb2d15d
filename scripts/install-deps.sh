#!/usr/bin/env bash
# Installs the build dependencies from Debian/Ubuntu packages (idempotent).
set -euo pipefail
pkgs=(g++ cmake ninja-build pkg-config libgtest-dev nlohmann-json3-dev libcli11-dev
      libutf8proc-dev libpng-dev libjpeg-dev libwebp-dev
      libcpp-httplib-dev                            # klein serve
      qemu-user                                     # tests/avx2_only_cpu.sh: an AVX2-only CPU, emulated
      python3 python3-venv chromium chromium-driver # the server tests (openai, selenium: pip, in a venv)
      # scripts/fuzz.sh: clang and its libFuzzer + sanitizer runtimes (both metapackages follow
      # the distribution's default LLVM, so their versions match)
      clang libclang-rt-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
