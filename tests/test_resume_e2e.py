"""Crash and resume for real: a driver process killed with SIGKILL between checkpoints
resumes and trains every prompt exactly once per epoch; SIGTERM stops a run like Ctrl-C,
with a summary marked interrupted and a checkpoint to resume from.

The driver runs as a child process joined to this test session's Ray cluster
(RAY_ADDRESS), so Ray removes its actors when it dies; the test kills only that child,
by its pid."""
import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mindspeed_rl_asp.tasks import base_prompt_id, prompt_epoch

pytestmark = pytest.mark.slow

SMALL = ["task.num_prompts=16", "rl.global_batch_size=4", "rl.mini_batch_size=2", "rl.n_samples_per_prompt=2",
         "rl.micro_batch_size=4", "generate.sampling_config.max_tokens=96", "scheduler.base_batch_size=2",
         "scheduler.group_size=2", "mode.queue_capacity=32", "eval.num_prompts=0", "save_every=2"]

# For the SIGTERM runs: one generation actor is all their checks need, and each actor's
# process start-up is most of a short run's time (the SIGKILL run keeps two, so that
# minibatches finish out of order across the kill).
ONE_ACTOR = ("layout.nodes=2", "layout.gen_nodes=1")


def start_driver(ray_cluster, run_dir, *overrides):
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address}
    return subprocess.Popen([sys.executable, "-m", "mindspeed_rl_asp.cli.train", *SMALL, f"run_dir={run_dir}",
                             *overrides], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, proc, timeout=600):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the driver ended (rc {proc.returncode}) before the test's moment:\n{out[-2000:]}\n{err[-2000:]}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail("timed out waiting for the driver")


def latest_version(run_dir):
    pointer = run_dir / "checkpoints" / "latest"
    return int(pointer.read_text().strip().split("_")[1]) if pointer.is_file() else 0


def assert_each_epoch_trained_once(consumed, prompts, epochs):
    by_epoch = collections.defaultdict(list)
    for pid in consumed:
        by_epoch[prompt_epoch(pid)].append(base_prompt_id(pid))
    assert sorted(by_epoch) == list(range(epochs))
    for epoch, ids in by_epoch.items():
        assert sorted(ids) == sorted(prompts), f"epoch {epoch}: {collections.Counter(ids)}"


def test_sigkill_between_checkpoints_then_resume(ray_cluster, tmp_path):
    from mindspeed_rl_asp.cli.train import main

    run_dir = tmp_path / "run"
    proc = start_driver(ray_cluster, run_dir, "steps=12")
    # Killed after its first checkpoint and a step beyond it, before the end: the
    # steps after the checkpoint are lost with it and must be trained again.
    wait_for(lambda: latest_version(run_dir) >= 2 and (run_dir / "metrics.jsonl").is_file()
             and len((run_dir / "metrics.jsonl").read_text().splitlines()) > latest_version(run_dir), proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    killed_at = latest_version(run_dir)
    assert 2 <= killed_at < 12 and not (run_dir / "summary.json").exists()

    assert main([f"resume={run_dir}"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["resumed_from"]["version"] >= killed_at
    prompts = sorted({base_prompt_id(p) for p in summary["consumed_prompt_ids"]})
    assert len(prompts) == 16   # task.num_prompts: every prompt, and (below) once in each epoch
    assert_each_epoch_trained_once(summary["consumed_prompt_ids"], prompts, epochs=3)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(12))   # rows the killed run wrote after its checkpoint were set aside
    # So were its spans after the checkpoint: each step trained once in the timeline, and each
    # span marked with its segment (the version it started from).
    spans = [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]
    assert sorted(int(s["label"].split()[1]) for s in spans if s["kind"] == "train") == list(range(12))
    assert {s["info"]["segment"] for s in spans} == {0, summary["resumed_from"]["version"]}
    assert (run_dir / "timeline.discarded.jsonl").is_file()
    saves = [json.loads(line) for line in (run_dir / "checkpoints.jsonl").read_text().splitlines()]
    assert [s["version"] for s in saves] == list(range(2, 13, 2))   # each once: before the kill, then resumed
    assert all(s["bytes"] > 1_000_000 and s["seconds"] > 0 for s in saves)   # the weights are in them
    assert sum(summary["policy_age_histogram"].values()) == 48
    assert max(int(a) for a in summary["policy_age_histogram"]) <= 2   # mode.max_staleness (default)


def test_sigterm_stops_like_ctrl_c_with_a_checkpoint(ray_cluster, tmp_path):
    from mindspeed_rl_asp.cli.train import main

    run_dir = tmp_path / "run"
    proc = start_driver(ray_cluster, run_dir, *ONE_ACTOR, "steps=200", "task.num_prompts=40", "save_every=1000")
    wait_for(lambda: (run_dir / "metrics.jsonl").is_file(), proc)
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "Fatal Python error" not in err
    assert "interrupted (SIGTERM)" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] and summary["signal"] == "SIGTERM"
    # save_every is set: the interrupt writes a checkpoint of the steps trained so far.
    assert summary["checkpoint"] and summary["resume_command"] == f"asp-train resume={run_dir}"
    version = latest_version(run_dir)
    assert version == summary["steps"] >= 1 and len(summary["consumed_prompt_ids"]) == 4 * version
    # Every step counted is recorded, the one that finished inside the interrupt too: its
    # metrics row, its train and publish spans (so a resume finds no partial epoch).
    rows = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows == list(range(version))
    spans = [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]
    assert [s["label"] for s in spans if s["kind"] == "publish"] == [f"v{v}" for v in range(1, version + 1)]
    assert {s["info"]["segment"] for s in spans} == {0}

    # It resumes from there (a few more steps, then Ctrl-C in-process is the other test's job).
    assert main([f"resume={run_dir}", "--dry-run"]) == 0


def test_a_step_finishing_inside_sigterm_is_recorded_and_the_resume_sees_whole_epochs(ray_cluster, tmp_path):
    """SIGTERM lands in the driver while it writes step 1's row (held until the loop waits);
    whatever was training then finishes and is recorded; the resumed run reports every
    epoch whole (8 prompts, 4 steps of 4: two epochs)."""
    from mindspeed_rl_asp.cli.train import main
    from mindspeed_rl_asp.config.load import load_config, make_run_dir
    from mindspeed_rl_asp.runtime.driver import run_training

    cfg = load_config([*SMALL, *ONE_ACTOR, "task.num_prompts=8", "steps=4", "save_every=3",
                       f"run_dir={tmp_path / 'run'}"])
    run_dir = make_run_dir(cfg, "train")

    def sigterm_at_step_1(metrics):
        if metrics["step"] == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    first = run_training(cfg, run_dir, on_step=sigterm_at_step_1)
    assert first["interrupted"] and first["signal"] == "SIGTERM" and 2 <= first["steps"] < 4
    rows = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows == list(range(first["steps"])) and latest_version(run_dir) == first["steps"]

    assert main([f"resume={run_dir}"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]
    by_epoch = summary["on_policy_correctness_by_epoch"]
    assert [e["epoch"] for e in by_epoch] == [0, 1] and all(e["complete"] for e in by_epoch), by_epoch
    assert_each_epoch_trained_once(summary["consumed_prompt_ids"],
                                   sorted({base_prompt_id(p) for p in summary["consumed_prompt_ids"]}), epochs=2)
