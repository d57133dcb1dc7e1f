"""engine=mindspeed on CPU, through MindSpeed-RL's own orchestration (engine.mindspeed_workers=cpu).

The checks that import MindSpeed-RL (tests/mindspeed_stubs/cpu_path_child.py) run in the
contract's child process and are read there: tests/test_mindspeed_contract.py::test_cpu_path
(one interpreter, one ``import mindspeed_rl`` and one Ray for both lists); without a
MindSpeed-RL checkout they skip, saying why. The end-to-end run is `asp-train` in a process
of its own (it puts the NPU stand-ins on its path, which must never happen in this
session). The pure parts (the importance-weight fold, the placement) run everywhere."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mindspeed_child import skip_reason

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_asp_train_runs_mindspeed_rl_with_cpu_workers(tmp_path):
    """The issue's command trains 2 steps: MindSpeed-RL's RayActorGroup, dock, KL controller
    and GRPO loss, with the hf engine doing the model work."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "mindspeed_rl_asp.cli.train", "--mindspeed-config",
               "configs/mindspeed_rl/grpo_tiny_cpu.yaml", "engine=mindspeed", "engine.mindspeed_workers=cpu",
               "steps=2", "task.num_prompts=16", "eval.num_prompts=0", "generate.sampling_config.max_tokens=48",
               f"run_dir={run_dir}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}   # the driver finds MindSpeed-RL by MINDSPEED_RL_CHECKOUT
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["mindspeed_update"] == 1.0 for r in rows)
    assert all(r["mindspeed_optimizer_steps"] == 1.0 and math.isfinite(r["mindspeed_pg_loss"]) for r in rows)


# ----------------------------------------------------------------------------- everywhere
def test_importance_weights_fold_into_the_advantages():
    from mindspeed_rl_asp.algo.grpo import GRPOLossConfig
    from mindspeed_rl_asp.integrations.mindspeed.engine import importance_weighted_advantages

    behaviour, proximal = [[-1.0, -0.1], [-3.0]], [[-0.5, -0.2], [-0.1]]
    old, adv = importance_weighted_advantages([2.0, -1.0], behaviour, proximal,
                                              GRPOLossConfig(off_policy="tis", tis_cap=2.0))
    assert old == proximal
    assert adv[0] == pytest.approx([2.0 * math.exp(0.5), 2.0 * math.exp(-0.1)])
    assert adv[1] == [-2.0]   # exp(2.9) capped at 2
    old, adv = importance_weighted_advantages([2.0, -1.0], behaviour, proximal, GRPOLossConfig(off_policy="none"))
    assert old == behaviour and adv == [[2.0, 2.0], [-1.0]]
    decoupled = GRPOLossConfig(off_policy="decoupled", tis_cap=None)
    assert importance_weighted_advantages([1.0], [[-3.0]], [[-0.1]], decoupled)[1] == [[pytest.approx(math.exp(2.9))]]


def test_mindspeed_placement_leaves_the_t_devices_to_mindspeed_rls_workers():
    """ASP's own group holds only the G devices (and a CPU per T node); MindSpeed-RL's worker
    group gets every T device: nothing is asked for twice."""
    from omegaconf import OmegaConf

    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.config.placement import mindspeed_worker_bundles, plan_placement, trainer_holds_devices

    cfg = load_config(["layout=ascend910b3_t4g4", "engine=mindspeed", "engine.mindspeed_config=x.yaml"],
                      validate=False)
    layout = OmegaConf.to_object(cfg.layout)
    assert not trainer_holds_devices("mindspeed", "async") and trainer_holds_devices("hf", "async")
    placement = plan_placement(layout, "async", trainer_holds_devices=False)
    workers = mindspeed_worker_bundles(layout, "async", cpus_per_device=1.0)
    asp_npus = sum(b.get("NPU", 0) for b in placement.bundles)
    worker_npus = sum(b["NPU"] for group in workers for b in group)
    assert (asp_npus, worker_npus) == (32, 32) and asp_npus + worker_npus == 64
    assert placement.trainer.resource == "CPU" and len(workers) == 4 and all(len(g) == 8 for g in workers)
    with pytest.raises(ValueError, match="mode=hybrid with engine=mindspeed"):
        plan_placement(layout, "hybrid", trainer_holds_devices=False)
