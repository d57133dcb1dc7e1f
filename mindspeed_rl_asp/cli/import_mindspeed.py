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

from ..integrations.mindspeed.config_import import CONFIG_FLAG, expand_mindspeed_config


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
