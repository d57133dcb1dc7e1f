"""A T/G layout made from a device count, by one stated rule (no layout file per size).

Pure: numbers in, a :class:`LayoutPlan` or a :class:`LayoutRefused` out. Used by the
MindSpeed-RL import (integrations/mindspeed/config_import.py), where a job names only its
NPU count (``rl_config.actor_resource.num_npus``).

The rule, for ``devices`` devices on nodes of ``devices_per_node``:

1. ``nodes = devices / devices_per_node`` (a whole number, else refused).
2. A T/G split (T + G = nodes, both >= 1) *fits* when
   - the T side holds whole Megatron replicas: TP x PP x CP divides the T devices, and the
     expert-parallel size divides the data-parallel size left (T devices / (TP x PP x CP)),
     the rule config/validate.parallel_problems checks;
   - the G side holds whole inference instances: an instance of s devices either divides
     a node (s | devices_per_node) or spans k = s / devices_per_node whole nodes, and then
     k divides G (an instance of k nodes takes k whole G nodes).
3. The split is the most even one that fits: smallest |T - G|, then more T nodes (the
   Training Unit also hosts the Control Unit). A split the user fixed (T or G given) is
   the only candidate.
4. No split fits (one node, or the T side can never hold a replica): when the mode is
   free, mode=hybrid on every node (colocated, as MindSpeed-RL runs), if a replica and the
   instances fit all of them; otherwise refused, the message naming the keys.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Parallel:
    """The parallel sizes a split must hold, with the config keys that set them (for messages)."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    instance: int = 1       # devices of one inference instance
    keys: str = "tensor x pipeline x context parallel size"
    ep_key: str = "expert parallel size"
    instance_key: str = "the inference instance size"

    @property
    def replica(self) -> int:
        return self.tp * self.pp * self.cp


@dataclass(frozen=True)
class LayoutPlan:
    nodes: int
    devices_per_node: int
    train_nodes: int
    gen_nodes: int
    hybrid: bool
    rule: str            # one line: why this split


class LayoutRefused(ValueError):
    """No layout of these devices holds the job; the message names the keys and the fix."""


def train_problem(parallel: Parallel, devices: int, side: str) -> Optional[str]:
    """Why ``devices`` training devices cannot hold the job's Megatron replicas (None: they can)."""
    if devices < parallel.replica or devices % parallel.replica:
        what = "is larger than" if devices < parallel.replica else "does not divide"
        return (f"{parallel.keys} = {parallel.tp} x {parallel.pp} x {parallel.cp} = {parallel.replica} {what} "
                f"the {devices} device(s) of {side}")
    data_parallel = devices // parallel.replica
    if data_parallel % parallel.ep:
        return (f"{parallel.ep_key} = {parallel.ep} does not divide the data-parallel size {data_parallel} "
                f"of the {devices} device(s) of {side}")
    return None


def instance_problem(parallel: Parallel, devices_per_node: int, gen_nodes: int, side: str) -> Optional[str]:
    """Why ``gen_nodes`` nodes cannot hold whole inference instances (None: they can)."""
    size = parallel.instance
    if size <= devices_per_node:
        if devices_per_node % size:
            return (f"{parallel.instance_key} = {size} device(s) does not divide a node of {devices_per_node}; "
                    "an instance divides a node or spans whole nodes")
        return None
    if size % devices_per_node:
        return (f"{parallel.instance_key} = {size} device(s) is neither a divisor nor a multiple of a node of "
                f"{devices_per_node}")
    span = size // devices_per_node
    if gen_nodes % span:
        return (f"{parallel.instance_key} = {size} device(s) spans {span} nodes, which does not divide the "
                f"{gen_nodes} node(s) of {side}")
    return None


def split_problem(parallel: Parallel, devices_per_node: int, train_nodes: int, gen_nodes: int) -> Optional[str]:
    side_t, side_g = f"the T side ({train_nodes} node(s))", f"the G side ({gen_nodes} node(s))"
    return (train_problem(parallel, train_nodes * devices_per_node, side_t)
            or instance_problem(parallel, devices_per_node, gen_nodes, side_g))


def plan_layout(devices: int, devices_per_node: int, parallel: Parallel, mode: Optional[str] = None,
                train_nodes: Optional[int] = None, gen_nodes: Optional[int] = None,
                devices_key: str = "the device count", node_key: str = "layout.devices_per_node") -> LayoutPlan:
    """The layout of ``devices`` devices by the module's rule. ``mode``: "async" or
    "hybrid" when the user chose one (None: free, hybrid only as the fallback of step 4);
    ``train_nodes`` / ``gen_nodes``: a split the user fixed."""
    if devices_per_node < 1 or devices < devices_per_node or devices % devices_per_node:
        raise LayoutRefused(f"{devices_key}={devices} is not a whole number of nodes of {node_key}="
                            f"{devices_per_node}; make it a multiple of {devices_per_node} or set {node_key}")
    nodes = devices // devices_per_node
    if mode == "hybrid":
        return _hybrid(parallel, nodes, devices_per_node, "mode=hybrid, as you chose")
    fixed = train_nodes is not None or gen_nodes is not None
    candidates = _candidates(nodes, train_nodes, gen_nodes)
    if fixed and not candidates:
        raise LayoutRefused(f"layout.train_nodes + layout.gen_nodes must be {nodes} ({devices} devices / "
                            f"{devices_per_node} per node), both at least 1; got {train_nodes} + {gen_nodes}")
    problems = []
    for t, g in candidates:
        problem = split_problem(parallel, devices_per_node, t, g)
        if problem is None:
            rule = ("the T/G split you gave" if fixed else
                    f"the most even T/G split of {nodes} nodes that holds the job (T {t} + G {g})")
            return LayoutPlan(nodes, devices_per_node, t, g, False, rule)
        problems.append(problem)
    why = problems[0] if problems else f"{nodes} node is too few: a T/G split needs at least 2"
    if mode == "async" or fixed:
        raise LayoutRefused(f"no T/G split of {devices} devices ({nodes} node(s) of {devices_per_node}) holds the "
                            f"job: {why}; lower those sizes, give more devices, or run mode=hybrid")
    return _hybrid(parallel, nodes, devices_per_node,
                   f"no T/G split of {nodes} node(s) holds the job ({why}): mode=hybrid, colocated on every "
                   "node as MindSpeed-RL runs it; give more devices or lower those sizes for ASP's decoupled run")


def _candidates(nodes: int, train_nodes: Optional[int], gen_nodes: Optional[int]) -> list[tuple[int, int]]:
    if train_nodes is not None or gen_nodes is not None:
        t = train_nodes if train_nodes is not None else nodes - gen_nodes
        g = gen_nodes if gen_nodes is not None else nodes - t
        return [(t, g)] if t >= 1 and g >= 1 and t + g == nodes else []
    splits = [(t, nodes - t) for t in range(1, nodes)]
    return sorted(splits, key=lambda s: (abs(s[0] - s[1]), -s[0]))


def _hybrid(parallel: Parallel, nodes: int, devices_per_node: int, rule: str) -> LayoutPlan:
    everything = f"all {nodes} node(s), colocated"
    problem = (train_problem(parallel, nodes * devices_per_node, everything)
               or instance_problem(parallel, devices_per_node, nodes, everything))
    if problem:
        raise LayoutRefused(f"neither a T/G split nor mode=hybrid on {nodes * devices_per_node} devices holds the "
                            f"job: {problem}; lower those sizes or give more devices")
    return LayoutPlan(nodes, devices_per_node, nodes, nodes, True, rule)
