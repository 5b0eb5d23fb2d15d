#!/usr/bin/env bash
# Installs the dependencies from Debian/Ubuntu packages (idempotent).
#   scripts/install-deps.sh          what building and running klein need (the README's run command)
#   scripts/install-deps.sh --test   also the tools of the whole test suite (the README's test command)
#   --list                           print the package names instead of installing them
set -euo pipefail
test_tools=0 list=0
for a in "$@"; do
  case $a in
    --test) test_tools=1 ;;
    --list) list=1 ;;
    *) echo "install-deps.sh: unknown option '$a' (expected --test, --list)" >&2; exit 2 ;;
  esac
done
# libgtest-dev is here, not under --test: the default build (KLEIN_BUILD_TESTS=ON) compiles the tests.
pkgs=(g++ cmake ninja-build pkg-config libgtest-dev nlohmann-json3-dev libcli11-dev
      libutf8proc-dev libpng-dev libjpeg-dev libwebp-dev
      libssl-dev                                    # SHA-256 of model files (manifests, --verify)
      libcpp-httplib-dev)                           # klein serve
if [ "$test_tools" = 1 ]; then
  pkgs+=(qemu-user                                     # tests/avx2_only_cpu.sh: an AVX2-only CPU, emulated
         python3 python3-venv chromium chromium-driver # the server tests (openai, selenium: pip, in a venv)
         python3-dev                                   # the Python package's tests (python/tests: pip builds it)
         # scripts/fuzz.sh: clang and its libFuzzer + sanitizer runtimes (both metapackages follow
         # the distribution's default LLVM, so their versions match)
         clang libclang-rt-dev
         ccache)                                       # .ci/run: shares objects between its build trees
fi
if [ "$list" = 1 ]; then
  printf '%s\n' "${pkgs[@]}"
  exit 0
fi
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
