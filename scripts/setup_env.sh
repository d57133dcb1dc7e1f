#!/usr/bin/env bash
# Create .venv in the repository (if missing) and install the package with its test
# extras into it. Re-installs only when setup.py changed since the last install.
# Sourced by scripts/run.sh and scripts/test.sh; needs only python3 (>= 3.10) with venv.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
VENV="${ASP_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.mindspeed_rl_asp-installed"
want="$(cat setup.py | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing mindspeed_rl_asp and its dependencies into $VENV (first time: about a minute)"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -e ".[test]"
  echo "$want" > "$stamp"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
