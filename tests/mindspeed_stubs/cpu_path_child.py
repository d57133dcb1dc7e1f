"""engine=mindspeed through MindSpeed-RL's own orchestration on CPU (engine.mindspeed_workers=cpu),
checked in a child process (all_checks_child.py, after the contract's checks; see
tests/mindspeed_child.py) for tests/test_mindspeed_contract.py::test_cpu_path.

Each check pins one failure the path had before (issue 16) or a guarantee it gives now:
the job composed with its Hydra defaults, MindSpeed-RL's config classes built from
DictConfigs and validated by its validate_rl_args, its KL controller, a RayActorGroup of
integrated workers on ASP's placement groups, and one stale batch through the CPU workers
(MindSpeed-RL's loss) equal in loss and gradient to the hf engine with this project's TIS
loss. The Ray they run on (all_checks_child.start_ray) offers one logical NPU.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

from child_checks import Checks, expect

ROOT = Path(__file__).resolve().parents[2]
TINY_JOB = ROOT / "configs" / "mindspeed_rl" / "grpo_tiny_cpu.yaml"
TINY_MODEL = ROOT / "mindspeed_rl_asp" / "assets" / "tiny-maze-qwen3"
check = Checks()


def tiny_configs(t_devices=1):
    from mindspeed_rl_asp.integrations.mindspeed import job as jobs

    return jobs.build_job(jobs.fit_job_to_t_side(jobs.compose_job(TINY_JOB), t_devices, "cpu"))


# ----------------------------------------------------------------------------- configs
@check
def job_composes_with_its_model_group():
    """Before: the YAML was read with OmegaConf.load, so `defaults: - model:` never resolved
    and MegatronConfig got model=None."""
    from mindspeed_rl_asp.integrations.mindspeed.job import compose_job

    job = compose_job(TINY_JOB)
    expect("tiny_maze_qwen3" in job.model, f"model group not composed: {list(job.get('model', {}))}")
    actor = tiny_configs()["actor_config"]
    expect((actor.num_layers, actor.hidden_size) == (4, 128), f"architecture {actor.num_layers}, {actor.hidden_size}")
    checkout = Path(os.environ["MINDSPEED_RL_CHECKOUT"])
    shipped = compose_job(checkout / "configs" / "grpo_qwen25_7b_A3.yaml")
    expect(shipped.model.qwen25_7b.num_layers == 28, "a shipped job's model group (qwen25_7b) composes")


@check
def rl_config_is_what_its_launcher_reads():
    """Before: RLConfig got a plain dict, and get_npu_deployment (which RayActorGroup calls)
    failed on it; the reference was a ReferenceWorker group with reference_resource None."""
    from mindspeed_rl.workers.integrated_worker import IntegratedWorker
    from mindspeed_rl.workers.scheduler.launcher import get_npu_deployment

    from mindspeed_rl_asp.integrations.mindspeed.cpu_workers import cpu_worker_class

    rl = tiny_configs(t_devices=1)["rl_config"]
    expect(rl.use_integrated_worker is True, "one integrated worker (actor + reference)")
    expect(get_npu_deployment(rl, IntegratedWorker) == 1, "MindSpeed-RL's IntegratedWorker gets the T devices")
    expect(get_npu_deployment(rl, cpu_worker_class()) == 1, "the cpu worker is found by MindSpeed-RL's name lookup")


@check
def validate_rl_args_sets_the_dispatch_sizes():
    """Before: validate_rl_args was never called and the dispatch sizes stayed None."""
    rl = tiny_configs()["rl_config"]
    sizes = (rl.actor_logprob_dispatch_size, rl.ref_dispatch_size, rl.actor_update_dispatch_size)
    expect(all(isinstance(s, int) and s > 0 for s in sizes), f"dispatch sizes {sizes}")
    expect(rl.mini_batch_size == 8 * 4, f"mini_batch_size in samples (8 prompts x 4): {rl.mini_batch_size}")


@check
def job_errors_name_the_key():
    from mindspeed_rl_asp.integrations.mindspeed import job as jobs

    composed = jobs.compose_job(TINY_JOB, ("+rl_config.use_integrated_worker=false",))
    try:
        jobs.fit_job_to_t_side(composed, 1)
    except jobs.MindSpeedJobError as error:
        expect("rl_config.use_integrated_worker" in str(error), str(error))
    else:
        raise AssertionError("use_integrated_worker=false was accepted")
    composed = jobs.fit_job_to_t_side(jobs.compose_job(TINY_JOB), 1, "cpu")
    composed.actor_config.micro_batch_size = 7   # does not divide the mini-batch
    try:
        jobs.build_job(composed)
    except jobs.MindSpeedJobError as error:
        expect("MindSpeed-RL refused the job" in str(error), str(error))
    else:
        raise AssertionError("MindSpeed-RL's validate_rl_args accepted micro_batch_size=7")


@check
def kl_controller_is_mindspeed_rls():
    """Before: update() got kl_ctrl=None while MindSpeed-RL's loss reads kl_ctrl.value."""
    from mindspeed_rl.trainer.utils.compute_utils import AdaptiveKLController, FixedKLController

    from mindspeed_rl_asp.integrations.mindspeed.job import make_kl_controller

    fixed = make_kl_controller(SimpleNamespace(kl_ctrl_type="fixed", init_kl_coef=0.02))
    expect(isinstance(fixed, FixedKLController) and fixed.value == 0.02, "fixed controller")
    adaptive = make_kl_controller(SimpleNamespace(kl_ctrl_type="adaptive", init_kl_coef=0.1, kl_target=6.0,
                                                  kl_horizon=100))
    expect(isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.1, "adaptive controller")


# ----------------------------------------------------------------------------- the worker group
def stale_batch(engine_cfg_model, seed=0):
    """Eight samples of tiny-maze prompts whose behaviour log-probs are 0.0 .. 1.0 nats away
    from the trainer's (stale: some importance weights above the cap of 2)."""
    import torch

    from mindspeed_rl_asp.engines.base import TrainBatch
    from mindspeed_rl_asp.engines.hf import HFTrainingEngine

    generator = torch.Generator().manual_seed(seed)
    prompts = [[int(t) for t in torch.randint(5, 60, (4 + i % 3,), generator=generator)] for i in range(8)]
    responses = [[int(t) for t in torch.randint(5, 60, (3 + (i * 5) % 7,), generator=generator)] for i in range(8)]
    proximal = HFTrainingEngine(str(TINY_MODEL)).logprobs(prompts, responses)
    behaviour = [[p + float(torch.rand((), generator=generator)) * 2 - 1 for p in row] for row in proximal]
    advantages = [float(x) for x in torch.randn(8, generator=generator)]
    return TrainBatch(prompts, responses, {"advantages": advantages, "behaviour_logprobs": behaviour,
                                           "proximal_logprobs": proximal})


def mindspeed_engine():
    from mindspeed_rl_asp.integrations.mindspeed.engine import MindSpeedTrainingEngine

    cfg = SimpleNamespace(mindspeed_config=str(TINY_JOB), mindspeed_workers="cpu", dtype="float32", num_threads=1,
                          device="cpu")
    return MindSpeedTrainingEngine(cfg, str(TINY_MODEL), temperature=1.0, bundles=[[{"NPU": 1.0}]])


STATE = {}


@check
def worker_group_is_placed_on_asps_groups():
    """Before: RayActorGroup(placement_group=None) built its own STRICT_PACK groups over
    devices ASP's actors hold (it would wait forever)."""
    engine = mindspeed_engine()
    STATE["engine"] = engine
    expect(engine.actor.placement_group is engine.placement_groups, "RayActorGroup keeps ASP's placement groups")
    expect(len(engine.actor.actor_handlers) == 1, f"{len(engine.actor.actor_handlers)} worker ranks")


@check
def stale_batch_equals_the_hf_engine():
    """One stale batch: MindSpeed-RL's loss in the cpu workers, with the truncated importance
    weights folded into the advantages, gives this project's TIS loss and gradient."""
    import torch

    from mindspeed_rl_asp.algo.grpo import GRPOLossConfig, make_loss_fn
    from mindspeed_rl_asp.engines.hf import HFTrainingEngine

    engine = STATE["engine"]
    batch = stale_batch(TINY_MODEL)
    cfg = GRPOLossConfig(off_policy="tis", tis_cap=2.0, clip_ratio_low=0.2, clip_ratio_high=0.2)
    weights = [math.exp(p - b) for rp, rb in zip(batch.extras["proximal_logprobs"], batch.extras["behaviour_logprobs"])
               for p, b in zip(rp, rb)]
    expect(max(weights) > 2.0 and min(weights) < 1.0, "the batch is stale both ways and reaches the cap")
    engine.configure_loss(cfg)
    ours = engine.train_step(batch)
    grads = engine.actor.execute_sync_command("parameter_grads")[0]
    hf = HFTrainingEngine(str(TINY_MODEL), lr=3e-5, micro_batch_size=8, temperature=1.0)
    theirs = hf.train_step(batch, make_loss_fn(cfg))
    expect(math.isclose(ours["mindspeed_pg_loss"], theirs["loss"], rel_tol=1e-5, abs_tol=1e-7),
           f"loss {ours['mindspeed_pg_loss']} vs {theirs['loss']}")
    worst = max(float((grads[n] - p.grad).abs().max()) for n, p in hf.model.named_parameters())
    scale = max(float(p.grad.abs().max()) for p in hf.model.parameters())
    expect(worst <= 1e-5 * scale, f"gradients differ by {worst} (largest gradient {scale})")
    STATE["tis_loss"] = ours["mindspeed_pg_loss"]
    STATE["grads"] = {k: v for k, v in grads.items()}


@check
def dropping_the_weights_changes_the_loss():
    """The previous path (proximal as old_log_prob, advantages unweighted) is not the TIS
    loss: the equality above can fail."""
    from mindspeed_rl_asp.integrations.mindspeed.engine import importance_weighted_advantages
    from mindspeed_rl_asp.engines.hf import HFTrainingEngine
    from mindspeed_rl_asp.algo.grpo import GRPOLossConfig, make_loss_fn

    batch = stale_batch(TINY_MODEL)
    old, unweighted = importance_weighted_advantages(batch.extras["advantages"], batch.extras["proximal_logprobs"],
                                                     None, None)
    batch.extras["behaviour_logprobs"] = old   # what the old glue computed: ratio vs proximal, no weight
    del batch.extras["proximal_logprobs"]
    hf = HFTrainingEngine(str(TINY_MODEL), lr=3e-5, micro_batch_size=8, temperature=1.0)
    plain = hf.train_step(batch, make_loss_fn(GRPOLossConfig(off_policy="none")))["loss"]
    expect(abs(plain - STATE["tis_loss"]) > 1e-3 * abs(STATE["tis_loss"]), f"{plain} vs TIS {STATE['tis_loss']}")


@check
def update_without_a_kl_controller_is_refused():
    import ray

    engine = STATE["engine"]
    try:
        ray.get(engine.actor.actor_handlers[0].update.remote(None, False))
    except Exception as error:  # noqa: BLE001 - a RayTaskError wrapping the worker's error
        expect("kl_ctrl" in str(error), str(error)[-500:])
    else:
        raise AssertionError("update(kl_ctrl=None) ran")


@check
def weights_come_back_through_the_megatron_map():
    """asp_state_dict gives Megatron names; the engine maps them back to the hf engine's
    tensors exactly."""
    import torch

    engine = STATE["engine"]
    exported = engine.state_tensors()
    held = engine.actor.execute_sync_command("hf_state_dict")[0]
    # The tiny policy ties lm_head to the embedding: Megatron has no output layer then, and
    # neither has the export (the loaders tie it again).
    expect(json.loads((TINY_MODEL / "config.json").read_text())["tie_word_embeddings"], "tied")
    expect(torch.equal(held.pop("lm_head.weight"), held["model.embed_tokens.weight"]), "lm_head is the embedding")
    expect(sorted(exported) == sorted(held), f"names: only exported {sorted(set(exported) - set(held))[:4]}, "
                                             f"only held {sorted(set(held) - set(exported))[:4]}")
    expect(all(torch.equal(exported[k], held[k]) for k in held), "the same values")

