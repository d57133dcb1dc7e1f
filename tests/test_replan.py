"""``ControlCore.replan_pending``: swapping the not-yet-dispatched minibatches mid-run.

Property tests drive whole runs through the one loop (the ``Shell`` of
test_control_properties.py, which checks every invariant after every event) and replan
at random points with random new cuts of the pending prompts: some keep the sizes (always
live), some recut at random (the core must refuse those the window rule rejects, and
then be unchanged). Every run must still train every step, keep the ledger a partition
and never dispatch a prompt twice."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mindspeed_rl_asp.control.clusters import OrderedCluster, random_chooser
from mindspeed_rl_asp.control.core import ControlConfig, ControlCore, Generate, ProtocolError
from mindspeed_rl_asp.control.loop import Done, Loop
from mindspeed_rl_asp.control.staleness import first_window_gap

from test_control_properties import Shell, hypothesis_chooser, setups


class ReplanShell(Shell):
    """The Shell, also checking that no prompt is ever dispatched twice (a replan must
    not re-offer a dispatched prompt) and that dispatched minibatches never change."""

    def __init__(self, cfg, mbs, chooser=None) -> None:
        super().__init__(cfg, mbs, chooser)
        self.dispatched: dict[str, str] = {}   # prompt id -> minibatch id it went out in
        self.retried: set[str] = set()         # minibatch ids that failed (may go again)
        self.replans = self.refusals = 0

    def check_action(self, a) -> None:
        if isinstance(a, Generate):
            for p in a.prompt_ids:
                again = self.dispatched.get(p)
                assert again is None or (again == a.minibatch_id and again in self.retried), \
                    f"prompt {p} dispatched again in {a.minibatch_id} (first in {again})"
                self.dispatched[p] = a.minibatch_id
            self.retried.discard(a.minibatch_id)
        super().check_action(a)

    def observed(self, event, core, t) -> None:
        if isinstance(event.action, Generate) and not isinstance(event, Done):
            self.retried.add(event.action.minibatch_id)
        super().observed(event, core, t)

    def replan(self, rng: random.Random, keep_sizes: bool) -> bool:
        """Cut the pending prompts anew (shuffled; same sizes or random ones) and hand
        them to the core. Returns whether it took them; a refusal must change nothing."""
        core = self.core
        d = core.dispatcher
        pending = d.minibatches[d.cursor:]
        if not pending or core.finished:
            return False
        ids = [p for mb in pending for p in mb.prompt_ids]
        rng.shuffle(ids)
        if keep_sizes:
            sizes = [mb.size for mb in pending]
        else:
            sizes, left = [], len(ids)
            while left:
                sizes.append(min(left, rng.randint(1, 5)))
                left -= sizes[-1]
        k, new = 0, []
        for j, size in enumerate(sizes):
            new.append((f"r{self.replans + self.refusals}.{j}", tuple(ids[k:k + size])))
            k += size
        before = (core.snapshot(), core.ledger(), d.minibatches, dict(d.index_of), d.cursor, list(d.retries))
        kept = d.minibatches[:d.cursor]
        try:
            core.replan_pending(new)
        except ValueError as error:
            assert "can never be filled" in str(error) or "queue_capacity" in str(error), error
            assert (core.snapshot(), core.ledger(), d.minibatches, dict(d.index_of), d.cursor,
                    list(d.retries)) == before, "a refused replan changed the core"
            self.refusals += 1
            return False
        assert d.minibatches[:d.cursor] == kept, "dispatched minibatches changed"
        assert [(mb.minibatch_id, mb.prompt_ids) for mb in d.minibatches[d.cursor:]] == new
        # Only the count of pending minibatches may differ (another cut of the same prompts).
        assert core.ledger() == before[1]
        assert replace(core.snapshot(), pending_minibatches=0) == replace(before[0], pending_minibatches=0)
        self.replans += 1
        return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=setups(), seed=st.integers(0, 2**16), starve=st.sampled_from([0.0, 0.9]),
       replan_rate=st.sampled_from([0.1, 0.3, 1.0]))
def test_runs_replanned_at_random_points_keep_every_invariant(setup, seed, starve, replan_rate):
    """Random event order with a few failures; replans at random points; the run ends
    with every step trained, every prompt consumed at most once."""
    cfg, mbs = setup
    rng = random.Random(seed)
    shell = ReplanShell(cfg, mbs, chooser=random_chooser(seed, fail_rate=0.3, max_failures=3, starve=starve))
    budget = 5 * (len(shell.all_ids) + shell.core.total_steps + cfg.num_actors) + 20
    while True:
        if rng.random() < replan_rate:
            shell.replan(rng, keep_sizes=rng.random() < 0.5)
        if not shell.advance():
            break
        budget -= 1
        assert budget > 0, f"no progress: {shell.core.snapshot()}"
    shell.check_finish()
    assert len(shell.consumed) == len(set(shell.consumed)) == shell.core.total_steps * cfg.global_batch_size


class ReplanMachine(RuleBasedStateMachine):
    """Hypothesis picks the event order, the failures and when (and how) to replan."""

    @initialize(setup=setups(), seed=st.integers(0, 2**16))
    def setup(self, setup, seed) -> None:
        self.shell = ReplanShell(*setup)
        self.seed = seed
        self.failures = 0
        self.data = None

        def choose(pending):
            index, fail = hypothesis_chooser(self.data, lambda: self.failures < 4)(pending)
            self.failures += fail
            return index, fail
        self.shell.chooser = choose

    @rule(data=st.data())
    def event(self, data) -> None:
        self.data = data
        self.shell.advance()

    @rule(seed=st.integers(0, 2**16), keep_sizes=st.booleans())
    def replan(self, seed, keep_sizes) -> None:
        if self.shell.finish is None:
            took = self.shell.replan(random.Random(seed), keep_sizes)
            # Same sizes in the same order pass the window rule whenever the plan did.
            pending = self.shell.core.dispatcher.minibatches[self.shell.core.dispatcher.cursor:]
            assert took or not keep_sizes or not pending

    @invariant()
    def invariants(self) -> None:
        if hasattr(self, "shell") and self.shell.finish is None:
            self.shell.check()

    def teardown(self) -> None:
        if hasattr(self, "shell"):
            self.shell.drain(self.seed)
            assert len(set(self.shell.consumed)) == len(self.shell.consumed)


ReplanMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestReplanMachine = ReplanMachine.TestCase


# ---------------------------------------------------------------------- examples
def _core(sizes, batch=2, staleness=1, capacity=8, actors=1):
    cfg = ControlConfig(num_actors=actors, global_batch_size=batch, n_samples_per_prompt=1,
                        max_staleness=staleness, queue_capacity=capacity, high_watermark=1.0, low_watermark=0.0)
    ids = iter(f"p{i}" for i in range(sum(sizes)))
    return ControlCore(cfg, [(f"m{k}", tuple(next(ids) for _ in range(s))) for k, s in enumerate(sizes)])


def test_replan_replaces_only_what_is_not_dispatched():
    core = _core([2, 2, 2, 2])
    loop = Loop(core, OrderedCluster(random_chooser(0)))
    loop.advance()                       # m0 dispatched and done
    d = core.dispatcher
    assert d.cursor == 1
    core.replan_pending([("n0", ("p7", "p4")), ("n1", ("p6", "p5")), ("n2", ("p3", "p2"))])
    assert [mb.minibatch_id for mb in d.minibatches] == ["m0", "n0", "n1", "n2"]
    assert d.index_of == {"m0": 0, "n0": 1, "n1": 2, "n2": 3}
    while loop.advance():
        pass
    assert core.consumed_ids() == ["p0", "p1", "p7", "p4", "p6", "p5", "p3", "p2"]


def test_a_replan_with_other_prompts_is_refused_naming_them():
    core = _core([2, 2, 2])
    before = core.dispatcher.minibatches
    with pytest.raises(ValueError, match=r"missing 1 \['p5'\], extra or repeated 1 \['p9'\]"):
        core.replan_pending([("n0", ("p0", "p1", "p2", "p3", "p4", "p9"))])
    with pytest.raises(ValueError, match=r"extra or repeated 1 \['p1'\]"):
        core.replan_pending([("n0", ("p0", "p1", "p2", "p3", "p4", "p5", "p1"))])
    with pytest.raises(ValueError, match="duplicate minibatch id 'n0'"):
        core.replan_pending([("n0", ("p0", "p1", "p2")), ("n0", ("p3", "p4", "p5"))])
    assert core.dispatcher.minibatches == before


def test_a_replan_the_window_rule_rejects_leaves_the_core_unchanged():
    # max_staleness=0: minibatches must meet every multiple of global_batch_size=2.
    core = _core([2, 2, 2], staleness=0)
    sizes = [1, 2, 2, 1]
    assert first_window_gap(sizes, 2, 0, 8, 3) is not None
    snap = core.snapshot()
    ids = iter(f"p{i}" for i in range(6))
    with pytest.raises(ValueError, match="step 0 can never be filled"):
        core.replan_pending([(f"n{k}", tuple(next(ids) for _ in range(s))) for k, s in enumerate(sizes)])
    assert core.snapshot() == snap and [mb.minibatch_id for mb in core.dispatcher.minibatches] == ["m0", "m1", "m2"]
    core.replan_pending([("n0", ("p1", "p0")), ("n1", ("p3", "p2")), ("n2", ("p5", "p4"))])
    assert [mb.prompt_ids for mb in core.dispatcher.minibatches] == [("p1", "p0"), ("p3", "p2"), ("p5", "p4")]


def test_a_replan_that_cannot_fit_the_queue_is_refused():
    core = _core([2, 2, 2], capacity=4)
    with pytest.raises(ValueError, match="queue_capacity=4 samples cannot hold minibatch 'n0'"):
        core.replan_pending([("n0", ("p0", "p1", "p2", "p3", "p4")), ("n1", ("p5",))])


def test_retries_stay_and_are_dispatched_first():
    core = _core([2, 2, 2])
    (gen,) = [a for a in core.poll() if isinstance(a, Generate)]
    core.on_minibatch_failed(gen.actor, gen.minibatch_id)     # m0 awaits a retry
    core.replan_pending([("n0", ("p5", "p4", "p3", "p2"))])
    (again,) = [a for a in core.poll() if isinstance(a, Generate)]
    assert again.minibatch_id == "m0" and core.dispatcher.retries == []
    assert core.ledger().pending == {"p2", "p3", "p4", "p5"}


def test_no_replan_after_finish():
    core = _core([2])
    loop = Loop(core, OrderedCluster(random_chooser(0)))
    while loop.advance():
        pass
    with pytest.raises(ProtocolError, match="after Finish"):
        core.replan_pending([])
