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

No one else gets in: every ``ray start``, the wait and the driver run with
``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH`` naming a token file (:func:`auth_env`),
so a process without the token cannot join the cluster or submit work; the token itself
is never on a command line or in a log, only in that file, which the operator puts on a
file system every node mounts (``asp-launch --new-token`` writes a random one, mode 0600)
or fills from a secret store. The dashboard listens on the head's loopback only unless
asked (``dashboard_host``), and a head on a non-loopback address without a token is
refused (:func:`token_problem`).
"""
from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shlex
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from ..config.placement import RESOURCE_BY_DEVICE, node_resource

RAY_PORT = 6379
DASHBOARD_HOST = "127.0.0.1"   # the head's loopback: reach it with an SSH tunnel
TOKEN_PATH = "~/.ray/auth_token"   # Ray's own default place for the token


def auth_env(token_path: str) -> dict[str, str]:
    """What every Ray process of the cluster needs to authenticate: the mode and where
    the token is (never the token)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False   # a host name: assume others can reach it


def token_problem(head: str, token_path: str) -> Optional[str]:
    """Why the cluster must not start (None: it may): a head others can reach, and no token."""
    path = Path(os.path.expanduser(token_path))
    if is_loopback(head) or (path.is_file() and path.stat().st_size > 0):
        return None
    return (f"head={head} is reachable from other machines and there is no token at {path}: create one with "
            f"`asp-launch --new-token --token-path={token_path}` on a file system every node mounts (or write "
            "the token there from your secret store), then start the nodes")


def new_token(token_path: str) -> bool:
    """Write a fresh random token to ``token_path`` (mode 0600), unless one is there;
    returns whether it wrote one. The token is never printed."""
    path = Path(os.path.expanduser(token_path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return True
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


def wait_command(layout, mode_name: str, head_address: str, timeout_s: float = WAIT_TIMEOUT_S,
                 token_path: str = TOKEN_PATH) -> str:
    """The head's wait step: ``asp-launch ... --wait`` returns 0 once the cluster is complete,
    1 (naming what is missing) after ``timeout_s``."""
    return " ".join(["asp-launch", *layout_arguments(layout), f"mode={mode_name}", f"head={head_address}", "--wait",
                     f"--wait-timeout={timeout_s:g}", f"--token-path={shlex.quote(os.path.expanduser(token_path))}"])


def _env_prefix(env: Optional[Mapping[str, str]]) -> list[str]:
    return [f"{k}={shlex.quote(str(v))}" for k, v in (env or {}).items()]


def launch_commands(layout, mode_name: str, head_address: str, overrides: list[str],
                    node_env: Optional[Mapping[str, str]] = None,
                    driver_env: Optional[Mapping[str, str]] = None, token_path: str = TOKEN_PATH,
                    dashboard_host: str = DASHBOARD_HOST) -> tuple[list[NodeCommand], str]:
    """(one ``ray start`` per layout node, the driver command for the head; run
    :func:`wait_command` before it). ``node_env``: variables every node's Ray processes
    need (their workers inherit them from ``ray start``), written before each ``ray
    start`` and the driver, after the token settings (:func:`auth_env`); ``driver_env``:
    variables of the driver only (its actors get them through config/placement.npu_actor_env)."""
    node_env = {**auth_env(os.path.expanduser(token_path)), **(node_env or {})}
    nodes = []
    for k in range(used_nodes(layout, mode_name)):
        flags = _device_flags(layout) + [f"--resources={shlex.quote(_resources(layout, k))}"]
        if k == 0:
            cmd = [*_env_prefix(node_env), "ray", "start", "--head", f"--port={RAY_PORT}",
                   f"--dashboard-host={dashboard_host}", *flags]
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
