"""One policy-age histogram (control/policy_age.py), in prompt groups, for every reporter:
hand cases, properties, and the core, the trainer's metrics and the simulator agreeing."""
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mindspeed_rl_asp.control.policy_age import age_histogram, age_metrics, merge_age_histograms


def test_hand_cases():
    assert age_histogram(5, [5, 4, 4, 3, 5, 5]) == {0: 3, 1: 2, 2: 1}
    assert list(age_histogram(3, [0, 3, 1])) == [0, 2, 3]
    assert age_histogram(0, []) == {}
    with pytest.raises(ValueError, match="newer"):
        age_histogram(2, [3])
    assert age_metrics({0: 3, 2: 1}) == {"policy_age_hist": {"0": 3, "2": 1}, "policy_age_mean": 0.5,
                                         "policy_age_max": 2}
    assert age_metrics({}) == {"policy_age_hist": {}, "policy_age_mean": 0.0, "policy_age_max": 0}
    assert merge_age_histograms({"0": 2, "1": 1}, {0: 3, 2: 1}) == {0: 5, 1: 1, 2: 1}


steps = st.lists(st.tuples(st.integers(0, 50), st.lists(st.integers(0, 8), max_size=12)), max_size=10)


@given(steps)
def test_merging_the_steps_equals_one_histogram_of_all_groups(run):
    """Summing per-step histograms (what a resumed run and the simulator's totals do) is the
    histogram of every group at once; its JSON form reads back to the same."""
    per_step = [age_histogram(step, [step - lag for lag in lags if step - lag >= 0]) for step, lags in run]
    all_ages = [step - (step - lag) for step, lags in run for lag in lags if step - lag >= 0]
    merged = merge_age_histograms(*per_step)
    assert merged == age_histogram(0, [-a for a in all_ages])
    assert sum(merged.values()) == len(all_ages)
    metrics = age_metrics(merged)
    assert merge_age_histograms(json.loads(json.dumps(metrics["policy_age_hist"]))) == merged
    assert metrics["policy_age_max"] == max(all_ages, default=0)
    assert metrics["policy_age_mean"] == pytest.approx(sum(all_ages) / len(all_ages) if all_ages else 0.0)


def test_the_simulator_per_step_metrics_and_totals_are_one_histogram_of_groups(tmp_path):
    """A simulated run: the per-step metrics in metrics.jsonl (the trainer's shape, made by
    the sim cluster) sum to the run's totals, and both count prompt groups."""
    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.sim.run import simulate

    cfg = load_config(["experiment=table3_qwen3_30b_a3b_asp", "steps=4", "task.num_prompts=128"])
    result = simulate(cfg, run_dir=tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    per_step = merge_age_histograms(*(row["policy_age_hist"] for row in rows))
    assert per_step == result.policy_age_hist
    assert sum(per_step.values()) == 4 * cfg.rl.global_batch_size   # groups, not samples
    assert result.policy_age_mean == pytest.approx(age_metrics(per_step)["policy_age_mean"])
