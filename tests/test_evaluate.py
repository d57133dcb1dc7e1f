"""Held-out comparison statistics: per-size rates and the paired change with its interval."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.policy.evaluate import ScoredSample, paired_change, rates_by_size


def sample(pid, correct, size=4, integrity=1.0):
    return ScoredSample(pid, size, "", 5, True, integrity, float(correct), float(correct))


def test_rates_by_size_groups_and_sorts():
    samples = [sample("a", 1, 5), sample("b", 0, 3), sample("c", 1, 3), sample("d", 0, 5, integrity=0.0)]
    rates = rates_by_size(samples)
    assert list(rates) == [3, 5]
    assert rates[3] == {"samples": 2, "integrity_rate": 1.0, "correctness_rate": 0.5}
    assert rates[5] == {"samples": 2, "integrity_rate": 0.5, "correctness_rate": 0.5}


def test_paired_change_hand_computed():
    # Three prompts, two samples each: per-prompt means before (0, .5, 1) and after (.5, 1, 1).
    before = [sample("a", 0), sample("a", 0), sample("b", 1), sample("b", 0), sample("c", 1), sample("c", 1)]
    after = [sample("a", 1), sample("a", 0), sample("b", 1), sample("b", 1), sample("c", 1), sample("c", 1)]
    c = paired_change(before, after)
    assert c["before"] == pytest.approx(0.5) and c["after"] == pytest.approx(5 / 6)
    assert c["change"] == pytest.approx(1 / 3)
    sd = math.sqrt(((0.5 - 1 / 3) ** 2 * 2 + (1 / 3) ** 2) / 2)  # diffs .5, .5, 0
    assert c["stderr"] == pytest.approx(sd / math.sqrt(3))
    assert c["ci95"] == pytest.approx([1 / 3 - 1.96 * sd / math.sqrt(3), 1 / 3 + 1.96 * sd / math.sqrt(3)])
    assert (c["improved"], c["worsened"], c["prompts"]) == (2, 0, 3)


def test_paired_change_refuses_different_prompts():
    with pytest.raises(ValueError, match="same prompts"):
        paired_change([sample("a", 1)], [sample("b", 1)])
    with pytest.raises(ValueError, match="no samples"):
        paired_change([], [])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=2, max_size=40))
def test_paired_change_is_antisymmetric_and_bounded(pairs):
    before = [sample(str(i), b) for i, (b, _) in enumerate(pairs)]
    after = [sample(str(i), a) for i, (_, a) in enumerate(pairs)]
    forward, backward = paired_change(before, after), paired_change(after, before)
    assert forward["change"] == pytest.approx(-backward["change"])
    assert forward["stderr"] == pytest.approx(backward["stderr"])
    assert forward["change"] == pytest.approx(forward["after"] - forward["before"])
    assert -1 <= forward["change"] <= 1 and forward["ci95"][0] <= forward["change"] <= forward["ci95"][1]
    assert forward["improved"] == backward["worsened"]


def test_same_checkpoint_twice_changes_nothing_and_progress_counts_all(random_policy_dir):
    from mindspeed_rl_asp.engines.base import SamplingParams
    from mindspeed_rl_asp.policy.evaluate import held_out_comparison
    from mindspeed_rl_asp.tasks.maze import MazeRewardWeights, MazeTaskSpec, make_dataset

    calls = []
    prompts = make_dataset(3, 0, MazeTaskSpec(min_size=3, max_size=4))
    results = held_out_comparison({"a": random_policy_dir, "b": random_policy_dir}, prompts,
                                  SamplingParams(max_tokens=8, seed=3), MazeRewardWeights(), {"num_threads": 1},
                                  n_samples_per_prompt=2, progress=lambda *call: calls.append(call))
    # Same weights, same seeds: the very same samples, so exactly no change.
    assert results["a"]["samples"] == results["b"]["samples"] == 6
    assert results["change"]["correctness"]["change"] == 0 and results["change"]["integrity"]["stderr"] == 0
    assert calls[-1] == ("b", 12, 12) and [c[1] for c in calls] == sorted(c[1] for c in calls)
    assert {c[0] for c in calls} == {"a", "b"}
