"""Contract tests against a real MindSpeed-RL checkout (MINDSPEED_RL_CHECKOUT=/path/to/it).

The checks run in one child process (tests/mindspeed_stubs/contract_child.py) with the
stubs of MindSpeed-RL's NPU-only imports and the checkout on its PYTHONPATH, so the stub
named vllm never shadows the real vllm of this session, and with a Ray of its own that
offers 32 logical CPUs (GRPOTransferDock and TransferQueueManager reserve 10 each; the
session's cluster has 4). What they check: ``import mindspeed_rl`` with the stubs; the
engine's calls against the real signatures; the weight map against MindSpeed-RL's QKV
split, name adaptors and fc1 gather; the queue adapter through the real GRPOTransferDock
and TransferQueue; the in-process dock model against the real dock; MindSpeed-RL's own
advantage stage over ASP's samples. Without a checkout they skip, saying why; the tests
at the bottom run everywhere.
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
STUBS = TESTS / "mindspeed_stubs"
CHECKOUT = os.environ.get("MINDSPEED_RL_CHECKOUT", "")
# MindSpeed-RL's pure-python requirements that its import needs and this project does not.
REQUIREMENTS = ("tensordict", "codetiming", "mathruler", "word2number", "zmq")
CHECKS = ("import_mindspeed_rl_with_stubs", "engine_api_signatures", "engine_cli_functions",
          "qkv_split_matches_mindspeed_rl", "names_match_mindspeed_rl_weight_adaptors",
          "fc1_gather_matches_mindspeed_rl", "transfer_dock_round_trip", "dock_model_matches_the_real_dock",
          "default_gbs_train_returns_nothing_on_the_real_dock", "mindspeed_rl_advantage_stage_reads_asp_samples",
          "transfer_queue_round_trip")


def skip_reason() -> str | None:
    if not CHECKOUT:
        return "MINDSPEED_RL_CHECKOUT is not set (point it to a checkout of Ascend/MindSpeed-RL to run these)"
    if not (Path(CHECKOUT) / "mindspeed_rl" / "__init__.py").is_file():
        return f"MINDSPEED_RL_CHECKOUT={CHECKOUT} has no mindspeed_rl package"
    missing = [m for m in REQUIREMENTS if importlib.util.find_spec(m) is None]
    if missing:
        return f"MindSpeed-RL's requirements {missing} are not installed (pip install {' '.join(missing)})"
    return None


@pytest.fixture(scope="module")
def contract_results(tmp_path_factory):
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("mindspeed_contract") / "results.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(STUBS), CHECKOUT, str(TESTS), str(TESTS.parent)]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["RAY_OVERRIDE_RESOURCES"] = json.dumps({"CPU": 32})
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"   # the checkout is read only: no __pycache__ in it
    run = subprocess.run([sys.executable, str(STUBS / "contract_child.py"), str(out)], env=env,
                         capture_output=True, text=True, timeout=900)
    if not out.exists():
        pytest.fail(f"the contract child process wrote no results (exit {run.returncode}):\n{run.stderr[-4000:]}")
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", CHECKS)
def test_contract(contract_results, name):
    assert name in contract_results, f"the child ran no check {name!r}"
    assert contract_results[name] == "ok", contract_results[name]


# ----------------------------------------------------------------------------- everywhere
def test_engine_api_check_can_fail(monkeypatch):
    """check_mindspeed_api names a missing target and a missing parameter."""
    import types

    from mindspeed_rl_asp.integrations.mindspeed.engine import ApiCall, check_mindspeed_api

    module = types.ModuleType("fake_mindspeed_api")

    class Worker:
        def __init__(self, megatron_config, rl_config):
            pass

    module.Worker = Worker
    monkeypatch.setitem(sys.modules, "fake_mindspeed_api", module)
    problems = check_mindspeed_api([ApiCall("fake_mindspeed_api", "Worker.__init__", ("megatron_config", "tokenizer")),
                                    ApiCall("fake_mindspeed_api", "Gone.update", ())])
    assert len(problems) == 2
    assert "takes no ['tokenizer']" in problems[0] and "AttributeError" in problems[1]
    assert check_mindspeed_api([ApiCall("fake_mindspeed_api", "Worker.__init__", ("rl_config",))]) == []


@pytest.mark.skipif(importlib.util.find_spec("mindspeed_rl") is not None, reason="mindspeed_rl is importable here")
def test_engine_mindspeed_without_mindspeed_rl_says_what_to_install():
    from types import SimpleNamespace

    from mindspeed_rl_asp.engines.base import EngineError
    from mindspeed_rl_asp.engines.registry import (make_generation_engine, make_reference_policy,
                                                   make_training_engine)

    cfg = SimpleNamespace(name="mindspeed", device="npu", dtype="bfloat16", num_threads=0)
    for build in (lambda: make_training_engine(cfg, "model", None, None, 1.0),
                  lambda: make_generation_engine(cfg, "model"),
                  lambda: make_reference_policy(cfg, "model", 1.0)):
        with pytest.raises(EngineError, match="mindspeed_rl is not importable.*checkout of Ascend/MindSpeed-RL"):
            build()


def test_skip_reason_names_the_variable(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "CHECKOUT", "")
    assert "MINDSPEED_RL_CHECKOUT is not set" in skip_reason()
    monkeypatch.setattr(sys.modules[__name__], "CHECKOUT", "/nonexistent-checkout")
    assert "has no mindspeed_rl package" in skip_reason()
