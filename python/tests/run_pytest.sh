#!/usr/bin/env bash
# The Python package's tests (ctest: Python). Makes a venv in the build folder (once; later runs
# reuse it), installs the package into it from this checkout with pip, and runs pytest.
# Usage: run_pytest.sh BUILD_DIR SOURCE_DIR ENGINE_ARCHIVE KLEIN_CLI
#   ENGINE_ARCHIVE: this build's libklein_internal.a. The package links it instead of compiling
#   the engine again (-DKLEIN_PYTHON_ENGINE; a user's `pip install .` compiles it): only the
#   binding compiles, in BUILD_DIR/python-build, kept between runs.
# Without PyPI (offline machines) the venv cannot be made: then this exits 77, which ctest
# reports as a skip, with the reason.
set -euo pipefail
build=$1 src=$2 engine=$3 cli=$4
shift 4  # the rest goes to pytest (e.g. -k NAME, --durations=10)
venv=$build/python-venv
deps=(numpy pytest Pillow mypy "scikit-build-core>=0.10" "nanobind>=2.0")
if ! [ -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import numpy, pytest, PIL, mypy, scikit_build_core, nanobind" 2>/dev/null; then
  rm -rf "$venv"
  if ! python3 -m venv "$venv"; then
    echo "SKIP: python3 -m venv failed (Debian: python3-venv, in scripts/install-deps.sh --test)"; exit 77
  fi
  if ! out=$("$venv/bin/pip" install -q --disable-pip-version-check --timeout 20 --retries 1 "${deps[@]}" 2>&1); then
    echo "$out" | tail -n 3
    echo "SKIP: pip could not install ${deps[*]} (is PyPI reachable? PIP_INDEX_URL=${PIP_INDEX_URL:-default})"
    exit 77
  fi
fi
# --no-build-isolation: the venv already has the build requirements (pyproject.toml), so pip
# neither downloads them again nor builds in a throwaway folder. The compiler launcher (ccache)
# comes from the environment as in the main build (CMAKE_CXX_COMPILER_LAUNCHER).
t0=$SECONDS
"$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
  -C build-dir="$build/python-build" -C cmake.define.KLEIN_PYTHON_ENGINE="$engine" "$src"
echo "python: package built and installed in $((SECONDS - t0)) s"
# From the build folder, so that `import klein` is the installed package, not python/klein.
cd "$build"
export KLEIN_CLI="$cli" KLEIN_SOURCE_DIR="$src" PYTHONDONTWRITEBYTECODE=1
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs "$src/python/tests" "$@"
