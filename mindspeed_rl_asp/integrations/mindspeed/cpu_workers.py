"""``engine.mindspeed_workers=cpu``: the methods of MindSpeed-RL's ``IntegratedWorker``
(actor + reference in one) over this project's hf engine, so that MindSpeed-RL's own
orchestration runs on a machine without NPUs: its config classes and ``validate_rl_args``,
``RayActorGroup`` placing these workers on (logical) ``NPU`` bundles of ASP's placement
groups, the ``GRPOTransferDock`` every stage reads from and writes to, its KL controller
and its GRPO loss. Only the model work is the hf engine's instead of Megatron's.

What each method does, as MindSpeed-RL's worker does it (``workers/actor_hybrid_worker.py``,
``integrated_worker.py``, read, not copied):

=========================  ===================================================================
method                     reads (consumer: columns) -> writes
=========================  ===================================================================
``compute_log_prob``       ``actor_log_prob``: input_ids, responses, response_length,
                           prompt_length -> ``old_log_prob`` (the trainer's current weights)
``compute_ref_log_prob``   ``ref_log_prob``: same -> ``ref_log_prob`` (the frozen start)
``update(kl_ctrl, skip)``  ``actor_train``: responses, advantages, old_log_prob, ref_log_prob,
                           input_ids, response_length, prompt_length -> one optimizer step per
                           ``rl_config.mini_batch_size`` samples; the loss is MindSpeed-RL's
                           ``GRPOActorLossFunc._compute_grpo_policy_loss`` (clip_ratio,
                           kl_ctrl.value, kl_penalty) on the hf model's log-probs, averaged
                           over equal micro-batches as Megatron's forward-backward does
``asp_state_dict``         this rank's weights in Megatron's names (weight_map.hf_to_megatron),
                           which the engine maps back with megatron_to_hf, as on NPUs
=========================  ===================================================================

One rank only (a data-parallel CPU group is not built): a T side of more than one device
is refused with the key to change. The hf engine computes in ``engine.dtype`` (float32 on
CPU) whatever ``megatron_training.bf16`` says (MindSpeed-RL requires bf16 of its NPU
workers); the learning rate is constant (``lr_decay_style: constant``, else refused), and
``entropy_coeff`` must be 0 (the hf engine returns no logits to take an entropy of).
Generation stays on ASP's Generation Units (the hf engine on CPU); this worker's
``generate_sequences`` is not built.
"""
from __future__ import annotations

import os
import socket
import time

__all__ = ["CPUIntegratedWorker", "cpu_worker_class", "micro_batch_loss"]

ROLLOUT_COLUMNS = ["input_ids", "responses", "response_length", "prompt_length"]
TRAIN_COLUMNS = ["responses", "advantages", "old_log_prob", "ref_log_prob", "input_ids", "response_length",
                 "prompt_length"]


def _dock(td, method: str, **kwargs):
    """A dock call: the Ray actor (MindSpeed-RL's) or an in-process dock (tests)."""
    bound = getattr(td, method)
    if hasattr(bound, "remote"):
        import ray

        return ray.get(bound.remote(**kwargs))
    return bound(**kwargs)


def _rows_of(batch: dict) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, response ids) per row of a padded dock batch."""
    prompts, responses = [], []
    for i in range(len(batch["input_ids"])):
        p = int(batch["prompt_length"][i].reshape(-1)[0])
        r = int(batch["response_length"][i].reshape(-1)[0])
        prompts.append(batch["input_ids"][i][:p].tolist())
        responses.append(batch["responses"][i][:r].tolist())
    return prompts, responses


def _divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of ``n`` that is <= ``cap`` (the dock reads ``n`` rows in equal reads)."""
    return max(d for d in range(1, max(1, min(n, cap)) + 1) if n % d == 0)


def micro_batch_loss(values, mask, old, advantages, ref, clip_ratio: float, kl_ctrl, kl_penalty: str):
    """MindSpeed-RL's GRPO policy loss of one micro-batch, on padded ``[B, T]`` tensors
    (``values`` differentiable; the rest per token). Masked positions are zeroed first so
    that padding never reaches exp()."""
    import torch
    from mindspeed_rl.models.loss.grpo_actor_loss_func import GRPOActorLossFunc

    mask_f = mask.to(values.dtype)
    zero = torch.zeros_like(values)
    values = torch.where(mask, values, zero)
    old, advantages, ref = (torch.where(mask, t.to(values.dtype), zero) for t in (old, advantages, ref))
    pg_loss, clipfrac, ppo_kl, kl_loss, _ = GRPOActorLossFunc._compute_grpo_policy_loss(
        old_log_prob=old, log_prob=values, ref_log_prob=ref, advantages=advantages, entropy=zero, eos_mask=mask_f,
        cliprange=clip_ratio, kl_ctrl=kl_ctrl, kl_penalty=kl_penalty, entropy_coeff=0.0)
    return pg_loss, {"actor/pg_loss": float(pg_loss.detach()), "actor/pg_clipfrac": float(clipfrac),
                     "actor/ppo_kl": float(ppo_kl), "actor/kl_loss": float(kl_loss)}


class CPUIntegratedWorker:
    """MindSpeed-RL's IntegratedWorker methods over the hf engine (see the module docstring).
    The constructor takes what ``RayActorGroup.create_actor_handlers`` passes; ASP adds
    ``asp_model_path`` / ``asp_reference_path`` / ``asp_dtype`` / ``asp_threads`` /
    ``asp_temperature`` through the group's keyword arguments."""

    def __init__(self, megatron_config, rl_config, generate_config, model_provider=None, get_megatron_module=None,
                 initialize_func=None, profiler_config=None, msprobe_config=None, tokenizer=None,
                 asp_model_path: str = "", asp_reference_path: str = "", asp_dtype: str = "float32",
                 asp_threads: int = 1, asp_temperature: float = 1.0, **kwargs):
        from .job import MindSpeedJobError

        self.megatron_config, self.rl_config, self.generate_config = megatron_config, rl_config, generate_config
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.rank = int(os.environ.get("RANK", 0))
        if self.world_size != 1:
            raise MindSpeedJobError(f"engine.mindspeed_workers=cpu runs one worker rank; the Training Unit has "
                                    f"{self.world_size} devices: use a layout with one T device "
                                    "(layout.train_nodes=1 layout.devices_per_node=1), or mindspeed_workers=npu")
        if getattr(megatron_config, "lr_decay_style", "constant") != "constant":
            raise MindSpeedJobError(f"actor_config.lr_decay_style={megatron_config.lr_decay_style!r}: the cpu "
                                    "workers train at a constant learning rate; set it to constant")
        if float(getattr(rl_config, "entropy_coeff", 0.0) or 0.0) != 0.0:
            raise MindSpeedJobError(f"rl_config.entropy_coeff={rl_config.entropy_coeff}: the cpu workers have no "
                                    "entropy term; set it to 0")
        self.paths = (asp_model_path or megatron_config.tokenizer_name_or_path,
                      asp_reference_path or asp_model_path or megatron_config.tokenizer_name_or_path)
        self.dtype, self.threads, self.temperature = asp_dtype, asp_threads, asp_temperature
        # RayActorGroup asks rank 0 for the rendezvous address of the others (there are none).
        try:
            self.master = (socket.gethostbyname(socket.gethostname()), 0)
        except OSError:   # a host whose name does not resolve: one rank needs no rendezvous
            self.master = ("127.0.0.1", 0)
        self.engine = self.reference = self.td = None
        self.iteration = 0
        self.consumed_train_samples = 0

    # ------------------------------------------------------------------ group plumbing
    def get_master_addr_port(self):
        return self.master

    def initialize(self):
        from ...engines.hf import HFTrainingEngine

        cfg = self.megatron_config
        self.engine = HFTrainingEngine(self.paths[0], "cpu", self.dtype, self.threads, lr=cfg.lr,
                                       weight_decay=cfg.weight_decay, clip_grad=cfg.clip_grad,
                                       micro_batch_size=cfg.micro_batch_size, temperature=self.temperature,
                                       betas=(cfg.adam_beta1, cfg.adam_beta2))

    def init_transfer_dock(self, td, mm_td=None, sampling_transfer_dock=None, mm_sampling_transfer_dock=None):
        self.td = td

    def get_iteration(self) -> int:
        return self.iteration

    def get_consumed_train_samples(self) -> int:
        return self.consumed_train_samples

    def enter_infer_mode(self):
        pass

    def exit_infer_mode(self):
        pass

    # ------------------------------------------------------------------ stages
    def _read(self, consumer: str, columns: list[str], cap: int):
        """Every unconsumed row of ``consumer``, in reads of at most ``cap`` rows, until the
        dock says all are consumed (MindSpeed-RL's stage loop)."""
        rows = int(_dock(self.td, "get_experience_len"))
        count = _divisor_at_most(rows, int(cap or rows))
        while not _dock(self.td, "all_consumed", consumer=consumer, get_n_samples=False):
            batch, index = _dock(self.td, "get_experience", consumer=consumer, experience_columns=list(columns),
                                 experience_count=count, get_n_samples=False)
            if not index:
                time.sleep(0.01)   # rows not ready yet (MindSpeed-RL's stages wait the same way)
                continue
            yield batch, index

    def _logprob_stage(self, consumer: str, column: str, logprobs) -> None:
        import torch

        for batch, index in self._read(consumer, ROLLOUT_COLUMNS, self.rl_config.actor_logprob_dispatch_size):
            prompts, responses = _rows_of(batch)
            values = logprobs(prompts, responses)
            _dock(self.td, "put_experience", data_dict={column: [torch.tensor(v, dtype=torch.float32) for v in values]},
                  indexes=list(index))

    def compute_log_prob(self):
        self._logprob_stage("actor_log_prob", "old_log_prob", self.engine.logprobs)

    def compute_ref_log_prob(self):
        if self.reference is None:
            from ...engines.hf import HFReferencePolicy

            self.reference = HFReferencePolicy(self.paths[1], "cpu", self.dtype, self.threads,
                                               temperature=self.temperature)
        self._logprob_stage("ref_log_prob", "ref_log_prob", self.reference.logprobs)

    def update(self, kl_ctrl=None, skip_actor_log_prob=False) -> dict:
        """MindSpeed-RL's update: one optimizer step per mini-batch of the rows in the dock.
        Returns the mean of the steps' loss metrics (MindSpeed-RL's workers return None and
        put them in the dock's metrics; these do both)."""
        from .job import MindSpeedJobError

        if kl_ctrl is None:
            raise MindSpeedJobError("update(kl_ctrl=None): MindSpeed-RL's loss reads kl_ctrl.value; pass its "
                                    "KL controller (job.make_kl_controller)")
        columns = [c for c in TRAIN_COLUMNS if not (skip_actor_log_prob and c == "old_log_prob")]
        mini = int(self.rl_config.mini_batch_size)
        totals: dict[str, float] = {}
        steps = 0
        for batch, index in self._read("actor_train", columns, self.rl_config.actor_update_dispatch_size):
            for start in range(0, len(index), mini):
                part = {k: v[start:start + mini] for k, v in batch.items()}
                for key, value in self._train_mini_batch(part, kl_ctrl, skip_actor_log_prob).items():
                    totals[key] = totals.get(key, 0.0) + value
                steps += 1
        self.iteration += 1
        self.consumed_train_samples += self.megatron_config.global_batch_size
        metrics = {k: v / max(steps, 1) for k, v in totals.items()}
        metrics["actor/optimizer_steps"] = float(steps)
        _dock(self.td, "update_metrics", key="actor/lr", value=self.megatron_config.lr)
        return metrics

    def _train_mini_batch(self, part: dict, kl_ctrl, skip_old: bool) -> dict:
        from ...engines.base import TrainBatch

        prompts, responses = _rows_of(part)
        lengths = [len(r) for r in responses]
        cut = lambda column: [part[column][i][:n] for i, n in enumerate(lengths)]   # noqa: E731
        extras = {"advantages": cut("advantages"), "ref": cut("ref_log_prob")}
        if not skip_old:
            extras["old"] = cut("old_log_prob")
        rl = self.rl_config

        def loss_fn(values, mask, batch, index):
            import torch

            def padded(name):
                out = torch.zeros(values.shape, dtype=values.dtype)
                for b, i in enumerate(index):
                    out[b, :lengths[i]] = batch.extras[name][i].to(values.dtype)
                return out

            old = padded("old") if "old" in batch.extras else values.detach()
            return micro_batch_loss(values, mask, old, padded("advantages"), padded("ref"), float(rl.clip_ratio),
                                    kl_ctrl, rl.kl_penalty)

        return self.engine.train_step(TrainBatch(prompts, responses, extras), loss_fn)

    # ------------------------------------------------------------------ weights, checkpoints
    def asp_state_dict(self):
        """(pp, tp, ep) = (0, 0, 0) and the weights in Megatron's names, as
        ``engine._asp_state_dict`` returns them from a Megatron rank."""
        from transformers import AutoConfig

        from .weight_map import MegatronRank, ModelShape, Parallel, hf_to_megatron

        tensors = self.engine.state_tensors()
        shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(self.paths[0]))
        shards = hf_to_megatron(tensors, shape, Parallel(tp=1, pp=1, ep=1))
        return (0, 0, 0), shards[MegatronRank(0, 0, 0)]

    def hf_state_dict(self) -> dict:
        """The weights as the hf engine holds them (tests compare them with the map's)."""
        return self.engine.state_tensors()

    def parameter_grads(self) -> dict:
        """Each parameter's gradient after the last optimizer step (tests)."""
        return {name: p.grad.detach().clone() for name, p in self.engine.model.named_parameters()
                if p.grad is not None}

    def save_ckpt(self, iteration: int):
        """MindSpeed-RL saves its actor at ``save``/iteration; here the hf checkpoint."""
        save = getattr(self.megatron_config, "save", None)
        if save:
            self.engine.save(os.path.join(save, f"iter_{int(iteration):07d}"))


def cpu_worker_class(npus_per_rank: float = 1.0):
    """The Ray actor class RayActorGroup builds: named ``IntegratedWorker`` because
    MindSpeed-RL looks a worker's NPU count up by class name (``launcher.resource_mapping``:
    ``rl_config.actor_resource``). Each rank holds one (logical) NPU of its bundle."""
    import ray

    cls = type("IntegratedWorker", (CPUIntegratedWorker,), {"__module__": __name__})
    return ray.remote(resources={"NPU": npus_per_rank}, num_cpus=0)(cls)
