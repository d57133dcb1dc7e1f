"""Pick an engine by ``engine.name``; heavy stacks are imported here, never at package import."""
from __future__ import annotations

from .base import EngineError


def make_generation_engine(engine_cfg, model_path: str):
    if engine_cfg.name == "hf":
        from .hf import HFGenerationEngine

        return HFGenerationEngine(model_path, engine_cfg.device, engine_cfg.dtype, engine_cfg.num_threads)
    if engine_cfg.name in ("vllm", "mindspeed"):
        raise EngineError(
            f"engine.name={engine_cfg.name!r} is not available in this build yet; use engine=hf "
            "(transformers + torch runs on CPU, GPU and, with torch_npu, NPU)"
        )
    raise EngineError(f"engine.name={engine_cfg.name!r} is not one of hf, vllm, mindspeed")


def make_training_engine(engine_cfg, model_path: str, train_cfg, rl_cfg, temperature: float):
    if engine_cfg.name != "hf":
        raise EngineError(
            f"engine.name={engine_cfg.name!r} has no training engine in this build yet; use engine=hf"
        )
    from .hf import HFTrainingEngine

    return HFTrainingEngine(
        model_path, engine_cfg.device, engine_cfg.dtype, engine_cfg.num_threads, lr=train_cfg.lr,
        weight_decay=train_cfg.weight_decay, clip_grad=train_cfg.clip_grad,
        micro_batch_size=rl_cfg.micro_batch_size, temperature=temperature,
    )


def make_reference_policy(engine_cfg, model_path: str, temperature: float):
    """The frozen reference policy the KL term is measured against (the starting checkpoint)."""
    if engine_cfg.name != "hf":
        raise EngineError(f"engine.name={engine_cfg.name!r} has no reference policy in this build yet; use engine=hf")
    from .hf import HFReferencePolicy

    return HFReferencePolicy(model_path, engine_cfg.device, engine_cfg.dtype, engine_cfg.num_threads, temperature)
