"""Layouts map to Ray bundles and role slots that fit them."""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mindspeed_rl_asp.config.load import list_group_options, load_config
from mindspeed_rl_asp.config.placement import plan_placement

REPO = Path(__file__).resolve().parents[1]


def layout(name, mode="async"):
    return OmegaConf.to_object(load_config([f"layout={name}", f"mode={mode}"])).layout


@pytest.mark.parametrize("name", [n for n in list_group_options("layout") if not n.endswith("hybrid")])
def test_async_slots_fit_their_bundles(name):
    lay = layout(name)
    placement = plan_placement(lay, "async")
    assert len(placement.generators) == lay.num_generation_actors
    used = {}
    for slot in (placement.trainer, *placement.generators):
        used[slot.bundle] = used.get(slot.bundle, 0) + slot.amount
    for bundle, amount in used.items():
        assert amount <= placement.bundles[bundle][placement.resource]
    assert all(s.bundle >= lay.train_nodes for s in placement.generators)


def test_paper_t4g4():
    placement = plan_placement(layout("ascend910b3_t4g4"), "async")
    assert placement.resource == "NPU" and len(placement.bundles) == 8
    assert [s.bundle for s in placement.generators] == [4, 5, 6, 7]


def test_hybrid_shares_every_node():
    lay = layout("ascend910b3_hybrid", "hybrid")
    placement = plan_placement(lay, "hybrid")
    assert len(placement.generators) == 8 and placement.trainer.amount == 4.0
    assert {s.bundle for s in placement.generators} == set(range(8))


def test_local_layout():
    placement = plan_placement(layout("local"), "async")
    assert placement.resource == "CPU" and len(placement.generators) == 2
    assert "generation actor 1: node 2" in placement.describe()


def test_launch_commands_one_per_node_and_a_driver():
    from mindspeed_rl_asp.runtime.launch import launch_commands

    lay = layout("ascend910b3_t2g6")
    nodes, driver = launch_commands(lay, "async", "10.0.0.1", ["steps=3"], token_path="/shared/ray/token")
    assert [n.role for n in nodes] == ["head"] + ["worker"] * 7
    assert all(f'"asp_node_{n.node}":1' in n.command and '"NPU":8' in n.command for n in nodes)
    assert all("--address=10.0.0.1:6379" in n.command for n in nodes[1:])
    assert nodes[0].units.startswith("T") and nodes[2].units.startswith("G")
    auth = "RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=/shared/ray/token"   # the path, never the token
    assert all(n.command.startswith(auth + " ray start") for n in nodes)
    assert "--dashboard-host=127.0.0.1" in nodes[0].command
    assert driver.startswith(auth + " RAY_ADDRESS=10.0.0.1:6379 asp-train layout=ascend910b3_t2g6 mode=async")
    assert driver.endswith("steps=3")


def test_pinned_bundles_follow_layout_nodes():
    placement = plan_placement(layout("ascend910b3_t1g3"), "async", pin_nodes=True)
    assert [b.get(f"asp_node_{k}") for k, b in enumerate(placement.bundles)] == [0.001] * 4


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "scripts" / "launch").glob("*.sh")))
def test_every_launch_script_names_a_layout(script):
    text = (REPO / "scripts" / "launch" / script).read_text()
    assert f"layout={script[:-3]}" in text and (REPO / "configs" / "layout" / script.replace(".sh", ".yaml")).is_file()


def test_asp_launch_dry_run(capsys):
    from mindspeed_rl_asp.cli.launch import main

    assert main(["layout=ascend910b3_t4g4", "head=10.0.0.9"]) == 0
    out = capsys.readouterr().out
    assert out.count("ray start") == 8 and "asp-train layout=ascend910b3_t4g4" in out
    assert main(["layout=ascend910b3_t4g4"]) == 2
    assert "head=HOST" in capsys.readouterr().err
