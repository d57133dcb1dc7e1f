"""asp-train's checks before any actor starts (the full runs are in test_runtime_e2e.py)."""
from mindspeed_rl_asp.cli.train import main


def test_dry_run_prints_placement_and_plan(capsys):
    assert main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "generation actor 1: node 2" in out and "plan: asp" in out


def test_a_plan_the_control_rules_cannot_run_is_refused(capsys):
    # Hybrid (max_staleness=0) needs minibatch boundaries on every step boundary; asp's
    # floating sizes do not give that, and the error says what to change.
    assert main(["mode=hybrid", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "mode=hybrid, scheduler=asp" in err and "max_staleness" in err and "Traceback" not in err


def test_too_few_prompts_for_the_steps(capsys):
    assert main(["steps=100", "task.num_prompts=64", "--dry-run"]) == 2
    assert "raise task.num_prompts or lower steps" in capsys.readouterr().err
