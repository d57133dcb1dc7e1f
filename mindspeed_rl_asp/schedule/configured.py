"""The plan a run's config asks for: the task's prompts, their predicted lengths, the
planner. Shared by ``asp-schedule``, ``asp-train`` and its dry run; also builds the task
itself from a run's config (:func:`configured_task`)."""
from __future__ import annotations

from dataclasses import replace

from .plan import SchedulePlan, SchedulerParams, make_plan


def configured_task(cfg, tokenizer=None, training: bool = False):
    """The task of a run's config, built as every process of the run builds it: prompts
    fitted to ``rl.max_prompt_length`` tokens of the model's tokenizer (``tokenizer``, or
    the one at ``model.path``, loaded when the task needs it: ``task=dataset`` always, the
    maze task only when given one). ``training``: a step must not hold a prompt twice.

    Raises :class:`~mindspeed_rl_asp.tasks.base.TaskError` or :class:`ConfigError` naming
    the key, file or row to fix, before any run directory exists."""
    from ..config.validate import ConfigError, resolve_model_path
    from ..tasks import make_task

    if tokenizer is None and cfg.task.name == "dataset":
        from ..engines.hf import load_tokenizer

        tokenizer = load_tokenizer(resolve_model_path(cfg.model.path))
    task = make_task(cfg.task, tokenizer, cfg.rl.max_prompt_length)
    n = len(task.prompts)
    problems = []
    if training and n < cfg.rl.global_batch_size:
        problems.append(f"rl.global_batch_size={cfg.rl.global_batch_size} exceeds the {n} prompts of the task "
                        f"({task.description}): a step would hold a prompt twice; lower rl.global_batch_size or "
                        "give more prompts")
    if cfg.scheduler.base_batch_size > n:
        problems.append(f"scheduler.base_batch_size={cfg.scheduler.base_batch_size} exceeds the {n} prompts of "
                        f"the task ({task.description})")
    if problems:
        raise ConfigError("; ".join(problems))
    return task


def resolve_predictor(sched, prompts) -> tuple[str, str]:
    """``scheduler.predictor`` made concrete for the task's ``prompts``, and why: ``auto``
    (the default) is ``reference`` when every prompt has a reference length (or the
    scheduler is fifo, which reads no lengths), else ``history`` when
    ``scheduler.lengths_file`` is given, else ``ridge``: profiled on
    ``scheduler.profile_share`` of the prompts with the starting policy and fitted before
    training. Any other value stays as given."""
    if sched.predictor != "auto":
        return sched.predictor, "as configured"
    if sched.name == "fifo":
        return "reference", "scheduler=fifo reads no lengths"
    missing = sum(p.reference_length is None for p in prompts)
    if not missing:
        return "reference", "every prompt has a reference length"
    why = f"{missing} of {len(prompts)} prompts have no reference length"
    if sched.lengths_file:
        return "history", f"{why}; scheduler.lengths_file is given"
    return "ridge", f"{why}; a ridge predictor is profiled and fitted on a share of them"


def apply_predictor(cfg, prompts) -> str:
    """Set ``cfg.scheduler.predictor`` to :func:`resolve_predictor`'s choice (so that the
    run's config.yaml, its plan and a resume all see it); returns one line saying which and why."""
    kind, why = resolve_predictor(cfg.scheduler, prompts)
    note = f"scheduler.predictor={cfg.scheduler.predictor}" + (f" -> {kind} ({why})" if kind != cfg.scheduler.predictor
                                                               else "")
    cfg.scheduler.predictor = kind
    return note


def task_items(cfg, prompts=None) -> list[tuple[str, float]]:
    """(prompt id, predicted length) for the task's prompts (``prompts`` if the caller
    already built them), from the task's reference lengths (``scheduler.predictor``
    ``reference``, or ``auto``: here nothing is profiled)."""
    from ..config.validate import ConfigError

    if cfg.scheduler.predictor not in ("reference", "auto"):
        raise ConfigError(
            f"scheduler.predictor={cfg.scheduler.predictor!r} needs lengths observed from a policy: asp-train "
            "profiles and fits it in the loop (schedule/length_profile.py); here give the lengths to asp-schedule "
            "as input=FILE.jsonl (see docs/scheduler.md), or use scheduler.predictor=reference"
        )
    prompts = configured_task(cfg).prompts if prompts is None else prompts
    missing = [p.id for p in prompts if p.reference_length is None]
    if missing and cfg.scheduler.name == "fifo":
        # fifo plans in data order and never reads a length: each prompt's load is taken
        # as the generation budget, so that plan.json's loads stay an upper bound.
        budget = float(cfg.generate.sampling_config.max_tokens)
        return [(p.id, budget if p.reference_length is None else float(p.reference_length)) for p in prompts]
    if missing:
        raise ConfigError(
            f"scheduler.predictor={cfg.scheduler.predictor} needs a reference length for every prompt, and "
            f"task={cfg.task.name} gives none for {len(missing)} of them (first: {missing[0]!r}); set "
            "task.reference_key to the field that holds a reference response, plan from observed lengths "
            "(asp-schedule input=FILE.jsonl, docs/scheduler.md), let asp-train learn them "
            "(scheduler.predictor=auto|ridge|lm, or history with scheduler.lengths_file), or use scheduler=fifo, "
            "which reads no lengths"
        )
    return [(p.id, float(p.reference_length)) for p in prompts]


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
