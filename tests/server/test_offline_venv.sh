#!/usr/bin/env bash
# Without PyPI the server tests skip, saying why, instead of failing: setup_venv.sh exits 77
# with its reason, and a suite that needs the openai package then exits 77 too. No network is
# simulated by a package index on a port where nothing listens.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$(PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_NO_CACHE_DIR=1 bash "$here/setup_venv.sh" "$tmp/venv" 2>&1)
rc=$?
[ "$rc" = 77 ] || { echo "FAIL: setup_venv.sh exited $rc without PyPI (77 expected):"; echo "$out"; exit 1; }
grep -q "^SKIP: server venv: pip could not install openai and selenium" <<<"$out" || {
  echo "FAIL: no SKIP reason in:"; echo "$out"; exit 1; }
out=$(cd "$here" && bash run_suite.sh "$tmp/venv" test_openai.py 2>&1)
rc=$?
[ "$rc" = 77 ] || { echo "FAIL: test_openai.py exited $rc without the openai package (77 expected):"; echo "$out"; exit 1; }
grep -q "^SKIP: openai not installed" <<<"$out" || { echo "FAIL: no SKIP reason in:"; echo "$out"; exit 1; }
echo "offline: the venv and the openai suite skip with their reasons"
