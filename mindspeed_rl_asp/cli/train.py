"""``asp-train``: asynchronous GRPO with ASP (or a baseline) on a Ray cluster.

    asp-train                                   # async + asp on the tiny maze policy, local Ray
    asp-train mode=async scheduler=fifo         # verl-style async baseline
    asp-train mode=hybrid scheduler=fifo        # MindSpeed-RL-style colocated baseline
    asp-train steps=20 run_dir=runs/mine        # length and place of the run
    asp-train --dry-run                         # print the placement and the plan, run nothing
    asp-train task=dataset task.path=train.jsonl task.verifier_function=[math_verify] model.path=DIR
                                                # a user's data, reward and Hugging Face checkpoint

Writes config.yaml, plan.json, placement.txt, metrics.jsonl, tensorboard/, timeline.jsonl,
queue.jsonl and summary.json into the run directory; ``asp-report RUN_DIR`` draws them.
"""
from __future__ import annotations

import sys
import time

SUMMARY = ("Train the policy with asynchronous GRPO (mode=async|hybrid, scheduler=asp|fifo|sorted) on Ray, on a "
           "task (task=maze|dataset|maze_dataset) with model.path any local Qwen2/Qwen3 checkpoint.")


def train(cfg, dry_run: bool = False, overrides=()) -> int:
    """``overrides``: the command line's, which a resumed run applies to its saved config."""
    from ..runtime.driver import prepare_task
    from .common import make_console

    console = make_console()
    cfg, resume = resolved_config(cfg, overrides)
    placement, groups = placement_of(cfg)
    where = f"layout {cfg.layout.name}, mode {cfg.mode.name}:\n{placement.describe(groups)}"
    # The task first: a bad file, field, row or reward stops here, before the run directory
    # exists. A real run measures prompts with the model's tokenizer, as its actors do; the
    # dry run loads no checkpoint (task=dataset excepted: it needs the tokenizer to read its rows).
    prepared = prepare_task(cfg, with_tokenizer=not dry_run)
    task = prepared.task
    if task.skipped:
        console.print(f"task: skipped {len(task.skipped)} prompt(s) longer than rl.max_prompt_length="
                      f"{cfg.rl.max_prompt_length} tokens (first: {task.skipped[0]}); "
                      "task.filter_overlong_prompts=false refuses them instead")
    if dry_run:
        print_dry_run(console, cfg, prepared, resume, where, len(placement.generators))
        return 0
    run_dir = open_run_dir(console, cfg, resume)
    summary = run_with_progress(console, cfg, run_dir, prepared, resume, len(placement.generators))
    return print_outcome(console, cfg, run_dir, summary)


def resolved_config(cfg, overrides):
    """``(cfg, resume point or None)``: a resumed run's saved config with this command
    line's overrides, and the checkpoint it starts from (checked before anything is written)."""
    if not cfg.resume:
        return cfg, None
    from ..config.resume import resume_config
    from ..runtime.checkpoint import check_steps_left, find_resume_point

    cfg = resume_config(cfg.resume, overrides)
    resume = find_resume_point(cfg.resume)
    check_steps_left(resume, cfg.steps, cfg.resume)
    return cfg, resume


def placement_of(cfg) -> tuple:
    """``(placement, worker groups)`` of the run, as the driver places it (a layout that
    cannot hold the run fails here, before anything else)."""
    from omegaconf import OmegaConf

    from ..config.placement import plan_placement, trainer_holds_devices, worker_groups_of

    layout = OmegaConf.to_object(cfg.layout)
    placement = plan_placement(layout, cfg.mode.name, ranks=cfg.train.ranks,
                               trainer_holds_devices=trainer_holds_devices(cfg.engine.name, cfg.mode.name))
    return placement, worker_groups_of(cfg.engine.name, cfg.mode.name, layout)


def print_dry_run(console, cfg, prepared, resume, where: str, num_generators: int) -> None:
    """What the run would do: the placement (``where``), and the plan (a new run: planned
    here and checked by the control core's rules) or the resume point."""
    if resume is not None:
        control = resume.control
        for note in resume.skipped:
            console.print(f"skipped checkpoint {note}")
        console.print(f"resume {cfg.resume} from {resume.path.name}: version {control.version}, "
                      f"{cfg.steps - control.version} of {cfg.steps} steps left, {len(control.consumed)} prompt "
                      "groups trained; queued samples are regenerated with the resumed weights")
        console.print(where)
        return
    from ..schedule.length_profile import describe_predictor
    from ..schedule.planning import make_control_core, plan_run

    task, num_prompts = prepared.task, len(prepared.task.prompts)
    plan, epochs, minibatches = plan_run(cfg, task.prompts)
    make_control_core(cfg, minibatches, num_generators)  # refuses plans the rules cannot run
    console.print(where)
    console.print(describe_weights(cfg))
    console.print(f"task {task.name}: {task.description}; rewards {' + '.join(task.rewards.names)}")
    console.print(f"plan: {plan.planner}, {plan.num_minibatches} minibatches in {len(plan.groups)} groups, "
                  f"{epochs} epoch(s) over {num_prompts} prompts for {cfg.steps} steps")
    console.print(f"{prepared.predictor_note}; {describe_predictor(cfg, num_prompts)}")


def open_run_dir(console, cfg, resume):
    """A new run's directory (config.yaml written), or the resumed run's (its config.yaml
    stays as the run began; the driver writes this segment's beside it once all checks pass)."""
    from pathlib import Path

    from ..config.load import make_run_dir

    if resume is None:
        return make_run_dir(cfg, "train")
    for note in resume.skipped:   # newer checkpoints that are damaged, one line each
        console.print(f"skipped checkpoint {note}")
    console.print(f"resuming from {resume.path} (version {resume.version})")
    return Path(cfg.run_dir)


def run_with_progress(console, cfg, run_dir, prepared, resume, num_generators: int) -> dict:
    """``run_training`` under a progress bar: start-up phases, one line per step, the
    final check's samples. Returns the run's summary."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..runtime.driver import run_training

    num_prompts = len(prepared.task.prompts)
    console.print(f"[bold]asp-train[/] mode={cfg.mode.name} scheduler={cfg.scheduler.name} "
                  f"layout={cfg.layout.name} ({num_generators} generation actors), {cfg.steps} steps "
                  f"({cfg.steps * cfg.rl.global_batch_size / num_prompts:.2g} passes over {num_prompts} prompts: "
                  f"{prepared.task.description}); run dir {run_dir}")
    columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} {task.fields[unit]}"),
               TimeElapsedColumn(), TextColumn("{task.fields[info]}")]
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("training", total=cfg.steps, completed=resume.version if resume else 0,
                                info="starting actors", unit="steps")
        on_step, on_eval, on_phase = progress_callbacks(progress, bar)
        return run_training(cfg, run_dir, on_step, on_eval=on_eval, prepared=prepared, on_phase=on_phase,
                            resume_point=resume)


def progress_callbacks(progress, bar):
    """``(on_step, on_eval, on_phase)`` of :func:`run_training` drawing on ``progress``."""
    def on_step(m: dict) -> None:
        progress.update(bar, completed=m["step"] + 1, info=(
            f"reward {m['reward_mean']:.3f} correct {m['correctness_rate']:.2f} "
            f"age {m['policy_age_mean']:.1f} {m['tokens_per_s']:.0f} tok/s"))
        progress.console.print(
            f"step {m['step']:>3}  iter {m['iteration_time_s']:6.2f}s  reward {m['reward_mean']:.3f}  "
            f"integrity {m['integrity_rate']:.2f}  correctness {m['correctness_rate']:.2f}  "
            f"age {m['policy_age_mean']:.2f}  pad {m['padding_bubble']:.2f}  "
            f"gen-idle {m['generation_idle_fraction']:.2f}  {m['tokens_per_s']:.0f} tok/s")

    checking = None

    def on_eval(what: str, done: int, total: int) -> None:
        nonlocal checking
        if checking is None:
            checking = progress.add_task("final check", total=total, info="", unit="samples")
        progress.update(checking, completed=done, total=total, info=f"sampling {what}")

    began = time.time()

    def on_phase(what: str) -> None:   # start-up, before the first step
        progress.update(bar, info=what)
        progress.console.print(f"startup {time.time() - began:6.1f}s  {what}")

    return on_step, on_eval, on_phase


def print_outcome(console, cfg, run_dir, summary: dict) -> int:
    """The run's end for the user: how to resume an interrupted run (exit 130 / 143), or
    the per-epoch correctness and the initial-vs-final comparison (exit 0)."""
    if summary.get("interrupted") and summary.get("stage") != "final evaluation":
        how = (f"resume with `{summary['resume_command']}`" if summary.get("resume_command")
               else "no checkpoint to resume from (set save_every=K to write them)")
        console.print(f"interrupted ({summary['signal']}) after {summary['steps']} steps; {how}")
        return 143 if summary["signal"] == "SIGTERM" else 130
    by_epoch = summary.get("on_policy_correctness_by_epoch", [])
    if len(by_epoch) > 1:
        console.print("on-policy correctness per epoch (the same prompts each epoch): " + "  ".join(
            f"{e['epoch']}: {e['correctness']:.3f}" for e in by_epoch if e["complete"]) + "".join(
            f"; epoch {e['epoch']} is partial ({e['samples']} samples) and not comparable"
            for e in by_epoch if not e["complete"]))
    held_out_title = (f"held-out mazes (eval.seed={cfg.eval.seed})" if cfg.task.name == "maze"
                      else f"held-out prompts ({cfg.task.eval_path})")
    for key, title in (("training_prompts", "training prompts (seen in training)"), ("held_out", held_out_title)):
        if key in summary:
            print_comparison(console, title, summary[key], cfg.eval.samples_per_prompt)
    console.print(f"done: {summary['steps']} steps in {summary['wall_time_s']:.1f} s; "
                  f"`asp-report {run_dir}` draws the timeline, queue and rewards")
    return 0


def describe_weights(cfg) -> str:
    """One line: how versions reach the actors (weights.transport)."""
    w = cfg.weights
    if w.transport == "collective":
        from ..control.core import prefetches
        from ..weights.collective import backend_for

        # The core issues Prefetch only where it can overlap generation (not in hybrid).
        arrival = "prefetched as the core decides, once published" if prefetches(cfg) else "sent at load"
        how = (f"collective ({backend_for(cfg.layout.device_type)} pair group per actor, {w.bucket_mb:g} MB buckets, "
               f"{arrival})")
    elif w.transport == "files":
        how = f"files (safetensors in {w.dir or '<run_dir>/weights'})"
    else:
        how = "Ray object store"
    return f"weights: trainer rank 0 -> every generation actor by {how}"


def print_comparison(console, title: str, comparison: dict, samples_per_prompt: int) -> None:
    """Initial vs final policy per group (maze size), then the paired change with its 95 % interval."""
    from rich.table import Table

    from ..tasks.base import group_label

    initial, final = comparison["initial"], comparison["final"]

    def groups(r):
        return r["by_group"] if "by_group" in r else r.get("by_size", {})

    prompts = comparison["change"]["correctness"]["prompts"]
    by = "maze size" if all(isinstance(k, int) for k in groups(initial)) else "group"
    table = Table(title=f"{title}: {prompts} prompts x {samples_per_prompt} samples, correctness by {by}")
    for column in ("policy", "integrity", "correctness", *(group_label(k) for k in groups(initial))):
        table.add_column(column, justify="right")
    for name, r in (("initial", initial), ("final", final)):
        table.add_row(name, f"{r['integrity_rate']:.3f}", f"{r['correctness_rate']:.3f}",
                      *(f"{v['correctness_rate']:.2f}" for v in groups(r).values()))
    console.print(table)
    for key, c in comparison["change"].items():
        low, high = c["ci95"]
        verdict = "up" if low > 0 else "down" if high < 0 else "no significant change"
        console.print(f"{key}: {c['before']:.3f} -> {c['after']:.3f}, change {c['change']:+.3f} "
                      f"(95% CI {low:+.3f} .. {high:+.3f}; {c['improved']} prompts up, {c['worsened']} down): "
                      f"{verdict}")


def main(argv=None) -> int:
    from .common import run_command

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--mindspeed-config" or a.startswith("--mindspeed-config=") for a in argv):
        from .common import expected_errors
        from ..integrations.mindspeed.config_import import expand_mindspeed_config

        try:  # a MindSpeed-RL job YAML: its overrides first, the user's after them (and winning)
            argv = expand_mindspeed_config(argv, apply_env="--dry-run" not in argv)
        except expected_errors() as error:
            print(f"asp-train: error: {error}", file=sys.stderr)
            return 2
    dry_run = "--dry-run" in argv
    argv = [a for a in argv if a != "--dry-run"]
    return run_command("asp-train", SUMMARY, lambda cfg: train(cfg, dry_run, argv), argv)


if __name__ == "__main__":
    raise SystemExit(main())
