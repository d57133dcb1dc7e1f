"""The task protocol: what the trainer, the planner and the evaluation may know of a task.

A task is a list of prompts and a way to score a response to one of them:

* a prompt (:class:`TaskPrompt`, or any object with the same attributes, such as
  :class:`~mindspeed_rl_asp.tasks.maze.MazePrompt`) has an ``id``, the ``prompt`` text the
  model reads (a chat template already applied where the task uses one), the ``question``
  a reward reads (the raw prompt field), an optional reference ``answer``, the row's
  ``metadata``, a ``group`` for per-group evaluation rates, and optionally a
  ``reference_length`` (tokens of a reference response, for ``scheduler.predictor=reference``);
* :meth:`Task.score` returns the named reward components, their weighted sum ``reward``,
  and the two rates every run reports, ``correctness`` and ``integrity`` (1.0 when the
  component chosen for each is above 0; see :mod:`~mindspeed_rl_asp.tasks.rewards`).

Nothing else about a task leaks out: the maze is one task among others. Standard library
only, like the rest of ``tasks/``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence, Union

Group = Union[int, str]


class TaskError(ValueError):
    """A task that cannot be built from its config or its data: the message names the key,
    the file or the row, and what to change."""


@dataclass(frozen=True)
class TaskPrompt:
    """One prompt of a task (see the module docstring for the fields)."""

    id: str
    prompt: str
    question: str
    answer: Optional[str] = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    group: Group = "all"
    reference_length: Optional[float] = None


@dataclass
class Task:
    """A built task: its prompts (after the prompt-length rule), its rewards, the ids it
    skipped as too long, and where its held-out prompts come from (None: it has none)."""

    name: str
    prompts: list
    rewards: Any  # tasks.rewards.RewardSet
    skipped: list[str] = field(default_factory=list)
    held_out_fn: Optional[Callable[[int, int], list]] = None
    description: str = ""

    def score(self, prompt, response: str) -> dict:
        """``{"reward", "correctness", "integrity", "components": {name: value}}``."""
        return self.rewards.score(prompt, response)

    def held_out(self, num_prompts: int, seed: int) -> Optional[list]:
        """``num_prompts`` prompts the run never trains on, or None if the task has none."""
        return None if self.held_out_fn is None else self.held_out_fn(num_prompts, seed)

    def by_id(self) -> dict:
        return {p.id: p for p in self.prompts}

    @property
    def has_reference_lengths(self) -> bool:
        return all(p.reference_length is not None for p in self.prompts)

    def import_roots(self) -> list[str]:
        """Directories a process must have on ``sys.path`` to import the task's user rewards."""
        return self.rewards.import_roots()


def fit_prompt_lengths(prompts: Sequence, lengths: Sequence[int], max_prompt_length: Optional[int],
                       skip: bool, where: Callable[[int], str]) -> tuple[list, list[str]]:
    """Apply the prompt-length rule: prompts longer than ``max_prompt_length`` tokens are
    skipped (``skip``, their ids returned) or refused with a :class:`TaskError` naming
    the first one (``where(i)`` says which row it is). Never truncated."""
    if max_prompt_length is None:
        return list(prompts), []
    kept, skipped = [], []
    for i, (prompt, n) in enumerate(zip(prompts, lengths)):
        if n <= max_prompt_length:
            kept.append(prompt)
        elif skip:
            skipped.append(prompt.id)
        else:
            raise TaskError(
                f"{where(i)}: its prompt is {n} tokens, longer than rl.max_prompt_length={max_prompt_length}; "
                "raise rl.max_prompt_length, or set task.filter_overlong_prompts=true to skip such prompts "
                "(prompts are never truncated)")
    if not kept:
        raise TaskError(f"every one of the {len(prompts)} prompts is longer than rl.max_prompt_length="
                        f"{max_prompt_length} tokens; raise rl.max_prompt_length")
    return kept, skipped


def group_label(group: Group) -> str:
    """How a group is shown in tables: an int group is a maze size (``4x4``)."""
    return f"{group}x{group}" if isinstance(group, int) else str(group)
