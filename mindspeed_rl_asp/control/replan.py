"""The re-plan rule (``scheduler.refit``): a later epoch planned again from observed lengths.

The core records the lengths each finished minibatch reports (``n_samples_per_prompt``
rows per prompt, in the order of ``Generate.prompt_ids``). When the next minibatch to
dispatch for the first time is the first pending one of an epoch ``e >= 1`` that was not
re-planned yet, the core hands that epoch's pending prompts and every length observed so
far to the injected planning function (``EpochReplan.plan``, pure: ``schedule/refit.py``
for a run) and swaps the epoch's minibatches for the ones it returns through
``ControlCore.replan_pending`` (the window rule re-checked; a refusal leaves the plan as
it was and is recorded). Each epoch is tried once.

Why at the cursor: the rule runs inside the core's dispatch, just before the epoch's
first minibatch would go, so none of the epoch is dispatched yet (its minibatch ids are
free to reuse) and the plan uses every length reported until then, in any event order.

Standard library only: the planning function and the epoch of a prompt id are passed in
as plain callables, so the core knows neither planners nor how ids name epochs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

__all__ = ["EpochReplan", "ReplanRecord", "lengths_by_prompt", "epoch_run"]

# (epoch, its pending minibatches' prompt ids in plan order, prompt id -> observed lengths)
#   -> (minibatches as (id, prompt ids) pairs, a note the core keeps for observers)
PlanEpoch = Callable[[int, tuple, Mapping[str, tuple]], tuple]


@dataclass(frozen=True)
class EpochReplan:
    """What the core needs to re-plan: ``plan`` (see ``PlanEpoch`` above), ``epoch_of``
    (prompt id -> its epoch), ``done``: epochs not to re-plan again (a resumed run's)."""

    plan: PlanEpoch
    epoch_of: Callable[[str], int]
    done: frozenset = frozenset()


@dataclass(frozen=True)
class ReplanRecord:
    """One re-plan as the core made it: which epoch, when (minibatches dispatched so far,
    the trainer's version), how many prompts, taken or the refusal, and the planning
    function's note (its lengths and plan, for the observer that writes the files)."""

    epoch: int
    dispatched_minibatches: int
    trainer_version: int
    prompts: int
    minibatches: int
    accepted: bool
    error: Optional[str] = None
    note: Any = None


def lengths_by_prompt(prompt_ids: Sequence[str], lengths: Sequence[int], n_samples: int) -> dict:
    """A finished minibatch's lengths by prompt id: rows ``k*n .. (k+1)*n - 1`` belong to
    ``prompt_ids[k]`` (the row layout every cluster reports). A wrong count is a
    ``ValueError`` (the core turns it into a ``ProtocolError``)."""
    if len(lengths) != len(prompt_ids) * n_samples:
        raise ValueError(f"{len(lengths)} lengths for {len(prompt_ids)} prompts x n_samples_per_prompt={n_samples}")
    return {pid: tuple(int(x) for x in lengths[k * n_samples:(k + 1) * n_samples])
            for k, pid in enumerate(prompt_ids)}


def epoch_run(pending: Sequence[Any], epoch: int, epoch_of: Callable[[str], int]) -> int:
    """How many of ``pending`` (minibatches in plan order) from the first on belong to
    ``epoch`` (a minibatch's epoch is its first prompt's)."""
    count = 0
    while count < len(pending) and epoch_of(pending[count].prompt_ids[0]) == epoch:
        count += 1
    return count
