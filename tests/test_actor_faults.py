"""Property tests of the core under actor faults: generation actors whose process dies.

A hypothesis state machine plays the shell on a cluster where any pending action may end
in any order, and a generation or a load may also end with its actor *lost* (the process
died). A lost actor comes back (``AwaitActor`` done, holding version 0, the starting
checkpoint a restarted process loads) while it has restarts left, else it is retired.
After every event the invariants of docs/control.md (Faults) are checked; at teardown
the run is drained without further faults and must finish, or, only when every actor is
retired, stop with ``ActorsExhausted``.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mindspeed_rl_asp.control.core import (ActorsExhausted, AwaitActor, ControlConfig, ControlCore, Finish,
                                           Generate, LoadWeights, ProtocolError, Publish, TrainStep)
from mindspeed_rl_asp.control.loop import Done, Failed, Loop, Observer, Outcome, apply_event

from test_control_properties import check_ledger, setups

RESTART_VERSION = 0   # what a restarted generation process loads: the starting checkpoint


class FaultCluster:
    """Pending actions end when the chooser says, as done, failed (raised) or lost (the
    actor's process died). ``AwaitActor`` ends as Ray would: back (Done with version 0)
    while the actor has restarts left, else failed (retired)."""

    def __init__(self, restarts: list[int], chooser, check) -> None:
        self.restarts_left = list(restarts)
        self.chooser, self.check = chooser, check
        self.pending: list = []
        self.cancelled: list = []
        self.clock = 0.0
        self.comes_back: dict[int, bool] = {}

    def now(self) -> float:
        return self.clock

    def submit(self, action) -> None:
        self.check(action)
        self.pending.append(action)

    def next_event(self):
        index, outcome = self.chooser(self.pending)
        action = self.pending.pop(index)
        self.clock += 1.0
        if isinstance(action, AwaitActor):
            if self.comes_back.pop(action.actor):
                return Done(action, RESTART_VERSION)
            return Failed(action, "ActorDiedError: restarts spent", lost=True)
        if outcome == "lost" and isinstance(action, (Generate, LoadWeights)):
            back = self.restarts_left[action.actor] > 0
            self.restarts_left[action.actor] -= back
            self.comes_back[action.actor] = back
            return Failed(action, "ActorUnavailableError: the process died", lost=True)
        if outcome == "failed" and isinstance(action, (Generate, LoadWeights)):
            return Failed(action, "injected failure")
        return Done(action)

    def cancel(self, actions) -> None:
        for action in actions:
            self.pending.remove(action)
            self.cancelled.append(action)


class FaultShell(Observer):
    """The test's model of the actors: status (idle / busy / lost / retired), the version
    each holds, and every prompt's behaviour version. ``check_action`` sees every action
    the core issues; ``check`` runs after every event."""

    def __init__(self, cfg: ControlConfig, mbs, restarts: list[int], chooser) -> None:
        self.cfg = cfg
        self.core = ControlCore(cfg, mbs)
        self.all_ids = frozenset(p for _, ids in mbs for p in ids)
        self.chooser = chooser
        self.cluster = FaultCluster(restarts, lambda pending: self.chooser(pending), self.check_action)
        self.loop = Loop(self.core, self.cluster, self)
        self.status = ["idle"] * cfg.num_actors          # idle | generating | loading | lost | retired
        self.versions = [0] * cfg.num_actors
        self.awaited: set[int] = set()
        self.loaded_since_restart: list[set[int]] = [{0} for _ in range(cfg.num_actors)]
        self.behaviour: dict[str, int] = {}
        self.generating: dict[int, Generate] = {}
        self.published = 0
        self.steps: list[TrainStep] = []
        self.consumed: list[str] = []
        self.finish: Finish | None = None
        self.restarted = self.retired = self.lost = 0

    def target(self) -> int:
        return self.published - self.published % self.cfg.refresh_interval

    def check_action(self, a) -> None:
        assert self.finish is None, f"{a} after Finish"
        if isinstance(a, (Generate, LoadWeights)):
            assert self.status[a.actor] == "idle", f"{a} to an actor that is {self.status[a.actor]}"
        if isinstance(a, Generate):
            # The version it generates with is one it holds now, loaded since its restart.
            assert a.version == self.versions[a.actor] == self.target(), (a, self.versions)
            assert a.version in self.loaded_since_restart[a.actor], a
            if self.cfg.refresh == "global":
                live = [k for k, s in enumerate(self.status) if s not in ("lost", "retired")]
                assert all(self.versions[k] == self.target() for k in live), (a, self.versions, self.status)
            for p in a.prompt_ids:
                assert p not in self.behaviour and p not in self.consumed, p
                self.behaviour[p] = a.version
            self.status[a.actor] = "generating"
            self.generating[a.actor] = a
        elif isinstance(a, LoadWeights):
            assert a.version > self.versions[a.actor] and a.version == self.target(), a
            self.status[a.actor] = "loading"
        elif isinstance(a, AwaitActor):
            assert self.status[a.actor] == "lost" and a.actor not in self.awaited, a
            self.awaited.add(a.actor)
        elif isinstance(a, TrainStep):
            assert a.step == len(self.steps) == self.published, a
            assert len(a.prompt_ids) == self.cfg.global_batch_size == len(set(a.prompt_ids))
            for p, v in zip(a.prompt_ids, a.versions):
                assert self.behaviour.pop(p) == v, (p, v)
                assert 0 <= a.step - v <= self.cfg.max_staleness
            self.consumed.extend(a.prompt_ids)
            self.steps.append(a)
        elif isinstance(a, Publish):
            assert a.version == len(self.steps) == self.published + 1, a

    def observed(self, event, core, t) -> None:
        a, ok = event.action, isinstance(event, Done)
        if isinstance(a, Generate):
            self.generating.pop(a.actor)
            if not ok:
                for p in a.prompt_ids:
                    del self.behaviour[p]
        if isinstance(a, (Generate, LoadWeights)):
            if not ok and event.lost:
                self.status[a.actor] = "lost"
                self.lost += 1
            else:
                self.status[a.actor] = "idle"
                if ok and isinstance(a, LoadWeights):
                    self.versions[a.actor] = a.version
                    self.loaded_since_restart[a.actor].add(a.version)
        elif isinstance(a, AwaitActor):
            self.awaited.discard(a.actor)
            if ok:
                self.status[a.actor], self.versions[a.actor] = "idle", event.info
                self.loaded_since_restart[a.actor] = {event.info}
                self.restarted += 1
            else:
                self.status[a.actor] = "retired"
                self.retired += 1
        elif isinstance(a, Publish):
            self.published = a.version
        if self.finish is None:
            self.check()

    def finished(self, outcome, core, t) -> None:
        self.finish = outcome.finish

    def check(self) -> None:
        core, cfg = self.core, self.cfg
        check_ledger(core, self.all_ids, self.generating, self.consumed, self.cluster.pending)
        snap = core.snapshot()
        assert snap.queued_samples + snap.in_flight_samples <= cfg.queue_capacity
        assert all(age <= cfg.max_staleness for age in snap.age_histogram)
        expected = {"idle": "idle", "generating": "generating", "loading": "loading",
                    "lost": "restarting", "retired": "retired"}
        assert [s.status for s in snap.actors] == [expected[s] for s in self.status]
        assert [s.version for s in snap.actors] == self.versions

    def run_to_end(self, seed: int) -> None:
        """No more faults: every pending action ends (AwaitActor as Ray decides) until
        Finish. A run with a live actor must train every step; only a run whose actors
        are all retired may stop, and then with ActorsExhausted."""
        rng = random.Random(seed)
        self.chooser = lambda pending: (rng.randrange(len(pending)), "done")
        budget = 10 * (len(self.all_ids) + self.core.total_steps + self.cfg.num_actors) + 50
        try:
            while self.loop.advance():
                budget -= 1
                assert budget > 0, f"no progress: {self.core.snapshot()}"
        except ActorsExhausted as error:
            assert self.status == ["retired"] * self.cfg.num_actors, (self.status, error)
            assert "fault.actor_restarts" in str(error)
            assert len(self.steps) < self.core.total_steps
            return
        assert self.finish is not None and self.finish.steps == self.core.total_steps == len(self.steps)
        unused = set(self.finish.not_dispatched) | set(self.finish.queued) | set(self.finish.running)
        assert unused | set(self.consumed) == self.all_ids and not unused & set(self.consumed)
        assert len(self.consumed) == len(set(self.consumed))


def fault_chooser(data, budget: list[int]):
    """Hypothesis picks which pending action ends and how (while the fault budget lasts)."""
    def choose(pending):
        index = data.draw(st.integers(0, len(pending) - 1), label="ends")
        outcome = "done"
        if budget[0] > 0 and isinstance(pending[index], (Generate, LoadWeights)):
            outcome = data.draw(st.sampled_from(["done", "done", "failed", "lost"]), label="outcome")
            budget[0] -= outcome != "done"
        return index, outcome
    return choose


class ActorFaultMachine(RuleBasedStateMachine):
    @initialize(setup=setups(), seed=st.integers(0, 2**16), data=st.data())
    def setup(self, setup, seed, data) -> None:
        cfg, mbs = setup
        restarts = data.draw(st.lists(st.integers(0, 2), min_size=cfg.num_actors, max_size=cfg.num_actors),
                             label="restarts")
        self.budget = [8]
        self.data = data
        self.shell = FaultShell(cfg, mbs, restarts, lambda pending: fault_chooser(self.data, self.budget)(pending))
        self.seed = seed
        self.stopped = False

    @rule(data=st.data())
    def event(self, data) -> None:
        if self.stopped or self.shell.finish is not None:
            return
        self.data = data
        try:
            self.shell.loop.advance()
        except ActorsExhausted:
            assert self.shell.status == ["retired"] * self.shell.cfg.num_actors
            self.stopped = True

    @rule(actor=st.integers(0, 4))
    def bogus_restart(self, actor) -> None:
        """A restart or retirement for an actor that is not restarting is refused and
        changes nothing."""
        shell = self.shell
        if actor < shell.cfg.num_actors and shell.status[actor] == "lost":
            return
        before = shell.core.snapshot()
        with pytest.raises(ProtocolError):
            shell.core.on_actor_restarted(actor, 0)
        with pytest.raises(ProtocolError):
            shell.core.on_actor_retired(actor)
        assert shell.core.snapshot() == before

    @invariant()
    def invariants(self) -> None:
        if hasattr(self, "shell") and self.shell.finish is None and not self.stopped:
            self.shell.check()

    def teardown(self) -> None:
        if hasattr(self, "shell") and not self.stopped and self.shell.finish is None:
            self.shell.run_to_end(self.seed)


ActorFaultMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestActorFaultMachine = ActorFaultMachine.TestCase


@settings(max_examples=300, deadline=None)
@given(setup=setups(), seed=st.integers(0, 2**16), restarts=st.integers(0, 2), losses=st.integers(0, 6))
def test_random_losses_end_in_finish_or_exhaustion(setup, seed, restarts, losses):
    """Whole runs with random actor losses at random times (every actor with the same
    restart budget) finish with every step trained while an actor lives."""
    cfg, mbs = setup
    rng = random.Random(seed)
    left = [losses]

    def choose(pending):
        index = rng.randrange(len(pending))
        lost = left[0] > 0 and isinstance(pending[index], (Generate, LoadWeights)) and rng.random() < 0.4
        left[0] -= lost
        return index, "lost" if lost else "done"

    shell = FaultShell(cfg, mbs, [restarts] * cfg.num_actors, choose)
    for _ in range(rng.randrange(0, 40)):
        try:
            if not shell.loop.advance():
                break
        except ActorsExhausted:
            assert shell.status == ["retired"] * cfg.num_actors
            return
    if shell.finish is None:
        shell.run_to_end(seed)


def one_actor_setup(actors: int, colocated: bool = False, refresh: str = "rolling"):
    cfg = ControlConfig(num_actors=actors, global_batch_size=2, n_samples_per_prompt=1, max_staleness=1,
                        queue_capacity=8, total_steps=3, colocated=colocated, refresh=refresh)
    mbs = [(f"m{k}", (f"p{2 * k}", f"p{2 * k + 1}")) for k in range(4)]
    return cfg, mbs


def test_a_lost_minibatch_is_redispatched_first_to_a_live_actor():
    cfg, mbs = one_actor_setup(2)
    core = ControlCore(cfg, mbs)
    first = core.poll()
    assert [(a.actor, a.minibatch_id) for a in first] == [(0, "m0"), (1, "m1")]
    apply_event(core, Failed(first[0], "died", lost=True))
    # Actor 0 is awaited, not given work; m0 goes first to the next idle actor.
    assert core.poll() == [AwaitActor(0)]
    assert core.snapshot().actors[0].status == "restarting"
    apply_event(core, Done(first[1]))
    gens = [a for a in core.poll() if isinstance(a, Generate)]
    assert [(a.actor, a.minibatch_id) for a in gens] == [(1, "m0")]
    assert core.ledger().running == {"p0", "p1"} and core.ledger().consumed == {"p2", "p3"}


def test_a_restarted_actor_reloads_before_it_generates():
    cfg, mbs = one_actor_setup(2)
    core = ControlCore(cfg, mbs)
    g0, g1 = core.poll()
    apply_event(core, Done(g0))
    apply_event(core, Done(g1))
    train, *rest = core.poll()
    apply_event(core, Done(train))
    publish = core.poll()[0]
    assert isinstance(publish, Publish)
    apply_event(core, Done(publish))            # version 1 is out
    actions = core.poll()
    loads = [a for a in actions if isinstance(a, LoadWeights)]
    apply_event(core, Failed(loads[0], "died", lost=True))   # actor 0 dies while loading
    assert AwaitActor(0) in core.poll()
    apply_event(core, Done(AwaitActor(0), 0))   # back, holding the starting checkpoint
    assert core.snapshot().actors[0].version == 0
    assert LoadWeights(0, 1) in core.poll()     # loads version 1 before it generates again


def test_every_actor_retired_stops_with_a_clear_error():
    cfg, mbs = one_actor_setup(1)
    core = ControlCore(cfg, mbs)
    (g,) = core.poll()
    apply_event(core, Failed(g, "died", lost=True))
    assert core.poll() == [AwaitActor(0)]
    apply_event(core, Failed(AwaitActor(0), "ActorDiedError", lost=True))
    with pytest.raises(ActorsExhausted, match="every generation actor \\(1\\) is retired"):
        core.poll()
    assert core.ledger().pending >= {"p0", "p1"}   # nothing lost: m0 waits for re-dispatch


def test_retired_actor_does_not_hold_up_a_global_refresh_or_colocated_training():
    for colocated, refresh in ((False, "global"), (True, "rolling")):
        cfg, mbs = one_actor_setup(2, colocated=colocated, refresh=refresh)
        core = ControlCore(cfg, mbs)
        g0, g1 = core.poll()
        apply_event(core, Failed(g1, "died", lost=True))
        apply_event(core, Failed(core.poll()[0], "gone", lost=True))   # AwaitActor(1): retired
        apply_event(core, Done(g0))
        assert core.snapshot().actors[1].status == "retired"
        # The whole run finishes on actor 0 alone.
        rng = random.Random(0)
        pending = []
        while True:
            actions = core.poll()
            if any(isinstance(a, Finish) for a in actions):
                break
            assert all(getattr(a, "actor", 0) == 0 for a in actions), actions
            pending.extend(actions)
            assert pending, core.snapshot()
            apply_event(core, Done(pending.pop(rng.randrange(len(pending)))))
        assert core.trainer_version == 3 and len(core.consumed_ids()) == 6


# ---------------------------------------------------------------------- the shell's pure parts
def test_restart_options_take_only_a_count():
    from mindspeed_rl_asp.runtime.generation_unit import restart_options

    assert restart_options(0) == {"max_restarts": 0, "max_task_retries": 0}
    assert restart_options(3)["max_restarts"] == 3
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="fault.actor_restarts"):
            restart_options(bad)


def test_a_dead_process_is_told_from_a_raised_error():
    import ray.exceptions as rex

    from mindspeed_rl_asp.runtime.ray_cluster import process_died, restarted_version_mismatch

    assert process_died(rex.ActorDiedError()) and process_died(rex.ActorUnavailableError("gone", b"\0" * 16))
    assert not process_died(rex.RayTaskError("generate", "Traceback...", RuntimeError("boom")))
    assert not process_died(RuntimeError("boom"))
    assert restarted_version_mismatch(0, 3, 3) is None
    assert "generated with weight version 0, not 3" in restarted_version_mismatch(0, 3, 0)


def test_the_recorder_keeps_every_fault(tmp_path):
    import json

    from mindspeed_rl_asp.metrics.recorder import RunRecorder

    cfg, mbs = one_actor_setup(2)
    core = ControlCore(cfg, mbs)
    rec = RunRecorder(tmp_path, 2, 2, tensorboard=False, start=100.0)
    gen = Generate(0, "m0", ("p0", "p1"), 0)
    rec.submitted(gen, 100.0)
    rec.observed(Failed(gen, "ActorUnavailableError: the process died\nmore", lost=True), core, 101.0)
    rec.observed(Done(AwaitActor(0), 0), core, 120.0)
    load = LoadWeights(1, 1)
    rec.submitted(load, 121.0)
    rec.observed(Failed(load, "TransferError: failed after 2 of 7 buckets"), core, 122.0)
    rec.submitted(LoadWeights(1, 1), 123.0)
    gen1 = Generate(1, "m1", ("p2", "p3"), 0)
    rec.submitted(gen1, 124.0)
    rec.observed(Failed(gen1, "RuntimeError: injected"), core, 125.0)
    rec.observed(Failed(LoadWeights(1, 1), "ActorDiedError", lost=True), core, 126.0)
    rec.observed(Failed(AwaitActor(1), "ActorDiedError: restarts spent", lost=True), core, 127.0)
    gen0 = Generate(0, "m2", ("p4", "p5"), 0)
    rec.submitted(gen0, 128.0)
    rec.observed(Failed(gen0, "ActorDiedError", lost=True), core, 129.0)
    rec.finished(Outcome(None, "cancel", (AwaitActor(0),)), core, 130.0)   # the run ended first
    rec.close()
    assert [(f["t"], f["actor"], f["kind"], f["minibatch"]) for f in rec.faults] == [
        (1.0, 0, "died", "m0"), (20.0, 0, "restarted", None), (22.0, 1, "load_failed", None),
        (23.0, 1, "load_retried", None), (25.0, 1, "generate_failed", "m1"), (26.0, 1, "died", None),
        (27.0, 1, "retired", None), (29.0, 0, "died", "m2"), (30.0, 0, "restart_pending", None)]
    assert rec.faults[0]["error"] == "ActorUnavailableError: the process died"
    assert rec.faults[1]["version"] == 0 and rec.faults[3]["version"] == 1
    spans = [json.loads(line) for line in (tmp_path / "timeline.jsonl").read_text().splitlines()]
    assert [(s["lane"], s["kind"], s["start"], s["end"]) for s in spans
            if s["kind"] in ("restart", "retired")] == [("gen-0", "restart", 101.0, 120.0),
                                                        ("gen-1", "retired", 126.0, 127.0)]
    assert rec.failures == 3 and rec.load_failures == 2
