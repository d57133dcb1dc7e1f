"""The layout planner (sim/planner.py, asp-plan-layout): its grid, what it skips and why,
its ranking, and that the overrides it prints are a run asp-train accepts."""
import json

import pytest

from mindspeed_rl_asp.cli.plan_layout import main as plan_main
from mindspeed_rl_asp.cli.plan_layout import parse_options, split_overrides
from mindspeed_rl_asp.cli.train import main as train_main
from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.sim import planner
from mindspeed_rl_asp.sim.planner import Candidate, Evaluated

PAPER_30B = ["experiment=table3_qwen3_30b_a3b_asp"]


def test_grid_of_a_small_cluster():
    # 3 nodes x 2 devices: splits T1+G2 and T2+G1, instances of 1 and 2 devices.
    grid = planner.candidate_grid(nodes=3, devices_per_node=2, instance_sizes=[1, 2], global_batch_size=8,
                                  n_samples_per_prompt=4, staleness_bounds=(1, 2), base_sizes=(2, 4))
    assert len(grid) == 2 * 2 * 2 * 2
    assert {(c.train_nodes, c.gen_nodes) for c in grid} == {(1, 2), (2, 1)}
    assert all(c.mode == "async" and c.scheduler == "asp" for c in grid)
    one = next(c for c in grid if (c.train_nodes, c.infer_instance_size, c.max_staleness, c.base_batch_size)
               == (1, 1, 2, 4))
    # 2 G nodes x 2 devices / 1 = 4 instances; one dispatch group is one minibatch each;
    # queue = (8 + 4 x (4 + 2)) x 4 samples, as the table3 presets size it.
    assert (one.num_instances, one.group_size, one.slack, one.queue_capacity) == (4, 4, 2, 128)
    small = next(c for c in grid if (c.train_nodes, c.infer_instance_size, c.base_batch_size) == (2, 2, 2))
    assert (small.num_instances, small.slack, small.queue_capacity) == (1, 1, (8 + 1 * 3) * 4)
    assert one.key_overrides == ("layout.train_nodes=1", "layout.gen_nodes=2", "layout.infer_instance_size=1",
                                 "mode.max_staleness=2", "mode.queue_capacity=128", "scheduler.base_batch_size=4",
                                 "scheduler.slack=2", "scheduler.group_size=4")
    assert one.overrides[:2] == ("mode=async", "scheduler=asp")


def test_base_sizes_slack_and_the_inference_parallelism_that_follows_the_instance():
    assert planner.default_base_sizes(32) == [4, 8, 16]
    assert planner.default_base_sizes(8) == [2, 4]
    assert planner.default_base_sizes(2) == [2]
    assert [planner.slack_for(b) for b in (1, 2, 3, 8)] == [0, 1, 2, 2]
    moe = {"infer_tensor_parallel_size": 1, "infer_expert_parallel_size": 8, "infer_pipeline_parallel_size": 1}
    dense = {"infer_tensor_parallel_size": 8, "infer_expert_parallel_size": 1, "infer_pipeline_parallel_size": 1}
    assert planner.inference_parallel_for(moe, 8, 4) == (("infer_expert_parallel_size", 4),)
    assert planner.inference_parallel_for(dense, 8, 2) == (("infer_tensor_parallel_size", 2),)
    assert planner.inference_parallel_for(dense, 8, 8) == ()


def test_a_cluster_of_one_node_has_no_async_split():
    with pytest.raises(planner.PlannerError, match="layout.nodes=1.*layout.nodes >= 2"):
        planner.candidate_grid(1, 8, [8], 32, 8)


def test_an_instance_too_small_for_the_model_is_skipped_with_the_reason():
    sizes, notes = planner.feasible_instance_sizes(load_config(PAPER_30B))
    # 56.9 GiB of Qwen3-30B-A3B weights do not fit 0.8 x 64 GiB of one 910B3.
    assert sizes == [2, 4, 8]
    assert len(notes) == 1
    assert notes[0].startswith("skipped layout.infer_instance_size=1:") and "infer_instance_size >= 2" in notes[0]


def test_a_candidate_the_validation_refuses_is_skipped_with_the_reason():
    # Qwen3-32B trains with TP 8 x PP 2 = 16 devices: 3 T nodes (24 devices) cannot hold it.
    cfg = load_config(["experiment=table3_qwen3_32b_asp"])
    odd = planner.asp_candidate(8, 8, 3, 8, 2, 8, 32, 8)
    outcome = planner.evaluate({"async": planner.ConfigWorkspace(cfg)}, odd, steps=2)
    assert isinstance(outcome, planner.Skipped)
    assert "does not divide the 24 training devices" in outcome.reason
    assert "skipped 1 candidate(s) (t3g5 i8)" in planner.summarize_skipped([outcome])[0]


def test_a_plan_the_control_core_refuses_is_skipped_with_the_reason():
    # A queue of 8 samples cannot hold a minibatch of 4 prompts x 4 samples: the config
    # validation lets it through, the control core refuses the plan.
    cfg = load_config([])
    cramped = planner.Candidate("async", "asp", 1, 2, 1, 2, 2, 4, 1, 2, 8)
    outcome = planner.evaluate({"async": planner.ConfigWorkspace(cfg)}, cramped, steps=2)
    assert isinstance(outcome, planner.Skipped)
    # The control core's own config check (ControlConfig) refuses it before
    # make_control_core wraps refusals with the mode and scheduler, so only its reason shows.
    assert "queue_capacity=8 samples cannot hold" in outcome.reason


def _row(label_staleness: int, iteration: float, age: float, queue: int = 100, mode: str = "async") -> Evaluated:
    c = Candidate(mode, "asp", 1, 2, 1, 2, label_staleness, 4, 2, 2, queue)
    return Evaluated(c, 10, iteration, 1.0 / iteration, 0.1, 0.2, age, 1.0)


def test_ranking_fastest_first_then_fresher_then_smaller_bound_and_queue():
    rows = [_row(4, 20.0, 3.0), _row(1, 30.0, 0.8), _row(3, 20.0, 2.5), _row(2, 20.0, 2.5),
            _row(2, 20.0, 2.5, queue=50), _row(0, 90.0, 0.0, mode="hybrid")]
    ranked = planner.rank(rows)
    assert [(r.iteration_s, r.policy_age_mean, r.candidate.max_staleness, r.candidate.queue_capacity)
            for r in ranked] == [(20.0, 2.5, 2, 50), (20.0, 2.5, 2, 100), (20.0, 2.5, 3, 100), (20.0, 3.0, 4, 100),
                                 (30.0, 0.8, 1, 100), (90.0, 0.0, 0, 100)]
    assert [r.candidate.mode for r in planner.best_async(ranked, 2)] == ["async", "async"]
    table = planner.format_table(ranked, limit=2).splitlines()
    # header, rule, the two best, and the hybrid reference wherever it ranks
    assert len(table) == 5 and table[-1].lstrip("| ").startswith("6 ") and "hybrid" in table[-1]


def test_the_workspace_gives_each_candidate_its_own_settings():
    cfg = load_config(PAPER_30B)
    workspace = planner.ConfigWorkspace(cfg)
    small = planner.asp_candidate(8, 8, 2, 4, 3, 16, 32, 8, (("infer_expert_parallel_size", 4),))
    whole = planner.asp_candidate(8, 8, 4, 8, 2, 8, 32, 8)
    assert workspace.apply(small.settings).model.infer_expert_parallel_size == 4
    after = workspace.apply(whole.settings)
    assert after.model.infer_expert_parallel_size == 8     # back to the base's value
    assert (after.layout.train_nodes, after.mode.max_staleness, after.scheduler.group_size) == (4, 2, 4)
    assert cfg.layout.infer_instance_size == 8 and cfg.mode.max_staleness == 2   # the base is untouched


@pytest.mark.parametrize("candidate", [
    planner.asp_candidate(8, 8, 2, 4, 4, 16, 32, 8, (("infer_expert_parallel_size", 4),)),
    planner.hybrid_candidate(8, 8, 8, 32, 8),
], ids=["asp", "hybrid"])
def test_printed_overrides_load_and_dry_run(candidate, capsys):
    overrides = [*PAPER_30B, *candidate.overrides]
    cfg = load_config(overrides)
    workspace_cfg = planner.ConfigWorkspace(load_config([*PAPER_30B, *candidate.group_overrides])).apply(
        candidate.settings)
    for key, value in candidate.settings:
        assert cfg[key.split(".")[0]][key.split(".")[1]] == value
        assert workspace_cfg[key.split(".")[0]][key.split(".")[1]] == value
    assert cfg.mode.name == candidate.mode and cfg.scheduler.name == candidate.scheduler
    assert train_main([*overrides, "--dry-run"]) == 0, capsys.readouterr().err
    assert "plan: " in capsys.readouterr().out


def test_options_and_swept_overrides():
    options, rest = parse_options(["steps=6", "--json", "out.json", "--steps=3", "--staleness", "1,2",
                                   "--base-sizes=2,4", "--top", "2", "--rows", "5", "seed=1"])
    assert rest == ["steps=6", "seed=1"]
    assert (options.json_path, options.screen_steps, options.staleness, options.base_sizes, options.top,
            options.rows) == ("out.json", 3, (1, 2), (2, 4), 2, 5)
    assert split_overrides(["experiment=x", "layout.train_nodes=2", "mode=hybrid", "mode.max_staleness=1"]) == (
        ["experiment=x"], ["layout.train_nodes=2", "mode=hybrid", "mode.max_staleness=1"])


def test_a_bad_flag_value_is_one_error_line(capsys):
    assert plan_main(["--staleness", "one"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("asp-plan-layout: error: --staleness 'one': give whole numbers") and "Traceback" not in err


def test_cli_on_a_tiny_cluster(tmp_path, capsys):
    # The default config: the tiny policy on 4 logical nodes of 2 CPU "devices".
    out = tmp_path / "plan.json"
    code = plan_main(["layout.nodes=4", "layout.devices_per_node=2", "layout.gen_nodes=3", "steps=4",
                      "--steps", "2", "--staleness", "1,2", "--top", "2", "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "ignored layout.gen_nodes=3: the planner sweeps this key" in captured.out
    assert "[" in captured.err and "done in" in captured.err       # progress on stderr
    last = captured.out.strip().splitlines()[-1]
    assert last.startswith("asp-train layout.nodes=4 layout.devices_per_node=2 steps=4 mode=")
    document = json.loads(out.read_text())
    # 3 splits x 2 sizes x 2 bounds x 2 bases, plus the hybrid reference
    assert len(document["screened"]) + len(document["skipped"]) == 3 * 2 * 2 * 2 + 1
    assert document["confirm_steps"] == 4 and document["screen_steps"] == 2
    assert [r["mode"] for r in document["confirmed"]].count("hybrid") == 1
    assert document["best"]["command"] == last
    times = [r["iteration_s"] for r in document["confirmed"]]
    assert times == sorted(times) and document["best"]["label"] == document["confirmed"][0]["label"]
    assert train_main([*last.split()[1:], "--dry-run"]) == 0
    # How far to trust it: the tiny model shares only its family (qwen3) with the Qwen3-32B cases.
    assert "how far to trust it" in captured.out
    assert document["trust"][0].startswith("trust (end_to_end, nearest by model family: table3_qwen3_32b_hybrid")
    assert all(line in captured.out for line in document["trust"])


def _keys(case_id, scope, hardware, family, execution, target=0.25):
    return planner.CaseKeys(case_id, scope, target, {"hardware": hardware, "model family": family,
                                                     "execution": execution})


def test_the_nearest_cases_share_the_most_with_the_plan_per_scope():
    plan = {"hardware": "ascend910b3", "model family": "qwen3_moe", "execution": "eager"}
    cases = [_keys("e2e_same", "end_to_end", "ascend910b3", "qwen3_moe", "eager"),
             _keys("e2e_other_model", "end_to_end", "ascend910b3", "qwen3", "eager"),
             _keys("micro_graph", "micro", "ascend910b3", "qwen3_moe", "graph", 0.3),
             _keys("micro_gpu", "micro", "h100_sxm", "qwen3_moe", "eager", 0.3),
             _keys("micro_gpu_llama", "micro", "h100_sxm", "llama", "graph", 0.3)]
    nearest = planner.nearest_cases(cases, plan)
    assert {scope: [c.id for c in group] for scope, group in nearest.items()} == {
        "end_to_end": ["e2e_same"], "micro": ["micro_graph"]}
    # Nothing shared: the scope is absent, and its line says it is unvalidated.
    assert planner.nearest_cases([cases[-1]], plan) == {}


def test_trust_lines_give_the_error_range_and_how_many_meet_the_target():
    plan = {"hardware": "ascend910b3", "model family": "qwen3", "execution": "eager"}
    group = [_keys("a", "end_to_end", "ascend910b3", "qwen3", "eager"),
             _keys("b", "end_to_end", "ascend910b3", "qwen3", "eager")]
    lines = planner.trust_lines(plan, {"end_to_end": group}, {"a": -0.64, "b": 0.1})
    assert lines == [
        "trust (end_to_end, nearest by hardware + model family + execution: a, b): simulated / measured - 1 "
        "from -64% to +10%, 1 of 2 within the 25% target",
        "trust (micro): no validation case shares the plan's hardware ascend910b3, model family qwen3, "
        "execution eager: this scope is unvalidated"]
