"""The simulator end to end: batching models, every mode through the one loop on the
virtual clock, the files a simulated run writes, the studies and the CLI's errors."""
from __future__ import annotations

import dataclasses
import functools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.cli.simulate import main as simulate_main
from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.config.schema import SimConfig
from mindspeed_rl_asp.sim.batching import (Instance, continuous_minibatch, decode_steps_time, static_minibatch)
from mindspeed_rl_asp.sim.costs import decode_step_time
from mindspeed_rl_asp.sim.run import setup_from_config, simulate
from mindspeed_rl_asp.sim.workload import LengthModel

SHORT = ["steps=4", "task.num_prompts=128"]


@functools.lru_cache(maxsize=None)
def paper_instance(model="qwen3_30b_a3b") -> Instance:
    return setup_from_config(load_config([f"experiment=table3_{model}_asp"])).instance


# ---------------------------------------------------------------------- batching models
@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 300), steps=st.integers(0, 400), kv0=st.integers(0, 200_000),
       growth=st.integers(0, 300), model=st.sampled_from(["qwen3_30b_a3b", "qwen3_32b"]))
def test_closed_form_step_sum_equals_the_sum_of_steps(batch, steps, kv0, growth, model):
    inst = paper_instance(model)
    direct = sum(decode_step_time(inst.model, inst.hardware, inst.engine, inst.devices, batch, kv0 + j * growth,
                                  inst.tp, inst.ep) for j in range(steps))
    assert decode_steps_time(inst, batch, steps, kv0, growth) == pytest.approx(direct, rel=1e-9, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=40), prompt=st.integers(16, 400))
def test_continuous_batching_is_never_slower_than_static(lengths, prompt):
    """With room for every row, continuous batching runs the same steps as static with
    finished rows dropped, so it can only be faster; both bubbles are shares."""
    inst = paper_instance()
    prompts = [prompt] * len(lengths)
    static, cont = static_minibatch(inst, prompts, lengths), continuous_minibatch(inst, prompts, lengths)
    assert cont.duration <= static.duration * (1 + 1e-9)
    assert static.slot_bubble == pytest.approx(1 - sum(lengths) / (len(lengths) * max(lengths)))
    assert 0.0 <= cont.slot_bubble <= 1.0 and 0.0 <= cont.tail_s <= cont.duration
    assert static.decode_steps == cont.decode_steps == max(lengths) - 1


def test_continuous_batching_refills_slots_up_to_max_num_seqs():
    inst = dataclasses.replace(paper_instance(), engine=dataclasses.replace(paper_instance().engine, max_num_seqs=2))
    # Four sequences, two slots: 10 and 10 run first, then 10 and 10: 19 + 10 decode steps... the
    # second pair's first tokens come from their prefill, so 9 + 9 steps after the first 9.
    timing = continuous_minibatch(inst, [16] * 4, [10, 10, 10, 10])
    assert timing.decode_steps == 18 and timing.capacity == 2 and timing.slot_bubble == pytest.approx(0.0)


def test_kv_capacity_holds_back_sequences_until_one_finishes():
    inst = paper_instance()
    tight = dataclasses.replace(inst, kv_capacity_tokens=2 * (16 + 50))
    timing = continuous_minibatch(tight, [16] * 3, [50, 50, 50])
    assert timing.decode_steps == 49 + 49   # two at once, then the third


# ---------------------------------------------------------------------- whole runs
@pytest.mark.parametrize("experiment", ["table3_qwen3_30b_a3b_hybrid", "table3_qwen3_30b_a3b_async_fifo",
                                        "table3_qwen3_30b_a3b_asp", "table3_qwen3_32b_asp"])
def test_every_mode_simulates_deterministically_within_its_bounds(experiment):
    cfg = load_config([f"experiment={experiment}", *SHORT])
    first, again = simulate(cfg), simulate(cfg)
    assert first.to_dict() == again.to_dict()
    assert first.steps == 4 and len(first.iteration_times) == 4
    assert first.iteration_s >= first.lower_bound_s > 0
    assert max(first.policy_age_hist) <= cfg.mode.max_staleness
    assert sum(first.policy_age_hist.values()) == 4 * cfg.rl.global_batch_size
    assert 0 <= first.generation_idle <= 1 and 0 <= first.trainer_idle <= 1
    if cfg.mode.name == "hybrid":
        assert first.policy_age_hist == {0: 4 * cfg.rl.global_batch_size} and first.num_actors == 8
    else:
        assert first.num_actors == 4 and first.train_devices == 32


def test_a_simulated_run_writes_what_a_real_run_writes_and_asp_report_draws_it(tmp_path):
    from mindspeed_rl_asp.metrics.report import make_report

    cfg = load_config(["experiment=table3_qwen3_30b_a3b_asp", *SHORT])
    result = simulate(cfg, tmp_path)
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    assert sum(m["iteration_time_s"] for m in metrics) == pytest.approx(result.total_s)
    spans = [json.loads(x) for x in (tmp_path / "timeline.jsonl").read_text().splitlines()]
    assert {s["kind"] for s in spans} >= {"generate", "train", "publish"}
    assert all(0 <= s["start"] <= s["end"] <= result.total_s + 1e-9 for s in spans if s["kind"] != "generate")
    assert json.loads((tmp_path / "sim_result.json").read_text())["steps"] == 4
    assert {p.name for p in make_report(tmp_path)} == {"timeline.png", "queue.png", "rewards.png"}


def test_global_refresh_pauses_every_actor_until_all_hold_the_version(tmp_path):
    """verl's sync: a Generate with version v starts only after every actor has loaded v;
    rolling refresh (ASP) lets an actor generate while another still loads."""
    def gaps(overrides, path):
        simulate(load_config(["experiment=table3_qwen3_30b_a3b_asp", *SHORT, *overrides]), path)
        spans = [json.loads(x) for x in (path / "timeline.jsonl").read_text().splitlines()]
        loaded = {}
        for s in spans:
            if s["kind"] == "load_weights":
                v = int(s["label"][1:])
                loaded[v] = max(loaded.get(v, 0.0), s["end"])
        return [s["start"] - loaded[s["info"]["version"]] for s in spans
                if s["kind"] == "generate" and s["info"]["version"] in loaded]

    global_gaps = gaps(["mode.refresh=global"], tmp_path / "global")
    rolling_gaps = gaps([], tmp_path / "rolling")
    assert global_gaps and min(global_gaps) >= -1e-9
    assert min(rolling_gaps) < 0     # somebody generated while another actor was still loading


def test_sim_config_defaults_are_the_length_model_defaults():
    model = LengthModel()
    shared = [f.name for f in dataclasses.fields(SimConfig) if hasattr(model, f.name)]
    assert {"median_response_length", "runaway_probability"} <= set(shared), shared
    assert [getattr(SimConfig(), k) for k in shared] == [getattr(model, k) for k in shared]


# ---------------------------------------------------------------------- the command
def test_the_table3_study_prints_the_paper_beside_every_row(tmp_path, capsys):
    assert simulate_main(["experiment=sim_table3", f"run_dir={tmp_path}", "steps=3"]) == 0
    out = capsys.readouterr().out
    study = json.loads((tmp_path / "study.json").read_text())
    assert [r["paper"]["iteration_s"] for r in study["rows"]] == [927.0, 536.7, 216.0, 928.0, 615.1, 230.7]
    assert all(r["simulated"]["steps"] == 3 for r in study["rows"])
    assert all(q["simulated"] and q["paper"] for q in study["ratios"])
    assert "| Qwen3-30B-A3B ASP |" in out and (tmp_path / "study.png").is_file()
    assert (tmp_path / "qwen3-30b-a3b-asp" / "timeline.jsonl").is_file()


@pytest.mark.parametrize("overrides, message", [
    (["hardware.hbm_bandwidth_gbs=0"], "hardware.hbm_bandwidth_gbs=0.0 must be > 0"),
    (["layout.infer_instance_size=1"], "layout.infer_instance_size=1"),
    (["engine.batching=paged"], "engine.batching='paged' is not one of"),
    (["sim.sigma_prompt=0"], "sigma_prompt"),
])
def test_bad_profiles_are_one_clear_error(tmp_path, capsys, overrides, message):
    code = simulate_main(["experiment=table3_qwen3_32b_asp", f"run_dir={tmp_path / 'r'}", *overrides])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_a_bad_lengths_file_names_the_line(tmp_path, capsys):
    bad = tmp_path / "lengths.jsonl"
    bad.write_text('{"id": "a", "lengths": [3, 4]}\n{"id": "b", "lengths": [-1, 4]}\n')
    code = simulate_main(["experiment=table3_qwen3_30b_a3b_asp", f"run_dir={tmp_path / 'r'}",
                          f"sim.lengths_file={bad}", "steps=1", "rl.global_batch_size=2", "rl.mini_batch_size=2", "scheduler.base_batch_size=2",
                          "scheduler.slack=0", "scheduler.group_size=1", "mode.queue_capacity=64"])
    err = capsys.readouterr().err
    assert code == 2 and ":2" in err, err


def test_a_simulated_engine_is_numbers_not_a_local_install(tmp_path, capsys):
    """Simulating CUDA vLLM on H200s needs no CUDA vLLM here (issue 18, item 5): the
    real runtime's install check still refuses the same config."""
    from mindspeed_rl_asp.config.validate import ConfigError
    from mindspeed_rl_asp.engines.vllm_platform import installed_device_type

    overrides = ["experiment=table3_qwen3_32b_asp", "engine=vllm", "engine.device=cuda", "hardware=h200",
                 "steps=2", "task.num_prompts=64"]
    if installed_device_type() != "cuda":
        with pytest.raises(ConfigError, match="engine.device='cuda'|needs vLLM"):
            load_config(overrides)
    code = simulate_main([*overrides, f"run_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert json.loads((tmp_path / "sim_result.json").read_text())["steps"] == 2
    cfg = load_config(overrides, local_install=False)
    assert cfg.engine.device == "cuda"


def test_mindspeed_rl_throughput_and_the_latency_bound_by_hand(tmp_path):
    """MindSpeed-RL's e2e_tps (compute_tps, log_max_throughput=True): per step (max prompt +
    max response) x samples, over world size and time; the latency bound: each step's
    longest response decoded alone, over max_staleness + 1 steps in flight."""
    from mindspeed_rl_asp.sim.batching import decode_steps_time, lone_sequence_time
    from mindspeed_rl_asp.sim.costs import prefill_time

    cfg = load_config(["experiment=table3_qwen3_30b_a3b_asp", *SHORT])
    result = simulate(cfg, tmp_path)
    steps = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 4
    world = 64
    padded = sum(m["samples"] * (m["prompt_length_max"] + m["response_length_max"]) for m in steps)
    assert result.mindspeed_e2e_tps == pytest.approx(padded / world / result.total_s)
    assert result.mindspeed_e2e_tps_mean == pytest.approx(sum(m["trained_tokens"] for m in steps) / world
                                                          / result.total_s)
    inst = setup_from_config(cfg).instance
    alone = [lone_sequence_time(inst, m["prompt_length_max"], m["response_length_max"]) for m in steps]
    assert result.latency_bound_s == pytest.approx(sum(alone) / 4 / (cfg.mode.max_staleness + 1))
    p, r = steps[0]["prompt_length_max"], steps[0]["response_length_max"]
    assert alone[0] == pytest.approx(prefill_time(inst.model, inst.hardware, inst.devices, p)
                                     + decode_steps_time(inst, 1, r - 1, p + 1, 1))
    assert result.bound_by == ("tail" if result.latency_bound_s > result.lower_bound_s else "throughput")
    assert result.iteration_s >= result.latency_bound_s


@pytest.mark.slow
def test_the_sensitivity_study_varies_one_unknown_for_all_three_systems():
    from mindspeed_rl_asp.sim.studies import SENSITIVITY, get_study

    study = get_study("sensitivity")
    assert len(study.rows) == 3 * len(SENSITIVITY)
    for (name, overrides), k in zip(SENSITIVITY, range(0, len(study.rows), 3)):
        trio = study.rows[k:k + 3]
        assert [r.system for r in trio] == ["MindSpeed-RL hybrid", "verl async", "ASP"]
        assert all(set(overrides) <= set(r.overrides) for r in trio)
        for r in trio:
            load_config(list(r.overrides), local_install=False)   # every row is a valid config
    assert sorted(set(round(v, 6) for v in study.paper_ratios.values())) == [round(536.7 / 216, 6), round(927 / 216, 6)]


def test_a_global_refresh_shares_the_senders_link_among_the_actors():
    """verl's global sync: the 4 actors load together from trainer rank 0's one 25 GB/s
    port, a quarter each; ASP's rolling refresh loads one at a time at the whole port;
    hybrid reshards in place over the node's links."""
    asp = setup_from_config(load_config(["experiment=table3_qwen3_30b_a3b_asp"]))
    verl = setup_from_config(load_config(["experiment=table3_qwen3_30b_a3b_async_fifo"]))
    hybrid = setup_from_config(load_config(["experiment=table3_qwen3_30b_a3b_hybrid"]))
    assert asp.load_bandwidth == pytest.approx(25e9)
    assert verl.load_bandwidth == pytest.approx(25e9 / 4)
    assert hybrid.load_bandwidth == pytest.approx(8 * 392e9)


def test_the_asyncflow_study_runs_and_prints_its_ratio_beside_asyncflows(tmp_path, capsys):
    """A two-step run of experiment=sim_asyncflow: its three rows, the decoupled /
    synchronous ratio beside AsyncFlow's 226.8 / 59.3, and the notes that name what drives it."""
    from mindspeed_rl_asp.cli.simulate import main as simulate_main

    overrides = ["steps=2", "task.num_prompts=64", "generate.sampling_config.max_tokens=1024",
                 "sim.median_response_length=256"]
    assert simulate_main(["experiment=sim_asyncflow", f"run_dir={tmp_path}", *overrides]) == 0
    out = capsys.readouterr().out
    study = json.loads((tmp_path / "study.json").read_text())
    assert [r["label"] for r in study["rows"]] == ["synchronous (MindSpeed-RL hybrid)",
                                                   "decoupled (AsyncFlow / verl style)", "ASP"]
    headline = study["ratios"][0]
    assert headline["paper"] == pytest.approx(226.8 / 59.3)
    iteration = {r["label"]: r["simulated"]["iteration_s"] for r in study["rows"]}
    assert headline["simulated"] == pytest.approx(iteration["synchronous (MindSpeed-RL hybrid)"]
                                                  / iteration["decoupled (AsyncFlow / verl style)"])
    assert f"| {headline['ratio']} | {headline['simulated']:.2f} | 3.82 |" in out
    assert "What drives the decoupled / synchronous ratio here" in out


@pytest.mark.parametrize("engine, off_policy, kl_coef, mode, passes", [
    ("vllm", "tis", 0.0, "async", 1),        # the proximal forward of the staleness correction
    ("vllm", "none", 0.0, "async", 0),       # behaviour log-probs stand in (verl's fully async)
    ("vllm", "decoupled", 0.1, "async", 2),  # proximal + reference
    ("mindspeed", "none", 0.0, "async", 1),  # MindSpeed-RL's actor: the old log-probs always
    ("mindspeed", "none", 0.0, "hybrid", 1),  # hybrid: the reference every step, one minibatch
])
def test_extra_forwards_follow_what_the_trainer_runs(engine, off_policy, kl_coef, mode, passes):
    from types import SimpleNamespace

    from mindspeed_rl_asp.sim.run import extra_forwards

    cfg = SimpleNamespace(engine=SimpleNamespace(name=engine), algo=SimpleNamespace(off_policy=off_policy,
                                                                                   kl_coef=kl_coef),
                          rl=SimpleNamespace(mini_batch_size=32, global_batch_size=32))
    assert extra_forwards(cfg, mode == "hybrid") == passes


def test_asp_simulate_honours_save_every():
    """The core's checkpoint rule runs on the virtual clock: a checkpoint at every multiple
    of save_every, the last version's included, and none without it."""
    saving = simulate(load_config(["experiment=table3_qwen3_30b_a3b_asp", *SHORT, "save_every=2"]))
    plain = simulate(load_config(["experiment=table3_qwen3_30b_a3b_asp", *SHORT]))
    assert saving.checkpoints == [2, 4] and plain.checkpoints == []
    assert saving.steps == plain.steps == 4
