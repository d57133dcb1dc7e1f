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
                         f"({self.trainer.amount:g} {self.resource})")
        else:
            lines.append(f"  trainer: {len(self.trainers)} data-parallel ranks (FSDP), control unit beside rank 0")
            for slot in self.trainers:
                lines.append(f"    trainer rank {slot.index}: node {slot.bundle} ({slot.amount:g} {self.resource})")
        for slot in self.generators:
            lines.append(f"  generation actor {slot.index}: node {slot.bundle} ({slot.amount:g} {self.resource})")
        return "\n".join(lines)


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
        trainer = RoleSlot("train", 0, 0, per_node * share)
    else:
        nodes = layout.train_nodes + layout.gen_nodes
        gen_nodes = range(layout.train_nodes, nodes)
        share = 1.0
        # A single trainer process takes its first node whole; with train.ranks > 1
        # each rank takes one device (below).
        trainer = RoleSlot("train", 0, 0, float(per_node))
    count = trainer_ranks(ranks, layout, mode_name)
    if count == 1:
        trainers = (trainer,)
    else:  # one device per rank, node after node
        trainers = tuple(RoleSlot("train", r, r // per_node, share) for r in range(count))
    generators = tuple(
        RoleSlot("generate", i, node, layout.infer_instance_size * share)
        for i, node in enumerate(n for n in gen_nodes for _ in range(actors_per_node))
    )
    bundles = tuple({resource: float(per_node), **({node_resource(k): 0.001} if pin_nodes else {})}
                    for k in range(nodes))
    return Placement(resource, bundles, trainers, generators)
