"""Cost models of the simulator: pure functions of profiles and counts, in seconds.

Each function is a roofline: the time of a piece of work is the larger of the bytes it
must move over the bandwidth that moves them and the FLOPs it must do over the compute
that does them, both derated by the efficiency the hardware profile cites. The formulas
are in the docstrings; the numbers are in the profiles (mindspeed_rl_asp/sim/profiles.py),
each with its source. Standard library only.

An instance is ``devices`` devices serving one model replica: attention and the dense
weights split over ``tp`` tensor-parallel devices (``devices / tp`` data-parallel
attention groups each hold a copy), the experts over ``ep`` devices; its KV cache,
bandwidth and FLOP/s are spread evenly over the devices. ``tp`` and ``ep`` default to
``devices`` (everything sharded), the simulator's instances pass the model's
``infer_tensor_parallel_size`` / ``infer_expert_parallel_size``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .profiles import GIB, EngineProfile, HardwareProfile, ModelProfile, ProfileError


@dataclass(frozen=True)
class Parallel:
    """How one inference instance splits the model: ``devices`` in all, ``tp`` tensor
    parallel (attention and dense weights), ``ep`` expert parallel (1 for a dense model),
    ``dp = devices / tp`` data-parallel attention groups, each running ``batch / dp``
    of the sequences."""

    devices: int
    tp: int
    ep: int

    @property
    def dp(self) -> int:
        return max(1, self.devices // self.tp)

    @property
    def expert_shards(self) -> int:
        """Ways each expert's weights are split: over the EP group, or without expert
        parallelism (``ep = 1``) tensor-parallel like the dense layers (vLLM's fused MoE
        under TP), which needs no all-to-all."""
        return self.ep if self.ep > 1 else self.tp


def parallel_of(model: ModelProfile, devices: int, tp: int | None = None, ep: int | None = None) -> Parallel:
    _require(devices >= 1, "devices", devices, ">= 1")
    tp = devices if tp is None else tp
    ep = (devices if ep is None else ep) if model.is_moe else 1
    _require(1 <= tp <= devices and devices % tp == 0, "tp", tp, f"a divisor of devices={devices}")
    _require(1 <= ep <= devices, "ep", ep, f"in [1, devices={devices}]")
    return Parallel(devices, tp, ep)


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
    (shared by the batch; an untied input embedding is looked up, not read:
    ``ModelProfile.decode_dense_bytes``), the experts only as far as the batch's tokens
    reach them, and each running sequence's cached keys and values (``kv_tokens`` in
    total) once.
    Activations are a few MB and left out.
    """
    _require(batch >= 1, "batch", batch, ">= 1")
    _require(kv_tokens >= 0, "kv_tokens", kv_tokens, ">= 0")
    experts = expected_distinct_experts(model.num_experts, model.num_experts_per_tok, batch)
    return (model.decode_dense_bytes + model.num_layers * experts * model.expert_bytes
            + kv_tokens * model.kv_bytes_per_token)


def decode_device_bytes(model: ModelProfile, par: Parallel, batch: int, kv_tokens: float) -> float:
    """Bytes one device of the instance reads in a decode step: its share of the dense
    weights (``1 / tp``: data-parallel attention groups each read their own copy), its
    share of the experts the batch hits (``1 / expert_shards``), and its share of the cache
    (``1 / devices``). With ``tp = ep = devices`` this is ``decode_bytes_read / devices``."""
    _require(batch >= 1, "batch", batch, ">= 1")
    experts = expected_distinct_experts(model.num_experts, model.num_experts_per_tok, batch)
    return (model.decode_dense_bytes / par.tp + model.num_layers * experts * model.expert_bytes / par.expert_shards
            + kv_tokens * model.kv_bytes_per_token / par.devices)


def decode_memory_time(model: ModelProfile, hardware: HardwareProfile, devices: int, batch: int,
                       kv_tokens: int, tp: int | None = None, ep: int | None = None) -> float:
    """The busiest device's bytes over its effective bandwidth (``HBM bw x bandwidth
    efficiency``): ``bytes_read / (devices x bw x eff)`` when everything is sharded."""
    _require(kv_tokens >= 0, "kv_tokens", kv_tokens, ">= 0")
    par = parallel_of(model, devices, tp, ep)
    bandwidth = hardware.hbm_bandwidth * hardware.inference_bandwidth_efficiency
    return decode_device_bytes(model, par, batch, kv_tokens) / bandwidth


def decode_compute_time(model: ModelProfile, hardware: HardwareProfile, devices: int, batch: int) -> float:
    """``2 x matmul params x batch / (devices x peak FLOP/s x compute efficiency)``: one
    multiply-add (2 FLOPs) per active weight per token (see ModelProfile.matmul_params).
    Attention over the cache (4 x layers x q_heads x head_dim FLOPs per cached token) is
    left out: decode is memory-bound long before it matters."""
    _require(devices >= 1, "devices", devices, ">= 1")
    _require(batch >= 1, "batch", batch, ">= 1")
    compute = devices * hardware.peak_flops * hardware.inference_compute_efficiency
    return 2.0 * model.matmul_params * batch / compute


def operators_per_step(model: ModelProfile, engine: EngineProfile, par: Parallel) -> int:
    """Operators one decode step launches on each device: per layer an attention block,
    a dense or MoE FFN, the tensor-parallel all-reduces when ``tp > 1`` and the
    expert-parallel dispatch / combine when ``ep > 1``; plus those outside the layers
    (embedding, final norm, LM head, sampler). The counts are the engine's
    (``engine.ops_*``, each with its source)."""
    ffn = engine.ops_moe_ffn if model.is_moe else engine.ops_dense_ffn
    comm = (engine.ops_tp_comm if par.tp > 1 else 0) + (engine.ops_ep_comm if model.is_moe and par.ep > 1 else 0)
    return model.num_layers * (engine.ops_attention + ffn + comm) + engine.ops_step


def _link(hardware: HardwareProfile, devices: int) -> tuple[float, float]:
    """(bandwidth per device, small-collective latency) of a group of ``devices``: inside
    a node when it fits one, across nodes otherwise."""
    if devices <= hardware.devices_per_node:
        return hardware.intra_node_bandwidth, hardware.intra_node_latency
    return hardware.inter_node_bandwidth, hardware.inter_node_latency


def allreduce_time(bytes_per_device: float, devices: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce, alpha-beta: ``latency + 2 (d - 1) / d x bytes / bandwidth``; 0 on
    one device. ``latency`` is a measured small-message collective (it already holds the
    algorithm's steps), ``bandwidth`` a device's link."""
    if devices <= 1:
        return 0.0
    return latency + 2.0 * (devices - 1) / devices * bytes_per_device / bandwidth


def alltoall_time(bytes_per_device: float, devices: int, bandwidth: float, latency: float) -> float:
    """All-to-all, alpha-beta: each device keeps ``1 / d`` of what it sends and moves the
    rest over its link, ``latency + (d - 1) / d x bytes / bandwidth``; 0 on one device."""
    if devices <= 1:
        return 0.0
    return latency + (devices - 1) / devices * bytes_per_device / bandwidth


def decode_comm_time(model: ModelProfile, hardware: HardwareProfile, par: Parallel, batch: int) -> float:
    """Seconds of a decode step's communication on the critical path, summed over layers:
    two tensor-parallel all-reduces of the hidden states (after attention and after the
    FFN) of a data-parallel group's ``batch / dp`` tokens, and for MoE with ``ep > 1`` an
    all-to-all dispatch and combine of each token's hidden state to its ``k`` experts."""
    tokens = batch / par.dp
    hidden_bytes = tokens * model.hidden_size * model.dtype_bytes
    per_layer = 0.0
    if par.tp > 1:
        bandwidth, latency = _link(hardware, par.tp)
        per_layer += 2 * allreduce_time(hidden_bytes, par.tp, bandwidth, latency)
    if model.is_moe and par.ep > 1:
        bandwidth, latency = _link(hardware, par.ep)
        per_layer += 2 * alltoall_time(hidden_bytes * model.num_experts_per_tok, par.ep, bandwidth, latency)
    return model.num_layers * per_layer


def decode_step_parts(model: ModelProfile, hardware: HardwareProfile, engine: EngineProfile, par: Parallel,
                      batch: int) -> tuple[float, float]:
    """``(constant, floor)`` of a decode step of ``batch`` sequences: the step costs
    ``constant + max(memory time, floor)``, where the memory time is the only part that
    depends on the cache (:func:`decode_memory_time`). By the engine's execution:

    - fitted: ``constant = overhead``, ``floor = compute``;
    - serial (a CPU: one core runs the framework, the matmuls and the cache reads one
      after another): ``constant = overhead + compute``, ``floor = 0``, so the step is
      ``overhead + compute + memory``;
    - graph: ``constant = overhead + per_sequence x b / dp + comm + ops x gap``,
      ``floor = compute`` (the device runs the kernels, the collectives and the gaps one
      after another; the host launches one graph);
    - eager: the host launches ``ops`` operators while the device runs them, so the
      step is the slower of the two: ``max(ops x launch, kernels + comm)`` =
      ``comm + max(kernels, ops x launch - comm)``; ``constant = overhead + per_sequence
      x b / dp + comm``, ``floor = max(compute, ops x launch - comm)``.

    ``overhead`` (``engine.decode_step_overhead``) is the host's fixed work per step
    (scheduling, input preparation); ``per_sequence`` its work per running sequence
    (sampling, bookkeeping, detokenising), each data-parallel group doing its share.
    """
    compute = decode_compute_time(model, hardware, par.devices, batch)
    if engine.execution == "serial":
        return engine.decode_step_overhead + compute, 0.0
    if not engine.first_principles:
        return engine.decode_step_overhead, compute
    comm = decode_comm_time(model, hardware, par, batch)
    host = engine.decode_step_overhead + engine.per_sequence * batch / par.dp
    ops = operators_per_step(model, engine, par)
    if engine.execution == "graph":
        return host + comm + ops * engine.graph_op_gap, compute
    return host + comm, max(compute, ops * engine.op_launch - comm)


def decode_step_time(model: ModelProfile, hardware: HardwareProfile, engine: EngineProfile, devices: int,
                     batch: int, kv_tokens: int, tp: int | None = None, ep: int | None = None) -> float:
    """Seconds of one decode step of ``batch`` running sequences holding ``kv_tokens``.

    ``constant + max(memory, floor)`` (:func:`decode_step_parts`): the memory time is the
    busiest device's weights, experts and cache over its bandwidth; the compute time
    ``2 x active x b / (devices x peak x eff)``. Small batches stream the weights
    (memory-bound, time nearly flat in ``batch``); past the crossover
    (:func:`decode_crossover_batch`) the matmuls dominate and time grows linearly; an
    eager engine is host-bound below the batch where its kernels outlast its launches.
    """
    par = parallel_of(model, devices, tp, ep)
    constant, floor = decode_step_parts(model, hardware, engine, par, batch)
    return constant + max(decode_memory_time(model, hardware, devices, batch, kv_tokens, tp, ep), floor)


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


def prefill_time(model: ModelProfile, hardware: HardwareProfile, devices: int, prompt_tokens: int,
                 serial: bool = False, sum_squared_lengths: float = 0.0) -> float:
    """Seconds to prefill ``prompt_tokens`` tokens (all prompts of a batch together).

    Compute-bound: ``2 x matmul params x prompt tokens / (devices x peak x eff)``, ``eff``
    the hardware's prefill efficiency (its inference compute efficiency unless the
    profile measured prefill apart). It is floored by one read of the weights those
    tokens touch (the same roofline as a decode step), which only matters for a handful
    of tokens: a prefill is a forward pass and cannot beat streaming the weights once.
    ``serial`` (a CPU engine): the read and the matmuls add up instead. Attention adds
    ``model.attention_flops_coefficient x sum of L^2`` over the prompts (each ``L`` tokens
    as the engine lays it out, padding included), as in a training forward.
    """
    _require(prompt_tokens >= 1, "prompt_tokens", prompt_tokens, ">= 1")
    compute = forward_flops(model, prompt_tokens, sum_squared_lengths) / (
        devices * hardware.peak_flops * hardware.prefill_efficiency)
    weights = decode_memory_time(model, hardware, devices, prompt_tokens, 0)
    return compute + weights if serial else max(compute, weights)


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


def forward_flops(model: ModelProfile, tokens: int, sum_squared_lengths: float = 0.0) -> float:
    """FLOPs of one forward pass over ``tokens`` tokens: ``2 x matmul params`` per token
    plus attention, ``model.attention_flops_coefficient x sum of L^2`` over the sequences
    (each ``L`` tokens long as laid out, padding included). A prefill is one; a training
    step is several (:func:`training_flops`)."""
    _require(tokens >= 0, "tokens", tokens, ">= 0")
    _require(sum_squared_lengths >= 0, "sum_squared_lengths", sum_squared_lengths, ">= 0")
    return 2.0 * model.matmul_params * tokens + model.attention_flops_coefficient * sum_squared_lengths


def training_flops(model: ModelProfile, trained_tokens: int, extra_forwards: int = 0, sum_squared_lengths: float = 0.0,
                   recompute: bool = False) -> float:
    """FLOPs of a training step: ``passes x (2 x matmul params x tokens + attention)``
    with ``passes`` forwards' worth of work: 3 for the update (forward 1, backward 2),
    1 per extra no-grad pass (old-policy, reference log-probs), 1 more with full
    recompute; attention is ``model.attention_flops_coefficient x sum of L^2`` over the
    step's sequences (each of ``L`` prompt + response tokens)."""
    _require(trained_tokens >= 0, "trained_tokens", trained_tokens, ">= 0")
    _require(extra_forwards >= 0, "extra_forwards", extra_forwards, ">= 0")
    passes = 3 + extra_forwards + (1 if recompute else 0)
    return passes * forward_flops(model, trained_tokens, sum_squared_lengths)


def padded_tokens(prompt_lengths: Sequence[int], response_lengths: Sequence[int], rows_per_batch: int
                  ) -> tuple[int, int]:
    """(tokens, sum of squared lengths) of rows laid out as an HF trainer pads them:
    consecutive batches of ``rows_per_batch`` rows, each row ``[left-padded prompt |
    right-padded response]`` as long as the batch's longest prompt plus its longest
    response (``engines/hf.pad_batch``); attention runs over the padded length too."""
    _require(rows_per_batch >= 1, "rows_per_batch", rows_per_batch, ">= 1")
    tokens = squares = 0
    for start in range(0, len(response_lengths), rows_per_batch):
        rows = range(start, min(len(response_lengths), start + rows_per_batch))
        width = max(prompt_lengths[i] for i in rows) + max(response_lengths[i] for i in rows)
        tokens += len(rows) * width
        squares += len(rows) * width * width
    return tokens, squares


def training_time(model: ModelProfile, hardware: HardwareProfile, devices: int, trained_tokens: int,
                  extra_forwards: int = 0, sum_squared_lengths: float = 0.0, recompute: bool = False) -> float:
    """Seconds of the training compute on ``trained_tokens`` tokens (prompt + response):
    :func:`training_flops` over ``devices x peak x MFU``. Without ``sum_squared_lengths``
    (attention) and recompute this is ``(6 + 2 x extra) x matmul params x tokens / (devices
    x peak x MFU)``. The MFU is the kernels' share of peak; the data-parallel gradient
    reduction is priced apart (:func:`gradient_sync_time`)."""
    _require(devices >= 1, "devices", devices, ">= 1")
    flops = training_flops(model, trained_tokens, extra_forwards, sum_squared_lengths, recompute)
    return flops / (devices * hardware.peak_flops * hardware.training_mfu)


def padded_training_time(model: ModelProfile, hardware: HardwareProfile, devices: int,
                         prompt_lengths: Sequence[int], response_lengths: Sequence[int], rows_per_batch: int,
                         extra_forwards: int = 0, recompute: bool = False) -> float:
    """Seconds of a training step whose trainer pads (``engine.train_layout: padded``, the hf
    engine): the update (and a recompute) runs micro-batches of ``rows_per_batch`` rows,
    each padded to its own longest prompt and response; the no-grad passes (proximal,
    reference log-probs) run the whole step as one padded batch (``engines/hf.py``)."""
    update_tokens, update_squares = padded_tokens(prompt_lengths, response_lengths, rows_per_batch)
    step_tokens, step_squares = padded_tokens(prompt_lengths, response_lengths, max(1, len(response_lengths)))
    update = training_time(model, hardware, devices, update_tokens, 0, update_squares, recompute)
    no_grad = extra_forwards * forward_flops(model, step_tokens, step_squares)
    return update + no_grad / (devices * hardware.peak_flops * hardware.training_mfu)


def gradient_sync_time(model: ModelProfile, hardware: HardwareProfile, devices: int, tp: int, pp: int, ep: int,
                       overlap: float) -> float:
    """Exposed seconds of a step's data-parallel gradient reduction: an all-reduce
    (reduce-scatter + all-gather with a distributed optimizer: the same bytes) of one
    device's gradients (``model.train_params_per_device`` in the model dtype) over the
    ``devices / (tp x pp)`` data-parallel ranks, across nodes when the group spans them,
    of which ``1 - overlap`` is not hidden behind the backward. 0 without data
    parallelism."""
    _require(0.0 <= overlap <= 1.0, "overlap", overlap, "in [0, 1]")
    dp = devices // max(tp * pp, 1)
    if dp <= 1:
        return 0.0
    grad_bytes = model.train_params_per_device(tp, pp, ep) * model.dtype_bytes
    bandwidth, latency = _link(hardware, devices)
    return (1.0 - overlap) * allreduce_time(grad_bytes, dp, bandwidth, latency)


def offload_bytes_per_device(model: ModelProfile, devices: int, tp: int, pp: int, ep: int) -> float:
    """Bytes of training state one device moves to host memory (and back) at a hybrid
    switch, MindSpeed-RL's ``offload_train_param / grad / optimizer``: bf16 parameters
    (2 bytes) and fp32 main gradients (4) of its model-parallel share, and the
    distributed optimizer's fp32 master weights, Adam's two moments (12 bytes) split
    further over the data-parallel ranks."""
    share = model.train_params_per_device(tp, pp, ep)
    dp = max(1, devices // max(tp * pp, 1))
    return share * (model.dtype_bytes + 4) + share * 12 / dp


def weight_transfer_time(weight_bytes: float, bandwidth: float, fixed_cost: float) -> float:
    """``fixed cost + weight bytes / effective bandwidth``: a refresh pays its fixed part
    (resharding, format conversion, engine reload) and then moves the bytes."""
    _require(weight_bytes >= 0, "weight_bytes", weight_bytes, ">= 0")
    _require(bandwidth > 0, "bandwidth", bandwidth, "> 0")
    _require(fixed_cost >= 0, "fixed_cost", fixed_cost, ">= 0")
    return fixed_cost + weight_bytes / bandwidth


def publish_time(model: ModelProfile, engine: EngineProfile) -> float:
    """Seconds the trainer spends on a refresh before the bytes move: the engine's fixed
    cost plus ``weight_sync_per_tensor x model.num_tensors`` (every tensor gathered from
    its shards, resharded to the inference layout, converted and handed over one by one)."""
    return engine.weight_sync_fixed + engine.weight_sync_per_tensor * model.num_tensors


def load_bandwidth(hardware: HardwareProfile, engine: EngineProfile, devices: int, link: float,
                   concurrent: int = 1) -> float:
    """Bytes/s into one instance of ``devices`` devices: its own links (``devices x link``),
    capped by the sender's when the engine sends from ``weight_sync_senders`` links shared
    by ``concurrent`` instances loading at once (rank 0 sending to every actor in turn)."""
    own = devices * link
    if engine.weight_sync_senders <= 0:
        return own
    return min(own, engine.weight_sync_senders * link / max(concurrent, 1))


def _require(ok: bool, name: str, value, condition: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value} must be {condition}")
