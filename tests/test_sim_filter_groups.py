"""``asp-simulate`` with DAPO's dynamic sampling: the simulator's rewards (sim/rewards.py)
reach the real core, whose reject rule drops the flat groups, so more minibatches are
generated than a run without rejections needs, and the prompt ledger stays exact."""
import json

import pytest

from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.sim.rewards import group_rewards, solve_rate
from mindspeed_rl_asp.sim.run import simulate

SHORT = ["steps=4", "task.num_prompts=128"]


@pytest.mark.parametrize("experiment", ["table3_qwen3_30b_a3b_asp", "table3_qwen3_30b_a3b_hybrid"])
def test_filtering_generates_extra_minibatches_and_the_ledger_is_exact(experiment, tmp_path):
    base = load_config([f"experiment={experiment}", *SHORT])
    plain = simulate(base, tmp_path / "plain")
    cfg = load_config([f"experiment={experiment}", *SHORT, "algo.filter_groups=std"])
    result = simulate(cfg, tmp_path / "std")
    ds, b = result.dynamic_sampling, cfg.rl.global_batch_size
    assert result.steps == 4 and ds["consumed_prompts"] == 4 * b
    assert ds["rejected_groups"] > 0 and ds["extra_minibatches"] > 0
    # More generated than steps x global_batch_size / base size, and than without filtering.
    assert ds["generated_minibatches"] > 4 * b / cfg.scheduler.base_batch_size
    assert ds["generated_minibatches"] > plain.dynamic_sampling["generated_minibatches"]
    # Every dispatched prompt is trained, rejected or left over at the end, once.
    assert ds["dispatched_prompts"] == ds["consumed_prompts"] + ds["rejected_groups"] + ds["unused_prompts"]
    assert plain.dynamic_sampling["rejected_groups"] == 0
    metrics = [json.loads(x) for x in (tmp_path / "std" / "metrics.jsonl").read_text().splitlines()]
    assert sum(m["rejected_groups"] for m in metrics) <= ds["rejected_groups"]
    assert result.total_s > plain.total_s     # the rejected groups' generation time is spent too
    # Effective tokens: filtering trains only groups with a reward spread; without it the
    # flat groups' tokens are trained too and do not count.
    assert ds["effective_tokens"] == sum(m["response_tokens"] for m in metrics)
    assert all(m["informative_groups"] == b for m in metrics)
    plain_metrics = [json.loads(x) for x in (tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()]
    assert 0 < plain.dynamic_sampling["effective_tokens"] < sum(m["response_tokens"] for m in plain_metrics)


def test_simulated_rewards_are_deterministic_and_follow_the_solve_rate():
    n = 4000
    rates = [solve_rate(f"p{i}", 0.3, 1.0) for i in range(n)]
    assert abs(sum(rates) / n - 0.3) < 0.02                   # Beta mean
    assert group_rewards("p1@e3", 2, 8, 0.3, 1.0) == group_rewards("p1@e3", 2, 8, 0.3, 1.0)
    assert solve_rate("p1@e3", 0.3, 1.0) == solve_rate("p1", 0.3, 1.0)   # a prompt keeps its difficulty
    with pytest.raises(ValueError, match="sim.solve_rate=1.0 must lie in"):
        solve_rate("p", 1.0, 1.0)
