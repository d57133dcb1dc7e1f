"""task=dataset: prompts from jsonl / parquet with configurable fields, the chat template,
the prompt-length rule, maze rows in the published layout, and one clear error per bad
input, with nothing written to the run directory."""
import json

import pytest

from hf_random import save_random_checkpoint
from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.config.validate import ConfigError
from mindspeed_rl_asp.schedule.configured import configured_task, task_items
from mindspeed_rl_asp.tasks.base import TaskError


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_checkpoint(tmp_path_factory.mktemp("qwen3"), "qwen3")


@pytest.fixture(scope="module")
def plain_model_dir(tmp_path_factory):
    return save_random_checkpoint(tmp_path_factory.mktemp("qwen3_plain"), "qwen3", chat_template=False)


MATH = [{"uid": f"q{i}", "question": f"What is {i} + {i}?", "solution": str(2 * i), "level": "easy" if i < 3 else "hard",
         "worked": f"{i} + {i} = {2 * i}, so the answer is \\boxed{{{2 * i}}}."} for i in range(6)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path, rows):
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def config(model_dir, path, *overrides):
    return load_config(["task=dataset", f"task.path={path}", f"model.path={model_dir}", "rl.global_batch_size=2",
                        "rl.mini_batch_size=2", "scheduler.base_batch_size=2", *overrides])


MATH_KEYS = ("task.prompt_key=question", "task.answer_key=solution", "task.id_key=uid", "task.group_key=level")


def test_jsonl_rows_become_prompts_with_the_models_chat_template(tmp_path, model_dir):
    task = configured_task(config(model_dir, write_jsonl(tmp_path / "m.jsonl", MATH), *MATH_KEYS))
    assert [p.id for p in task.prompts] == [r["uid"] for r in MATH] and task.skipped == []
    first = task.prompts[0]
    assert first.prompt == "<|im_start|>user\nWhat is 0 + 0?<|im_end|>\n<|im_start|>assistant\n"
    assert first.question == "What is 0 + 0?" and first.answer == "0" and first.group == "easy"
    assert first.metadata["worked"] == MATH[0]["worked"] and first.reference_length is None
    assert task.rewards.names == ["math_verify"] and task.held_out(3, 0) is None
    assert task.score(task.prompts[2], "<think>hm</think> \\boxed{4}")["correctness"] == 1.0


def test_parquet_reads_like_jsonl(tmp_path, model_dir):
    a = configured_task(config(model_dir, write_jsonl(tmp_path / "m.jsonl", MATH), *MATH_KEYS))
    b = configured_task(config(model_dir, write_parquet(tmp_path / "m.parquet", MATH), *MATH_KEYS))
    assert [(p.id, p.prompt, p.answer, p.group) for p in a.prompts] == \
        [(p.id, p.prompt, p.answer, p.group) for p in b.prompts]


def test_chat_template_modes_and_system_prompt(tmp_path, model_dir, plain_model_dir):
    path = write_jsonl(tmp_path / "m.jsonl", MATH)
    never = configured_task(config(model_dir, path, *MATH_KEYS, "task.chat_template=never"))
    assert never.prompts[0].prompt == "What is 0 + 0?"
    system = configured_task(config(model_dir, path, *MATH_KEYS, "task.system_prompt=Answer in a box."))
    assert system.prompts[0].prompt.startswith("<|im_start|>system\nAnswer in a box.<|im_end|>\n<|im_start|>user\n")
    # auto: a tokenizer without a template gets the text as it is; always refuses it.
    assert configured_task(config(plain_model_dir, path, *MATH_KEYS)).prompts[0].prompt == "What is 0 + 0?"
    with pytest.raises(TaskError, match="task.chat_template=always, but the tokenizer at model.path has no chat"):
        configured_task(config(plain_model_dir, path, *MATH_KEYS, "task.chat_template=always"))


def test_chat_messages_in_the_prompt_field(tmp_path, model_dir):
    rows = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 + 1?"}],
             "answer": "2"}] * 2
    task = configured_task(config(model_dir, write_jsonl(tmp_path / "c.jsonl", rows)))
    assert task.prompts[0].question == "1 + 1?" and [p.id for p in task.prompts] == ["row-0", "row-1"]
    assert task.prompts[0].prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_num_prompts_takes_the_first_rows(tmp_path, model_dir):
    task = configured_task(config(model_dir, write_jsonl(tmp_path / "m.jsonl", MATH), *MATH_KEYS,
                                  "task.num_prompts=4"))
    assert [p.id for p in task.prompts] == ["q0", "q1", "q2", "q3"]


def test_overlong_prompts_are_skipped_and_counted_or_refused(tmp_path, model_dir):
    rows = MATH[:4] + [{**MATH[4], "question": "What is " + " + ".join(["1"] * 200) + "?"}] + MATH[5:]
    path = write_jsonl(tmp_path / "long.jsonl", rows)
    task = configured_task(config(model_dir, path, *MATH_KEYS, "rl.max_prompt_length=64"))
    assert task.skipped == ["q4"] and "q4" not in [p.id for p in task.prompts] and len(task.prompts) == 5
    with pytest.raises(TaskError, match=r"row 4 of .*long.jsonl \(id 'q4'\): its prompt is \d+ tokens, longer than "
                                        r"rl.max_prompt_length=64"):
        configured_task(config(model_dir, path, *MATH_KEYS, "rl.max_prompt_length=64",
                               "task.filter_overlong_prompts=false"))
    with pytest.raises(TaskError, match="every one of the 6 prompts is longer than rl.max_prompt_length=2"):
        configured_task(config(model_dir, path, *MATH_KEYS, "rl.max_prompt_length=2"))


@pytest.mark.parametrize("write, overrides, message", [
    (None, (), r"task.path='.*nothing.jsonl': no such file"),
    (lambda p: p.write_text(""), (), r"task.path='.*data.jsonl': the file is empty"),
    (lambda p: p.write_text("{not json\n"), (), r"task.path='.*data.jsonl': cannot be read as json"),
    (lambda p: write_jsonl(p, MATH), ("task.prompt_key=problem",),
     r"task.prompt_key='problem': .*data.jsonl has no such field; its fields are uid, question, solution, level, worked"),
    (lambda p: write_jsonl(p, MATH), ("task.prompt_key=question", "task.answer_key=label"),
     r"task.answer_key='label': .*has no such field"),
    (lambda p: write_jsonl(p, MATH), ("task.prompt_key=question", "task.answer_key="),
     "compare with a reference answer: set task.answer_key"),
    (lambda p: write_jsonl(p, MATH), ("task.prompt_key=question", "task.answer_key=solution", "task.group_key=lvl"),
     r"task.group_key='lvl'"),
    (lambda p: write_jsonl(p, [{"prompt": "a", "answer": "1"}, {"prompt": "", "answer": "2"}]), (),
     r"row 1 of .*data.jsonl: the prompt is empty"),
    (lambda p: write_jsonl(p, [{"prompt": "a", "answer": "1"}, {"prompt": 5, "answer": "2"}]), (),
     r"row 1 of .*: the prompt must be a string or a list"),
    (lambda p: write_jsonl(p, [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": None}]), (),
     r"row 1 of .*: task.answer_key='answer' is empty"),
    (lambda p: write_jsonl(p, [{"id": "x", "prompt": "a", "answer": "1"}, {"id": "x", "prompt": "b", "answer": "2"}]),
     ("task.id_key=id",), r"row 1 of .*: id 'x' .* is also the id of row 0"),
    (lambda p: write_jsonl(p, MATH), ("task.prompt_key=question", "task.answer_key=solution",
                                      "task.verifier_function=[no_such_module_xyz:score]"),
     r"task.verifier_function\[0\]='no_such_module_xyz:score': cannot import module 'no_such_module_xyz'"),
    (lambda p: write_jsonl(p, MATH), ("task.prompt_key=question", "task.answer_key=solution",
                                      "task.verifier_function=[mazebench_correctness]"),
     r"prompt 'row-0' of .*: a maze reward is configured but its prompt holds no readable maze"),
    (lambda p: write_jsonl(p, MATH), ("task.prompt_key=question", "task.answer_key=solution",
                                      "task.eval_path=missing_eval.jsonl"), r"task.eval_path='missing_eval.jsonl': no such"),
])
def test_bad_input_is_one_clear_error(tmp_path, model_dir, write, overrides, message):
    path = tmp_path / ("nothing.jsonl" if write is None else "data.jsonl")
    if write is not None:
        write(path)
    with pytest.raises(TaskError, match=message):
        configured_task(config(model_dir, path, *overrides))


@pytest.mark.parametrize("overrides, message", [
    (("task.verifier_function=[math_verfy]",), r"task.verifier_function\[0\]='math_verfy' is not a registered "
                                               r"reward; did you mean 'math_verify'"),
    (("task.verifier_function=[exact_match,format]", "task.verifier_weight=[1.0]"), "2 rewards of task.verifier"),
    (("task.correctness_reward=acccc",), r"task.correctness_reward='acccc' is not a registered reward"),
    (("task.path=",), "set task.path=FILE.jsonl"),
    (("task.verifier_function=[]",), "task=dataset needs task.verifier_function"),
    (("task.chat_template=sometimes",), "task.chat_template='sometimes' is not one of auto, always, never"),
    (("task=maze", "task.prompt_format=markdown"), "task.prompt_format='markdown' is not one of project, alphamaze"),
])
def test_bad_task_keys_are_refused_by_validation(tmp_path, model_dir, overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(model_dir, tmp_path / "m.jsonl", *overrides)


def test_a_small_dataset_is_checked_against_the_step_once_read(tmp_path, model_dir):
    cfg = config(model_dir, write_jsonl(tmp_path / "m.jsonl", MATH), *MATH_KEYS, "rl.global_batch_size=8",
                 "rl.mini_batch_size=8")
    with pytest.raises(ConfigError, match="rl.global_batch_size=8 exceeds the 6 prompts of the task"):
        configured_task(cfg, training=True)
    assert len(configured_task(cfg).prompts) == 6  # planning alone is fine


def test_reference_lengths_come_from_a_field_or_planning_says_what_is_missing(tmp_path, model_dir):
    from mindspeed_rl_asp.engines.hf import load_tokenizer

    path = write_jsonl(tmp_path / "m.jsonl", MATH)
    cfg = config(model_dir, path, *MATH_KEYS, "task.reference_key=worked")
    task = configured_task(cfg)
    tokenizer = load_tokenizer(model_dir)
    expected = [len(tokenizer(r["worked"], add_special_tokens=False)["input_ids"]) + 1.0 for r in MATH]
    assert [length for _, length in task_items(cfg, task.prompts)] == expected
    bare = config(model_dir, path, *MATH_KEYS, "scheduler.predictor=reference")
    with pytest.raises(ConfigError, match=r"scheduler.predictor=reference needs a reference length for every prompt, "
                                          r"and task=dataset gives none for 6 of them \(first: 'q0'\); set "
                                          r"task.reference_key"):
        task_items(bare, configured_task(bare).prompts)
    # fifo reads no lengths: it plans such a task, each load taken as the generation budget.
    fifo = config(model_dir, path, *MATH_KEYS, "scheduler=fifo", "scheduler.slack=0")
    assert {length for _, length in task_items(fifo, configured_task(fifo).prompts)} == \
        {float(fifo.generate.sampling_config.max_tokens)}


def test_held_out_prompts_come_from_eval_path(tmp_path, model_dir):
    path = write_jsonl(tmp_path / "m.jsonl", MATH)
    held = write_jsonl(tmp_path / "e.jsonl", [{**r, "uid": "e" + r["uid"]} for r in MATH[:3]])
    task = configured_task(config(model_dir, path, *MATH_KEYS, f"task.eval_path={held}"))
    assert [p.id for p in task.held_out(2, 0)] == ["eq0", "eq1"]


def test_a_user_reward_by_import_path(tmp_path, model_dir, monkeypatch):
    (tmp_path / "user_rewards_t.py").write_text("def shorter(response, prompt):\n    return -len(response) / 100\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = configured_task(config(model_dir, write_jsonl(tmp_path / "m.jsonl", MATH), *MATH_KEYS,
                                  "task.verifier_function=[math_verify,user_rewards_t:shorter]",
                                  "task.verifier_weight=[1.0,0.5]"))
    result = task.score(task.prompts[1], "\\boxed{2}")
    assert result["components"] == {"math_verify": 1.0, "user_rewards_t:shorter": -0.09}
    assert result["reward"] == pytest.approx(1.0 - 0.045)
    assert task.import_roots() == [str(tmp_path.resolve())]


# ------------------------------------------------------------------ maze rows, the published layout

def maze_rows(n=6, seed=0):
    from mindspeed_rl_asp.tasks.maze import MazeTaskSpec, dataset_row, make_dataset

    return [dataset_row(item) for item in make_dataset(n, seed, MazeTaskSpec(min_size=3, max_size=5))]


def test_generated_rows_are_dataset_rows_and_score_alike(tmp_path, model_dir):
    from mindspeed_rl_asp.tasks.maze import MazeTaskSpec, make_dataset, parse_maze

    rows = maze_rows()
    task = configured_task(load_config(["task=maze_dataset", f"task.path={write_parquet(tmp_path / 'r.parquet', rows)}",
                                        f"model.path={model_dir}", "rl.max_prompt_length=512"]))
    generated = make_dataset(6, 0, MazeTaskSpec(min_size=3, max_size=5), layout="alphamaze")
    assert [p.question for p in task.prompts] == [g.prompt for g in generated]
    assert [p.answer for p in task.prompts] == [g.answer for g in generated]
    assert [parse_maze(p.question) for p in task.prompts] == [parse_maze(g.prompt) for g in generated]
    assert task.rewards.names == ["alphamaze_xmlcount", "alphamaze_integrity", "alphamaze_correctness"]
    for row, item in zip(task.prompts, generated):
        # The generator's reference response earns the same from either side.
        assert task.score(row, item.reference_response) == task.score(item, item.reference_response)
        assert task.score(row, item.reference_response)["correctness"] == 1.0
    # The same mazes, generated by task=maze in the dataset's layout, use the same rewards.
    maze_task = configured_task(load_config(["task.prompt_format=alphamaze", "rl.max_prompt_length=900",
                                             "generate.sampling_config.max_tokens=100"]))
    assert maze_task.rewards.names == task.rewards.names


def test_maze_rows_offer_the_any_legal_route_rule(tmp_path, model_dir):
    path = write_jsonl(tmp_path / "r.jsonl", maze_rows())
    task = configured_task(load_config(["task=maze_dataset", f"task.path={path}", f"model.path={model_dir}",
                                        "rl.max_prompt_length=512", "task.correctness_reward=mazebench_correctness"]))
    assert task.rewards.correctness.name == "mazebench_correctness" and "mazebench_correctness" not in task.rewards.names


# ------------------------------------------------------------------ the command line

BAD_INPUTS = [
    (lambda p: None, (), "no such file"),
    (lambda p: p.write_text(""), (), "the file is empty"),
    (lambda p: write_jsonl(p, MATH), ("task.prompt_key=problem",), "task.prompt_key='problem'"),
    (lambda p: write_jsonl(p, MATH), ("task.prompt_key=question", "task.answer_key=solution",
                                      "rl.max_prompt_length=4", "task.filter_overlong_prompts=false"),
     "row 0 of"),
    (lambda p: write_jsonl(p, MATH), ("task.prompt_key=question", "task.answer_key=solution",
                                      "task.verifier_function=[nope]"), "task.verifier_function[0]='nope'"),
]


@pytest.mark.parametrize("write, overrides, message", BAD_INPUTS)
def test_asp_train_refuses_bad_input_before_writing_the_run_directory(tmp_path, model_dir, capsys, write, overrides,
                                                                      message):
    from mindspeed_rl_asp.cli.train import main

    data = tmp_path / "data.jsonl"
    write(data)
    fresh, used = tmp_path / "fresh_run", tmp_path / "used_run"
    used.mkdir()
    (used / "config.yaml").write_text("from an earlier run\n")
    for run_dir in (fresh, used):
        argv = ["task=dataset", f"task.path={data}", f"model.path={model_dir}", "rl.global_batch_size=2",
                "rl.mini_batch_size=2", "scheduler.base_batch_size=2", f"run_dir={run_dir}", *overrides]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("asp-train: error: ") and message in err and "Traceback" not in err
    assert not fresh.exists()
    assert [p.name for p in used.iterdir()] == ["config.yaml"] and (used / "config.yaml").read_text() == \
        "from an earlier run\n"


def test_dry_run_names_the_task_and_its_rewards(tmp_path, model_dir, capsys):
    from mindspeed_rl_asp.cli.train import main

    data = write_jsonl(tmp_path / "m.jsonl", MATH)
    assert main(["task=dataset", f"task.path={data}", f"model.path={model_dir}", *MATH_KEYS, "rl.global_batch_size=2",
                 "rl.mini_batch_size=2", "scheduler.base_batch_size=2", "task.reference_key=worked",
                 "task.verifier_function=[format,math_verify]", "task.verifier_weight=[0.1,1.0]", "--dry-run"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "task dataset: 6 prompts from" in out and "rewards format + math_verify" in out
    assert "epoch(s) over 6 prompts" in out


@pytest.mark.parametrize("more, chosen, why", [
    (("task.reference_key=worked",), "reference", "every prompt has a reference length"),
    ((), "ridge", "6 of 6 prompts have no reference length; a ridge predictor is profiled"),
    (("scheduler=fifo", "scheduler.slack=0"), "reference", "scheduler=fifo reads no lengths"),
])
def test_the_default_predictor_fits_the_task_and_the_dry_run_says_which(tmp_path, model_dir, capsys, more, chosen, why):
    """scheduler.predictor=auto (the default): a plain dataset is planned (ridge, profiled in
    the loop) instead of refused, and the dry run says what auto became and why."""
    from mindspeed_rl_asp.cli.train import main

    data = write_jsonl(tmp_path / "m.jsonl", MATH)
    assert main(["task=dataset", f"task.path={data}", f"model.path={model_dir}", *MATH_KEYS, "rl.global_batch_size=2",
                 "rl.mini_batch_size=2", "scheduler.base_batch_size=2", *more, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"scheduler.predictor=auto -> {chosen} ({why}" in out


def test_auto_takes_the_history_when_a_lengths_file_is_given(tmp_path, model_dir):
    from mindspeed_rl_asp.schedule.configured import resolve_predictor

    lengths = write_jsonl(tmp_path / "lengths.jsonl", [{"prompt": "x", "lengths": [3]}])
    cfg = config(model_dir, write_jsonl(tmp_path / "m.jsonl", MATH), *MATH_KEYS, f"scheduler.lengths_file={lengths}")
    assert resolve_predictor(cfg.scheduler, configured_task(cfg).prompts)[0] == "history"
    cfg = config(model_dir, write_jsonl(tmp_path / "m.jsonl", MATH), *MATH_KEYS, "scheduler.predictor=lm")
    assert resolve_predictor(cfg.scheduler, configured_task(cfg).prompts) == ("lm", "as configured")
