"""``asp-plan-layout``: the fastest T/G split, instance size, staleness bound and
minibatch size for a cluster, by simulating each candidate (sim/planner.py).

    asp-plan-layout experiment=table3_qwen3_30b_a3b_asp              # the paper's 8 x 8 910B3
    asp-plan-layout experiment=table3_qwen3_32b_asp --json plan.json # also write the table as JSON
    asp-plan-layout model=qwen3_32b hardware=h200 layout.nodes=4 ... # another cluster

The model, hardware, cluster size (layout.nodes x layout.devices_per_node), batch
geometry (rl.*) and length distribution (sim.*, sim.lengths_file) come from the config;
the split, the instance size, mode.max_staleness and scheduler.base_batch_size are swept.
Options: --json FILE, --steps N (screening steps per candidate, default 10), --top K
(candidates simulated again at the full steps, default 5), --staleness 1,2,3,4,
--base-sizes 4,8,16, --rows N (screening rows printed, default 15). Progress goes to
stderr; the last line printed is the best choice as an asp-train command.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

SUMMARY = ("Sweep T/G split, inference instance size, max_staleness and base batch size on the simulator; print "
           "the ranked table and the best layout as asp-train overrides (--json FILE, --steps N, --top K, "
           "--staleness 1,2,3,4, --base-sizes 4,8,16, --rows N).")

# Keys the planner sets itself: a user's value for one would be overwritten, so it is dropped with a note.
SWEPT_PREFIXES = ("mode=", "scheduler=", "layout.train_nodes=", "layout.gen_nodes=", "layout.infer_instance_size=",
                  "model.infer_tensor_parallel_size=", "model.infer_expert_parallel_size=",
                  "model.infer_pipeline_parallel_size=", "mode.max_staleness=", "mode.queue_capacity=",
                  "scheduler.base_batch_size=", "scheduler.slack=", "scheduler.group_size=")


@dataclass(frozen=True)
class Options:
    json_path: Optional[str] = None
    screen_steps: Optional[int] = None
    top: Optional[int] = None
    staleness: Optional[tuple[int, ...]] = None
    base_sizes: Optional[tuple[int, ...]] = None
    rows: int = 15


FLAGS = {"--json": "json_path", "--steps": "screen_steps", "--top": "top", "--staleness": "staleness",
         "--base-sizes": "base_sizes", "--rows": "rows"}


def parse_options(argv: list[str]) -> tuple[Options, list[str]]:
    """Split ``argv`` into the planner's flags (``--flag VALUE`` or ``--flag=VALUE``) and
    the Hydra overrides. Raises ``UserError`` naming a bad flag value."""
    from .common import UserError

    values: dict = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, inline = arg.partition("=")
        if flag not in FLAGS:
            rest.append(arg)
            i += 1
            continue
        if eq:
            raw, i = inline, i + 1
        elif i + 1 < len(argv):
            raw, i = argv[i + 1], i + 2
        else:
            raise UserError(f"{flag} needs a value (see asp-plan-layout --help)")
        values[FLAGS[flag]] = _flag_value(flag, raw)
    return Options(**values), rest


def _flag_value(flag: str, raw: str):
    from .common import UserError

    if flag == "--json":
        return raw
    try:
        numbers = tuple(int(part) for part in raw.split(","))
    except ValueError:
        raise UserError(f"{flag} {raw!r}: give whole numbers, e.g. {flag} "
                        f"{'1,2,3,4' if flag in ('--staleness', '--base-sizes') else '10'}") from None
    low = 0 if flag == "--staleness" else 1
    if any(n < low for n in numbers):
        raise UserError(f"{flag} {raw!r}: every value must be >= {low}")
    if flag in ("--staleness", "--base-sizes"):
        return numbers
    if len(numbers) != 1:
        raise UserError(f"{flag} {raw!r}: give one number")
    return numbers[0]


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(the user's overrides the planner keeps, those it sweeps itself and drops)."""
    kept = [o for o in overrides if not o.startswith(SWEPT_PREFIXES)]
    return kept, [o for o in overrides if o.startswith(SWEPT_PREFIXES)]


def plan(options: Options, overrides: list[str]) -> int:
    from ..config.load import load_config
    from ..config.validate import ConfigError
    from ..sim import planner
    from ..sim.run import workload_from_config
    from .common import UserError

    kept, dropped = split_overrides(overrides)
    notes = [f"ignored {o}: the planner sweeps this key" for o in dropped]
    bases = {"async": load_config([*kept, "mode=async", "scheduler=asp"], local_install=False)}
    try:
        bases["hybrid"] = load_config([*kept, "mode=hybrid", "scheduler=fifo"], local_install=False)
    except ConfigError as error:
        notes.append(f"no hybrid reference row: {' '.join(str(error).split())}")
    cfg = bases["async"]
    layout, rl = cfg.layout, cfg.rl
    sizes, size_notes = planner.feasible_instance_sizes(cfg)
    notes += size_notes
    if not sizes:
        raise UserError("no inference instance size holds the model: " + " | ".join(size_notes))
    confirm_steps = cfg.steps
    screen_steps = min(options.screen_steps or planner.SCREEN_STEPS, confirm_steps)

    def parallel(size: int):
        return planner.inference_parallel_for(cfg.model, layout.infer_instance_size, size)

    try:
        candidates = planner.candidate_grid(layout.nodes, layout.devices_per_node, sizes, rl.global_batch_size,
                                            rl.n_samples_per_prompt, options.staleness or planner.STALENESS_BOUNDS,
                                            options.base_sizes, parallel)
    except planner.PlannerError as error:
        raise UserError(str(error)) from None
    reference = None
    if "hybrid" in bases:
        size = layout.infer_instance_size if layout.infer_instance_size in sizes else sizes[0]
        reference = planner.hybrid_candidate(layout.nodes, layout.devices_per_node, size, rl.global_batch_size,
                                             rl.n_samples_per_prompt, parallel(size))
    print(f"planning {cfg.model.name} on {layout.nodes} x {layout.devices_per_node} {cfg.hardware.name}: "
          f"{rl.global_batch_size} prompts x {rl.n_samples_per_prompt} samples per step, responses up to "
          f"{cfg.generate.sampling_config.max_tokens} tokens, lengths "
          f"{cfg.sim.lengths_file or f'median {cfg.sim.median_response_length:g}'}; "
          f"{len(candidates) + (reference is not None)} candidates", file=sys.stderr)
    started = time.perf_counter()
    try:
        result = planner.plan_layout(bases, candidates, reference, screen_steps, confirm_steps,
                                     options.top or planner.CONFIRM_TOP, workload_from_config(cfg), notes,
                                     progress=_progress_printer())
    except planner.PlannerError as error:
        raise UserError(str(error)) from None
    result.seconds = time.perf_counter() - started
    result.base_overrides = kept
    print(f"done in {result.seconds:.1f} s", file=sys.stderr)
    trust = planner.validation_trust(cfg)
    print(report(result, cfg, options.rows, trust))
    if options.json_path:
        write_json(Path(options.json_path), cfg, result, trust)
    print(planner.command_line(result.best_overrides()))
    return 0


def write_json(path: Path, cfg, result, trust) -> None:
    """The planner's answer as JSON (``--json``): the problem, every row, the trust lines."""
    layout, rl = cfg.layout, cfg.rl
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"model": cfg.model.name, "hardware": cfg.hardware.name, "nodes": layout.nodes,
                "devices_per_node": layout.devices_per_node, "global_batch_size": rl.global_batch_size,
                "n_samples_per_prompt": rl.n_samples_per_prompt, **result.to_dict(), "trust": trust}
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)


def report(result, cfg, rows: int, trust=()) -> str:
    from ..sim import planner

    lines = [*(f"note: {n}" for n in result.notes), *planner.summarize_skipped(result.skipped), "",
             f"{cfg.model.name} on {cfg.layout.nodes} x {cfg.layout.devices_per_node} {cfg.hardware.name}, "
             f"best {len(result.confirmed)} at steps={result.confirm_steps} (ranked by iteration time):",
             planner.format_table(result.confirmed),
             *(["", "how far to trust it (the nearest published measurements, docs/validation.md):", *trust]
               if trust else [])]
    if result.confirmed is not result.screened:
        lines += ["", f"screening at steps={result.screen_steps}, best {rows} of {len(result.screened)}:",
                  planner.format_table(result.screened, rows)]
    best = result.best
    lines += ["", f"best: {best.candidate.label}: {best.iteration_s:.1f} s per iteration, "
                  f"{best.tokens_per_s_per_device:.1f} tokens/s/device (lower bound {best.lower_bound_s:.1f} s)"]
    return "\n".join(lines)


def _progress_printer():
    """One updating line on a terminal; on a pipe a line every tenth of the sweep."""
    tty = sys.stderr.isatty()

    def show(done: int, total: int, outcome) -> None:
        from ..sim.planner import Evaluated

        if not tty and done % max(1, total // 10) and done != total:
            return
        what = f"{outcome.iteration_s:.1f} s/iter" if isinstance(outcome, Evaluated) else "skipped"
        end = "\r" if tty and done != total else "\n"
        print(f"[{done}/{total}] {outcome.candidate.label}: {what}".ljust(60), end=end, file=sys.stderr, flush=True)

    return show


def main(argv=None) -> int:
    from .common import UserError, run_command

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        options, overrides = parse_options(argv)
    except UserError as error:
        print(f"asp-plan-layout: error: {error}", file=sys.stderr)
        return 2
    return run_command("asp-plan-layout", SUMMARY, lambda cfg: plan(options, overrides), overrides,
                       local_install=False)


if __name__ == "__main__":
    raise SystemExit(main())
