"""Commands that bring up a layout on a real cluster: ``ray start`` per node, then one
driver command on the head. Pure: it only builds the command lines.

Layout node 0 is the head. It is a T node, so the driver (and the Control Unit in it)
runs beside the Training Unit, as the design wants. Each node registers its devices
(``NPU``/``GPU``/CPUs) and a marker resource ``asp_node_<k>`` that pins placement
bundle k to it. Nothing here stops or kills anything: ``ray stop`` on a node is the
operator's call.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from .placement import node_resource

RAY_PORT = 6379


@dataclass(frozen=True)
class NodeCommand:
    node: int
    role: str          # "head" or "worker"
    units: str         # which unit(s) the node hosts
    command: str


def _device_flags(layout) -> list[str]:
    if layout.device_type == "gpu":
        return [f"--num-gpus={layout.devices_per_node}"]
    if layout.device_type == "npu":
        return []  # NPUs are a custom resource, added with the node marker
    return [f"--num-cpus={layout.devices_per_node}"]


def _resources(layout, node: int) -> str:
    resources = {node_resource(node): 1}
    if layout.device_type == "npu":
        resources["NPU"] = layout.devices_per_node
    return json.dumps(resources, separators=(",", ":"))


def node_units(layout, mode_name: str, node: int) -> str:
    if mode_name == "hybrid":
        return "T+G (colocated)"
    if node < layout.train_nodes:
        return "T (training unit)" + (" + control unit + driver" if node == 0 else "")
    return "G (generation unit)"


def launch_commands(layout, mode_name: str, head_address: str, overrides: list[str]) -> tuple[list[NodeCommand], str]:
    """(one ``ray start`` per layout node, the driver command for the head)."""
    used = layout.nodes if mode_name == "hybrid" else layout.train_nodes + layout.gen_nodes
    nodes = []
    for k in range(used):
        flags = _device_flags(layout) + [f"--resources={shlex.quote(_resources(layout, k))}"]
        if k == 0:
            cmd = ["ray", "start", "--head", f"--port={RAY_PORT}", *flags]
        else:
            cmd = ["ray", "start", f"--address={head_address}:{RAY_PORT}", *flags]
        nodes.append(NodeCommand(k, "head" if k == 0 else "worker", node_units(layout, mode_name, k), " ".join(cmd)))
    driver = " ".join([f"RAY_ADDRESS={head_address}:{RAY_PORT}", "asp-train", f"layout={layout.name}",
                       f"mode={mode_name}", *map(shlex.quote, overrides)])
    return nodes, driver
