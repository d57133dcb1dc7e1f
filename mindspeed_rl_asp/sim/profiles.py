"""Simulator inputs as plain, frozen data: the model, the hardware, the engine.

Every number a cost model uses comes from one of these profiles, and every number in a
profile either is computed from architecture numbers (parameter counts, bytes) or
carries its source (hardware and engine numbers, each with a ``sources`` entry). Nothing
here is a knob: a published figure is copied with its citation, and an assumption says
that it is one.

Units inside a profile are SI: FLOP/s, bytes, bytes/s, seconds. Config files use the
units datasheets use (TFLOPS, GiB, GB/s); the ``*_from_config`` constructors convert and
validate, collecting every problem into one :class:`ProfileError`.

Standard library only: the simulator and its tests must run without torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

GIB = 2**30
GB = 10**9
TERA = 10**12

# Bytes per element of the dtype names the configs use (``model.dtype``).
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
BATCHING_STYLES = ("continuous", "static")
# How an engine runs a decode step's operators (docs/simulator.md, "Decode step"):
# eager: the host launches every operator (the step is the slower of the host's launches
# and the device's kernels); graph: one captured graph replays them (a small gap per
# operator on the device); fitted: the per-step cost outside the roofline is one constant
# fitted to whole measured calls (cpu_local / hf), dispatch and per-sequence work inside it.
EXECUTION_MODES = ("eager", "graph", "fitted", "serial")
RECOMPUTE_MODES = ("none", "full")
TRAIN_LAYOUTS = ("packed", "padded")

_MISSING = object()


class ProfileError(ValueError):
    """A profile that cannot be built; the message names every bad key and its fix."""


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class ModelProfile:
    """A Qwen3-family decoder (dense or MoE) described by its architecture numbers only.

    Every parameter count is computed from the layout of a Qwen3 layer, so a typo in the
    architecture shows up as a wrong total instead of hiding behind a typed-in one:

    - attention: q/k/v/o projections without bias, plus ``q_norm`` and ``k_norm``
      (an RMSNorm weight of ``head_dim`` each, applied per head);
    - two RMSNorm weights of ``hidden_size`` per layer and one final norm;
    - FFN: SwiGLU (gate, up, down) of ``intermediate_size`` in a dense model; in an MoE
      model every layer is MoE (Qwen3-MoE: ``decoder_sparse_step=1``, no
      ``mlp_only_layers``), a router of ``hidden x num_experts`` and ``num_experts``
      SwiGLU experts of ``moe_intermediate_size``, no shared expert. ``intermediate_size``
      is then unused;
    - input embedding and, unless tied, a separate LM head of ``vocab x hidden``.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    dtype_bytes: int
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0

    @cached_property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @cached_property
    def attention_params_per_layer(self) -> int:
        q_dim = self.num_attention_heads * self.head_dim
        kv_dim = self.num_key_value_heads * self.head_dim
        projections = self.hidden_size * q_dim + 2 * self.hidden_size * kv_dim + q_dim * self.hidden_size
        return projections + 2 * self.head_dim  # q_norm and k_norm

    @cached_property
    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden_size  # input_layernorm, post_attention_layernorm

    @cached_property
    def params_per_expert(self) -> int:
        """One SwiGLU expert (gate, up, down); 0 for a dense model."""
        return 3 * self.hidden_size * self.moe_intermediate_size if self.is_moe else 0

    @cached_property
    def ffn_params_per_layer(self) -> int:
        """The FFN weights every token reads: the dense MLP, or the MoE router alone."""
        if self.is_moe:
            return self.hidden_size * self.num_experts
        return 3 * self.hidden_size * self.intermediate_size

    @cached_property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @cached_property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @cached_property
    def dense_params(self) -> int:
        """Non-expert parameters: everything every token uses (embeddings included)."""
        per_layer = self.attention_params_per_layer + self.norm_params_per_layer + self.ffn_params_per_layer
        return self.num_layers * per_layer + self.hidden_size + self.embedding_params + self.lm_head_params

    @cached_property
    def expert_params(self) -> int:
        return self.num_layers * self.num_experts * self.params_per_expert

    @cached_property
    def total_params(self) -> int:
        return self.dense_params + self.expert_params

    @cached_property
    def active_params(self) -> int:
        """Parameters one token uses: the dense part plus ``num_experts_per_tok`` experts
        per layer (the definition behind Qwen's "3.3B activated")."""
        return self.dense_params + self.num_layers * self.num_experts_per_tok * self.params_per_expert

    @cached_property
    def matmul_params(self) -> int:
        """Active parameters that take part in a matrix multiply, i.e. FLOPs / (2 x token).

        The input embedding is a table lookup, not a multiply-add, so it is left out when
        it is separate from the LM head (for Qwen3-30B-A3B that is 0.31 B of the 3.35 B
        active, 9 %); a tied table is the LM head's matmul and stays in.
        """
        lookup_only = 0 if self.tie_word_embeddings else self.embedding_params
        return self.active_params - lookup_only

    @cached_property
    def weight_bytes(self) -> int:
        return self.total_params * self.dtype_bytes

    @cached_property
    def dense_weight_bytes(self) -> int:
        return self.dense_params * self.dtype_bytes

    @cached_property
    def decode_dense_bytes(self) -> int:
        """Non-expert bytes a decode step streams from memory: the dense weights less an
        untied input embedding table, which a step only looks up (one row per token, a
        few KB) instead of reading whole (Qwen3-30B-A3B: 0.62 of 3.1 GB; a tied table is
        the LM head's matmul and is read)."""
        lookup_only = 0 if self.tie_word_embeddings else self.embedding_params
        return (self.dense_params - lookup_only) * self.dtype_bytes

    @cached_property
    def expert_bytes(self) -> int:
        """Bytes of one expert of one layer."""
        return self.params_per_expert * self.dtype_bytes

    @cached_property
    def num_tensors(self) -> int:
        """Weight tensors of the Hugging Face layout (what a refresh converts and loads one
        by one): per layer q, k, v, o, q_norm, k_norm and two RMSNorms, plus the dense MLP's
        gate, up and down or the MoE router and gate, up and down of every expert; then the
        embedding, the final norm and an untied LM head."""
        ffn = 1 + 3 * self.num_experts if self.is_moe else 3
        return self.num_layers * (8 + ffn) + 2 + (0 if self.tie_word_embeddings else 1)

    @cached_property
    def attention_flops_coefficient(self) -> int:
        """Forward attention FLOPs of one sequence of ``L`` tokens are this x ``L^2``:
        ``QK^T`` and ``AV`` are ``2 x 2 x q_heads x head_dim`` FLOPs per (query, key) pair
        and layer, and causal masking keeps half of the ``L^2`` pairs."""
        return 2 * self.num_layers * self.num_attention_heads * self.head_dim

    def train_params_per_device(self, tp: int, pp: int, ep: int) -> float:
        """Parameters one training device holds: the dense part split over TP x PP, the
        experts over TP x PP x EP (MindSpeed's ``moe_tp_extend_ep``: experts are sharded over
        the tensor- and expert-parallel groups together)."""
        return self.dense_params / (tp * pp) + self.expert_params / (tp * pp * max(ep, 1))

    @cached_property
    def kv_bytes_per_token(self) -> int:
        """Key and value of every layer, cached in the model dtype:
        2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.num_layers * self.num_key_value_heads * self.head_dim * self.dtype_bytes


# Config keys of the architecture, in ModelConfig and configs/model/*.yaml.
MODEL_ARCHITECTURE_KEYS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "tie_word_embeddings", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size",
)

# Hugging Face config.json names of the same numbers.
HF_CONFIG_KEYS = {"num_layers": "num_hidden_layers"}


def model_problems(profile: ModelProfile, prefix: str = "model") -> list[str]:
    """What is wrong with an architecture, each item naming the ``prefix.key``."""
    p: list[str] = []
    for key in ("num_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "vocab_size", "dtype_bytes"):
        value = getattr(profile, key)
        if not value > 0:
            p.append(f"{prefix}.{key}={value} must be > 0")
    if profile.num_key_value_heads > 0 and profile.num_attention_heads % profile.num_key_value_heads:
        p.append(
            f"{prefix}.num_attention_heads={profile.num_attention_heads} is not a multiple of "
            f"{prefix}.num_key_value_heads={profile.num_key_value_heads} (grouped-query attention)"
        )
    if profile.num_experts < 0:
        p.append(f"{prefix}.num_experts={profile.num_experts} must be >= 0 (0 for a dense model)")
    elif profile.is_moe:
        if not 1 <= profile.num_experts_per_tok <= profile.num_experts:
            p.append(
                f"{prefix}.num_experts_per_tok={profile.num_experts_per_tok} must be in "
                f"[1, {prefix}.num_experts={profile.num_experts}]"
            )
        if not profile.moe_intermediate_size > 0:
            p.append(f"{prefix}.moe_intermediate_size={profile.moe_intermediate_size} must be > 0 "
                     f"when {prefix}.num_experts > 0")
    elif not profile.intermediate_size > 0:
        p.append(f"{prefix}.intermediate_size={profile.intermediate_size} must be > 0 for a dense model")
    return p


def model_profile_from_config(model: Any, prefix: str = "model") -> ModelProfile:
    """The profile of ``model`` (the ``model`` config node, a mapping or a ModelConfig).

    ``dtype_bytes`` comes from ``model.dtype``; the architecture keys are those of
    :data:`MODEL_ARCHITECTURE_KEYS`. Raises :class:`ProfileError` listing every problem.
    """
    fix = f"fix the model's file in configs/model/ or override {prefix}.<key>=..."
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key in MODEL_ARCHITECTURE_KEYS:
        value = _lookup(model, key)
        if value is _MISSING or value is None:
            problems.append(f"{prefix}.{key} is missing")
        else:
            values[key] = value
    dtype = _lookup(model, "dtype")
    if dtype not in DTYPE_BYTES:
        problems.append(f"{prefix}.dtype={dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    if problems:
        _raise(problems, f"model {_lookup(model, 'name')!r}", fix)
    profile = ModelProfile(name=str(_lookup(model, "name")), dtype_bytes=DTYPE_BYTES[dtype],
                           **{k: (bool(v) if k == "tie_word_embeddings" else int(v)) for k, v in values.items()})
    _raise(model_problems(profile, prefix), f"model {profile.name!r}", fix)
    return profile


def model_profile_from_hf_config(config: Mapping[str, Any], name: str = "") -> ModelProfile:
    """The profile of a Hugging Face ``config.json`` (Qwen3 or Qwen3-MoE), as a dict."""
    dtype = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    mapping = {key: config.get(HF_CONFIG_KEYS.get(key, key), 0) for key in MODEL_ARCHITECTURE_KEYS}
    mapping["tie_word_embeddings"] = config.get("tie_word_embeddings", False)
    if not mapping["head_dim"] and config.get("num_attention_heads"):
        mapping["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    mapping.update(name=name or config.get("_name_or_path", "hf-config"), dtype=dtype)
    return model_profile_from_config(mapping, prefix="config.json")


# ------------------------------------------------------------------------ hardware


@dataclass(frozen=True)
class HardwareProfile:
    """One device and its node. ``sources`` maps each config key to where its number
    comes from (a datasheet, a measurement, or an assumption that says so)."""

    name: str
    peak_flops: float                      # dense BF16 FLOP/s per device
    hbm_bytes: float                       # device memory, bytes
    hbm_bandwidth: float                   # bytes/s per device
    inference_bandwidth_efficiency: float  # share of hbm_bandwidth a decode step reaches
    inference_compute_efficiency: float    # share of peak_flops inference matmuls reach
    training_mfu: float                    # model FLOPs utilisation of a training step
    intra_node_bandwidth: float            # bytes/s per device to the other devices of its node
    inter_node_bandwidth: float            # bytes/s per device to other nodes
    devices_per_node: int
    sources: Mapping[str, str] = field(default_factory=dict)
    # 0: not in the profile; a cost model that needs one says so (require_hardware).
    host_link_bandwidth: float = 0.0       # bytes/s per device to host memory (offload / onload)
    intra_node_latency: float = 0.0        # seconds of a small collective inside a node
    inter_node_latency: float = 0.0        # seconds of a small collective across nodes
    prefill_compute_efficiency: float = 0.0  # share of peak_flops a prefill reaches (0: inference_compute_efficiency)
    host_cores: int = 0                    # cores every process of the run shares (0: each has a device of its own)
    corun_slowdown: float = 0.0            # host_cores: how much slower a core runs while another core is busy
    timeslice_slowdown: float = 0.0        # host_cores: how much more CPU the same work takes when time-sliced

    @property
    def prefill_efficiency(self) -> float:
        return self.prefill_compute_efficiency or self.inference_compute_efficiency


# config key -> (profile field, unit factor)
HARDWARE_NUMBERS = {
    "peak_bf16_tflops": ("peak_flops", TERA),
    "hbm_gib": ("hbm_bytes", GIB),
    "hbm_bandwidth_gbs": ("hbm_bandwidth", GB),
    "inference_bandwidth_efficiency": ("inference_bandwidth_efficiency", 1),
    "inference_compute_efficiency": ("inference_compute_efficiency", 1),
    "training_mfu": ("training_mfu", 1),
    "intra_node_bandwidth_gbs": ("intra_node_bandwidth", GB),
    "inter_node_bandwidth_gbs": ("inter_node_bandwidth", GB),
    "devices_per_node": ("devices_per_node", 1),
}
_FRACTIONS = ("inference_bandwidth_efficiency", "inference_compute_efficiency", "training_mfu")
# Numbers only some cost models use: optional in a file, but positive and sourced when
# present, and one error naming the key when a run needs one that is absent.
HARDWARE_OPTIONAL = {
    "host_link_bandwidth_gbs": ("host_link_bandwidth", GB),
    "intra_node_latency_us": ("intra_node_latency", 1e-6),
    "inter_node_latency_us": ("inter_node_latency", 1e-6),
    # A CPU host (configs/hardware/cpu_local.yaml): prefill and decode matmuls reach
    # different shares of the core, and the run's processes time-share its cores.
    "prefill_compute_efficiency": ("prefill_compute_efficiency", 1),
    "host_cores": ("host_cores", 1),
    "corun_slowdown": ("corun_slowdown", 1),
    "timeslice_slowdown": ("timeslice_slowdown", 1),
}


def hardware_profile_from_config(hardware: Any, prefix: str = "hardware") -> HardwareProfile:
    """The profile of the ``hardware`` config node (configs/hardware/<name>.yaml)."""
    name = str(_lookup(hardware, "name", ""))
    fix_file = f"configs/hardware/{name}.yaml" if name else "the file in configs/hardware/"
    sources = _sources(hardware)
    problems: list[str] = []
    values: dict[str, float] = {}
    for key, (attr, factor) in HARDWARE_NUMBERS.items():
        value = _positive_number(problems, hardware, key, prefix, fix_file)
        if value is None:
            continue
        if key in _FRACTIONS and value > 1:
            problems.append(f"{prefix}.{key}={value} must be <= 1 (a fraction of the peak): fix {fix_file} "
                            f"or override {prefix}.{key}=...")
        _require_source(problems, sources, key, prefix, fix_file)
        values[attr] = int(value) if key == "devices_per_node" else float(value) * factor
    for key, (attr, factor) in HARDWARE_OPTIONAL.items():
        raw = _lookup(hardware, key, None)
        if raw is None or raw is _MISSING:
            continue
        if key in ("corun_slowdown", "timeslice_slowdown") and raw == 0:   # a measured "no slowdown" is valid
            _require_source(problems, sources, key, prefix, fix_file)
            continue
        value = _positive_number(problems, hardware, key, prefix, fix_file)
        if value is not None:
            _require_source(problems, sources, key, prefix, fix_file)
            if key == "prefill_compute_efficiency" and value > 1:
                problems.append(f"{prefix}.{key}={value} must be <= 1 (a fraction of the peak): fix {fix_file} "
                                f"or override {prefix}.{key}=...")
            if key == "host_cores" and value != int(value):
                problems.append(f"{prefix}.{key}={value} must be a whole number: fix {fix_file}")
            values[attr] = int(value) if key == "host_cores" else float(value) * factor
    _raise(problems, f"hardware profile {name!r}", None)
    return HardwareProfile(name=name, sources=sources, **values)


def require_hardware(hardware: HardwareProfile, keys_why: Mapping[str, str]) -> None:
    """One :class:`ProfileError` naming every optional hardware key a run needs but the
    profile lacks (``{config key: what needs it}``)."""
    problems = [f"hardware.{key} is missing: {why} needs it; add it with its source to "
                f"configs/hardware/{hardware.name}.yaml or override hardware.{key}=..."
                for key, why in keys_why.items() if not getattr(hardware, HARDWARE_OPTIONAL[key][0])]
    _raise(problems, f"hardware profile {hardware.name!r}", None)


# -------------------------------------------------------------------------- engine


@dataclass(frozen=True)
class EngineProfile:
    """How an inference engine turns steps into time, and what moving weights costs.

    ``batching``: ``continuous`` (vLLM: a finished sequence's slot is refilled at the next
    step) or ``static`` (HF ``generate``: the batch runs until its longest member ends).
    """

    name: str
    batching: str
    decode_step_overhead: float   # seconds per decode step outside the model's kernels
    max_num_seqs: int
    kv_memory_fraction: float     # gpu_memory_utilization: share of device memory for weights + KV
    weight_sync_fixed: float      # seconds per weight refresh besides the transfer (reshard, convert)
    mode_switch: float            # seconds per train <-> generate switch in hybrid mode besides moving bytes
    sources: Mapping[str, str] = field(default_factory=dict)
    # The first-principles step and sync model (execution eager | graph); "fitted" leaves
    # every field below at its default and prices a step with decode_step_overhead alone;
    # "serial" (a CPU: the same core runs the framework and the kernels, so a step's parts
    # add up instead of overlapping) adds call_overhead per generate call.
    execution: str = "fitted"
    call_overhead: float = 0.0    # seconds per generate call besides its steps (inputs, padding, outputs); serial
    train_layout: str = "packed"  # packed: the trainer computes real tokens only; padded: micro-batches padded (hf)
    op_launch: float = 0.0        # eager: host seconds to launch one operator
    graph_op_gap: float = 0.0     # graph: device seconds between two operators of a replayed graph
    per_sequence: float = 0.0     # host seconds per running sequence per step (sampling, scheduling, detokenising)
    ops_attention: int = 0        # operators of one attention block (norms, projections, RoPE, cache write, attention)
    ops_dense_ffn: int = 0        # operators of one dense SwiGLU FFN
    ops_moe_ffn: int = 0          # operators of one MoE FFN (router, top-k, permute, grouped GEMMs, unpermute)
    ops_tp_comm: int = 0          # collectives per layer with tensor parallelism (all-reduces)
    ops_ep_comm: int = 0          # collectives per MoE layer with expert parallelism (dispatch, combine)
    ops_step: int = 0             # operators per step outside the layers (embedding, final norm, LM head, sampler)
    weight_sync_per_tensor: float = 0.0   # seconds per weight tensor of a refresh (gather, reshard, convert, load)
    weight_sync_senders: int = 0  # device links that send a version to the instances (0: each instance's own links)
    hybrid_offload: bool = False  # hybrid: the trainer's params, grads and optimizer state leave the device
    recompute: str = "none"       # training activation recompute: none | full (one more forward)
    dp_comm_overlap: float = 0.0  # share of the data-parallel gradient reduction hidden behind the backward

    @property
    def first_principles(self) -> bool:
        return self.execution in ("eager", "graph")


ENGINE_NUMBERS = {
    "decode_step_overhead_s": "decode_step_overhead",
    "max_num_seqs": "max_num_seqs",
    "gpu_memory_utilization": "kv_memory_fraction",
    "weight_sync_fixed_s": "weight_sync_fixed",
    "mode_switch_s": "mode_switch",
}


def engine_profile_from_config(engine: Any, prefix: str = "engine") -> EngineProfile:
    """The profile of the ``engine`` config node (configs/engine/<name>.yaml)."""
    name = str(_lookup(engine, "name", ""))
    fix_file = f"configs/engine/{name}.yaml" if name else "the file in configs/engine/"
    sources = _sources(engine)
    problems: list[str] = []
    batching = _lookup(engine, "batching")
    if batching not in BATCHING_STYLES:
        problems.append(f"{prefix}.batching={'missing' if batching is _MISSING else repr(batching)} is not one "
                        f"of {', '.join(BATCHING_STYLES)}: fix {fix_file} or override {prefix}.batching=...")
    else:
        _require_source(problems, sources, "batching", prefix, fix_file)
    values: dict[str, float] = {}
    for key, attr in ENGINE_NUMBERS.items():
        value = _positive_number(problems, engine, key, prefix, fix_file)
        if value is None:
            continue
        if key == "gpu_memory_utilization" and value > 1:
            problems.append(f"{prefix}.{key}={value} must be <= 1: fix {fix_file} or override {prefix}.{key}=...")
        _require_source(problems, sources, key, prefix, fix_file)
        values[attr] = int(value) if key == "max_num_seqs" else float(value)
    execution = _sourced_choice(problems, engine, sources, "execution", EXECUTION_MODES, prefix, fix_file)
    if execution is not None:
        values["execution"] = execution
        if execution in ("eager", "graph"):
            values.update(_first_principles_numbers(problems, engine, sources, prefix, fix_file))
        if _lookup(engine, "train_layout", "") not in ("", None, _MISSING):
            layout = _sourced_choice(problems, engine, sources, "train_layout", TRAIN_LAYOUTS, prefix, fix_file)
            if layout is not None:
                values["train_layout"] = layout
        if execution == "serial":
            value = _positive_number(problems, engine, "call_overhead_s", prefix, fix_file)
            if value is not None:
                _require_source(problems, sources, "call_overhead_s", prefix, fix_file)
                values["call_overhead"] = float(value)
    _raise(problems, f"engine profile {name!r}", None)
    return EngineProfile(name=name, batching=batching, sources=sources, **values)


def _sourced_choice(problems, engine, sources, key, choices, prefix, fix_file):
    """``engine[key]`` if it is one of ``choices`` and has a source, else None (and the
    problem said, naming the key)."""
    value = _lookup(engine, key)
    if value not in choices:
        problems.append(f"{prefix}.{key}={'missing' if value is _MISSING else repr(value)} is not one of "
                        f"{', '.join(choices)}: fix {fix_file} or override {prefix}.{key}=...")
        return None
    _require_source(problems, sources, key, prefix, fix_file)
    return value


# config key -> (profile field, kind): the keys an eager or graph engine profile must give.
ENGINE_FIRST_PRINCIPLES = {
    "op_launch_us": ("op_launch", "us"), "graph_op_gap_us": ("graph_op_gap", "us"),
    "per_sequence_us": ("per_sequence", "us"),
    "ops_attention": ("ops_attention", "int"), "ops_dense_ffn": ("ops_dense_ffn", "int"),
    "ops_moe_ffn": ("ops_moe_ffn", "int"), "ops_tp_comm": ("ops_tp_comm", "int"),
    "ops_ep_comm": ("ops_ep_comm", "int"), "ops_step": ("ops_step", "int"),
    "weight_sync_per_tensor_us": ("weight_sync_per_tensor", "us"),
    "weight_sync_senders": ("weight_sync_senders", "int"),
}


def _first_principles_numbers(problems, engine, sources, prefix, fix_file) -> dict:
    values: dict[str, Any] = {}
    for key, (attr, kind) in ENGINE_FIRST_PRINCIPLES.items():
        value = _positive_number(problems, engine, key, prefix, fix_file)
        if value is None:
            continue
        if kind == "int" and value != int(value):
            problems.append(f"{prefix}.{key}={value} must be a whole number: fix {fix_file}")
            continue
        _require_source(problems, sources, key, prefix, fix_file)
        values[attr] = int(value) if kind == "int" else float(value) * 1e-6
    recompute = _sourced_choice(problems, engine, sources, "recompute", RECOMPUTE_MODES, prefix, fix_file)
    if recompute is not None:
        values["recompute"] = recompute
    for key, attr in (("hybrid_offload", "hybrid_offload"),):
        flag = _lookup(engine, key)
        if not isinstance(flag, bool):
            problems.append(f"{prefix}.{key}={'missing' if flag is _MISSING else repr(flag)} must be true or false: "
                            f"fix {fix_file} or override {prefix}.{key}=...")
        else:
            _require_source(problems, sources, key, prefix, fix_file)
            values[attr] = flag
    overlap = _lookup(engine, "dp_comm_overlap")
    if isinstance(overlap, bool) or not isinstance(overlap, (int, float)) or not 0 <= overlap <= 1:
        problems.append(f"{prefix}.dp_comm_overlap={'missing' if overlap is _MISSING else repr(overlap)} must be a "
                        f"share in [0, 1]: fix {fix_file} or override {prefix}.dp_comm_overlap=...")
    else:
        _require_source(problems, sources, "dp_comm_overlap", prefix, fix_file)
        values["dp_comm_overlap"] = float(overlap)
    return values


# ------------------------------------------------------------------------- helpers


def _lookup(node: Any, key: str, default: Any = _MISSING) -> Any:
    """``node[key]`` for a mapping (dict, DictConfig), ``node.key`` for a dataclass."""
    if isinstance(node, Mapping):
        return node.get(key, default)
    return getattr(node, key, default)


def _sources(node: Any) -> dict[str, str]:
    raw = _lookup(node, "sources", None)
    if raw is None or raw is _MISSING:
        return {}
    return {str(k): str(v) for k, v in dict(raw).items()}


def _positive_number(problems: list[str], node: Any, key: str, prefix: str, fix_file: str):
    """The number at ``key`` if it is one and > 0; otherwise record why and return None."""
    value = _lookup(node, key)
    hint = f"fix {fix_file} or override {prefix}.{key}=..."
    if value is _MISSING or value is None:
        problems.append(f"{prefix}.{key} is missing: {hint}")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        problems.append(f"{prefix}.{key}={value!r} is not a number: {hint}")
        return None
    if not value > 0:
        problems.append(f"{prefix}.{key}={value} must be > 0: {hint}")
        return None
    return value


def _require_source(problems: list[str], sources: Mapping[str, str], key: str, prefix: str, fix_file: str) -> None:
    if not sources.get(key, "").strip():
        problems.append(f"{prefix}.sources.{key} is missing: every number needs its source "
                        f"(a datasheet, a measurement, or 'assumption: ...') in {fix_file}")


def _raise(problems: list[str], what: str, fix: str | None) -> None:
    if not problems:
        return
    lines = [f"{len(problems)} problem(s) in {what}:"] + [f"  - {p}" for p in problems]
    if fix:
        lines.append(f"  ({fix})")
    raise ProfileError("\n".join(lines))
