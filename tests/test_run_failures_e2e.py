"""How a real run ends when it cannot go on: one line for the user, naming what failed and
what to do (the resume command when a checkpoint exists), and summary.json marked failed
with the reason; the disk filling up at a checkpoint is one of those paths."""
import errno
import json
import os
import signal

import pytest

from mindspeed_rl_asp.config.load import load_config, make_run_dir
from mindspeed_rl_asp.control.loop import TrainerFailed
from mindspeed_rl_asp.runtime.driver import run_training

pytestmark = pytest.mark.slow

SMALL = ["task.num_prompts=8", "steps=4", "rl.global_batch_size=2", "rl.mini_batch_size=2",
         "rl.n_samples_per_prompt=2", "rl.micro_batch_size=4", "generate.sampling_config.max_tokens=48",
         "scheduler.base_batch_size=2", "scheduler.group_size=2", "mode.queue_capacity=32", "eval.num_prompts=0",
         # One generation actor: no check here needs two, and each actor's start-up is most of a run's time.
         "layout.nodes=2", "layout.gen_nodes=1"]


def trainer_pids(ray):
    from ray._private import state

    return [a["Pid"] for a in state.actors().values()
            if a["ActorClassName"] == "TrainingWorker" and a["State"] == "ALIVE"]


def test_a_killed_trainer_is_one_line_with_the_resume_command(ray_cluster, tmp_path, capfd):
    """The trainer's process is killed after version 3 is published (no checkpoint is due
    then; step_000002 exists): the next step fails (trainer ranks are not restarted: their
    optimizer state would be lost), and the error is one line naming the trainer, with the
    resume command; Ray's own actor-death text reaches no terminal."""
    cfg = load_config([*SMALL, "save_every=2", f"run_dir={tmp_path / 'run'}"])
    run_dir = make_run_dir(cfg, "test")
    killed = []

    def kill_trainer_after_version_3(metrics):
        if metrics["step"] == 2 and not killed:
            (pid,) = trainer_pids(ray_cluster)
            assert pid != os.getpid()
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    with pytest.raises(TrainerFailed) as raised:
        run_training(cfg, run_dir, on_step=kill_trainer_after_version_3)
    message = str(raised.value)
    assert killed and len(message.splitlines()) == 1, message
    assert message.startswith("training step 3 failed: ") and f"(actor TrainingWorker, pid {killed[0]})" in message
    assert message.endswith(f"; resume with `asp-train resume={run_dir}` (from step_000002)")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed"] and summary["steps"] == 3 and "failed" in summary["error"]
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert summary["resume_command"] == f"asp-train resume={run_dir}"
    assert summary["checkpoint"].endswith("step_000002")
    assert "died" in summary["error_detail"].lower()   # Ray's full text is kept here, not printed
    err = capfd.readouterr().err
    assert "class_name" not in err and "actor_id" not in err, err[-3000:]


def test_a_full_disk_at_a_checkpoint_marks_the_summary_failed(ray_cluster, tmp_path, capsys, monkeypatch):
    """ENOSPC while the checkpoint of version 2 is written: one error line naming the path
    and the fix, and summary.json (which still fits) says failed and why."""
    from mindspeed_rl_asp.cli.train import main
    from mindspeed_rl_asp.runtime import checkpoint

    def disk_full(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path / checkpoint.MANIFEST))

    monkeypatch.setattr(checkpoint, "write_manifest", disk_full)
    run_dir = tmp_path / "run"
    assert main([*SMALL, "save_every=2", f"run_dir={run_dir}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ENOSPC" in err[0] and "disk is full" in err[0] and "manifest.json" in err[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed"] and summary["error_type"] == "OSError" and "No space left" in summary["error"]
    assert summary["steps"] == 2 and summary["checkpoint"] is None
    assert not (run_dir / "checkpoints" / "latest").exists()   # nothing half-written was committed


def test_a_failed_final_check_marks_the_summary_failed_and_keeps_the_training(ray_cluster, tmp_path, capsys,
                                                                              monkeypatch):
    """The training ended; the initial-vs-final check then fails (the disk fills up): one error
    line, summary.json says failed at that stage and why, and the trained policy is there."""
    from mindspeed_rl_asp.cli.train import main
    from mindspeed_rl_asp.runtime import driver

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "eval-cache")

    monkeypatch.setattr(driver, "evaluate_initial_and_final", disk_full)
    run_dir = tmp_path / "run"
    assert main([*SMALL, "steps=2", "eval.num_prompts=2", f"run_dir={run_dir}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ENOSPC" in err[0] and "eval-cache" in err[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed"] and summary["stage"] == "final evaluation" and summary["steps"] == 2
    assert "No space left" in summary["error"] and (run_dir / "final_policy" / "config.json").is_file()
