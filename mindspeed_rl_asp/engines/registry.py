"""Pick an engine by ``engine.name``; heavy stacks are imported here, never at package import.

=============  ==========================================  ==================
engine.name    generation                                  training
=============  ==========================================  ==================
``hf``         transformers ``generate`` (engines/hf.py)   hf
``vllm``       vLLM's offline engine (engines/vllm_engine)  hf, same device
``mindspeed``  vLLM on vllm-ascend (engines/vllm_engine)    MindSpeed-RL's Megatron actor
                                                           (integrations/mindspeed/engine.py)
=============  ==========================================  ==================

``mindspeed`` needs MindSpeed-RL importable (a checkout on PYTHONPATH, with its Ascend
stack); without it every builder fails with one error that says what to install.
"""
from __future__ import annotations

import importlib.util

from .base import EngineError

# Engines whose training side is the hf engine.
_HF_TRAINING = ("hf", "vllm")


# Engines that live outside engines/, by entry point ("module:attribute"), resolved when
# one is built. integrations/ is the layer above config/ and engines/ (it imports both),
# so engines/ names it instead of importing it: the same inversion as a setuptools entry
# point, and what keeps `import mindspeed_rl_asp.engines.registry` free of it.
ENGINE_PLUGINS = {
    "mindspeed": "mindspeed_rl_asp.integrations.mindspeed.engine",
}


def _plugin(name: str, attribute: str):
    import importlib

    return getattr(importlib.import_module(ENGINE_PLUGINS[name]), attribute)


def _require_mindspeed_rl() -> None:
    """engine=mindspeed without MindSpeed-RL: one error naming what to install (checked by
    module lookup, without importing it)."""
    if importlib.util.find_spec("mindspeed_rl") is None:
        raise EngineError(f"engine.name='mindspeed': mindspeed_rl is not importable. "
                          f"{_plugin('mindspeed', 'mindspeed_install_hint')()}")


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
        if getattr(engine_cfg, "mindspeed_workers", "npu") == "cpu":
            # MindSpeed-RL's orchestration on CPU (integrations/mindspeed/cpu_workers.py):
            # the Generation Units are the hf engine; this process needs no MindSpeed-RL.
            from .hf import HFGenerationEngine

            return HFGenerationEngine(model_path, "cpu", engine_cfg.dtype, engine_cfg.num_threads)
        # Generation is this project's vLLM engine; on NPUs vLLM runs through vllm-ascend.
        _require_mindspeed_rl()
        from .vllm_engine import VLLMGenerationEngine

        return VLLMGenerationEngine(model_path, engine_cfg, instance=instance)
    raise EngineError(f"engine.name={engine_cfg.name!r} is not one of hf, vllm, mindspeed")


def _check_hf_training(engine_cfg, what: str) -> None:
    if engine_cfg.name not in _HF_TRAINING:
        raise EngineError(f"engine.name={engine_cfg.name!r} has no {what} in this build yet; use engine=hf "
                          "or engine=vllm (both train with the hf engine)")


def make_training_engine(engine_cfg, model_path: str, train_cfg, rl_cfg, temperature: float, worker_bundles=()):
    """``worker_bundles``: engine=mindspeed only, the placement of MindSpeed-RL's worker
    group (bundles of ASP's placement groups, made by the driver)."""
    if engine_cfg.name == "mindspeed":
        _require_mindspeed_rl()
        return _plugin("mindspeed", "MindSpeedTrainingEngine")(engine_cfg, model_path, train_cfg, rl_cfg, temperature,
                                                               bundles=worker_bundles)
    _check_hf_training(engine_cfg, "training engine")
    from .hf import HFTrainingEngine

    return HFTrainingEngine(
        model_path, engine_cfg.device, engine_cfg.dtype, engine_cfg.num_threads, lr=train_cfg.lr,
        weight_decay=train_cfg.weight_decay, clip_grad=train_cfg.clip_grad,
        micro_batch_size=rl_cfg.micro_batch_size, temperature=temperature,
        betas=(getattr(train_cfg, "adam_beta1", 0.9), getattr(train_cfg, "adam_beta2", 0.999)),
    )


def make_reference_policy(engine_cfg, model_path: str, temperature: float, training_engine=None):
    """The frozen reference policy the KL term is measured against (the starting checkpoint).
    engine=mindspeed: MindSpeed-RL's ReferenceWorker, driven by ``training_engine``."""
    if engine_cfg.name == "mindspeed":
        _require_mindspeed_rl()
        if training_engine is None:
            raise EngineError("engine=mindspeed: the reference policy is built from its training engine "
                              "(make_reference_policy(..., training_engine=engine))")
        return _plugin("mindspeed", "MindSpeedReferencePolicy")(training_engine)
    _check_hf_training(engine_cfg, "reference policy")
    from .hf import HFReferencePolicy

    return HFReferencePolicy(model_path, engine_cfg.device, engine_cfg.dtype, engine_cfg.num_threads, temperature)
