"""Tasks: prompt sets with rewards. ``maze`` is the one the paper uses."""
from __future__ import annotations


def make_task_prompts(task_cfg):
    """The prompt list a ``task`` config describes (deterministic in its seed)."""
    from .maze import MazeTaskSpec, make_dataset

    spec = MazeTaskSpec(min_size=task_cfg.min_size, max_size=task_cfg.max_size, size_decay=task_cfg.size_decay)
    return make_dataset(task_cfg.num_prompts, task_cfg.seed, spec)


def reward_weights(task_cfg):
    from .maze import MazeRewardWeights

    return MazeRewardWeights(integrity=task_cfg.integrity_weight, correctness=task_cfg.correctness_weight)
