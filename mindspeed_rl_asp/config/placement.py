"""Where each role runs: a pure mapping from the layout config to Ray placement.

One placement-group bundle per layout node, holding that node's devices as a Ray
resource (``CPU`` for cpu layouts, ``GPU``, or the custom ``NPU`` resource Ascend hosts
register). In ``async`` mode the Training Unit (and the Control Unit, which lives in the
driver beside it) owns the first ``train_nodes`` bundles and generation actors fill the
next ``gen_nodes``, ``infer_instance_size`` devices each (an instance larger than a node
spans ``infer_instance_size / devices_per_node`` whole nodes: its actor sits on the first,
the others are held for the instance's own workers). In ``hybrid`` mode every node
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
    # An inference instance larger than a node: every node it spans (``bundle`` first),
    # each whole; empty for an instance within one node.
    span: tuple[int, ...] = ()
    # The Ray resource of ``amount`` when not the placement's (engine=mindspeed: the Training
    # Unit is a CPU coordinator; MindSpeed-RL's workers hold the T devices).
    resource: str = ""


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

    def describe(self, worker_groups: list | None = None) -> str:
        """What runs where; ``worker_groups``: MindSpeed-RL's worker group placement
        (:func:`mindspeed_worker_bundles`, engine=mindspeed), listed after ASP's own."""
        text = self._describe_roles()
        if worker_groups:
            devices = sum(len(g) for g in worker_groups)
            text += (f"\n  MindSpeed-RL worker group (RayActorGroup of IntegratedWorker ranks): {devices} rank(s), "
                     f"{len(worker_groups)} placement group(s) of {len(worker_groups[0])} NPU bundle(s), T nodes "
                     f"0-{len(worker_groups) - 1}")
        return text

    def _describe_roles(self) -> str:
        shapes: list[tuple[dict, int]] = []   # (shape, how many bundles in a row have it)
        for bundle in self.bundles:
            shape = {k: v for k, v in bundle.items() if not k.startswith("asp_node_")}
            if shapes and shapes[-1][0] == shape:
                shapes[-1] = (shape, shapes[-1][1] + 1)
            else:
                shapes.append((shape, 1))
        if len(shapes) == 1:
            lines = [f"{len(self.bundles)} node bundle(s) of {shapes[0][0]}"]
        else:
            lines = [f"{len(self.bundles)} node bundle(s): " + ", ".join(f"{n} of {shape}" for shape, n in shapes)]
        if len(self.trainers) == 1:
            lines.append(f"  trainer + control unit: node {self.trainer.bundle} "
                         f"({self.trainer.amount:g} {self.trainer.resource or self.resource})"
                         f"{self._visible(self.trainer)}")
        else:
            lines.append(f"  trainer: {len(self.trainers)} data-parallel ranks (FSDP), control unit beside rank 0")
            for slot in self.trainers:
                lines.append(f"    trainer rank {slot.index}: node {slot.bundle} ({slot.amount:g} {self.resource})"
                             f"{self._visible(slot)}")
        for slot in self.generators:
            where = (f"nodes {slot.span[0]}-{slot.span[-1]} (instance of {len(slot.span)} whole nodes; the actor on "
                     f"node {slot.bundle}, {slot.amount:g} {self.resource})" if slot.span else
                     f"node {slot.bundle} ({slot.amount:g} {self.resource})")
            lines.append(f"  generation actor {slot.index}: {where}{self._visible(slot)}")
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
    from .schema import training_devices

    return training_devices(layout, mode_name) if ranks == "auto" else int(ranks)


def plan_placement(layout, mode_name: str, pin_nodes: bool = False, ranks=1,
                   trainer_holds_devices: bool = True) -> Placement:
    """``pin_nodes``: tie bundle k to the machine started as layout node k (multi-node
    clusters launched by ``asp-launch``); the trainer's node 0 is the head, where the
    driver and so the Control Unit run. ``ranks``: ``train.ranks`` (a number or ``auto``).
    ``trainer_holds_devices=False`` (engine=mindspeed, async): the T nodes' bundles hold one
    CPU each and the Training Unit is a CPU coordinator on the first; the T devices go to
    MindSpeed-RL's worker group, in the groups of :func:`mindspeed_worker_bundles`."""
    if not trainer_holds_devices:
        return _coordinator_placement(plan_placement(layout, mode_name, pin_nodes, ranks), layout, mode_name)
    resource = RESOURCE_BY_DEVICE[layout.device_type]
    per_node = layout.devices_per_node
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
    generators = _generator_slots(layout, list(gen_nodes), share)
    bundles = tuple({resource: float(per_node), **({node_resource(k): 0.001} if pin_nodes else {})}
                    for k in range(nodes))
    return Placement(resource, bundles, trainers, generators)


def _generator_slots(layout, gen_nodes: list[int], share: float) -> tuple[RoleSlot, ...]:
    """One slot per inference instance. Within a node, actor i is instance i % k of its node
    (k instances per node), devices in blocks of the instance size. Larger than a node, an
    instance takes ``span`` whole consecutive nodes; its actor asks for the first node's
    devices and the rest of the span stays with the instance (its own worker processes)."""
    size, per_node = layout.infer_instance_size, layout.devices_per_node
    if size > per_node:
        span = size // per_node
        starts = gen_nodes[::span][:len(gen_nodes) // span]
        return tuple(RoleSlot("generate", i, node, per_node * share, tuple(range(per_node)),
                              tuple(gen_nodes[i * span:(i + 1) * span])) for i, node in enumerate(starts))
    per = per_node // size
    return tuple(RoleSlot("generate", i, node, size * share, tuple(range((i % per) * size, (i % per + 1) * size)))
                 for i, node in enumerate(n for n in gen_nodes for _ in range(per)))


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


def trainer_holds_devices(engine_name: str, mode_name: str) -> bool:
    """Whether the Training Unit's actor holds the T devices itself: yes, except with
    engine=mindspeed in async mode, where MindSpeed-RL's worker group holds them (a hybrid
    engine=mindspeed run is refused when it starts: that is MindSpeed-RL's own colocated run)."""
    return not (engine_name == "mindspeed" and mode_name != "hybrid")


def _coordinator_placement(placement: Placement, layout, mode_name: str) -> Placement:
    """``placement`` with the T bundles' devices taken out (see plan_placement)."""
    if mode_name == "hybrid":
        raise ValueError("mode=hybrid with engine=mindspeed is MindSpeed-RL's own colocated run (launch its "
                         "cli/train_grpo.py for that baseline); ASP's engine=mindspeed runs mode=async")
    if len(placement.trainers) != 1:
        raise ValueError(f"engine=mindspeed trains with MindSpeed-RL's worker group; train.ranks="
                         f"{len(placement.trainers)} must be 1 (the group has a rank per T device)")
    bundles = tuple({**{k: v for k, v in b.items() if k != placement.resource}, "CPU": 1.0}
                    if k < layout.train_nodes else b for k, b in enumerate(placement.bundles))
    trainer = RoleSlot("train", 0, 0, 1.0, (), resource="CPU")
    return Placement(placement.resource, bundles, (trainer,), placement.generators)


def mindspeed_worker_bundles(layout, mode_name: str, cpus_per_device: float, pin_nodes: bool = False) -> list[list[dict]]:
    """The Training Unit's devices as MindSpeed-RL's ``RayActorGroup`` takes placement
    (engine=mindspeed): one placement group per T node, one
    ``{"NPU": 1, "CPU": c}`` bundle per device (the shape of its own
    ``construct_placement_groups``), pinned to layout node k when ``asp-launch`` started the
    cluster. ASP makes these and passes them in, so MindSpeed-RL never builds groups over
    devices ASP's actors hold. The NPUs may be logical (``engine.mindspeed_workers=cpu``)."""
    if mode_name == "hybrid":
        raise ValueError("mode=hybrid with engine=mindspeed is MindSpeed-RL's own colocated run; use mode=async")
    nodes, per_node = layout.train_nodes, layout.devices_per_node
    groups = []
    for node in range(nodes):
        marker = {node_resource(node): 0.001 / per_node} if pin_nodes else {}
        cpus = {"CPU": float(cpus_per_device)} if cpus_per_device > 0 else {}
        groups.append([{"NPU": 1.0, **cpus, **marker} for _ in range(per_node)])
    return groups


def worker_groups_of(engine_name: str, mode_name: str, layout) -> list[list[dict]] | None:
    """MindSpeed-RL's worker group placement for ``describe`` (None: the engine has none)."""
    if trainer_holds_devices(engine_name, mode_name):
        return None
    return mindspeed_worker_bundles(layout, mode_name, cpus_per_device=0.0)
