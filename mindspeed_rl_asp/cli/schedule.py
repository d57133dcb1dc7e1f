"""``asp-schedule``: write a SchedulePlan (JSON) from predicted lengths.

    asp-schedule input=lengths.jsonl output=plan.json scheduler=asp \\
        scheduler.base_batch_size=8 scheduler.slack=2 scheduler.group_size=4

``input`` is a JSONL file of ``{"id": ..., "predicted_length": ...}``. Without ``input``
the prompts of the ``task`` config are planned with ``scheduler.predictor=reference``
(the length of each prompt's reference response: a maze's reference solution, a
dataset's ``task.reference_key`` field). ``output`` defaults to ``<run_dir>/plan.json``.
"""
from __future__ import annotations

from pathlib import Path

SUMMARY = "Plan minibatches and dispatch groups from predicted lengths (input=FILE.jsonl, output=plan.json)."


def schedule(cfg) -> int:
    from ..config.load import make_run_dir
    from ..schedule.configured import build_plan, task_items
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
