"""Launching a MindSpeed-RL job: asp-launch --mindspeed-config and
scripts/launch_mindspeed_job.sh print Ray starts with each node's NPUs and MindSpeed-RL's
environment (its checkout on every node, the job's HCCL_BUFFSIZE for the driver), and the
driver command they print composes and dry-runs. Nothing here starts Ray."""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHECKOUT = os.environ.get("MINDSPEED_RL_CHECKOUT")
needs_checkout = pytest.mark.skipif(not CHECKOUT, reason="MINDSPEED_RL_CHECKOUT is unset: no MindSpeed-RL checkout "
                                                         "to read its configs/ from")


def job(name):
    return str(Path(CHECKOUT) / "configs" / name)


def launch(argv, capsys, monkeypatch, checkout=None):
    from mindspeed_rl_asp.cli.launch import main

    monkeypatch.setenv("MINDSPEED_RL_CHECKOUT", checkout or "")
    if not checkout:
        monkeypatch.delenv("MINDSPEED_RL_CHECKOUT")
    monkeypatch.setenv("HCCL_BUFFSIZE", "")
    monkeypatch.delenv("HCCL_BUFFSIZE")
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def driver_line(out: str) -> str:
    return next(line.strip() for line in out.splitlines() if "asp-train " in line)


@needs_checkout
def test_every_node_starts_ray_with_its_npus_and_mindspeed_rls_checkout(capsys, monkeypatch):
    out = launch(["head=10.0.0.1", "--mindspeed-config", job("dapo_qwen3_30b_a3b_A3.yaml")], capsys, monkeypatch,
                 checkout="/opt/MindSpeed-RL")
    starts = [line for line in out.splitlines() if " ray start " in f" {line}"]
    assert len(starts) == 2 and all("MINDSPEED_RL_CHECKOUT=/opt/MindSpeed-RL " in line.split("ray start")[0]
                                    for line in starts)
    assert all('"NPU":8' in line for line in starts) and '"asp_node_1":1' in starts[1]
    driver = driver_line(out)
    environment = driver.split(" asp-train ")[0].split()
    assert {"MINDSPEED_RL_CHECKOUT=/opt/MindSpeed-RL", "HCCL_BUFFSIZE=640", "RAY_ADDRESS=10.0.0.1:6379"} <= set(environment)
    assert "--mindspeed-config" in driver and "layout=ascend910b3_t1g1 mode=async" in driver


@needs_checkout
def test_without_a_checkout_the_dry_run_says_what_to_set(capsys, monkeypatch):
    import importlib.util

    if importlib.util.find_spec("mindspeed_rl") is not None:
        pytest.skip("mindspeed_rl is importable here: nothing to say")
    out = launch(["head=10.0.0.1", "--mindspeed-config", job("grpo_qwen3_8b_A3.yaml")], capsys, monkeypatch)
    assert "set MINDSPEED_RL_CHECKOUT=DIR" in out and "MINDSPEED_RL_CHECKOUT=" not in driver_line(out)


@needs_checkout
@pytest.mark.parametrize("name", ["grpo_qwen25_32b_A2.yaml", "grpo_qwen3_8b_A3.yaml"])
def test_the_printed_driver_command_dry_runs(name, capsys, monkeypatch, tmp_path):
    """The layout of grpo_qwen25_32b_A2 has no file (hybrid on 2 nodes: its keys are in the
    command); grpo_qwen3_8b_A3's is ascend910b3_t1g1."""
    from mindspeed_rl_asp.cli.train import main as train_main
    from mindspeed_rl_asp.tasks.megatron_data import write_packed

    out = launch(["head=10.0.0.1", "--mindspeed-config", job(name)], capsys, monkeypatch)
    words = shlex.split(driver_line(out))
    argv = words[words.index("asp-train") + 1:]
    assert ("layout.nodes=2" in argv) == (name == "grpo_qwen25_32b_A2.yaml")
    write_packed(str(tmp_path / "data"), {"input_ids": [[5, 6, 7]] * 64, "labels": [[8]] * 64})
    # The job's model is not here: a small random checkpoint with the job's positions stands in
    # (the config takes a checkpoint's architecture from its config.json: config/model_card.py).
    from hf_random import save_random_checkpoint

    stand_in = save_random_checkpoint(tmp_path / "model", family="qwen2", max_positions=32768)
    rc = train_main([*argv, f"model.path={stand_in}", f"task.path={tmp_path / 'data'}", "--dry-run"])
    dry = capsys.readouterr()
    assert rc == 0, dry.err
    assert "plan: asp" in dry.out


@needs_checkout
def test_the_job_script_dry_runs():
    script = REPO / "scripts" / "launch_mindspeed_job.sh"
    text = script.read_text()
    assert "--mindspeed-config" in text and "pkill" not in text and "ray stop --force" not in text
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "asp-launch").exists() or not shutil.which("bash"):
        pytest.skip("asp-launch is not installed beside this python (pip install -e .)")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", str(script), job("grpo_deepseek_r1_671b_A3.yaml"), "head=10.0.0.1"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("ray start") == 32 and "mode=hybrid" in done.stdout
    assert "generation" not in done.stderr
