"""``asp-schedule``: write a SchedulePlan (JSON) from predicted lengths.

    asp-schedule input=lengths.jsonl output=plan.json scheduler=asp \\
        scheduler.base_batch_size=8 scheduler.slack=2 scheduler.group_size=4

``input`` is a JSONL file of ``{"id": ..., "predicted_length": ...}``. Without ``input``
the prompts of the ``task`` config are planned with ``scheduler.predictor=reference``
(the length of each maze's reference solution). ``output`` defaults to
``<run_dir>/plan.json``.
"""
from __future__ import annotations

from pathlib import Path

SUMMARY = "Plan minibatches and dispatch groups from predicted lengths (input=FILE.jsonl, output=plan.json)."


def task_items(cfg) -> list[tuple[str, float]]:
    """(prompt id, predicted length) for the task's prompts, from the configured predictor."""
    from ..tasks import make_task_prompts
    from ..tasks.maze import count_tokens
    from .common import UserError

    if cfg.scheduler.predictor != "reference":
        raise UserError(
            f"scheduler.predictor={cfg.scheduler.predictor!r} needs lengths observed from a policy; "
            "give them as input=FILE.jsonl (see docs/scheduler.md), or use scheduler.predictor=reference"
        )
    # +1: the response ends with the end-of-text token.
    return [(p.id, float(count_tokens(p.reference_response) + 1)) for p in make_task_prompts(cfg.task)]


def build_plan(cfg, items):
    from ..schedule.plan import SchedulerParams, make_plan

    params = SchedulerParams(name=cfg.scheduler.name, base_batch_size=cfg.scheduler.base_batch_size,
                             slack=cfg.scheduler.slack, group_size=cfg.scheduler.group_size)
    return make_plan(items, params, n_samples_per_prompt=cfg.rl.n_samples_per_prompt)


def schedule(cfg) -> int:
    from ..config.load import make_run_dir
    from ..schedule.plan import group_load_stats, padding_stats, read_items_jsonl
    from .common import UserError

    if cfg.input:
        if not Path(cfg.input).is_file():
            raise UserError(f"input={cfg.input!r}: no such file")
        items = read_items_jsonl(cfg.input)
    else:
        items = task_items(cfg)
    plan = build_plan(cfg, items)
    output = Path(cfg.output) if cfg.output else make_run_dir(cfg, "schedule") / "plan.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    plan.save(output)
    pad = padding_stats(plan)
    spread = group_load_stats(plan)
    print(f"planner {plan.planner}: {len(items)} prompts -> {plan.num_minibatches} minibatches in "
          f"{len(plan.groups)} groups; predicted padding bubble {pad['bubble_fraction']:.3f}, group load max/min "
          f"{spread['max_over_min']:.3f}, cv {spread['cv']:.3f}")
    print(f"wrote {output}")
    return 0


def main(argv=None) -> int:
    from .common import run_command

    return run_command("asp-schedule", SUMMARY, schedule, argv, training=False)


if __name__ == "__main__":
    raise SystemExit(main())
