"""Checkpoint files and resume rules without Ray: atomic writes, the newest complete
checkpoint, the dispatch list left to run, and the resume config checks."""
import json

import pytest
from hypothesis import given, settings, strategies as st

from mindspeed_rl_asp.config.validate import ConfigError
from mindspeed_rl_asp.runtime.checkpoint import (CONTROL, LATEST, POLICY, TRAINER_STATE, ControlState,
                                                 checkpoints_dir, commit_checkpoint, find_resume_point,
                                                 latest_checkpoint, merge_histograms, missing_parts,
                                                 remaining_minibatches, set_aside_metrics_after, write_checkpoint)


def state(version, consumed=(), minibatches=(("mb0", ["a", "b"]),)):
    return ControlState(version, list(consumed), [(m, list(ids)) for m, ids in minibatches], epochs=1,
                        total_steps=8, age_histogram={"0": 2}, wall_time_s=1.5)


def write_trainer_files(path):
    (path / POLICY).mkdir()
    (path / POLICY / "config.json").write_text("{}")
    (path / POLICY / "model.safetensors").write_bytes(b"weights")
    (path / TRAINER_STATE).write_bytes(b"state")


def test_write_commits_and_points_latest(tmp_path):
    path = write_checkpoint(tmp_path, state(2), write_trainer_files, keep=2)
    assert path.name == "step_000002" and not missing_parts(path)
    assert (checkpoints_dir(tmp_path) / LATEST).read_text().strip() == "step_000002"
    assert ControlState.from_json((path / CONTROL).read_text()) == state(2)
    assert latest_checkpoint(tmp_path) == path


def test_interrupt_mid_write_keeps_the_previous_checkpoint(tmp_path):
    first = write_checkpoint(tmp_path, state(2), write_trainer_files, keep=2)

    def interrupted(path):
        (path / POLICY).mkdir()
        (path / POLICY / "config.json").write_text("{}")
        raise KeyboardInterrupt   # Ctrl-C while the weights are being written

    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path, state(4), interrupted, keep=2, attempt=1)
    assert latest_checkpoint(tmp_path) == first
    assert find_resume_point(tmp_path_with_config(tmp_path)).version == 2
    leftovers = [p.name for p in checkpoints_dir(tmp_path).iterdir()]
    assert "step_000004" not in leftovers and any(".partial-" in n for n in leftovers)


def tmp_path_with_config(run_dir):
    (run_dir / "config.yaml").write_text("seed: 0\n")
    return run_dir


def test_latest_falls_back_to_the_newest_complete(tmp_path):
    write_checkpoint(tmp_path, state(2), write_trainer_files, keep=3)
    newer = write_checkpoint(tmp_path, state(4), write_trainer_files, keep=3)
    (newer / TRAINER_STATE).unlink()   # damaged after the fact
    assert latest_checkpoint(tmp_path).name == "step_000002"


def test_keep_prunes_older_checkpoints(tmp_path):
    for v in (1, 2, 3, 4):
        write_checkpoint(tmp_path, state(v), write_trainer_files, keep=2)
    assert sorted(p.name for p in checkpoints_dir(tmp_path).glob("step_*")) == ["step_000003", "step_000004"]


def test_commit_refuses_an_incomplete_directory(tmp_path):
    partial = tmp_path / "step_000001.partial-1-0"
    partial.mkdir()
    with pytest.raises(RuntimeError, match="incomplete"):
        commit_checkpoint(partial, 1, keep=1)


def test_resume_point_errors_name_what_is_missing(tmp_path):
    with pytest.raises(ConfigError, match="no config.yaml"):
        find_resume_point(tmp_path)
    tmp_path_with_config(tmp_path)
    with pytest.raises(ConfigError, match="save_every"):
        find_resume_point(tmp_path)
    path = write_checkpoint(tmp_path, state(2), write_trainer_files, keep=1)
    for f in (path / POLICY).glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ConfigError, match=r"policy/model\.safetensors missing"):   # named by the manifest
        find_resume_point(tmp_path)


ids = st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=30, unique=True)


@settings(max_examples=200, deadline=None)
@given(ids, st.integers(1, 6), st.data())
def test_remaining_minibatches_partition_the_untrained_prompts(prompts, size, data):
    minibatches = [(f"mb{i}", prompts[i:i + size]) for i in range(0, len(prompts), size)]
    consumed = data.draw(st.lists(st.sampled_from(prompts), unique=True))
    left = remaining_minibatches(minibatches, consumed)
    flat = [p for _, mb in left for p in mb]
    assert flat == [p for p in prompts if p not in set(consumed)]   # same order, none twice, none lost
    assert all(mb for _, mb in left)
    assert len({m for m, _ in left}) == len(left)


def test_histograms_add_up():
    assert merge_histograms({"0": 2, "1": 1}, {0: 3, 2: 1}) == {"0": 5, "1": 1, "2": 1}


def test_metrics_after_the_checkpoint_are_set_aside(tmp_path):
    rows = [{"step": s, "x": s} for s in range(5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert set_aside_metrics_after(tmp_path, 3) == 2
    kept = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    moved = [json.loads(x)["step"] for x in (tmp_path / "metrics.discarded.jsonl").read_text().splitlines()]
    assert kept == [0, 1, 2] and moved == [3, 4]


# ---------------------------------------------------------------------- resume config
@pytest.fixture
def saved_run(tmp_path):
    from mindspeed_rl_asp.config.load import load_config, make_run_dir

    cfg = load_config(["steps=4", "rl.global_batch_size=4", "rl.mini_batch_size=4", f"run_dir={tmp_path / 'run'}", "save_every=2"])
    return make_run_dir(cfg, "test")


def test_resume_config_keeps_the_saved_values(saved_run):
    from mindspeed_rl_asp.config.resume import resume_config

    cfg = resume_config(str(saved_run), ["resume=" + str(saved_run), "engine.num_threads=2", "save_every=1"])
    assert cfg.rl.global_batch_size == 4 and cfg.steps == 4
    assert cfg.engine.num_threads == 2 and cfg.save_every == 1 and cfg.resume == str(saved_run)


@pytest.mark.parametrize("override, key", [("rl.global_batch_size=8", "rl.global_batch_size"),
                                           ("model.path=elsewhere", "model.path"),
                                           ("steps=10", "steps")])
def test_resume_refuses_a_contradicting_key(saved_run, override, key):
    from mindspeed_rl_asp.config.resume import resume_config

    before = sorted(p.name for p in saved_run.iterdir())
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        resume_config(str(saved_run), [override])
    assert sorted(p.name for p in saved_run.iterdir()) == before


def test_resume_refuses_group_overrides_and_another_run_dir(saved_run, tmp_path):
    from mindspeed_rl_asp.config.resume import resume_config

    with pytest.raises(ConfigError, match="config group 'engine=vllm'"):
        resume_config(str(saved_run), ["engine=vllm"])
    with pytest.raises(ConfigError, match="run_dir="):
        resume_config(str(saved_run), [f"run_dir={tmp_path / 'other'}"])
    with pytest.raises(ConfigError, match="unknown config key 'rl.global_batch'"):
        resume_config(str(saved_run), ["rl.global_batch=3"])


def test_asp_train_resume_without_a_checkpoint_writes_nothing(saved_run, capsys):
    from mindspeed_rl_asp.cli.train import main

    before = {p.name: p.stat().st_mtime_ns for p in saved_run.iterdir()}
    assert main([f"resume={saved_run}"]) == 2
    assert "nothing to resume from" in capsys.readouterr().err
    assert main([f"resume={saved_run}", "rl.n_samples_per_prompt=8"]) == 2
    assert "rl.n_samples_per_prompt: saved 4, given 8" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in saved_run.iterdir()} == before


def test_resume_of_a_finished_run_writes_nothing(saved_run, capsys):
    """Refused before the segment's config.resume-*.yaml (or anything else) is written."""
    from mindspeed_rl_asp.cli.train import main

    write_checkpoint(saved_run, state(4), write_trainer_files, keep=2)   # all steps=4 trained
    before = sorted(str(p.relative_to(saved_run)) for p in saved_run.rglob("*"))
    assert main([f"resume={saved_run}"]) == 2
    assert "already trained all steps=4" in capsys.readouterr().err
    assert sorted(str(p.relative_to(saved_run)) for p in saved_run.rglob("*")) == before


@pytest.mark.parametrize("damaged", ["policy/model.safetensors", TRAINER_STATE, CONTROL, "policy/config.json"])
@pytest.mark.parametrize("how", ["truncated", "changed", "deleted"])
def test_resume_falls_back_past_a_damaged_checkpoint(tmp_path, damaged, how):
    """Each kind of file, truncated / changed in place / deleted after the commit: the resume
    takes the newest intact checkpoint and says which it skipped and why."""
    from mindspeed_rl_asp.runtime.checkpoint import MANIFEST, damage

    older = write_checkpoint(tmp_path, state(2), write_trainer_files, keep=3)
    newer = write_checkpoint(tmp_path, state(4), write_trainer_files, keep=3)
    assert (newer / MANIFEST).is_file() and damage(newer) == []
    target = newer / damaged
    data = target.read_bytes()
    if how == "truncated":
        target.write_bytes(data[: len(data) // 2])
    elif how == "changed":
        target.write_bytes(bytes([data[0] ^ 1]) + data[1:])   # same size, other bytes
    else:
        target.unlink()
    point = find_resume_point(tmp_path_with_config(tmp_path))
    assert point.path == older and point.version == 2
    assert len(point.skipped) == 1 and point.skipped[0].startswith("step_000004: ") and damaged in point.skipped[0]


def test_no_intact_checkpoint_is_one_error_naming_why(tmp_path):
    only = write_checkpoint(tmp_path, state(2), write_trainer_files, keep=3)
    (only / TRAINER_STATE).write_bytes(b"st")
    with pytest.raises(ConfigError, match="no checkpoint is intact .*trainer_state.pt has 2 bytes, the manifest says 5"):
        find_resume_point(tmp_path_with_config(tmp_path))


def test_a_checkpoint_without_a_manifest_is_checked_for_its_parts(tmp_path):
    """Written before manifests existed: resumable when its parts are there."""
    from mindspeed_rl_asp.runtime.checkpoint import MANIFEST

    path = write_checkpoint(tmp_path, state(2), write_trainer_files, keep=3)
    (path / MANIFEST).unlink()
    assert find_resume_point(tmp_path_with_config(tmp_path)).path == path


def test_faults_and_failures_survive_a_resume(tmp_path):
    """The control state carries the run's faults and generation failures: a resumed
    segment adds its own to the saved ones instead of starting from zero."""
    from types import SimpleNamespace

    from mindspeed_rl_asp.control.core import Checkpoint
    from mindspeed_rl_asp.runtime.checkpoint import CheckpointWriter

    died = {"t": 1.0, "actor": 0, "kind": "died"}
    prior = ControlState(4, ["a"], [("mb0", ["a", "b"])], epochs=1, total_steps=8, generation_failures=1,
                         faults=[died])
    segment = SimpleNamespace(failures=2, faults=[{"t": 0.5, "actor": 1, "kind": "load_failed"}])
    # The core resumed at 4 and trained two more steps: it checkpoints version 6.
    saved = CheckpointWriter(tmp_path, 2, prior, 0.0, write_trainer_files, faults=segment).state(
        Checkpoint(6, consumed=("b",)), 3.0)
    assert saved.version == 6 and saved.consumed == ["a", "b"] and saved.generation_failures == 3
    assert saved.faults == [died, segment.faults[0]]
    assert ControlState.from_json(saved.to_json()) == saved   # and through control.json
    older = json.loads(saved.to_json())
    del older["faults"]   # a control.json from before faults were saved
    assert ControlState.from_json(json.dumps(older)).faults == []


def test_rollouts_after_the_checkpoint_are_set_aside_too(tmp_path):
    rows = [{"step": s, "prompt_id": f"p{s}", "response": "x"} for s in (0, 1, 1, 2)]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert set_aside_metrics_after(tmp_path, 1) == 0   # no metrics.jsonl: none of those moved
    kept = [json.loads(x)["step"] for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    moved = [json.loads(x)["step"] for x in (tmp_path / "rollouts.discarded.jsonl").read_text().splitlines()]
    assert kept == [0] and moved == [1, 1, 2]


def test_rollout_records_say_what_the_model_wrote():
    from mindspeed_rl_asp.runtime.training_unit import rollout_records

    rows = [("p0", [1], [5, 6], [-0.1, -0.2], 3), ("p0", [1], [7], [-0.3], 3), ("p1", [2], [8, 9, 9], [0, 0, 0], 2)]
    scores = [{"reward": r, "components": {"correctness": r}} for r in (1.0, 0.0, 0.5)]
    decode = lambda ids: " ".join(map(str, ids))   # noqa: E731
    every = rollout_records(rows, scores, [0.7, -0.7, 0.0], decode, -1)
    assert [(r["prompt_id"], r["sample"], r["response"], r["length"], r["version"]) for r in every] == [
        ("p0", 0, "5 6", 2, 3), ("p0", 1, "7", 1, 3), ("p1", 0, "8 9 9", 3, 2)]
    assert every[0]["reward"] == 1.0 and every[0]["components"] == {"correctness": 1.0} and every[1]["advantage"] == -0.7
    assert [r["prompt_id"] for r in rollout_records(rows, scores, [0, 0, 0], decode, 2)] == ["p0", "p0"]
    assert rollout_records(rows, scores, [0, 0, 0], decode, 0) == []


@pytest.mark.parametrize("value, per_step", [(True, -1), (False, 0), (5, 5), (0, 0)])
def test_record_rollouts_values(value, per_step):
    from mindspeed_rl_asp.config.validate import rollouts_per_step

    assert rollouts_per_step(value) == per_step


@pytest.mark.parametrize("bad", [-1, "all", 2.5])
def test_record_rollouts_refuses_other_values(bad):
    from mindspeed_rl_asp.config.validate import rollouts_per_step

    with pytest.raises(ConfigError, match="record.rollouts="):
        rollouts_per_step(bad)


def test_a_resume_refused_for_a_changed_task_writes_nothing(saved_run, capsys):
    """The checkpoint's dispatch list names prompts the task no longer has: one error line,
    and no config.resume-*.yaml, swept partials or moved rows (a refused resume writes nothing)."""
    from mindspeed_rl_asp.cli.train import main

    write_checkpoint(saved_run, state(2, minibatches=(("mb0", ["gone-0", "gone-1"]),)), write_trainer_files, keep=2)
    (saved_run / "metrics.jsonl").write_text(json.dumps({"step": 3}) + "\n")   # a row a resume would set aside
    before = {str(p.relative_to(saved_run)): p.stat().st_mtime_ns for p in saved_run.rglob("*")}
    assert main([f"resume={saved_run}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'gone-0'" in err[0] and "task's data changed" in err[0]
    assert {str(p.relative_to(saved_run)): p.stat().st_mtime_ns for p in saved_run.rglob("*")} == before


def test_spans_after_the_checkpoint_are_set_aside(tmp_path):
    from mindspeed_rl_asp.runtime.checkpoint import set_aside_spans_after

    spans = [{"lane": "train", "kind": "train", "start": s, "end": s + 1.0, "label": "", "info": {"segment": 0}}
             for s in (0.0, 2.0, 4.0, 6.0)]
    (tmp_path / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in spans))
    assert set_aside_spans_after(tmp_path, 0.0) == 0   # a checkpoint from before saved_at: nothing moves
    assert set_aside_spans_after(tmp_path, 4.5) == 2   # ends at 5 and 7: after the checkpoint
    kept = [json.loads(x)["end"] for x in (tmp_path / "timeline.jsonl").read_text().splitlines()]
    moved = [json.loads(x)["end"] for x in (tmp_path / "timeline.discarded.jsonl").read_text().splitlines()]
    assert kept == [1.0, 3.0] and moved == [5.0, 7.0]


def test_checkpoints_carry_their_time_and_spans_their_segment(tmp_path):
    """The control state says when it was saved (the cluster's clock), and each span a
    resumed segment writes says which segment (the version it started from)."""
    from types import SimpleNamespace

    from mindspeed_rl_asp.control.core import Checkpoint
    from mindspeed_rl_asp.metrics.recorder import RunRecorder
    from mindspeed_rl_asp.runtime.checkpoint import CheckpointWriter

    saved = CheckpointWriter(tmp_path, 2, state(4), 10.0, write_trainer_files).state(
        Checkpoint(5, consumed=("b",), ages=((0, 1),)), 17.5)
    assert saved.saved_at == 17.5 and ControlState.from_json(saved.to_json()).saved_at == 17.5
    recorder = RunRecorder(tmp_path, 1, 1, tensorboard=False, segment=4)
    recorder.failure(SimpleNamespace(actor=0, minibatch_id="m0"), 1.0, 2.0, "boom")
    recorder.actor_back(0, True, 3.0, 5)
    recorder.close()
    rows = [json.loads(x) for x in (tmp_path / "timeline.jsonl").read_text().splitlines()]
    assert [r["info"]["segment"] for r in rows] == [4, 4]
