"""``asp-import-mindspeed``: a MindSpeed-RL GRPO / DAPO job YAML as this project's overrides.

    asp-import-mindspeed JOB.yaml                         # the overrides, the ignored keys, the layout
    asp-import-mindspeed JOB.yaml layout=ascend910b3_t2g6 # map onto a layout you choose
    asp-import-mindspeed JOB.yaml task=maze --dry-run     # and dry-run asp-train with them
    asp-import-mindspeed JOB.yaml --model-dir DIR         # the model group's folder (default: model/ beside JOB)
    asp-train --mindspeed-config JOB.yaml [overrides]     # import, print, and train (your overrides win)

The mapping, what is ignored and what is refused: docs/mindspeed_rl.md and
mindspeed_rl_asp/integrations/mindspeed/config_import.py.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

CONFIG_FLAG = "--mindspeed-config"
MODEL_DIR_FLAG = "--model-dir"


def _take_value(argv: list[str], flag: str) -> Optional[str]:
    """Remove ``flag VALUE`` (or ``flag=VALUE``) from argv and return VALUE."""
    from .common import UserError

    for i, arg in enumerate(argv):
        if arg == flag:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise UserError(f"{flag} needs a value: {flag} PATH")
            value = argv[i + 1]
            del argv[i:i + 2]
            return value
        if arg.startswith(flag + "="):
            del argv[i]
            return arg.split("=", 1)[1]
    return None


def expand_mindspeed_config(argv: Sequence[str], out=None) -> list[str]:
    """``argv`` with ``--mindspeed-config FILE [--model-dir DIR]`` replaced by the imported
    overrides, the user's own overrides after them (and winning: a key set by both keeps
    the user's). Prints what was imported to ``out`` (stdout). Without the flag: argv."""
    from ..integrations.mindspeed.config_import import import_file, merge_overrides

    argv = list(argv)
    path = _take_value(argv, CONFIG_FLAG)
    model_dir = _take_value(argv, MODEL_DIR_FLAG)
    if path is None:
        return argv
    flags = [a for a in argv if a.startswith("-")]
    user = [a for a in argv if not a.startswith("-")]
    result = import_file(path, model_dir, user)
    print(result.describe(), file=out or sys.stdout, flush=True)
    if user:
        print(f"# then your {len(user)} override(s), which win: {' '.join(user)}", file=out or sys.stdout)
    return merge_overrides(result.overrides, user) + flags


def main(argv=None) -> int:
    from .common import UserError, expected_errors

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0 if argv else 2
    dry_run = "--dry-run" in argv
    argv = [a for a in argv if a != "--dry-run"]
    try:
        path = argv.pop(0)
        if path.startswith("-") or "=" in path:
            raise UserError(f"the first argument is the MindSpeed-RL job YAML, got {path!r}")
        overrides = expand_mindspeed_config([CONFIG_FLAG, path, *argv])
    except expected_errors() as error:
        print(f"asp-import-mindspeed: error: {error}", file=sys.stderr)
        return 2
    if not dry_run:
        import shlex

        print("# the same job as one command:\nasp-train " + " ".join(map(shlex.quote, overrides)))
        return 0
    from .train import main as train_main

    return train_main([*overrides, "--dry-run"])


if __name__ == "__main__":
    raise SystemExit(main())
