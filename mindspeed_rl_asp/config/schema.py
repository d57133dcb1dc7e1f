"""Typed schema of the whole configuration tree.

Hydra composes YAML files from ``configs/`` (groups: layout, model, engine, scheduler,
mode, task, experiment); :func:`mindspeed_rl_asp.config.load.load_config` merges the
result onto :class:`RootConfig`, so every key is typed and an unknown key is an error.

Keys that MindSpeed-RL users know keep MindSpeed-RL's names: ``global_batch_size``,
``mini_batch_size``, ``n_samples_per_prompt``, ``max_prompt_length``,
``tensor_model_parallel_size``, ``infer_tensor_parallel_size``, and the
``sampling_config`` keys (``max_tokens``, ``temperature``, ``top_p``, ``top_k``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..algo.grpo import GRPOLossKeys

DEVICE_TYPES = ("cpu", "gpu", "npu")
# The config groups of configs/config.yaml's defaults list (one folder of options each).
CONFIG_GROUPS = ("layout", "hardware", "model", "engine", "scheduler", "mode", "task", "experiment")
ENGINES = ("hf", "vllm", "mindspeed")
MODES = ("async", "hybrid")
SCHEDULERS = ("asp", "fifo", "sorted")
PREDICTORS = ("auto", "reference", "history", "ridge", "lm")
REFITS = ("none", "history")
TASKS = ("maze", "dataset")


@dataclass
class LayoutConfig:
    """Nodes of the cluster and their split between Training (T) and Generation (G) Units.

    In ``mode=async`` the first ``train_nodes`` nodes host the Training Unit (and the
    Control Unit), the next ``gen_nodes`` host generation actors, one actor per
    ``infer_instance_size`` devices. In ``mode=hybrid`` every node does both, one after
    the other, and the split is not used. On one machine a "node" is a logical slot
    (a Ray resource bundle); ``local`` has three of one CPU "device" each.
    """

    name: str = "local"
    device_type: str = "cpu"
    accelerator: str = "CPU"
    nodes: int = 3
    devices_per_node: int = 1
    train_nodes: int = 1
    gen_nodes: int = 2
    infer_instance_size: int = 1

    @property
    def train_devices(self) -> int:
        return self.train_nodes * self.devices_per_node

    @property
    def gen_devices(self) -> int:
        return self.gen_nodes * self.devices_per_node

    @property
    def num_generation_actors(self) -> int:
        return self.gen_devices // self.infer_instance_size


@dataclass
class ModelConfig:
    """The policy. ``path`` is a local directory (config.json, tokenizer, weights)."""

    name: str = "tiny-maze-qwen3"
    path: str = "mindspeed_rl_asp/assets/tiny-maze-qwen3"
    family: str = "qwen3"
    dtype: str = "float32"
    max_position_embeddings: int = 1024
    # Architecture, as in the checkpoint's config.json (num_layers = num_hidden_layers).
    # Parameter counts and bytes are computed from these (sim/profiles.ModelProfile),
    # never typed in. 0 means unset: every file in configs/model/ sets them.
    num_layers: int = 0
    hidden_size: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    vocab_size: int = 0
    tie_word_embeddings: bool = False
    num_experts: int = 0            # 0: dense
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    # Megatron context parallelism (MindSpeed-RL's actor_config.context_parallel_size);
    # used by engine=mindspeed only, the hf trainer does not split sequences.
    context_parallel_size: int = 1
    infer_tensor_parallel_size: int = 1
    infer_pipeline_parallel_size: int = 1
    infer_expert_parallel_size: int = 1


@dataclass
class EngineConfig:
    """Which engine runs generation and training, and how each actor uses its device."""

    name: str = "hf"
    device: str = "cpu"
    dtype: str = "float32"
    # torch intra-op threads per actor; 0 means torch's default.
    num_threads: int = 1
    gpu_memory_utilization: float = 0.5
    max_num_seqs: int = 64
    # engine=vllm (engines/vllm_platform.py has the per-device choices). KV cache bytes per
    # instance: 0 means max_num_seqs full sequences on cpu, gpu_memory_utilization on
    # cuda/npu; max_model_len 0: the run's longest sequence, rl.max_prompt_length +
    # generate.sampling_config.max_tokens (config/engine.py); tensor_parallel_size
    # must fit the instance (layout.infer_instance_size devices).
    kv_cache_memory_bytes: int = 0
    max_model_len: int = 0
    tensor_parallel_size: int = 1
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    # engine=mindspeed (integrations/mindspeed/engine.py): the MindSpeed-RL GRPO YAML its
    # Megatron actor is built from (megatron_training / actor_config / rl_config /
    # generate_config / model sections).
    mindspeed_config: str = ""
    # Who does the model work behind MindSpeed-RL's orchestration: "npu" (its Megatron
    # workers) or "cpu" (integrations/mindspeed/cpu_workers.py: the same worker methods
    # over the hf engine, so the whole MindSpeed-RL path runs on a machine without NPUs).
    mindspeed_workers: str = "npu"
    # Engine profile for the simulator (sim/profiles.EngineProfile): "continuous" (vLLM)
    # or "static" (HF generate) batching, seconds per decode step outside the kernels,
    # per weight refresh besides the transfer, and per train <-> generate switch in
    # hybrid mode. 0 / "" means unset; sources maps each key to where its value is from.
    batching: str = ""
    decode_step_overhead_s: float = 0.0
    weight_sync_fixed_s: float = 0.0
    mode_switch_s: float = 0.0
    # The first-principles decode step, weight sync and training (docs/simulator.md,
    # "Decode step"): execution eager | graph | fitted | serial (fitted: decode_step_overhead_s
    # is a constant fitted to whole measured calls and the keys below are not read; serial:
    # a CPU, where a step's overhead, compute and memory add up, plus call_overhead_s);
    # per-operator launch (eager) or gap (graph) and per-running-sequence host time in
    # microseconds; operators per block; seconds per weight tensor of a refresh and the
    # links that send it; hybrid offload of the trainer's state; recompute; the share of
    # the data-parallel gradient reduction hidden behind the backward.
    execution: str = ""
    call_overhead_s: float = 0.0   # serial (a CPU engine): seconds per generate call besides its steps
    train_layout: str = ""         # packed (default: real tokens only) | padded (hf: padded micro-batches)
    op_launch_us: float = 0.0
    graph_op_gap_us: float = 0.0
    per_sequence_us: float = 0.0
    ops_attention: int = 0
    ops_dense_ffn: int = 0
    ops_moe_ffn: int = 0
    ops_tp_comm: int = 0
    ops_ep_comm: int = 0
    ops_step: int = 0
    weight_sync_per_tensor_us: float = 0.0
    weight_sync_senders: int = 0
    hybrid_offload: Optional[bool] = None
    recompute: str = ""
    dp_comm_overlap: Optional[float] = None
    sources: Dict[str, str] = field(default_factory=dict)


@dataclass
class HardwareConfig:
    """One device and its node, for the simulator's cost models (sim/profiles.HardwareProfile).

    Units are the datasheets': TFLOPS, GiB, GB/s (10^9 bytes/s); efficiencies are
    fractions of the peak. ``sources`` maps every number's key to where it comes from.
    0 means unset: every file in configs/hardware/ sets every number.
    """

    name: str = "cpu_local"
    peak_bf16_tflops: float = 0.0
    hbm_gib: float = 0.0
    hbm_bandwidth_gbs: float = 0.0
    inference_bandwidth_efficiency: float = 0.0
    inference_compute_efficiency: float = 0.0
    training_mfu: float = 0.0
    intra_node_bandwidth_gbs: float = 0.0
    inter_node_bandwidth_gbs: float = 0.0
    devices_per_node: int = 0
    # Optional (null: absent; a run that needs one says so): per-device bandwidth to host
    # memory (hybrid offload / onload) and the latency of a small collective inside a node
    # and across nodes (communication per decode layer, gradient reduction).
    host_link_bandwidth_gbs: Optional[float] = None
    intra_node_latency_us: Optional[float] = None
    inter_node_latency_us: Optional[float] = None
    # A CPU host: the share of the peak a prefill reaches (null: inference_compute_efficiency)
    # and the cores every process of a run shares (null: each has devices of its own).
    prefill_compute_efficiency: Optional[float] = None
    host_cores: Optional[int] = None
    corun_slowdown: Optional[float] = None   # with host_cores: a core's slowdown while another is busy
    timeslice_slowdown: Optional[float] = None   # with host_cores: extra CPU time of work time-sliced on a core
    sources: Dict[str, str] = field(default_factory=dict)


@dataclass
class SchedulerConfig:
    """Offline planner; sizes count prompts (each carries n_samples_per_prompt samples)."""

    name: str = "asp"
    # auto: reference lengths where the task has them, else history (with lengths_file),
    # else ridge profiled in the loop (schedule/configured.resolve_predictor).
    predictor: str = "auto"
    base_batch_size: int = 4
    slack: int = 1
    group_size: int = 2
    # The predictor in the loop (schedule/length_profile.py, docs/scheduler.md "Predictors
    # in the loop"). ridge | lm: profile_share of the task's prompts are sampled
    # profile_samples times with the starting policy, the predictor is fitted on them but
    # the profile_holdout share of them (scored for rank quality) and predicts the rest.
    # history: the lengths of lengths_file (scripts/profile_lengths.py's JSONL) with a
    # ridge fallback. predictor_path: a predictor saved by an earlier run
    # (<run_dir>/length_predictor), loaded instead of profiling and fitting.
    profile_share: float = 0.25
    profile_samples: int = 1
    profile_holdout: float = 0.25
    lengths_file: str = ""
    predictor_path: str = ""
    # Refit between epochs (schedule/epoch_report.py, docs/scheduler.md "Refit between epochs"):
    # none: every epoch replays the first plan; history: as dispatch nears epoch e >= 1,
    # each prompt's length is (refit_weight x the plan's prediction + the sum of its
    # lengths observed so far) / (refit_weight + samples observed), and epoch e is
    # planned again on those lengths. refit_weight counts samples.
    refit: str = "none"
    refit_weight: float = 4.0


@dataclass
class ModeConfig:
    """``async``: decoupled T and G with a bounded Training Queue; ``hybrid``: colocated."""

    name: str = "async"
    max_staleness: int = 2
    queue_capacity: int = 64
    high_watermark: float = 0.75
    low_watermark: float = 0.25
    # Weight refresh: "rolling" (ASP: each actor loads the newest version between its own
    # minibatches, no global pause) or "global" (verl fully-async: every refresh_interval
    # versions all actors pause, drain and load together). docs/control.md.
    refresh: str = "rolling"
    refresh_interval: int = 1
    # Generation still running when the last step is published: "cancel" or "drain".
    at_finish: str = "cancel"


@dataclass
class TaskConfig:
    """The prompt set and its rewards (docs/tasks.md). ``maze``: AlphaMaze-format mazes from
    randomized DFS; ``dataset``: prompts from a jsonl or parquet file.

    Rewards keep MindSpeed-RL's keys: ``verifier_function`` lists reward names (from the
    registry in tasks/rewards.py, or ``package.module:function``), ``verifier_weight`` one
    weight each (empty: 1.0 each). Empty ``verifier_function`` on ``maze``: the project's
    integrity and correctness with ``integrity_weight`` / ``correctness_weight`` (or, with
    ``prompt_format=alphamaze``, the original AlphaMaze rewards).
    """

    name: str = "maze"
    # maze: how many to generate; dataset: the first this many rows that fit (0: all).
    num_prompts: int = 512
    seed: int = 0
    min_size: int = 3
    max_size: int = 8
    size_decay: float = 0.6
    integrity_weight: float = 0.2
    correctness_weight: float = 1.0
    # maze: "project" (tags only) or "alphamaze" (MAZE-REASONING-GRPO-V0.1's prompt layout).
    prompt_format: str = "project"
    # dataset: the file (.jsonl or .parquet), a held-out file in the same layout, and fields.
    path: str = ""
    eval_path: str = ""
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    id_key: str = ""
    group_key: str = ""
    reference_key: str = ""
    system_prompt: str = ""
    chat_template: str = "auto"            # auto | always | never
    # A prompt longer than rl.max_prompt_length: skipped and counted (true) or refused (false).
    filter_overlong_prompts: bool = True
    verifier_function: List[str] = field(default_factory=list)
    verifier_weight: List[float] = field(default_factory=list)
    # The components the correctness / integrity rates read ("": the first accuracy /
    # format reward listed; integrity falls back to nonempty_answer).
    correctness_reward: str = ""
    integrity_reward: str = ""


@dataclass
class SamplingConfig:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    # 0 disables top-k. Keep it 0 for RL: log-probs must be those of the sampling policy.
    top_k: int = 0
    # Drop tokens whose probability is below min_p x the most likely one's (0: off), as
    # MindSpeed-RL's sampling_config.min_p (vLLM's min_p; transformers' MinPLogitsWarper).
    min_p: float = 0.0


@dataclass
class GenerateConfig:
    sampling_config: SamplingConfig = field(default_factory=SamplingConfig)
    # asp-generate only: greedy decoding (the most likely token each step: top_k=1, so the
    # same on every engine and seed); asp-train refuses it, RL needs sampled responses.
    greedy: bool = False


@dataclass
class RLConfig:
    """GRPO batch geometry; all ``*_batch_size`` count prompts, not samples."""

    global_batch_size: int = 8
    mini_batch_size: int = 8
    n_samples_per_prompt: int = 4
    max_prompt_length: int = 256
    micro_batch_size: int = 8


@dataclass
class TrainConfig:
    lr: float = 3e-5
    weight_decay: float = 0.0
    clip_grad: float = 1.0
    # AdamW's betas (torch's defaults; MindSpeed-RL's configs often take beta2 0.95).
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    # Trainer ranks: 1 (one process), a number up to layout.train_nodes x
    # devices_per_node (hybrid: every node's devices), or "auto" (all of them). Several
    # ranks train data-parallel, sharded with FSDP2, one Ray actor per device, over
    # torch.distributed (gloo on cpu, nccl on gpu, hccl on npu: layout.device_type).
    ranks: Any = 1
    # Where a step's samples travel inside the Training Unit: "local" (Ray payloads as
    # they are), "transfer_dock" or "transfer_queue" (MindSpeed-RL's own data channel, so
    # its stages read ASP's samples; needs mindspeed_rl importable and one trainer rank:
    # integrations/mindspeed/queue.py). The control rules stay in control/ either way.
    data_channel: str = "local"


def training_devices(layout, mode_name: str) -> int:
    """The devices trainer ranks may use: T nodes x devices per node (hybrid: every node's)."""
    nodes = layout.nodes if mode_name == "hybrid" else layout.train_nodes
    return nodes * layout.devices_per_node


@dataclass
class AlgoConfig(GRPOLossKeys):
    """GRPO (see docs/grpo.md): the loss keys, inherited from ``algo/grpo.GRPOLossKeys``
    (declared there once, so they cannot drift from the loss's), plus how advantages are
    normalised. ``off_policy`` corrects for stale samples: ``tis`` (truncated importance
    weight), ``decoupled`` (decoupled PPO) or ``none``.

    ``adv_std``: the group std that scales advantages, ``population`` (ddof=0, this
    project's default) or ``sample`` (ddof=1, MindSpeed-RL's ``group_norm``; an imported
    job gets it). ``adv_eps``: added to the std (MindSpeed-RL's is 1e-6 too).

    DAPO (docs/grpo.md): ``filter_groups`` is dynamic sampling, ``none`` or ``std`` (drop
    a prompt group whose ``filter_groups_metric`` reward has zero spread and generate
    more until a step is full; a step may take at most ``max_num_gen_batches``
    generation batches of ``rl.global_batch_size`` prompts, the first included, as
    MindSpeed-RL's ``filter_groups_max_batches``, else the run stops; 0 for no limit); ``overlong_buffer_len`` > 0 turns on DAPO's overlong reward shaping:
    a response within that many tokens of ``generate.sampling_config.max_tokens`` loses up
    to ``overlong_penalty_factor``, linearly."""

    scale_advantages: bool = True
    adv_std: str = "population"
    adv_eps: float = 1e-6
    filter_groups: str = "none"
    filter_groups_metric: str = "acc"
    max_num_gen_batches: int = 0
    overlong_buffer_len: int = 0
    overlong_penalty_factor: float = 1.0


@dataclass
class EvalConfig:
    """Held-out evaluation of the initial and the final policy (``num_prompts: 0`` skips it).
    The held-out mazes come from ``seed``, a different stream from ``task.seed``."""

    num_prompts: int = 128
    samples_per_prompt: int = 1
    seed: int = 12345
    save_final_policy: bool = True


@dataclass
class ExperimentConfig:
    name: str = "none"
    description: str = ""


@dataclass
class SimConfig:
    """The simulator's workload (``asp-simulate``; real runs ignore it).

    Response lengths come from the long-tailed length model (sim/workload.LengthModel,
    whose defaults these are; a test keeps them equal) or, with ``lengths_file``, from a
    recorded lengths file. ``predictor_spearman``: the rank quality of the length
    predictor the planner sees (null: the true expected lengths). ``solve_rate`` /
    ``solve_concentration``: the simulated rewards dynamic sampling reads
    (``sim/rewards.py``). docs/simulator.md.
    """

    lengths_file: Optional[str] = None
    median_response_length: float = 512.0
    sigma_prompt: float = 0.72
    sigma_sample: float = 0.29
    runaway_probability: float = 0.01
    prompt_length_median: float = 320.0
    prompt_length_sigma: float = 0.05
    min_prompt_length: int = 16
    predictor_spearman: Optional[float] = None
    # Dynamic sampling (algo.filter_groups): each prompt's solve rate is drawn from a Beta
    # of this mean and concentration, each sample is right with it (sim/rewards.py).
    solve_rate: float = 0.5
    solve_concentration: float = 1.0
    seed: int = 0
    # The figure of the paper a study row is compared with; set by the study, not by hand.
    study: str = ""
    # experiment=validation: the cases file ("" : configs/validation/cases.yaml).
    validation_file: str = ""


WEIGHT_TRANSPORTS = ("object_store", "collective", "files")


@dataclass
class WeightsConfig:
    """How a published version reaches the generation actors (runtime/transport.py).

    ``object_store``: Ray's object store (fine for small models). ``collective``: from
    trainer rank 0 to each actor over a torch.distributed pair group (gloo / nccl /
    hccl by layout.device_type) in buckets of ``bucket_mb``, swapped in only once
    complete; ``prefetch``: the control core moves a published version to each actor
    still generating ahead of its load (its ``Prefetch`` action), so the load only swaps. ``files``: safetensors in ``dir`` ("" = <run_dir>/weights; on a
    cluster, a file system every node sees). ``timeout_s`` bounds a transfer's wait.
    """

    transport: str = "object_store"
    bucket_mb: float = 64.0
    prefetch: bool = True
    timeout_s: float = 120.0
    dir: str = ""


@dataclass
class FaultConfig:
    """What a run does when a generation actor's process dies (runtime/generation_unit.py).

    ``actor_restarts``: how many times Ray restarts each generation actor (its process
    starts again from the starting checkpoint and is brought up to date before it
    generates); once they are spent the actor is retired and the run goes on with the
    others (it stops, with a clear error, only when none is left). 0: retire at once.
    """

    actor_restarts: int = 1


@dataclass
class RecordConfig:
    """What a run writes down besides its metrics. ``rollouts``: every sample a step trains
    on, to ``<run_dir>/rollouts.jsonl`` (prompt id, sample index, response text, reward and
    its components, length, policy version, advantage): ``true`` all of them, ``false``
    none, ``N`` the first N of each step."""

    rollouts: Any = True


@dataclass
class RootConfig:
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    mode: ModeConfig = field(default_factory=ModeConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    record: RecordConfig = field(default_factory=RecordConfig)
    seed: int = 0
    steps: int = 60
    # Where this run writes config, metrics and timelines; "" picks runs/<time>-<name>.
    run_dir: str = ""
    # Checkpoints (runtime/checkpoint.py): every ``save_every`` published versions (0: never)
    # the trainer state and the control state go atomically to <run_dir>/checkpoints/;
    # the newest ``keep_checkpoints`` stay. ``resume=RUN_DIR`` continues that run.
    save_every: int = 0
    keep_checkpoints: int = 2
    resume: str = ""
    # Command-specific inputs (asp-schedule, asp-generate); unused by others.
    input: Optional[str] = None
    output: Optional[str] = None
