"""What every command-line entry point shares: Hydra-style overrides in, clear errors out.

Each CLI is ``main(argv) -> int`` over :func:`run_command`: arguments are Hydra overrides
(``key=value``, ``group=option``); ``--help`` lists the config groups and their options;
``--cfg`` prints the composed config and exits. Expected failures (bad config, missing
checkpoint, malformed input) print one ``error:`` line, never a library traceback.
"""
from __future__ import annotations

import sys
from typing import Callable, Sequence

from ..config.validate import ConfigError

GROUPS = ("layout", "model", "engine", "scheduler", "mode", "task", "experiment")


class UserError(Exception):
    """A problem the user can fix; its message says how."""


def expected_errors() -> tuple[type[BaseException], ...]:
    from ..control.core import ActorsExhausted, TooManyRejected
    from ..control.loop import TrainerFailed
    from ..engines.base import EngineError
    from ..schedule.partition import ScheduleError
    from ..sim.profiles import ProfileError
    from ..sim.workload import WorkloadError
    from ..tasks.base import TaskError
    from ..tasks.maze import MazeFormatError
    from ..weights.store import WeightStoreError

    return (ConfigError, UserError, EngineError, MazeFormatError, TaskError, ScheduleError, WeightStoreError, ProfileError,
            WorkloadError, FileNotFoundError, TrainerFailed, ActorsExhausted, TooManyRejected)


# When output goes to a file or a pipe (a job log, CI), lines are never wrapped: a log is read
# with grep and by other programs, and Rich's default of 80 columns breaks paths mid-word.
# Tables get this width to lay out in.
LOG_WIDTH = 200


def make_console(file=None):
    """The commands' Rich console: as Rich makes it on a terminal; elsewhere plain lines,
    unwrapped, no colour codes."""
    from rich.console import Console

    console = Console(file=file)
    if console.is_terminal:
        return console
    return Console(file=file, soft_wrap=True, width=LOG_WIDTH, no_color=True, highlight=False)


# Errors of the file system a run writes to, and what to do about each.
_DISK_ADVICE = {
    "EACCES": "choose a directory you may write (run_dir=DIR), or fix its permissions",
    "EPERM": "choose a directory you may write (run_dir=DIR), or fix its permissions",
    "EROFS": "the file system is read-only: choose another run_dir=DIR",
    "ENOSPC": "the disk is full: free space there or choose run_dir=DIR on another disk (a run with "
              "save_every continues with asp-train resume=RUN_DIR from its last checkpoint)",
    "EDQUOT": "the disk quota is used up: free space or choose run_dir=DIR elsewhere",
    "EISDIR": "a directory is where a file must be: remove it or choose another path",
    "ENOTDIR": "a file is where a directory must be: remove it or choose another path",
}


def _is_disk_error(error: OSError) -> bool:
    import errno

    return errno.errorcode.get(error.errno or 0, "") in _DISK_ADVICE


def disk_error_line(error: OSError) -> str:
    """One line for a file-system error: the path, what happened, what to do."""
    import errno

    code = errno.errorcode.get(error.errno or 0, "")
    where = f"{error.filename}: " if error.filename else ""
    return f"{where}{error.strerror or error} ({code}); {_DISK_ADVICE[code]}"


def usage(prog: str, summary: str) -> str:
    from ..config.load import list_group_options

    lines = [f"usage: {prog} [key=value ...] [group=option ...] [--cfg]", "", summary, "", "config groups:"]
    lines += [f"  {g:<11}{', '.join(list_group_options(g))}" for g in GROUPS]
    lines += ["", "examples: seed=3  task.num_prompts=32  layout=ascend910b3_t4g4  run_dir=runs/mine"]
    return "\n".join(lines)


def run_command(prog: str, summary: str, body: Callable, argv: Sequence[str] | None = None,
                training: bool = True, local_install: bool = True) -> int:
    """Parse ``argv`` (overrides), compose the config and call ``body(cfg)``.
    ``training=False``: the command does not train, so training-only checks are skipped.
    ``local_install=False``: the command runs nothing here (a simulator), so what is
    installed on this machine is not checked."""
    from omegaconf import OmegaConf

    from ..config.load import load_config

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(usage(prog, summary))
        return 0
    print_cfg = "--cfg" in argv
    overrides = [a for a in argv if a != "--cfg"]
    try:
        bad = [a for a in overrides if "=" not in a]
        if bad:
            raise UserError(f"argument {bad[0]!r} is not an override; write key=value (see {prog} --help)")
        cfg = load_config(overrides, training=training, local_install=local_install)
        if print_cfg:
            print(OmegaConf.to_yaml(cfg, resolve=True))
            return 0
        return int(body(cfg) or 0)
    except expected_errors() as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:   # a file-system error is one line; any other keeps its traceback
        if not _is_disk_error(error):
            raise
        print(f"{prog}: error: {disk_error_line(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
