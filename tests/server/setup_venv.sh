#!/usr/bin/env bash
# Creates the virtual environment of the server tests in the build folder (idempotent): the
# official openai client and Selenium, from PyPI. Usage: setup_venv.sh VENV_DIR
set -euo pipefail
venv=$1
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import openai, selenium" 2>/dev/null; then
  echo "server venv: ready ($venv)"; exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check openai selenium
"$venv/bin/python" -c "import openai, selenium; print('server venv: openai', openai.__version__, 'selenium', selenium.__version__)"
