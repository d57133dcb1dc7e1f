"""The prefetch rule of ControlCore (``ControlConfig.prefetch``: the collective transport
moving a published version to an actor ahead of its load).

Unit tests on hand-made states, then property tests through the one loop: the ``Shell``
of test_control_properties.py (every invariant after every event, the core's
``in_flight()`` equal to the cluster's pending work) extended with the prefetch's own
checks, on random configs and event orders in which prefetches end, fail or are
cancelled at any point. Every run must prefetch only published versions (the refresh
target), never two at once to one actor nor one version twice, never load or generate
on an actor while its prefetch runs, settle prefetches at Finish as ``at_finish`` says,
and end: a failed prefetch only sends the actor's load the long way.
"""
from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mindspeed_rl_asp.control.clusters import random_chooser
from mindspeed_rl_asp.control.core import (ControlConfig, ControlCore, Generate, LoadWeights, Prefetch,
                                           ProtocolError, prefetches)
from mindspeed_rl_asp.control.loop import Done, Failed, Loop, apply_event

from test_control_properties import Shell, setups


def cfg_for(**kw) -> ControlConfig:
    base = dict(num_actors=1, global_batch_size=1, n_samples_per_prompt=1, max_staleness=1, queue_capacity=4,
                high_watermark=1.0, low_watermark=0.0, prefetch=True)
    base.update(kw)
    return ControlConfig(**base)


def one_prompt_minibatches(count: int):
    return [(f"m{i}", (f"p{i}",)) for i in range(count)]


def core_generating_when_v1_is_published() -> ControlCore:
    """One actor generating m1 with version 0 when version 1 is published."""
    core = ControlCore(cfg_for(), one_prompt_minibatches(5))
    assert core.poll() == [Generate(0, "m0", ("p0",), 0)]
    core.on_generated(0, "m0")
    assert [type(a) for a in core.poll()] == [type(core.training), Generate]
    core.on_train_step_done(0)
    core.poll()
    core.on_published(1)
    return core


# ---------------------------------------------------------------------- units
def test_a_generating_actor_prefetches_and_loads_only_once_the_prefetch_ended():
    core = core_generating_when_v1_is_published()
    assert core.poll() == [Prefetch(0, 1)]
    assert Prefetch(0, 1) in core.in_flight()
    core.on_generated(0, "m1")
    assert not any(isinstance(a, (LoadWeights, Generate)) for a in core.poll())   # waits for its prefetch
    core.on_prefetched(0, 1)
    assert core.poll() == [LoadWeights(0, 1)]
    assert Prefetch(0, 1) not in core.in_flight()


def test_a_failed_prefetch_falls_back_to_the_usual_load_and_is_not_repeated():
    core = core_generating_when_v1_is_published()
    assert core.poll() == [Prefetch(0, 1)]
    core.on_prefetch_failed(0, 1)
    assert core.poll() == []                      # still generating: no second prefetch of version 1
    core.on_generated(0, "m1")
    assert LoadWeights(0, 1) in core.poll()       # the load moves the version itself


def test_without_prefetch_no_prefetch_is_issued():
    core = ControlCore(cfg_for(prefetch=False), one_prompt_minibatches(5))
    core.poll()
    core.on_generated(0, "m0")
    core.poll()
    core.on_train_step_done(0)
    core.poll()
    core.on_published(1)
    assert core.poll() == [] and not any(isinstance(a, Prefetch) for a in core.in_flight())


def test_reports_of_prefetches_never_issued_are_refused_and_change_nothing():
    core = core_generating_when_v1_is_published()
    core.poll()
    before = core.in_flight()
    for report in (core.on_prefetched, core.on_prefetch_failed):
        with pytest.raises(ProtocolError, match="prefetch of version 2 to actor 0"):
            report(0, 2)
    assert core.in_flight() == before


def test_prefetch_is_a_bool():
    with pytest.raises(ValueError, match="prefetch=1 must be a bool"):
        cfg_for(prefetch=1)


@pytest.mark.parametrize("transport, prefetch, mode, expected", [
    ("collective", True, "async", True), ("collective", False, "async", False),
    ("object_store", True, "async", False), ("files", True, "async", False),
    ("collective", True, "hybrid", False)])
def test_prefetch_is_on_for_the_collective_transport_that_asks_for_it(transport, prefetch, mode, expected):
    cfg = SimpleNamespace(weights=SimpleNamespace(transport=transport, prefetch=prefetch),
                          mode=SimpleNamespace(name=mode))
    assert prefetches(cfg) is expected


@pytest.mark.parametrize("at_finish", ["cancel", "drain"])
def test_a_prefetch_in_flight_at_finish_is_settled_as_at_finish_says(at_finish):
    """Two actors, three steps of one prompt: actor 1's first minibatch ends only when
    nothing else can, so it is generating when version 1 is published and gets a
    prefetch; prefetches end last of all, so Finish comes with it still running."""
    core = ControlCore(cfg_for(num_actors=2, total_steps=3, at_finish=at_finish), one_prompt_minibatches(6))
    ended: list = []

    class Cluster:
        def __init__(self):
            self.pending, self.cancelled = [], []

        def now(self):
            return 0.0

        def submit(self, action):
            self.pending.append(action)

        def next_event(self):
            def last(a):
                return isinstance(a, Prefetch), isinstance(a, Generate) and a.actor == 1
            action = min(self.pending, key=lambda a: (last(a), self.pending.index(a)))
            self.pending.remove(action)
            ended.append(action)
            return Done(action)

        def cancel(self, actions):
            for a in actions:
                self.pending.remove(a)
                self.cancelled.append(a)

    cluster = Cluster()
    loop = Loop(core, cluster)
    while loop.advance():
        pass
    assert Prefetch(1, 1) in loop.outcome.leftover
    if at_finish == "cancel":
        assert Prefetch(1, 1) in cluster.cancelled and Prefetch(1, 1) not in ended
    else:
        assert Prefetch(1, 1) in ended and not cluster.cancelled
    assert core.in_flight() == [] and not cluster.pending


# ---------------------------------------------------------------------- the loop, any order
class PrefetchShell(Shell):
    """The shell of test_control_properties.py, plus what a prefetch must respect."""

    def __init__(self, cfg: ControlConfig, mbs, chooser=None) -> None:
        super().__init__(replace(cfg, prefetch=True), mbs, chooser)
        self.prefetching: dict[int, int] = {}
        self.tried: set[tuple[int, int]] = set()
        self.prefetch_events = 0

    def check_action(self, a) -> None:
        if isinstance(a, (LoadWeights, Generate)):
            assert a.actor not in self.prefetching, f"{a} while its prefetch of {self.prefetching} runs"
        if not isinstance(a, Prefetch):
            return super().check_action(a)
        assert self.finish is None, f"{a} after Finish"
        target = self.published - self.published % self.cfg.refresh_interval
        assert a.version == target and a.version <= self.published, f"{a}: not the published target {target}"
        assert a.version > self.versions[a.actor], f"{a}: the actor holds {self.versions[a.actor]}"
        assert a.actor not in self.prefetching and a.actor not in self.loading, f"{a}: two transfers at once"
        assert (a.actor, a.version) not in self.tried, f"{a} again"
        self.tried.add((a.actor, a.version))
        self.prefetching[a.actor] = a.version

    def observed(self, event, core, t) -> None:
        if not isinstance(event.action, Prefetch):
            return super().observed(event, core, t)
        a = event.action
        assert self.prefetching.pop(a.actor) == a.version
        self.prefetch_events += 1
        if self.finish is None:
            self.check()

    def event_budget(self) -> int:
        # Each actor is sent at most one prefetch per published version.
        return super().event_budget() + self.cfg.num_actors * (self.core.total_steps + 1)

    def check_finish(self) -> None:
        super().check_finish()
        # Cancel: the prefetches still running at Finish are cancelled (the shell hears of
        # no event for them) and are exactly those left unsettled; drain: each one ended.
        left = {a.actor: a.version for a in self.outcome.leftover if isinstance(a, Prefetch)}
        if self.cfg.at_finish == "cancel":
            assert self.prefetching == left, f"prefetches unsettled {self.prefetching}, cancelled {left}"
        else:
            assert not self.prefetching, f"prefetches left unsettled: {self.prefetching}"


def prefetch_chooser(seed: int, fail_rate: float = 0.3, generation_fail_rate: float = 0.2,
                     max_failures: int = 3):
    """Any pending action ends next; a prefetch fails with ``fail_rate`` (half of those
    as a lost actor's would), a generation with ``generation_fail_rate``."""
    rng = random.Random(seed)
    gen = random_chooser(seed, fail_rate=generation_fail_rate, max_failures=max_failures)

    def choose(pending):
        index, fail = gen(pending)
        if isinstance(pending[index], Prefetch):
            fail = rng.random() < fail_rate
        return index, fail
    return choose


# Found by hypothesis: a prefetch still running at a cancelling Finish.
CANCELLED_AT_FINISH = (ControlConfig(num_actors=4, global_batch_size=4, n_samples_per_prompt=1, max_staleness=1,
                                     queue_capacity=7, high_watermark=0.0, low_watermark=0.0, at_finish="cancel"),
                       [("m0", ("p0",)), ("m1", ("p1", "p2", "p3", "p4")), ("m2", ("p5", "p6", "p7", "p8"))])


@settings(max_examples=300, deadline=None)
@given(setup=setups(), seed=st.integers(0, 2**16), fail_rate=st.sampled_from([0.0, 0.5, 1.0]))
@example(setup=CANCELLED_AT_FINISH, seed=0, fail_rate=0.0)
def test_random_runs_with_prefetch_finish_within_bounds(setup, seed, fail_rate):
    """Whole runs under random event orders, prefetches failing at any rate (1.0: every
    one fails), generation failing too: every invariant holds and the run ends."""
    shell = PrefetchShell(*setup, chooser=prefetch_chooser(seed, fail_rate))
    shell.run_to_end()


def test_prefetch_is_issued_and_overlaps_generation():
    """Not vacuous: on a run where actors generate while versions are published, the
    core prefetches, and a load follows a finished prefetch."""
    cfg = ControlConfig(num_actors=2, global_batch_size=2, n_samples_per_prompt=2, max_staleness=2,
                        queue_capacity=16, high_watermark=1.0, low_watermark=0.0)
    shell = PrefetchShell(cfg, [(f"m{i}", (f"p{2 * i}", f"p{2 * i + 1}")) for i in range(10)],
                          chooser=prefetch_chooser(3, fail_rate=0.0, generation_fail_rate=0.0))
    shell.run_to_end()
    assert shell.prefetch_events >= 2


class PrefetchMachine(RuleBasedStateMachine):
    """Hypothesis picks which pending action ends next and whether a prefetch (or a
    generation, a few times) fails; the invariants hold after every event."""

    @initialize(setup=setups(), seed=st.integers(0, 2**16))
    def setup(self, setup, seed) -> None:
        self.shell = PrefetchShell(*setup)
        self.seed, self.data, self.failures = seed, None, 0
        self.shell.chooser = self._choose

    def _choose(self, pending):
        index = self.data.draw(st.integers(0, len(pending) - 1), label="ends")
        action = pending[index]
        fail = False
        if isinstance(action, Prefetch) or (isinstance(action, Generate) and self.failures < 4):
            fail = self.data.draw(st.booleans(), label="fails")
            self.failures += fail and isinstance(action, Generate)
        return index, fail

    @rule(data=st.data())
    def event(self, data) -> None:
        self.data = data
        self.shell.advance()

    @rule(actor=st.integers(0, 4), version=st.integers(0, 6))
    def bogus_prefetch_report(self, actor, version) -> None:
        """A report of a prefetch never issued is refused and changes nothing."""
        shell = self.shell
        if shell.prefetching.get(actor) == version or shell.finish is not None:
            return
        before = (shell.core.in_flight(), shell.core.snapshot())
        with pytest.raises(ProtocolError):
            apply_event(shell.core, Done(Prefetch(actor, version)))
        with pytest.raises(ProtocolError):
            apply_event(shell.core, Failed(Prefetch(actor, version), "bogus"))
        assert (shell.core.in_flight(), shell.core.snapshot()) == before

    @invariant()
    def invariants(self) -> None:
        if hasattr(self, "shell") and self.shell.finish is None:
            self.shell.check()

    def teardown(self) -> None:
        if hasattr(self, "shell"):
            self.shell.chooser = prefetch_chooser(self.seed, fail_rate=0.5, generation_fail_rate=0.0)
            self.shell.run_to_end()


PrefetchMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestPrefetchMachine = PrefetchMachine.TestCase
