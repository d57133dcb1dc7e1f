"""A T/G layout made from a device count (config/layouts.plan_layout), inference instances
that span whole nodes (validate.layout_problems, config/placement), and the launch of a
layout that has no file."""
import pytest
from omegaconf import OmegaConf

from mindspeed_rl_asp.config.layouts import LayoutRefused, Parallel, plan_layout
from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.config.validate import ConfigError
from mindspeed_rl_asp.config.placement import plan_placement


def split(plan):
    return ("hybrid", plan.nodes) if plan.hybrid else (plan.train_nodes, plan.gen_nodes)


@pytest.mark.parametrize("devices, parallel, expected", [
    (64, Parallel(), (4, 4)),                                   # the most even split
    (40, Parallel(), (3, 2)),                                   # odd: more T nodes
    (16, Parallel(tp=8), (1, 1)),
    (16, Parallel(tp=4, pp=4), ("hybrid", 2)),                  # 16 > the 8 devices of T: colocated
    (32, Parallel(tp=4, pp=4), (2, 2)),
    (48, Parallel(tp=4, pp=4), (4, 2)),                         # 3 + 3 would give T 24, not a multiple of 16
    (64, Parallel(tp=8, pp=2, cp=2), (4, 4)),                   # CP counts in the replica
    (16, Parallel(tp=4, ep=2), (1, 1)),                         # data-parallel 2, EP 2
    (32, Parallel(tp=4, ep=4), (2, 2)),                         # EP 4 needs data-parallel 4: 16 T devices
    (16, Parallel(tp=4, ep=4), ("hybrid", 2)),                  # data-parallel 2 on 8 T devices
    (8, Parallel(), ("hybrid", 1)),                             # one node: no split
    (256, Parallel(instance=64), (16, 16)),                     # an instance of 8 nodes: 2 of them on G
    (96, Parallel(instance=32), (8, 4)),                        # 6 + 6: 6 G nodes hold no whole 4-node instance
])
def test_the_rule(devices, parallel, expected):
    assert split(plan_layout(devices, 8, parallel)) == expected


def test_deepseek_r1_ep64_spans_nodes_and_falls_back_to_hybrid():
    """TP 4 x PP 8 with EP 8 needs data-parallel 8, i.e. 256 training devices: no T/G split of
    256 holds that, so it runs colocated, as MindSpeed-RL does, its EP 64 instances taking 8
    whole nodes each."""
    plan = plan_layout(256, 8, Parallel(tp=4, pp=8, ep=8, instance=64))
    assert split(plan) == ("hybrid", 32) and "expert parallel size = 8 does not divide" in plan.rule
    with pytest.raises(LayoutRefused, match="no T/G split of 256 devices"):
        plan_layout(256, 8, Parallel(tp=4, pp=8, ep=8, instance=64), mode="async")


def test_refusals_name_the_keys():
    with pytest.raises(LayoutRefused, match="num_npus=20 is not a whole number of nodes of layout.devices_per_node=8"):
        plan_layout(20, 8, Parallel(), devices_key="num_npus")
    with pytest.raises(LayoutRefused, match="= 32 is larger than the 16 device"):
        plan_layout(16, 8, Parallel(tp=8, pp=4))               # not even colocated
    with pytest.raises(LayoutRefused, match="train_nodes \\+ layout.gen_nodes must be 4"):
        plan_layout(32, 8, Parallel(), train_nodes=3, gen_nodes=3)
    with pytest.raises(LayoutRefused, match="spans 2 nodes, which does not divide the 3 node"):
        plan_layout(32, 8, Parallel(instance=16), train_nodes=1)
    assert split(plan_layout(32, 8, Parallel(), train_nodes=1)) == (1, 3)   # the user's split
    assert split(plan_layout(32, 8, Parallel(), mode="hybrid")) == ("hybrid", 4)
    assert split(plan_layout(32, 16, Parallel())) == (1, 1)    # 16 devices per node (Atlas A3)


def layout_of(overrides, mode="async"):
    return OmegaConf.to_object(load_config(["layout=ascend910b3_t4g4", f"mode={mode}", *overrides],
                                           validate=False)).layout


def test_an_instance_of_whole_nodes_is_a_valid_layout_and_places_on_them():
    lay = layout_of(["layout.nodes=24", "layout.train_nodes=8", "layout.gen_nodes=16",
                     "layout.infer_instance_size=64"])
    assert lay.num_generation_actors == 2
    placement = plan_placement(lay, "async")
    assert [s.span for s in placement.generators] == [tuple(range(8, 16)), tuple(range(16, 24))]
    assert [s.bundle for s in placement.generators] == [8, 16]
    assert all(s.amount == 8 and s.devices == tuple(range(8)) for s in placement.generators)
    assert "generation actor 1: nodes 16-23 (instance of 8 whole nodes" in placement.describe()
    hybrid = plan_placement(layout_of(["layout.infer_instance_size=32"], "hybrid"), "hybrid")
    assert [s.span for s in hybrid.generators] == [(0, 1, 2, 3), (4, 5, 6, 7)]


@pytest.mark.parametrize("overrides, message", [
    (["layout.infer_instance_size=12"], "use a divisor or a multiple of devices_per_node"),
    (["layout.infer_instance_size=24"], "spans 3 whole nodes of 8, which does not divide layout.gen_nodes=4"),
])
def test_an_instance_that_neither_divides_nor_spans_whole_nodes_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["layout=ascend910b3_t4g4", "task.num_prompts=64", *overrides])


def test_a_layout_without_a_file_launches_by_its_keys():
    """A layout made by the import has no file: the launch commands carry its keys."""
    from mindspeed_rl_asp.runtime.launch import launch_commands, layout_arguments, wait_command

    keys = ["layout.name=ascend910b3_t2g2", "layout.device_type=npu", "layout.nodes=4", "layout.devices_per_node=8",
            "layout.train_nodes=2", "layout.gen_nodes=2"]
    lay = OmegaConf.to_object(load_config(keys, validate=False)).layout
    args = layout_arguments(lay)
    assert "layout=ascend910b3_t2g2" not in args and "layout.train_nodes=2" in args
    nodes, driver = launch_commands(lay, "async", "10.0.0.1", [])
    assert len(nodes) == 4 and "layout.gen_nodes=2" in driver and "layout=" not in driver.split("asp-train")[1]
    assert "layout.nodes=4" in wait_command(lay, "async", "10.0.0.1")
    shipped = OmegaConf.to_object(load_config(["layout=ascend910b3_t1g3"], validate=False)).layout
    assert layout_arguments(shipped) == ["layout=ascend910b3_t1g3"]
