"""Checkpoints and resume through the real loop (``control/loop.py``) over random plans and
random event orders (``OrderedCluster``): the core checkpoints exactly at the multiples of
``save_every`` and once at an interrupt, and a core resumed at a checkpoint's version
continues to the run's total steps with every prompt accounted for."""
from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.control.clusters import OrderedCluster, random_chooser
from mindspeed_rl_asp.control.core import (Checkpoint, ControlConfig, ControlCore, Generate, LoadWeights,
                                           ProtocolError, Publish, TrainStep)
from mindspeed_rl_asp.control.loop import CheckpointFailed, Done, Failed, Loop, Observer, drive
from mindspeed_rl_asp.control.staleness import first_window_gap


class Submitted(Observer):
    """Every action the loop submitted, in order; ``log``: submissions and completions."""

    def __init__(self):
        self.actions, self.log = [], []

    def submitted(self, action, t):
        self.actions.append(action)
        self.log.append(("submitted", action))

    def observed(self, event, core, t):
        if isinstance(event, Done):
            self.log.append(("done", event.action))

    def of(self, kind):
        return [a for a in self.actions if isinstance(a, kind)]


@st.composite
def runs(draw):
    """A config and a plan: minibatches of 1..3 prompts (at most ``staleness x batch + 1``:
    enough for liveness) covering every step and one more step's worth, with room for any
    minibatch; ``save_every`` 1..4."""
    batch, n = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    staleness, steps = draw(st.integers(1, 2)), draw(st.integers(2, 7))
    sizes = []
    while sum(sizes) < (steps + 1) * batch:
        sizes.append(draw(st.integers(1, min(3, staleness * batch + 1))))
    config = ControlConfig(num_actors=draw(st.integers(1, 3)), global_batch_size=batch, n_samples_per_prompt=n,
                           max_staleness=staleness, queue_capacity=(batch + 3) * n, total_steps=steps,
                           refresh_interval=draw(st.integers(1, staleness + 1)),
                           save_every=draw(st.integers(1, 4)))
    # Plans the core refuses (refresh_interval > 1 narrows the window) are not runs.
    assume(first_window_gap(sizes, batch, staleness, config.queue_capacity // n, steps,
                            config.refresh_interval) is None)
    ids = iter(f"p{i}" for i in range(sum(sizes)))
    plan = [(f"m{k}", tuple(next(ids) for _ in range(size))) for k, size in enumerate(sizes)]
    return config, plan


def run_to_end(config, plan, seed):
    seen = Submitted()
    core = ControlCore(config, plan)
    outcome = drive(core, OrderedCluster(random_chooser(seed, fail_rate=0.2, max_failures=3)), seen)
    return core, outcome, seen


@settings(max_examples=200, deadline=None)
@given(run=runs(), seed=st.integers(0, 2**16))
def test_checkpoints_exactly_at_the_multiples_of_save_every(run, seed):
    config, plan = run
    core, outcome, seen = run_to_end(config, plan, seed)
    assert outcome.finish is not None and core.trainer_version == config.total_steps
    saves = seen.of(Checkpoint)
    assert [c.version for c in saves] == list(range(config.save_every, config.total_steps + 1, config.save_every))
    steps = seen.of(TrainStep)
    for save in saves:
        # The state at version v: the prompts of steps 0..v-1, in the order trained.
        trained = [p for step in steps[:save.version] for p in step.prompt_ids]
        assert list(save.consumed) == trained
        assert sum(n for _, n in save.ages) == save.version * config.global_batch_size
        # No step started while it was written: step v is submitted after it is done.
        if save.version < config.total_steps:
            assert seen.log.index(("submitted", steps[save.version])) > seen.log.index(("done", save))
    # Finish waited for the last one.
    assert not any(isinstance(a, Checkpoint) for a in outcome.leftover)


@settings(max_examples=200, deadline=None)
@given(run=runs(), seed=st.integers(0, 2**16), stop_after=st.integers(0, 60))
def test_an_interrupt_checkpoints_the_trainers_version_once(run, seed, stop_after):
    config, plan = run
    seen = Submitted()
    core = ControlCore(config, plan)
    loop = Loop(core, OrderedCluster(random_chooser(seed)), seen)
    for _ in range(stop_after):
        if not loop.advance():
            break
    assume(loop.outcome is None)   # a run that ended first has nothing to interrupt
    loop.interrupt(finish_training=True)
    versions = [c.version for c in seen.of(Checkpoint)]
    assert versions[-1] == core.trainer_version == core.published_version
    assert len(versions) == len(set(versions))   # never the same version twice
    assert all(v % config.save_every == 0 for v in versions[:-1])
    assert not core.in_flight()


def resumed_plan(plan, checkpoint):
    """The saved dispatch list minus the prompts trained, in order (as the shell resumes)."""
    done = set(checkpoint.consumed)
    left = [(mb_id, tuple(p for p in ids if p not in done)) for mb_id, ids in checkpoint.minibatches]
    return [(mb_id, ids) for mb_id, ids in left if ids]


@settings(max_examples=200, deadline=None)
@given(run=runs(), seed=st.integers(0, 2**16), resume_seed=st.integers(0, 2**16), data=st.data())
def test_a_resumed_core_continues_to_the_same_total_steps_with_an_exact_ledger(run, seed, resume_seed, data):
    config, plan = run
    _, _, first = run_to_end(config, plan, seed)
    before_the_end = [c for c in first.of(Checkpoint) if c.version < config.total_steps]
    assume(before_the_end)   # a checkpoint of the last version leaves nothing to resume
    save = data.draw(st.sampled_from(before_the_end))
    rest = resumed_plan(plan, save)
    resumed_config = ControlConfig(**{**config.__dict__, "start_version": save.version})
    core, outcome, seen = run_to_end(resumed_config, rest, resume_seed)
    b, v = config.global_batch_size, save.version
    assert core.trainer_version == config.total_steps and outcome.finish.steps == config.total_steps
    # The run's own versions: steps v.., publishes v+1.., generation with v or later.
    assert [t.step for t in seen.of(TrainStep)] == list(range(v, config.total_steps))
    assert [p.version for p in seen.of(Publish)] == list(range(v + 1, config.total_steps + 1))
    assert min(g.version for g in seen.of(Generate)) >= v
    assert all(a.version > v for a in seen.of(LoadWeights))
    assert all(0 <= t.step - w <= config.max_staleness for t in seen.of(TrainStep) for w in t.versions)
    # Checkpoints go on at the multiples of save_every past the resumed one.
    assert [c.version for c in seen.of(Checkpoint)] == [
        k for k in range(v + 1, config.total_steps + 1) if k % config.save_every == 0]
    # Ledger: the resumed plan's prompts are partitioned; with the first segment's trained
    # ones, every step took b prompts and no prompt was trained twice.
    ledger = core.ledger()
    ids = {p for _, mb in rest for p in mb}
    parts = [ledger.pending, ledger.running, ledger.queued, ledger.consumed, ledger.rejected]
    assert set().union(*parts) == ids and sum(map(len, parts)) == len(ids)
    trained = list(save.consumed) + core.consumed_ids()
    assert len(trained) == config.total_steps * b and len(set(trained)) == len(trained)


def test_a_failed_checkpoint_stops_the_run_and_names_its_cause():
    config = ControlConfig(num_actors=1, global_batch_size=1, n_samples_per_prompt=1, max_staleness=1,
                           queue_capacity=4, total_steps=2, save_every=1)
    core = ControlCore(config, [("m0", ("p0",)), ("m1", ("p1",))])
    full = OSError(28, "No space left on device", "checkpoints/step_000001.partial/manifest.json")

    class DiskFull(OrderedCluster):
        def next_event(self):
            event = super().next_event()
            if isinstance(event.action, Checkpoint):
                return Failed(event.action, str(full), info=full)
            return event

    with pytest.raises(CheckpointFailed, match="checkpoint of version 1 failed") as raised:
        drive(core, DiskFull(random_chooser(0)))
    assert raised.value.cause is full and core.trainer_version == 1


def test_a_checkpoint_reported_for_another_version_is_a_protocol_error():
    config = ControlConfig(num_actors=1, global_batch_size=1, n_samples_per_prompt=1, max_staleness=1,
                           queue_capacity=4, total_steps=2, save_every=1)
    core = ControlCore(config, [("m0", ("p0",)), ("m1", ("p1",))])
    with pytest.raises(ProtocolError, match="checkpoint of version 1 reported written; the checkpoint being "
                                            "written is None"):
        core.on_checkpointed(1)


def test_a_start_version_with_nothing_left_to_train_is_refused():
    with pytest.raises(ValueError, match="start_version=4 leaves nothing to train: total_steps=4"):
        ControlConfig(num_actors=1, global_batch_size=1, n_samples_per_prompt=1, max_staleness=1,
                      queue_capacity=4, total_steps=4, start_version=4)


def test_a_start_version_past_the_plans_steps_is_refused_with_the_numbers():
    config = ControlConfig(num_actors=1, global_batch_size=2, n_samples_per_prompt=1, max_staleness=1,
                           queue_capacity=4, total_steps=5, start_version=2)
    with pytest.raises(ValueError, match=r"total_steps=5 from start_version=2 needs 6 prompts .* enough for 2 steps"):
        ControlCore(config, [("m0", ("a", "b")), ("m1", ("c", "d"))])


def test_without_save_every_no_checkpoint_is_issued_even_at_an_interrupt():
    config = ControlConfig(num_actors=1, global_batch_size=1, n_samples_per_prompt=1, max_staleness=1,
                           queue_capacity=4, total_steps=2)
    seen = Submitted()
    core = ControlCore(config, [("m0", ("p0",)), ("m1", ("p1",))])
    loop = Loop(core, OrderedCluster(random_chooser(0)), seen)
    loop.advance()
    loop.interrupt(finish_training=True)
    assert seen.of(Checkpoint) == [] and not isinstance(loop.outcome, Done)
