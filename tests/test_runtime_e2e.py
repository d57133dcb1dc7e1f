"""The Ray runtime end to end: a few real GRPO steps in each mode, and its fault paths.

Each run starts its actors (a process importing torch each, most of a short run's time),
so there are five runs, each carrying every check it can:

* async ASP, rolling refresh, two generation actors: KL term, held-out comparison;
* async FIFO, global refresh across two generation actors, drain at finish: three epochs
  with a failed minibatch re-dispatched;
* hybrid ASP, two colocated actors: three epochs with a failed minibatch re-dispatched,
  and no generation overlapping a training step;
* a trainer error and Ctrl-C, one generation actor each: a clean stop.
"""
import json
import os
import signal
import threading
import time

import pytest

from mindspeed_rl_asp.config.load import load_config, make_run_dir
from mindspeed_rl_asp.control.loop import TrainerFailed
from mindspeed_rl_asp.runtime.driver import run_training
from mindspeed_rl_asp.runtime.faults import FaultPlan

pytestmark = pytest.mark.slow

SMALL = ["task.num_prompts=24", "steps=2", "rl.global_batch_size=4", "rl.mini_batch_size=2",
         "rl.n_samples_per_prompt=2", "rl.micro_batch_size=4", "generate.sampling_config.max_tokens=96",
         "scheduler.base_batch_size=2", "scheduler.group_size=2", "mode.queue_capacity=32", "eval.num_prompts=0"]


# For the runs that stop early: one generation actor is all their checks need, and each
# actor's process start-up is most of a short run's time.
ONE_ACTOR = ("layout.nodes=2", "layout.gen_nodes=1")
# Hybrid runs a colocated actor per node: two nodes (two actors, not the local layout's
# three) still interleave generation and training across actors.
HYBRID = ("mode=hybrid", "layout.nodes=2")


def run(tmp_path, *overrides, **options):
    cfg = load_config([*SMALL, f"run_dir={tmp_path / 'run'}", *overrides])
    run_dir = make_run_dir(cfg, "test")
    return cfg, run_dir, run_training(cfg, run_dir, **options)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# Three epochs over 8 prompts (6 steps of 4), with actor 0's first minibatch failing.
THREE_EPOCHS = ("task.num_prompts=8", "steps=6")
FAIL_FIRST_MINIBATCH = FaultPlan(fail_actor_once=0)


@pytest.mark.parametrize("overrides, faults", [
    # The full system (async ASP, rolling refresh over two generation actors) also runs the
    # KL term and the held-out comparison.
    (("mode=async", "scheduler=asp", "scheduler.slack=1", "algo.kl_coef=0.05", "eval.num_prompts=6",
      "eval.samples_per_prompt=2"), None),
    # verl's global weight sync across two generation actors, and overshoot drained instead
    # of cancelled; over three epochs with a failed minibatch (re-dispatched under a global
    # refresh). FIFO with no slack plans exactly the 24 prompts the six steps train, so
    # every minibatch, the retry too, finishes before the last step whatever the timing:
    # the retry is never drained (nor cancelled) at finish.
    (("mode=async", "scheduler=fifo", "scheduler.slack=0", "mode.refresh=global", "mode.at_finish=drain",
      *THREE_EPOCHS), FAIL_FIRST_MINIBATCH),
    # Hybrid (colocated, ASP step by step) over three epochs with a failed minibatch.
    ((*HYBRID, "scheduler=asp", *THREE_EPOCHS), FAIL_FIRST_MINIBATCH),
], ids=["async-asp-kl-eval", "async-fifo-global-drain-3epochs-failure", "hybrid-asp-3epochs-failure"])
def test_each_mode_trains(ray_cluster, tmp_path, overrides, faults):
    phases = []
    cfg, run_dir, summary = run(tmp_path, *overrides, on_phase=phases.append, faults=faults)
    check_trained(cfg, run_dir, summary, phases)
    if faults is not None:
        check_epochs_and_redispatched_minibatch(cfg, run_dir, summary)


def check_trained(cfg, run_dir, summary, phases):
    """A finished run: its steps, start-up phases, samples, metrics and files."""
    assert summary["steps"] == cfg.steps
    # Start-up is reported phase by phase, in order, before the first step.
    assert [p.split(":")[0] for p in phases] == ["plan ready", "Ray cluster up", "placement ready", "models loaded",
                                                "first minibatch generated"]
    assert summary["at_finish"]["at_finish"] == cfg.mode.at_finish and not summary["at_finish"]["interrupted"]
    consumed = summary["consumed_prompt_ids"]
    assert len(consumed) == len(set(consumed)) == cfg.steps * cfg.rl.global_batch_size
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(cfg.steps))
    # What the model wrote: every trained sample, with its prompt, reward and version.
    written = read_jsonl(run_dir / "rollouts.jsonl")
    per_step = cfg.rl.global_batch_size * cfg.rl.n_samples_per_prompt
    assert [r["step"] for r in written] == [step for step in range(cfg.steps) for _ in range(per_step)]
    assert {r["prompt_id"] for r in written} == set(consumed)
    assert all(isinstance(r["response"], str) and r["version"] <= r["step"] for r in written)
    for r in rows:
        assert r["samples"] == cfg.rl.global_batch_size * cfg.rl.n_samples_per_prompt
        assert r["policy_age_max"] <= cfg.mode.max_staleness
        assert 0.0 <= r["padding_bubble"] < 1.0 and r["iteration_time_s"] > 0
        assert ("kl" in r) == (cfg.algo.kl_coef > 0) and r.get("kl", 0.0) >= 0.0
    if cfg.eval.num_prompts:
        for key in ("held_out", "training_prompts"):
            held = summary[key]
            assert held["initial"]["samples"] == held["final"]["samples"] == 12
            assert held["change"]["correctness"]["prompts"] == 6
        assert (run_dir / "final_policy" / "config.json").is_file()
    spans = read_jsonl(run_dir / "timeline.jsonl")
    kinds = {s["kind"] for s in spans}
    assert {"generate", "train", "publish"} <= kinds
    if cfg.mode.name == "hybrid":
        # Colocated: no generation overlaps a training step.
        trains = [(s["start"], s["end"]) for s in spans if s["kind"] == "train"]
        gens = [(s["start"], s["end"]) for s in spans if s["kind"] == "generate"]
        assert not any(g0 < t1 and t0 < g1 for t0, t1 in trains for g0, g1 in gens)
    for name in ("config.yaml", "plan.json", "queue.jsonl", "summary.json", "placement.txt"):
        assert (run_dir / name).is_file()
    assert any((run_dir / "tensorboard").iterdir())


def check_epochs_and_redispatched_minibatch(cfg, run_dir, summary):
    """Steps beyond the prompts train more epochs, and a failed minibatch is re-dispatched
    (THREE_EPOCHS, FAIL_FIRST_MINIBATCH): the failed minibatch is generated exactly once
    more and every prompt is still trained once per epoch."""
    from collections import Counter

    from mindspeed_rl_asp.tasks import base_prompt_id

    assert cfg.steps == 6 and cfg.task.num_prompts == 8
    assert summary["steps"] == 6 and summary["epochs"] == 3
    consumed = summary["consumed_prompt_ids"]
    assert len(consumed) == len(set(consumed)) == 24
    assert set(Counter(base_prompt_id(p) for p in consumed).values()) == {3}  # each prompt once per epoch
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == list(range(6))
    assert summary["generation_failures"] == 1
    spans = read_jsonl(run_dir / "timeline.jsonl")
    failed = [s for s in spans if s["kind"] == "failed"]
    assert len(failed) == 1 and failed[0]["lane"] == "gen-0"
    regenerated = [s for s in spans if s["kind"] == "generate" and s["label"] == failed[0]["label"]]
    assert len(regenerated) == 1  # the same minibatch, generated exactly once more


def test_trainer_error_stops_cleanly(ray_cluster, tmp_path):
    with pytest.raises(TrainerFailed, match="injected trainer failure at step 1"):
        run(tmp_path, *ONE_ACTOR, faults=FaultPlan(fail_trainer_at_step=1))
    run_dir = tmp_path / "run"
    assert (run_dir / "config.yaml").is_file()
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [0]
    assert ray_cluster.util.placement_group_table() == {} or all(
        pg["state"] == "REMOVED" for pg in ray_cluster.util.placement_group_table().values())


def test_ctrl_c_stops_cleanly(ray_cluster, tmp_path, capsys):
    from mindspeed_rl_asp.cli.train import main

    run_dir = tmp_path / "run"

    def interrupt_after_first_step():
        deadline = time.time() + 300
        while time.time() < deadline and not (run_dir / "metrics.jsonl").is_file():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_after_first_step, daemon=True).start()
    # Far more steps than the interrupt needs (steps take 0.1-0.5 s here), so that the
    # run cannot finish before the signal lands.
    rc = main([*SMALL, *ONE_ACTOR, "steps=200", "task.num_prompts=40", f"run_dir={run_dir}"])
    assert rc == 130
    assert "interrupted (SIGINT)" in capsys.readouterr().out
    assert (run_dir / "config.yaml").is_file() and (run_dir / "metrics.jsonl").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] and summary["signal"] == "SIGINT" and summary["checkpoint"] is None
    assert summary["steps"] >= 1 and len(summary["consumed_prompt_ids"]) == 4 * summary["steps"]
    assert all(pg["state"] == "REMOVED" for pg in ray_cluster.util.placement_group_table().values())
