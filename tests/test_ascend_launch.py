"""Placement and launch on Ascend: NPU bundles as MindSpeed-RL names them, each actor's visible
NPUs and runtime environment, the wait for every node before the driver, and the dry run of
every layout and launch script. Nothing here starts Ray or a cluster."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mindspeed_rl_asp.config.load import list_group_options, load_config
from mindspeed_rl_asp.runtime.launch import (TOKEN_PATH, 
    describe_wait, launch_commands, missing_resources, required_resources, wait_command, wait_for_cluster)
from mindspeed_rl_asp.config.placement import NPU_RUNTIME_ENV, npu_actor_env, plan_placement

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = list_group_options("layout")


def mode_of(name):
    return "hybrid" if name.endswith("hybrid") else "async"


def layout(name):
    return OmegaConf.to_object(load_config([f"layout={name}", f"mode={mode_of(name)}"], validate=False)).layout


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_dry_runs_its_launch(name, capsys):
    from mindspeed_rl_asp.cli.launch import main

    lay, mode = layout(name), mode_of(name)
    nodes, driver = launch_commands(lay, mode, "10.0.0.9", ["steps=3"])
    used = lay.nodes if mode == "hybrid" else lay.train_nodes + lay.gen_nodes
    assert len(nodes) == used and nodes[0].role == "head"
    for n in nodes:
        assert f'"asp_node_{n.node}":1' in n.command
        if lay.device_type == "npu":      # MindSpeed-RL's resource name, with the node's count
            assert f'"NPU":{lay.devices_per_node}' in n.command and "--num-gpus" not in n.command
        elif lay.device_type == "cpu":
            assert f"--num-cpus={lay.devices_per_node}" in n.command
    assert main([f"layout={name}", f"mode={mode}", "head=10.0.0.9"]) == 0
    out = capsys.readouterr().out
    assert out.count("ray start") == used
    wait = wait_command(lay, mode, "10.0.0.9")
    auth = f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={os.path.expanduser(TOKEN_PATH)}"
    assert f"{wait} && \\\n  {auth} RAY_ADDRESS=10.0.0.9:6379 asp-train layout={name}" in out   # the wait comes first
    assert all(n.command.startswith(auth + " ray start") for n in nodes)   # every node authenticates
    assert describe_wait(lay, mode) in out


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_wait_needs_every_marker_and_every_device(name):
    lay, mode = layout(name), mode_of(name)
    needed = required_resources(lay, mode)
    used = lay.nodes if mode == "hybrid" else lay.train_nodes + lay.gen_nodes
    device = {"npu": "NPU", "gpu": "GPU", "cpu": "CPU"}[lay.device_type]
    assert needed[device] == used * lay.devices_per_node
    assert sorted(k for k in needed if k.startswith("asp_node_")) == sorted(f"asp_node_{k}" for k in range(used))
    joined = {f"asp_node_{k}": 1.0 for k in range(used - 1)}
    joined[device] = (used - 1) * lay.devices_per_node
    missing = missing_resources(joined, needed)
    assert f"asp_node_{used - 1}: 0/1" in missing and any(m.startswith(device) for m in missing)
    joined[f"asp_node_{used - 1}"] = 1.0
    joined[device] += lay.devices_per_node
    assert missing_resources(joined, needed) == []


def test_wait_polls_until_the_last_node_joins():
    lay = layout("ascend910b3_t4g4")
    needed = required_resources(lay, "async")
    snapshots = [{"NPU": 8.0 * k, **{f"asp_node_{i}": 1.0 for i in range(k)}} for k in (1, 3, 8)]
    seen, lines, now = [], [], [0.0]

    def resources():
        seen.append(1)
        return snapshots[min(len(seen) - 1, 2)]

    missing = wait_for_cluster(needed, resources, timeout_s=100, poll_s=5, report=lines.append,
                               clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert missing == [] and len(seen) == 3 and now[0] == 10
    assert lines[0].startswith("waiting for ") and "NPU: 8/64" in lines[0] and lines[-1] == "cluster ready"


def test_wait_times_out_naming_what_is_missing():
    lay = layout("ascend910b3_t1g3")
    now = [0.0]
    missing = wait_for_cluster(required_resources(lay, "async"), lambda: {"NPU": 8.0, "asp_node_0": 1.0},
                               timeout_s=30, poll_s=5, clock=lambda: now[0],
                               sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert now[0] == 30 and missing == ["asp_node_1: 0/1", "asp_node_2: 0/1", "asp_node_3: 0/1", "NPU: 8/32"]


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n.startswith("ascend")])
def test_each_actor_sees_only_its_own_npus(name):
    lay, mode = layout(name), mode_of(name)
    placement = plan_placement(lay, mode)
    assert placement.resource == "NPU"
    assert placement.trainer.devices == tuple(range(lay.devices_per_node))
    by_node = {}
    for slot in placement.generators:
        assert len(slot.devices) == lay.infer_instance_size
        assert set(slot.devices) <= set(range(lay.devices_per_node))
        by_node.setdefault(slot.bundle, []).extend(slot.devices)
    for devices in by_node.values():   # instances of one node never share a device
        assert sorted(devices) == list(range(lay.devices_per_node))
    env = npu_actor_env(placement.generators[-1])
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == ",".join(map(str, placement.generators[-1].devices))
    assert "ASCEND_RT_VISIBLE_DEVICES=" in placement.describe()


def test_several_instances_per_node_split_its_npus():
    lay = layout("ascend910b3_t4g4")
    lay.infer_instance_size = 2
    placement = plan_placement(lay, "async")
    assert [s.devices for s in placement.generators[:5]] == [(0, 1), (2, 3), (4, 5), (6, 7), (0, 1)]
    assert [s.bundle for s in placement.generators[:5]] == [4, 4, 4, 4, 5]
    ranks = plan_placement(lay, "async", ranks=16).trainers
    assert [(s.bundle, s.devices) for s in ranks[7:9]] == [(0, (7,)), (1, (0,))]
    assert "ASCEND_RT_VISIBLE_DEVICES=2-3" in placement.describe()


def test_npu_env_is_mindspeed_rls_and_the_operator_can_override_it():
    slot = plan_placement(layout("ascend910b3_t4g4"), "async").generators[0]
    env = npu_actor_env(slot, {"HCCL_BUFFSIZE": "640", "UNRELATED": "x"})
    assert env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"   # Ray must not rewrite the devices
    assert env["HCCL_BUFFSIZE"] == "640" and "UNRELATED" not in env
    assert env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    assert set(env) == set(NPU_RUNTIME_ENV) | {"ASCEND_RT_VISIBLE_DEVICES"}


def test_ray_options_carry_the_npu_env_only_on_npu_layouts():
    from mindspeed_rl_asp.runtime.driver import _ray_options

    npu = plan_placement(layout("ascend910b3_t4g4"), "async")
    options = _ray_options(None, npu.generators[1], npu.resource, 1)
    env = options["runtime_env"]["env_vars"]
    assert options["resources"] == {"NPU": 8.0} and env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert env["OMP_NUM_THREADS"] == "1"
    cpu = plan_placement(layout("local"), "async")
    assert "ASCEND_RT_VISIBLE_DEVICES" not in _ray_options(None, cpu.generators[0], cpu.resource, 1)[
        "runtime_env"]["env_vars"]


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n.startswith("ascend")])
def test_every_ascend_layout_has_a_launch_script_that_dry_runs(name):
    script = REPO / "scripts" / "launch" / f"{name}.sh"
    assert script.is_file(), f"scripts/launch/{name}.sh is missing"
    text = script.read_text()
    assert f"layout={name} mode={mode_of(name)}" in text and "--wait" in text
    assert "pkill" not in text and "ray stop --force" not in text and "kill" not in text.replace(
        "kills processes", "")
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "asp-launch").exists() or not shutil.which("bash"):
        pytest.skip("asp-launch is not installed beside this python (pip install -e .)")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", str(script), "head=10.0.0.1"], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--wait" in done.stdout and f"asp-train layout={name}" in done.stdout


def test_asp_launch_takes_a_mindspeed_job_and_its_layout(capsys):
    from mindspeed_rl_asp.cli.launch import main

    job = REPO / "configs" / "mindspeed_rl" / "grpo_qwen3_32b_910b3.yaml"
    assert main(["head=10.0.0.9", "--mindspeed-config", str(job), "task=maze"]) == 0
    out = capsys.readouterr().out
    commands = [line for line in out.splitlines() if not line.startswith("#")]   # notes may name `ray start`
    assert sum("ray start" in line for line in commands) == 8 and "layout ascend910b3_t4g4" in out
    assert f"asp-train layout=ascend910b3_t4g4 mode=async --mindspeed-config {job} task=maze" in out
    assert main(["head=10.0.0.9", "--mindspeed-config", str(job), "layout=ascend910b3_t1g3"]) == 2
    assert "num_npus=64 does not match layout ascend910b3_t1g3" in capsys.readouterr().err


def test_bad_wait_timeout_is_one_error(capsys):
    from mindspeed_rl_asp.cli.launch import main

    assert main(["layout=ascend910b3_t4g4", "head=10.0.0.9", "--wait", "--wait-timeout", "soon"]) == 2
    assert "--wait-timeout must be a number" in capsys.readouterr().err
