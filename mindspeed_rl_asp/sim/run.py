"""One simulated run from a config: the same plan, core, observers and loop as ``asp-train``.

    workload  = the length model (or a recorded lengths file)       sim.*
    predicted = lengths of the configured rank quality               sim.predictor_spearman
    plan      = schedule/planning.plan_minibatches (the real planner) scheduler.*, mode.*
    core      = schedule/assembly.assemble_core (the real core, as    rl.*, mode.*, save_every
                asp-train builds it: its re-plan rule of scheduler.refit, its checkpoints)
    drive(core, SimCluster(costs from the profiles), observers)     hardware.*, model.*, engine.*, layout.*

With ``run_dir`` the observers are asp-train's (``schedule/assembly.assemble_observers``):
the real ``RunRecorder`` writes ``timeline.jsonl``, ``queue.jsonl`` and ``metrics.jsonl``
(``asp-report`` draws them), the real ``EpochReplanner`` the re-plans and the per-epoch
predictor report (``replan.jsonl``, ``plan_e<e>.json``, ``predictor_by_epoch.json``);
beside them ``SimStats`` gathers ``sim_result.json``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from ..control.core import Checkpoint, Generate, LoadWeights, Publish, TrainStep, is_colocated, prefetches
from ..control.loop import Done, Observer, drive
from ..control.policy_age import age_histogram, age_metrics, merge_age_histograms
from .batching import Instance, full_batch_token_rate, lone_sequence_time
from .cluster import SimCluster, SimSetup
from .costs import (gradient_sync_time, kv_capacity_tokens, load_bandwidth, offload_bytes_per_device, publish_time,
                    training_time)
from .profiles import (engine_profile_from_config, hardware_profile_from_config, model_profile_from_config,
                       require_hardware)
from .workload import LengthModel, Workload, plan_items, predict_lengths, replay_workload, sample_workload


def setup_from_config(cfg) -> SimSetup:
    """Profiles and layout -> what the cluster prices work with. Raises ``ProfileError``
    naming the key for a bad profile or an instance that cannot hold the model."""
    from ..config.placement import plan_placement

    model = model_profile_from_config(cfg.model)
    hardware = hardware_profile_from_config(cfg.hardware)
    engine = engine_profile_from_config(cfg.engine)
    layout = cfg.layout
    devices = layout.infer_instance_size
    sequence = cfg.rl.max_prompt_length + cfg.generate.sampling_config.max_tokens
    tp, ep = inference_parallel(cfg, devices, model.is_moe)
    instance = Instance(model, hardware, engine, devices,
                        kv_capacity_tokens(model, hardware, engine, devices, sequence), tp, ep)
    colocated = is_colocated(cfg.mode)
    placement = plan_placement(layout, cfg.mode.name)
    all_devices = layout.nodes * layout.devices_per_node
    link = hardware.intra_node_bandwidth if colocated else hardware.inter_node_bandwidth
    train_devices = trainer_devices(cfg, all_devices, colocated)
    needs = {}
    if engine.first_principles and (instance.parallel.tp > 1 or (model.is_moe and instance.parallel.ep > 1)):
        needs["intra_node_latency_us" if devices <= hardware.devices_per_node else "inter_node_latency_us"] = \
            "communication per decode layer (tensor / expert parallel instances)"
    train_tp, train_pp, train_ep = _train_parallel(cfg, train_devices)
    if engine.first_principles and train_devices // (train_tp * train_pp) > 1:
        needs["intra_node_latency_us" if train_devices <= hardware.devices_per_node else "inter_node_latency_us"] = \
            "the data-parallel gradient reduction"
    switch = engine.mode_switch
    if colocated and engine.hybrid_offload:
        needs["host_link_bandwidth_gbs"] = "hybrid offload / onload of the trainer's state"
    require_hardware(hardware, needs)
    if colocated and engine.hybrid_offload:
        switch += offload_bytes_per_device(model, train_devices, train_tp, train_pp, train_ep) / hardware.host_link_bandwidth
    grad_sync = (gradient_sync_time(model, hardware, train_devices, train_tp, train_pp, train_ep, engine.dp_comm_overlap)
                 if engine.first_principles else 0.0)
    return SimSetup(instance=instance, num_actors=len(placement.generators), train_devices=train_devices,
                    colocated=colocated, extra_forwards=extra_forwards(cfg, colocated), publish_s=publish_time(model, engine),
                    load_bandwidth=instance_load_bandwidth(cfg, hardware, engine, devices, link, colocated,
                                                           len(placement.generators)), switch_s=switch,
                    recompute=engine.recompute == "full", grad_sync_s=grad_sync, host_cores=hardware.host_cores,
                    corun_slowdown=hardware.corun_slowdown, timeslice_slowdown=hardware.timeslice_slowdown,
                    train_padding_rows=cfg.rl.micro_batch_size if engine.train_layout == "padded" else 0,
                    **prefetch_setup(cfg, model, hardware, engine, devices, link))


def prefetch_setup(cfg, model, hardware, engine, devices: int, link: float) -> dict:
    """What ``Prefetch`` costs (the collective transport with ``weights.prefetch``,
    ``control.core.prefetches``): a transfer moves the weight bytes into one instance over
    its own links (``devices x link``), capped by its share of the trainer's egress:
    ``weight_sync_senders x link`` shared by every transfer running at once (0 senders:
    the instances' links alone limit it); a load after a finished prefetch only copies the
    bytes into the engine: each device reads and writes its share once over HBM,
    ``2 x weight bytes / (devices x hbm_bandwidth)``. Without prefetch: nothing."""
    if not prefetches(cfg):
        return {}
    return {"prefetch": True, "ingress_bandwidth": devices * link,
            "trainer_egress": max(engine.weight_sync_senders, 0) * link,
            "swap_s": 2.0 * model.weight_bytes / (devices * hardware.hbm_bandwidth)}


def instance_load_bandwidth(cfg, hardware, engine, devices: int, link: float, colocated: bool, actors: int) -> float:
    """Bytes/s into one instance at a refresh. Colocated (hybrid), every device reshards
    its own shard over the node's links; decoupled, the trainer's ``weight_sync_senders``
    links feed the instances (``costs.load_bandwidth``), all of them at once under
    ``mode.refresh=global`` (every actor loads together, so each gets ``1 / actors`` of the
    sender), one at a time under rolling refresh (concurrent rolling loads are not
    modelled)."""
    if colocated:
        return devices * link
    concurrent = actors if cfg.mode.refresh == "global" else 1
    return load_bandwidth(hardware, engine, devices, link, concurrent)


def extra_forwards(cfg, colocated: bool) -> int:
    """No-grad passes per step besides the update. MindSpeed-RL's hybrid loop (engine=
    mindspeed, colocated) runs the reference forward every iteration, kl_coef or not
    (trainer/grpo_trainer_hybrid.py: ``compute_ref_log_prob`` unconditionally), and skips
    the old-policy forward when a step is one on-policy minibatch (its
    ``skip_actor_log_prob``: global batch x n == mini batch, one epoch). The project's own
    trainer (engine hf or vllm) computes the proximal log-probs only when its loss corrects
    for staleness (``algo.off_policy`` tis or decoupled, runtime/training_unit._train_batch;
    with ``none`` the behaviour log-probs stand in, as verl's fully async trainer does with
    its rollout log-probs). Otherwise: the old log-probs always. The reference ones with a
    KL term."""
    if colocated and cfg.engine.name == "mindspeed":
        return 1 + (cfg.rl.mini_batch_size != cfg.rl.global_batch_size)
    if cfg.engine.name in ("hf", "vllm"):
        return int(cfg.algo.off_policy in ("tis", "decoupled")) + (cfg.algo.kl_coef > 0)
    return 1 + (cfg.algo.kl_coef > 0)


def inference_parallel(cfg, devices: int, is_moe: bool) -> tuple[int, int]:
    """(tp, ep) of an inference instance from ``model.infer_*_parallel_size``; a size that
    does not divide the instance (or 0) falls back to the whole instance."""
    tp = int(cfg.model.infer_tensor_parallel_size or 0)
    ep = int(cfg.model.infer_expert_parallel_size or 0) if is_moe else 1
    tp = tp if 0 < tp <= devices and devices % tp == 0 else devices
    ep = ep if 0 < ep <= devices else devices
    return tp, (ep if is_moe else 1)


def _train_parallel(cfg, train_devices: int) -> tuple[int, int, int]:
    """(tp, pp, ep) of the trainer: the model's Megatron sizes for the mindspeed trainer
    (when they divide its devices), one device's worth for the hf trainer."""
    m = cfg.model
    tp, pp, ep = (int(m.tensor_model_parallel_size or 1), int(m.pipeline_model_parallel_size or 1),
                  int(m.expert_model_parallel_size or 1))
    if cfg.engine.name != "mindspeed" or train_devices % (tp * pp):
        return train_devices, 1, 1
    return tp, pp, ep


def trainer_devices(cfg, all_devices: int, colocated: bool) -> int:
    """Devices one training step runs on. The hf trainer runs ``train.ranks`` processes,
    one device each (config/placement; 1 by default, colocated or not); a Megatron
    (mindspeed) trainer spans the T nodes, or every device when colocated."""
    if cfg.engine.name in ("hf", "vllm"):   # vllm generates; its trainer is the hf one
        from ..config.placement import trainer_ranks

        return trainer_ranks(cfg.train.ranks, cfg.layout, cfg.mode.name)
    return all_devices if colocated else cfg.layout.train_nodes * cfg.layout.devices_per_node


def length_model_from_config(sim, max_prompt_length: int) -> LengthModel:
    return LengthModel(median_response_length=sim.median_response_length, sigma_prompt=sim.sigma_prompt,
                       sigma_sample=sim.sigma_sample, runaway_probability=sim.runaway_probability,
                       prompt_length_median=sim.prompt_length_median, prompt_length_sigma=sim.prompt_length_sigma,
                       min_prompt_length=sim.min_prompt_length, max_prompt_length=max_prompt_length)


def workload_from_config(cfg) -> Workload:
    n, max_tokens = cfg.rl.n_samples_per_prompt, cfg.generate.sampling_config.max_tokens
    if cfg.sim.lengths_file:
        return replay_workload(cfg.sim.lengths_file, n_samples_per_prompt=n, max_tokens=max_tokens, seed=cfg.sim.seed)
    return sample_workload(length_model_from_config(cfg.sim, cfg.rl.max_prompt_length), cfg.task.num_prompts,
                           n, max_tokens, seed=cfg.sim.seed)


class SimStats(Observer):
    """What a study needs from a run, without writing files: per-step publish times,
    busy time per lane, tokens generated, time-weighted queue occupancy, policy ages."""

    def __init__(self, num_actors: int) -> None:
        self.step_end: list[float] = []
        self.train_busy = 0.0
        self.gen_busy = [0.0] * num_actors
        self.tokens = 0
        self.step_lengths: list[tuple[int, int, int, int]] = []  # (samples, trained tokens, max prompt, max response)
        self.ages: dict[int, int] = {}
        self.queue_area = 0.0
        self.queue_max = 0
        self._queue_level = 0
        self._last_t = 0.0
        self._issued: dict = {}
        self.checkpoints: list[int] = []   # versions checkpointed (save_every), in order

    def submitted(self, action, t) -> None:
        self._issued[action] = t

    def observed(self, event, core, t) -> None:
        action = event.action
        start = self._issued.pop(action, t)
        if isinstance(event, Done):
            if isinstance(action, Generate):
                self.gen_busy[action.actor] += t - start
                self.tokens += sum(event.info.lengths)
            elif isinstance(action, LoadWeights):
                self.gen_busy[action.actor] += t - start
            elif isinstance(action, TrainStep):
                self.train_busy += t - start
                m = getattr(event.info, "metrics", None) or {}
                if "trained_tokens" in m:
                    self.step_lengths.append((m["samples"], m["trained_tokens"], m.get("prompt_length_max", 0),
                                              m.get("response_length_max", 0)))
                self.ages = merge_age_histograms(self.ages, age_histogram(action.step, action.versions))
            elif isinstance(action, Publish):
                self.train_busy += t - start
                self.step_end.append(t)
            elif isinstance(action, Checkpoint):
                self.train_busy += t - start
                self.checkpoints.append(action.version)
        self.queue_area += self._queue_level * (t - self._last_t)
        self._last_t = t
        self._queue_level = core.snapshot().queued_samples
        self.queue_max = max(self.queue_max, self._queue_level)


@dataclass
class SimResult:
    """One simulated run. Times in seconds; ``tokens_per_s_per_*``: generated response
    tokens per second of the whole run per device, with three device counts (the paper
    does not say which it uses, docs/reproduce_table3.md): the generation devices
    (``gen``: all of them in hybrid), every device of the layout (``device``), and the
    generation devices' busy time only (``gen_busy``)."""

    mode: str
    scheduler: str
    steps: int
    total_s: float
    iteration_s: float
    iteration_times: list[float]
    lower_bound_s: float
    generation_bound_s: float
    training_bound_s: float
    tokens: int
    tokens_per_s_per_gen_device: float
    tokens_per_s_per_device: float
    tokens_per_s_per_gen_device_busy: float
    generation_idle: float
    trainer_idle: float
    policy_age_mean: float
    policy_age_hist: dict[int, int]
    queue_mean_samples: float
    queue_max_samples: int
    padding_bubble: float
    slot_bubble: float
    tail_share: float
    num_actors: int
    gen_devices: int
    train_devices: int
    devices: int
    at_finish: dict = field(default_factory=dict)
    dynamic_sampling: dict = field(default_factory=dict)
    checkpoints: list = field(default_factory=list)   # versions the core checkpointed (save_every)
    # MindSpeed-RL's own throughput (mindspeed_rl/utils/utils.compute_tps, its default
    # log_max_throughput=True): (max prompt + max response length) x samples of a step over
    # world size and the step's time, world = every device of the layout; ``_mean``: with
    # mean lengths (log_max_throughput=False); ``vllm``: over the rollout time instead
    # (the busiest generation instance's busy time).
    mindspeed_e2e_tps: float = 0.0
    mindspeed_e2e_tps_mean: float = 0.0
    mindspeed_vllm_tps: float = 0.0
    # The tail: each step's longest response decoded alone, over the pipeline depth the
    # staleness bound allows (max_staleness + 1 steps in flight); ``bound_by`` says which
    # of the zero-bubble bound and this one is larger.
    latency_bound_s: float = 0.0
    bound_by: str = ""
    # scheduler.refit: each re-plan the core made (epoch, taken, minibatches dispatched then).
    replans: list = field(default_factory=list)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["policy_age_hist"] = {str(k): v for k, v in self.policy_age_hist.items()}
        return out


def lower_bounds(cfg, setup: SimSetup, workload: Workload) -> tuple[float, float, float]:
    """(iteration lower bound, generation bound, training bound): the iteration time
    with zero bubbles. Generation bound: a step's response tokens over every instance
    running a full batch (``batching.full_batch_token_rate``); training bound: the
    step's training and publish time. Async overlaps the two (the larger binds); hybrid
    runs them one after the other on the same devices, with both switches and a load."""
    step_prompts = cfg.rl.global_batch_size
    prompts = workload.prompts
    mean_prompt = sum(p.prompt_length for p in prompts) / len(prompts)
    mean_response = workload.total_response_tokens / workload.num_samples
    samples = step_prompts * cfg.rl.n_samples_per_prompt
    rate = setup.num_actors * full_batch_token_rate(setup.instance, mean_prompt, mean_response)
    generation = samples * mean_response / rate
    inst = setup.instance
    mean_square = sum((p.prompt_length + r) ** 2 for p in prompts for r in p.response_lengths) / workload.num_samples
    training = training_time(inst.model, inst.hardware, setup.train_devices,
                             round(samples * (mean_prompt + mean_response)), setup.extra_forwards,
                             samples * mean_square, setup.recompute) + setup.grad_sync_s + setup.publish_s
    if setup.colocated:
        return generation + training + 2 * setup.switch_s + setup.load_s(), generation, training
    return max(generation, training), generation, training


def simulate(cfg, run_dir: Optional[Path] = None, workload: Optional[Workload] = None,
             predicted: Optional[Mapping[str, float]] = None) -> SimResult:
    """Simulate ``cfg.steps`` steps of the configured run; see the module docstring.
    ``predicted`` (prompt id -> length) replaces the predictions of rank quality
    ``sim.predictor_spearman``: e.g. the lengths a real run's predictor gave its planner."""
    from ..schedule.assembly import PlanLengths, assemble_core, assemble_observers, generation_devices
    from ..schedule.planning import plan_minibatches
    from ..tasks import epochs_needed

    setup = setup_from_config(cfg)
    workload = workload or workload_from_config(cfg)
    if predicted is None:
        quality = "oracle" if cfg.sim.predictor_spearman is None else cfg.sim.predictor_spearman
        predicted = predict_lengths(workload, quality, seed=cfg.sim.seed)
    epochs = epochs_needed(workload.num_prompts, cfg.steps, cfg.rl.global_batch_size)
    items = plan_items(workload, predicted)
    plan, minibatches = plan_minibatches(cfg, items, epochs)
    plan_lengths = PlanLengths(dict(items), "simulated")   # what a real run reads from its run directory
    core = assemble_core(cfg, minibatches, plan_lengths, setup.num_actors)
    cluster = SimCluster(setup, {p.id: p for p in workload.prompts}, rewards=sim_rewards(cfg))
    stats = SimStats(setup.num_actors)
    observers = None
    if run_dir is not None:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        plan.save(run_dir / "plan.json")
        observers = assemble_observers(cfg, run_dir, setup.num_actors, plan_lengths, start=0.0, tensorboard=False)
    try:
        outcome = drive(core, cluster, stats if observers is None else observers.fanout(stats))
    finally:
        if observers is not None:
            observers.close()
    layout = cfg.layout
    devices = layout.nodes * layout.devices_per_node
    result = _result(cfg, setup, workload, stats, cluster, outcome, devices, generation_devices(cfg), core)
    if run_dir is not None:
        (run_dir / "sim_result.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return result


def sim_rewards(cfg):
    """The simulated rewards (``sim/rewards.py``): always drawn, so that a run's effective
    tokens (those of groups with a reward spread) are known; the core's reject rule reads
    them only with ``algo.filter_groups`` on."""
    from .rewards import reward_source

    return reward_source(cfg.rl.n_samples_per_prompt, cfg.sim.solve_rate, cfg.sim.solve_concentration, cfg.sim.seed)


def dynamic_sampling_result(cfg, core, cluster: SimCluster, outcome, total_s: float = 0.0) -> dict:
    """What dynamic sampling did: groups rejected, minibatches generated in all and to make
    up for rejections, the prompt ledger (dispatched = consumed + rejected + unused), and
    the effective tokens (response tokens trained in groups whose simulated rewards have a
    spread, the only ones with a GRPO signal) in all and per second of the run."""
    snap, finish = core.snapshot(), outcome.finish
    return {"filter_groups": cfg.algo.filter_groups, "rejected_groups": snap.rejected_prompts,
            "effective_tokens": cluster.effective_tokens,
            "effective_tokens_per_s": cluster.effective_tokens / total_s if total_s else 0.0,
            "extra_minibatches": snap.extra_minibatches, "generated_minibatches": len(cluster.timings),
            "dispatched_prompts": cluster.dispatched_prompts, "consumed_prompts": len(core.consumed_ids()),
            "unused_prompts": len(finish.queued) + len(finish.running) if finish else 0}


def _result(cfg, setup, workload, stats: SimStats, cluster: SimCluster, outcome, devices, gen_devices,
            core) -> SimResult:
    ends = stats.step_end
    total = ends[-1] if ends else 0.0
    iterations = [b - a for a, b in zip([0.0] + ends[:-1], ends)]
    timings = list(cluster.timings.values())
    busy = sum(stats.gen_busy)
    per_instance = setup.instance.devices
    bound, gen_bound, train_bound = lower_bounds(cfg, setup, workload)
    padded = sum(t.capacity * t.decode_steps for t in timings)
    world = devices
    max_tokens = sum(n * (p + r) for n, _, p, r in stats.step_lengths)
    mean_tokens = sum(tok for _, tok, _, _ in stats.step_lengths)
    rollout = max(stats.gen_busy, default=0.0)
    depth = cfg.mode.max_staleness + 1
    latency = (sum(lone_sequence_time(setup.instance, p, r) for _, _, p, r in stats.step_lengths)
               / max(len(stats.step_lengths), 1) / depth)
    return SimResult(
        mode=cfg.mode.name, scheduler=cfg.scheduler.name, steps=len(ends), total_s=total,
        iteration_s=total / max(len(ends), 1), iteration_times=iterations,
        lower_bound_s=bound, generation_bound_s=gen_bound, training_bound_s=train_bound,
        tokens=stats.tokens,
        tokens_per_s_per_gen_device=stats.tokens / total / gen_devices if total else 0.0,
        tokens_per_s_per_device=stats.tokens / total / devices if total else 0.0,
        tokens_per_s_per_gen_device_busy=stats.tokens / (busy * per_instance) if busy else 0.0,
        generation_idle=1.0 - busy / (total * setup.num_actors) if total else 0.0,
        trainer_idle=1.0 - stats.train_busy / total if total else 0.0,
        policy_age_mean=age_metrics(stats.ages)["policy_age_mean"],
        policy_age_hist=stats.ages,
        queue_mean_samples=stats.queue_area / total if total else 0.0, queue_max_samples=stats.queue_max,
        padding_bubble=_weighted(timings, "slot_bubble", lambda t: t.capacity * t.decode_steps, padded)
        if setup.instance.engine.batching == "static" else 0.0,
        slot_bubble=_weighted(timings, "slot_bubble", lambda t: t.capacity * t.decode_steps, padded),
        tail_share=sum(t.tail_s for t in timings) / max(sum(t.duration for t in timings), 1e-12),
        num_actors=setup.num_actors, gen_devices=gen_devices, train_devices=setup.train_devices, devices=devices,
        at_finish=outcome.summary(),
        mindspeed_e2e_tps=max_tokens / world / total if total else 0.0,
        mindspeed_e2e_tps_mean=mean_tokens / world / total if total else 0.0,
        mindspeed_vllm_tps=max_tokens / world / rollout if rollout else 0.0,
        latency_bound_s=latency, bound_by="tail" if latency > bound else "throughput",
        replans=[{"epoch": r.epoch, "accepted": r.accepted, "dispatched_minibatches": r.dispatched_minibatches,
                  "minibatches": r.minibatches} for r in core.replans],
        dynamic_sampling=dynamic_sampling_result(cfg, core, cluster, outcome, total),
        checkpoints=list(stats.checkpoints))


def _weighted(timings, attr: str, weight, total_weight: float) -> float:
    if not total_weight:
        return 0.0
    return sum(getattr(t, attr) * weight(t) for t in timings) / total_weight
