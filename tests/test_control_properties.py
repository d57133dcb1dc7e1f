"""Property tests of ControlCore: random configs, plans and event interleavings.

A hypothesis state machine plays the shell: it applies every action ``poll`` returns and
fires events in any order (completions of any running minibatch, failures, weight loads,
train-step completions, publishes). After every event it checks the invariants listed in
docs/control.md; at teardown it drains the run (no more failures) and checks that it ends.
"""
from __future__ import annotations

import random
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mindspeed_rl_asp.control import core as core_mod
from mindspeed_rl_asp.control.clusters import OrderedCluster, random_chooser
from mindspeed_rl_asp.control.core import (ControlConfig, ControlCore, Finish, Generate, LoadWeights,
                                           ProtocolError, Publish, TrainStep)
from mindspeed_rl_asp.control.loop import ControlDeadlock, Done, Loop, Observer
from mindspeed_rl_asp.control.staleness import first_window_gap

WATERMARKS = (0.0, 0.25, 0.5, 0.75, 1.0)


@st.composite
def sizes_for(draw, batch: int, staleness: int, steps: int) -> list[int]:
    """Minibatch sizes (1..5 prompts). For max_staleness=0 they tile every step's batch
    (a requirement); otherwise at most ``staleness * batch + 1`` (enough for liveness)."""
    sizes: list[int] = []
    if staleness == 0:
        for _ in range(steps + draw(st.integers(0, 1))):
            left = batch
            while left:
                k = draw(st.integers(1, min(5, left)))
                sizes.append(k)
                left -= k
        return sizes
    kmax = min(5, staleness * batch + 1)
    target = steps * batch + draw(st.integers(0, batch))
    while sum(sizes) < target:
        sizes.append(draw(st.integers(1, kmax)))
    return sizes


@st.composite
def setups(draw, colocated=st.booleans()):
    actors = draw(st.integers(1, 4))
    batch = draw(st.integers(1, 4))
    n = draw(st.integers(1, 4))
    staleness = draw(st.integers(0, 3))
    steps = draw(st.integers(1, 5))
    sizes = draw(sizes_for(batch, staleness, steps))
    kmax = max(sizes)
    capacity = draw(st.integers(max(batch, kmax), batch + kmax + 3)) * n - draw(st.integers(0, n - 1))
    capacity = max(capacity, batch * n, kmax * n)
    total = draw(st.sampled_from([None, steps]))
    resolved = sum(sizes) // batch if total is None else total
    refresh = draw(st.sampled_from(["rolling", "global"]))
    interval = draw(st.integers(1, staleness + 1))
    if first_window_gap(sizes, batch, staleness, capacity // n, resolved, interval) is not None:
        capacity = (batch + kmax - 1) * n  # always enough for these sizes (docs/control.md)
    if first_window_gap(sizes, batch, staleness, capacity // n, resolved, interval) is not None:
        interval = 1  # sizes_for keeps interval 1 live; a longer one may need more staleness
    low = draw(st.sampled_from(WATERMARKS))
    high = draw(st.sampled_from([w for w in WATERMARKS if w >= low]))
    cfg = ControlConfig(num_actors=actors, global_batch_size=batch, n_samples_per_prompt=n,
                        max_staleness=staleness, queue_capacity=capacity, high_watermark=high,
                        low_watermark=low, total_steps=total, colocated=draw(colocated),
                        refresh=refresh, refresh_interval=interval,
                        at_finish=draw(st.sampled_from(["cancel", "drain"])))
    ids = iter(f"p{i}" for i in range(sum(sizes)))
    mbs = [(f"m{k}", tuple(next(ids) for _ in range(size))) for k, size in enumerate(sizes)]
    return cfg, mbs


class Shell(Observer):
    """The test's model of the outside world, driven through the one loop
    (``control.loop.Loop``) on an ``OrderedCluster`` whose chooser picks which pending
    action ends next. It checks every action the core issues (``check_action``) and
    every invariant after every event (``observed``). A core resumed at
    ``cfg.start_version`` (``v``) is checked the same way, its steps and versions from ``v``."""

    def __init__(self, cfg: ControlConfig, mbs, chooser=None) -> None:
        self.cfg = cfg
        self.core = ControlCore(cfg, mbs)
        self.all_ids = frozenset(p for _, ids in mbs for p in ids)
        self.chooser = chooser or random_chooser(0)
        self.cluster = OrderedCluster(self._choose, self.check_action)
        self.loop = Loop(self.core, self.cluster, self)
        self.generating: dict[int, Generate] = {}
        self.loading: dict[int, int] = {}
        self.start = cfg.start_version
        self.versions = [self.start] * cfg.num_actors
        self.behaviour: dict[str, int] = {}
        self.training: TrainStep | None = None
        self.publishing: int | None = None
        self.published = self.start
        self.consumed: list[str] = []
        self.finish: Finish | None = None
        self.outcome = None
        self.steps: list[TrainStep] = []

    def _choose(self, pending):
        # Called right after the loop submitted everything of this iteration.
        assert self.core.poll() == [], "poll must be idempotent until an event arrives"
        return self.chooser(pending)

    def advance(self) -> bool:
        return self.loop.advance()

    def check_action(self, a) -> None:
        cfg = self.cfg
        assert self.finish is None, f"{a} after Finish"
        # Actors hold the start version until the refresh target passes it.
        target = max(self.start, self.published - self.published % cfg.refresh_interval)
        if isinstance(a, Generate):
            assert a.actor not in self.generating and a.actor not in self.loading, a
            assert a.version == self.versions[a.actor] == target, a
            assert not (cfg.colocated and (self.training or self.publishing)), f"{a} while training (colocated)"
            if cfg.refresh == "global":
                assert all(v == target for v in self.versions) and not self.loading, \
                    f"{a} during a global refresh: versions {self.versions}, loading {self.loading}"
            for p in a.prompt_ids:
                self.behaviour[p] = a.version
            self.generating[a.actor] = a
        elif isinstance(a, LoadWeights):
            assert a.actor not in self.generating and a.actor not in self.loading, a
            assert a.version > self.versions[a.actor] and a.version == target, a
            assert not (cfg.colocated and (self.training or self.publishing)), f"{a} while training (colocated)"
            self.loading[a.actor] = a.version
        elif isinstance(a, TrainStep):
            assert self.training is None, a
            assert not (cfg.colocated and (self.generating or self.loading)), f"{a} overlaps generation"
            assert a.step == self.start + len(self.steps) == self.published, a
            assert len(a.prompt_ids) == cfg.global_batch_size == len(set(a.prompt_ids))
            for p, v in zip(a.prompt_ids, a.versions):
                assert self.behaviour[p] == v, (p, v)
                assert 0 <= a.step - v <= cfg.max_staleness, f"age {a.step - v} > {cfg.max_staleness}"
                assert p not in self.consumed, p
            self.consumed.extend(a.prompt_ids)
            self.training = a
            self.steps.append(a)
        elif isinstance(a, Publish):
            assert self.training is None and self.publishing is None, a
            assert a.version == self.start + len(self.steps) == self.published + 1, a
            self.publishing = a.version
        else:  # pragma: no cover
            raise AssertionError(a)

    # ---------------------------------------------------------------- events
    def observed(self, event, core, t) -> None:
        a, ok = event.action, isinstance(event, Done)
        if isinstance(a, Generate):
            g = self.generating.pop(a.actor)
            assert g == a
            if not ok:
                for p in g.prompt_ids:
                    del self.behaviour[p]
        elif isinstance(a, LoadWeights):
            v = self.loading.pop(a.actor)
            assert v > self.versions[a.actor]
            if ok:
                self.versions[a.actor] = v
        elif isinstance(a, TrainStep):
            self.training = None
        elif isinstance(a, Publish):
            self.publishing, self.published = None, a.version
        if self.finish is None:
            self.check()

    def finished(self, outcome, core, t) -> None:
        assert outcome.finish is not None and not outcome.interrupted
        f = outcome.finish
        assert self.training is None and self.publishing is None
        assert f.steps == self.start + len(self.steps) == self.core.total_steps == self.published
        self.finish, self.outcome = f, outcome

    # ---------------------------------------------------------------- checks
    def quiescent(self) -> bool:
        """Nothing is running and every trained version is published."""
        return (not self.generating and not self.loading and self.training is None
                and self.publishing is None and self.published == self.core.trainer_version)

    def check(self) -> None:
        core, cfg = self.core, self.cfg
        led = check_ledger(core, self.all_ids, self.generating, self.consumed, self.cluster.pending)
        snap = core.snapshot()
        assert snap.queued_samples + snap.in_flight_samples <= cfg.queue_capacity
        assert snap.queued_samples == len(led.queued) * cfg.n_samples_per_prompt
        assert all(age <= cfg.max_staleness for age in snap.age_histogram)
        assert sum(snap.age_histogram.values()) == len(self.consumed)
        target = max(self.start, core.published_version - core.published_version % cfg.refresh_interval)
        assert snap.admitted_prompts <= (cfg.max_staleness + target + 1) * cfg.global_batch_size
        # Deadlock freedom is the loop's own check: a poll that issues nothing while
        # nothing is in flight raises ControlDeadlock, which fails the test.

    def drain(self, seed: int, starve: float = 0.0) -> None:
        """End every pending action (no failures) until Finish; must terminate. With
        probability ``starve`` the running minibatches of the oldest version are held back
        while anything else can end, so slow minibatches get overtaken."""
        self.chooser = random_chooser(seed, starve=starve)
        self.run_to_end()

    def event_budget(self) -> int:
        """How many events a run may take before it counts as stuck (room for re-dispatches)."""
        return 5 * (len(self.all_ids) + self.core.total_steps + self.cfg.num_actors) + 20

    def run_to_end(self, between=None) -> None:
        """Advance until Finish, calling ``between()`` before each event (a re-plan, say);
        a run that takes more than :meth:`event_budget` events fails. Then check the finish."""
        budget = self.event_budget()
        while True:
            if between is not None:
                between()
            if not self.advance():
                break
            budget -= 1
            assert budget > 0, f"no progress: {self.core.snapshot()}"
        self.check_finish()

    def check_finish(self) -> None:
        f, cfg = self.finish, self.cfg
        assert len(self.consumed) == (f.steps - self.start) * cfg.global_batch_size
        unused = set(f.not_dispatched) | set(f.queued) | set(f.running)
        assert len(unused) == len(f.not_dispatched) + len(f.queued) + len(f.running)
        assert unused | set(self.consumed) == self.all_ids and not unused & set(self.consumed)
        # Overshoot: less than one minibatch generated beyond the last step's needs.
        largest = max(mb.size for mb in self.core.dispatcher.minibatches)
        assert len(f.queued) + len(f.running) < largest or not (f.queued or f.running)
        # Work still running at Finish was settled as configured, and nothing is left.
        assert self.outcome.at_finish == cfg.at_finish
        assert set(f.running) == {p for a in self.outcome.leftover if isinstance(a, Generate)
                                  for p in a.prompt_ids}
        if cfg.at_finish == "cancel":
            assert self.cluster.cancelled == list(self.outcome.leftover)
        else:
            assert not self.cluster.cancelled and not self.generating and not self.loading
        assert not self.cluster.pending and self.core.in_flight() == []


def check_ledger(core, all_ids, generating, consumed, pending):
    """The core's ledger against what the test shell saw: the five sets partition the
    prompts (rejected is empty without dynamic sampling), running is what is generating, consumed is what was trained, and the core's
    work in flight is the cluster's. Returns the ledger."""
    led = core.ledger()
    parts = (led.pending, led.running, led.queued, led.consumed, led.rejected)
    assert sum(map(len, parts)) == len(all_ids), "a prompt is lost or duplicated"
    assert frozenset().union(*parts) == all_ids
    assert led.running == {p for g in generating.values() for p in g.prompt_ids}
    assert sorted(led.consumed) == sorted(consumed)
    assert sorted(map(repr, core.in_flight())) == sorted(map(repr, pending))
    return led


def budgeted_chooser(machine, max_failures: int):
    """A hypothesis chooser for a state machine: draws from ``machine.data`` (set by the
    rule that advances) and lets at most ``max_failures`` generations fail in all."""
    machine.failures = 0

    def choose(pending):
        index, fail = hypothesis_chooser(machine.data, lambda: machine.failures < max_failures)(pending)
        machine.failures += fail
        return index, fail
    return choose


def hypothesis_chooser(data, allow_failures):
    """Let hypothesis pick which pending action ends next and whether a generation fails."""
    def choose(pending):
        index = data.draw(st.integers(0, len(pending) - 1), label="ends")
        fail = allow_failures() and isinstance(pending[index], Generate) \
            and data.draw(st.booleans(), label="fails")
        return index, fail
    return choose


class ControlMachine(RuleBasedStateMachine):
    @initialize(setup=setups(), seed=st.integers(0, 2**16))
    def setup(self, setup, seed) -> None:
        self.shell = Shell(*setup)
        self.seed = seed
        self.data = None
        self.shell.chooser = budgeted_chooser(self, max_failures=6)

    @rule(data=st.data())
    def event(self, data) -> None:
        """One iteration of the loop: any pending action ends next, in any order."""
        self.data = data
        self.shell.advance()

    @rule(actor=st.integers(0, 4), mb=st.integers(0, 30))
    def bogus_completion(self, actor, mb) -> None:
        """A completion for work the actor does not hold is refused and changes nothing."""
        shell = self.shell
        held = shell.generating.get(actor)
        mb_id = f"m{mb}"
        if held is not None and held.minibatch_id == mb_id:
            return
        before = shell.core.snapshot()
        with pytest.raises(ProtocolError):
            shell.core.on_generated(actor, mb_id)
        assert shell.core.snapshot() == before

    @invariant()
    def invariants(self) -> None:
        if hasattr(self, "shell") and self.shell.finish is None:
            self.shell.check()

    def teardown(self) -> None:
        if hasattr(self, "shell"):
            self.shell.drain(self.seed)


ControlMachine.TestCase.settings = settings(
    max_examples=400, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestControlMachine = ControlMachine.TestCase


@settings(max_examples=400, deadline=None)
@given(setup=setups(), seed=st.integers(0, 2**16), starve=st.sampled_from([0.0, 0.9, 1.0]))
def test_random_runs_finish_within_bounds(setup, seed, starve):
    """Whole runs under random event order (a few failures; slow minibatches overtaken)
    end with every invariant."""
    shell = Shell(*setup, chooser=random_chooser(seed, fail_rate=0.3, max_failures=3))
    for _ in range(random.Random(seed).randrange(0, 8)):
        if not shell.advance():
            break
    if shell.finish is None:
        shell.drain(seed, starve)
    else:
        shell.check_finish()


@settings(max_examples=300, deadline=None)
@given(actors=st.integers(2, 4), batch=st.integers(1, 2), staleness=st.integers(1, 3),
       sizes=st.lists(st.integers(1, 2), min_size=6, max_size=14), seed=st.integers(0, 2**16),
       starve=st.sampled_from([0.7, 1.0]))
def test_overtaken_minibatches_never_exceed_the_bound(actors, batch, staleness, sizes, seed, starve):
    """Staleness stress: many actors, small batches, the oldest work held back. This is
    where waiting only for the prompts due *this* step is not enough (docs/control.md)."""
    ids = iter(f"p{i}" for i in range(sum(sizes)))
    mbs = [(f"m{k}", tuple(next(ids) for _ in range(sz))) for k, sz in enumerate(sizes)]
    cfg = ControlConfig(num_actors=actors, global_batch_size=batch, n_samples_per_prompt=1,
                        max_staleness=staleness, queue_capacity=64, high_watermark=1.0,
                        low_watermark=0.0)
    Shell(cfg, mbs).drain(seed, starve)


@st.composite
def raw_setups(draw):
    """Configs and plans NOT pre-filtered for liveness (capacity and sizes arbitrary)."""
    batch = draw(st.integers(1, 4))
    n = draw(st.integers(1, 3))
    staleness = draw(st.integers(0, 2))
    steps = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=12))
    assume(sum(sizes) >= steps * batch)
    capacity = max(batch, max(sizes)) * n + draw(st.integers(0, 3 * n))
    cfg = ControlConfig(num_actors=draw(st.integers(1, 3)), global_batch_size=batch,
                        n_samples_per_prompt=n, max_staleness=staleness, queue_capacity=capacity,
                        high_watermark=1.0, low_watermark=0.0, total_steps=steps,
                        refresh=draw(st.sampled_from(["rolling", "global"])),
                        refresh_interval=draw(st.integers(1, staleness + 1)))
    ids = iter(f"p{i}" for i in range(sum(sizes)))
    return cfg, [(f"m{k}", tuple(next(ids) for _ in range(s))) for k, s in enumerate(sizes)]


@settings(max_examples=400, deadline=None)
@given(setup=raw_setups(), seed=st.integers(0, 2**16))
def test_window_check_is_exact(setup, seed):
    """The constructor's liveness check rejects exactly the plans that get stuck: with the
    check switched off, a rejected plan deadlocks (the loop raises) at the reported step;
    an accepted one always finishes."""
    cfg, mbs = setup
    sizes = [len(ids) for _, ids in mbs]
    gap = first_window_gap(sizes, cfg.global_batch_size, cfg.max_staleness,
                           cfg.queue_capacity // cfg.n_samples_per_prompt, cfg.total_steps,
                           cfg.refresh_interval)
    if gap is None:
        Shell(cfg, mbs).drain(seed)
        return
    with pytest.raises(ValueError, match=f"step {gap.step} can never be filled"):
        ControlCore(cfg, mbs)
    with mock.patch.object(core_mod, "first_window_gap", lambda *a, **k: None):
        shell = Shell(cfg, mbs, chooser=random_chooser(seed))
    with pytest.raises(ControlDeadlock):
        while shell.advance():
            pass
    assert shell.finish is None and shell.core.trainer_version == gap.step
    assert shell.core.snapshot().trainer_wait == "queue"
