"""The simulator's price of ``Prefetch`` (the collective transport with ``weights.prefetch``).

A transfer moves the weight bytes into one instance at ``min(its links, the trainer's
egress / transfers running)``, so concurrent transfers share the trainer's sending
links and every start and end moves the others' ends; a load after a finished prefetch
costs the local swap alone; the constants come from the hardware and engine profiles.
"""
from __future__ import annotations

import json

import pytest

from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.control.core import Generate, LoadWeights, Prefetch
from mindspeed_rl_asp.control.loop import Done
from mindspeed_rl_asp.sim.cluster import SimCluster
from mindspeed_rl_asp.sim.profiles import engine_profile_from_config, hardware_profile_from_config
from mindspeed_rl_asp.sim.run import setup_from_config, simulate
from mindspeed_rl_asp.sim.workload import PromptWorkload

PAPER = ["experiment=table3_qwen3_30b_a3b_asp", "weights.transport=collective"]


def paper_setup(*overrides):
    return setup_from_config(load_config([*PAPER, *overrides]))


def ends(cluster: SimCluster, count: int) -> dict:
    """action -> the clock when it ended, for the next ``count`` events."""
    out = {}
    for _ in range(count):
        event = cluster.next_event()
        assert isinstance(event, Done)
        out[event.action] = cluster.now()
    return out


def test_the_constants_come_from_the_profiles():
    cfg = load_config(PAPER)
    setup = setup_from_config(cfg)
    hardware, engine = hardware_profile_from_config(cfg.hardware), engine_profile_from_config(cfg.engine)
    devices, weight_bytes = cfg.layout.infer_instance_size, setup.instance.model.weight_bytes
    assert setup.prefetch
    assert setup.ingress_bandwidth == devices * hardware.inter_node_bandwidth
    assert setup.trainer_egress == engine.weight_sync_senders * hardware.inter_node_bandwidth == 25e9
    assert setup.swap_s == pytest.approx(2 * weight_bytes / (devices * hardware.hbm_bandwidth))
    # Qwen3-30B-A3B in bf16 (~61 GB) over one 200 GbE port: ~2.4 s; its swap: ~10 ms.
    assert setup.transfer_rate(1) == 25e9 and 2.0 < weight_bytes / 25e9 < 3.0 and setup.swap_s < 0.02


@pytest.mark.parametrize("overrides", [["weights.prefetch=false"], ["weights.transport=object_store"],
                                       ["mode=hybrid"]])
def test_no_prefetch_without_the_collective_prefetching_transport_in_a_decoupled_mode(overrides):
    cfg = load_config([*PAPER, *overrides]) if overrides != ["mode=hybrid"] else \
        load_config(["experiment=table3_qwen3_30b_a3b_hybrid", "weights.transport=collective"])
    setup = setup_from_config(cfg)
    assert not setup.prefetch and setup.swap_s == 0.0


@pytest.mark.parametrize("actors", [1, 2, 4])
def test_transfers_running_together_share_the_trainer_egress(actors):
    setup = paper_setup()
    cluster = SimCluster(setup, {})
    for actor in range(actors):
        cluster.submit(Prefetch(actor, 1))
    ended = ends(cluster, actors)
    alone = setup.instance.model.weight_bytes / setup.trainer_egress
    assert all(t == pytest.approx(actors * alone, rel=1e-9) for t in ended.values())


def test_a_transfer_started_later_moves_the_first_ones_end():
    """A runs alone until a generation ends at g (on the heap), then B starts: both at
    half the rate, so A ends at 2 x alone - g, and B, alone again, at 2 x alone."""
    setup = paper_setup()
    alone = setup.instance.model.weight_bytes / setup.trainer_egress
    cluster = SimCluster(setup, {"p0": PromptWorkload("p0", 16, (4,), 4.0)})
    cluster.submit(Prefetch(0, 1))
    cluster.submit(Generate(1, "m0", ("p0",), 0))
    assert isinstance(cluster.next_event().action, Generate)
    g = cluster.now()
    assert 0 < g < alone
    cluster.submit(Prefetch(1, 1))
    ended = ends(cluster, 2)
    assert ended[Prefetch(0, 1)] == pytest.approx(2 * alone - g, rel=1e-9)
    assert ended[Prefetch(1, 1)] == pytest.approx(2 * alone, rel=1e-9)


def test_a_load_after_a_prefetch_only_swaps_and_one_without_moves_the_bytes():
    setup = paper_setup()
    cluster = SimCluster(setup, {})
    cluster.submit(Prefetch(0, 1))
    cluster.next_event()
    start = cluster.now()
    cluster.submit(LoadWeights(0, 1))
    event = cluster.next_event()
    assert cluster.now() - start == pytest.approx(setup.swap_s) and event.info.swap_s == setup.swap_s
    cluster.submit(LoadWeights(1, 1))   # never prefetched: the bytes move over the egress
    start = cluster.now()
    event = cluster.next_event()
    assert cluster.now() - start == pytest.approx(setup.instance.model.weight_bytes / setup.transfer_rate(1))
    assert event.info.transfer_s == pytest.approx(cluster.now() - start)


def test_a_cancelled_transfer_gives_its_share_back():
    setup = paper_setup()
    cluster = SimCluster(setup, {})
    cluster.submit(Prefetch(0, 1))
    cluster.submit(Prefetch(1, 1))
    cluster.cancel([Prefetch(1, 1)])
    assert ends(cluster, 1) == {Prefetch(0, 1): pytest.approx(setup.instance.model.weight_bytes / setup.trainer_egress)}


def read_spans(run_dir):
    return [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]


def test_a_simulated_run_prefetches_and_its_loads_cost_the_swap(tmp_path):
    """The Table 3 ASP preset with the collective transport: the core prefetches while
    actors generate, so most refreshes cost the swap alone, and the iteration is no
    slower than with every transfer at load time."""
    on = simulate(load_config([*PAPER, "steps=6"]), tmp_path / "on")
    off = simulate(load_config([*PAPER, "steps=6", "weights.prefetch=false"]), tmp_path / "off")
    swap = paper_setup().swap_s
    loads_on = [s for s in read_spans(tmp_path / "on") if s["kind"] == "load_weights"]
    loads_off = [s for s in read_spans(tmp_path / "off") if s["kind"] == "load_weights"]
    swapped = [s for s in loads_on if s["end"] - s["start"] == pytest.approx(swap)]
    assert loads_on and len(swapped) > len(loads_on) / 2
    assert all(s["end"] - s["start"] > 100 * swap for s in loads_off)
    assert on.iteration_s < off.iteration_s


def test_the_cpu_host_shares_cores_beside_the_transfers(tmp_path):
    """cpu_local (processor sharing of the host's cores) with transfers beside it: the run
    ends, and the same config gives the same result twice (the event order is fixed)."""
    cfg = load_config(["hardware=cpu_local", "steps=6", "weights.transport=collective"])
    first, second = simulate(cfg, tmp_path / "a"), simulate(cfg, tmp_path / "b")
    assert first.iteration_s == second.iteration_s > 0
    assert any(s["kind"] == "load_weights" and s["info"].get("swap_s") for s in read_spans(tmp_path / "a"))


def test_without_prefetch_a_generate_is_priced_as_before():
    """The transfers' bookkeeping leaves work without transfers untouched."""
    setup = paper_setup("weights.prefetch=false")
    prompts = {"p0": PromptWorkload("p0", 128, (300, 200), 250.0)}
    cluster = SimCluster(setup, prompts)
    cluster.submit(Generate(0, "m0", ("p0",), 0))
    event = cluster.next_event()
    assert cluster.now() == pytest.approx(event.info.end) and event.info.end > 0
