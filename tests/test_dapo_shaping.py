"""DAPO's overlong reward shaping and the filter metric (algo/dapo.py), against values
computed by hand from the paper's formula: with L_max = 100 and L_cache = 20 a response of
|y| tokens gets 0 up to 80 tokens and ((100 - 20) - |y|) / 20 beyond, times the factor."""
from __future__ import annotations

import pytest

from mindspeed_rl_asp.algo.dapo import (check_filter_metric, filter_metric, overlong_penalty, score_samples,
                                        shape_score)


@pytest.mark.parametrize("length, factor, expected", [
    (0, 1.0, 0.0), (80, 1.0, 0.0), (81, 1.0, -0.05), (90, 1.0, -0.5), (99, 1.0, -0.95), (100, 1.0, -1.0),
    (130, 1.0, -1.0),            # never below -factor (the excess is capped at the buffer)
    (90, 0.5, -0.25), (100, 2.0, -2.0), (95, 0.0, 0.0),
])
def test_overlong_penalty_by_hand(length, factor, expected):
    assert overlong_penalty(length, 100, 20, factor) == pytest.approx(expected, abs=1e-12)


def test_overlong_penalty_off_and_bad_values():
    assert overlong_penalty(100, 100, 0, 1.0) == 0.0
    with pytest.raises(ValueError, match="overlong_buffer_len=100 must be below generate.sampling_config.max_tokens=100"):
        overlong_penalty(10, 100, 100, 1.0)
    with pytest.raises(ValueError, match="none may be negative"):
        overlong_penalty(10, 100, -1, 1.0)


def test_shaping_is_a_reward_component():
    score = {"reward": 1.5, "correctness": 1.0, "integrity": 1.0, "components": {"acc": 1.0, "format": 0.5}}
    shaped = shape_score(score, 95, 100, 20, 1.0)
    assert shaped["reward"] == pytest.approx(1.5 - 0.75)
    assert shaped["components"] == {"acc": 1.0, "format": 0.5, "overlong": pytest.approx(-0.75)}
    assert score["components"] == {"acc": 1.0, "format": 0.5}          # the input is not changed
    assert shape_score(score, 95, 100, 0, 1.0) == score


def test_score_samples_shapes_each_sample_by_its_length():
    def score_fn(prompt, text):
        return {"reward": 1.0, "correctness": 1.0, "integrity": 1.0, "components": {"acc": 1.0}}
    scores = score_samples(score_fn, None, ["a", "b"], [10, 100],
                           {"overlong_buffer_len": 20, "overlong_penalty_factor": 1.0}, 100)
    assert [s["reward"] for s in scores] == [1.0, 0.0]
    assert [s["components"]["overlong"] for s in scores] == [0.0, -1.0]


def test_filter_metric_reads_a_component_the_correctness_or_the_reward():
    score = {"reward": 0.25, "correctness": 0.0, "integrity": 1.0, "components": {"maze_integrity": 1.0, "x": 0.3}}
    assert filter_metric(score, "x") == 0.3
    assert filter_metric(score, "acc") == 0.0
    assert filter_metric(score, "reward") == 0.25
    with pytest.raises(ValueError, match="algo.filter_groups_metric='nope' is not a reward of this task"):
        filter_metric(score, "nope")
    check_filter_metric("acc", [])
