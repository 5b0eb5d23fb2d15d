#!/usr/bin/env bash
# Creates the virtual environment of the server tests in the build folder (idempotent): the
# official openai client and Selenium, from PyPI. Usage: setup_venv.sh VENV_DIR
# Without PyPI (offline machines, a dead mirror) the install fails: then this exits 77, which
# ctest reports as a skip with the reason below, and the suites skip what needs the packages.
set -euo pipefail
venv=$1
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import openai, selenium" 2>/dev/null; then
  echo "server venv: ready ($venv)"; exit 0
fi
python3 -m venv "$venv"
if ! out=$("$venv/bin/pip" install -q --disable-pip-version-check --timeout 20 --retries 1 openai selenium 2>&1); then
  echo "$out" | tail -n 3
  echo "SKIP: server venv: pip could not install openai and selenium (is PyPI reachable? PIP_INDEX_URL=${PIP_INDEX_URL:-default})"
  exit 77
fi
"$venv/bin/python" -c "import openai, selenium; print('server venv: openai', openai.__version__, 'selenium', selenium.__version__)"
