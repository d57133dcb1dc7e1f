"""Cost models of the simulator: pure functions of profiles and counts, in seconds.

Each function is a roofline: the time of a piece of work is the larger of the bytes it
must move over the bandwidth that moves them and the FLOPs it must do over the compute
that does them, both derated by the efficiency the hardware profile cites. The formulas
are in the docstrings; the numbers are in the profiles (mindspeed_rl_asp/sim/profiles.py),
each with its source. Standard library only.

An instance is ``devices`` devices serving one model replica (tensor and expert
parallel); its weights, KV cache, bandwidth and FLOP/s are spread evenly over them.
"""
from __future__ import annotations

import math

from .profiles import GIB, EngineProfile, HardwareProfile, ModelProfile, ProfileError


def expected_distinct_experts(num_experts: int, experts_per_token: int, tokens: int) -> float:
    """Expected number of distinct experts a batch of ``tokens`` tokens hits in one layer.

    ``E * (1 - (1 - k/E) ** b)``: under uniform routing a given expert is missed by one
    token with probability ``1 - k/E``, by all ``b`` tokens (independently) with that to
    the power ``b``; linearity of expectation sums the hit probability over the ``E``
    experts. One token hits exactly ``k``; from a few dozen tokens up nearly all ``E``
    (Qwen3-30B-A3B, E=128, k=8: 8 at b=1, 60.9 at b=10, 111.8 at b=32, 125.9 at b=64),
    which is why a decode step of a big batch reads almost every expert. 0 for a dense
    model.
    """
    if num_experts == 0:
        return 0.0
    _require(0 < experts_per_token <= num_experts, "experts_per_token", experts_per_token,
             f"in [1, num_experts={num_experts}]")
    _require(tokens >= 0, "tokens", tokens, ">= 0")
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** tokens)


def decode_bytes_read(model: ModelProfile, batch: int, kv_tokens: int) -> float:
    """Bytes one decode step reads from device memory, summed over the instance.

    ``non-expert weights + layers x distinct experts x bytes per expert + KV bytes of the
    running sequences``: every weight a token of the batch touches is read once per step
    (shared by the batch), the experts only as far as the batch's tokens reach them, and
    each running sequence's cached keys and values (``kv_tokens`` in total) once.
    Activations are a few MB and left out.
    """
    _require(batch >= 1, "batch", batch, ">= 1")
    _require(kv_tokens >= 0, "kv_tokens", kv_tokens, ">= 0")
    experts = expected_distinct_experts(model.num_experts, model.num_experts_per_tok, batch)
    return (model.dense_weight_bytes + model.num_layers * experts * model.expert_bytes
            + kv_tokens * model.kv_bytes_per_token)


def decode_memory_time(model: ModelProfile, hardware: HardwareProfile, devices: int, batch: int,
                       kv_tokens: int) -> float:
    """``bytes_read / (devices x HBM bandwidth x bandwidth efficiency)``."""
    _require(devices >= 1, "devices", devices, ">= 1")
    bandwidth = devices * hardware.hbm_bandwidth * hardware.inference_bandwidth_efficiency
    return decode_bytes_read(model, batch, kv_tokens) / bandwidth


def decode_compute_time(model: ModelProfile, hardware: HardwareProfile, devices: int, batch: int) -> float:
    """``2 x matmul params x batch / (devices x peak FLOP/s x compute efficiency)``: one
    multiply-add (2 FLOPs) per active weight per token (see ModelProfile.matmul_params).
    Attention over the cache (4 x layers x q_heads x head_dim FLOPs per cached token) is
    left out: decode is memory-bound long before it matters."""
    _require(devices >= 1, "devices", devices, ">= 1")
    _require(batch >= 1, "batch", batch, ">= 1")
    compute = devices * hardware.peak_flops * hardware.inference_compute_efficiency
    return 2.0 * model.matmul_params * batch / compute


def decode_step_time(model: ModelProfile, hardware: HardwareProfile, engine: EngineProfile, devices: int,
                     batch: int, kv_tokens: int) -> float:
    """Seconds of one decode step of ``batch`` running sequences holding ``kv_tokens``.

    ``overhead + max(bytes_read / (devices x HBM bw x eff), 2 x active x b / (devices x
    peak x eff))``: the engine's per-step cost outside the kernels (scheduling, sampling,
    launches) plus a roofline of the step's kernels. Small batches stream the weights
    (memory-bound, time nearly flat in ``batch``); past the crossover
    (:func:`decode_crossover_batch`) the matmuls dominate and time grows linearly.
    """
    return engine.decode_step_overhead + max(
        decode_memory_time(model, hardware, devices, batch, kv_tokens),
        decode_compute_time(model, hardware, devices, batch),
    )


def decode_crossover_batch(model: ModelProfile, hardware: HardwareProfile, devices: int,
                           kv_tokens_per_sequence: float = 0.0, max_batch: int = 1 << 20) -> int:
    """The smallest batch whose decode step is compute-bound (compute time >= memory
    time), with ``kv_tokens_per_sequence`` cached tokens per sequence; ``max_batch + 1``
    if none up to ``max_batch`` is.

    compute - memory is convex in the batch (linear terms minus the concave expert
    saturation), so once a step is memory-bound at batch 1 it turns compute-bound at most
    once, and bisection finds where. With long caches it may never: each sequence then
    adds more KV bytes than FLOPs at the roofline's ratio.
    """
    def compute_bound(b: int) -> bool:
        kv = int(round(b * kv_tokens_per_sequence))
        return (decode_compute_time(model, hardware, devices, b)
                >= decode_memory_time(model, hardware, devices, b, kv))

    if compute_bound(1):
        return 1
    if not compute_bound(max_batch):
        return max_batch + 1
    low, high = 1, max_batch
    while low < high:
        mid = (low + high) // 2
        if compute_bound(mid):
            high = mid
        else:
            low = mid + 1
    return low


def prefill_time(model: ModelProfile, hardware: HardwareProfile, devices: int, prompt_tokens: int) -> float:
    """Seconds to prefill ``prompt_tokens`` tokens (all prompts of a batch together).

    Compute-bound: ``2 x matmul params x prompt tokens / (devices x peak x eff)``. It is
    floored by one read of the weights those tokens touch (the same roofline as a decode
    step), which only matters for a handful of tokens: a prefill is a forward pass and
    cannot beat streaming the weights once.
    """
    _require(prompt_tokens >= 1, "prompt_tokens", prompt_tokens, ">= 1")
    return max(decode_compute_time(model, hardware, devices, prompt_tokens),
               decode_memory_time(model, hardware, devices, prompt_tokens, 0))


def kv_capacity_tokens(model: ModelProfile, hardware: HardwareProfile, engine: EngineProfile, devices: int,
                       sequence_tokens: int) -> int:
    """Tokens of KV cache an instance of ``devices`` devices holds.

    ``(devices x HBM x kv memory fraction - weight bytes) / kv bytes per token``, floored:
    the engine may use ``gpu_memory_utilization`` of each device, the weights take their
    share and the rest is KV cache (activation workspace is left inside that margin).
    Raises :class:`ProfileError` naming ``layout.infer_instance_size`` when the instance
    cannot hold the weights plus one whole sequence of ``sequence_tokens``
    (``rl.max_prompt_length + generate.sampling_config.max_tokens``), with the smallest
    instance size that would.
    """
    _require(devices >= 1, "devices", devices, ">= 1")
    _require(sequence_tokens >= 1, "sequence_tokens", sequence_tokens, ">= 1")
    usable = devices * hardware.hbm_bytes * engine.kv_memory_fraction
    capacity = math.floor((usable - model.weight_bytes) / model.kv_bytes_per_token)
    if capacity < sequence_tokens:
        need = model.weight_bytes + sequence_tokens * model.kv_bytes_per_token
        fits = math.ceil(need / (hardware.hbm_bytes * engine.kv_memory_fraction))
        raise ProfileError(
            f"layout.infer_instance_size={devices}: {devices} x {hardware.hbm_bytes / GIB:.0f} GiB "
            f"({hardware.name}) at engine.gpu_memory_utilization={engine.kv_memory_fraction} leaves "
            f"{usable / GIB:.1f} GiB, less than {model.name}'s {model.weight_bytes / GIB:.1f} GiB of weights "
            f"plus one sequence of {sequence_tokens} tokens ({sequence_tokens * model.kv_bytes_per_token / GIB:.2f}"
            f" GiB of KV cache); use layout.infer_instance_size >= {fits} (a divisor of layout.devices_per_node), "
            f"raise engine.gpu_memory_utilization, or shorten rl.max_prompt_length / "
            f"generate.sampling_config.max_tokens"
        )
    return capacity


def training_time(model: ModelProfile, hardware: HardwareProfile, devices: int, trained_tokens: int,
                  extra_forwards: int = 0) -> float:
    """Seconds of the training work on ``trained_tokens`` tokens (prompt + response).

    ``(6 + 2 x extra_forwards) x matmul params x tokens / (devices x peak x MFU)``: a
    forward (2 FLOPs per weight per token) and a backward (4) for the update, plus one
    no-grad forward (2) for each extra pass over the same tokens: the old-policy
    log-probs and, with a KL term, the reference-policy log-probs. MFU is the measured
    share of peak a training step reaches, so communication and bubbles are inside it.
    """
    _require(devices >= 1, "devices", devices, ">= 1")
    _require(trained_tokens >= 0, "trained_tokens", trained_tokens, ">= 0")
    _require(extra_forwards >= 0, "extra_forwards", extra_forwards, ">= 0")
    flops = (6 + 2 * extra_forwards) * model.matmul_params * trained_tokens
    return flops / (devices * hardware.peak_flops * hardware.training_mfu)


def weight_transfer_time(weight_bytes: float, bandwidth: float, fixed_cost: float) -> float:
    """``fixed cost + weight bytes / effective bandwidth``: a refresh pays its fixed part
    (resharding, format conversion, engine reload) and then moves the bytes."""
    _require(weight_bytes >= 0, "weight_bytes", weight_bytes, ">= 0")
    _require(bandwidth > 0, "bandwidth", bandwidth, "> 0")
    _require(fixed_cost >= 0, "fixed_cost", fixed_cost, ">= 0")
    return fixed_cost + weight_bytes / bandwidth


def weight_sync_time(model: ModelProfile, hardware: HardwareProfile, engine: EngineProfile, devices: int,
                     cross_node: bool = True) -> float:
    """Seconds to refresh one instance of ``devices`` devices with a new weight version.

    Each device receives its shard over its own link, so the instance's bandwidth is
    ``devices x`` the per-device inter-node bandwidth (trainer and instance on different
    nodes, the async layouts) or intra-node bandwidth (``cross_node=False``), and the
    engine adds its fixed reshard/convert cost (:func:`weight_transfer_time`).
    """
    _require(devices >= 1, "devices", devices, ">= 1")
    link = hardware.inter_node_bandwidth if cross_node else hardware.intra_node_bandwidth
    return weight_transfer_time(model.weight_bytes, devices * link, engine.weight_sync_fixed)


def _require(ok: bool, name: str, value, condition: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value} must be {condition}")
