"""asp-train's checks before any actor starts (the full runs are in test_runtime_e2e.py)."""
import pytest

from mindspeed_rl_asp.cli.train import main
from mindspeed_rl_asp.config.load import list_group_options


def test_dry_run_prints_placement_and_plan(capsys):
    assert main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "generation actor 1: node 2" in out and "plan: asp" in out


@pytest.mark.parametrize("experiment", list_group_options("experiment"))
def test_every_shipped_experiment_dry_runs(experiment, capsys):
    # The dry run composes, validates, places, plans and builds the control core, and
    # starts no actor, engine or checkpoint: so the paper presets (engine=mindspeed, whose
    # stack and weights this machine lacks) are checked here as they ship.
    code = main([f"experiment={experiment}", "--dry-run"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "plan: " in captured.out and captured.err == ""


def test_a_plan_the_control_rules_cannot_run_is_refused(capsys):
    # A queue that holds one step admits no minibatch across a step boundary; asp's
    # floating sizes cross them, and the error says what to change.
    assert main(["mode.queue_capacity=32", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "mode=async, scheduler=asp" in err and "queue_capacity" in err and "Traceback" not in err


def test_hybrid_plans_step_by_step(capsys):
    # max_staleness=0: planned per step, so asp and a prompt count that is no multiple of
    # the step both run.
    assert main(["mode=hybrid", "task.num_prompts=62", "--dry-run"]) == 0
    assert "plan: asp per step" in capsys.readouterr().out


def test_a_step_larger_than_the_prompt_set_is_refused(capsys):
    assert main(["task.num_prompts=6", "--dry-run"]) == 2
    assert "raise task.num_prompts or lower rl.global_batch_size" in capsys.readouterr().err


def test_held_out_table_and_verdict():
    from rich.console import Console

    from mindspeed_rl_asp.cli.train import print_comparison

    def rates(c3, c4):
        return {"integrity_rate": 1.0, "correctness_rate": (c3 + c4) / 2,
                "by_size": {3: {"correctness_rate": c3}, 4: {"correctness_rate": c4}}}

    change = {"correctness": {"before": 0.5, "after": 0.6, "change": 0.1, "ci95": [0.02, 0.18], "improved": 9,
                              "worsened": 2, "prompts": 20},
              "integrity": {"before": 1.0, "after": 1.0, "change": 0.0, "ci95": [0.0, 0.0], "improved": 0,
                            "worsened": 0}}
    console = Console(record=True, width=200)
    print_comparison(console, "held-out mazes", {"initial": rates(0.9, 0.1), "final": rates(0.9, 0.3),
                                                 "change": change}, samples_per_prompt=2)
    text = console.export_text()
    assert "held-out mazes: 20 prompts x 2 samples" in text
    assert "3x3" in text and "4x4" in text and "0.30" in text
    assert "correctness: 0.500 -> 0.600, change +0.100 (95% CI +0.020 .. +0.180; 9 prompts up, 2 down): up" in text
    assert "integrity: 1.000 -> 1.000" in text and "no significant change" in text
