"""From a run's config to what the control core runs: the offline plan, the passes
over the prompts, the minibatches in dispatch order, and the core itself
(:func:`make_control_core`; a run's core, with its re-plan rule, comes from
``schedule/assembly.assemble_core``). Shared by the Ray driver, ``asp-train --dry-run``
and the simulator (which plans a synthetic workload through :func:`plan_minibatches`
exactly as a real run plans its prompts)."""
from __future__ import annotations

from typing import Sequence


def steps_must_align(mode) -> bool:
    """Minibatches may not straddle a training step when ``max_staleness=0``: a step may
    take only samples of the weights it starts from, so a minibatch spanning two steps
    could never be consumed (a liveness rule of docs/control.md, not a device rule; the
    device rule is ``control.core.is_colocated``)."""
    return mode.max_staleness == 0


def plan_minibatches(cfg, items: Sequence[tuple[str, float]], epochs: int):
    """The plan (for ``plan.json``) and the ``(minibatch id, prompt ids)`` the core
    dispatches, for ``items`` = (prompt id, predicted length): one pass planned and
    replayed once per pass; planned step by step when :func:`steps_must_align`."""
    from .configured import build_plan, repeat_for_epochs, step_aligned_plan
    from .plan import SchedulerParams

    if steps_must_align(cfg.mode):
        return step_aligned_plan(items, SchedulerParams.from_mapping(cfg.scheduler),
                                 cfg.rl.n_samples_per_prompt, cfg.rl.global_batch_size, epochs)
    plan = build_plan(cfg, items)
    return plan, repeat_for_epochs(plan, epochs)


def run_items(cfg, prompts, run_dir=None, log=None) -> list[tuple[str, float]]:
    """(prompt id, predicted length) for the task's ``prompts`` from ``scheduler.predictor``.

    ``reference``: the task's reference lengths. ``ridge`` / ``lm`` / ``history``: the
    predictor in the loop (:func:`~mindspeed_rl_asp.schedule.length_profile.profile_and_predict`:
    profile with the starting policy, fit, predict; its files go into ``run_dir``).
    Without ``run_dir`` (the dry run) the policy is neither sampled nor loaded: ``history``
    still reads its lengths file, ``ridge`` / ``lm`` plan every prompt at the generation
    budget (``generate.sampling_config.max_tokens``)."""
    from .configured import apply_predictor, task_items

    apply_predictor(cfg, prompts)   # auto made concrete (a no-op when the caller did it)
    sched = cfg.scheduler
    if sched.predictor == "reference":
        return task_items(cfg, prompts)
    from .length_profile import profile_and_predict

    if run_dir is None and sched.predictor != "history":
        budget = float(cfg.generate.sampling_config.max_tokens)
        return [(p.id, budget) for p in prompts]
    return profile_and_predict(cfg, prompts, run_dir, log=log)[0]


def plan_run(cfg, prompts, run_dir=None, log=None):
    """``(plan, epochs, minibatches)`` for the task's ``prompts`` and ``cfg.steps``;
    ``run_dir``: the run's directory, where a fitted predictor and its report go (see
    :func:`run_items`; None: the dry run, nothing sampled)."""
    from ..tasks import epochs_needed

    epochs = epochs_needed(len(prompts), cfg.steps, cfg.rl.global_batch_size)
    plan, minibatches = plan_minibatches(cfg, run_items(cfg, prompts, run_dir, log), epochs)
    return plan, epochs, minibatches


def make_control_core(cfg, minibatches, num_actors: int, start_version: int = 0, taken=(), replan=None):
    """The pure control core for this plan, for ``cfg.steps`` steps (``start_version``: a
    resumed run's checkpoint version, where its core starts; with ``save_every`` the core
    issues the checkpoints; with ``algo.filter_groups`` the core refills from
    :func:`refill_passes`, past the epochs of ``taken``: a resumed run's prompt ids already
    trained; ``replan``: the re-plan rule of ``scheduler.refit``, ``control.replan.EpochReplan``,
    from ``schedule/assembly.replan_rule``); a plan the control rules cannot run (for
    example hybrid mode with minibatches that straddle step boundaries) is a config error."""
    from ..config.validate import ConfigError
    from ..control.core import ControlConfig, ControlCore

    try:   # the config's checks and the plan's, both refusals named with the mode and scheduler
        control = ControlConfig.from_root(cfg, num_actors=num_actors, start_version=start_version)
        refill = refill_passes(minibatches, taken) if control.filter_groups != "none" else None
        return ControlCore(control, minibatches, refill=refill, replan=replan)
    except ValueError as error:
        raise ConfigError(f"the plan cannot run with mode={cfg.mode.name}, scheduler={cfg.scheduler.name}: "
                          f"{error}") from None


def refill_passes(minibatches, taken=()):
    """The refill of dynamic sampling (``ControlCore(refill=...)``), for when rejected
    groups used the plan up: pass ``k`` is ``minibatches`` again, as the next passes over
    the data (as DAPO reads its data loader's next batch): the same cut and order, every
    prompt id moved ``k x E`` epochs on (``E``: the epochs the list spans), and further if
    ``taken`` (ids used before, e.g. trained by a resumed run's earlier segments) reaches
    later epochs, so no id repeats; minibatch ids prefixed ``r{k + d}.``, where ``d`` is the
    deepest refill prefix already in ``minibatches`` (a resumed run's dispatch list holds the
    refills of its earlier segments), so no minibatch id repeats either. Pure: the same
    ``k`` gives the same minibatches."""
    import re

    from ..tasks import base_prompt_id, epoch_prompt_id, prompt_epoch

    mbs = [(str(mb_id), tuple(ids)) for mb_id, ids in minibatches]
    epochs = [prompt_epoch(p) for _, ids in mbs for p in ids] or [0]
    span = max(epochs) - min(epochs) + 1
    beyond = max(0, max((prompt_epoch(p) for p in taken), default=0) - max(epochs))
    depth = max((int(m.group(1)) for mb_id, _ in mbs for m in [re.match(r"r(\d+)\.", mb_id)] if m), default=0)

    def refill(k: int):
        shift = k * span + beyond
        return [(f"r{k + depth}.{mb_id}",
                 tuple(epoch_prompt_id(base_prompt_id(p), prompt_epoch(p) + shift) for p in ids))
                for mb_id, ids in mbs]
    return refill
