"""Bubbles per engine (metrics/timeline.py): the static padding bubble and continuous
batching's shortfall below capacity with its tail share; the recorder writes both."""
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.metrics.timeline import (TAIL_SHARE, padding_bubble, running_capacity, slot_bubble,
                                               slot_use, tail_step_share)
from mindspeed_rl_asp.sim import batching

lengths_st = st.lists(st.integers(min_value=1, max_value=200), min_size=1, max_size=40)
capacity_st = st.integers(min_value=1, max_value=64)


def test_one_definition_of_the_tail():
    assert batching.TAIL_SHARE is TAIL_SHARE == 0.25


def test_worked_example():
    # capacity 2: [4, 1] start at 0; the 1 ends at 1, [2] joins 1..3, [1] joins 3..4.
    use = slot_use([4, 1, 2, 1], 2)
    assert use.steps == 4 and use.useful == 8 and use.capacity == 2
    assert use.bubble == 0.0 and use.tail_steps == 0
    # one long answer: 8 rows, capacity 8, one of length 10, seven of length 1.
    use = slot_use([10] + [1] * 7, 8)
    assert use.steps == 10 and use.tail_steps == 9      # 1 running < 0.25 x 8 for steps 1..9
    assert abs(use.bubble - (1 - 17 / 80)) < 1e-12


def test_capacity_per_engine():
    assert running_capacity("static", 32, 8) == 32
    assert running_capacity("continuous", 32, 8) == 8
    assert running_capacity("continuous", 4, 64) == 4
    assert running_capacity("continuous", 4, None) == 4


@given(lengths_st, capacity_st)
@settings(max_examples=200, deadline=None)
def test_bounds(lengths, capacity):
    use = slot_use(lengths, capacity)
    assert 0.0 <= use.bubble <= 1.0 and 0.0 <= use.tail_share <= 1.0
    assert max(lengths) <= use.steps <= sum(lengths)
    assert use.useful == sum(lengths)


@given(lengths_st, st.integers(min_value=0, max_value=20))
@settings(max_examples=200, deadline=None)
def test_equals_padding_bubble_when_every_row_fits(lengths, extra):
    use = slot_use(lengths, len(lengths) + extra)
    assert use.steps == max(lengths)
    assert abs(slot_bubble([lengths], [len(lengths) + extra]) - padding_bubble([lengths])) < 1e-12
    assert abs(slot_bubble([lengths], [running_capacity("static", len(lengths))]) - padding_bubble([lengths])) < 1e-12


@given(lengths_st, capacity_st)
@settings(max_examples=200, deadline=None)
def test_more_slots_never_take_more_steps(lengths, capacity):
    """Monotone in capacity: one more slot never lengthens the minibatch, and every
    capacity's steps lie between the full-batch and the one-slot schedules."""
    a, b = slot_use(lengths, capacity), slot_use(lengths, capacity + 1)
    assert b.steps <= a.steps
    assert max(lengths) <= a.steps <= slot_use(lengths, 1).steps == sum(lengths)
    assert slot_use(lengths, 1).bubble == 0.0


@given(lengths_st, capacity_st, st.integers(min_value=1, max_value=200))
@settings(max_examples=200, deadline=None)
def test_a_longer_straggler_only_adds_bubble_and_tail(lengths, capacity, more):
    """Monotone in the longest answer: stretching it (every row fitting at once) leaves
    the others' work alone, so the shortfall and the tail can only grow."""
    capacity = max(capacity, len(lengths))
    i = max(range(len(lengths)), key=lambda k: lengths[k])
    longer = list(lengths)
    longer[i] += more
    a, b = slot_use(lengths, capacity), slot_use(longer, capacity)
    assert b.bubble >= a.bubble - 1e-12
    assert b.tail_steps >= a.tail_steps


@given(st.lists(st.tuples(lengths_st, capacity_st), min_size=1, max_size=5))
@settings(max_examples=100, deadline=None)
def test_window_aggregates_are_weighted(groups):
    lengths = [g for g, _ in groups]
    caps = [c for _, c in groups]
    uses = [slot_use(g, c) for g, c in groups]
    assert 0.0 <= slot_bubble(lengths, caps) <= 1.0 and 0.0 <= tail_step_share(lengths, caps) <= 1.0
    assert abs(tail_step_share(lengths, caps) - sum(u.tail_steps for u in uses) / sum(u.steps for u in uses)) < 1e-12
    assert slot_bubble([], []) == 0.0 and tail_step_share([], []) == 0.0


def test_recorder_writes_slot_bubble_by_batching(tmp_path):
    import json

    from mindspeed_rl_asp.control.reports import MinibatchReport
    from mindspeed_rl_asp.metrics.recorder import RunRecorder

    lengths = [10] + [1] * 7
    out = {}
    for batching in ("static", "continuous"):
        run = tmp_path / batching
        run.mkdir()
        rec = RunRecorder(run, 1, 1, tensorboard=False, engine={"batching": batching, "max_num_seqs": 4})
        rec.generated(MinibatchReport("mb0", 0, 0, 0.0, 1.0, lengths), 2)
        report = SimpleNamespace(step=0, version=1, start=1.0, end=2.0, metrics={})
        snap = SimpleNamespace(queued_samples=0, in_flight_samples=0, queue_capacity=8, throttled=False,
                               trainer_wait=False, rejected_prompts=0, extra_minibatches=0)
        out[batching] = rec.stepped(report, 2.0, 2.1, snap)
        rec.close()
        row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
        assert "slot_bubble" in json.dumps(row) and "tail_step_share" in json.dumps(row)
    assert out["static"]["slot_bubble"] == out["static"]["padding_bubble"] == padding_bubble([lengths])
    use = slot_use(lengths, 4)
    assert out["continuous"]["padding_bubble"] == padding_bubble([lengths])
    assert out["continuous"]["slot_bubble"] == use.bubble
    assert out["continuous"]["tail_step_share"] == use.tail_share
    assert out["static"]["tail_step_share"] == slot_use(lengths, 8).tail_share
