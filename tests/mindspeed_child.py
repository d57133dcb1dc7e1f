"""Run MindSpeed-RL checks in a child process: the NPU stand-ins and the MindSpeed-RL
checkout on its PYTHONPATH (so the stand-in named vllm never shadows the real vllm of the
test session), HF offline, and no bytecode written into the read-only checkout. Used by
tests/test_mindspeed_contract.py (the one child, all_checks_child.py, that runs the
contract's and the cpu path's checks) and tests/test_mindspeed_cpu_path.py (skip_reason);
the child writes its results as JSON."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
CHILDREN = TESTS / "mindspeed_stubs"
# The NPU stack's stand-ins ship with the package (engine.mindspeed_workers=cpu uses them too).
STANDINS = TESTS.parent / "mindspeed_rl_asp" / "assets" / "npu_standins"
CHECKOUT = os.environ.get("MINDSPEED_RL_CHECKOUT", "")
# MindSpeed-RL's pure-python requirements that its import needs (the test extra installs them).
REQUIREMENTS = ("tensordict", "codetiming", "mathruler", "word2number", "zmq", "cloudpickle", "orjson", "pylatexenc")


def skip_reason() -> str | None:
    if not CHECKOUT:
        return "MINDSPEED_RL_CHECKOUT is not set (point it to a checkout of Ascend/MindSpeed-RL to run these)"
    if not (Path(CHECKOUT) / "mindspeed_rl" / "__init__.py").is_file():
        return f"MINDSPEED_RL_CHECKOUT={CHECKOUT} has no mindspeed_rl package"
    missing = [m for m in REQUIREMENTS if importlib.util.find_spec(m) is None]
    if missing:
        return f"MindSpeed-RL's requirements {missing} are not installed (pip install {' '.join(missing)})"
    return None


def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(STANDINS), CHECKOUT, str(TESTS), str(TESTS.parent)]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"   # the checkout is read only: no __pycache__ in it
    env.update(extra or {})
    return env


def run_child(script: str, out_dir: Path, timeout: int = 900) -> dict:
    """Run ``mindspeed_stubs/<script>`` (skipping the caller when MindSpeed-RL is absent) and
    return its results."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    out = out_dir / "results.json"
    run = subprocess.run([sys.executable, str(CHILDREN / script), str(out)], env=child_env(),
                         capture_output=True, text=True, timeout=timeout)
    if not out.exists():
        pytest.fail(f"{script} wrote no results (exit {run.returncode}):\n{run.stderr[-4000:]}")
    return json.loads(out.read_text())
