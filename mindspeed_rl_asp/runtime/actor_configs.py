"""What each actor is built from: one small frozen config per component, made once from
the run's config (:func:`actor_configs`) and handed to the actors as it is.

The fields are the schema's own typed nodes (``config/schema.py``: ``EngineConfig``,
``TaskConfig``, ...), plain dataclasses that pickle across Ray's process boundary, so an
actor reads ``config.engine.device`` exactly as the driver does: no dict rebuilt into an
object on the far side. What the run resolves for every process is resolved here, once:
``engine.max_model_len`` (``config/engine.py``), the job YAML's and the task files' paths
made absolute (an actor's working directory need not be the driver's), the task's reward
import roots.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from ..config.schema import AlgoConfig, EngineConfig, RLConfig, SamplingConfig, TaskConfig, TrainConfig

__all__ = ["ScoringConfig", "GenerationActorConfig", "TrainerActorConfig", "ActorConfigs", "actor_configs"]


@dataclass(frozen=True)
class ScoringConfig:
    """What a generation actor needs to score its own samples (DAPO's dynamic sampling or
    overlong shaping: ``algo.filter_groups`` / ``algo.overlong_buffer_len``)."""

    task: TaskConfig
    import_roots: tuple[str, ...]
    max_prompt_length: int
    algo: AlgoConfig
    max_tokens: int


@dataclass(frozen=True)
class GenerationActorConfig:
    engine: EngineConfig
    sampling: SamplingConfig
    n_samples: int
    scoring: Optional[ScoringConfig] = None   # None: the trainer scores


@dataclass(frozen=True)
class TrainerActorConfig:
    """``reference_path``: the KL reference, the run's starting checkpoint (a resumed run
    trains from its checkpoint's policy, given beside this); ``worker_bundles``: the
    placement of MindSpeed-RL's worker group (engine=mindspeed; empty otherwise)."""

    engine: EngineConfig
    train: TrainConfig
    rl: RLConfig
    algo: AlgoConfig
    task: TaskConfig
    temperature: float
    reference_path: str
    import_roots: tuple[str, ...] = ()
    record_rollouts: Any = False
    worker_bundles: tuple = ()


@dataclass(frozen=True)
class ActorConfigs:
    generation: GenerationActorConfig
    trainer: TrainerActorConfig


def typed(node, cls):
    """A config node as its schema dataclass (an OmegaConf node, or already the dataclass)."""
    if isinstance(node, cls):
        return node
    from omegaconf import OmegaConf

    return OmegaConf.to_object(node)


def actor_task_config(task_cfg: TaskConfig) -> TaskConfig:
    """The task config as the actors get it: file paths made absolute."""
    paths = {key: str(Path(value).resolve()) for key in ("path", "eval_path")
             if (value := getattr(task_cfg, key))}
    return replace(task_cfg, **paths)


def actor_engine_config(cfg) -> EngineConfig:
    """``cfg.engine`` with ``max_model_len`` resolved and the MindSpeed-RL job YAML's path absolute."""
    from ..config.engine import engine_settings

    engine = engine_settings(cfg)
    return replace(engine, mindspeed_config=str(Path(engine.mindspeed_config).resolve()) if engine.mindspeed_config
                   else "")


def scoring_config(cfg, task_cfg: TaskConfig, import_roots, reward_names) -> Optional[ScoringConfig]:
    """What a generation actor needs to score its samples, or None when the trainer scores
    (``algo.filter_groups=none`` and ``algo.overlong_buffer_len=0``). ``reward_names``: the
    task's rewards, which ``algo.filter_groups_metric`` must name (or ``acc`` / ``reward``):
    checked here, with the overlong buffer, which must be shorter than ``max_tokens``."""
    from ..algo.dapo import check_filter_metric, overlong_penalty
    from ..config.validate import ConfigError

    algo = typed(cfg.algo, AlgoConfig)
    max_tokens = cfg.generate.sampling_config.max_tokens
    if algo.filter_groups == "none" and algo.overlong_buffer_len == 0:
        return None
    try:
        if algo.filter_groups != "none":
            check_filter_metric(algo.filter_groups_metric, list(reward_names))
        overlong_penalty(0, max_tokens, algo.overlong_buffer_len, algo.overlong_penalty_factor)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return ScoringConfig(task_cfg, tuple(import_roots), cfg.rl.max_prompt_length, algo, max_tokens)


def actor_configs(cfg, task, reference_path: str, worker_bundles=()) -> ActorConfigs:
    """Every actor's config, made once from the run's ``cfg`` and its built ``task``."""
    task_cfg = actor_task_config(typed(cfg.task, TaskConfig))
    engine = actor_engine_config(cfg)
    roots = tuple(task.import_roots())
    generation = GenerationActorConfig(engine, typed(cfg.generate.sampling_config, SamplingConfig),
                                       cfg.rl.n_samples_per_prompt,
                                       scoring_config(cfg, task_cfg, roots, task.rewards.names))
    trainer = TrainerActorConfig(engine, typed(cfg.train, TrainConfig), typed(cfg.rl, RLConfig),
                                 typed(cfg.algo, AlgoConfig), task_cfg, cfg.generate.sampling_config.temperature,
                                 reference_path, roots, cfg.record.rollouts, tuple(worker_bundles))
    return ActorConfigs(generation, trainer)
