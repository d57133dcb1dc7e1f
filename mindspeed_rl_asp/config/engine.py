"""The engine settings a run hands its actors: ``cfg.engine`` with what 0 means resolved.

``engine.max_model_len=0`` means the longest sequence the run can make, prompt plus
response (``rl.max_prompt_length + generate.sampling_config.max_tokens``), not the
checkpoint's ``max_position_embeddings``: a model with 32 K or 128 K positions would
otherwise have vLLM size its KV cache (and refuse to start) for sequences the run never
makes. One place, so the config check and the actors agree."""
from __future__ import annotations

__all__ = ["run_model_len", "engine_settings"]


def run_model_len(configured: int, max_prompt_length: int, max_tokens: int) -> int:
    """``engine.max_model_len`` as a run uses it: as configured, or (0) prompt + response."""
    return int(configured) if configured else int(max_prompt_length) + int(max_tokens)


def engine_settings(cfg):
    """``cfg.engine`` as its typed ``EngineConfig``, ``max_model_len`` resolved
    (:func:`run_model_len`). ``cfg``: the OmegaConf config or the plain ``RootConfig`` the
    config checks get."""
    from dataclasses import is_dataclass, replace

    from omegaconf import OmegaConf

    engine = cfg.engine if is_dataclass(cfg.engine) else OmegaConf.to_object(cfg.engine)
    return replace(engine, max_model_len=run_model_len(engine.max_model_len, cfg.rl.max_prompt_length,
                                                       cfg.generate.sampling_config.max_tokens))
