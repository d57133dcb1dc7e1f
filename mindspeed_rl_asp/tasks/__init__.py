"""Tasks: prompt sets with rewards. ``maze`` is the one the paper uses.

A run longer than one pass over the prompts trains on them again: epoch ``e >= 1`` sees
every prompt under the id ``"<id>@e<e>"`` (:func:`epoch_prompt_id`), so the control core,
which tracks each id exactly once, needs no notion of epochs, and :func:`base_prompt_id`
gives the prompt back for its text and reward.
"""
from __future__ import annotations

EPOCH_MARK = "@e"


def make_task_prompts(task_cfg):
    """The prompt list a ``task`` config describes (deterministic in its seed)."""
    from .maze import MazeTaskSpec, make_dataset

    spec = MazeTaskSpec(min_size=task_cfg.min_size, max_size=task_cfg.max_size, size_decay=task_cfg.size_decay)
    return make_dataset(task_cfg.num_prompts, task_cfg.seed, spec)


def reward_weights(task_cfg):
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
