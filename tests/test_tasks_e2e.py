"""asp-train end to end on a user's job: a saved random Qwen3 checkpoint with its own
tokenizer and chat template, trained for 2 steps on (1) a jsonl math dataset with a math
reward and a user's reward function, (2) maze rows in MAZE-REASONING-GRPO-V0.1's own
layout (parquet), scored with the original AlphaMaze rewards and MazeBench's rule, planned
with the lm predictor in the loop."""
import json

import pytest

from hf_random import save_random_checkpoint
from mindspeed_rl_asp.cli.train import main

pytestmark = pytest.mark.slow

SMALL = ["steps=2", "rl.global_batch_size=2", "rl.mini_batch_size=2", "rl.n_samples_per_prompt=2",
         "rl.micro_batch_size=4", "generate.sampling_config.max_tokens=16", "scheduler.base_batch_size=2",
         "scheduler.group_size=2", "mode.queue_capacity=32", "eval.num_prompts=2", "eval.samples_per_prompt=1",
         # One generation actor: the checks are on the task, its rewards and the export, not on actors.
         "layout.nodes=2", "layout.gen_nodes=1"]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return save_random_checkpoint(tmp_path_factory.mktemp("random_qwen3"), "qwen3")


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return summary, metrics


def test_jsonl_math_dataset_with_a_math_reward(ray_cluster, tmp_path, qwen3_dir, monkeypatch):
    rows = [{"problem": f"What is {i} * 3?", "answer": str(3 * i),
             "solution": f"<think>{i} times 3</think> \\boxed{{{3 * i}}}"} for i in range(8)]
    train, held = jsonl(tmp_path / "train.jsonl", rows), jsonl(tmp_path / "held.jsonl", rows[:3])
    (tmp_path / "e2e_user_rewards.py").write_text(
        "def mentions_answer(response, prompt):\n    return float(prompt.answer in response)\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # importable here; the trainer actor gets the path from the task
    run_dir = tmp_path / "run"
    # The planner (asp) reads each prompt's length off its reference solution (predictor=reference);
    # a predictor fitted on a dataset without reference lengths (lm) is the maze-rows test below.
    rc = main(["task=dataset", f"task.path={train}", f"task.eval_path={held}", "task.prompt_key=problem",
               "task.reference_key=solution", "scheduler.predictor=reference",
               "task.verifier_function=[math_verify,e2e_user_rewards:mentions_answer]",
               "task.verifier_weight=[1.0,0.1]", f"model.path={qwen3_dir}", f"run_dir={run_dir}", *SMALL])
    assert rc == 0
    summary, metrics = read(run_dir)
    assert summary["steps"] == 2 and summary["task"]["prompts"] == 8
    assert not (run_dir / "predictor.json").exists()   # reference lengths: no predictor fitted, no report
    assert summary["task"]["rewards"] == ["math_verify", "e2e_user_rewards:mentions_answer"]
    assert (summary["task"]["correctness_reward"], summary["task"]["integrity_reward"]) == \
        ("math_verify", "nonempty_answer")
    for m in metrics:
        assert set(m["reward_components"]) == {"math_verify", "e2e_user_rewards:mentions_answer"}
        assert m["reward_mean"] == pytest.approx(m["reward_components"]["math_verify"]
                                                 + 0.1 * m["reward_components"]["e2e_user_rewards:mentions_answer"])
    assert summary["held_out"]["change"]["correctness"]["prompts"] == 2
    assert summary["training_prompts"]["initial"]["by_group"].keys() == {"all"}
    final = run_dir / "final_policy"
    assert json.loads((final / "tokenizer_config.json").read_text())["tokenizer_class"] == "Qwen2Tokenizer"
    assert (final / "model.safetensors").is_file() and (final / "chat_template.jinja").is_file()


def test_maze_rows_in_the_datasets_own_layout(ray_cluster, tmp_path, qwen3_dir):
    import datasets

    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.schedule.configured import configured_task
    from mindspeed_rl_asp.schedule.predictors import load_predictor
    from mindspeed_rl_asp.tasks.maze import MazeTaskSpec, dataset_row, make_dataset

    rows = [dataset_row(item) for item in make_dataset(8, 1, MazeTaskSpec(min_size=3, max_size=5))]
    path = tmp_path / "maze_rows.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    run_dir = tmp_path / "run"
    # The rows carry no reference length: the lm predictor, fitted on samples of the
    # starting policy (the paper's step 1), gives the planner its lengths.
    job = ["task=maze_dataset", f"task.path={path}", "task.correctness_reward=mazebench_correctness",
           "scheduler=asp", "scheduler.predictor=lm", "rl.max_prompt_length=512", f"model.path={qwen3_dir}", *SMALL]
    rc = main([*job, f"run_dir={run_dir}"])
    assert rc == 0
    summary, metrics = read(run_dir)
    assert summary["steps"] == 2 and summary["task"]["name"] == "dataset"
    assert summary["task"]["correctness_reward"] == "mazebench_correctness"
    assert set(metrics[0]["reward_components"]) == {"alphamaze_xmlcount", "alphamaze_integrity",
                                                    "alphamaze_correctness"}
    assert "held_out" not in summary and summary["training_prompts"]["change"]["correctness"]["prompts"] == 2
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["planner"] != "fifo" and plan["groups"]
    # This run is also the lm predictor's run in the loop (test_predictor_in_loop runs ridge):
    # of the 8 prompts, 4 profiled (the fewest), 2 of them held out; every prompt planned;
    # the saved predictor loads.
    report = json.loads((run_dir / "predictor.json").read_text())
    assert report["kind"] == "lm" and report["profiled"] == 4 and report["held_out"]["prompts"] == 2
    assert (run_dir / "length_predictor" / "meta.json").is_file()
    assert sorted(i for g in plan["groups"] for mb in g for i in mb["ids"]) == sorted(
        p.id for p in configured_task(load_config(job)).prompts)
    load_predictor(run_dir / "length_predictor", "lm")
