"""Which finished prompt groups are rejected: DAPO's dynamic sampling, one pure rule.

``filter_groups="std"`` (DAPO, Yu et al. 2025, "dynamic sampling"; MindSpeed-RL's
``filter_groups_enable``): a group whose metric values (one per sample, e.g. the
accuracy reward) are all equal carries no GRPO signal (every advantage is 0), so it is
rejected and more prompts are generated until a step has ``global_batch_size`` accepted
groups. A group of one sample is always kept, as in MindSpeed-RL's ``DynamicSampling``
(``np.std(group) > 0 or len(group) == 1``); "all equal" is tested exactly (max == min),
so no rounding of a mean can turn an all-equal group into a kept one.

The core applies this rule to the rewards a generation report carries
(``ControlCore.on_generated(..., rewards)``), so the Ray shell and the simulator never
decide on their own.
"""
from __future__ import annotations

from typing import Mapping, Sequence

__all__ = ["FILTERS", "rejected_groups", "check_filter"]

FILTERS = ("none", "std")


def check_filter(rule: str) -> None:
    if rule not in FILTERS:
        raise ValueError(f"filter_groups={rule!r} must be one of {', '.join(FILTERS)}")


def rejected_groups(rule: str, rewards: Mapping[str, Sequence[float]]) -> list[str]:
    """The prompt ids (in ``rewards``' order) whose group ``rule`` rejects: with ``std``,
    the groups of two or more samples whose values are all equal; with ``none``, none."""
    check_filter(rule)
    if rule == "none":
        return []
    out = []
    for prompt_id, values in rewards.items():
        values = [float(v) for v in values]
        if not values:
            raise ValueError(f"prompt group {prompt_id!r} has no reward values")
        if len(values) > 1 and max(values) == min(values):
            out.append(prompt_id)
    return out
