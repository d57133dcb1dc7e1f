"""``engine=mindspeed``: the Training Unit drives MindSpeed-RL's own GRPO worker group on the T
nodes; the G nodes generate with this project's vLLM engine on vllm-ascend
(``engines/vllm_engine.py``, ``engines/vllm_platform.py``), or with ``mindspeed_workers=cpu``
the hf engine.

Assembly (``job.py``), as MindSpeed-RL's ``cli/train_grpo.py`` does it: Hydra composes the
job with its ``defaults`` (its ``model/NAME.yaml``); MindSpeed-RL's own
``parse_training_config`` builds its config classes from the DictConfig sections and runs
``validate_rl_args``; its KL controller; a ``RayActorGroup`` of ``IntegratedWorker`` ranks
(actor and reference in one, as its GRPO requires) on placement groups ASP made for the T
devices (``config/placement.mindspeed_worker_bundles``). ``engine.mindspeed_workers=npu``:
MindSpeed-RL's ``IntegratedWorker`` (Megatron) with ``asp_state_dict`` added;
``cpu``: ``cpu_workers.CPUIntegratedWorker``, the same methods over the hf engine with
MindSpeed-RL's loss, so the whole orchestration runs on a machine without NPUs.

How it fits the training-engine protocol (``engines/base.py``): the Training Unit
(``runtime/training_unit.py``) stays as it is. Each call puts its rows into a
``GRPOTransferDock`` sized to the call (sample ``i`` is row ``i``) with the columns
MindSpeed-RL's stages read, runs the stage on every rank of the group, and reads the
stage's output column back:

* ``logprobs``   -> ``compute_log_prob`` -> ``old_log_prob``
* reference      -> ``compute_ref_log_prob`` (the integrated worker's reference) -> ``ref_log_prob``
* ``train_step`` -> the batch's ``advantages`` (this project's GRPO advantages,
  ``algo/grpo.group_advantages``; with ``algo.adv_std=sample``, what an imported job gets,
  they equal MindSpeed-RL's ``group_norm``, which divides by the sample std; the population
  std makes them larger by sqrt(n / (n - 1))), the run's off-policy correction folded in
  (``importance_weighted_advantages``: per-token ``A * min(exp(proximal - behaviour), cap)``
  with the proximal log-probs as ``old_log_prob``; the clipped objective is positively
  homogeneous in ``A``, so MindSpeed-RL's loss computes this project's TIS loss exactly),
  and ``ref_log_prob`` go into the dock, then ``update(kl_ctrl, skip_actor_log_prob=False)``
  with MindSpeed-RL's own KL controller. The loss is MindSpeed-RL's ``GRPOActorLossFunc``;
  ``loss_fn`` is not used, and the metrics say so.
* ``state_tensors`` / ``export_weights`` -> every rank's Megatron parameters
  (``asp_state_dict``), mapped to Hugging Face names and shapes by
  ``weight_map.megatron_to_hf``. The Training Unit sends that through its weight transport
  (``weights.transport=collective``: ``weights/collective.py`` over HCCL on NPUs), loaded by
  the vLLM actors with vLLM's own ``load_weights`` (which fuses q/k/v and gate/up again).

What has run (tests/test_mindspeed_cpu_path.py, tests/test_mindspeed_contract.py, against
the MindSpeed-RL snapshot): all of the above with ``mindspeed_workers=cpu`` (real
MindSpeed-RL classes: config classes, validate_rl_args, RayActorGroup, GRPOTransferDock, KL
controllers, GRPOActorLossFunc's loss); with ``npu``, only what the signatures check
(``check_mindspeed_api``) covers: Megatron init, HCCL groups, MindSpeed-RL's
``IntegratedWorker`` methods on real ranks and ``asp_state_dict`` on a Megatron model have
NOT run (no NPU here).

Importing this module imports nothing of MindSpeed-RL, Megatron or torch_npu; the class
below imports them when it is built.
"""
from __future__ import annotations

import importlib
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .job import CLI_FUNCTIONS, load_cli_functions  # noqa: F401 (re-exported: the contract checks call it here)

__all__ = ["MINDSPEED_API", "ApiCall", "check_mindspeed_api", "mindspeed_install_hint", "MindSpeedTrainingEngine",
           "MindSpeedReferencePolicy", "MindSpeedEngineError", "load_cli_functions"]

# This module imports nothing from engines/ (engines/registry.py imports it: integrations
# is the higher layer there), so it has its own error and snapshot types; the Training
# Unit reads a snapshot by its ``version`` and ``tensors`` only.


class MindSpeedEngineError(RuntimeError):
    """engine=mindspeed could not be built or used; the message says what to change."""


@dataclass
class ExportedWeights:
    version: int
    tensors: dict


@dataclass(frozen=True)
class ApiCall:
    """One MindSpeed-RL callable this engine calls, with the parameters it passes."""

    module: str
    qualname: str
    params: tuple[str, ...]


# What this module calls, by keyword. ``check_mindspeed_api`` resolves each against the
# real code (a Ray actor class is checked on the class it wraps).
MINDSPEED_API = (
    ApiCall("mindspeed_rl.workers.scheduler.launcher", "RayActorGroup.__init__",
            ("worker", "placement_group", "megatron_config", "rl_config", "model_provider", "initialize_func",
             "tokenizer", "generate_config", "get_megatron_module", "profiler_config", "msprobe_config")),
    ApiCall("mindspeed_rl.workers.scheduler.launcher", "RayActorGroup.initialize", ()),
    ApiCall("mindspeed_rl.workers.scheduler.launcher", "RayActorGroup.compute_log_prob", ("blocking",)),
    ApiCall("mindspeed_rl.workers.scheduler.launcher", "RayActorGroup.compute_ref_log_prob", ("blocking",)),
    ApiCall("mindspeed_rl.workers.scheduler.launcher", "RayActorGroup.update", ("kl_ctrl", "skip_actor_log_prob")),
    ApiCall("mindspeed_rl.workers.scheduler.launcher", "RayActorGroup.sync_init_transfer_dock", ("transfer_dock",)),
    ApiCall("mindspeed_rl.workers.scheduler.launcher", "RayActorGroup.execute_sync_command", ("method_name",)),
    ApiCall("mindspeed_rl.workers.scheduler.launcher", "RayActorGroup.save_checkpoint", ("iteration",)),
    ApiCall("mindspeed_rl.workers.integrated_worker", "IntegratedWorker.__init__",
            ("megatron_config", "rl_config", "generate_config", "model_provider", "initialize_func", "tokenizer",
             "get_megatron_module")),
    ApiCall("mindspeed_rl.workers.integrated_worker", "IntegratedWorker.compute_log_prob", ()),
    ApiCall("mindspeed_rl.workers.integrated_worker", "IntegratedWorker.compute_ref_log_prob", ()),
    ApiCall("mindspeed_rl.workers.integrated_worker", "IntegratedWorker.update", ("kl_ctrl", "skip_actor_log_prob")),
    ApiCall("mindspeed_rl.workers.integrated_worker", "IntegratedWorker.init_transfer_dock", ("td",)),
    ApiCall("mindspeed_rl.trainer.utils.transfer_dock", "GRPOTransferDock.__init__",
            ("prompts_num", "n_samples_per_prompt", "metrics", "GBS_train", "addition_columns")),
    ApiCall("mindspeed_rl.trainer.utils.transfer_dock", "GRPOTransferDock.put_experience", ("data_dict", "indexes")),
    ApiCall("mindspeed_rl.trainer.utils.transfer_dock", "GRPOTransferDock.get_experience",
            ("consumer", "experience_columns", "experience_count", "indexes", "get_n_samples")),
    ApiCall("mindspeed_rl.trainer.utils.transfer_dock", "GRPOTransferDock.all_consumed", ("consumer", "get_n_samples")),
    ApiCall("mindspeed_rl.trainer.utils.transfer_dock", "GRPOTransferDock.clear", ()),
    ApiCall("mindspeed_rl.trainer.utils.compute_utils", "FixedKLController.__init__", ("init_kl_coef",)),
    ApiCall("mindspeed_rl.trainer.utils.compute_utils", "AdaptiveKLController.__init__",
            ("init_kl_coef", "target_kl", "horizon")),
    ApiCall("mindspeed_rl.models.loss.grpo_actor_loss_func", "GRPOActorLossFunc._compute_grpo_policy_loss",
            ("old_log_prob", "log_prob", "ref_log_prob", "advantages", "entropy", "eos_mask", "cliprange", "kl_ctrl",
             "kl_penalty", "entropy_coeff")),
    ApiCall("mindspeed_rl.config_cls.megatron_config", "MegatronConfig.__init__", ("training_config", "model_config")),
    ApiCall("mindspeed_rl.config_cls.rl_config", "RLConfig.__init__", ("config_dict",)),
    ApiCall("mindspeed_rl.config_cls.generate_config", "GenerateConfig.__init__", ("config_dict",)),
    ApiCall("mindspeed_rl.config_cls.validate_config", "validate_rl_args",
            ("actor_config", "ref_config", "reward_config", "rl_config", "generate_config")),
    ApiCall("mindspeed_rl.utils.tokenizer", "get_tokenizer", ("tokenizer_model",)),
    ApiCall("mindspeed_rl.utils.metrics", "Metric.__init__", ()),
)


def mindspeed_install_hint() -> str:
    return ("engine=mindspeed needs MindSpeed-RL and its Ascend stack: a checkout of Ascend/MindSpeed-RL on "
            "PYTHONPATH (and MINDSPEED_RL_CHECKOUT pointing to it, for its cli/train_grpo.py), its requirements "
            "(MindSpeed, Megatron-LM, torch_npu, CANN, vllm-ascend), and engine.mindspeed_config naming the "
            "MindSpeed-RL YAML; see docs/mindspeed_rl_adapters.md. On machines without NPUs use engine=hf or "
            "engine=vllm")


def _resolve(call: ApiCall) -> Any:
    target: Any = importlib.import_module(call.module)
    for part in call.qualname.split("."):
        target = getattr(target, part)
        # A Ray actor class wraps the class MindSpeed-RL wrote: check that one.
        target = getattr(target, "__ray_actor_class__", target)
    return target


def check_mindspeed_api(calls: Sequence[ApiCall] = MINDSPEED_API) -> list[str]:
    """Every call this engine makes whose target is missing or lacks a parameter it passes
    (empty: the real code takes them all). Needs mindspeed_rl importable."""
    problems = []
    for call in calls:
        try:
            target = _resolve(call)
        except (ImportError, AttributeError) as error:
            problems.append(f"{call.module}.{call.qualname}: {type(error).__name__}: {error}")
            continue
        parameters = inspect.signature(target).parameters
        takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        missing = [p for p in call.params if p not in parameters and not takes_kwargs]
        if missing:
            problems.append(f"{call.module}.{call.qualname} takes no {missing} (it takes {list(parameters)})")
    return problems


def _asp_state_dict(self) -> tuple[tuple[int, int, int], dict]:
    """(pp, tp, ep) rank and this rank's Megatron parameters on CPU (stage-local names),
    for ``weight_map.megatron_to_hf``. Runs inside MindSpeed-RL's actor (not run here)."""
    model = self.model[0] if isinstance(self.model, (list, tuple)) else self.model
    while hasattr(model, "module"):   # DDP / Float16Module wrappers
        model = model.module
    state = self.parallel_state
    rank = (state.get_pipeline_model_parallel_rank(), state.get_tensor_model_parallel_rank(),
            state.get_expert_model_parallel_rank() if hasattr(state, "get_expert_model_parallel_rank") else 0)
    return rank, {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters()}


def _integrated_worker_class():
    """MindSpeed-RL's IntegratedWorker (actor and reference in one) with ``asp_state_dict``
    added, as a Ray actor class. Named ``IntegratedWorker`` on purpose: RayActorGroup looks
    its NPU count up by class name (``launcher.resource_mapping``: ``rl_config.actor_resource``)."""
    import ray
    from mindspeed_rl.workers.integrated_worker import IntegratedWorker

    cls = type("IntegratedWorker", (IntegratedWorker.__ray_actor_class__,), {"asp_state_dict": _asp_state_dict})
    return ray.remote(resources={"NPU": 0.7})(cls)


def _ray_dock(rows: int):
    """A GRPOTransferDock Ray actor for ``rows`` single-sample rows."""
    from mindspeed_rl.trainer.utils.transfer_dock import GRPOTransferDock
    from mindspeed_rl.utils.metrics import Metric

    from .queue import ASP_COLUMNS

    # GBS_train = rows: its default 0 makes n-sample reads return nothing.
    # num_cpus=0: the dock reserves 10 CPUs by default, which would wait forever on a small
    # cluster; it only holds tensors and answers calls.
    return GRPOTransferDock.options(num_cpus=0).remote(prompts_num=rows, n_samples_per_prompt=1, metrics=Metric(), GBS_train=rows,
                                   addition_columns=list(ASP_COLUMNS))


def _ray_call(dock, name: str, **kwargs):
    import ray

    return ray.get(getattr(dock, name).remote(**kwargs))


class DockCalls:
    """A dock per row count (a dock's size is its all-consumed condition: MindSpeed-RL's
    stages loop until every row is consumed), handed to the worker groups when it changes.
    ``make_dock(rows)`` and ``call(dock, method, **kwargs)``: the real dock on Ray by
    default; tests pass the in-process model."""

    def __init__(self, groups: Sequence[Any], make_dock: Callable = _ray_dock, call: Callable = _ray_call):
        self.groups = groups
        self.make_dock = make_dock
        self.call = call
        self.docks: dict[int, Any] = {}
        self.current = None

    def dock_for(self, rows: int):
        if rows not in self.docks:
            self.docks[rows] = self.make_dock(rows)
        dock = self.docks[rows]
        self.call(dock, "clear")
        if dock is not self.current:
            for group in self.groups:
                group.sync_init_transfer_dock(dock)
            self.current = dock
        return dock

    def put(self, dock, columns: dict, rows: int) -> None:
        self.call(dock, "put_experience", data_dict=columns, indexes=list(range(rows)))

    def read(self, dock, column: str, lengths: Sequence[int]) -> list[list[float]]:
        """``column`` of rows ``0 .. len(lengths)-1``, each cut to its response length."""
        batch, _ = self.call(dock, "get_experience", consumer="trainer", experience_columns=[column],
                             indexes=list(range(len(lengths))))
        values = batch[column]
        return [values[position][:n].tolist() for position, n in enumerate(lengths)]


def _rows(prompt_ids, response_ids) -> dict:
    """The rollout columns of arbitrary rows (each its own n=1 group)."""
    import torch

    cols: dict[str, list] = {"prompts": [], "prompt_length": [], "responses": [], "response_length": [],
                             "input_ids": []}
    for prompt, response in zip(prompt_ids, response_ids):
        p = torch.as_tensor(list(prompt), dtype=torch.int32)
        r = torch.as_tensor(list(response), dtype=torch.int32)
        cols["prompts"].append(p)
        cols["prompt_length"].append(torch.tensor([len(p)], dtype=torch.int32))
        cols["responses"].append(r)
        cols["response_length"].append(torch.tensor([len(r)], dtype=torch.int32))
        cols["input_ids"].append(torch.cat([p, r]))
    return cols


def _placement_groups(bundles: Sequence[Sequence[dict]]) -> list:
    """ASP's placement groups for MindSpeed-RL's worker group, one per T node, ready."""
    import ray
    from ray.util.placement_group import placement_group

    groups = [placement_group(list(node), strategy="STRICT_PACK") for node in bundles]
    ray.get([g.ready() for g in groups])
    return groups


def _worker_group(workers: str, configs: dict, placement_groups: list, model_path: str, engine_cfg, temperature):
    """MindSpeed-RL's ``RayActorGroup`` of integrated workers (actor and reference in one, as
    its GRPO requires) on ASP's placement groups, initialised."""
    from mindspeed_rl.workers.scheduler.launcher import RayActorGroup

    actor_config, rl_config = configs["actor_config"], configs["rl_config"]
    common = dict(placement_group=placement_groups, megatron_config=actor_config, rl_config=rl_config,
                  generate_config=configs["generate_config"], profiler_config=configs["profiler_config"]["integrated"],
                  msprobe_config=configs["msprobe_config"],
                  global_batch_size=actor_config.global_batch_size * rl_config.n_samples_per_prompt)
    if workers == "cpu":
        from .cpu_workers import cpu_worker_class

        # The cpu workers compute in engine.dtype when the engine is a CPU one, else in float32
        # (engine=mindspeed's own dtype, bfloat16, is the NPU workers').
        on_cpu = getattr(engine_cfg, "device", "cpu") == "cpu"
        return RayActorGroup(worker=cpu_worker_class(), model_provider=None, initialize_func=None,
                             get_megatron_module=None, tokenizer=None, asp_model_path=model_path,
                             asp_dtype=getattr(engine_cfg, "dtype", "float32") if on_cpu else "float32",
                             asp_threads=max(1, int(getattr(engine_cfg, "num_threads", 1))),
                             asp_temperature=float(temperature), **common).initialize()
    from mindspeed_rl.utils.tokenizer import get_tokenizer

    cli = load_cli_functions()
    tokenizer = get_tokenizer(tokenizer_model=actor_config.tokenizer_name_or_path,
                              prompt_type=getattr(actor_config, "prompt_type", None),
                              prompt_type_path=getattr(actor_config, "prompt_type_path", None))
    return RayActorGroup(worker=_integrated_worker_class(), model_provider=cli["gpt_model_provider"],
                         initialize_func=cli["initialize_megatron"], get_megatron_module=cli["get_megatron_module"],
                         tokenizer=tokenizer, **common).initialize()


def importance_weighted_advantages(advantages, behaviour, proximal, loss_cfg) -> tuple[list, list]:
    """``(old_log_prob, per-token advantages)`` for MindSpeed-RL's loss so that it computes
    this project's off-policy-corrected GRPO loss exactly: the clipped PPO objective
    ``max(-A r, -A clip(r))`` is positively homogeneous in ``A``, so a token's capped
    importance weight ``w = min(exp(proximal - behaviour), tis_cap)`` (detached) moves into
    its advantage (``A w``) with the ratio taken against the proximal policy, as
    ``algo/grpo.grpo_loss`` does. ``off_policy=none`` (or no proximal): the behaviour
    log-probs and ``A`` as they are."""
    import math

    off_policy = getattr(loss_cfg, "off_policy", "none") if loss_cfg is not None else "none"
    if off_policy == "none" or proximal is None:
        return ([list(map(float, b)) for b in behaviour],
                [[float(a)] * len(b) for a, b in zip(advantages, behaviour)])
    cap = loss_cfg.tis_cap if loss_cfg.tis_cap is not None else math.inf
    limit = 20.0   # algo/grpo.LOG_RATIO_LIMIT: exp() clamped the same way
    weighted = []
    for a, b, p in zip(advantages, behaviour, proximal):
        weighted.append([float(a) * min(math.exp(max(-limit, min(limit, float(pi) - float(bi)))), cap)
                         for bi, pi in zip(b, p)])
    return [list(map(float, p)) for p in proximal], weighted


class MindSpeedTrainingEngine:
    """The training-engine protocol over MindSpeed-RL's actor (see the module docstring;
    written against its API, not run: there is no NPU here)."""

    def __init__(self, engine_cfg, model_path: str, train_cfg=None, rl_cfg=None, temperature: float = 1.0,
                 bundles=()):
        """Assembles the job as MindSpeed-RL's ``cli/train_grpo.py`` does (``job.py``): Hydra
        with the job's defaults, its config classes and ``validate_rl_args`` through its own
        ``parse_training_config``, its KL controller, and a ``RayActorGroup`` of integrated
        workers (MindSpeed-RL's on NPUs; ``cpu_workers.py`` with ``engine.mindspeed_workers=cpu``)
        on ASP's placement groups (``bundles``, from the driver)."""
        from transformers import AutoConfig, AutoTokenizer

        from . import job as jobs
        from .weight_map import ModelShape, Parallel

        path = getattr(engine_cfg, "mindspeed_config", "") or ""
        if not path:
            raise MindSpeedEngineError("engine=mindspeed needs engine.mindspeed_config=FILE.yaml: the MindSpeed-RL GRPO "
                              "YAML whose megatron_training / actor_config / rl_config / generate_config / model "
                              "sections build its actor")
        workers = getattr(engine_cfg, "mindspeed_workers", "npu")
        if not bundles:
            raise MindSpeedEngineError("engine=mindspeed: no placement for MindSpeed-RL's worker group "
                                       "(bundles=); the driver (runtime/driver.py) places it")
        jobs.use_mindspeed_rl(workers)
        if workers == "cpu":   # what the acl stand-in answers RayActorGroup: the devices of a T node
            os.environ.setdefault(jobs.LOGICAL_NPUS_ENV, str(len(bundles[0])))
        job = jobs.fit_job_to_t_side(jobs.compose_job(path), sum(len(group) for group in bundles), workers)
        configs = jobs.build_job(job)
        actor_config, self.rl_config = configs["actor_config"], configs["rl_config"]
        self.kl_ctrl = jobs.make_kl_controller(self.rl_config)
        self.placement_groups = _placement_groups(bundles)
        self.actor = _worker_group(workers, configs, self.placement_groups, model_path, engine_cfg, temperature)
        self.docks = DockCalls([self.actor])
        self.loss_cfg = None
        self.model_path = model_path
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(model_path),
                                               padded_vocab_size=getattr(actor_config, "padded_vocab_size", 0) or 0)
        self.parallel = Parallel(tp=actor_config.tensor_model_parallel_size,
                                 pp=actor_config.pipeline_model_parallel_size,
                                 ep=getattr(actor_config, "expert_model_parallel_size", 1) or 1,
                                 moe_tp_extend_ep=bool(getattr(actor_config, "moe_tp_extend_ep", False)))
        self.version = 0

    def configure_loss(self, loss_cfg) -> None:
        """The run's GRPO loss config (``algo``): its off-policy correction is folded into
        the advantages MindSpeed-RL's loss reads (``importance_weighted_advantages``)."""
        self.loss_cfg = loss_cfg

    # ------------------------------------------------------------------ protocol
    def logprobs(self, prompt_ids, response_ids, temperature: float = 1.0) -> list[list[float]]:
        """MindSpeed-RL's actor log-probs; it divides the logits by its own
        ``generate_config.sampling_config.temperature`` (``temperature`` here is not used)."""
        dock = self.docks.dock_for(len(response_ids))
        self.docks.put(dock, _rows(prompt_ids, response_ids), len(response_ids))
        self.actor.compute_log_prob(blocking=True)
        return self.docks.read(dock, "old_log_prob", [len(r) for r in response_ids])

    def reference_logprobs(self, prompt_ids, response_ids) -> list[list[float]]:
        dock = self.docks.dock_for(len(response_ids))
        self.docks.put(dock, _rows(prompt_ids, response_ids), len(response_ids))
        self.actor.compute_ref_log_prob(blocking=True)   # the integrated worker holds the reference
        return self.docks.read(dock, "ref_log_prob", [len(r) for r in response_ids])

    def train_step(self, batch, loss_fn=None) -> dict[str, float]:
        """One MindSpeed-RL update on ``batch`` with its own GRPO loss and optimizer, the
        run's off-policy correction folded into the advantages
        (:func:`importance_weighted_advantages`), and its KL controller (``kl_ctrl.value``).
        ``loss_fn`` (this project's loss) is not used: MindSpeed-RL's computes the same."""
        import torch

        rows = len(batch)
        columns = _rows(batch.prompt_ids, batch.response_ids)
        extras = batch.extras
        old, advantages = importance_weighted_advantages(extras["advantages"], extras["behaviour_logprobs"],
                                                         extras.get("proximal_logprobs"), self.loss_cfg)
        ref = extras["ref_logprobs"] if "ref_logprobs" in extras else old
        columns["old_log_prob"] = [torch.tensor(x, dtype=torch.float32) for x in old]
        columns["ref_log_prob"] = [torch.as_tensor(list(x), dtype=torch.float32) for x in ref]
        columns["advantages"] = [torch.tensor(a, dtype=torch.float32) for a in advantages]
        dock = self.docks.dock_for(rows)
        self.docks.put(dock, columns, rows)
        results = self.actor.update(self.kl_ctrl, False)   # old_log_prob is in the dock
        self.version += 1
        metrics = {"mindspeed_update": 1.0, "asp_loss_fn_used": 0.0, "kl_coef": float(self.kl_ctrl.value)}
        first = results[0] if results else None
        if isinstance(first, dict):   # the cpu workers return their loss metrics; MindSpeed-RL's return None
            metrics.update({k.replace("actor/", "mindspeed_"): float(v) for k, v in first.items()})
        return metrics

    def state_tensors(self) -> dict:
        """The actor's weights as a Hugging Face state dict (weight_map.megatron_to_hf)."""
        from .weight_map import MegatronRank, megatron_to_hf

        shards = {}
        for (pp, tp, ep), state in self.actor.execute_sync_command("asp_state_dict"):
            shards.setdefault(MegatronRank(pp, tp, ep), state)
        return megatron_to_hf(shards, self.shape, self.parallel)

    def export_weights(self) -> ExportedWeights:
        return ExportedWeights(self.version, self.state_tensors())

    def save_native(self) -> None:
        """MindSpeed-RL's own checkpoint of the actor (weights and optimizer, in its ``save``
        directory)."""
        self.actor.save_checkpoint(self.version)

    def save(self, path: str) -> None:
        """MindSpeed-RL's own checkpoint, and the policy as a Hugging Face checkpoint at
        ``path`` (the weights mapped by the weight map, in the starting model's dtype, with
        its config and tokenizer files: engines/export.py)."""
        from ...engines.export import export_policy

        self.save_native()
        export_policy(path, self.state_tensors(), self.model_path)

    def optimizer_state(self) -> dict:
        """Empty: the optimizer is in MindSpeed-RL's own checkpoint (``save``)."""
        return {}

    def load_optimizer_state(self, state) -> None:
        raise MindSpeedEngineError("resume with engine=mindspeed is not built: the optimizer state is in "
                                   "MindSpeed-RL's checkpoint (its save directory), which its actor loads with "
                                   "its own load key; start a new run from the saved policy instead")


class MindSpeedReferencePolicy:
    """The frozen reference as MindSpeed-RL's ReferenceWorker (through the engine's dock)."""

    def __init__(self, engine: MindSpeedTrainingEngine):
        self.engine = engine

    def logprobs(self, prompt_ids, response_ids, temperature: float = 1.0) -> list[list[float]]:
        return self.engine.reference_logprobs(prompt_ids, response_ids)
