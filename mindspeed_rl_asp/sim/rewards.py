"""Simulated rewards, for dynamic sampling (``algo.filter_groups``) in ``asp-simulate``.

Each prompt has a solve rate ``q`` drawn once from a Beta distribution of mean
``sim.solve_rate`` and concentration ``sim.solve_concentration`` (``a = mean x c``,
``b = (1 - mean) x c``; below 2 it is U-shaped: many prompts the policy nearly always
solves or nearly always fails, the groups DAPO rejects); each sample of a group is
correct with probability ``q`` (reward 1.0, else 0.0). Deterministic in (``sim.seed``,
prompt, version): a prompt keeps its ``q`` across passes (a refill of the same prompt is
as easy as it was), and the same minibatch at the same version gets the same rewards.
The control core's own reject rule reads them, as it reads a real run's.
"""
from __future__ import annotations

import random
from typing import Callable, Sequence

from ..tasks import base_prompt_id

__all__ = ["solve_rate", "group_rewards", "reward_source"]


def solve_rate(prompt_id: str, mean: float, concentration: float, seed: int = 0) -> float:
    """The prompt's chance that one sample is correct (same for every pass over it)."""
    if not 0.0 < mean < 1.0 or not concentration > 0.0:
        raise ValueError(f"sim.solve_rate={mean} must lie in (0, 1) and sim.solve_concentration="
                         f"{concentration} must be > 0")
    rng = random.Random(f"{seed}/solve/{base_prompt_id(prompt_id)}")
    return rng.betavariate(mean * concentration, (1.0 - mean) * concentration)


def group_rewards(prompt_id: str, version: int, n: int, mean: float, concentration: float,
                  seed: int = 0) -> tuple[float, ...]:
    """The ``n`` samples' correctness (1.0 / 0.0) of ``prompt_id`` generated at ``version``."""
    q = solve_rate(prompt_id, mean, concentration, seed)
    rng = random.Random(f"{seed}/rewards/{prompt_id}/{version}")
    return tuple(1.0 if rng.random() < q else 0.0 for _ in range(n))


def reward_source(n: int, mean: float, concentration: float, seed: int = 0) -> Callable:
    """``rewards(action)`` for a cluster: each prompt of a ``Generate`` -> its group's rewards."""
    solve_rate("check", mean, concentration, seed)   # a bad value fails at start, naming the key

    def rewards(action) -> dict[str, Sequence[float]]:
        return {p: group_rewards(p, action.version, n, mean, concentration, seed) for p in action.prompt_ids}
    return rewards
