#!/usr/bin/env bash
# Runs one server suite: with the venv's Python when ServerVenv made it, else with the system's
# (the suites that need only the standard library still run; the others skip, exit 77).
# Usage: run_suite.sh VENV_DIR test_x.py
set -euo pipefail
venv=$1 suite=$2
python=python3
[ -x "$venv/bin/python" ] && python=$venv/bin/python
exec "$python" "$suite"
