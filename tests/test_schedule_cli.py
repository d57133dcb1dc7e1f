"""asp-schedule: the override names scripts rely on, the plan JSON shape, clear errors."""
import json

import pytest

from mindspeed_rl_asp.cli.schedule import main


def _items(path, n=40):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "predicted_length": 10 + (i * 37) % 300}) + "\n")


@pytest.mark.parametrize("planner", ["asp", "fifo", "sorted"])
def test_plan_from_jsonl(tmp_path, planner, capsys):
    _items(tmp_path / "in.jsonl")
    out = tmp_path / "plan.json"
    slack = 2 if planner == "asp" else 0
    rc = main([f"input={tmp_path / 'in.jsonl'}", f"output={out}", f"scheduler={planner}",
               "scheduler.base_batch_size=6", f"scheduler.slack={slack}", "scheduler.group_size=3"])
    assert rc == 0
    plan = json.loads(out.read_text())
    ids = [i for group in plan["groups"] for mb in group for i in mb["ids"]]
    assert sorted(ids) == sorted(f"p{i}" for i in range(40))
    assert all(len(g) <= 3 for g in plan["groups"])
    assert plan["planner"] == planner
    assert "padding bubble" in capsys.readouterr().out


def test_plan_from_task_prompts(tmp_path):
    out = tmp_path / "plan.json"
    assert main([f"output={out}", "task.num_prompts=32"]) == 0
    assert len([i for g in json.loads(out.read_text())["groups"] for mb in g for i in mb["ids"]]) == 32


@pytest.mark.parametrize(
    "argv,message",
    [
        (["input=missing.jsonl"], "no such file"),
        (["scheduler.predictor=ridge"], "needs lengths observed from a policy"),
        (["scheduler.slack=7"], "scheduler.slack=7"),
    ],
)
def test_errors(tmp_path, capsys, argv, message):
    assert main(argv + [f"output={tmp_path / 'p.json'}"]) == 2
    assert message in capsys.readouterr().err


def test_bad_lengths_name_the_id(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "predicted_length": 3}\n{"id": "b", "predicted_length": -1}\n')
    assert main([f"input={tmp_path / 'bad.jsonl'}", f"output={tmp_path / 'p.json'}"]) == 2
    err = capsys.readouterr().err
    assert "'b'" in err or '"b"' in err or " b" in err
