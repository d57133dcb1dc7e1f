"""Checks that need more than types: every problem names the key and what to change.

All problems are collected and reported together, so a user fixes a config in one go.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..control.core import AT_FINISH, REFRESH_POLICIES
from .paths import locate, missing_checkpoint_parts
from .schema import (DEVICE_TYPES, ENGINES, MODES, PREDICTORS, REFITS, SCHEDULERS, TASKS, WEIGHT_TRANSPORTS,
                     training_devices)


class ConfigError(ValueError):
    """A configuration that cannot run; the message says which key and what to change."""


def _choice(problems: list[str], key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        problems.append(f"{key}={value!r} is not one of {', '.join(allowed)}")


def _positive(problems: list[str], key: str, value: float) -> None:
    if not value > 0:
        problems.append(f"{key}={value} must be > 0")


def _divides(problems: list[str], small_key: str, small: int, big_key: str, big: int, fix: str) -> None:
    if small > 0 and big % small != 0:
        problems.append(f"{small_key}={small} does not divide {big_key}={big}; {fix}")


def layout_problems(layout, mode_name: str) -> list[str]:
    p: list[str] = []
    _choice(p, "layout.device_type", layout.device_type, DEVICE_TYPES)
    for key in ("nodes", "devices_per_node", "infer_instance_size"):
        _positive(p, f"layout.{key}", getattr(layout, key))
    if p:
        return p
    if mode_name == "async":
        if layout.train_nodes < 1 or layout.gen_nodes < 1:
            p.append(
                f"mode=async needs at least one T and one G node, got layout.train_nodes="
                f"{layout.train_nodes}, layout.gen_nodes={layout.gen_nodes}"
            )
        elif layout.train_nodes + layout.gen_nodes > layout.nodes:
            p.append(
                f"layout.train_nodes + layout.gen_nodes = {layout.train_nodes} + {layout.gen_nodes} "
                f"= {layout.train_nodes + layout.gen_nodes} exceeds layout.nodes={layout.nodes}; "
                "lower one of them, raise layout.nodes, or run mode=hybrid (colocated)"
            )
    size, per_node = layout.infer_instance_size, layout.devices_per_node
    if size <= per_node or size % per_node:
        _divides(p, "layout.infer_instance_size", size, "layout.devices_per_node", per_node,
                 "an inference instance must fit a node evenly or span whole nodes: use a divisor or a multiple "
                 "of devices_per_node")
    else:   # an instance of k whole nodes takes k G nodes (hybrid: k of every node)
        span, gen = size // per_node, layout.nodes if mode_name == "hybrid" else layout.gen_nodes
        if gen % span:
            key = "layout.nodes" if mode_name == "hybrid" else "layout.gen_nodes"
            p.append(f"layout.infer_instance_size={size} spans {span} whole nodes of {per_node}, which does not "
                     f"divide {key}={gen}; make {key} a multiple of {span} or the instance smaller")
    return p


def parallel_problems(model, layout, mode_name: str) -> list[str]:
    p: list[str] = []
    train_devices = layout.nodes * layout.devices_per_node if mode_name == "hybrid" else layout.train_devices
    model_parallel = model.tensor_model_parallel_size * model.pipeline_model_parallel_size
    if train_devices > 0 and model_parallel > 0 and train_devices % model_parallel:
        p.append(
            f"model.tensor_model_parallel_size x model.pipeline_model_parallel_size = {model_parallel} "
            f"does not divide the {train_devices} training devices; change the parallel sizes or "
            "layout.train_nodes"
        )
    elif model_parallel > 0:
        data_parallel = train_devices // model_parallel
        if data_parallel and data_parallel % model.expert_model_parallel_size:
            p.append(
                f"model.expert_model_parallel_size={model.expert_model_parallel_size} does not divide the "
                f"data-parallel size {data_parallel} of the training devices"
            )
    infer_parallel = model.infer_tensor_parallel_size * model.infer_pipeline_parallel_size
    for key, size in (("model.infer_tensor_parallel_size x infer_pipeline_parallel_size", infer_parallel),
                      ("model.infer_expert_parallel_size", model.infer_expert_parallel_size)):
        _divides(p, key, size, "layout.infer_instance_size", layout.infer_instance_size,
                 "an inference instance must hold a whole model replica")
    return p


def batch_problems(cfg, training: bool) -> list[str]:
    p: list[str] = []
    rl, sched, task = cfg.rl, cfg.scheduler, cfg.task
    for key in ("global_batch_size", "mini_batch_size", "n_samples_per_prompt", "micro_batch_size",
                "max_prompt_length"):
        _positive(p, f"rl.{key}", getattr(rl, key))
    for key in ("base_batch_size", "group_size"):
        _positive(p, f"scheduler.{key}", getattr(sched, key))
    # A dataset's prompt count is known once it is read (schedule/configured.configured_task
    # checks it then); num_prompts=0 takes every row.
    from_file = task.name == "dataset"
    if not from_file:
        _positive(p, "task.num_prompts", task.num_prompts)
    elif task.num_prompts < 0:
        p.append(f"task.num_prompts={task.num_prompts} must be >= 0 (0: every row of task.path)")
    _positive(p, "steps", cfg.steps)
    if p:
        return p
    _divides(p, "rl.mini_batch_size", rl.mini_batch_size, "rl.global_batch_size", rl.global_batch_size,
             "a training step is a whole number of optimizer minibatches")
    samples_per_mini = rl.mini_batch_size * rl.n_samples_per_prompt
    _divides(p, "rl.micro_batch_size", rl.micro_batch_size,
             "rl.mini_batch_size x rl.n_samples_per_prompt", samples_per_mini,
             "micro batches (samples) must tile a minibatch")
    if sched.slack < 0 or sched.slack >= sched.base_batch_size:
        p.append(
            f"scheduler.slack={sched.slack} must be in [0, scheduler.base_batch_size - 1] = "
            f"[0, {sched.base_batch_size - 1}]"
        )
    p += predictor_problems(sched)
    if training and task.num_prompts < rl.global_batch_size and not (from_file and task.num_prompts == 0):
        p.append(
            f"rl.global_batch_size={rl.global_batch_size} exceeds task.num_prompts={task.num_prompts}: a step "
            "would hold a prompt twice; raise task.num_prompts or lower rl.global_batch_size (steps beyond "
            "one pass over the prompts start another epoch)"
        )
    if cfg.eval.num_prompts < 0:
        p.append(f"eval.num_prompts={cfg.eval.num_prompts} must be >= 0 (0 skips the evaluation)")
    if cfg.eval.samples_per_prompt < 1:
        p.append(f"eval.samples_per_prompt={cfg.eval.samples_per_prompt} must be >= 1")
    if sched.base_batch_size > task.num_prompts and not (from_file and task.num_prompts == 0):
        p.append(f"scheduler.base_batch_size={sched.base_batch_size} exceeds task.num_prompts={task.num_prompts}")
    return p


def predictor_problems(sched) -> list[str]:
    """The predictor in the loop (schedule/length_profile.py): shares, files, and which
    predictor each key goes with."""
    p: list[str] = []
    kind = sched.predictor
    if not 0.0 < sched.profile_share <= 1.0:
        p.append(f"scheduler.profile_share={sched.profile_share} must be in (0, 1]: the share of the task's prompts "
                 "sampled with the starting policy")
    if not 0.0 <= sched.profile_holdout < 1.0:
        p.append(f"scheduler.profile_holdout={sched.profile_holdout} must be in [0, 1): the share of the profiled "
                 "prompts kept out of the fit to measure rank quality")
    if sched.profile_samples < 1:
        p.append(f"scheduler.profile_samples={sched.profile_samples} must be >= 1")
    if sched.lengths_file:
        if kind not in ("history", "auto"):
            p.append(f"scheduler.lengths_file is read by scheduler.predictor=history only, not {kind}")
        elif not Path(sched.lengths_file).is_file():
            p.append(f"scheduler.lengths_file={sched.lengths_file!r}: no such file (a JSONL of "
                     "scripts/profile_lengths.py, or an earlier run's length_profile.jsonl)")
    elif kind == "history":
        p.append("scheduler.predictor=history needs scheduler.lengths_file: observed lengths from an earlier "
                 "profile or run (scripts/profile_lengths.py's JSONL, or <run_dir>/length_profile.jsonl)")
    if sched.predictor_path:
        if kind not in ("ridge", "lm"):
            p.append(f"scheduler.predictor_path loads a ridge or lm predictor; scheduler.predictor={kind} fits none "
                     "(set scheduler.predictor=ridge or lm, the kind saved there)")
        elif not (Path(sched.predictor_path) / "meta.json").is_file():
            p.append(f"scheduler.predictor_path={sched.predictor_path!r}: no saved predictor there (expected a "
                     "directory with meta.json, an earlier run's <run_dir>/length_predictor)")
    return p


def refit_problems(cfg) -> list[str]:
    """``scheduler.refit`` (the core's re-plan rule: control/replan.py, schedule/refit.py):
    a known rule, a usable weight, and a plan that a refit can change."""
    sched = cfg.scheduler
    p: list[str] = []
    refit = getattr(sched, "refit", "none")
    _choice(p, "scheduler.refit", refit, REFITS)
    weight = getattr(sched, "refit_weight", 4.0)
    if not weight > 0:
        p.append(f"scheduler.refit_weight={weight} must be > 0: the plan's prediction counts as that many "
                 "observed samples")
    if refit != "none" and sched.name == "fifo":
        p.append(f"scheduler.refit={refit} re-plans by length, but scheduler=fifo reads no lengths; "
                 "use scheduler=asp or sorted, or scheduler.refit=none")
    if refit != "none" and cfg.mode.max_staleness == 0:
        p.append(f"scheduler.refit={refit} is not supported with mode.max_staleness=0 (hybrid): that plan is "
                 "cut step by step across epochs; set scheduler.refit=none")
    return p


def sampling_problems(cfg) -> list[str]:
    p: list[str] = []
    sc = cfg.generate.sampling_config
    _positive(p, "generate.sampling_config.max_tokens", sc.max_tokens)
    _positive(p, "generate.sampling_config.temperature", sc.temperature)
    if not 0 < sc.top_p <= 1:
        p.append(f"generate.sampling_config.top_p={sc.top_p} must be in (0, 1]")
    if not 0.0 <= sc.min_p < 1.0:
        p.append(f"generate.sampling_config.min_p={sc.min_p} must be in [0, 1) (0 disables it)")
    if sc.top_k < 0:
        p.append(f"generate.sampling_config.top_k={sc.top_k} must be >= 0 (0 disables top-k)")
    total = cfg.rl.max_prompt_length + sc.max_tokens
    if total > cfg.model.max_position_embeddings:
        p.append(
            f"rl.max_prompt_length + generate.sampling_config.max_tokens = {total} exceeds "
            f"model.max_position_embeddings={cfg.model.max_position_embeddings}"
        )
    return p


def mode_problems(mode) -> list[str]:
    p: list[str] = []
    _choice(p, "mode.name", mode.name, MODES)
    if mode.max_staleness < 0:
        p.append(f"mode.max_staleness={mode.max_staleness} must be >= 0")
    _positive(p, "mode.queue_capacity", mode.queue_capacity)
    if not 0 <= mode.low_watermark <= mode.high_watermark <= 1:
        p.append(
            f"watermarks must satisfy 0 <= mode.low_watermark ({mode.low_watermark}) <= "
            f"mode.high_watermark ({mode.high_watermark}) <= 1"
        )
    _choice(p, "mode.refresh", mode.refresh, REFRESH_POLICIES)
    _choice(p, "mode.at_finish", mode.at_finish, AT_FINISH)
    _positive(p, "mode.refresh_interval", mode.refresh_interval)
    if mode.refresh_interval > 1 and mode.max_staleness < mode.refresh_interval - 1:
        p.append(f"mode.max_staleness={mode.max_staleness} is below mode.refresh_interval - 1 = "
                 f"{mode.refresh_interval - 1}: actors keep a version that long; raise mode.max_staleness")
    return p


def task_problems(task) -> list[str]:
    """The task's keys; files, fields and user reward functions are checked when the task
    is built (tasks.make_task), still before any run directory is written."""
    from ..tasks.dataset import CHAT_TEMPLATE_MODES
    from ..tasks.maze import LAYOUTS
    from ..tasks.rewards import unknown_reward

    p: list[str] = []
    _choice(p, "task.name", task.name, TASKS)
    if task.min_size < 2:
        p.append(f"task.min_size={task.min_size} must be >= 2")
    if task.max_size < task.min_size:
        p.append(f"task.max_size={task.max_size} must be >= task.min_size={task.min_size}")
    _positive(p, "task.size_decay", task.size_decay)
    _choice(p, "task.prompt_format", task.prompt_format, LAYOUTS)
    _choice(p, "task.chat_template", task.chat_template, CHAT_TEMPLATE_MODES)
    if task.name == "dataset":
        if not task.path:
            p.append("task=dataset reads its prompts from a file: set task.path=FILE.jsonl (or .parquet)")
        if not task.prompt_key:
            p.append("task.prompt_key is empty: name the field that holds the prompt")
        if not task.verifier_function:
            p.append("task=dataset needs task.verifier_function: the rewards to train on, e.g. [math_verify] "
                     "or [exact_match] (docs/tasks.md lists them)")
    names = list(task.verifier_function)
    for i, name in enumerate(names):
        problem = unknown_reward(name, f"task.verifier_function[{i}]")
        if problem:
            p.append(problem)
    if task.verifier_weight and len(task.verifier_weight) != len(names):
        p.append(f"task.verifier_weight has {len(task.verifier_weight)} weights for the {len(names)} rewards of "
                 "task.verifier_function; give one weight per reward (or none: 1.0 each)")
    for key in ("correctness_reward", "integrity_reward"):
        name = getattr(task, key)
        problem = name and unknown_reward(name, f"task.{key}")
        if problem:
            p.append(problem)
    return p


def algo_problems(algo) -> list[str]:
    """Reuse the loss config's own checks, reported under the ``algo.`` keys."""
    from dataclasses import asdict

    from ..algo.grpo import GRPOLossConfig

    problems: list[str] = []
    try:
        GRPOLossConfig.from_mapping(asdict(algo))
    except ValueError as error:
        problems.append(f"algo: {error}")
    _choice(problems, "algo.adv_std", algo.adv_std, ("population", "sample"))
    if not algo.adv_eps >= 0:
        problems.append(f"algo.adv_eps={algo.adv_eps} must be >= 0")
    _choice(problems, "algo.filter_groups", algo.filter_groups, ("none", "std"))
    if algo.max_num_gen_batches < 0:
        problems.append(f"algo.max_num_gen_batches={algo.max_num_gen_batches} must be >= 0 (0: no limit)")
    if algo.overlong_buffer_len < 0:
        problems.append(f"algo.overlong_buffer_len={algo.overlong_buffer_len} must be >= 0 (0: no shaping)")
    if not algo.overlong_penalty_factor >= 0:
        problems.append(f"algo.overlong_penalty_factor={algo.overlong_penalty_factor} must be >= 0")
    return problems


# train.data_channel: where a step's samples travel inside the Training Unit
# (integrations/mindspeed/queue.py builds the channel).
DATA_CHANNELS = ("local", "transfer_dock", "transfer_queue")


def data_channel_problems(kind: str, ranks: int = 1, local_install: bool = True) -> list[str]:
    """What is wrong with ``train.data_channel=kind`` before anything starts (for config
    validation): an unknown name, MindSpeed-RL not importable (``local_install``), several
    trainer ranks."""
    import importlib.util

    if kind not in DATA_CHANNELS:
        return [f"train.data_channel={kind!r} is not one of {', '.join(DATA_CHANNELS)}"]
    if kind == "local":
        return []
    problems = []
    if local_install and importlib.util.find_spec("mindspeed_rl") is None:
        problems.append(f"train.data_channel={kind} needs mindspeed_rl importable: put a checkout of "
                        "Ascend/MindSpeed-RL on PYTHONPATH (docs/mindspeed_rl_adapters.md), or use "
                        "train.data_channel=local")
    if ranks != 1:
        problems.append(f"train.data_channel={kind} needs train.ranks=1 (got {ranks}); use train.data_channel=local")
    return problems


def distributed_problems(cfg, local_install: bool = True) -> list[str]:
    """``train.ranks`` (trainer ranks) and the ``weights`` transport keys."""
    p: list[str] = []
    ranks, most = cfg.train.ranks, training_devices(cfg.layout, cfg.mode.name)
    where = ("layout.nodes x layout.devices_per_node" if cfg.mode.name == "hybrid"
             else "layout.train_nodes x layout.devices_per_node")
    if ranks != "auto" and (isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1):
        p.append(f"train.ranks={ranks!r} must be a whole number >= 1 or 'auto' (every training device)")
    elif ranks != "auto" and ranks > most:
        p.append(f"train.ranks={ranks} exceeds the {most} training device(s) ({where}); lower train.ranks, "
                 f"set train.ranks=auto, or give the Training Unit more devices")
    if not p:   # MindSpeed-RL's data channel: importable, one trainer rank
        p += data_channel_problems(cfg.train.data_channel, most if ranks == "auto" else ranks, local_install)
    w = cfg.weights
    _choice(p, "weights.transport", w.transport, WEIGHT_TRANSPORTS)
    _positive(p, "weights.bucket_mb", w.bucket_mb)
    _positive(p, "weights.timeout_s", w.timeout_s)
    return p


def engine_problems(cfg, local_install: bool = True) -> list[str]:
    """engine=vllm: platform installed (``local_install``), tensor-parallel size within the
    instance, KV budget of at least one sequence (engines/vllm_platform.py has the rules;
    vLLM is not imported). ``local_install=False`` (the simulator): the engine of a
    simulated cluster is numbers, not this machine's install, so it counts as installed
    on the device it names."""
    if cfg.engine.name != "vllm":
        return []
    import json

    from ..engines.base import EngineError
    from ..engines.vllm_platform import config_problems, platform_for

    installed = "detect"
    if not local_install:
        try:
            installed = platform_for(str(cfg.engine.device)).vllm_device_type
        except EngineError:
            pass    # an unknown engine.device: config_problems names it
    config = locate(cfg.model.path) / "config.json"
    model_config = json.loads(config.read_text()) if config.is_file() else None
    from .engine import engine_settings

    engine = engine_settings(cfg)   # max_model_len as the actors get it
    return config_problems(engine, cfg.layout.infer_instance_size, model_config, installed)


def rollouts_per_step(value) -> int:
    """``record.rollouts`` as a count per step: -1 all, 0 none, N the first N; a ConfigError
    for anything but true, false or an integer >= 0."""
    if isinstance(value, bool):
        return -1 if value else 0
    if isinstance(value, int) and value >= 0:
        return value
    raise ConfigError(f"record.rollouts={value!r} must be true (every sample), false (none) or a number N >= 0 "
                      "(the first N samples of each step)")


def record_problems(cfg) -> list[str]:
    try:
        rollouts_per_step(cfg.record.rollouts)
    except ConfigError as error:
        return [str(error)]
    return []


def validate_config(cfg, training: bool = True, local_install: bool = True) -> None:
    """Raise :class:`ConfigError` listing every problem of ``cfg`` (a :class:`RootConfig`).

    ``training=False`` (commands that only generate or plan) skips the checks that only a
    training run needs (a step's prompts all distinct). ``local_install=False`` (the
    simulator and the layout planner) skips the checks of what is installed on this
    machine (vLLM's platform, MindSpeed-RL importable): a simulated cluster's engine is
    numbers, not a local install."""
    problems: list[str] = []
    _choice(problems, "engine.name", cfg.engine.name, ENGINES)
    _choice(problems, "scheduler.name", cfg.scheduler.name, SCHEDULERS)
    _choice(problems, "scheduler.predictor", cfg.scheduler.predictor, PREDICTORS)
    if cfg.engine.num_threads < 0:
        problems.append(f"engine.num_threads={cfg.engine.num_threads} must be >= 0 (0: torch default)")
    problems += engine_problems(cfg, local_install)
    problems += mode_problems(cfg.mode)
    problems += layout_problems(cfg.layout, cfg.mode.name)
    if not problems:
        problems += parallel_problems(cfg.model, cfg.layout, cfg.mode.name)
    problems += batch_problems(cfg, training)
    problems += refit_problems(cfg)
    problems += sampling_problems(cfg)
    if training and cfg.generate.greedy:
        problems.append("generate.greedy=true is for asp-generate: GRPO needs sampled responses (a group of "
                        "identical answers has no advantage); remove it, or lower generate.sampling_config.temperature")
    problems += task_problems(cfg.task)
    problems += algo_problems(cfg.algo)
    problems += record_problems(cfg)
    for key in ("adam_beta1", "adam_beta2"):
        beta = getattr(cfg.train, key)
        if not 0.0 <= beta < 1.0:
            problems.append(f"train.{key}={beta} must be in [0, 1) (AdamW's moment decay)")
    restarts = cfg.fault.actor_restarts
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        problems.append(f"fault.actor_restarts={restarts!r} must be an int >= 0 (how many times a generation "
                        "actor whose process died is restarted before it is retired; 0: retire at once)")
    if cfg.save_every < 0:
        problems.append(f"save_every={cfg.save_every} must be >= 0 (0: no checkpoints)")
    if cfg.keep_checkpoints < 1:
        problems.append(f"keep_checkpoints={cfg.keep_checkpoints} must be >= 1 (the newest checkpoint always stays)")
    if not any(q.startswith("layout.") for q in problems):
        problems += distributed_problems(cfg, local_install)
    if problems:
        listing = "\n".join(f"  - {problem}" for problem in problems)
        raise ConfigError(f"invalid configuration ({len(problems)} problem(s)):\n{listing}")


def resolve_model_path(path: str) -> Path:
    """The checkpoint directory of ``model.path`` (as written, or the one shipped in the
    package: config/paths.py); one error naming model.path and everything it lacks."""
    candidate = locate(path)
    fix = ("point model.path at a local Hugging Face checkpoint directory (what save_pretrained writes, "
           "with its tokenizer), or leave it at the shipped tiny policy")
    if not candidate.is_dir():
        raise ConfigError(f"model.path={path!r}: no checkpoint there (no such directory); {fix}")
    missing = missing_checkpoint_parts(candidate)
    if missing:
        raise ConfigError(f"model.path={path!r}: no checkpoint there: the directory {candidate} lacks "
                          f"{' and '.join(missing)}; {fix}")
    return candidate
