#!/usr/bin/env bash
# Quick start, command 1: set up .venv and run the main job: async GRPO with ASP on the
# tiny default policy (asp-train with the default config).
# Extra arguments are Hydra overrides, e.g.: bash scripts/run.sh task.num_prompts=16
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
exec "$VENV/bin/asp-train" "$@"
