#!/usr/bin/env bash
# Quick start, command 2: set up .venv and run the test suite (slow tests included).
# Extra arguments go to pytest, e.g.: bash scripts/test.sh -m "not slow" -x
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
exec "$VENV/bin/python" -m pytest "$@"
