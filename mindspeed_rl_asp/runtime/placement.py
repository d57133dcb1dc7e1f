"""Where each role runs: a pure mapping from the layout config to Ray placement.

One placement-group bundle per layout node, holding that node's devices as a Ray
resource (``CPU`` for cpu layouts, ``GPU``, or the custom ``NPU`` resource Ascend hosts
register). In ``async`` mode the Training Unit (and the Control Unit, which lives in the
driver beside it) owns the first ``train_nodes`` bundles and generation actors fill the
next ``gen_nodes``, ``infer_instance_size`` devices each. In ``hybrid`` mode every node
both generates and trains, one phase after the other, so the trainer and the actors
share bundles and each asks for half of what it shares.
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
    trainer: RoleSlot
    generators: tuple[RoleSlot, ...]

    def describe(self) -> str:
        shape = {k: v for k, v in self.bundles[0].items() if not k.startswith("asp_node_")}
        lines = [f"{len(self.bundles)} node bundle(s) of {shape}"]
        lines.append(f"  trainer + control unit: node {self.trainer.bundle} ({self.trainer.amount:g} {self.resource})")
        for slot in self.generators:
            lines.append(f"  generation actor {slot.index}: node {slot.bundle} ({slot.amount:g} {self.resource})")
        return "\n".join(lines)


def node_resource(node: int) -> str:
    """The marker resource ``asp-launch`` gives layout node ``node`` (``ray start --resources``),
    so that bundle ``node`` lands on exactly that machine."""
    return f"asp_node_{node}"


def plan_placement(layout, mode_name: str, pin_nodes: bool = False) -> Placement:
    """``pin_nodes``: tie bundle k to the machine started as layout node k (multi-node
    clusters launched by ``asp-launch``); the trainer's node 0 is the head, where the
    driver and so the Control Unit run."""
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
        # The hf trainer is one process; it takes its first node whole (multi-node
        # Megatron training is the mindspeed engine's business).
        trainer = RoleSlot("train", 0, 0, float(per_node))
    generators = tuple(
        RoleSlot("generate", i, node, layout.infer_instance_size * share)
        for i, node in enumerate(n for n in gen_nodes for _ in range(actors_per_node))
    )
    bundles = tuple({resource: float(per_node), **({node_resource(k): 0.001} if pin_nodes else {})}
                    for k in range(nodes))
    return Placement(resource, bundles, trainer, generators)
