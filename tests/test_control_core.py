"""Hand-written scenarios for ControlCore (the properties live in test_control_properties)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from mindspeed_rl_asp.config.schema import ModeConfig, RootConfig
from mindspeed_rl_asp.control.clusters import OrderedCluster
from mindspeed_rl_asp.control.core import (ControlConfig, ControlCore, Finish, Generate, LoadWeights,
                                           ProtocolError, Publish, TrainStep, minibatches_from_plan)
from mindspeed_rl_asp.control.loop import Observer, drive


def single_prompt_plan(count: int) -> list[tuple[str, tuple[str, ...]]]:
    return [(f"m{i}", (f"p{i}",)) for i in range(count)]


def plan_of(*sizes: int) -> list[tuple[str, tuple[str, ...]]]:
    out, k = [], 0
    for m, size in enumerate(sizes):
        out.append((f"m{m}", tuple(f"p{k + j}" for j in range(size))))
        k += size
    return out


def config(**kw) -> ControlConfig:
    base = dict(num_actors=1, global_batch_size=1, n_samples_per_prompt=1, max_staleness=1,
                queue_capacity=64, high_watermark=1.0, low_watermark=0.0)
    base.update(kw)
    return ControlConfig(**base)


def publish(core, version) -> None:
    """The poll after a step issues exactly the publish of its version; report it done."""
    assert core.poll() == [Publish(version)]
    core.on_published(version)


def gen(actor, mb, version, core) -> Generate:
    return Generate(actor, mb, core.dispatcher.minibatches[core.dispatcher.index_of[mb]].prompt_ids, version)


# ---------------------------------------------------------------------- staleness
def test_slow_minibatch_overtaken_makes_the_trainer_wait():
    core = ControlCore(config(num_actors=3, global_batch_size=2, total_steps=3), single_prompt_plan(8))
    assert core.poll() == [gen(0, "m0", 0, core), gen(1, "m1", 0, core), gen(2, "m2", 0, core)]
    core.on_generated(1, "m1")
    assert core.poll() == [gen(1, "m3", 0, core)]          # admission: 4 = (1 + 0 + 1) x 2
    core.on_generated(2, "m2")
    assert core.poll() == [TrainStep(0, ("p1", "p2"), (0, 0))]
    core.on_generated(1, "m3")
    core.on_train_step_done(0)
    assert core.poll() == [Publish(1)]                     # step 1 waits for version 1
    assert core.poll() == [] and core.snapshot().trainer_wait == "publish"
    core.on_published(1)
    assert core.poll() == [LoadWeights(1, 1), LoadWeights(2, 1)]
    core.on_weights_loaded(1, 1)
    core.on_weights_loaded(2, 1)
    assert core.poll() == [gen(1, "m4", 1, core), gen(2, "m5", 1, core)]
    core.on_generated(1, "m4")
    core.on_generated(2, "m5")
    # Three groups queued, but m0 (version 0, due at step 1) still runs: the trainer waits.
    assert core.poll() == []
    snap = core.snapshot()
    assert snap.trainer_wait == "deadline" and snap.queued_prompts == 3
    core.on_generated(0, "m0")
    step1 = [a for a in core.poll() if isinstance(a, TrainStep)]
    assert step1 == [TrainStep(1, ("p3", "p0"), (0, 0))]  # oldest version first, then arrival
    assert core.snapshot().age_histogram == {0: 2, 1: 2}


def test_waiting_only_for_prompts_due_now_is_not_enough():
    """max_staleness=2, batch 1: p1 and p2 (version 0) are both due by step 2. If step 1
    took the fresh p3, step 2 could hold only one of them. The trainer must wait at step 1
    although no running prompt is due at step 1 itself."""
    core = ControlCore(config(num_actors=3, max_staleness=2), single_prompt_plan(6))
    assert [a.minibatch_id for a in core.poll()] == ["m0", "m1", "m2"]
    core.on_generated(0, "m0")
    assert core.poll() == [TrainStep(0, ("p0",), (0,))]
    core.on_train_step_done(0)
    publish(core, 1)
    assert core.poll() == [LoadWeights(0, 1)]
    core.on_weights_loaded(0, 1)
    assert core.poll() == [gen(0, "m3", 1, core)]
    core.on_generated(0, "m3")
    assert core.poll() == []
    assert core.snapshot().trainer_wait == "deadline"
    core.on_generated(2, "m2")
    assert core.poll()[0] == TrainStep(1, ("p2",), (0,))
    core.on_train_step_done(1)
    publish(core, 2)
    core.poll()
    assert core.snapshot().trainer_wait == "deadline"     # p1 is due now
    core.on_generated(1, "m1")
    assert core.poll()[0] == TrainStep(2, ("p1",), (0,))
    assert max(core.ages) == 2


# ---------------------------------------------------------------------- synchronous / hybrid
def first_of_kinds(pending):
    """End loads first, then generation, then training, then the publish (oldest first)."""
    order = (LoadWeights, Generate, TrainStep, Publish)
    return min(range(len(pending)), key=lambda i: (order.index(type(pending[i])), i)), False


class Trace(Observer):
    """The action batches the loop submitted, one list per poll that issued something."""

    def __init__(self) -> None:
        self.batches: list[list[object]] = []
        self._events = -1

    def submitted(self, action, t) -> None:
        if self._events != t:
            self.batches.append([])
            self._events = t
        self.batches[-1].append(action)

    def finished(self, outcome, core, t) -> None:
        self.batches.append([outcome.finish])


def drive_synchronously(core: ControlCore) -> list[list[object]]:
    """Run the loop with events in a fixed order (loads, generation, training, publish);
    returns the action batches of every poll that returned something."""
    trace = Trace()
    drive(core, OrderedCluster(first_of_kinds), trace)
    return trace.batches


@pytest.mark.parametrize("colocated", [False, True])
def test_max_staleness_zero_is_the_synchronous_pattern(colocated):
    cfg = config(num_actors=2, global_batch_size=4, n_samples_per_prompt=2, max_staleness=0,
                 queue_capacity=8, colocated=colocated)
    core = ControlCore(cfg, plan_of(2, 2, 2, 2, 2, 2))
    trace = drive_synchronously(core)
    kinds = [[type(a).__name__ for a in batch] for batch in trace]
    assert kinds == [
        ["Generate", "Generate"], ["TrainStep"], ["Publish"], ["LoadWeights", "LoadWeights"],
        ["Generate"], ["Generate"], ["TrainStep"], ["Publish"], ["LoadWeights", "LoadWeights"],
        ["Generate"], ["Generate"], ["TrainStep"], ["Publish"], ["Finish"]]
    steps = [a for batch in trace for a in batch if isinstance(a, TrainStep)]
    assert [set(s.versions) for s in steps] == [{0}, {1}, {2}]
    gens = [a for batch in trace for a in batch if isinstance(a, Generate)]
    assert [g.version for g in gens] == [0, 0, 1, 1, 2, 2]
    assert core.ages == {0: 12}


def test_colocated_never_overlaps_and_drains_generation_for_a_ready_step():
    plan = single_prompt_plan(6)
    free = ControlCore(config(num_actors=2, max_staleness=2), plan)
    colo = ControlCore(config(num_actors=2, max_staleness=2, colocated=True), plan)
    for core in (free, colo):
        assert [a.minibatch_id for a in core.poll()] == ["m0", "m1"]
        core.on_generated(0, "m0")
    # Decoupled: train step 0 and keep actor 0 busy at once.
    assert free.poll() == [TrainStep(0, ("p0",), (0,)), gen(0, "m2", 0, free)]
    # Colocated: step 0 is ready, so no new generation; it waits for m1 to drain.
    assert colo.poll() == []
    assert colo.snapshot().trainer_wait == "colocated"
    colo.on_generated(1, "m1")
    assert colo.poll() == [TrainStep(0, ("p0",), (0,))]
    assert colo.snapshot().training_step == 0
    colo.on_train_step_done(0)
    publish(colo, 1)
    # The queue still holds p1 for step 1, so the trainer goes first again.
    assert colo.poll() == [TrainStep(1, ("p1",), (0,))]
    colo.on_train_step_done(1)
    publish(colo, 2)
    assert colo.poll() == [LoadWeights(0, 2), LoadWeights(1, 2)]


def test_hybrid_from_root_config():
    root = RootConfig(mode=ModeConfig(name="hybrid", max_staleness=0, high_watermark=1.0,
                                      low_watermark=0.0))
    cfg = ControlConfig.from_root(root, num_actors=2)
    assert cfg.colocated and cfg.max_staleness == 0 and cfg.total_steps == root.steps
    assert cfg.global_batch_size == root.rl.global_batch_size
    assert not ControlConfig.from_root(RootConfig(), num_actors=2, total_steps=3).colocated


# ---------------------------------------------------------------------- queue watermarks
def test_watermarks_throttle_above_high_and_resume_below_low():
    cfg = config(max_staleness=7, queue_capacity=8, high_watermark=0.5, low_watermark=0.25,
                 total_steps=6)
    core = ControlCore(cfg, single_prompt_plan(12))
    assert core.poll() == [gen(0, "m0", 0, core)]
    core.on_generated(0, "m0")
    assert core.poll() == [TrainStep(0, ("p0",), (0,)), gen(0, "m1", 0, core)]
    for k in (1, 2, 3):                      # step 0 keeps training; the queue fills
        core.on_generated(0, f"m{k}")
        assert core.poll() == [gen(0, f"m{k + 1}", 0, core)]
    core.on_generated(0, "m4")               # 4 queued = 0.5 x 8: throttled
    assert core.poll() == []
    snap = core.snapshot()
    assert snap.throttled and snap.queued_samples == 4 and snap.in_flight_samples == 0
    assert core.queue.fits(1) and core.staleness.admits(1, 0)   # only the throttle holds it
    core.on_train_step_done(0)
    publish(core, 1)
    assert core.poll() == [TrainStep(1, ("p1",), (0,)), LoadWeights(0, 1)]
    core.on_weights_loaded(0, 1)
    assert core.poll() == []                 # 3 queued: between the watermarks, still throttled
    assert core.snapshot().throttled
    core.on_train_step_done(1)
    publish(core, 2)
    acts = core.poll()                       # step 2 leaves 2 = 0.25 x 8 queued: released
    assert acts == [TrainStep(2, ("p2",), (0,)), LoadWeights(0, 2)]
    assert not core.snapshot().throttled
    core.on_weights_loaded(0, 2)
    assert core.poll() == [gen(0, "m5", 2, core)]


def test_throttle_never_starves_the_trainer():
    """A low watermark above what one step needs would freeze a throttled queue; the
    core feeds the actors anyway while queued + running prompts cannot fill a step."""
    cfg = config(global_batch_size=4, max_staleness=3, queue_capacity=8, high_watermark=0.25,
                 low_watermark=0.25)
    core = ControlCore(cfg, single_prompt_plan(8))
    for k in range(4):
        assert core.poll() == [gen(0, f"m{k}", 0, core)]
        core.on_generated(0, f"m{k}")
        assert core.snapshot().throttled == (k >= 1)
    assert core.poll() == [TrainStep(0, ("p0", "p1", "p2", "p3"), (0, 0, 0, 0)),
                           gen(0, "m4", 0, core)]


def test_capacity_counts_in_flight_samples():
    cfg = config(num_actors=4, global_batch_size=2, n_samples_per_prompt=2, max_staleness=3,
                 queue_capacity=8)
    core = ControlCore(cfg, plan_of(2, 2, 2, 2))
    actions = core.poll()
    assert [a.minibatch_id for a in actions] == ["m0", "m1"]      # 2 x 2 x 2 = 8 samples
    snap = core.snapshot()
    assert snap.in_flight_samples == 8 and snap.queued_samples == 0
    assert [a.status for a in snap.actors] == ["generating", "generating", "idle", "idle"]


# ---------------------------------------------------------------------- failures and protocol
def test_failed_minibatch_is_redispatched_first_and_never_duplicated():
    core = ControlCore(config(num_actors=2, global_batch_size=2, max_staleness=3), plan_of(2, 2, 2, 2))
    assert core.poll() == [gen(0, "m0", 0, core), gen(1, "m1", 0, core)]
    core.on_minibatch_failed(1, "m1")
    core.on_minibatch_failed(0, "m0")
    assert core.ledger().pending >= {"p0", "p1", "p2", "p3"}
    assert core.snapshot().retry_minibatches == 2
    assert core.poll() == [gen(0, "m0", 0, core), gen(1, "m1", 0, core)]   # plan order, before m2
    with pytest.raises(ProtocolError):
        core.on_generated(0, "m1")           # m1 now belongs to actor 1
    with pytest.raises(ProtocolError):
        core.on_generated(1, "m2")           # never dispatched
    core.on_generated(1, "m1")
    with pytest.raises(ProtocolError):
        core.on_generated(1, "m1")           # a second completion is refused
    core.on_generated(0, "m0")
    consumed = [p for a in core.poll() if isinstance(a, TrainStep) for p in a.prompt_ids]
    assert consumed == ["p2", "p3"]           # m1 arrived first
    led = core.ledger()
    assert led.consumed == {"p2", "p3"} and led.queued == {"p0", "p1"}


def test_retry_is_not_new_work_for_the_throttle():
    """A failed minibatch was already admitted once: it goes back out even while throttled."""
    cfg = config(num_actors=2, max_staleness=7, queue_capacity=4, high_watermark=0.5,
                 low_watermark=0.0)
    core = ControlCore(cfg, single_prompt_plan(6))
    assert core.poll() == [gen(0, "m0", 0, core), gen(1, "m1", 0, core)]
    core.on_generated(0, "m0")
    assert core.poll() == [TrainStep(0, ("p0",), (0,)), gen(0, "m2", 0, core)]
    core.on_generated(1, "m1")
    assert core.poll() == [gen(1, "m3", 0, core)]
    core.on_generated(0, "m2")                 # 2 queued = 0.5 x 4: throttled
    assert core.poll() == [] and core.snapshot().throttled
    core.on_minibatch_failed(1, "m3")
    assert core.poll() == [gen(0, "m3", 0, core)]   # the retry; m4 stays throttled


def test_protocol_errors_leave_state_unchanged():
    core = ControlCore(config(num_actors=2), single_prompt_plan(4))
    core.poll()
    before = core.snapshot()
    for bad in (lambda: core.on_generated(5, "m0"), lambda: core.on_generated(0, "nope"),
                lambda: core.on_minibatch_failed(1, "m0"), lambda: core.on_weights_loaded(0, 1),
                lambda: core.on_train_step_done(0), lambda: core.on_published(1),
                lambda: core.on_published(0)):
        with pytest.raises(ProtocolError):
            bad()
        assert core.snapshot() == before


# ---------------------------------------------------------------------- end of run
def test_finish_reports_unused_prompts_by_reason():
    cfg = config(num_actors=2, global_batch_size=4, max_staleness=1, queue_capacity=8, total_steps=1)
    core = ControlCore(cfg, plan_of(3, 3, 3))
    assert [a.minibatch_id for a in core.poll()] == ["m0", "m1"]   # 6 >= 4 needed: m2 never goes
    core.on_generated(1, "m1")
    core.on_generated(0, "m0")
    assert core.poll() == [TrainStep(0, ("p3", "p4", "p5", "p0"), (0,) * 4)]
    core.on_train_step_done(0)
    publish(core, 1)                          # Finish only once the last version is published
    assert core.poll() == [Finish(1, not_dispatched=("p6", "p7", "p8"), queued=("p1", "p2"))]
    assert core.poll() == [] and core.snapshot().finished


def test_last_step_does_not_wait_for_work_no_step_needs():
    core = ControlCore(config(num_actors=2, global_batch_size=2, total_steps=1), plan_of(1, 2))
    assert [a.minibatch_id for a in core.poll()] == ["m0", "m1"]
    core.on_generated(1, "m1")
    assert core.poll() == [TrainStep(0, ("p1", "p2"), (0, 0))]
    core.on_train_step_done(0)
    publish(core, 1)
    assert core.poll() == [Finish(1, running=("p0",))]
    assert core.in_flight() == [gen(0, "m0", 0, core)]   # the loop cancels or drains it
    core.on_generated(0, "m0")                # late completion after Finish: bookkeeping only
    assert core.poll() == []


# ---------------------------------------------------------------------- validation and adapters
@pytest.mark.parametrize("kw, plan, match", [
    (dict(global_batch_size=4, n_samples_per_prompt=2, queue_capacity=7), plan_of(4), "cannot hold one step"),
    (dict(global_batch_size=2, n_samples_per_prompt=2, queue_capacity=8), plan_of(5), "cannot hold minibatch 'm0'"),
    (dict(global_batch_size=4, max_staleness=0), plan_of(3, 3, 2), "step 0 can never be filled"),
    (dict(global_batch_size=4, max_staleness=1, queue_capacity=4), plan_of(3, 3, 2), "step 0 can never be filled"),
    (dict(global_batch_size=2, total_steps=3), plan_of(2, 2), "total_steps=3 needs 6 prompts"),
    (dict(global_batch_size=4), plan_of(3), "fewer than one step"),
    (dict(), [("a", ("x",)), ("a", ("y",))], "duplicate minibatch id 'a'"),
    (dict(), [("a", ("x",)), ("b", ("x",))], "prompt id 'x' appears twice"),
    (dict(), [("a", ())], "minibatch 'a' is empty"),
    (dict(), [], "the plan is empty"),
    (dict(), [("a", "xy")], "not a str"),
    (dict(max_staleness=-1), plan_of(1), "max_staleness=-1 must be >= 0"),
    (dict(num_actors=True), plan_of(1), "num_actors=True must be an int"),
    (dict(high_watermark=0.2, low_watermark=0.5), plan_of(1), "watermarks"),
])
def test_invalid_configs_and_plans_name_the_values(kw, plan, match):
    with pytest.raises(ValueError, match=match):
        ControlCore(config(**kw), plan)


def test_plan_adapter_reads_groups_of_ids():
    mb = lambda *ids: SimpleNamespace(ids=ids)  # noqa: E731
    plan = SimpleNamespace(groups=((mb("a", "b"), mb("c")), (mb("d"),)))
    assert [(m.minibatch_id, m.prompt_ids) for m in minibatches_from_plan(plan)] == [
        ("g0m0", ("a", "b")), ("g0m1", ("c",)), ("g1m0", ("d",))]
    core = ControlCore(config(global_batch_size=2), plan)
    assert core.total_steps == 2
    assert core.poll()[0] == Generate(0, "g0m0", ("a", "b"), 0)


@pytest.mark.parametrize("mode, planner", [("async", "asp"), ("hybrid", "fifo")])
def test_runs_a_real_schedule_plan_to_the_end(mode, planner):
    """Contract with the scheduler: a SchedulePlan (groups -> minibatches -> ids) drives
    the core with the shipped defaults."""
    from mindspeed_rl_asp.schedule.plan import SchedulerParams, make_plan

    root = RootConfig()
    if mode == "hybrid":
        root = RootConfig(mode=ModeConfig(name="hybrid", max_staleness=0, high_watermark=1.0,
                                          low_watermark=0.0))
    base = root.rl.global_batch_size if planner == "fifo" else root.scheduler.base_batch_size
    params = SchedulerParams(name=planner, base_batch_size=base,
                             slack=0 if planner == "fifo" else root.scheduler.slack,
                             group_size=root.scheduler.group_size)
    items = [(f"q{i}", float((37 * i) % 400 + 10)) for i in range(root.steps * root.rl.global_batch_size)]
    plan = make_plan(items, params, n_samples_per_prompt=root.rl.n_samples_per_prompt)
    core = ControlCore(ControlConfig.from_root(root, num_actors=2), plan)
    trace = drive_synchronously(core)
    assert isinstance(trace[-1][-1], Finish) and core.trainer_version == root.steps
    assert max(core.ages) <= root.mode.max_staleness
