"""Output to a file or pipe (job logs, CI) is plain lines that are never wrapped."""
import io
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_log_console_never_wraps_or_colours():
    from mindspeed_rl_asp.cli.common import make_console

    out = io.StringIO()
    console = make_console(out)
    path = "runs/" + "a-very-long-run-directory-name/" * 8
    console.print(f"[bold]asp-train[/] step 0  run dir {path}")
    assert out.getvalue() == f"asp-train step 0  run dir {path}\n"   # one line, no escape codes


def test_dry_run_lines_are_whole_when_piped():
    run = subprocess.run([sys.executable, "-m", "mindspeed_rl_asp.cli.train", "--dry-run"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    task_line = [line for line in run.stdout.splitlines() if line.startswith("task maze:")]
    assert len(task_line) == 1 and task_line[0].endswith("maze_integrity + maze_correctness"), run.stdout
