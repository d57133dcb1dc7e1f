"""Runs longer than one pass over the prompts: epoch ids and the replayed plan."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mindspeed_rl_asp.schedule.configured import repeat_for_epochs, step_aligned_plan
from mindspeed_rl_asp.schedule.plan import SchedulerParams, make_plan
from mindspeed_rl_asp.tasks import base_prompt_id, epoch_prompt_id, epochs_needed


@pytest.mark.parametrize("num_prompts, steps, batch, epochs", [
    (64, 8, 8, 1), (64, 9, 8, 2), (512, 60, 8, 1), (64, 60, 8, 8), (10, 1, 8, 1), (8, 0, 8, 1),
])
def test_epochs_needed(num_prompts, steps, batch, epochs):
    assert epochs_needed(num_prompts, steps, batch) == epochs


def test_epoch_ids_round_trip_and_epoch_zero_is_plain():
    assert epoch_prompt_id("maze-0-3", 0) == "maze-0-3"
    assert epoch_prompt_id("maze-0-3", 2) == "maze-0-3@e2"
    assert base_prompt_id("maze-0-3@e2") == base_prompt_id("maze-0-3") == "maze-0-3"
    with pytest.raises(ValueError, match="already contains"):
        epoch_prompt_id("maze-0-3@e1", 1)


@given(st.lists(st.integers(1, 200), min_size=4, max_size=40), st.integers(1, 4))
def test_replayed_plan_holds_every_prompt_once_per_epoch(lengths, epochs):
    items = [(f"p{i}", float(n)) for i, n in enumerate(lengths)]
    plan = make_plan(items, SchedulerParams(name="asp", base_batch_size=2, slack=1, group_size=2),
                     n_samples_per_prompt=2)
    minibatches = repeat_for_epochs(plan, epochs)
    ids = [pid for _, mb in minibatches for pid in mb]
    assert len(ids) == len(set(ids)) == len(items) * epochs
    assert len({mb_id for mb_id, _ in minibatches}) == len(minibatches)
    per_epoch = len(minibatches) // epochs
    for e in range(epochs):
        # Each epoch replays the plan in its order, under that epoch's ids.
        chunk = minibatches[e * per_epoch:(e + 1) * per_epoch]
        assert [[base_prompt_id(p) for p in mb] for _, mb in chunk] == [list(mb.ids) for mb in plan.minibatches()]
        assert all(p == epoch_prompt_id(base_prompt_id(p), e) for _, mb in chunk for p in mb)


def test_prompt_epoch_reads_the_epoch_back():
    from mindspeed_rl_asp.tasks import prompt_epoch

    assert [prompt_epoch(epoch_prompt_id("maze-0-7", e)) for e in range(4)] == [0, 1, 2, 3]


def test_step_correctness_is_split_by_epoch_and_summed_across_steps():
    from mindspeed_rl_asp.metrics.report import epoch_means
    from mindspeed_rl_asp.runtime.training_unit import epoch_sums

    # A step that straddles epochs 0 and 1: 3 samples of epoch 0 (2 correct), 1 of epoch 1.
    rows = [("a", None), ("a", None), ("b", None), ("a@e1", None)]
    scores = [{"correctness": c} for c in (1.0, 0.0, 1.0, 1.0)]
    step0 = epoch_sums(rows, scores)
    assert step0 == {"0": [2.0, 3], "1": [1.0, 1]}
    step1 = epoch_sums([("b@e1", None)] * 3, [{"correctness": 0.0}] * 3)
    assert epoch_means([{"epoch_correctness": step0}, {"epoch_correctness": step1}, {}]) == [
        (0, pytest.approx(2 / 3), 3), (1, pytest.approx(1 / 4), 4)]


def test_step_integrity_is_split_by_epoch_like_correctness():
    from mindspeed_rl_asp.metrics.report import epoch_means
    from mindspeed_rl_asp.runtime.training_unit import epoch_sums

    rows = [("a", None), ("b", None), ("a@e1", None), ("b@e1", None)]
    scores = [{"correctness": c, "integrity": i} for c, i in ((0.0, 1.0), (0.0, 0.0), (1.0, 1.0), (0.0, 1.0))]
    assert epoch_sums(rows, scores, "integrity") == {"0": [1.0, 2], "1": [2.0, 2]}
    assert epoch_sums(rows, scores) == {"0": [0.0, 2], "1": [1.0, 2]}  # correctness stays the default
    step = {"epoch_integrity": epoch_sums(rows, scores, "integrity")}
    assert epoch_means([step], "epoch_integrity") == [(0, pytest.approx(0.5), 2), (1, pytest.approx(1.0), 2)]


def test_step_metrics_from_hand_built_samples():
    """training_unit.step_metrics, the trainer's per-step metrics, on 2 groups of 2:
    group a has a reward spread (a GRPO signal), group b (epoch 1, one version older) not;
    ages count groups."""
    from mindspeed_rl_asp.runtime.training_unit import step_metrics

    rows = [("a", [1], [5, 6], None, 3), ("a", [1], [5], None, 3), ("b@e1", [2], [7, 8, 9], None, 2),
            ("b@e1", [2], [7], None, 2)]
    scores = [{"reward": r, "integrity": 1.0, "correctness": c, "components": {"x": r}}
              for r, c in ((1.0, 1.0), (0.0, 0.0), (0.5, 0.0), (0.5, 0.0))]
    m = step_metrics(3, rows, scores, [3, 2])
    assert m["reward_mean"] == pytest.approx(0.5) and m["reward_components"] == {"x": pytest.approx(0.5)}
    assert m["correctness_rate"] == 0.25 and m["integrity_rate"] == 1.0
    assert m["samples"] == 4 and m["response_tokens"] == 7 and m["response_length_mean"] == 1.75
    assert m["informative_groups"] == 1 and m["informative_response_tokens"] == 3
    assert m["epoch_correctness"] == {"0": [1.0, 2], "1": [0.0, 2]}
    assert (m["policy_age_hist"], m["policy_age_mean"], m["policy_age_max"]) == ({"0": 1, "1": 1}, 0.5, 1)


def test_partial_epochs_are_flagged():
    from mindspeed_rl_asp.metrics.report import is_complete

    assert is_complete([(0, 0.5, 256), (1, 0.6, 256), (2, 0.4, 128)]) == [True, True, False]
    assert is_complete([]) == []


@given(st.lists(st.integers(1, 200), min_size=4, max_size=30), st.integers(1, 3), st.integers(2, 9),
       st.sampled_from(["asp", "fifo", "sorted"]))
def test_step_aligned_plan_keeps_every_minibatch_inside_one_step(lengths, epochs, batch, planner):
    items = [(f"p{i}", float(n)) for i, n in enumerate(lengths)]
    params = SchedulerParams(name=planner, base_batch_size=3, slack=1 if planner == "asp" else 0, group_size=2)
    plan, minibatches = step_aligned_plan(items, params, 2, batch, epochs)
    ids = [pid for _, mb in minibatches for pid in mb]
    assert ids == plan.prompt_ids() and len(ids) == len(set(ids)) == len(items) * epochs
    stream = [epoch_prompt_id(i, e) for e in range(epochs) for i, _ in items]
    position = {pid: k for k, pid in enumerate(stream)}
    dispatched = 0
    for mb_id, mb in minibatches:
        steps = {position[p] // batch for p in mb}
        assert len(steps) == 1 and mb_id.startswith(f"s{steps.pop()}m")  # never straddles a step
        dispatched += len(mb)
    # Steps go in data order: the first k steps hold exactly the first k * batch prompts.
    for k in range(1, len(stream) // batch + 1):
        first = [pid for _, mb in minibatches for pid in mb if position[pid] // batch < k]
        assert set(first) == set(stream[:k * batch])
    assert plan.planner == f"{planner} per step" and plan.params.group_size == 1
