"""The re-plan rule in the core (``control/replan.py``, ``scheduler.refit``) through the one loop.

A property test drives whole runs with the real planning function (``schedule/refit``
over the real planner) under random event orders with failures, through the Shell of
test_control_properties.py (every invariant after every event); then the simulator,
which gets the rule through the same ``schedule/assembly.assemble_core`` as the Ray driver."""
from __future__ import annotations

import json
import random
from dataclasses import replace

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.control.clusters import random_chooser
from mindspeed_rl_asp.control.core import ControlConfig, ControlCore, Generate
from mindspeed_rl_asp.control.loop import Done, Loop
from mindspeed_rl_asp.control.staleness import first_window_gap
from mindspeed_rl_asp.schedule.configured import repeat_for_epochs
from mindspeed_rl_asp.schedule.plan import SchedulerParams, make_plan
from mindspeed_rl_asp.schedule.refit import epoch_replan
from mindspeed_rl_asp.tasks import base_prompt_id, prompt_epoch

from mindspeed_rl_asp.schedule.planning import refill_passes

from test_control_rejection import RejectShell
from test_replan import ReplanShell


class RefitShell(ReplanShell):
    """The ReplanShell (no prompt dispatched twice, dispatched minibatches never change)
    whose core carries the re-plan rule and whose cluster reports every sample's length
    (``truth`` of its base prompt). Also checks that a minibatch id goes out with one set
    of prompts only, and again only as a retry."""

    def __init__(self, cfg, mbs, rule, truth, chooser) -> None:
        super().__init__(cfg, mbs, chooser)
        self.core = ControlCore(cfg, mbs, replan=rule)
        self.loop = Loop(self.core, self.cluster, self)
        self.truth = truth
        self.sent: dict[str, tuple[str, ...]] = {}   # minibatch id -> the prompts it went out with
        plain_next = self.cluster.next_event

        def next_event():
            event = plain_next()
            if isinstance(event, Done) and isinstance(event.action, Generate):
                lengths = [truth[base_prompt_id(p)] for p in event.action.prompt_ids
                           for _ in range(cfg.n_samples_per_prompt)]
                return Done(event.action, type("Report", (), {"lengths": lengths})())
            return event
        self.cluster.next_event = next_event

    def check_action(self, a) -> None:
        if isinstance(a, Generate):
            again = a.minibatch_id in self.sent
            assert not again or a.minibatch_id in self.retried, f"minibatch id {a.minibatch_id} reused"
            assert self.sent.setdefault(a.minibatch_id, a.prompt_ids) == a.prompt_ids
        super().check_action(a)


def recorded(plan, returned: dict):
    """``plan`` (a planning function), also keeping what it returned for each epoch."""
    def plan_and_keep(epoch, old, observed):
        new, note = plan(epoch, old, observed)
        returned[epoch] = [(mb_id, tuple(ids)) for mb_id, ids in new]
        return new, note
    return plan_and_keep


def random_cut(seed: int):
    """A planning function that shuffles the epoch's prompts and cuts them at random (1 to
    5 prompts): the window rule refuses some of these, which the core must survive."""
    def plan(epoch, old, observed):
        rng = random.Random(seed * 31 + epoch)
        ids = [p for mb in old for p in mb]
        rng.shuffle(ids)
        cut, k = [], 0
        while k < len(ids):
            size = rng.randint(1, 5)
            cut.append((f"x{epoch}.{len(cut)}", tuple(ids[k:k + size])))
            k += size
        return cut, None
    return plan


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actors=st.integers(1, 3), batch=st.integers(1, 4), staleness=st.integers(1, 2), n=st.integers(1, 2),
       n_prompts=st.integers(4, 16), epochs=st.integers(2, 3), base=st.integers(2, 4), slack=st.integers(0, 1),
       planner=st.sampled_from(["asp", "sorted", "random cut"]), seed=st.integers(0, 2**16),
       weight=st.sampled_from([0.5, 4.0]), starve=st.sampled_from([0.0, 0.9]))
def test_replans_through_the_loop_keep_the_ledger_exact(actors, batch, staleness, n, n_prompts, epochs, base,
                                                        slack, planner, seed, weight, starve):
    """Every epoch the run reaches is tried once, just before its first minibatch goes
    (none of it dispatched yet), and taken or refused by the window rule; the core
    dispatches what the planning function returned (the real one over the real planner,
    or a random cut that the window rule often refuses); every epoch holds every prompt once
    (trained, or unused at Finish); no prompt or minibatch id goes out twice (but as a retry); the core
    recorded every sample's length."""
    rng = random.Random(seed)
    truth = {f"p{i}": rng.randint(1, 60) for i in range(n_prompts)}
    prior = {p: float(rng.randint(1, 60)) for p in truth}
    params = SchedulerParams(name="sorted" if planner == "random cut" else planner, base_batch_size=min(base, n_prompts), slack=slack, group_size=1)
    minibatches = repeat_for_epochs(make_plan(list(prior.items()), params, n), epochs)
    cfg = ControlConfig(num_actors=actors, global_batch_size=batch, n_samples_per_prompt=n, max_staleness=staleness,
                        queue_capacity=(batch + 2 * (base + slack)) * n, high_watermark=1.0, low_watermark=0.0)
    sizes = [len(ids) for _, ids in minibatches]
    assume(first_window_gap(sizes, batch, staleness, cfg.queue_capacity // n, sum(sizes) // batch) is None)
    rule = epoch_replan(lambda items: make_plan(items, params, n), prior, weight)
    returned: dict = {}
    rule = replace(rule, plan=recorded(random_cut(seed) if planner == "random cut" else rule.plan, returned))
    shell = RefitShell(cfg, minibatches, rule, truth,
                       random_chooser(seed, fail_rate=0.2, max_failures=3, starve=starve))
    shell.run_to_end()

    core = shell.core
    final = core.dispatcher.minibatches
    reached = {prompt_epoch(p) for mb in final[:core.dispatcher.cursor] for p in mb.prompt_ids}
    assert [r.epoch for r in core.replans] == sorted(reached - {0})
    event(f"re-plans taken {sum(r.accepted for r in core.replans)}, refused {sum(not r.accepted for r in core.replans)}")
    for r in core.replans:
        assert all(prompt_epoch(p) != r.epoch for mb in final[:r.dispatched_minibatches] for p in mb.prompt_ids)
        assert r.prompts == n_prompts
        now = [(mb.minibatch_id, mb.prompt_ids) for mb in final if prompt_epoch(mb.prompt_ids[0]) == r.epoch]
        if r.accepted:
            assert now == returned[r.epoch] and r.minibatches == len(now)
        else:
            assert "can never be filled" in r.error or "queue_capacity" in r.error, r.error
            assert now == [mb for mb in minibatches if prompt_epoch(mb[1][0]) == r.epoch]
    assert len({mb.minibatch_id for mb in final}) == len(final)
    # Each epoch holds every prompt exactly once: trained, or left unused at Finish (the
    # steps need fewer, or the last minibatches overshot; which epoch's is event order).
    f = shell.finish
    unused = [*f.not_dispatched, *f.queued, *f.running]
    for e in range(epochs):
        trained = [base_prompt_id(p) for p in core.consumed_ids() if prompt_epoch(p) == e]
        left = [base_prompt_id(p) for p in unused if prompt_epoch(p) == e]
        assert sorted(trained + left) == sorted(truth), f"epoch {e}"
    done = {p for k in core.dispatcher.done for p in final[k].prompt_ids}
    assert core.observed_lengths == {p: (truth[base_prompt_id(p)],) * n for p in done}



def report_lengths(cluster, truth, n) -> None:
    """Make ``cluster``'s finished generations report every sample's length (``truth``
    of its base prompt), keeping whatever else the event carries (rewards)."""
    plain_next = cluster.next_event

    def next_event():
        event = plain_next()
        if isinstance(event, Done) and isinstance(event.action, Generate):
            lengths = [truth[base_prompt_id(p)] for p in event.action.prompt_ids for _ in range(n)]
            return Done(event.action, type("Report", (), {"lengths": lengths})(), rewards=event.rewards)
        return event
    cluster.next_event = next_event


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actors=st.integers(1, 3), batch=st.integers(1, 4), staleness=st.integers(0, 2), n=st.integers(2, 3),
       n_prompts=st.integers(4, 12), base=st.integers(2, 4), seed=st.integers(0, 2**16),
       rate=st.sampled_from([0.2, 0.6]), cap=st.integers(1, 10))
def test_replans_with_dynamic_sampling_keep_the_ledger_exact(actors, batch, staleness, n, n_prompts, base, seed,
                                                               rate, cap):
    """With DAPO's dynamic sampling (rejected groups, refills past the plan, splits at
    quiescence) the rule re-plans every epoch the run reaches once, refill passes
    included; the ledger stays a partition of every prompt (rejected ones counted) after
    every event, and no minibatch id repeats."""
    rng = random.Random(seed)
    truth = {f"p{i}": rng.randint(1, 60) for i in range(n_prompts)}
    prior = {p: float(rng.randint(1, 60)) for p in truth}
    params = SchedulerParams(name="asp", base_batch_size=min(base, n_prompts), slack=1, group_size=1)
    minibatches = repeat_for_epochs(make_plan(list(prior.items()), params, n), 2)
    cfg = ControlConfig(num_actors=actors, global_batch_size=batch, n_samples_per_prompt=n, max_staleness=staleness,
                        queue_capacity=(batch + 2 * (base + 1)) * n, high_watermark=1.0, low_watermark=0.0,
                        total_steps=max(1, (2 * n_prompts) // batch - 1))
    refill = refill_passes(minibatches)
    shell = RejectShell(cfg, minibatches, chooser=random_chooser(seed, fail_rate=0.2, max_failures=2),
                        reject_rate=rate, max_rejections=cap, seed=seed, refill=refill)
    rule = epoch_replan(lambda items: make_plan(items, params, n), prior, 4.0)
    shell.core = ControlCore(shell.cfg, minibatches, refill=refill, replan=rule)
    shell.loop = Loop(shell.core, shell.cluster, shell)
    report_lengths(shell.cluster, truth, n)
    shell.run_to_end()

    core = shell.core
    final = core.dispatcher.minibatches
    reached = {prompt_epoch(p) for mb in final[:core.dispatcher.cursor] for p in mb.prompt_ids}
    event(f"refills {core.refills}, re-plans {len(core.replans)}")
    assert [r.epoch for r in core.replans] == sorted(reached - {0})
    assert all(r.accepted and r.prompts == n_prompts for r in core.replans)   # no window rule with filtering
    assert len({mb.minibatch_id for mb in final}) == len(final)
    done = {p for k in core.dispatcher.done for p in final[k].prompt_ids}
    assert core.observed_lengths == {p: (truth[base_prompt_id(p)],) * n for p in done}

def test_a_core_without_the_rule_keeps_no_lengths_and_never_replans():
    cfg = ControlConfig(num_actors=1, global_batch_size=1, n_samples_per_prompt=1, max_staleness=1,
                        queue_capacity=4)
    core = ControlCore(cfg, [("e0g0m0", ("p0",)), ("e1g0m0", ("p0@e1",))])
    (gen,) = [a for a in core.poll() if isinstance(a, Generate)]
    core.on_generated(gen.actor, gen.minibatch_id, None, [7])
    assert core.observed_lengths == {} and core.replans == []


# ---------------------------------------------------------------------- the simulator
SIM = ["experiment=table3_qwen3_30b_a3b_asp", "steps=6", "task.num_prompts=64", "sim.predictor_spearman=0.2"]


def generate_spans(run_dir) -> dict[str, int]:
    """Minibatch id -> tokens generated, from a run's timeline."""
    spans = [json.loads(x) for x in (run_dir / "timeline.jsonl").read_text().splitlines()]
    return {s["label"]: s["info"]["tokens"] for s in spans if s["kind"] == "generate"}


def test_asp_simulate_honours_scheduler_refit(tmp_path):
    """Three epochs of 64 prompts on a poor predictor (Spearman 0.2): with refit the core
    re-plans epochs 1 and 2 from the simulated lengths (plans that differ from the first,
    with less predicted padding), so the minibatches dispatched after epoch 0 hold other
    prompts than without refit, while epoch 0 runs the same; the files say so."""
    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.sim.run import simulate

    refit = simulate(load_config([*SIM, "scheduler.refit=history"]), tmp_path / "refit")
    plain = simulate(load_config(SIM), tmp_path / "plain")
    assert [(r["epoch"], r["accepted"]) for r in refit.replans] == [(1, True), (2, True)] and plain.replans == []
    saved = json.loads((tmp_path / "refit" / "sim_result.json").read_text())
    assert [r["epoch"] for r in saved["replans"]] == [1, 2]
    lines = [json.loads(x) for x in (tmp_path / "refit" / "replan.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines] == [1, 2] and all(r["accepted"] for r in lines)
    assert all(r["predicted_bubble_new_plan"] < r["predicted_bubble_old_order"] for r in lines)
    first = json.loads((tmp_path / "refit" / "plan.json").read_text())
    for e in (1, 2):
        plan = json.loads((tmp_path / "refit" / f"plan_e{e}.json").read_text())
        assert sorted(i for g in plan["groups"] for mb in g for i in mb["ids"]) == \
            sorted(i for g in first["groups"] for mb in g for i in mb["ids"])
        assert [mb["ids"] for g in plan["groups"] for mb in g] != [mb["ids"] for g in first["groups"] for mb in g]
    assert not (tmp_path / "plain" / "plan_e1.json").exists()
    report = json.loads((tmp_path / "refit" / "predictor_by_epoch.json").read_text())
    assert [e["replanned"] for e in report["epochs"]] == [False, True, True]
    ours, theirs = generate_spans(tmp_path / "refit"), generate_spans(tmp_path / "plain")
    epoch0 = {k for k in theirs if k.startswith("e0")}
    assert {k: ours[k] for k in epoch0} == {k: theirs[k] for k in epoch0}
    later = sorted(k for k in ours if not k.startswith("e0"))
    assert later and any(ours[k] != theirs.get(k) for k in later)


def test_a_resumed_run_does_not_replan_epochs_it_replanned_or_started(tmp_path):
    """``schedule/assembly``: the prior from the run's predicted_lengths.jsonl; epochs with a
    ``plan_e<e>.json`` and epochs of ids trained before are done; refit=none: no rule."""
    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.schedule.assembly import replan_rule, replanned_epochs, run_plan_lengths

    def refit_of_run(cfg, prompts, run_dir, taken=()):
        return replan_rule(cfg, run_plan_lengths(cfg, prompts, run_dir), taken, replanned_epochs(run_dir))

    (tmp_path / "predicted_lengths.jsonl").write_text(
        "".join(json.dumps({"id": f"p{i}", "predicted_length": 10.0 + i}) + "\n" for i in range(4)))
    (tmp_path / "plan_e2.json").write_text("{}")
    cfg = load_config(["scheduler.predictor=ridge", "scheduler.refit=history", "scheduler.refit_weight=2",
                       "scheduler.base_batch_size=1", "scheduler.slack=0", "scheduler.group_size=1"])
    rule = refit_of_run(cfg, [], tmp_path, taken=["p0", "p1@e1", "p3@e3"])
    assert rule.done == {0, 1, 2, 3} and rule.epoch_of("p2@e4") == 4
    assert refit_of_run(load_config(["scheduler.predictor=ridge"]), [], tmp_path) is None
    # The bound planning function blends with weight 2 on that prior: p1 seen at 20 -> (2 x 11 + 20) / 3.
    new, note = rule.plan(4, (("p0@e4", "p1@e4"),), {"p1@e1": (20,)})
    assert note["lengths"] == {"p0": 10.0, "p1": 14.0}
    assert sorted(p for _, ids in new for p in ids) == ["p0@e4", "p1@e4"]
    assert sorted(mb_id for mb_id, _ in new) == ["e4g0m0", "e4g1m0"]   # repeat_for_epochs' form
