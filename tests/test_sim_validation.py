"""The validation table (configs/validation/cases.yaml): every row has a source, bad rows
are one clear error, and `asp-simulate experiment=validation` prints simulated vs measured
with the error and, for a miss, the assumption that explains it."""
import dataclasses
import json

import pytest
import yaml

from mindspeed_rl_asp.cli.simulate import main as simulate_main
from mindspeed_rl_asp.config.load import config_dir
from mindspeed_rl_asp.sim.profiles import ProfileError
from mindspeed_rl_asp.sim.studies import load_cases, simulate_case

CASES = config_dir() / "validation" / "cases.yaml"


def shipped():
    return yaml.safe_load(CASES.read_text())


def test_the_shipped_cases_load_with_a_source_each_and_both_kinds_and_scopes():
    cases = load_cases(shipped())
    assert all(c.source for c in cases)
    assert {c.kind for c in cases} == {"calibration", "validation"}
    assert {c.scope for c in cases if c.kind == "validation"} == {"micro", "end_to_end"}


def test_a_row_without_a_source_is_one_clear_error():
    raw = shipped()
    raw["cases"][0]["source"] = ""
    raw["cases"][1]["measured"] = -1
    with pytest.raises(ProfileError) as info:
        load_cases(raw)
    message = str(info.value)
    assert "cases[0] (ascend_eager_block).source is missing: every measurement needs its source" in message
    assert "cases[1] (vllm_qwen3_30b_eager_4090d).measured=-1 must be a number > 0" in message


def test_a_micro_case_is_the_cost_model_of_its_profiles():
    case = next(c for c in load_cases(shipped()) if c.id == "ascend_eager_block")
    # Qwen3-30B-A3B on 2 x 910B3 at TP 2, eager: 48 x (9 + 9 + 2) + 15 = 975 launches at
    # 41.6 us, host bound; 4 ms fixed and 14 us for the one sequence.
    assert simulate_case(case) == pytest.approx(0.004 + 14e-6 + max(975 * 41.6e-6, 0.0), rel=1e-6)


def test_the_command_prints_every_case_with_its_error_and_names_the_assumption_of_a_miss(tmp_path, capsys):
    raw = shipped()
    raw["cases"] = [c for c in raw["cases"] if c["scope"] == "micro"]
    path = tmp_path / "cases.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert simulate_main(["experiment=validation", f"run_dir={tmp_path / 'r'}", f"sim.validation_file={path}"]) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "r" / "validation.json").read_text())["rows"]
    assert [r["id"] for r in rows] == [c["id"] for c in raw["cases"]]
    for r in rows:
        assert r["error"] == pytest.approx(r["simulated"] / r["measured"] - 1)
        assert f"| {r['id']} |" in out
    # Exactly the missed cases are listed with the assumption behind each miss.
    missed = [r for r in rows if not r["within"]]
    assert [r["id"] for r in rows if f"- {r['id']} (" in out] == [r["id"] for r in missed]
    assert [r["id"] for r in missed if r["assumption"] not in out] == []


def test_a_bare_loop_case_prices_the_step_without_the_serving_engines_host_work():
    case = next(c for c in load_cases(shipped()) if c.id == "h100_llama8b_graph")
    assert case.host == "bare"
    serving = dataclasses.replace(case, host="serving")
    # engine=vllm: 2 ms of fixed host work and 14 us for the one running sequence.
    assert simulate_case(serving) - simulate_case(case) == pytest.approx(0.002 + 14e-6)


def test_an_unknown_host_is_one_clear_error():
    raw = shipped()
    raw["cases"][0]["host"] = "laptop"
    with pytest.raises(ProfileError, match=r"cases\[0\] \(ascend_eager_block\)\.host='laptop' is not one of serving, bare"):
        load_cases(raw)
