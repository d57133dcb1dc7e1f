"""A real ``asp-train`` run with DAPO's dynamic sampling (``algo.filter_groups=std``) and
overlong shaping: the generation actors score their samples, the core rejects the groups
whose accuracy has no spread (the tiny policy solves some small mazes every time and
fails bigger ones every time), more prompts are generated until every step is full, and
metrics.jsonl and summary.json count what was rejected. Kept small: tiny model, 3 steps,
64 tokens."""
import json

import pytest

from mindspeed_rl_asp.config.load import load_config, make_run_dir
from mindspeed_rl_asp.runtime.driver import run_training
from mindspeed_rl_asp.tasks import base_prompt_id

pytestmark = pytest.mark.slow

SMALL = ["task.num_prompts=8", "steps=3", "rl.global_batch_size=4", "rl.mini_batch_size=4",
         "rl.n_samples_per_prompt=4", "rl.micro_batch_size=8", "generate.sampling_config.max_tokens=64",
         "scheduler.base_batch_size=2", "scheduler.group_size=2", "mode.queue_capacity=48", "eval.num_prompts=0",
         "scheduler=asp", "mode=async", "algo.filter_groups=std", "algo.overlong_buffer_len=16",
         # Below the correctness weight (1.0) less the integrity weight (0.2): a group with a spread of
         # correctness then has one of reward too, whatever the penalties.
         "algo.overlong_penalty_factor=0.5",
         # One generation actor: rejection and refill are the core's, whichever actor generates.
         "layout.nodes=2", "layout.gen_nodes=1"]


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_dynamic_sampling_rejects_flat_groups_and_every_step_is_full(ray_cluster, tmp_path):
    cfg = load_config([*SMALL, f"run_dir={tmp_path / 'run'}"])
    run_dir = make_run_dir(cfg, "test")
    summary = run_training(cfg, run_dir)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert summary["steps"] == 3 and len(metrics) == 3
    ds = summary["dynamic_sampling"]
    assert ds["filter_groups"] == "std"
    # The plan holds 2 epochs of 8 prompts; more than 4 rejected means the refill (the
    # next passes over the data) was drawn on: 12 trained + rejected > 16 dispatched.
    assert ds["rejected_groups"] > 4 and ds["extra_minibatches"] > 0
    # Every step trained global_batch_size groups, none of them a rejected one.
    consumed = summary["consumed_prompt_ids"]
    assert len(consumed) == len(set(consumed)) == 3 * 4
    assert ds["rejected_groups"] == summary["unused_prompts"]["rejected"]
    assert sum(m["rejected_groups"] for m in metrics) <= ds["rejected_groups"]
    assert sum(m["extra_minibatches"] for m in metrics) <= ds["extra_minibatches"]
    timeline = read_jsonl(run_dir / "timeline.jsonl")
    dispatched = [s for s in timeline if s["kind"] == "generate"]
    assert sum(s["info"]["prompts"] for s in dispatched) >= 12 + ds["rejected_groups"]
    for m in metrics:
        assert m["samples"] == 16 and "overlong" in m["reward_components"]
        assert m["reward_components"]["overlong"] <= 0.0
        assert m["informative_groups"] == 4    # only groups with a spread were trained
    assert len({base_prompt_id(p) for p in consumed}) <= summary["task"]["prompts"] == 8
