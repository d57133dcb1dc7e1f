"""The plan a run's config asks for: the task's prompts, their predicted lengths, the
planner. Shared by ``asp-schedule``, ``asp-train`` and its dry run."""
from __future__ import annotations

from .plan import SchedulePlan, SchedulerParams, make_plan


def task_items(cfg, prompts=None) -> list[tuple[str, float]]:
    """(prompt id, predicted length) for the task's prompts (``prompts`` if the caller
    already built them), from the configured predictor."""
    from ..config.validate import ConfigError
    from ..tasks import make_task_prompts
    from ..tasks.maze import count_tokens

    if cfg.scheduler.predictor != "reference":
        raise ConfigError(
            f"scheduler.predictor={cfg.scheduler.predictor!r} needs lengths observed from a policy; "
            "give them to asp-schedule as input=FILE.jsonl (see docs/scheduler.md), or use "
            "scheduler.predictor=reference"
        )
    # +1: the response ends with the end-of-text token.
    return [(p.id, float(count_tokens(p.reference_response) + 1)) for p in (prompts or make_task_prompts(cfg.task))]


def build_plan(cfg, items) -> SchedulePlan:
    return make_plan(items, SchedulerParams.from_mapping(cfg.scheduler),
                     n_samples_per_prompt=cfg.rl.n_samples_per_prompt)


def repeat_for_epochs(plan: SchedulePlan, epochs: int) -> list[tuple[str, tuple[str, ...]]]:
    """``(minibatch id, prompt ids)`` in dispatch order: the plan once per epoch, epoch
    ``e``'s prompts renamed by :func:`~mindspeed_rl_asp.tasks.epoch_prompt_id`.

    Every epoch dispatches the same prompts, so the offline plan is made once and
    replayed; minibatch ids are ``"e{e}g{g}m{m}"``.
    """
    from ..tasks import epoch_prompt_id

    if epochs < 1:
        raise ValueError(f"epochs={epochs} must be >= 1")
    return [(f"e{e}g{g}m{m}", tuple(epoch_prompt_id(i, e) for i in mb.ids))
            for e in range(epochs) for g, group in enumerate(plan.groups) for m, mb in enumerate(group)]
