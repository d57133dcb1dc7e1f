"""Real runs in which a generation actor's process is killed (SIGKILL) mid-minibatch.

The actor's first minibatch writes its process id into a flag file and blocks
(``run_training(faults=FaultPlan(hold_actor_once=...))``), so the kill lands mid-minibatch for sure; the
test kills only that pid. With ``fault.actor_restarts=1`` Ray brings the actor back and
the core refreshes it before it generates again; with 0 it is retired and the other
actor finishes the run. Either way the killed minibatch is generated once more and the
ledger is exact: every prompt trained once per epoch, every step trained.

The restarted actor's run also carries the failed weight load (collective transport): one
run of two actors instead of two.
"""
import json
import os
import signal
import threading
import time
from collections import Counter

import pytest

from mindspeed_rl_asp.config.load import load_config, make_run_dir
from mindspeed_rl_asp.runtime.driver import run_training
from mindspeed_rl_asp.runtime.faults import FaultPlan
from mindspeed_rl_asp.tasks import base_prompt_id

pytestmark = pytest.mark.slow

# 8 prompts, 4 steps of 4: two epochs, so "once per epoch" is checked across a restart.
SMALL = ["task.num_prompts=8", "steps=4", "rl.global_batch_size=4", "rl.mini_batch_size=2",
         "rl.n_samples_per_prompt=2", "rl.micro_batch_size=4", "generate.sampling_config.max_tokens=64",
         "scheduler.base_batch_size=2", "scheduler.group_size=2", "mode.queue_capacity=32", "eval.num_prompts=0",
         "scheduler=asp", "mode=async"]


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(tmp_path, *overrides, **options):
    cfg = load_config([*SMALL, f"run_dir={tmp_path / 'run'}", *overrides])
    run_dir = make_run_dir(cfg, "test")
    return cfg, run_dir, run_training(cfg, run_dir, **options)


def run_killing_actor(tmp_path, actor: int, *overrides, fail_transfer_once=None):
    """A run whose ``actor`` is killed with SIGKILL while it generates its first minibatch
    (``fail_transfer_once``: FaultPlan's, also armed)."""
    flag = tmp_path / "held-actor.pid"
    killed: list[int] = []
    run_over = threading.Event()

    def kill_when_held():
        while not flag.is_file():
            if run_over.wait(0.02):
                return
        pid = int(flag.read_text())
        if pid not in (os.getpid(), 0, 1):   # only the actor's own process, never ours
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    killer = threading.Thread(target=kill_when_held, daemon=True)
    killer.start()
    try:
        faults = FaultPlan(hold_actor_once=(actor, str(flag)), fail_transfer_once=fail_transfer_once)
        cfg, run_dir, summary = run(tmp_path, *overrides, faults=faults)
    finally:
        run_over.set()
        killer.join(timeout=10)
    assert killed, "the held actor never wrote its pid: the kill did not happen"
    return cfg, run_dir, summary


def check_ledger(cfg, summary, run_dir):
    consumed = summary["consumed_prompt_ids"]
    assert summary["steps"] == cfg.steps
    assert len(consumed) == len(set(consumed)) == cfg.steps * cfg.rl.global_batch_size
    epochs = cfg.steps * cfg.rl.global_batch_size // cfg.task.num_prompts
    assert set(Counter(base_prompt_id(p) for p in consumed).values()) == {epochs}
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == list(range(cfg.steps))


def killed_minibatch(summary, actor):
    died = [f for f in summary["faults"] if f["kind"] == "died"]
    assert len(died) == 1 and died[0]["actor"] == actor and died[0]["minibatch"], summary["faults"]
    return died[0]["minibatch"]


def test_killed_actor_is_restarted_and_a_failed_weight_load_is_retried(ray_cluster, tmp_path):
    """Two faults in one run of one generation actor: its process is killed in its first
    minibatch and restarted; later, its first weight transfer (collective transport) fails
    after 2 buckets and is retried. The order is certain: no version is trained (so none is
    transferred) before the restarted actor generates the killed minibatch again."""
    # One generation actor, so that the run needs it back (with two, the other may finish
    # the run before the restart does, and the probe is cancelled at Finish).
    cfg, run_dir, summary = run_killing_actor(tmp_path, 0, "fault.actor_restarts=1", "layout.nodes=2",
                                              "layout.gen_nodes=1", "weights.transport=collective",
                                              "weights.bucket_mb=0.5", "weights.prefetch=false",
                                              fail_transfer_once=2)
    check_ledger(cfg, summary, run_dir)
    # Each fault once, in this order (nothing else: no second death, no second failed load).
    assert [(f["kind"], f["actor"]) for f in summary["faults"]] == [
        ("died", 0), ("restarted", 0), ("load_failed", 0), ("load_retried", 0)], summary["faults"]
    spans = read_jsonl(run_dir / "timeline.jsonl")
    check_restarted(summary, spans)
    check_load_retried(summary, spans)


def check_restarted(summary, spans):
    """Actor 0 died mid-minibatch, came back holding the starting checkpoint, and
    regenerated the killed minibatch with weights it loaded since."""
    mb = killed_minibatch(summary, 0)
    restarted = next(f for f in summary["faults"] if f["kind"] == "restarted")
    assert restarted["version"] == 0           # the new process holds the starting checkpoint
    assert len([s for s in spans if s["kind"] == "generate" and s["label"] == mb]) == 1
    assert [s["lane"] for s in spans if s["kind"] == "restart"] == ["gen-0"]
    # After its restart, actor 0 generates only with versions it loaded since (or 0).
    back = next(s["end"] for s in spans if s["kind"] == "restart")
    loaded = {0}
    for s in sorted((s for s in spans if s["lane"] == "gen-0" and s["start"] >= back), key=lambda s: s["start"]):
        if s["kind"] == "load_weights":
            loaded.add(int(s["label"][1:]))
        elif s["kind"] == "generate":
            assert s["info"]["version"] in loaded, (s, loaded)
    assert summary["generation_failures"] == 1   # the killed minibatch; a failed load is not one


def check_load_retried(summary, spans):
    """One weight load failed mid-transfer, was recorded, and the actor's next load retried it."""
    faults = summary["faults"]
    failed = [f for f in faults if f["kind"] == "load_failed"]
    assert len(failed) == 1 and "failed after 2 of" in failed[0]["error"], faults
    # The actor's next load is the retry: of the refresh target then, which is the failed
    # version or, if the trainer published meanwhile, a newer one.
    retried = [f for f in faults if f["kind"] == "load_retried"]
    assert [f["actor"] for f in retried] == [failed[0]["actor"]], faults
    assert retried[0]["version"] >= failed[0]["version"] and retried[0]["t"] >= failed[0]["t"]
    lane = f"gen-{failed[0]['actor']}"
    assert [s["label"] for s in spans if s["kind"] == "load_failed"] == [f"v{failed[0]['version']}"]
    assert any(s["kind"] == "load_weights" and s["lane"] == lane and s["label"] == f"v{retried[0]['version']}"
               for s in spans)


def test_killed_actor_without_restarts_is_retired_and_the_other_finishes(ray_cluster, tmp_path):
    cfg, run_dir, summary = run_killing_actor(tmp_path, 1, "fault.actor_restarts=0")
    check_ledger(cfg, summary, run_dir)
    mb = killed_minibatch(summary, 1)
    assert [(f["kind"], f["actor"]) for f in summary["faults"]] == [("died", 1), ("retired", 1)]
    spans = read_jsonl(run_dir / "timeline.jsonl")
    died_at = next(s["start"] for s in spans if s["kind"] == "retired")
    regenerated = [s for s in spans if s["kind"] == "generate" and s["label"] == mb]
    assert [s["lane"] for s in regenerated] == ["gen-0"]
    assert not [s for s in spans if s["lane"] == "gen-1" and s["kind"] in ("generate", "load_weights")
                and s["start"] > died_at]


def test_last_actor_retired_stops_the_run_with_a_clear_error(ray_cluster, tmp_path):
    from mindspeed_rl_asp.control.core import ActorsExhausted

    with pytest.raises(ActorsExhausted, match="fault.actor_restarts"):
        run_killing_actor(tmp_path, 0, "fault.actor_restarts=0", "layout.nodes=2", "layout.gen_nodes=1")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["failed"] and "every generation actor (1) is retired" in summary["error"]
    assert [f["kind"] for f in summary["faults"]] == ["died", "retired"]
    assert summary["steps"] == 0 and summary["consumed_prompt_ids"] == []
