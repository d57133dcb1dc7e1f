"""Bad input that tests/test_tasks_dataset.py does not cover: a model.path checkpoint
directory without a config, weights or tokenizer; a dataset of blank lines; a row without
the prompt field; maze prompts over rl.max_prompt_length; an unknown reward for the maze
task. Each is one error naming the key or the row, and asp-train writes nothing: a new
run directory is not created, an existing one is left as it was."""
import json
import shutil

import pytest

from hf_random import save_random_checkpoint
from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.config.validate import ConfigError, resolve_model_path
from mindspeed_rl_asp.schedule.configured import configured_task
from mindspeed_rl_asp.tasks.base import TaskError


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_checkpoint(tmp_path_factory.mktemp("qwen3"), "qwen3")


def broken_copy(model_dir, tmp_path, remove):
    """A copy of the checkpoint without the files named in ``remove``."""
    broken = tmp_path / "broken_ckpt"
    shutil.copytree(model_dir, broken)
    for name in remove:
        (broken / name).unlink()
    return broken


TOKENIZER = ("tokenizer.json", "tokenizer_config.json")
# (files removed, the parts the error must name as missing, those it must not)
BROKEN_CHECKPOINTS = [
    (("config.json",), ["a config (config.json)"], ["weights", "a tokenizer"]),
    (("model.safetensors",), ["weights (model.safetensors or"], ["a config", "a tokenizer"]),
    (TOKENIZER, ["a tokenizer (tokenizer.json or"], ["a config", "weights"]),
    (("config.json", "model.safetensors"), ["a config (config.json) and weights ("], ["a tokenizer"]),
]


@pytest.mark.parametrize("remove, missing, present", BROKEN_CHECKPOINTS)
def test_a_checkpoint_without_a_part_is_one_error_naming_model_path_and_what_is_missing(
        model_dir, tmp_path, remove, missing, present):
    broken = broken_copy(model_dir, tmp_path, remove)
    with pytest.raises(ConfigError) as error:
        resolve_model_path(str(broken))
    message = str(error.value)
    assert message.startswith(f"model.path={str(broken)!r}: no checkpoint there")
    for part in missing:
        assert part in message
    for part in present:
        assert part not in message


def test_a_model_path_that_is_no_directory(tmp_path):
    with pytest.raises(ConfigError, match=r"model.path='.*nothing': no checkpoint there \(no such directory\)"):
        resolve_model_path(str(tmp_path / "nothing"))
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ConfigError, match="no such directory"):
        resolve_model_path(str(tmp_path / "a_file"))


def test_the_shipped_policy_is_found_in_the_package_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = resolve_model_path(load_config().model.path)
    assert path.is_absolute() and (path / "model.safetensors").is_file()


def dataset_config(model_dir, path, *overrides):
    return load_config(["task=dataset", f"task.path={path}", f"model.path={model_dir}", "rl.global_batch_size=2",
                        "rl.mini_batch_size=2", "scheduler.base_batch_size=2", *overrides])


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]


def test_a_file_of_blank_lines_is_empty(tmp_path, model_dir):
    path = tmp_path / "blank.jsonl"
    path.write_text("\n  \n\n")
    with pytest.raises(TaskError, match=r"task.path='.*blank.jsonl': the file is empty \(blank lines only\)"):
        configured_task(dataset_config(model_dir, path))


def test_a_row_without_the_prompt_field_is_named(tmp_path, model_dir):
    path = write_jsonl(tmp_path / "gap.jsonl", ROWS[:2] + [{"answer": "9"}] + ROWS[2:])
    with pytest.raises(TaskError, match=r"row 2 of .*gap.jsonl: task.prompt_key='prompt' is missing or null"):
        configured_task(dataset_config(model_dir, path))


def maze_lengths(cfg):
    from mindspeed_rl_asp.engines.hf import load_tokenizer

    tokenizer = load_tokenizer(resolve_model_path(cfg.model.path))
    from mindspeed_rl_asp.tasks import make_task

    task = make_task(cfg.task, tokenizer, None)
    lengths = {p.id: len(tokenizer(p.prompt, add_special_tokens=False)["input_ids"]) for p in task.prompts}
    return tokenizer, lengths


def test_overlong_maze_prompts_are_skipped_with_a_count_or_refused_never_truncated():
    tokenizer, lengths = maze_lengths(load_config())
    limit = sorted(lengths.values())[len(lengths) // 2]  # about half the mazes are longer
    longer = sorted(i for i, n in lengths.items() if n > limit)
    assert longer
    task = configured_task(load_config([f"rl.max_prompt_length={limit}", "rl.global_batch_size=4",
                                        "rl.mini_batch_size=4", "scheduler.base_batch_size=2"]), tokenizer)
    assert sorted(task.skipped) == longer
    assert len(task.prompts) == len(lengths) - len(longer)
    by_id = {p.id: p for p in task.prompts}
    assert all(len(tokenizer(p.prompt, add_special_tokens=False)["input_ids"]) == lengths[i] for i, p in by_id.items())
    with pytest.raises(TaskError, match=rf"maze prompt '.*': its prompt is \d+ tokens, longer than "
                                        rf"rl.max_prompt_length={limit}; .* never truncated"):
        configured_task(load_config([f"rl.max_prompt_length={limit}", "task.filter_overlong_prompts=false"]),
                        tokenizer)


# ------------------------------------------------------------------ the command line

def checkpoint_without(*names):
    return lambda model_dir, tmp_path: str(broken_copy(model_dir, tmp_path, names))


def data_file(rows=None, text=None):
    def write(tmp_path):
        path = tmp_path / "data.jsonl"
        path.write_text(text) if text is not None else write_jsonl(path, rows)
        return path
    return write


# (model.path, data file for task=dataset or None for task=maze, overrides, what the error names)
CLI_BAD_INPUTS = [
    (checkpoint_without("config.json"), None, (), "lacks a config (config.json); point model.path"),
    (checkpoint_without("model.safetensors"), None, (), "lacks weights (model.safetensors"),
    (checkpoint_without("model.safetensors"), data_file(ROWS), (), "lacks weights (model.safetensors"),
    (lambda model_dir, tmp_path: str(tmp_path / "no_such_ckpt"), None, (), "(no such directory)"),
    (lambda model_dir, tmp_path: str(model_dir), data_file(text="\n\n"), (), "the file is empty (blank lines only)"),
    (lambda model_dir, tmp_path: str(model_dir), data_file(ROWS[:1] + [{"answer": "3"}] + ROWS[1:]), (),
     "row 1 of"),
    (None, None, ("rl.max_prompt_length=8", "task.filter_overlong_prompts=false"), "rl.max_prompt_length=8"),
    (None, None, ("task.verifier_function=[maze_corectness]",), "task.verifier_function[0]='maze_corectness'"),
]


@pytest.mark.parametrize("model, data, overrides, message", CLI_BAD_INPUTS)
def test_asp_train_refuses_bad_input_and_writes_nothing(tmp_path, model_dir, capsys, model, data, overrides, message):
    from mindspeed_rl_asp.cli.train import main

    argv = ["rl.global_batch_size=2", "rl.mini_batch_size=2", "scheduler.base_batch_size=2", *overrides]
    if model is not None:
        argv.append(f"model.path={model(model_dir, tmp_path)}")
    if data is not None:
        argv += ["task=dataset", f"task.path={data(tmp_path)}"]
    fresh, used = tmp_path / "fresh_run", tmp_path / "used_run"
    used.mkdir()
    (used / "config.yaml").write_text("from an earlier run\n")
    for run_dir in (fresh, used):
        assert main([*argv, f"run_dir={run_dir}"]) == 2
        err = " ".join(capsys.readouterr().err.split())  # rich may wrap the line
        assert err.startswith("asp-train: error: ") and message in err and "Traceback" not in err, err
    assert not fresh.exists()
    assert [p.name for p in used.iterdir()] == ["config.yaml"]
    assert (used / "config.yaml").read_text() == "from an earlier run\n"
