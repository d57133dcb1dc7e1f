"""A CPU host in the simulator: the serial step model (a step's parts add up on one
core, a generate call has a fixed cost) and processor sharing of the host's cores."""
from __future__ import annotations

import dataclasses
import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.control.core import Generate, TrainStep
from mindspeed_rl_asp.sim.batching import static_minibatch
from mindspeed_rl_asp.sim.cluster import SimCluster
from mindspeed_rl_asp.sim.costs import (decode_memory_time, decode_step_time, padded_tokens, padded_training_time,
                                        prefill_time, training_time)
from mindspeed_rl_asp.sim.profiles import ProfileError, hardware_profile_from_config
from mindspeed_rl_asp.sim.run import setup_from_config


@functools.lru_cache(maxsize=None)
def cpu_setup(cores: int = 2):
    """The cpu_local setup with ``cores`` shared cores and no co-running or time-slicing slowdown."""
    setup = setup_from_config(load_config(["hardware=cpu_local"]))
    hw = dataclasses.replace(setup.instance.hardware, host_cores=cores, corun_slowdown=0.0, timeslice_slowdown=0.0)
    return dataclasses.replace(setup, instance=dataclasses.replace(setup.instance, hardware=hw), host_cores=cores,
                               corun_slowdown=0.0, timeslice_slowdown=0.0)


class PricedCluster(SimCluster):
    """The real cluster with each action's CPU seconds given by the test."""

    def __init__(self, setup, seconds):
        super().__init__(setup, prompts={})
        self.seconds = seconds

    def _price(self, action, start):
        return self.seconds[action], None


def generate(actor: int) -> Generate:
    return Generate(actor=actor, minibatch_id=f"m{actor}", prompt_ids=(f"p{actor}",), version=0)


def ends(cluster, count):
    out = {}
    for _ in range(count):
        event = cluster.next_event()
        out[event.action] = cluster.now()
    return out


def test_the_cpu_profile_is_serial_on_shared_cores():
    setup = setup_from_config(load_config([]))
    assert setup.instance.engine.execution == "serial" and setup.instance.engine.call_overhead > 0
    assert setup.host_cores == setup.instance.hardware.host_cores >= 1
    assert setup.corun_slowdown == setup.instance.hardware.corun_slowdown >= 0
    assert setup.timeslice_slowdown == setup.instance.hardware.timeslice_slowdown >= 0


def test_serial_step_adds_overhead_compute_and_memory():
    inst = cpu_setup().instance
    model, hw, eng = inst.model, inst.hardware, inst.engine
    compute = 2.0 * model.matmul_params * 16 / (hw.peak_flops * hw.inference_compute_efficiency)
    memory = decode_memory_time(model, hw, 1, 16, 16 * 100)
    assert decode_step_time(model, hw, eng, 1, 16, 16 * 100) == pytest.approx(
        eng.decode_step_overhead + compute + memory, rel=1e-12)


def test_serial_prefill_adds_the_weight_read_at_the_prefill_efficiency():
    inst = cpu_setup().instance
    model, hw = inst.model, inst.hardware
    assert hw.prefill_efficiency == hw.prefill_compute_efficiency != hw.inference_compute_efficiency
    compute = 2.0 * model.matmul_params * 800 / (hw.peak_flops * hw.prefill_compute_efficiency)
    assert prefill_time(model, hw, 1, 800, serial=True) == pytest.approx(
        compute + decode_memory_time(model, hw, 1, 800, 0), rel=1e-12)


def test_a_static_call_pays_the_call_overhead_once_per_batch():
    inst = cpu_setup().instance
    free = dataclasses.replace(inst, engine=dataclasses.replace(inst.engine, call_overhead=0.0))
    with_cost, without = static_minibatch(inst, [60] * 8, [20] * 8), static_minibatch(free, [60] * 8, [20] * 8)
    assert with_cost.duration - without.duration == pytest.approx(inst.engine.call_overhead, rel=1e-9)


@pytest.mark.parametrize("cores, expected", [(1, [2.0, 2.0]), (2, [1.0, 1.0]), (4, [1.0, 1.0])])
def test_two_equal_jobs_share_the_cores(cores, expected):
    a, b = generate(0), generate(1)
    cluster = PricedCluster(cpu_setup(cores), {a: 1.0, b: 1.0})
    cluster.submit(a)
    cluster.submit(b)
    got = ends(cluster, 2)
    assert [got[a], got[b]] == pytest.approx(expected)


def test_busy_cores_slow_each_other_by_the_measured_share():
    a, b, c = generate(0), generate(1), generate(2)
    setup = dataclasses.replace(cpu_setup(2), corun_slowdown=0.25)
    cluster = PricedCluster(setup, {a: 1.0, b: 1.0})
    cluster.submit(a)
    cluster.submit(b)
    got = ends(cluster, 2)
    assert [got[a], got[b]] == pytest.approx([1.25, 1.25])   # both cores busy: each at 1 / 1.25
    alone = PricedCluster(setup, {c: 1.0})
    alone.submit(c)
    assert ends(alone, 1)[c] == pytest.approx(1.0)            # one busy core runs at full speed


def test_more_threads_than_cores_pay_the_time_slicing_share():
    a, b, c = generate(0), generate(1), generate(2)
    setup = dataclasses.replace(cpu_setup(2), corun_slowdown=0.25, timeslice_slowdown=0.5)
    cluster = PricedCluster(setup, {a: 1.0, b: 1.0, c: 1.0})
    for action in (a, b, c):
        cluster.submit(action)
    got = ends(cluster, 3)
    # Three on two cores: each at (2/3) / (1.25 x 1.5) = 16/45 a second; all end together at 45/16.
    assert [got[a], got[b], got[c]] == pytest.approx([45 / 16] * 3)


def test_three_jobs_on_two_cores_run_at_two_thirds_until_one_ends():
    a, b, c = generate(0), generate(1), TrainStep(step=0, prompt_ids=("p0",), versions=(0,))
    cluster = PricedCluster(cpu_setup(2), {a: 1.0, b: 2.0, c: 2.0})
    for action in (a, b, c):
        cluster.submit(action)
    got = ends(cluster, 3)
    # 3 jobs at 2/3: a ends at 1.5 (b, c have 1.0 left); then 2 jobs at full speed: 2.5.
    assert got[a] == pytest.approx(1.5) and got[b] == pytest.approx(2.5) and got[c] == pytest.approx(2.5)


def test_a_report_ends_when_the_shared_work_really_ends():
    setup = setup_from_config(load_config([]))
    prompts_cfg = load_config([])
    from mindspeed_rl_asp.sim.run import workload_from_config

    workload = workload_from_config(prompts_cfg)
    cluster = SimCluster(dataclasses.replace(setup, host_cores=1, corun_slowdown=0.0, timeslice_slowdown=0.0),
                         {p.id: p for p in workload.prompts})
    ids = [p.id for p in workload.prompts[:2]]
    first, second = (Generate(actor=k, minibatch_id=f"m{k}", prompt_ids=(ids[k],), version=0) for k in (0, 1))
    cluster.submit(first)
    cluster.submit(second)
    events = [cluster.next_event(), cluster.next_event()]
    prices = {first: cluster.timings["m0"].duration, second: cluster.timings["m1"].duration}
    # One core: the shorter job ends at twice its price, the other at the sum of both.
    short, long_ = sorted(prices, key=prices.get)
    by_action = {e.action: e.info for e in events}
    assert by_action[short].end == pytest.approx(2 * prices[short])
    assert by_action[long_].end == pytest.approx(prices[short] + prices[long_])


@settings(max_examples=80, deadline=None)
@given(cores=st.integers(1, 4), work=st.lists(st.floats(0.01, 10.0), min_size=1, max_size=8),
       cancel=st.integers(0, 7))
def test_processor_sharing_conserves_work(cores, work, cancel):
    """The cores never do more than cores x elapsed seconds, never less than the work
    needs when every job runs, and never run one job faster than one core."""
    actions = [generate(k) for k in range(len(work))]
    cluster = PricedCluster(cpu_setup(cores), dict(zip(actions, work)))
    for action in actions:
        cluster.submit(action)
    dropped = actions[cancel] if cancel < len(actions) else None
    if dropped is not None and len(actions) > 1:
        cluster.cancel([dropped])
    live = [a for a in actions if not (dropped is not None and len(actions) > 1 and a == dropped)]
    got = ends(cluster, len(live))
    total = sum(work[actions.index(a)] for a in live)
    makespan = max(got.values())
    assert makespan >= total / cores - 1e-9
    assert makespan <= total + 1e-9
    for a in live:
        assert got[a] >= work[actions.index(a)] - 1e-9


def test_host_cores_and_the_corun_slowdown_are_checked_and_sourced():
    from omegaconf import OmegaConf

    base = OmegaConf.to_container(load_config(["hardware=cpu_local"]).hardware)
    assert hardware_profile_from_config({**base, "corun_slowdown": 0}).corun_slowdown == 0.0   # measured: none
    assert hardware_profile_from_config({**base, "timeslice_slowdown": 0}).timeslice_slowdown == 0.0
    for key, value, words in (("host_cores", 1.5, "whole number"), ("host_cores", 0, "must be > 0"),
                              ("corun_slowdown", -0.1, "must be > 0"), ("timeslice_slowdown", -1, "must be > 0")):
        with pytest.raises(ProfileError, match=words):
            hardware_profile_from_config({**base, key: value})
    with pytest.raises(ProfileError, match="sources.host_cores"):
        hardware_profile_from_config({**base, "sources": {**base["sources"], "host_cores": ""}})


def test_padded_tokens_by_hand():
    # Rows (prompt, response) (3, 5) and (7, 1) pad to 7 + 5 = 12 each; (2, 2) and (4, 9) to 4 + 9 = 13.
    tokens, squares = padded_tokens([3, 7, 2, 4], [5, 1, 2, 9], 2)
    assert tokens == 2 * 12 + 2 * 13 and squares == 2 * 144 + 2 * 169


def test_a_padded_trainer_prices_micro_batches_and_one_padded_no_grad_pass():
    inst = cpu_setup().instance
    model, hw = inst.model, inst.hardware
    prompts, lengths = [60, 200, 80, 90], [10, 40, 5, 70]
    update_tokens, update_squares = padded_tokens(prompts, lengths, 2)
    step_tokens, step_squares = padded_tokens(prompts, lengths, 4)
    expected = (training_time(model, hw, 1, update_tokens, 0, update_squares)
                + training_time(model, hw, 1, step_tokens, 0, step_squares) / 3)
    assert padded_training_time(model, hw, 1, prompts, lengths, 2, extra_forwards=1) == pytest.approx(expected)
    # Padding only adds work: never cheaper than the packed price of the same rows.
    packed = training_time(model, hw, 1, sum(prompts) + sum(lengths), 1,
                           sum((p + r) ** 2 for p, r in zip(prompts, lengths)))
    assert padded_training_time(model, hw, 1, prompts, lengths, 2, extra_forwards=1) > packed


def test_the_hf_engine_trains_padded_micro_batches_of_the_configured_size():
    setup = setup_from_config(load_config(["rl.micro_batch_size=4"]))
    assert setup.instance.engine.train_layout == "padded" and setup.train_padding_rows == 4
    assert setup_from_config(load_config(["experiment=table3_qwen3_32b_asp"])).train_padding_rows == 0
