"""Tasks: prompt sets with rewards, behind one small protocol (tasks/base.py).

``task=maze`` generates AlphaMaze-format mazes (the paper's task; the project's layout or
the published dataset's), ``task=dataset`` reads a user's jsonl / parquet file
(tasks/dataset.py); both score with rewards picked by name (tasks/rewards.py).
:func:`make_task` builds either from a ``task`` config; the trainer, the planner and the
evaluation see only the :class:`~mindspeed_rl_asp.tasks.base.Task` it returns.

A run longer than one pass over the prompts trains on them again: epoch ``e >= 1`` sees
every prompt under the id ``"<id>@e<e>"`` (:func:`epoch_prompt_id`), so the control core,
which tracks each id exactly once, needs no notion of epochs, and :func:`base_prompt_id`
gives the prompt back for its text and reward.
"""
from __future__ import annotations

from .base import Task, TaskError, TaskPrompt, fit_prompt_lengths  # noqa: F401  (the protocol's names)

EPOCH_MARK = "@e"
TASK_NAMES = ("maze", "dataset")


def _get(cfg, key: str, default):
    value = getattr(cfg, key, default)
    return default if value is None else value


def maze_rewards(task_cfg):
    """The maze task's rewards: ``task.verifier_function`` if given, else the project's
    integrity + correctness (weights ``task.integrity_weight``, ``task.correctness_weight``)
    for its own layout, or the original AlphaMaze rewards (weights 1) for the dataset's."""
    from .rewards import make_reward_set

    names, weights = list(_get(task_cfg, "verifier_function", [])), list(_get(task_cfg, "verifier_weight", []))
    if not names:
        if _get(task_cfg, "prompt_format", "project") == "alphamaze":
            names, weights = ["alphamaze_xmlcount", "alphamaze_integrity", "alphamaze_correctness"], [1.0] * 3
        else:
            names = ["maze_integrity", "maze_correctness"]
            weights = [task_cfg.integrity_weight, task_cfg.correctness_weight]
    return make_reward_set(names, weights, _get(task_cfg, "correctness_reward", ""),
                           _get(task_cfg, "integrity_reward", ""))


def _prompt_lengths(prompts, tokenizer) -> list[int]:
    from .maze import count_tokens

    if tokenizer is None:  # the maze's own token unit: the tiny tokenizer's, tag for tag
        return [count_tokens(p.prompt) for p in prompts]
    return [len(ids) for ids in tokenizer([p.prompt for p in prompts], add_special_tokens=False)["input_ids"]]


def _make_maze_task(task_cfg, tokenizer, max_prompt_length) -> Task:
    from .maze import LAYOUTS, MazeTaskSpec, make_dataset

    layout = _get(task_cfg, "prompt_format", "project")
    if layout not in LAYOUTS:
        raise TaskError(f"task.prompt_format={layout!r} is not one of {', '.join(LAYOUTS)}")
    spec = MazeTaskSpec(min_size=task_cfg.min_size, max_size=task_cfg.max_size, size_decay=task_cfg.size_decay)
    rewards = maze_rewards(task_cfg)
    skip = bool(_get(task_cfg, "filter_overlong_prompts", True))

    def fitted(prompts, force_skip=False):
        return fit_prompt_lengths(prompts, _prompt_lengths(prompts, tokenizer), max_prompt_length,
                                  skip or force_skip, lambda i: f"maze prompt {prompts[i].id!r}")

    prompts, skipped = fitted(make_dataset(task_cfg.num_prompts, task_cfg.seed, spec, layout))
    return Task("maze", prompts, rewards, skipped,
                held_out_fn=lambda n, seed: fitted(make_dataset(n, seed, spec, layout), True)[0],
                description=f"{len(prompts)} generated mazes ({layout} layout)")


def _make_dataset_task(task_cfg, tokenizer, max_prompt_length) -> Task:
    from .dataset import check_maze_rows, load_prompts
    from .rewards import make_reward_set

    rewards = make_reward_set(list(_get(task_cfg, "verifier_function", [])),
                              list(_get(task_cfg, "verifier_weight", [])),
                              _get(task_cfg, "correctness_reward", ""), _get(task_cfg, "integrity_reward", ""))
    needs_answer = rewards.needs("answer")

    def load(path, key, limit):
        prompts, skipped = load_prompts(task_cfg, tokenizer, max_prompt_length, path, key, limit, needs_answer)
        if rewards.needs("maze"):
            check_maze_rows(prompts, path)
        return prompts, skipped

    prompts, skipped = load(task_cfg.path, "task.path", task_cfg.num_prompts)
    held_out_fn = None
    if _get(task_cfg, "eval_path", ""):
        held, _ = load(task_cfg.eval_path, "task.eval_path", 0)  # read now: a bad file fails before the run
        held_out_fn = lambda n, seed: held[:n]  # noqa: E731  (a file's rows, in order; the seed picks nothing)
    return Task("dataset", prompts, rewards, skipped, held_out_fn,
                description=f"{len(prompts)} prompts from {task_cfg.path}")


def make_task(task_cfg, tokenizer=None, max_prompt_length=None) -> Task:
    """The task a ``task`` config describes (deterministic in it), its prompts fitted to
    ``max_prompt_length`` tokens of ``tokenizer`` (the model's; the maze task measures in
    its own token unit without one, the dataset task needs it). Raises
    :class:`~mindspeed_rl_asp.tasks.base.TaskError` naming what to fix."""
    name = task_cfg.name
    if name == "maze":
        return _make_maze_task(task_cfg, tokenizer, max_prompt_length)
    if name == "dataset":
        return _make_dataset_task(task_cfg, tokenizer, max_prompt_length)
    raise TaskError(f"task.name={name!r} is not one of {', '.join(TASK_NAMES)}")


def make_task_prompts(task_cfg, tokenizer=None, max_prompt_length=None):
    """The prompt list a ``task`` config describes (deterministic in its seed)."""
    return make_task(task_cfg, tokenizer, max_prompt_length).prompts


def reward_weights(task_cfg):
    """The maze task's own reward weights (for callers of ``tasks.maze.score_response``)."""
    from .maze import MazeRewardWeights

    return MazeRewardWeights(integrity=task_cfg.integrity_weight, correctness=task_cfg.correctness_weight)


def epochs_needed(num_prompts: int, steps: int, global_batch_size: int) -> int:
    """Passes over ``num_prompts`` prompts that ``steps`` steps of ``global_batch_size`` take."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts={num_prompts} must be >= 1")
    return max(1, -(-steps * global_batch_size // num_prompts))


def epoch_prompt_id(prompt_id: str, epoch: int) -> str:
    """The id of ``prompt_id`` in pass ``epoch`` (epoch 0 keeps the plain id)."""
    if EPOCH_MARK in prompt_id:
        raise ValueError(f"prompt id {prompt_id!r} already contains {EPOCH_MARK!r}")
    return prompt_id if epoch == 0 else f"{prompt_id}{EPOCH_MARK}{epoch}"


def base_prompt_id(prompt_id: str) -> str:
    """Inverse of :func:`epoch_prompt_id`: the dataset id behind an epoch id."""
    return prompt_id.split(EPOCH_MARK, 1)[0]


def prompt_epoch(prompt_id: str) -> int:
    """The pass an id of :func:`epoch_prompt_id` belongs to (0 for a plain id)."""
    _, mark, epoch = prompt_id.partition(EPOCH_MARK)
    return int(epoch) if mark else 0
