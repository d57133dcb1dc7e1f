"""Layouts map to Ray bundles and role slots that fit them."""
import pytest
from omegaconf import OmegaConf

from mindspeed_rl_asp.config.load import list_group_options, load_config
from mindspeed_rl_asp.runtime.placement import plan_placement


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
