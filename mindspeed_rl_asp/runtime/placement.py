"""Where each role runs: a pure mapping from the layout config to Ray placement.

One placement-group bundle per layout node, holding that node's devices as a Ray
resource (``CPU`` for cpu layouts, ``GPU``, or the custom ``NPU`` resource Ascend hosts
register). In ``async`` mode the Training Unit (and the Control Unit, which lives in the
driver beside it) owns the first ``train_nodes`` bundles and generation actors fill the
next ``gen_nodes``, ``infer_instance_size`` devices each. In ``hybrid`` mode every node
both generates and trains, one phase after the other, so the trainer and the actors
share bundles and each asks for half of what it shares.

The Training Unit is ``train.ranks`` actors (``trainer_ranks``): one rank takes its first
node whole (the single-process trainer); several ranks take one device each, filling
the T nodes in order (hybrid: every node), and train data-parallel, sharded with FSDP.
"""
from __future__ import annotations

from dataclasses import dataclass

RESOURCE_BY_DEVICE = {"cpu": "CPU", "gpu": "GPU", "npu": "NPU"}


@dataclass(frozen=True)
class RoleSlot:
    role: str            # "train" or "generate"
    index: int           # actor index within its role
    bundle: int          # placement-group bundle (layout node)
    amount: float        # units of ``resource`` it asks for
    # Which devices of its node it uses (local indices; ASCEND_RT_VISIBLE_DEVICES on npu
    # layouts, see npu_actor_env). Hybrid roles share them: the trainer sees the whole node.
    devices: tuple[int, ...] = ()


@dataclass(frozen=True)
class Placement:
    resource: str
    bundles: tuple[dict, ...]
    trainers: tuple[RoleSlot, ...]   # one per trainer rank; rank 0 first
    generators: tuple[RoleSlot, ...]

    @property
    def trainer(self) -> RoleSlot:
        """Trainer rank 0 (the only one unless ``train.ranks`` > 1)."""
        return self.trainers[0]

    def describe(self) -> str:
        shape = {k: v for k, v in self.bundles[0].items() if not k.startswith("asp_node_")}
        lines = [f"{len(self.bundles)} node bundle(s) of {shape}"]
        if len(self.trainers) == 1:
            lines.append(f"  trainer + control unit: node {self.trainer.bundle} "
                         f"({self.trainer.amount:g} {self.resource}){self._visible(self.trainer)}")
        else:
            lines.append(f"  trainer: {len(self.trainers)} data-parallel ranks (FSDP), control unit beside rank 0")
            for slot in self.trainers:
                lines.append(f"    trainer rank {slot.index}: node {slot.bundle} ({slot.amount:g} {self.resource})"
                             f"{self._visible(slot)}")
        for slot in self.generators:
            lines.append(f"  generation actor {slot.index}: node {slot.bundle} ({slot.amount:g} {self.resource})"
                         f"{self._visible(slot)}")
        return "\n".join(lines)

    def _visible(self, slot: RoleSlot) -> str:
        """On NPU layouts, the devices the actor sees (npu_actor_env's ASCEND_RT_VISIBLE_DEVICES)."""
        if self.resource != "NPU" or not slot.devices:
            return ""
        first, last = slot.devices[0], slot.devices[-1]
        contiguous = list(slot.devices) == list(range(first, last + 1))
        shown = f"{first}-{last}" if contiguous and last > first else ",".join(map(str, slot.devices))
        return f", ASCEND_RT_VISIBLE_DEVICES={shown}"


def node_resource(node: int) -> str:
    """The marker resource ``asp-launch`` gives layout node ``node`` (``ray start --resources``),
    so that bundle ``node`` lands on exactly that machine."""
    return f"asp_node_{node}"


def trainer_ranks(ranks, layout, mode_name: str) -> int:
    """``train.ranks`` as a number: ``auto`` is every training device."""
    from ..config.schema import training_devices

    return training_devices(layout, mode_name) if ranks == "auto" else int(ranks)


def plan_placement(layout, mode_name: str, pin_nodes: bool = False, ranks=1) -> Placement:
    """``pin_nodes``: tie bundle k to the machine started as layout node k (multi-node
    clusters launched by ``asp-launch``); the trainer's node 0 is the head, where the
    driver and so the Control Unit run. ``ranks``: ``train.ranks`` (a number or ``auto``)."""
    resource = RESOURCE_BY_DEVICE[layout.device_type]
    per_node = layout.devices_per_node
    actors_per_node = per_node // layout.infer_instance_size
    if mode_name == "hybrid":
        nodes = layout.nodes
        gen_nodes = range(nodes)
        share = 0.5  # the trainer and the actors take turns on the same devices
        trainer = RoleSlot("train", 0, 0, per_node * share, tuple(range(per_node)))
    else:
        nodes = layout.train_nodes + layout.gen_nodes
        gen_nodes = range(layout.train_nodes, nodes)
        share = 1.0
        # A single trainer process takes its first node whole; with train.ranks > 1
        # each rank takes one device (below).
        trainer = RoleSlot("train", 0, 0, float(per_node), tuple(range(per_node)))
    count = trainer_ranks(ranks, layout, mode_name)
    if count == 1:
        trainers = (trainer,)
    else:  # one device per rank, node after node
        trainers = tuple(RoleSlot("train", r, r // per_node, share, (r % per_node,)) for r in range(count))
    size = layout.infer_instance_size
    generators = tuple(   # actor i is instance i % actors_per_node of its node: devices in blocks of `size`
        RoleSlot("generate", i, node, size * share, tuple(range((i % actors_per_node) * size,
                                                                  (i % actors_per_node + 1) * size)))
        for i, node in enumerate(n for n in gen_nodes for _ in range(actors_per_node))
    )
    bundles = tuple({resource: float(per_node), **({node_resource(k): 0.001} if pin_nodes else {})}
                    for k in range(nodes))
    return Placement(resource, bundles, trainers, generators)


# The environment MindSpeed-RL gives its Ray workers on Ascend, for the same reasons here
# (read from its source, not copied; where each is set):
# - RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES: configs/envs/runtime_env.yaml and
#   workers/scheduler/launcher_ms.py, scheduler_ms.py: Ray must not rewrite
#   ASCEND_RT_VISIBLE_DEVICES; MindSpeed-RL then picks the device from Ray's accelerator
#   ids, this project sets the slot's own devices (``RoleSlot.devices``) instead.
# - PYTORCH_NPU_ALLOC_CONF=expandable_segments:True, HCCL_CONNECT_TIMEOUT=1800,
#   HCCL_EXEC_TIMEOUT=3600, VLLM_USE_V1=1, USING_LCCL_COM=0, TASK_QUEUE_ENABLE=2,
#   CPU_AFFINITY_CONF=1: configs/envs/runtime_env.yaml (TASK_QUEUE_ENABLE also in
#   examples/grpo/*.sh), passed to ray.init(runtime_env=...) by cli/train_grpo.py.
# - HCCL_BUFFSIZE: runtime_env.yaml, overwritten by cli/train_grpo.py from
#   rl_config.hccl_buffersize (default 256, config_cls/rl_config.py).
# - CUDA_DEVICE_MAX_CONNECTIONS=1: runtime_env.yaml and workers/base_worker.py (Megatron's
#   tensor-parallel overlap needs one hardware queue).
# Left out: VLLM_DP_SIZE (MindSpeed-RL's own vLLM adapter reads it; here the engine gets its
# parallel sizes as arguments), HCCL_IF_BASE_PORT and LCAL_COMM_ID (fixed ports would
# collide between the separate trainer and generation processes of one node).
NPU_RUNTIME_ENV = {
    "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1",
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    "HCCL_CONNECT_TIMEOUT": "1800",
    "HCCL_EXEC_TIMEOUT": "3600",
    "HCCL_BUFFSIZE": "256",
    "VLLM_USE_V1": "1",
    "USING_LCCL_COM": "0",
    "TASK_QUEUE_ENABLE": "2",
    "CPU_AFFINITY_CONF": "1",
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
}


def npu_actor_env(slot: RoleSlot, driver_env=None) -> dict:
    """The runtime environment of an actor on an NPU layout: :data:`NPU_RUNTIME_ENV` (a key
    set in ``driver_env``, the driver's own environment, keeps the operator's value) and
    ``ASCEND_RT_VISIBLE_DEVICES`` = the slot's devices, so each actor sees exactly its own
    NPUs (numbered from 0 inside the actor)."""
    driver_env = driver_env or {}
    env = {key: driver_env.get(key, value) for key, value in NPU_RUNTIME_ENV.items()}
    env["ASCEND_RT_VISIBLE_DEVICES"] = ",".join(map(str, slot.devices))
    return env
