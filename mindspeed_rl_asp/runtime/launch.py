"""Commands that bring up a layout on a real cluster: ``ray start`` per node, a wait until
every node has joined with its devices, then one driver command on the head. Pure: it
builds command lines and judges a cluster's resources; :func:`wait_for_cluster` is the
only part that talks to Ray.

Layout node 0 is the head. It is a T node, so the driver (and the Control Unit in it)
runs beside the Training Unit, as the design wants. Each node registers its devices
(``--num-gpus`` / ``--num-cpus``, or on Ascend ``--resources='{"NPU": n}'``: the resource
name MindSpeed-RL's launchers register and its placement bundles ask for) and a marker
resource ``asp_node_<k>`` that pins placement bundle k to it. The driver starts only once
the cluster shows every marker and the devices the layout needs, as MindSpeed-RL's
examples/grpo/*.sh do by polling ``ray status`` for the NPU count (here through
``ray.cluster_resources()``, which needs no parsing). Nothing here stops or kills
anything: ``ray stop`` on a node is the operator's call.
"""
from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from .placement import RESOURCE_BY_DEVICE, node_resource

RAY_PORT = 6379
WAIT_TIMEOUT_S = 1800.0     # MindSpeed-RL's examples wait without a bound; a bound makes a missing node an error
WAIT_POLL_S = 5.0           # MindSpeed-RL's examples poll every 5 s too


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


def used_nodes(layout, mode_name: str) -> int:
    return layout.nodes if mode_name == "hybrid" else layout.train_nodes + layout.gen_nodes


def required_resources(layout, mode_name: str) -> dict[str, float]:
    """What the cluster must show before the driver starts: every node's marker, and the
    devices of all of them (``NPU`` / ``GPU`` / ``CPU`` as the layout's device type)."""
    nodes = used_nodes(layout, mode_name)
    needed = {node_resource(k): 1.0 for k in range(nodes)}
    needed[RESOURCE_BY_DEVICE[layout.device_type]] = float(nodes * layout.devices_per_node)
    return needed


def missing_resources(available: Mapping[str, float], needed: Mapping[str, float]) -> list[str]:
    """The needed resources the cluster does not show yet, as ``name: have/need`` (empty: ready)."""
    return [f"{name}: {available.get(name, 0):g}/{amount:g}" for name, amount in needed.items()
            if available.get(name, 0) < amount]


def describe_wait(layout, mode_name: str) -> str:
    needed = required_resources(layout, mode_name)
    device = RESOURCE_BY_DEVICE[layout.device_type]
    return (f"wait until all {used_nodes(layout, mode_name)} nodes have joined (markers asp_node_0.."
            f"{used_nodes(layout, mode_name) - 1}) with {needed[device]:g} {device} in all")


LAYOUT_KEYS = ("name", "device_type", "accelerator", "nodes", "devices_per_node", "train_nodes", "gen_nodes",
               "infer_instance_size")


def layout_arguments(layout, shipped: Optional[Mapping[str, Mapping]] = None) -> list[str]:
    """How a command names ``layout``: ``layout=NAME`` when configs/layout/NAME.yaml exists,
    then the keys where this layout differs from that file; else every key (a layout made
    from an NPU count by the MindSpeed-RL import has no file). ``shipped``: the layout files
    by name (default: read from configs/)."""
    if shipped is None:
        from ..integrations.mindspeed.config_import import shipped_layouts

        shipped = shipped_layouts()
    file = shipped.get(layout.name)
    keys = [k for k in LAYOUT_KEYS if file is None or file.get(k, getattr(layout, k)) != getattr(layout, k)]
    return ([f"layout={layout.name}"] if file is not None else []) + [
        f"layout.{k}={shlex.quote(str(getattr(layout, k)))}" for k in keys]


def wait_command(layout, mode_name: str, head_address: str, timeout_s: float = WAIT_TIMEOUT_S) -> str:
    """The head's wait step: ``asp-launch ... --wait`` returns 0 once the cluster is complete,
    1 (naming what is missing) after ``timeout_s``."""
    return " ".join(["asp-launch", *layout_arguments(layout), f"mode={mode_name}", f"head={head_address}", "--wait",
                     f"--wait-timeout={timeout_s:g}"])


def _env_prefix(env: Optional[Mapping[str, str]]) -> list[str]:
    return [f"{k}={shlex.quote(str(v))}" for k, v in (env or {}).items()]


def launch_commands(layout, mode_name: str, head_address: str, overrides: list[str],
                    node_env: Optional[Mapping[str, str]] = None,
                    driver_env: Optional[Mapping[str, str]] = None) -> tuple[list[NodeCommand], str]:
    """(one ``ray start`` per layout node, the driver command for the head; run
    :func:`wait_command` before it). ``node_env``: variables every node's Ray processes
    need (their workers inherit them from ``ray start``), written before each ``ray
    start`` and the driver; ``driver_env``: variables of the driver only (its actors get
    them through runtime/placement.npu_actor_env)."""
    nodes = []
    for k in range(used_nodes(layout, mode_name)):
        flags = _device_flags(layout) + [f"--resources={shlex.quote(_resources(layout, k))}"]
        if k == 0:
            cmd = [*_env_prefix(node_env), "ray", "start", "--head", f"--port={RAY_PORT}", *flags]
        else:
            cmd = [*_env_prefix(node_env), "ray", "start", f"--address={head_address}:{RAY_PORT}", *flags]
        nodes.append(NodeCommand(k, "head" if k == 0 else "worker", node_units(layout, mode_name, k), " ".join(cmd)))
    driver = " ".join([*_env_prefix({**(node_env or {}), **(driver_env or {})}), f"RAY_ADDRESS={head_address}:{RAY_PORT}",
                       "asp-train", *layout_arguments(layout),
                       f"mode={mode_name}", *map(shlex.quote, overrides)])
    return nodes, driver


def wait_for_cluster(needed: Mapping[str, float], resources: Callable[[], Mapping[str, float]],
                     timeout_s: float = WAIT_TIMEOUT_S, poll_s: float = WAIT_POLL_S,
                     report: Optional[Callable[[str], None]] = None,
                     clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Poll ``resources()`` (``ray.cluster_resources``) until nothing in ``needed`` is missing
    or ``timeout_s`` passes; returns what is still missing (empty: ready). ``report`` gets a
    line each time the missing set changes."""
    deadline = clock() + timeout_s
    last: Optional[list[str]] = None
    while True:
        missing = missing_resources(resources(), needed)
        if missing != last and report is not None:
            report("cluster ready" if not missing else "waiting for " + ", ".join(missing))
        last = missing
        if not missing or clock() >= deadline:
            return missing
        sleep(poll_s)
