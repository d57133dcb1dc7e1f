"""The reject path of ControlCore (DAPO's dynamic sampling, ``filter_groups="std"``).

Unit tests on hand-made states, then property tests through the one loop: the
``Shell`` of test_control_properties.py (every invariant after every event) on a
cluster whose finished minibatches report rewards, some groups with no spread (all
equal: rejected by the rule), in random event orders, with failures, random configs
(hybrid, max_staleness 0, global refresh, ...). Every run must train every step on
``global_batch_size`` accepted groups, never train a rejected one, keep the ledger a
partition of the plan as extended by refills, and count every rejected group.
"""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mindspeed_rl_asp.control.clusters import random_chooser
from mindspeed_rl_asp.control.core import (ControlConfig, ControlCore, Finish, Generate, ProtocolError,
                                           TooManyRejected, TrainStep)
from mindspeed_rl_asp.control.loop import Done, Loop, apply_event
from mindspeed_rl_asp.control.rejection import rejected_groups

from test_control_properties import Shell, budgeted_chooser, check_ledger, raw_setups, setups
from test_replan import ReplanShell

SPREAD, FLAT = (0.0, 1.0), (1.0, 1.0)


def cfg_for(**kw) -> ControlConfig:
    base = dict(num_actors=1, global_batch_size=2, n_samples_per_prompt=2, max_staleness=1,
                queue_capacity=16, high_watermark=1.0, low_watermark=0.0, filter_groups="std")
    base.update(kw)
    return ControlConfig(**base)


def refill_of(mbs):
    """The plan again, as the next pass over the data: new ids ``r{k}.``-prefixed."""
    def refill(k):
        return [(f"r{k}.{mb}", tuple(f"r{k}.{p}" for p in ids)) for mb, ids in mbs]
    return refill


# ---------------------------------------------------------------------- the rule
def test_rule_rejects_exactly_the_groups_without_spread():
    rewards = {"a": [1.0, 1.0, 1.0], "b": [0.0, 0.0], "c": [0.0, 1.0, 1.0], "d": [0.5], "e": [0.3, 0.3 + 1e-12]}
    assert rejected_groups("std", rewards) == ["a", "b"]       # one sample: kept, as in MindSpeed-RL
    assert rejected_groups("none", rewards) == []
    with pytest.raises(ValueError, match="filter_groups='max' must be one of none, std"):
        rejected_groups("max", rewards)
    with pytest.raises(ValueError, match="no reward values"):
        rejected_groups("std", {"a": []})


# ---------------------------------------------------------------------- units
def test_a_rejected_group_gives_back_its_room_and_admission_and_more_is_dispatched():
    core = ControlCore(cfg_for(max_staleness=0, queue_capacity=4), [("m0", ("p0", "p1")), ("m1", ("p2", "p3")),
                                                                    ("m2", ("p4", "p5"))])
    [g] = core.poll()
    assert g.prompt_ids == ("p0", "p1") and core.staleness.admitted == 2
    core.on_generated(0, "m0", {"p0": FLAT, "p1": SPREAD})
    snap = core.snapshot()
    assert (snap.queued_prompts, snap.admitted_prompts, snap.rejected_prompts) == (1, 1, 1)
    assert core.ledger().rejected == {"p0"} and core.ledger().queued == {"p1"}
    # m1 (2 prompts) does not fit the one prompt of admission left at version 0: with
    # nothing in flight the core splits it and sends the part that fits.
    [g] = core.poll()
    assert g == Generate(0, "m1/a", ("p2",), 0)
    assert [mb.minibatch_id for mb in core.dispatcher.minibatches] == ["m0", "m1/a", "m1/b", "m2"]
    core.on_generated(0, "m1/a", {"p2": SPREAD})
    [t] = core.poll()
    assert t == TrainStep(0, ("p1", "p2"), (0, 0))
    assert core.snapshot().extra_minibatches == 0   # m1/a is planned work, pulled forward


def test_only_queued_groups_can_be_rejected_and_a_refusal_changes_nothing():
    core = ControlCore(cfg_for(), [("m0", ("p0", "p1")), ("m1", ("p2", "p3"))])
    core.poll()
    before = (core.snapshot(), core.ledger())
    for bad in (["p0"], ["zz"]):
        with pytest.raises(ProtocolError, match="only queued groups"):
            core.on_groups_rejected(bad)
    core.on_generated(0, "m0", {"p0": SPREAD, "p1": SPREAD})
    with pytest.raises(ProtocolError, match="once each"):
        core.on_groups_rejected(["p0", "p0"])
    assert before[1].running == {"p0", "p1"}
    core.on_groups_rejected(["p0"])
    assert core.ledger().rejected == {"p0"}


def test_missing_rewards_are_refused_when_filtering():
    core = ControlCore(cfg_for(), [("m0", ("p0", "p1")), ("m1", ("p2", "p3"))])
    core.poll()
    before = core.snapshot()
    with pytest.raises(ProtocolError, match="carries no rewards for \\['p1'\\]"):
        core.on_generated(0, "m0", {"p0": SPREAD})
    assert core.snapshot() == before


def test_without_filtering_rewards_are_ignored():
    core = ControlCore(cfg_for(filter_groups="none"), [("m0", ("p0", "p1")), ("m1", ("p2", "p3"))])
    core.poll()
    core.on_generated(0, "m0", {"p0": FLAT, "p1": FLAT})
    assert core.snapshot().queued_prompts == 2 and core.snapshot().rejected_prompts == 0


def test_when_the_plan_runs_out_the_refill_extends_it():
    mbs = [("m0", ("p0", "p1")), ("m1", ("p2", "p3"))]
    core = ControlCore(cfg_for(num_actors=2, max_staleness=1), mbs, refill=refill_of(mbs))
    g0, g1 = core.poll()
    core.on_generated(0, "m0", {"p0": FLAT, "p1": FLAT})
    core.on_generated(1, "m1", {"p2": SPREAD, "p3": FLAT})
    [a] = core.poll()   # total_steps = 2 (4 prompts): admitted is 1, the plan is used up
    assert a == Generate(0, "r1.m0", ("r1.p0", "r1.p1"), 0) and core.refills == 1
    assert core.snapshot().extra_minibatches == 1   # beyond the 4 prompts the 2 steps need
    ledger = core.ledger()
    assert ledger.rejected == {"p0", "p1", "p3"} and ledger.pending == {"r1.p2", "r1.p3"}


def test_without_a_refill_a_plan_used_up_is_a_clear_error():
    core = ControlCore(cfg_for(), [("m0", ("p0", "p1"))])
    core.poll()
    core.on_generated(0, "m0", {"p0": FLAT, "p1": SPREAD})
    with pytest.raises(TooManyRejected, match="ran out"):
        core.poll()


def test_too_many_rejected_for_one_step_stops_the_run():
    mbs = [(f"m{k}", (f"p{2 * k}", f"p{2 * k + 1}")) for k in range(3)]
    core = ControlCore(cfg_for(max_gen_batches=2), mbs, refill=refill_of(mbs))
    loop = Loop(core, _AllFlat())
    # Two generation batches of 2 prompts: more than 2 rejected for step 0 stops it.
    with pytest.raises(TooManyRejected, match=r"rejected 4 prompt groups while step 0 .* "
                                              r"\(algo.max_num_gen_batches=2 - 1\) x global_batch_size=2 = 2"):
        while loop.advance():
            pass
    assert core.trainer_version == 0


class _AllFlat:
    """A cluster on which every group is all-correct: everything is rejected."""

    def __init__(self):
        self.pending = []

    def now(self):
        return 0.0

    def submit(self, action):
        self.pending.append(action)

    def next_event(self):
        a = self.pending.pop(0)
        return Done(a, rewards={p: FLAT for p in a.prompt_ids}) if isinstance(a, Generate) else Done(a)

    def cancel(self, actions):
        pass


def test_one_generation_batch_stops_at_the_first_rejection():
    """max_gen_batches=1 is MindSpeed-RL's default: no batch beyond the first."""
    core = ControlCore(cfg_for(max_gen_batches=1), [("m0", ("p0", "p1")), ("m1", ("p2", "p3"))])
    core.poll()
    core.on_generated(0, "m0", {"p0": SPREAD, "p1": FLAT})
    with pytest.raises(TooManyRejected, match="rejected 1 prompt groups"):
        core.poll()


def test_rejections_after_the_last_step_started_do_not_count():
    core = ControlCore(cfg_for(total_steps=1, max_gen_batches=1), [("m0", ("p0", "p1", "p2"))])
    core.poll()
    core.on_generated(0, "m0", {"p0": SPREAD, "p1": SPREAD, "p2": SPREAD})
    [t] = core.poll()
    assert t.prompt_ids == ("p0", "p1")
    core.on_groups_rejected(["p2"])      # the overshoot group: no step needs it
    assert core._rejected_for_step == 0 and core.ledger().rejected == {"p2"}


# ---------------------------------------------------------------------- through the loop
class RejectShell(Shell):
    """The Shell on a cluster that scores: a finished group's rewards are flat (rejected)
    with the shell's probability, at most ``max_rejections`` in all (so runs end)."""

    def __init__(self, cfg, mbs, chooser=None, reject_rate=0.5, max_rejections=12, seed=0, flat=None,
                 refill=None):
        self.initial = frozenset(p for _, ids in mbs for p in ids)
        self.refill = refill or refill_of(mbs)
        self._init(replace(cfg, filter_groups="std"), mbs, chooser)
        self.rng = random.Random(seed)
        self.reject_rate, self.max_rejections = reject_rate, max_rejections
        self.flat = flat                     # hypothesis: data -> bool, else the rng
        self.rejected_seen: list[str] = []

    def _init(self, cfg, mbs, chooser):
        Shell.__init__(self, cfg, mbs, chooser)
        self.core = ControlCore(cfg, mbs, refill=self.refill)
        self.loop = Loop(self.core, self.cluster, self)
        self.cluster.rewards = self.rewards

    def rewards(self, action):
        out = {}
        n = self.cfg.n_samples_per_prompt
        for p in action.prompt_ids:
            flat = len(self.rejected_seen) < self.max_rejections and (
                self.flat() if self.flat is not None else self.rng.random() < self.reject_rate)
            out[p] = (1.0,) * n if flat or n == 1 else (0.0,) * (n - 1) + (1.0,)
            if flat and n > 1:
                self.rejected_seen.append(p)
        return out

    def check_action(self, a) -> None:
        if isinstance(a, TrainStep):
            assert not set(a.prompt_ids) & set(self.rejected_seen), "a rejected group was trained"
        super().check_action(a)

    def check(self) -> None:
        core = self.core
        ids = set(self.initial)
        for k in range(1, core.refills + 1):
            ids |= {p for _, pids in self.refill(k) for p in pids}
        self.all_ids = frozenset(ids)
        super().check()
        led = core.ledger()
        # Only groups that came back flat are rejected, all of them once they arrived.
        arrived_flat = {p for p in self.rejected_seen if p not in led.running and p not in led.pending}
        assert led.rejected <= set(self.rejected_seen) and arrived_flat <= led.rejected | led.pending
        assert core.snapshot().rejected_prompts == len(led.rejected)
        assert core.snapshot().extra_minibatches <= len(led.rejected)   # none without a rejection
        # I3 with rejections: what is admitted is what runs, is queued or was trained (and,
        # for a resumed core, the prompts of the steps before its start).
        assert core.staleness.admitted == self.start * self.cfg.global_batch_size + len(led.running) + \
            len(led.queued) + len(led.consumed)

    def event_budget(self) -> int:
        """Rejected groups are generated again: room for each prompt up to ``max_rejections`` times."""
        return 8 * (len(self.initial) * (2 + self.max_rejections) + self.core.total_steps + self.cfg.num_actors) + 50

    def check_finish(self) -> None:
        f, cfg = self.finish, self.cfg
        self.check_ids_for_finish()
        assert len(self.consumed) == (f.steps - self.start) * cfg.global_batch_size == \
            (self.core.total_steps - self.start) * cfg.global_batch_size
        parts = [set(f.not_dispatched), set(f.queued), set(f.running), set(f.rejected), set(self.consumed)]
        assert sum(map(len, parts)) == len(self.all_ids) and set().union(*parts) == self.all_ids
        assert set(f.rejected) <= set(self.rejected_seen)
        assert not self.cluster.pending and self.core.in_flight() == []

    def check_ids_for_finish(self) -> None:
        ids = set(self.initial)
        for k in range(1, self.core.refills + 1):
            ids |= {p for _, pids in self.refill(k) for p in pids}
        self.all_ids = frozenset(ids)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=setups(), seed=st.integers(0, 2**16), rate=st.sampled_from([0.2, 0.5, 0.9]),
       starve=st.sampled_from([0.0, 0.9]), cap=st.integers(0, 16))
def test_random_runs_with_rejections_train_every_step_on_accepted_groups(setup, seed, rate, starve, cap):
    shell = RejectShell(*setup, chooser=random_chooser(seed, fail_rate=0.3, max_failures=3, starve=starve),
                        reject_rate=rate, max_rejections=cap, seed=seed)
    for _ in range(random.Random(seed).randrange(0, 10)):
        if not shell.advance():
            break
    if shell.finish is None:
        shell.drain(seed, starve)
    else:
        shell.check_finish()


class RejectMachine(RuleBasedStateMachine):
    """Hypothesis picks the event order, the failures and which groups come back flat."""

    @initialize(setup=setups(), seed=st.integers(0, 2**16), cap=st.integers(0, 12))
    def setup(self, setup, seed, cap) -> None:
        self.data = None
        self.shell = RejectShell(*setup, max_rejections=cap, seed=seed,
                                 flat=lambda: self.data.draw(st.booleans(), label="flat"))
        self.seed = seed
        self.shell.chooser = budgeted_chooser(self, max_failures=4)

    @rule(data=st.data())
    def event(self, data) -> None:
        self.data = data
        self.shell.advance()

    @invariant()
    def invariants(self) -> None:
        if hasattr(self, "shell") and self.shell.finish is None:
            self.shell.check()

    def teardown(self) -> None:
        if hasattr(self, "shell"):
            self.shell.flat = None
            self.shell.drain(self.seed)


RejectMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestRejectMachine = RejectMachine.TestCase


def test_apply_event_passes_rewards_to_the_core():
    core = ControlCore(cfg_for(), [("m0", ("p0", "p1")), ("m1", ("p2", "p3"))])
    [g] = core.poll()
    apply_event(core, Done(g, rewards={"p0": FLAT, "p1": SPREAD}))
    assert core.ledger().rejected == {"p0"}
    assert isinstance(core.poll()[0], Generate)
    assert Finish(0).rejected == ()


class RejectReplanShell(RejectShell, ReplanShell):
    """Rejections and re-plans at random points together, with ReplanShell's checks too
    (no prompt dispatched twice, dispatched minibatches never change, a refused re-plan
    changes nothing)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.dispatched, self.retried, self.replans, self.refusals = {}, set(), 0, 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=setups(), seed=st.integers(0, 2**16), rate=st.sampled_from([0.3, 0.8]), cap=st.integers(1, 12),
       replan_rate=st.sampled_from([0.1, 0.5]))
def test_rejections_and_replans_together_keep_every_invariant(setup, seed, rate, cap, replan_rate):
    rng = random.Random(seed)
    shell = RejectReplanShell(*setup, chooser=random_chooser(seed, fail_rate=0.2, max_failures=2),
                              reject_rate=rate, max_rejections=cap, seed=seed)
    def maybe_replan():
        if rng.random() < replan_rate:
            shell.replan(rng, keep_sizes=rng.random() < 0.5)

    shell.run_to_end(between=maybe_replan)
    assert len(shell.consumed) == len(set(shell.consumed))


@pytest.mark.parametrize("staleness, sizes", [(0, [3, 1, 2, 2]), (1, [1, 4, 1, 2]), (0, [1, 3, 3, 1])])
def test_with_filtering_a_plan_that_skips_a_window_is_split_instead_of_refused(staleness, sizes):
    """Without filtering these plans are refused (a step could never fill); with it the
    core splits the straddling minibatch at quiescence and trains every step."""
    ids = iter(f"p{i}" for i in range(sum(sizes)))
    mbs = [(f"m{k}", tuple(next(ids) for _ in range(s))) for k, s in enumerate(sizes)]
    cfg = cfg_for(max_staleness=staleness, queue_capacity=8, filter_groups="none", num_actors=2)
    with pytest.raises(ValueError, match="can never be filled"):
        ControlCore(cfg, mbs)
    shell = RejectShell(cfg, mbs, max_rejections=0)
    shell.drain(0)
    assert any(mb.minibatch_id.endswith("/a") for mb in shell.core.dispatcher.minibatches)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=raw_setups(), seed=st.integers(0, 2**16), cap=st.integers(0, 10))
def test_with_filtering_every_plan_finishes(setup, seed, cap):
    """Plans not filtered for the window rule (many of them refused without filtering),
    random rejections and event orders: with filtering on every run trains every step."""
    shell = RejectShell(*setup, chooser=random_chooser(seed, fail_rate=0.2, max_failures=2),
                        reject_rate=0.4, max_rejections=cap, seed=seed)
    shell.drain(seed)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=setups(), seed=st.integers(0, 2**16), cap=st.integers(0, 12), at=st.integers(1, 4))
def test_a_run_resumed_after_rejections_trains_every_step_and_no_id_twice(setup, seed, cap, at):
    """A checkpoint after version ``at`` is published (what runtime/checkpoint.py keeps: the
    dispatch list, refills and splits included, and the prompts trained), then a fresh core
    started at version ``at`` over the dispatch list minus what was trained, refilled past
    the epochs already used (schedule/planning.refill_passes), as the driver builds it. Both
    segments have rejections at random; together they train every step, never one prompt
    id twice, and the second trains steps ``at..total - 1`` by their own numbers."""
    from mindspeed_rl_asp.runtime.checkpoint import remaining_minibatches
    from mindspeed_rl_asp.schedule.planning import refill_passes

    cfg, mbs = setup
    total = sum(len(ids) for _, ids in mbs) // cfg.global_batch_size if cfg.total_steps is None else cfg.total_steps
    at = min(at, total - 1)
    first = RejectShell(cfg, mbs, chooser=random_chooser(seed), max_rejections=cap, seed=seed,
                        refill=refill_passes(mbs))
    while first.core.published_version < at and first.advance():
        pass
    assert first.core.published_version == at
    trained = first.core.consumed_ids()[:at * cfg.global_batch_size]       # steps 0..at-1
    saved = [(mb.minibatch_id, mb.prompt_ids) for mb in first.core.dispatcher.minibatches]
    rest = remaining_minibatches(saved, trained)
    second = RejectShell(replace(cfg, total_steps=total, start_version=at), rest, chooser=random_chooser(seed + 1),
                         max_rejections=cap, seed=seed + 1, refill=refill_passes(rest, taken=trained))
    second.drain(seed + 1)
    both = trained + second.consumed
    assert len(both) == len(set(both)) == total * cfg.global_batch_size
    assert second.core.trainer_version == total and second.core.consumed_ids() == second.consumed


def test_refills_of_a_resumed_list_use_new_minibatch_ids():
    """A resumed run's dispatch list holds its earlier refills (``r1.m0``); its own refills
    must not reuse them (hypothesis found refill(1) giving ``r1.m0`` again)."""
    from mindspeed_rl_asp.schedule.planning import refill_passes
    from mindspeed_rl_asp.tasks import epoch_prompt_id

    # m0's untrained part (a split keeps its id) and the refill of m0 from before the resume
    rest = [("m0", (epoch_prompt_id("p1", 0),)), ("r1.m0", (epoch_prompt_id("p0", 1),))]
    existing = {mb_id for mb_id, _ in rest}
    for k in (1, 2, 3):
        made = refill_passes(rest)(k)
        assert not existing & {mb_id for mb_id, _ in made}
        existing |= {mb_id for mb_id, _ in made}
