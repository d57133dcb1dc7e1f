"""A MindSpeed-RL GRPO / DAPO job (its Hydra YAML) as this project's Hydra overrides.

MindSpeed-RL describes a job in four sections, ``megatron_training`` (data, tokenizer,
batch, checkpoints), ``actor_config`` (the Megatron actor: parallelism, optimizer),
``rl_config`` (GRPO: samples per prompt, minibatches, KL, rewards, resources) and
``generate_config`` (vLLM: inference parallelism, sampling), plus a ``defaults: - model:
NAME`` group read from ``model/NAME.yaml`` beside the file, and optionally
``profiler_config`` / ``msprobe_config``. :func:`import_job` maps every key this project
can honour to an override, lists the keys it ignores or passes through with the reason
(fusion and kernel flags, logging, Megatron checkpoint plumbing, expert load balancing:
they change speed or bookkeeping, never the algorithm; keys of MindSpeed-RL's own actor
with engine=mindspeed), and refuses, with one :class:`MindSpeedImportError` naming the key
and the fix, a key whose meaning it cannot honour, an unknown section or key, parallel
sizes no layout of the job's NPUs holds, or a missing model group.

The T/G split is new. MindSpeed-RL colocates actor, reference and rollout on all
``rl_config.actor_resource.num_npus`` NPUs; ASP puts training and generation on
different nodes. The layout is the user's ``layout=NAME`` when given (its devices must
equal num_npus), otherwise it is made from num_npus and ``layout.devices_per_node``
(default 8) by config/layouts.plan_layout's stated rule: the most even T/G split that
holds the job's Megatron replica (TP x PP x CP, EP) and whole inference instances (an
instance larger than a node takes whole G nodes), else mode=hybrid. ``asp-plan-layout``
with the same overrides searches a better split.

Conventions checked against MindSpeed-RL's source (config_cls/rl_config.py and the
advantage, KL, reward and loss functions its trainer calls):

* ``rl_config.mini_batch_size`` is written in prompts; RLConfig multiplies it by
  ``n_samples_per_prompt`` after reading it, so its internal value counts samples. This
  project's ``rl.mini_batch_size`` counts prompts: the YAML value maps unchanged (never
  the multiplied one). ``megatron_training.global_batch_size`` counts prompts too;
  ``actor_config.micro_batch_size`` counts samples, as ``rl.micro_batch_size`` does.
* ``kl_penalty``: ``kl`` is logp - ref (our k1), ``mse`` is (logp - ref)^2 / 2 (k2),
  ``low_var_kl`` is exp(ref - logp) - (ref - logp) - 1 (k3; MindSpeed-RL also clamps the
  result to [-10, 10], ours does not, which only matters for a KL above 10 per token).
* ``adv_estimator: group_norm`` is (r - mean) / (std + 1e-6) per prompt group with the
  sample std (torch's ``std``, ddof=1; trainer/utils/compute_utils.py):
  ``algo.scale_advantages=true algo.adv_std=sample algo.adv_eps=1e-6``. The GRPO loss is a
  masked mean over every token of the batch: ``algo.loss_agg=token_mean`` (DAPO's
  ``token_level_loss: false`` is the mean of per-sequence means: ``seq_mean_token_mean``).
* DAPO: ``filter_groups_enable`` keeps a prompt group only if its
  ``filter_groups_metric`` reward has a non-zero std and generates more until
  ``filter_groups_train_batch_size`` groups are kept (``algo.filter_groups=std``, the
  step is ``rl.global_batch_size`` = that many groups); ``overlong_buffer_enable`` adds
  min(-min(len - (max - buffer), buffer) / buffer x factor, 0) to the reward
  (models/rule_verifier.py): ``algo.overlong_buffer_len``, ``algo.overlong_penalty_factor``.
* ``sampling_config.top_k: -1`` is vLLM's "no top-k", our ``top_k=0``.

Pure: plain dicts in, a frozen result out. :func:`import_file` is the thin shell that
reads the YAML, its model group and the shipped layouts.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from ...config.layouts import LayoutRefused, Parallel, plan_layout
from ...config.validate import ConfigError

SECTIONS = ("defaults", "megatron_training", "actor_config", "rl_config", "generate_config")
# Sections that only profile or debug a run: the import maps nothing from them; with
# engine=mindspeed, MindSpeed-RL's own assembly reads them from the job YAML
# (engine.mindspeed_config), as its cli/train_grpo.py does (ProfilerConfig, MsprobeConfig).
PASSED_SECTIONS = {
    "profiler_config": "profiling (this project's timeline.jsonl records every actor's spans)",
    "msprobe_config": "MindStudio precision probes (debugging only)",
}
GRPO_STAGES = ("ray_grpo", "ray_dapo")
# Layout node counts are this project's; the files live in configs/layout/.
LAYOUT_GROUP = "layout"
# MindSpeed-RL's group_norm: (r - mean) / (std + 1e-6), torch's std (ddof=1); its
# trainer/utils/compute_utils.compute_group_norm_advantage_return.
MINDSPEED_ADV_EPS = 1e-6
DEFAULT_DEVICES_PER_NODE = 8     # an Atlas 800T A2 / 910B node (configs/layout/ascend910b3_*.yaml)
NPU_ACCELERATOR = "Ascend 910B3"


class MindSpeedImportError(ConfigError):
    """A MindSpeed-RL YAML this project cannot run as written; the message names the key
    (``section.key``) and what to change."""


@dataclass(frozen=True)
class Ignored:
    key: str       # section.key as written in the YAML
    reason: str


@dataclass(frozen=True)
class LayoutMapping:
    """How the colocated MindSpeed-RL job maps onto this project's layout: a shipped file
    (``file``) or one made from the NPU count (``file`` None: every layout key is an
    override)."""

    name: str
    rule: str                 # why this layout
    num_npus: int             # rl_config.actor_resource.num_npus
    device_type: str
    nodes: int                # nodes used (T + G; hybrid: all)
    devices_per_node: int
    train_nodes: int
    gen_nodes: int
    infer_instance_size: int
    hybrid: bool = False
    file: Optional[str] = None
    accelerator: str = NPU_ACCELERATOR
    # A layout made from the NPU count sits on a shipped file of its device type (which gives
    # device_type and accelerator; every other key is set), so that a tool that drops some
    # layout keys (asp-plan-layout sweeps the split) still composes a whole layout.
    base: Optional[str] = None

    @property
    def train_devices(self) -> int:
        return (self.nodes if self.hybrid else self.train_nodes) * self.devices_per_node

    @property
    def gen_devices(self) -> int:
        return (self.nodes if self.hybrid else self.gen_nodes) * self.devices_per_node

    @property
    def instances(self) -> int:
        return self.gen_devices // self.infer_instance_size

    def overrides(self) -> dict[str, Any]:
        """The layout (and mode) overrides: the file's name, or every key of the layout."""
        if self.file:
            keys: dict[str, Any] = {"layout": self.file}
        else:
            keys = {"layout": self.base} if self.base else {
                "layout.device_type": self.device_type, "layout.accelerator": self.accelerator}
            keys.update({"layout.name": self.name, "layout.nodes": self.nodes,
                         "layout.devices_per_node": self.devices_per_node, "layout.train_nodes": self.train_nodes,
                         "layout.gen_nodes": self.gen_nodes})
        keys["layout.infer_instance_size"] = self.infer_instance_size
        if self.hybrid:
            keys["mode"] = "hybrid"
        return keys


@dataclass(frozen=True)
class ImportResult:
    overrides: tuple[str, ...]       # Hydra overrides, groups first, in a stable order
    ignored: tuple[Ignored, ...]
    layout: LayoutMapping
    model_group: str
    source: str = ""                 # the YAML the job came from (for messages)
    parallel: Mapping[str, int] = field(default_factory=dict)
    # Environment variables the job sets (MindSpeed-RL's cli/train_grpo.py sets HCCL_BUFFSIZE from
    # rl_config.hccl_buffersize); expand_mindspeed_config puts them in the driver's environment
    # unless already set there, asp-launch writes them before the driver command.
    env: Mapping[str, str] = field(default_factory=dict)

    def describe_layout(self) -> str:
        lay, p = self.layout, self.parallel
        tp, pp, ep, cp = p.get("tp", 1), p.get("pp", 1), p.get("ep", 1), p.get("cp", 1)
        itp, ipp, iep = p.get("itp", 1), p.get("ipp", 1), p.get("iep", 1)
        replica = tp * pp * cp
        dp = lay.train_devices // replica if replica and lay.train_devices % replica == 0 else 0
        megatron = f"Megatron TP {tp} x PP {pp}" + (f" x CP {cp}" if cp > 1 else "") + f", EP {ep}" + (
            f", data-parallel {dp}" if dp else "")
        span = lay.infer_instance_size // lay.devices_per_node
        instance = (f"{lay.instances} inference instance(s) of {lay.infer_instance_size}"
                    + (f" ({span} whole nodes each)" if span > 1 else "") + f" (infer TP {itp} x PP {ipp}, EP {iep})")
        if lay.hybrid:
            split = (f"mode=hybrid: every one of the {lay.num_npus} NPUs trains ({megatron}) and generates "
                     f"({instance}) in turn, as MindSpeed-RL does")
        else:
            split = (f"T = {lay.train_nodes} node(s) x {lay.devices_per_node} = {lay.train_devices} {lay.device_type} "
                     f"device(s) train ({megatron}), G = {lay.gen_nodes} node(s) x {lay.devices_per_node} = "
                     f"{lay.gen_devices} device(s) generate as {instance}")
        return "\n".join([
            f"layout {lay.name}: {lay.rule}",
            f"  MindSpeed-RL colocates actor, reference and rollout on all {lay.num_npus} devices "
            "(rl_config.actor_resource.num_npus)" + ("; so does mode=hybrid:" if lay.hybrid else "; ASP splits them:"),
            f"  {split}.",
            *self._planner_hint(),
        ])

    def _planner_hint(self) -> list[str]:
        if self.layout.hybrid and not self.layout.file:   # the fallback: no T/G split holds the job
            return ["  No T/G split of these NPUs holds the job, so asp-plan-layout has no split to sweep; with more "
                    "NPUs (or smaller parallel sizes) it has."]
        # The simulator draws lengths from sim.* (or sim.lengths_file), not from the data: no task keys.
        return ["  For a split tuned to this job (instance size, staleness, minibatch size) run:",
                "  asp-plan-layout " + " ".join(o for o in self.overrides if o.split("=")[0].split(".")[0] != "task")
                + "   (it sweeps the split and drops the keys it sweeps)"]

    def describe(self) -> str:
        lines = [f"# {len(self.overrides)} override(s) from {self.source or 'the MindSpeed-RL job'}:"]
        lines += [f"  {o}" for o in self.overrides]
        lines.append(f"# {len(self.ignored)} key(s) ignored or passed through: no override needed (each with why: "
                     "speed or bookkeeping only, what this project does anyway, or applied by MindSpeed-RL's own "
                     "actor):")
        lines += [f"  {i.key}: {i.reason}" for i in self.ignored]
        if self.env:
            lines.append("# environment (the driver's, unless you set it; every actor inherits it): "
                         + " ".join(f"{k}={v}" for k, v in self.env.items()))
        lines.append(self.describe_layout())
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Key rules. Each handler gets (builder, "section.key", value) and either records an
# override target, records the key as ignored, or raises MindSpeedImportError.
# ---------------------------------------------------------------------------------------

Handler = Callable[["_Builder", str, Any], None]


class _Builder:
    """Collects targets (override key -> value) and ignored keys while the rules run."""

    def __init__(self, engine: str = "hf") -> None:
        # engine=mindspeed trains with MindSpeed-RL's own actor, which reads the same YAML:
        # its optimizer, schedule and loss keys are honoured there (ACTOR_HONOURS).
        self.engine = engine
        self.values: dict[str, Any] = {}
        self.ignored: list[Ignored] = []
        self.seen: dict[str, Any] = {}     # "section.key" -> value, for cross-key rules

    @property
    def actor(self) -> bool:
        return self.engine == "mindspeed"

    def set(self, target: str, value: Any) -> None:
        self.values[target] = value

    def ignore(self, key: str, reason: str) -> None:
        self.ignored.append(Ignored(key, reason))


def refuse(key: str, value: Any, why: str, fix: str) -> MindSpeedImportError:
    return MindSpeedImportError(f"MindSpeed-RL key {key}={value!r}: {why}; {fix}")


def _number(key: str, value: Any, kind: type = float):
    """YAML reads ``1e-6`` (no dot) as a string: accept numbers written either way."""
    if isinstance(value, bool):
        raise refuse(key, value, f"expected a {kind.__name__}", "write a number")
    try:
        number = kind(float(value)) if kind is int else kind(value)
    except (TypeError, ValueError):
        raise refuse(key, value, f"expected a {kind.__name__}", "write a number") from None
    if kind is int and float(value) != number:
        raise refuse(key, value, "expected a whole number", "write an integer")
    return number


def to(target: str, kind: Optional[type] = None, convert: Optional[Callable[[Any], Any]] = None) -> Handler:
    def handle(b: _Builder, key: str, value: Any) -> None:
        v = _number(key, value, kind) if kind in (int, float) else value
        b.set(target, convert(v) if convert else v)
    return handle


def positive(target: str) -> Handler:
    def handle(b: _Builder, key: str, value: Any) -> None:
        v = _number(key, value, int)
        if v < 1:
            raise refuse(key, value, "must be at least 1", "write a positive integer")
        b.set(target, v)
    return handle


def ignore(reason: str) -> Handler:
    return lambda b, key, value: b.ignore(key, reason)


ACTOR_HONOURS = ("with engine=mindspeed MindSpeed-RL's own Megatron actor trains from this YAML "
                 "(engine.mindspeed_config) and applies it")
PASSED_THROUGH = ("passed through: with engine=mindspeed MindSpeed-RL's own actor is built from this YAML "
                  "(engine.mindspeed_config) and applies it")


def only(accepted: Sequence[Any], why: str, fix: str, reason: str, actor: bool = False) -> Handler:
    """A key whose accepted values are what this project does anyway (recorded as ignored
    with ``reason``); any other value is refused with ``why`` and ``fix``. ``actor``: a key
    of MindSpeed-RL's actor (optimizer, schedule, loss), which engine=mindspeed honours
    whatever its value."""
    def handle(b: _Builder, key: str, value: Any) -> None:
        if actor and b.actor:
            b.ignore(key, f"{value!r}: {ACTOR_HONOURS}")
            return
        if not any(_same(value, a) for a in accepted):
            raise refuse(key, value, why, fix + " (or train with engine=mindspeed, whose MindSpeed-RL actor "
                         "honours it)" if actor else fix)
        b.ignore(key, reason)
    return handle


def actor_only(why: str, fix: str) -> Handler:
    """A key only MindSpeed-RL's own actor can honour (LoRA, no-op layers, its Megatron
    checkpoint): passed through with engine=mindspeed, refused (``why``, ``fix``) otherwise."""
    def handle(b: _Builder, key: str, value: Any) -> None:
        if not b.actor:
            raise refuse(key, value, f"{why} (engine={b.engine})", f"{fix}, or train with engine=mindspeed, "
                         "whose MindSpeed-RL actor applies it")
        b.ignore(key, f"{value!r}: {PASSED_THROUGH}")
    return handle


def note(b: _Builder, key: str, value: Any) -> None:
    """Read by a cross-key rule after every section ran (see :func:`_cross_key_rules`)."""
    b.seen[key] = value


def _same(value: Any, accepted: Any) -> bool:
    if isinstance(accepted, bool) or isinstance(value, bool):
        return value is accepted or (value in (None,) and accepted is False)
    if isinstance(accepted, (int, float)):
        try:
            return float(value) == float(accepted)
        except (TypeError, ValueError):
            return False
    return value == accepted


def unhonoured(why: str, fix: str) -> Handler:
    def handle(b: _Builder, key: str, value: Any) -> None:
        raise refuse(key, value, why, fix)
    return handle


def adam(target: str) -> Handler:
    """An AdamW beta: MindSpeed-RL's actor takes it with engine=mindspeed; this project's
    trainer (train.adam_beta1/2) with the hf engine."""
    mapped = to(target, float)

    def handle(b: _Builder, key: str, value: Any) -> None:
        if b.actor:
            b.ignore(key, f"{value!r}: {ACTOR_HONOURS}")
        else:
            mapped(b, key, value)
    return handle


SPEED = "a fused kernel or memory/speed switch of Megatron / MindSpeed; no effect on the algorithm"
CHECKPOINT = "Megatron checkpoint plumbing; this project loads the Hugging Face checkpoint at model.path and saves into run_dir"
LOGGING = "logging; this project writes metrics.jsonl and TensorBoard into run_dir"
DISPATCH = ("MindSpeed-RL's TransferDock dispatch granularity; ASP's Control Unit dispatches the planned "
            "minibatches instead")
COLOCATION = ("offloading between the colocated train and generate phases; in ASP's decoupled layout "
              "nothing is swapped (mode=hybrid swaps by phase)")
ARCHITECTURE = "architecture detail; the checkpoint's config.json at model.path is what the model is built from"
DATA_ORDER = "data order; ASP's planner orders the prompts (scheduler=asp|fifo|sorted)"
EPLB = ("expert load balancing (EPLB): where vLLM places the MoE experts and its token counts; speed only, the "
        "model and its outputs are the same")
LORA = actor_only("LoRA adapters are not supported by this project's trainer", "train full weights (delete the "
                  "lora_* keys)")
MEGATRON_LOAD = actor_only("a Megatron checkpoint, which this project's trainer cannot read (it loads the Hugging "
                           "Face checkpoint at tokenizer_name_or_path)", "delete load")


MEGATRON_KEYS: dict[str, Handler] = {
    "model": note,
    "tokenizer_name_or_path": to("model.path"),
    "tokenizer_type": only(["PretrainedFromHF"], "only Hugging Face tokenizers load here",
                           "use tokenizer_type: PretrainedFromHF with a Hugging Face checkpoint directory",
                           "the tokenizer is the one at model.path (tokenizer_name_or_path)"),
    "global_batch_size": positive("rl.global_batch_size"),
    "seq_length": ignore("Megatron's padded training length; this trainer pads each micro-batch to its "
                         "longest sample (the lengths are bounded by max_prompt_length + max_tokens)"),
    "save_interval": to("save_every", int),
    "train_iters": positive("steps"),
    "seed": to("seed", int),
    "stage": note,
    "data_path": note,
    "split": only(["100,0,0"], "only a training split is read", "write split: 100,0,0 (held-out prompts come "
                  "from task.eval_path)", "the whole file trains (held-out prompts: task.eval_path)"),
    "no_shuffle": ignore(DATA_ORDER),
    "full_shuffle_instruction_dataset": ignore(DATA_ORDER),
    "dataset_additional_keys": note,
    "bf16": note,
    "tensor_model_parallel_size": positive("model.tensor_model_parallel_size"),
    "pipeline_model_parallel_size": positive("model.pipeline_model_parallel_size"),
    "micro_batch_size": positive("rl.micro_batch_size"),
    "lr": to("train.lr", float),
    "lr_decay_style": note, "lr_warmup_fraction": note, "lr_warmup_iters": note, "min_lr": note,
    "weight_decay": to("train.weight_decay", float),
    "clip_grad": to("train.clip_grad", float),
    "adam_beta1": adam("train.adam_beta1"),
    "adam_beta2": adam("train.adam_beta2"),
    "attention_dropout": only([0.0], "dropout is off in RL training here", "set it to 0.0", "no dropout", True),
    "hidden_dropout": only([0.0], "dropout is off in RL training here", "set it to 0.0", "no dropout", True),
    "init_method_std": ignore("initialisation of new weights; the policy is loaded, never initialised"),
    "load": MEGATRON_LOAD, "save": ignore(CHECKPOINT), "finetune": ignore(CHECKPOINT),
    "no_load_optim": ignore(CHECKPOINT), "no_load_rng": ignore(CHECKPOINT),
    "no_save_optim": ignore(CHECKPOINT + " (save_every checkpoints always hold the optimizer and RNG)"),
    "no_save_rng": ignore(CHECKPOINT + " (save_every checkpoints always hold the optimizer and RNG)"),
    "no_shared_storage": ignore(CHECKPOINT),
    "distributed_backend": ignore("this project picks gloo / nccl / hccl from layout.device_type"),
    "log_interval": ignore(LOGGING), "eval_interval": ignore(LOGGING), "eval_iters": ignore(LOGGING),
    "norm_epsilon": ignore(ARCHITECTURE), "qk_layernorm": ignore(ARCHITECTURE),
    "use_rotary_position_embeddings": ignore(ARCHITECTURE),
    "reset_attention_mask": ignore("packing of several samples into one row; this trainer pads instead"),
    "attention_mask_type": ignore("packing of several samples into one row; this trainer pads instead"),
    "no_pad_to_seq_lengths": ignore(SPEED),
    **{k: ignore(SPEED) for k in (
        "use_fused_rmsnorm", "use_mcore_models", "sequence_parallel", "use_flash_attn", "no_masked_softmax_fusion",
        "attention_softmax_in_fp32", "no_gradient_accumulation_fusion", "use_fused_swiglu", "use_fused_rotary_pos_emb",
        "use_distributed_optimizer", "moe_alltoall_overlap_comm", "moe_grouped_gemm", "moe_permutation_async_comm",
        "gemm_gradient_accumulation_fusion", "overlap_grad_reduce", "reuse_fp32_param", "swap_attention",
        "swap_optimizer", "recompute_granularity", "recompute_method", "recompute_num_layers", "shape_order",
        "initial_loss_scale", "moe_tp_extend_ep", "context_parallel_algo", "num_layer_list")},
    **{k: LORA for k in ("lora_r", "lora_alpha", "lora_fusion", "lora_target_modules", "lora_ckpt_filter")},
}

# actor_config overrides megatron_training key by key, as in MindSpeed-RL.
ACTOR_KEYS: dict[str, Handler] = {
    **MEGATRON_KEYS,
    "expert_model_parallel_size": positive("model.expert_model_parallel_size"),
    "context_parallel_size": positive("model.context_parallel_size"),
    # No-op layers pad a layer count so that pipeline stages are even (Megatron's noop_layers):
    # MindSpeed-RL's actor builds them; this project's trainer loads the checkpoint's own layers.
    "noop_layers": actor_only("no-op padding layers change the model this project's trainer loads",
                              "delete noop_layers and num_layers and use the checkpoint's own layers"),
    "num_layers": actor_only("a layer count other than the checkpoint's changes the model this project's "
                             "trainer loads", "delete it: the checkpoint's config.json gives the layers"),
}

RL_KEYS: dict[str, Handler] = {
    "n_samples_per_prompt": positive("rl.n_samples_per_prompt"),
    # Written in prompts (RLConfig multiplies it by n_samples_per_prompt afterwards): ours counts prompts too.
    "mini_batch_size": positive("rl.mini_batch_size"),
    "max_prompt_length": positive("rl.max_prompt_length"),
    "epochs": only([1], "this project makes one pass of updates over each step's samples",
                   "set rl_config.epochs: 1", "one pass of updates per step (rl.global_batch_size / "
                   "rl.mini_batch_size optimizer updates)"),
    "clip_ratio": note, "clip_higher_enable": note, "clip_ratio_low": note, "clip_ratio_high": note,
    "kl_penalty": note, "kl_ctrl_type": note, "init_kl_coef": note, "kl_horizon": note, "kl_target": note,
    "token_level_loss": note,
    "adv_estimator": only(["group_norm"], "only GRPO's group-normalised advantages are implemented",
                          "set adv_estimator: group_norm (GAE needs a critic this project does not have)",
                          "GRPO group normalisation: algo.scale_advantages=true"),
    "gamma": ignore("GAE discount; unused by group_norm advantages"),
    "lam": ignore("GAE lambda; unused by group_norm advantages"),
    "advantage_whiten": ignore("GAE whitening; unused by group_norm advantages"),
    "entropy_coeff": only([0.0], "the loss has no entropy bonus", "set entropy_coeff: 0", "no entropy bonus", True),
    "use_kl_in_reward": only([False], "the KL term is in the loss here, never in the reward",
                             "set use_kl_in_reward: false (init_kl_coef then weights the KL in the loss)",
                             "KL in the loss (algo.kl_coef)"),
    "rule_reward": only([True], "only rule rewards are implemented (no reward model)",
                        "set rule_reward: true and name the rules in verifier_function", "rule rewards"),
    "verifier_function": note, "verifier_weight": note,
    "verifier_parallel": ignore("reward evaluation concurrency; rewards are computed in the trainer"),
    "verifier_timeout": ignore("reward evaluation timeout; math_verify takes MATH_VERIFY_TIMEOUT_S"),
    "actor_resource": note,
    "shuffle_mini_batch": only([False], "minibatches are taken in the order the planner made them",
                               "set shuffle_mini_batch: false", "minibatches in plan order"),
    "use_integrated_worker": only([True], "the separate-worker mode has no ASP equivalent",
                                  "set use_integrated_worker: true", "one actor worker: ASP's Training Unit"),
    "blocking": ignore("MindSpeed-RL's synchronous pipeline switch; ASP's Control Unit decides what waits"),
    "guarantee_order": ignore(DATA_ORDER),
    "async_engine": ignore("MindSpeed-RL's in-process async rollout; ASP's generation actors are asynchronous"),
    "num_cpus_for_local_task": ignore("Ray CPUs for MindSpeed-RL's own driver task"),
    "num_cpus_for_placement_group": ignore("Ray CPUs per MindSpeed-RL bundle; this project sizes its bundles by layout"),
    "hccl_buffersize": positive("env.HCCL_BUFFSIZE"),   # MB; cli/train_grpo.py exports it (see ImportResult.env)
    "zmq_communication": ignore(DISPATCH), "data_strategy": ignore(DISPATCH),
    "log_max_throughput": ignore(LOGGING), "use_tensorboard": ignore(LOGGING), "use_wandb": ignore(LOGGING),
    "wandb_project": ignore(LOGGING), "wandb_exp_name": ignore(LOGGING), "wandb_save_dir": ignore(LOGGING),
    "use_swanlab": ignore(LOGGING), "swanlab_mode": ignore(LOGGING), "swanlab_project": ignore(LOGGING),
    "swanlab_exp_name": ignore(LOGGING), "swanlab_save_dir": ignore(LOGGING),
    # DAPO (rl_config.py): read together by _dapo_rules.
    **{k: note for k in ("filter_groups_enable", "filter_groups_metric", "filter_groups_max_batches",
                         "filter_groups_train_batch_size", "overlong_buffer_enable", "overlong_buffer",
                         "overlong_buffer_penalty_factor", "rollout_max_tokens")},
    "multi_turn_enable": only([False], "multi-turn tool use is not implemented", "set multi_turn_enable: false",
                              "single-turn"),
    **{k: ignore(SPEED) for k in (
        "use_remove_padding", "use_dynamic_bsz", "max_packing_token_size", "ref_max_packing_token_size",
        "actor_max_packing_token_size", "update_max_packing_token_size", "dynamic_max_batch_size",
        "ref_dynamic_max_batch_size", "actor_dynamic_max_batch_size", "update_dynamic_max_batch_size",
        "use_dp_batch_balance", "actor_forward_micro_batch_size", "ref_forward_micro_batch_size",
        "tp_split_expert")},
    **{k: ignore(DISPATCH) for k in (
        "actor_rollout_dispatch_size", "actor_logprob_dispatch_size", "ref_dispatch_size", "reward_dispatch_size",
        "dynamic_sampling_dispatch_size", "adv_dispatch_size", "actor_update_dispatch_size", "kl_dispatch_size")},
    **{k: unhonoured("a separate model or worker besides the actor is not supported (GRPO with rule rewards "
                     "needs only the actor; the reference is a frozen copy of it)", "delete the key")
       for k in ("reference_resource", "reward_resource", "critic_resource", "vit_resource")},
    **{k: unhonoured("multi-turn tool use is not implemented", "delete the key")
       for k in ("tool_config_path", "max_tool_calls", "max_parallel_calls", "max_total_response_length",
                 "max_tool_response_length", "tool_response_truncate_side", "tool_parser_format")},
    "share_backbone": LORA,
}

SAMPLING_KEYS: dict[str, Handler] = {
    "max_tokens": positive("generate.sampling_config.max_tokens"),
    "temperature": to("generate.sampling_config.temperature", float),
    "top_p": to("generate.sampling_config.top_p", float),
    "top_k": to("generate.sampling_config.top_k", int, lambda k: 0 if k < 0 else k),
    "logprobs": only([0, 1], "the engines return only the sampled token's log-prob", "set logprobs: 1",
                     "the sampled token's log-prob is always returned"),
    "min_p": to("generate.sampling_config.min_p", float),
    "detokenize": ignore("rewards decode the tokens themselves"),
    "seed": ignore("sampling seeds derive from the run's seed (megatron_training.seed)"),
}

GENERATE_KEYS: dict[str, Handler] = {
    "infer_tensor_parallel_size": positive("model.infer_tensor_parallel_size"),
    "infer_pipeline_parallel_size": positive("model.infer_pipeline_parallel_size"),
    "infer_expert_parallel_size": positive("model.infer_expert_parallel_size"),
    "enable_expert_parallel": note,
    "max_num_seqs": positive("engine.max_num_seqs"),
    "max_model_len": positive("engine.max_model_len"),
    "gpu_memory_utilization": to("engine.gpu_memory_utilization", float),
    "enforce_eager": to("engine.enforce_eager"),
    "enable_prefix_caching": to("engine.enable_prefix_caching"),
    "dtype": note,
    "sampling_config": note,
    "max_num_batched_tokens": ignore("vLLM's token budget per scheduler step (speed)"),
    "trust_remote_code": ignore("checkpoints load with transformers' own Qwen2 / Qwen3 classes"),
    "torchair_graph": ignore(SPEED), "ascend_scheduler_config_enabled": ignore(SPEED),
    "num_scheduler_steps": ignore(SPEED),
    "offload_train_optimizer": ignore(COLOCATION), "offload_train_grad": ignore(COLOCATION),
    "offload_train_param": ignore(COLOCATION),
    "expert_map_path": ignore(EPLB), "eplb_token_collects": ignore(EPLB), "eplb_token_save_path": ignore(EPLB),
}

SECTION_KEYS = {"megatron_training": MEGATRON_KEYS, "actor_config": ACTOR_KEYS, "rl_config": RL_KEYS,
                "generate_config": GENERATE_KEYS}

# Megatron model-group keys -> this project's model.* architecture keys (configs/model/*.yaml).
MODEL_GROUP_KEYS = {
    "num_layers": "model.num_layers", "hidden_size": "model.hidden_size",
    "num_attention_heads": "model.num_attention_heads", "kv_channels": "model.head_dim",
    "padded_vocab_size": "model.vocab_size", "max_position_embeddings": "model.max_position_embeddings",
    "num_experts": "model.num_experts", "moe_router_topk": "model.num_experts_per_tok",
    "moe_ffn_hidden_size": "model.moe_intermediate_size",
}

REWARD_FIX = ("name one of this project's rewards (mindspeed_rl_asp/tasks/rewards.py keeps MindSpeed-RL's "
              "names: {names}) or your own as package.module:function")


def _unknown_key(key: str, table: Mapping[str, Handler]) -> MindSpeedImportError:
    import difflib

    close = difflib.get_close_matches(key.rpartition(".")[2], list(table), n=1)
    hint = f" (did you mean {key.rpartition('.')[0]}.{close[0]}?)" if close else ""
    return MindSpeedImportError(
        f"MindSpeed-RL key {key} is not known to the importer{hint}: it cannot say whether this project "
        "honours it; delete it, or map it in mindspeed_rl_asp/integrations/mindspeed/config_import.py")


def _run_section(b: _Builder, section: str, body: Any, table: Mapping[str, Handler]) -> None:
    if not isinstance(body, Mapping):
        raise MindSpeedImportError(f"MindSpeed-RL section {section} must be a mapping of keys, got {body!r}")
    for key, value in body.items():
        full = f"{section}.{key}"
        if key not in table:
            raise _unknown_key(full, table)
        table[key](b, full, value)


def model_group_name(job: Mapping[str, Any]) -> str:
    """The NAME of ``defaults: - model: NAME`` (or ``- model: [NAME]``); refuses without one."""
    fix = ("add `defaults: [{model: NAME}]` naming a file model/NAME.yaml beside the job YAML "
           "(or give its folder with --model-dir)")
    for entry in job.get("defaults") or []:
        if isinstance(entry, Mapping) and "model" in entry:
            name = entry["model"]
            if isinstance(name, (list, tuple)):
                if len(name) != 1:
                    raise refuse("defaults.model", name, "exactly one model group is needed", fix)
                name = name[0]
            if isinstance(name, str) and name:
                return name
    raise MindSpeedImportError(f"MindSpeed-RL key defaults.model is missing: the job names no model group; {fix}")


def _model_overrides(b: _Builder, name: str, group: Optional[Mapping[str, Any]]) -> None:
    if group is None:
        raise MindSpeedImportError(
            f"MindSpeed-RL key defaults.model={name!r}: no model group {name}.yaml was found; put the model "
            "group file in a folder model/ beside the job YAML or pass its folder with --model-dir")
    body = group.get(name, group)   # MindSpeed-RL wraps the group under its own name
    if not isinstance(body, Mapping):
        raise refuse("defaults.model", name, "the model group is not a mapping of keys", "check model/NAME.yaml")
    for key, target in MODEL_GROUP_KEYS.items():
        if key in body:
            b.set(target, _number(f"model.{name}.{key}", body[key], int))
    moe = int(body.get("num_experts") or 0) > 0
    if "ffn_hidden_size" in body and not moe:
        b.set("model.intermediate_size", _number(f"model.{name}.ffn_hidden_size", body["ffn_hidden_size"], int))
    heads = body.get("num_attention_heads")
    if body.get("group_query_attention") and "num_query_groups" in body:
        b.set("model.num_key_value_heads", _number(f"model.{name}.num_query_groups", body["num_query_groups"], int))
    elif heads:
        b.set("model.num_key_value_heads", int(heads))
    if "kv_channels" not in body and heads and body.get("hidden_size"):
        b.set("model.head_dim", int(body["hidden_size"]) // int(heads))
    if "untie_embeddings_and_output_weights" in body:
        b.set("model.tie_word_embeddings", not bool(body["untie_embeddings_and_output_weights"]))
    if not moe:
        b.set("model.num_experts", 0)
        b.set("model.num_experts_per_tok", 0)
        b.set("model.moe_intermediate_size", 0)
    b.set("model.name", name)
    b.set("model.family", "qwen3_moe" if moe else "qwen3" if body.get("qk_layernorm") else "qwen2")


def _user_choice(user_overrides: Sequence[str], key: str) -> Optional[str]:
    found = None
    for o in user_overrides:
        k, sep, v = o.lstrip("+~").partition("=")
        if sep and k == key:
            found = v
    return found


def _user_int(user_overrides: Sequence[str], key: str) -> Optional[int]:
    value = _user_choice(user_overrides, key)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise MindSpeedImportError(f"{key}={value!r}: expected a whole number") from None


# ---------------------------------------------------------------------------------------
# The layout: a shipped file the user names, or one made from the NPU count.
# ---------------------------------------------------------------------------------------

def _parallel(values: Mapping[str, Any]) -> Parallel:
    """What a layout must hold, from the imported model.* keys (with MindSpeed-RL's names)."""
    return Parallel(
        tp=values.get("model.tensor_model_parallel_size", 1), pp=values.get("model.pipeline_model_parallel_size", 1),
        cp=values.get("model.context_parallel_size", 1), ep=values.get("model.expert_model_parallel_size", 1),
        instance=values.get("layout.infer_instance_size", 1),
        keys="actor_config.tensor_model_parallel_size x pipeline_model_parallel_size x context_parallel_size",
        ep_key="actor_config.expert_model_parallel_size",
        instance_key="generate_config.infer_pipeline_parallel_size x max(infer_tensor_parallel_size, "
                     "infer_expert_parallel_size)")


def _device_type(user_overrides: Sequence[str], layouts: Mapping[str, Mapping[str, Any]]) -> str:
    """npu, unless the user chose a layout file or a device type (or CPU workers) that says otherwise."""
    requested = _user_choice(user_overrides, "layout")
    if requested in layouts:
        return str(layouts[requested].get("device_type", "npu"))
    chosen = _user_choice(user_overrides, "layout.device_type")
    if chosen:
        return chosen
    return "cpu" if _user_choice(user_overrides, "engine.mindspeed_workers") == "cpu" else "npu"


def choose_layout(num_npus: int, layouts: Mapping[str, Mapping[str, Any]], parallel: Parallel = Parallel(),
                  user_overrides: Sequence[str] = ()) -> LayoutMapping:
    """The layout of a job of ``num_npus`` devices.

    The user's ``layout=NAME``: that file; its devices (T + G nodes x devices per node;
    hybrid: every node) must equal ``num_npus`` and hold the job (config/layouts). A CPU
    job (``engine.mindspeed_workers=cpu`` or ``layout.device_type=cpu``) with a shipped CPU
    layout of ``num_npus`` devices: that file (``local`` has 3). Otherwise one made from
    ``num_npus`` by config/layouts.plan_layout, on nodes of ``layout.devices_per_node``
    (default 8), with the user's ``mode=``, ``layout.train_nodes`` / ``layout.gen_nodes``
    if given; a shipped file of exactly that geometry keeps its name.
    """
    requested = _user_choice(user_overrides, "layout")
    mode = _user_choice(user_overrides, "mode")
    if requested is not None:
        return _requested_layout(num_npus, layouts, requested, mode == "hybrid", parallel)
    device_type = _device_type(user_overrides, layouts)
    if device_type == "cpu":
        for name, lay in sorted(layouts.items()):
            if lay.get("device_type") == "cpu" and _file_devices(lay, mode == "hybrid") == num_npus:
                return _requested_layout(num_npus, layouts, name, mode == "hybrid", parallel,
                                         f"the shipped CPU layout of {num_npus} devices")
    per_node = _user_int(user_overrides, "layout.devices_per_node") or (
        DEFAULT_DEVICES_PER_NODE if device_type == "npu" else 1)
    try:
        plan = plan_layout(num_npus, per_node, parallel, mode, _user_int(user_overrides, "layout.train_nodes"),
                           _user_int(user_overrides, "layout.gen_nodes"), "rl_config.actor_resource.num_npus")
    except LayoutRefused as error:
        raise MindSpeedImportError(f"MindSpeed-RL key rl_config.actor_resource.num_npus={num_npus}: {error}") from None
    name = (f"{'ascend910b3' if device_type == 'npu' else device_type}_"
            + (f"hybrid{plan.nodes}" if plan.hybrid else f"t{plan.train_nodes}g{plan.gen_nodes}"))
    same = [n for n, lay in sorted(layouts.items()) if _same_geometry(lay, plan, device_type)]
    rule = f"made from {num_npus} NPUs on nodes of {per_node} (layout.devices_per_node): {plan.rule}"
    return LayoutMapping(same[0] if same else name, rule, num_npus, device_type, plan.nodes, per_node,
                         plan.train_nodes, plan.gen_nodes, parallel.instance, plan.hybrid, same[0] if same else None,
                         NPU_ACCELERATOR if device_type == "npu" else device_type.upper(),
                         None if same else _base_layout(layouts, device_type, per_node, plan.hybrid))


def _base_layout(layouts: Mapping[str, Mapping[str, Any]], device_type: str, per_node: int,
                 hybrid: bool) -> Optional[str]:
    """The shipped file a made layout sits on: of its device type, not a hybrid one, nodes of
    the same size first, then the fewest T + G nodes (so that a tool that drops the split's
    keys is left with one that fits), then by name. ``hybrid`` does not change the choice:
    the split's keys are set either way."""
    kinds = [(lay.get("devices_per_node") != per_node, lay["train_nodes"] + lay["gen_nodes"], n)
             for n, lay in layouts.items() if lay.get("device_type") == device_type and not n.endswith("_hybrid")]
    return min(kinds)[2] if kinds else None


def _file_devices(lay: Mapping[str, Any], hybrid: bool) -> int:
    used = lay["nodes"] if hybrid else lay["train_nodes"] + lay["gen_nodes"]
    return used * lay["devices_per_node"]


def _same_geometry(lay: Mapping[str, Any], plan, device_type: str) -> bool:
    if lay.get("device_type") != device_type or lay.get("devices_per_node") != plan.devices_per_node:
        return False
    if plan.hybrid:
        return lay.get("name", "").endswith("_hybrid") and lay.get("nodes") == plan.nodes
    return (not lay.get("name", "").endswith("_hybrid") and lay.get("train_nodes") == plan.train_nodes
            and lay.get("gen_nodes") == plan.gen_nodes and lay.get("nodes") == plan.nodes)


def _requested_layout(num_npus: int, layouts: Mapping[str, Mapping[str, Any]], requested: str, hybrid: bool,
                      parallel: Parallel, rule: str = "") -> LayoutMapping:
    key = "rl_config.actor_resource.num_npus"
    if requested not in layouts:
        raise MindSpeedImportError(f"layout={requested}: no such layout; choose one of {', '.join(sorted(layouts))}, "
                                   "or leave layout= out to have one made from num_npus")
    lay = layouts[requested]
    devices = _file_devices(lay, hybrid)
    if devices != num_npus:
        used = "nodes" if hybrid else "train_nodes + gen_nodes"
        raise MindSpeedImportError(
            f"MindSpeed-RL key {key}={num_npus} does not match layout {requested}, which uses {devices} "
            f"devices (({used}) x devices_per_node); set {key}: {devices}, choose a layout of {num_npus} devices, "
            "or leave layout= out to have one made from num_npus")
    from ...config.layouts import split_problem, train_problem

    per_node = lay["devices_per_node"]
    problem = (train_problem(parallel, devices, f"layout {requested}") if hybrid else
               split_problem(parallel, per_node, lay["train_nodes"], lay["gen_nodes"]))
    if problem:
        raise MindSpeedImportError(f"layout={requested} cannot hold the job: {problem}; choose another layout or "
                                   "leave layout= out to have one made from num_npus")
    nodes = lay["nodes"] if hybrid else lay["train_nodes"] + lay["gen_nodes"]
    return LayoutMapping(requested, rule or f"the layout you chose ({devices} devices = num_npus)", num_npus,
                         lay["device_type"], nodes, per_node, lay["train_nodes"], lay["gen_nodes"],
                         parallel.instance, hybrid, requested, lay.get("accelerator", NPU_ACCELERATOR))


# ---------------------------------------------------------------------------------------
# Rules that read several keys, after every section ran.
# ---------------------------------------------------------------------------------------

def _cross_key_rules(b: _Builder, user_overrides: Sequence[str], reward_names: Optional[Sequence[str]]) -> None:
    """Every rule that reads keys of several sections, in the order their overrides print."""
    _stage_rule(b)
    _learning_rate_rules(b)
    _clip_rules(b)
    _kl_rules(b)
    _advantage_rules(b)
    _reward_rules(b, reward_names)
    _data_rules(b, user_overrides)
    _precision_rules(b)
    _inference_rules(b)
    _dapo_rules(b)


def _stage_rule(b: _Builder) -> None:
    stage = b.seen.get("megatron_training.stage")
    if stage is not None and stage not in GRPO_STAGES:
        raise refuse("megatron_training.stage", stage, "this project runs GRPO only",
                     f"use a GRPO or DAPO job (stage: {' or '.join(GRPO_STAGES)})")


def _learning_rate_rules(b: _Builder) -> None:
    """Constant, no warm-up, with this project's trainer; anything with MindSpeed-RL's actor."""
    s, actor = b.seen, b.actor
    style = s.get("actor_config.lr_decay_style", s.get("megatron_training.lr_decay_style", "constant"))
    if style != "constant" and not actor:
        raise refuse("actor_config.lr_decay_style", style, "this project's trainer keeps the learning rate constant",
                     "set lr_decay_style: constant (or train with engine=mindspeed, whose MindSpeed-RL actor "
                     "honours it)")
    for key in ("lr_warmup_fraction", "lr_warmup_iters"):
        for section in ("megatron_training", "actor_config"):
            value = s.get(f"{section}.{key}")
            if value is not None and not _same(value, 0) and not actor:
                raise refuse(f"{section}.{key}", value, "there is no learning-rate warm-up here",
                             f"set {key}: 0 (or train with engine=mindspeed, whose MindSpeed-RL actor honours it)")
            if value is not None:
                b.ignore(f"{section}.{key}", f"{value!r}: {ACTOR_HONOURS}" if actor else
                         "no warm-up (constant learning rate)")
    for section in ("megatron_training", "actor_config"):
        for key in ("lr_decay_style", "min_lr"):
            if f"{section}.{key}" in s:
                b.ignore(f"{section}.{key}", f"{s[f'{section}.{key}']!r}: {ACTOR_HONOURS}" if actor else
                         "constant learning rate (train.lr)")


def _clip_rules(b: _Builder) -> None:
    """A symmetric clip_ratio, or DAPO's clip-higher pair."""
    s = b.seen
    if s.get("rl_config.clip_higher_enable"):
        b.set("algo.clip_ratio_low", _number("rl_config.clip_ratio_low", s.get("rl_config.clip_ratio_low", 0.1)))
        b.set("algo.clip_ratio_high", _number("rl_config.clip_ratio_high", s.get("rl_config.clip_ratio_high", 0.1)))
        if "rl_config.clip_ratio" in s:
            b.ignore("rl_config.clip_ratio", "clip_higher_enable: clip_ratio_low / clip_ratio_high apply")
        return
    ratio = _number("rl_config.clip_ratio", s.get("rl_config.clip_ratio", 0.2))
    b.set("algo.clip_ratio_low", ratio)
    b.set("algo.clip_ratio_high", ratio)
    for key in ("clip_ratio_low", "clip_ratio_high", "clip_higher_enable"):
        if f"rl_config.{key}" in s:
            b.ignore(f"rl_config.{key}", "clip_higher_enable is off: clip_ratio applies to both sides")


def _kl_rules(b: _Builder) -> None:
    """The coefficient, the estimator and its control (fixed here; adaptive by MindSpeed-RL's actor)."""
    s, actor = b.seen, b.actor
    ctrl = s.get("rl_config.kl_ctrl_type", "fixed")
    if ctrl != "fixed" and not actor:
        raise refuse("rl_config.kl_ctrl_type", ctrl, "only a fixed KL coefficient is implemented in this project's "
                     "trainer", "set kl_ctrl_type: fixed (or train with engine=mindspeed, whose MindSpeed-RL actor "
                     "takes MindSpeed-RL's KL controller)")
    if ctrl != "fixed":
        b.ignore("rl_config.kl_ctrl_type", f"{ctrl!r}: {ACTOR_HONOURS}")
    for key in ("kl_horizon", "kl_target"):
        if f"rl_config.{key}" in s:
            b.ignore(f"rl_config.{key}", f"{ACTOR_HONOURS}" if ctrl != "fixed" else
                     "adaptive KL control is off (kl_ctrl_type: fixed)")
    penalty = s.get("rl_config.kl_penalty", "low_var_kl")
    estimators = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
    if penalty not in estimators and not (actor and penalty == "abs"):
        raise refuse("rl_config.kl_penalty", penalty, "this project's KL estimators are kl (k1), mse (k2) and "
                     "low_var_kl (k3)", "choose one of kl, mse, low_var_kl" + (
                         " (or train with engine=mindspeed, whose MindSpeed-RL actor honours abs)"
                         if penalty == "abs" else ""))
    if penalty in estimators:
        b.set("algo.kl_estimator", estimators[penalty])
    else:   # engine=mindspeed: MindSpeed-RL's loss applies kl_penalty itself
        b.ignore("rl_config.kl_penalty", f"{penalty!r}: {ACTOR_HONOURS}")
    b.set("algo.kl_coef", _number("rl_config.init_kl_coef", s.get("rl_config.init_kl_coef", 0.01)))


def _advantage_rules(b: _Builder) -> None:
    """group_norm with MindSpeed-RL's sample std and epsilon; its loss aggregation."""
    b.set("algo.scale_advantages", True)
    b.set("algo.adv_std", "sample")
    b.set("algo.adv_eps", MINDSPEED_ADV_EPS)
    token_level = b.seen.get("rl_config.token_level_loss", True)
    b.set("algo.loss_agg", "token_mean" if token_level else "seq_mean_token_mean")


def _reward_rules(b: _Builder, reward_names: Optional[Sequence[str]]) -> None:
    """MindSpeed-RL's rule names are this project's registry names."""
    s = b.seen
    functions = s.get("rl_config.verifier_function", ["base_acc"])
    weights = s.get("rl_config.verifier_weight", [1.0] * len(functions))
    if not isinstance(functions, (list, tuple)) or not functions:
        raise refuse("rl_config.verifier_function", functions, "expected a list of reward names",
                     "write verifier_function: [NAME, ...]")
    if not isinstance(weights, (list, tuple)) or len(weights) != len(functions):
        raise refuse("rl_config.verifier_weight", weights, f"expected {len(functions)} weight(s), one per "
                     "verifier_function", "give one weight per reward")
    if reward_names is not None:
        for name in functions:
            if ":" not in str(name) and name not in reward_names:
                raise refuse("rl_config.verifier_function", name, "not a reward this project has",
                              REWARD_FIX.format(names=", ".join(sorted(reward_names))))
    b.set("task.verifier_function", [str(f) for f in functions])
    b.set("task.verifier_weight", [_number("rl_config.verifier_weight", w) for w in weights])


def _data_rules(b: _Builder, user_overrides: Sequence[str]) -> None:
    """A raw jsonl / parquet file, or a preprocessed (Megatron indexed) dataset prefix: both
    task=dataset (tasks/megatron_data.py reads the prefix's .bin / .idx files). A task= of
    the user's replaces it."""
    s = b.seen
    data = s.get("megatron_training.data_path")
    extra = s.get("megatron_training.dataset_additional_keys") or []
    if "megatron_training.dataset_additional_keys" in s:
        b.ignore("megatron_training.dataset_additional_keys", f"{list(extra)}: columns of the preprocessed dataset; "
                 "labels is the reference answer (task.answer_key)")
    if data is None:
        return
    if _user_choice(user_overrides, "task") == "maze":
        b.ignore("megatron_training.data_path", "replaced by your task=maze (generated prompts)")
        return
    b.set("task", "dataset")   # a task group of the user's (e.g. maze_dataset) replaces it
    b.set("task.path", str(data))
    if not any(_user_choice(user_overrides, k) for k in ("scheduler.predictor", "task.reference_key", "task")):
        # MindSpeed-RL's data has no reference responses to plan by: the predictor in the loop
        # profiles a share of the prompts with the starting policy and predicts the rest.
        b.set("scheduler.predictor", "ridge")
    if not str(data).endswith((".jsonl", ".parquet", ".json")):
        # MindSpeed-RL's preprocess_data.py: <prefix>_packed_<field>_document.{bin,idx}; the prompt is
        # input_ids (chat template applied when it was preprocessed), the answer the labels column.
        b.set("task.prompt_key", "input_ids")
        b.set("task.answer_key", "labels" if "labels" in extra else "")
        b.set("task.chat_template", "never")


def _precision_rules(b: _Builder) -> None:
    s = b.seen
    dtype = s.get("generate_config.dtype")
    bf16 = s.get("actor_config.bf16", s.get("megatron_training.bf16"))
    chosen = dtype or ("bfloat16" if bf16 else None)
    if dtype and bf16 is not None and (dtype == "bfloat16") != bool(bf16):
        raise refuse("generate_config.dtype", dtype, "training and generation would use different precisions "
                     f"(bf16: {bf16})", "make generate_config.dtype and bf16 agree")
    if chosen:
        b.set("engine.dtype", chosen)
        b.set("model.dtype", chosen)
    for key in ("megatron_training.bf16", "actor_config.bf16"):
        if key in s:
            b.ignore(key, f"precision: engine.dtype / model.dtype = {chosen or 'the default'}")


def _inference_rules(b: _Builder) -> None:
    """Sampling, and inference parallelism -> one instance's devices."""
    s = b.seen
    sampling = s.get("generate_config.sampling_config")
    if sampling is not None:
        _run_section(b, "generate_config.sampling_config", sampling, SAMPLING_KEYS)
    min_p = b.values.get("generate.sampling_config.min_p", 0.0)
    if not 0.0 <= min_p < 1.0:
        raise refuse("generate_config.sampling_config.min_p", min_p, "must be in [0, 1)", "write a probability")
    itp = b.values.get("model.infer_tensor_parallel_size", 1)
    ipp = b.values.get("model.infer_pipeline_parallel_size", 1)
    iep = b.values.get("model.infer_expert_parallel_size", 1)
    expert_parallel = s.get("generate_config.enable_expert_parallel")
    if iep > 1 and expert_parallel is False:
        raise refuse("generate_config.enable_expert_parallel", False, f"infer_expert_parallel_size={iep} needs "
                     "expert parallelism", "set enable_expert_parallel: true or infer_expert_parallel_size: 1")
    if expert_parallel is not None:
        b.ignore("generate_config.enable_expert_parallel", f"implied by infer_expert_parallel_size={iep}")
    # vLLM's expert-parallel group is its data x tensor parallel ranks, so an instance spans
    # max(TP, EP) devices per pipeline stage.
    b.set("layout.infer_instance_size", ipp * max(itp, iep))
    b.set("engine.tensor_parallel_size", itp)


def _dapo_rules(b: _Builder) -> None:
    """DAPO's dynamic sampling and overlong shaping (rl_config.py's keys) -> algo.*."""
    s = b.seen
    off = "dynamic sampling is off (filter_groups_enable: false)"
    if s.get("rl_config.filter_groups_enable"):
        _filter_groups_rule(b)
    else:
        for key in ("filter_groups_enable", "filter_groups_metric", "filter_groups_max_batches",
                    "filter_groups_train_batch_size"):
            if f"rl_config.{key}" in s:
                b.ignore(f"rl_config.{key}", off if key != "filter_groups_enable" else "no dynamic sampling")
    if s.get("rl_config.overlong_buffer_enable"):
        _overlong_rule(b)
        return
    for key in ("overlong_buffer_enable", "overlong_buffer", "overlong_buffer_penalty_factor", "rollout_max_tokens"):
        if f"rl_config.{key}" in s:
            b.ignore(f"rl_config.{key}", "no overlong penalty" if key == "overlong_buffer_enable" else
                     "the overlong penalty is off (overlong_buffer_enable: false); responses are bounded by "
                     "sampling_config.max_tokens")


def _filter_groups_rule(b: _Builder) -> None:
    s = b.seen
    metric = s.get("rl_config.filter_groups_metric", "acc")
    functions = b.values.get("task.verifier_function", [])
    if metric not in functions:
        raise refuse("rl_config.filter_groups_metric", metric, "dynamic sampling reads the spread of one of the "
                     f"job's rewards, and verifier_function is {functions}", "name one of them")
    # Both count generation batches of global_batch_size prompts per step, the first included; <= 0: no limit.
    most = max(0, _number("rl_config.filter_groups_max_batches", s.get("rl_config.filter_groups_max_batches", 1), int))
    b.set("algo.filter_groups", "std")
    b.set("algo.filter_groups_metric", str(metric))
    b.set("algo.max_num_gen_batches", most)
    b.ignore("rl_config.filter_groups_enable", "algo.filter_groups=std: a group whose metric has zero std is "
             "dropped and more prompts are generated")
    train_batch = s.get("rl_config.filter_groups_train_batch_size")
    if train_batch is not None:
        kept = _number("rl_config.filter_groups_train_batch_size", train_batch, int)
        generated = b.values.get("rl.global_batch_size")
        b.set("rl.global_batch_size", kept)
        b.ignore("rl_config.filter_groups_train_batch_size", f"{kept} kept groups per step: rl.global_batch_size")
        if generated is not None and generated != kept:
            b.ignore("megatron_training.global_batch_size", f"{generated}: MindSpeed-RL's generation batch; ASP's "
                     "Control Unit keeps dispatching minibatches until a step has its kept groups")


def _overlong_rule(b: _Builder) -> None:
    s = b.seen
    buffer = _number("rl_config.overlong_buffer", s.get("rl_config.overlong_buffer", 0), int)
    max_tokens = b.values.get("generate.sampling_config.max_tokens")
    if buffer < 1 or (max_tokens is not None and buffer >= max_tokens):
        raise refuse("rl_config.overlong_buffer", buffer, f"must be in [1, sampling_config.max_tokens={max_tokens})",
                     "shorten the buffer or turn overlong_buffer_enable off")
    rollout = s.get("rl_config.rollout_max_tokens", 2048)    # RLConfig's default
    if max_tokens is not None and _number("rl_config.rollout_max_tokens", rollout, int) != max_tokens:
        raise refuse("rl_config.rollout_max_tokens", rollout, f"the penalty counts from it, and "
                     f"generate_config.sampling_config.max_tokens is {max_tokens} (MindSpeed-RL refuses the same)",
                     "make the two equal")
    b.set("algo.overlong_buffer_len", buffer)
    b.set("algo.overlong_penalty_factor",
          _number("rl_config.overlong_buffer_penalty_factor", s.get("rl_config.overlong_buffer_penalty_factor", 1.0)))
    for key in ("overlong_buffer_enable", "rollout_max_tokens"):
        if f"rl_config.{key}" in s:
            b.ignore(f"rl_config.{key}", f"{s[f'rl_config.{key}']!r}: the overlong penalty counts from "
                     "generate.sampling_config.max_tokens" if key == "rollout_max_tokens" else
                     "algo.overlong_buffer_len / algo.overlong_penalty_factor")


def _queue_rules(b: _Builder, layout: LayoutMapping, user_overrides: Sequence[str],
                 scheduler_defaults: Mapping[str, Any]) -> None:
    """Dispatch groups and the Training Queue, which MindSpeed-RL does not have, by the rule
    of this project's table3 presets: one minibatch per generation instance in a dispatch
    group, and a queue that holds one step plus one group of the largest minibatches asp
    may cut, (global_batch_size + group_size x (base_batch_size + slack)) x n samples
    (hybrid: exactly one step). base_batch_size and slack: yours, else the scheduler's."""
    if "rl.global_batch_size" not in b.values:
        raise MindSpeedImportError("MindSpeed-RL key megatron_training.global_batch_size is missing; write the "
                                   "prompts per iteration, e.g. global_batch_size: 32")
    b.values.setdefault("rl.n_samples_per_prompt", 1)   # MindSpeed-RL's default
    gbs, n = b.values["rl.global_batch_size"], b.values["rl.n_samples_per_prompt"]
    if layout.hybrid:
        b.set("mode.queue_capacity", gbs * n)
        return

    def chosen(key: str, fallback: int) -> int:
        user = _user_choice(user_overrides, f"scheduler.{key}")
        return int(user) if user is not None else int(scheduler_defaults.get(key, fallback))

    group = chosen("group_size", layout.instances) if _user_choice(user_overrides, "scheduler.group_size") \
        else layout.instances
    b.set("scheduler.group_size", group)
    b.set("mode.queue_capacity", (gbs + group * (chosen("base_batch_size", 4) + chosen("slack", 1))) * n)


def _engine_has(key: str) -> bool:
    from dataclasses import fields

    from ...config.schema import EngineConfig

    return key in {f.name for f in fields(EngineConfig)}


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_format(v) for v in value) + "]"
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_./\-]+", text) and text not in ("true", "false", "null"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# Group overrides first (Hydra selects the files, then the keys refine them).
GROUPS = ("layout", "mode", "engine", "hardware", "task")


def merge_overrides(imported: Sequence[str], user: Sequence[str]) -> list[str]:
    """The imported overrides, then the user's; a key the user sets drops the imported one
    (Hydra refuses a group chosen twice, and the user's value must win)."""
    user_keys = {o.lstrip("+~").split("=", 1)[0] for o in user}
    return [o for o in imported if o.split("=", 1)[0] not in user_keys] + list(user)


def _check_sections(job: Any) -> None:
    if not isinstance(job, Mapping):
        raise MindSpeedImportError(f"a MindSpeed-RL job YAML is a mapping of sections, got {type(job).__name__}")
    for section in job:
        if section not in SECTIONS and section not in PASSED_SECTIONS:
            raise MindSpeedImportError(
                f"MindSpeed-RL section {section} is not one this project can run (it reads "
                f"{', '.join(SECTIONS + tuple(PASSED_SECTIONS))}); delete it"
                + (" (PPO's critic is not supported: run GRPO)" if section == "critic_config" else ""))
    for section in ("rl_config", "generate_config"):
        if section not in job:
            raise MindSpeedImportError(f"MindSpeed-RL section {section} is missing; a GRPO job has "
                                       f"{', '.join(SECTIONS[1:])}")


def _num_npus(job: Mapping[str, Any]) -> int:
    rl = job["rl_config"] if isinstance(job["rl_config"], Mapping) else {}
    resource = rl.get("actor_resource")
    if not isinstance(resource, Mapping) or "num_npus" not in resource:
        raise MindSpeedImportError("MindSpeed-RL key rl_config.actor_resource.num_npus is missing; write "
                                   "actor_resource: {num_npus: N} with the job's NPU count")
    for key in resource:
        if key != "num_npus":
            raise _unknown_key(f"rl_config.actor_resource.{key}", {"num_npus": note})
    return _number("rl_config.actor_resource.num_npus", resource["num_npus"], int)


def _passed_sections(b: _Builder, job: Mapping[str, Any]) -> None:
    for section, what in PASSED_SECTIONS.items():
        if section in job:
            b.ignore(section, f"{what}: passed through, MindSpeed-RL's own assembly reads it from the job YAML "
                     "(engine.mindspeed_config)" if b.actor else f"{what}; nothing in it changes the run")


def _sections(b: _Builder, job: Mapping[str, Any], name: str) -> None:
    """Every key of the four sections through its handler; the model names must agree."""
    for section in ("megatron_training", "actor_config", "rl_config", "generate_config"):
        if section in job:
            _run_section(b, section, job[section], SECTION_KEYS[section])
    for section in ("megatron_training", "actor_config"):
        named = b.seen.get(f"{section}.model")
        if named is not None and named != name:
            raise refuse(f"{section}.model", named, f"the job's model group is {name!r}",
                         f"make {section}.model and defaults.model name the same model")
        if named is not None:
            b.ignore(f"{section}.model", f"the model group defaults.model={name}")


def _layout_and_engine(b: _Builder, layout: LayoutMapping, source: str) -> None:
    b.ignore("rl_config.actor_resource.num_npus", f"{layout.num_npus} devices = layout {layout.name} (see below)")
    for key, value in layout.overrides().items():
        b.set(key, value)
    if layout.device_type == "npu":
        # MindSpeed-RL's stack on Ascend; versions reach the separate G nodes over HCCL in buckets.
        b.set("engine", "mindspeed")
        b.set("hardware", "ascend910b3")
        b.set("weights.transport", "collective")
    if b.actor and source and _engine_has("mindspeed_config"):
        # Its Megatron actor is built from the same YAML (integrations/mindspeed/engine.py).
        b.set("engine.mindspeed_config", source)


def import_job(job: Mapping[str, Any], model_group: Optional[Mapping[str, Any]],
               layouts: Mapping[str, Mapping[str, Any]], user_overrides: Sequence[str] = (),
               reward_names: Optional[Sequence[str]] = None, source: str = "",
               scheduler_defaults: Optional[Mapping[str, Any]] = None) -> ImportResult:
    """Map a MindSpeed-RL job (its YAML as a dict) to this project's overrides.

    ``model_group``: the content of ``model/NAME.yaml`` for the job's ``defaults: model``
    (None when no such file was found: refused). ``layouts``: this project's layout
    files by name. ``user_overrides``: what the user adds after the YAML; ``layout=``,
    ``layout.devices_per_node`` / ``train_nodes`` / ``gen_nodes``, ``mode=``, ``engine=``
    and ``task...`` there steer the import (the layout, hybrid or not, the trainer, the
    data). ``reward_names``: the reward registry's names (None skips that check).
    ``scheduler_defaults``: the chosen scheduler file's keys (base_batch_size, slack), for
    the queue rule of :func:`_queue_rules`.
    """
    _check_sections(job)
    num_npus = _num_npus(job)
    # Which keys are honoured depends on the trainer: engine=mindspeed on NPUs unless the user chose.
    device_type = _device_type(user_overrides, layouts)
    b = _Builder(_user_choice(user_overrides, "engine") or ("mindspeed" if device_type == "npu" else "hf"))
    name = model_group_name(job)
    _model_overrides(b, name, model_group)
    _sections(b, job, name)
    _passed_sections(b, job)
    _cross_key_rules(b, user_overrides, reward_names)
    if "megatron_training.stage" in b.seen:
        b.ignore("megatron_training.stage", f"{b.seen['megatron_training.stage']}: GRPO (ASP runs GRPO)")
    parallel = _parallel(b.values)
    layout = choose_layout(num_npus, layouts, parallel, user_overrides)
    _queue_rules(b, layout, user_overrides, scheduler_defaults or {})
    _layout_and_engine(b, layout, source)
    sizes = {"tp": parallel.tp, "pp": parallel.pp, "cp": parallel.cp, "ep": parallel.ep,
             "itp": b.values.get("model.infer_tensor_parallel_size", 1),
             "ipp": b.values.get("model.infer_pipeline_parallel_size", 1),
             "iep": b.values.get("model.infer_expert_parallel_size", 1)}
    env = {k.split(".", 1)[1]: str(b.values.pop(k)) for k in [k for k in b.values if k.startswith("env.")]}
    if env:
        b.ignore("rl_config.hccl_buffersize", f"HCCL_BUFFSIZE={env['HCCL_BUFFSIZE']} in the driver's environment, "
                 "which every NPU actor inherits (config/placement.npu_actor_env)")
    groups = [f"{g}={_format(b.values[g])}" for g in GROUPS if g in b.values]
    keys = [f"{k}={_format(v)}" for k, v in b.values.items() if k not in GROUPS]
    return ImportResult(tuple(groups + keys), tuple(b.ignored), layout, name, source, sizes, env)


# ---------------------------------------------------------------------------------------
# Command-line flags shared by asp-train, asp-import-mindspeed and asp-launch.
# ---------------------------------------------------------------------------------------

CONFIG_FLAG = "--mindspeed-config"
MODEL_DIR_FLAG = "--model-dir"


def _take_value(argv: list[str], flag: str) -> Optional[str]:
    """Remove ``flag VALUE`` (or ``flag=VALUE``) from argv and return VALUE."""
    for i, arg in enumerate(argv):
        if arg == flag:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise MindSpeedImportError(f"{flag} needs a value: {flag} PATH")
            value = argv[i + 1]
            del argv[i:i + 2]
            return value
        if arg.startswith(flag + "="):
            del argv[i]
            return arg.split("=", 1)[1]
    return None


def expand_mindspeed_config(argv: Sequence[str], out=None, apply_env: bool = False) -> list[str]:
    """``argv`` with ``--mindspeed-config FILE [--model-dir DIR]`` replaced by the imported
    overrides, the user's own overrides after them (and winning: a key set by both keeps
    the user's). Prints what was imported to ``out`` (stdout). Without the flag: argv.
    ``apply_env`` (a run that starts actors): the job's environment (ImportResult.env) goes
    into this process's, where a variable is not set already."""
    argv = list(argv)
    path = _take_value(argv, CONFIG_FLAG)
    model_dir = _take_value(argv, MODEL_DIR_FLAG)
    if path is None:
        return argv
    flags = [a for a in argv if a.startswith("-")]
    user = [a for a in argv if not a.startswith("-")]
    result = import_file(path, model_dir, user)
    print(result.describe(), file=out or sys.stdout, flush=True)
    if apply_env:
        import os

        for key, value in result.env.items():
            os.environ.setdefault(key, value)
    if user:
        print(f"# then your {len(user)} override(s), which win: {' '.join(user)}", file=out or sys.stdout)
    return merge_overrides(result.overrides, user) + flags


# ---------------------------------------------------------------------------------------
# The shell: read the YAML, its model group and this project's layouts.
# ---------------------------------------------------------------------------------------

def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml's when built with it: the same result, faster
        return yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    except FileNotFoundError:
        raise MindSpeedImportError(f"MindSpeed-RL job {path}: no such file") from None
    except yaml.YAMLError as error:
        raise MindSpeedImportError(f"MindSpeed-RL job {path}: not valid YAML ({error})") from None


def shipped_layouts() -> dict[str, dict]:
    from ...config.load import config_dir

    folder = config_dir() / LAYOUT_GROUP
    return {p.stem: _read_yaml(p) for p in sorted(folder.glob("*.yaml"))}


def scheduler_file(name: str) -> dict:
    from ...config.load import config_dir

    path = config_dir() / "scheduler" / f"{name}.yaml"
    return _read_yaml(path) if path.is_file() else {}


def reward_registry_names() -> list[str]:
    from ...tasks.rewards import REGISTRY

    return sorted(REGISTRY)


def import_file(path, model_dir=None, user_overrides: Sequence[str] = ()) -> ImportResult:
    """Read a MindSpeed-RL job YAML and import it (:func:`import_job`). Its model group is
    ``<model_dir>/NAME.yaml``, by default ``model/NAME.yaml`` beside the job (MindSpeed-RL's
    own ``configs/`` layout)."""
    path = Path(path)
    job = _read_yaml(path)
    if not isinstance(job, Mapping):
        raise MindSpeedImportError(f"MindSpeed-RL job {path}: expected a mapping of sections")
    name = model_group_name(job)
    folder = Path(model_dir) if model_dir else path.parent / "model"
    group_file = folder / f"{name}.yaml"
    group = _read_yaml(group_file) if group_file.is_file() else None
    return import_job(job, group, shipped_layouts(), user_overrides, reward_registry_names(), source=str(path),
                      scheduler_defaults=scheduler_file(_user_choice(user_overrides, "scheduler") or "asp"))
