"""A run directory that cannot be written is one error line naming the path and what to do."""
import errno
import os

import pytest

from mindspeed_rl_asp.cli.common import disk_error_line, run_command


@pytest.mark.parametrize("code, words", [(errno.EACCES, "run_dir=DIR"), (errno.ENOSPC, "disk is full"),
                                         (errno.EROFS, "read-only")])
def test_each_disk_error_is_one_line_with_the_fix(code, words, capsys):
    def body(cfg):
        raise OSError(code, os.strerror(code), "runs/x/metrics.jsonl")

    assert run_command("asp-train", "t", body, []) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("asp-train: error: runs/x/metrics.jsonl: ")
    assert words in err and errno.errorcode[code] in err


def test_other_os_errors_are_not_hidden():
    def body(cfg):
        raise OSError(errno.ECONNREFUSED, "Connection refused")

    with pytest.raises(OSError):
        run_command("asp-train", "t", body, [])


def test_a_run_dir_that_cannot_be_made_is_refused_in_one_line(tmp_path, capsys):
    """For real, as any user (root included): a file stands where the run directory's
    parent must be."""
    from mindspeed_rl_asp.cli.train import main

    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    assert main([f"run_dir={blocker / 'run'}", "steps=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ENOTDIR" in err and str(blocker) in err


def test_disk_error_line_without_a_path():
    assert disk_error_line(OSError(errno.ENOSPC, "No space left on device")).startswith("No space left on device (ENOSPC)")


def test_too_many_rejected_groups_is_one_line(capsys):
    """Dynamic sampling past algo.max_num_gen_batches stops a run (or a simulation) with the
    core's message, not a traceback."""
    from mindspeed_rl_asp.control.core import TooManyRejected

    def body(cfg):
        raise TooManyRejected("step 0: 9 groups rejected, more than algo.max_num_gen_batches allows")

    assert run_command("asp-simulate", "t", body, []) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "asp-simulate: error: step 0: 9 groups rejected, more than algo.max_num_gen_batches allows"]


def test_an_actors_disk_error_is_unwrapped_from_rays_task_error():
    """A trainer's checkpoint or export write that fails reaches the driver wrapped by Ray;
    the driver hands on the OSError itself, so the command prints its one line."""
    import ray.exceptions

    from mindspeed_rl_asp.runtime.ray_cluster import os_error_of

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "run/checkpoints/step_000002.partial/policy")
    wrapped = ray.exceptions.RayTaskError("save_checkpoint", "Traceback ...\nOSError: ...", full)
    assert os_error_of(wrapped) is full
    other = RuntimeError("not a disk")
    assert os_error_of(other) is other
