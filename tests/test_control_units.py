"""Unit tests of the three control pieces: staleness, queue, dispatcher."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.control.dispatcher import (ActorStatus, Dispatcher, PlannedMinibatch, ProtocolError,
                                                 as_minibatches)
from mindspeed_rl_asp.control.queue import TrainingQueue
from mindspeed_rl_asp.control.staleness import StalenessControl, WindowGap, first_window_gap


# ---------------------------------------------------------------------- staleness
def test_admission_is_areals_formula_on_the_behaviour_version():
    s = StalenessControl(max_staleness=1, global_batch_size=4, total_steps=10)
    assert s.headroom(0) == 8                      # (1 + 0 + 1) x 4 - 0
    s.dispatch(5, 0)
    assert s.admits(3, 0) and not s.admits(4, 0)
    assert s.admits(7, 1)                          # a newer version opens the window
    with pytest.raises(ValueError, match="exceed the headroom"):
        s.dispatch(4, 0)
    s.retract(5, 0)
    assert s.admitted == 0 and s.outstanding() == {}


def test_deadline_check_counts_future_steps_up_to_the_horizon():
    s = StalenessControl(max_staleness=2, global_batch_size=1, total_steps=5)
    s.dispatch(3, 0)                               # p0, p1, p2 at version 0 (due step 2)
    assert s.consume(0, [0]) == [0]
    s.dispatch(1, 1)                               # p3 at version 1 (due step 3)
    assert not s.feasible(1, [1])                  # would leave 2 prompts due by step 2, 1 slot
    assert s.feasible(1, [0])
    short = StalenessControl(max_staleness=2, global_batch_size=1, total_steps=2)
    short.dispatch(3, 0)
    short.consume(0, [0])
    short.dispatch(1, 1)
    assert short.feasible(1, [1])                  # step 1 is the last: nothing is due later
    assert not s.feasible(3, [0])                  # version 0 is past its deadline at step 3


def test_consume_refuses_an_age_above_the_bound():
    s = StalenessControl(max_staleness=1, global_batch_size=1, total_steps=5)
    s.dispatch(1, 0)
    with pytest.raises(ValueError, match="ages must lie in 0..max_staleness=1"):
        s.consume(2, [0])


@pytest.mark.parametrize("sizes, batch, staleness, cap, steps, gap", [
    ([2, 2, 2, 2], 4, 0, 4, 2, None),                     # tiles the batch
    ([3, 3, 2], 4, 0, 8, 2, WindowGap(0, 1, 3, 4, 4)),    # m1 straddles prompt 4
    ([3, 3, 2], 4, 1, 8, 2, None),                        # one version of slack is enough
    ([3, 3, 2], 4, 1, 5, 2, WindowGap(0, 1, 3, 5, 4)),    # ... unless the queue is too small
    ([1, 5, 1, 1], 2, 1, 8, 4, WindowGap(0, 1, 1, 4, 2)),
    ([1, 1, 5, 1], 2, 1, 8, 4, WindowGap(1, 2, 2, 6, 4)),    # fills step 0, never step 1
])
def test_window_gap_examples(sizes, batch, staleness, cap, steps, gap):
    assert first_window_gap(sizes, batch, staleness, cap, steps) == gap


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(1, 6), staleness=st.integers(1, 4), n=st.integers(1, 3),
       sizes=st.lists(st.integers(1, 6), min_size=1, max_size=30))
def test_window_gap_sufficient_condition(batch, staleness, n, sizes):
    """kmax <= eta * B + 1 and capacity >= (B + kmax - 1) x n samples always suffice."""
    kmax = max(sizes)
    steps = sum(sizes) // batch
    if kmax > staleness * batch + 1 or steps == 0:
        return
    assert first_window_gap(sizes, batch, staleness, batch + kmax - 1, steps) is None


# ---------------------------------------------------------------------- queue
def test_queue_counts_in_flight_against_capacity():
    q = TrainingQueue(capacity=8, n_samples_per_prompt=2, high_watermark=1.0, low_watermark=0.0)
    q.reserve(3)
    assert q.fits(1) and not q.fits(2)
    with pytest.raises(ValueError, match="do not fit"):
        q.reserve(2)
    q.arrive(["a", "b", "c"], version=1)
    assert (q.queued_samples, q.in_flight_samples, q.reserved_samples) == (6, 0, 6)
    with pytest.raises(ValueError, match="cannot release"):
        q.arrive(["d"], version=0)                 # nothing was reserved for it


def test_queue_orders_by_version_then_arrival():
    q = TrainingQueue(capacity=16, n_samples_per_prompt=1, high_watermark=1.0, low_watermark=0.0)
    q.reserve(5)
    q.arrive(["n1", "n2"], version=2)
    q.arrive(["o1"], version=1)
    q.arrive(["n3"], version=2)
    q.arrive(["o2"], version=1)
    assert [g.prompt_id for g in q.oldest(3)] == ["o1", "o2", "n1"]
    assert [g.prompt_id for g in q.take(3)] == ["o1", "o2", "n1"]
    assert [g.prompt_id for g in q.groups()] == ["n2", "n3"]
    with pytest.raises(ValueError):
        q.take(3)


def test_queue_watermark_hysteresis():
    q = TrainingQueue(capacity=10, n_samples_per_prompt=1, high_watermark=0.6, low_watermark=0.2)
    q.reserve(10)
    levels = []
    for k in range(7):
        q.arrive([f"p{k}"], 0)
        levels.append(q.throttled)
    assert levels == [False] * 5 + [True, True]     # engages at 6 = 0.6 x 10
    downs = []
    for _ in range(5):
        q.take(1)
        downs.append(q.throttled)
    assert downs == [True, True, True, True, False]  # holds until 2 = 0.2 x 10


def test_queue_rejects_bad_watermarks():
    with pytest.raises(ValueError, match="low_watermark"):
        TrainingQueue(capacity=4, n_samples_per_prompt=1, high_watermark=0.1, low_watermark=0.2)


# ---------------------------------------------------------------------- dispatcher
def plan(*sizes):
    out, k = [], 0
    for m, size in enumerate(sizes):
        out.append(PlannedMinibatch(f"m{m}", tuple(f"p{k + j}" for j in range(size))))
        k += size
    return out


def test_dispatcher_walks_in_order_lowest_idle_actor_first():
    d = Dispatcher(plan(1, 1, 1, 1), num_actors=3)
    assert d.idle_actors() == [0, 1, 2]
    assert d.peek() == (0, False)
    assert d.assign(1) == 0                     # whoever the core picks gets the next one
    assert d.assign(0) == 1
    assert d.idle_actors() == [2]
    assert d.running() == [(0, 1), (1, 0)]


def test_dispatcher_retries_in_plan_order_before_new_work():
    d = Dispatcher(plan(1, 1, 1, 1), num_actors=2)
    d.assign(0), d.assign(1)
    d.fail(1, "m1")
    d.fail(0, "m0")
    assert d.retries == [0, 1] and d.peek() == (0, True)
    assert d.assign(1) == 0 and d.assign(0) == 1 and d.peek() == (2, False)
    with pytest.raises(ProtocolError, match="holding 'm0'"):
        d.complete(1, "m1")
    assert d.complete(1, "m0") == 0


def test_dispatcher_refresh_and_load_protocol():
    d = Dispatcher(plan(1, 1), num_actors=2)
    assert d.needs_refresh(0, 1) and not d.needs_refresh(0, 0)
    d.start_load(0, 1)
    assert d.actors[0].status is ActorStatus.LOADING and d.actors[0].version == 0
    assert not d.needs_refresh(0, 1)             # busy loading
    with pytest.raises(ProtocolError):
        d.assign(0)
    with pytest.raises(ProtocolError):
        d.finish_load(0, 2)
    d.finish_load(0, 1)
    assert d.actors[0].version == 1 and d.actors[0].status is ActorStatus.IDLE
    with pytest.raises(ProtocolError):
        d.start_load(0, 1)                       # never a downgrade or a reload
    with pytest.raises(ProtocolError, match="unknown actor"):
        d.start_load(7, 2)


def test_as_minibatches_accepts_pairs_and_planned():
    mbs = as_minibatches([("a", ["x", "y"]), PlannedMinibatch("b", ("z",))])
    assert mbs == [PlannedMinibatch("a", ("x", "y")), PlannedMinibatch("b", ("z",))]
    with pytest.raises(ValueError, match="expected"):
        as_minibatches([("a", "b", "c")])
