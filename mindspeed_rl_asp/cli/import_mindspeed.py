"""``asp-import-mindspeed``: MindSpeed-RL GRPO / DAPO job YAMLs as this project's overrides.

    asp-import-mindspeed JOB.yaml                         # the overrides, the ignored keys, the layout
    asp-import-mindspeed JOB.yaml layout=ascend910b3_t2g6 # map onto a layout you choose
    asp-import-mindspeed JOB.yaml layout.devices_per_node=16   # nodes of 16 NPUs (the layout is made from num_npus)
    asp-import-mindspeed JOB.yaml task.path=DATA --dry-run     # and dry-run asp-train with them
    asp-import-mindspeed JOB.yaml --model-dir DIR         # the model group's folder (default: model/ beside JOB)
    asp-import-mindspeed A.yaml B.yaml ... [overrides]    # several jobs, one after the other (one process)
    asp-train --mindspeed-config JOB.yaml [overrides]     # import, print, and train (your overrides win)

The mapping, what is ignored and what is refused: docs/mindspeed_rl.md and
mindspeed_rl_asp/integrations/mindspeed/config_import.py. With several jobs every one is
imported (and dry-run) even when an earlier one is refused; the exit status is 2 if any was.
"""
from __future__ import annotations

import sys

from ..integrations.mindspeed.config_import import CONFIG_FLAG, expand_mindspeed_config


def job_files(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the leading job YAMLs, the rest); a job file is a .yaml / .yml argument without ``=``."""
    jobs = []
    while argv and "=" not in argv[0] and not argv[0].startswith("-") and argv[0].endswith((".yaml", ".yml")):
        jobs.append(argv.pop(0))
    return jobs, argv


def import_one(path: str, rest: list[str], dry_run: bool, several: bool = False) -> int:
    """Import (and with ``dry_run`` dry-run) one job; 2 on a refusal, printed as one line."""
    from .common import expected_errors

    try:
        overrides = expand_mindspeed_config([CONFIG_FLAG, path, *rest])
    except expected_errors() as error:
        print(f"asp-import-mindspeed: error: {f'{path}: ' if several else ''}{error}", file=sys.stderr, flush=True)
        return 2
    if not dry_run:
        import shlex

        print("# the same job as one command:\nasp-train " + " ".join(map(shlex.quote, overrides)), flush=True)
        return 0
    from .train import main as train_main

    return train_main([*overrides, "--dry-run"])


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0 if argv else 2
    dry_run = "--dry-run" in argv
    jobs, rest = job_files([a for a in argv if a != "--dry-run"])
    if not jobs:
        first = next((a for a in argv if a != "--dry-run"), "")
        print(f"asp-import-mindspeed: error: the first argument is the MindSpeed-RL job YAML, got {first!r}",
              file=sys.stderr)
        return 2
    if len(jobs) == 1:
        return import_one(jobs[0], rest, dry_run)
    status = 0
    for path in jobs:
        print(f"### {path}", flush=True)
        status = max(status, import_one(path, rest, dry_run, several=True))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
