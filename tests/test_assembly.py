"""The one assembly of a run (``schedule/assembly.py``): the core with its re-plan and
checkpoint rules, and the observers both shells share. That the Ray driver and the
simulator call it (and build none of it themselves) is a rule of test_code_rules.py."""
from __future__ import annotations

import json

import pytest

from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.control.loop import Observer
from mindspeed_rl_asp.schedule.assembly import (PlanLengths, assemble_core, assemble_observers, replanned_epochs,
                                                run_plan_lengths)
from mindspeed_rl_asp.schedule.planning import plan_minibatches

REFIT = ["scheduler.predictor=ridge", "scheduler.refit=history", "scheduler.refit_weight=2", "steps=6"]
LENGTHS = {f"p{i}": 10.0 + 5 * i for i in range(16)}


def core_of(overrides, plan=PlanLengths(LENGTHS, "ridge"), **kwargs):
    cfg = load_config(overrides)
    _, minibatches = plan_minibatches(cfg, sorted(LENGTHS.items()), 3)
    return assemble_core(cfg, minibatches, plan, 2, **kwargs)


def test_the_core_gets_the_refit_rule_the_checkpoints_and_its_start():
    core = core_of([*REFIT, "save_every=2"], start_version=2, taken=["p0", "p1@e1"], replanned=[2])
    assert core.epoch_replan is not None and core.epoch_replan.done == {0, 1, 2}
    assert core.config.save_every == 2 and core.trainer_version == 2
    assert core_of(REFIT).epoch_replan.done == frozenset()


@pytest.mark.parametrize("overrides, plan", [
    (["scheduler.refit=none", "steps=6"], PlanLengths(LENGTHS, "reference")),
    (REFIT, PlanLengths({}, "ridge", "no predicted_lengths.jsonl")),
])
def test_no_refit_rule_without_refit_or_without_the_first_plans_lengths(overrides, plan):
    assert core_of(overrides, plan).epoch_replan is None


def test_a_run_directory_gives_its_lengths_and_the_epochs_it_replanned(tmp_path):
    cfg = load_config(REFIT)
    missing = run_plan_lengths(cfg, [], tmp_path)
    assert missing.lengths == {} and "predicted_lengths.jsonl" in missing.missing
    (tmp_path / "predicted_lengths.jsonl").write_text(
        "".join(json.dumps({"id": f"p{i}", "predicted_length": 10.0 + i}) + "\n" for i in range(3)))
    for name in ("plan_e1.json", "plan_e3.json", "plan_ex.json", "plan.json"):
        (tmp_path / name).write_text("{}")
    assert run_plan_lengths(cfg, [], tmp_path) == PlanLengths({"p0": 10.0, "p1": 11.0, "p2": 12.0}, "ridge")
    assert replanned_epochs(tmp_path) == {1, 3}


class Shell(Observer):
    """A shell's own observer, to see where the fan-out puts it."""

    def __init__(self):
        self.seen = []

    def submitted(self, action, t):
        self.seen.append(("submitted", t))


@pytest.mark.parametrize("mode, engine, refit, gen_devices, batching", [
    ("async", "hf", "history", 2, "static"), ("hybrid", "hf", "none", 3, "static"),
    ("async", "vllm", "history", 2, "continuous")])
def test_the_shared_observers_are_built_from_the_config(tmp_path, mode, engine, refit, gen_devices, batching):
    cfg = load_config([*REFIT, f"mode={mode}", f"engine={engine}", f"scheduler.refit={refit}"], local_install=False)
    steps = []
    observers = assemble_observers(cfg, tmp_path, 2, PlanLengths(LENGTHS, "simulated"), 5.0, steps.append,
                                   tensorboard=False, segment=4, elapsed_before=1.5)
    shell = Shell()
    fanout = observers.fanout(shell)
    fanout.submitted(object(), 6.0)
    observers.close()
    recorder, epochs = observers.recorder, observers.epochs
    assert fanout.observers == [recorder, epochs, shell] and shell.seen == [("submitted", 6.0)]
    assert (recorder.gen_devices, recorder.batching, recorder.start, recorder.segment, recorder.elapsed_before,
            recorder.on_step) == (gen_devices, batching, 5.0, 4, 1.5, steps.append)
    assert not (tmp_path / "tensorboard").exists() and (tmp_path / "timeline.jsonl").is_file()
    assert (epochs.prior, epochs.refit, epochs.weight, epochs.start, epochs.batching, epochs.n_samples) == \
        (LENGTHS, refit, 2.0, 5.0, batching, cfg.rl.n_samples_per_prompt)
    assert epochs.describe == {"scheduler": "asp", "predictor": "simulated"}


def test_without_the_first_plans_lengths_the_epoch_report_says_why_and_does_not_refit(tmp_path):
    cfg = load_config(REFIT)
    observers = assemble_observers(cfg, tmp_path, 1, PlanLengths({}, "ridge", "no lengths file"), 0.0,
                                   tensorboard=False)
    observers.close()
    assert observers.epochs.refit == "none"
    assert observers.epochs.describe == {"scheduler": "asp", "predictor": "ridge", "note": "no lengths file"}
