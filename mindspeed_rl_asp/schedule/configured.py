"""The plan a run's config asks for: the task's prompts, their predicted lengths, the
planner. Shared by ``asp-schedule``, ``asp-train`` and its dry run."""
from __future__ import annotations

from dataclasses import replace

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


def step_aligned_plan(items, params: SchedulerParams, n_samples_per_prompt: int, global_batch_size: int,
                      epochs: int) -> tuple[SchedulePlan, list[tuple[str, tuple[str, ...]]]]:
    """A plan whose minibatches never straddle a training step, for ``max_staleness=0``
    (hybrid), where a step may only take samples of the weights it starts from.

    The prompts of all epochs, in data order (epoch ids as in :func:`repeat_for_epochs`),
    are cut into steps of ``global_batch_size``, and each step is planned on its own with
    the configured planner: with ``asp``, length-homogeneous minibatches inside the step.
    One minibatch per dispatch group (``group_size=1``): the planner's ordering then puts
    a step's heaviest minibatch first, which is what shortens a synchronous phase.
    Returns the plan (for ``plan.json``) and the ``(minibatch id, prompt ids)`` list,
    ids ``"s{step}m{m}"``.
    """
    from ..tasks import epoch_prompt_id

    per_step = replace(params, group_size=1)
    stream = [(epoch_prompt_id(i, e), length) for e in range(epochs) for i, length in items]
    groups, minibatches = [], []
    for step, start in enumerate(range(0, len(stream), global_batch_size)):
        plan = make_plan(stream[start:start + global_batch_size], per_step, n_samples_per_prompt)
        groups.extend(plan.groups)
        minibatches += [(f"s{step}m{m}", mb.ids) for m, mb in enumerate(plan.minibatches())]
    return SchedulePlan(tuple(groups), per_step, n_samples_per_prompt, f"{params.name} per step"), minibatches
