"""Balanced dispatch groups: arrange minibatches so every group carries the same load.

A dispatch group is ``group_size`` minibatches handed to the rollout actors together;
its load is the SUM of its minibatch loads (the work the actor pool must do before
the group is complete, with work-conserving dispatch inside the group). Equal group
loads keep the sample production rate steady (no sorting bubble); interleaving long
and short minibatches inside a group keeps the slowest minibatch started first
while short ones stream samples out behind it.

Algorithm (``balanced_groups``):

1. group shapes: ``G = ceil(M / group_size)`` groups, all full except the LAST,
   which holds ``M - (G - 1) * group_size`` minibatches when ``M`` is not a
   multiple of ``group_size``;
2. LPT with capacities: minibatches in descending load go to the least-loaded
   group that still has room (ties: lowest group index);
3. refinement: passes that pair the k-th heaviest with the k-th lightest full
   group and apply, in all pairs at once, the member swap that best evens each
   pair (``refine_pairs``; LPT alone leaves the groups that received the big
   items in round one heavy);
4. dispatch order: full groups by load descending (consecutive groups differ by
   the smallest possible steps: sorting minimises total variation), the partial
   group last; inside a group, minibatches alternate longest, shortest, second
   longest, second shortest, ...

Everything here is pure numpy / heapq; no knowledge of prompts or plans.
"""
from __future__ import annotations

import heapq
from typing import Callable

import numpy as np

__all__ = [
    "LoadFn",
    "padded_decode_load",
    "decode_step_load",
    "group_shapes",
    "lpt_groups",
    "refine_pairs",
    "interleave_long_short",
    "balanced_groups",
    "sequential_groups",
    "load_spread",
]

# (sizes in prompts, max predicted lengths, n_samples_per_prompt) -> loads; elementwise.
LoadFn = Callable[[np.ndarray, np.ndarray, int], np.ndarray]


def padded_decode_load(sizes: np.ndarray, max_lengths: np.ndarray, n_samples: int) -> np.ndarray:
    """Default load: padded decode work ``size * n_samples * max_len`` (tokens incl. padding).

    Right when decode throughput is flat in batch size (compute-bound), and the
    quantity the padding bubble is measured in.
    """
    return np.asarray(sizes, dtype=np.float64) * n_samples * np.asarray(max_lengths, dtype=np.float64)


def decode_step_load(step_overhead: float) -> LoadFn:
    """Memory-bound decode model: time = max_len * (step_overhead + size * n_samples).

    A decode step costs a fixed ``step_overhead`` (weights read, launch; in units of
    one sequence's per-step cost) plus a per-sequence term; the minibatch runs
    ``max_len`` steps. ``step_overhead = 0`` reduces to ``padded_decode_load``.
    """
    if not np.isfinite(step_overhead) or step_overhead < 0:
        raise ValueError(f"step_overhead={step_overhead} must be finite and >= 0")

    def load(sizes: np.ndarray, max_lengths: np.ndarray, n_samples: int) -> np.ndarray:
        sizes = np.asarray(sizes, dtype=np.float64)
        return np.asarray(max_lengths, dtype=np.float64) * (step_overhead + sizes * n_samples)

    return load


def group_shapes(num_minibatches: int, group_size: int) -> list[int]:
    """Group capacities: full groups of ``group_size`` then one smaller final group if needed."""
    if group_size <= 0:
        raise ValueError(f"group_size={group_size} must be > 0")
    full, rem = divmod(num_minibatches, group_size)
    return [group_size] * full + ([rem] if rem else [])


def lpt_groups(loads: np.ndarray, shapes: list[int]) -> list[list[int]]:
    """Longest-processing-time-first into the least-loaded group with free capacity.

    Invariant: returns a partition of ``range(len(loads))`` with ``len(g) == shapes[i]``.
    """
    loads = np.asarray(loads, dtype=np.float64)
    order = np.argsort(-loads, kind="stable").tolist()
    values = loads.tolist()
    groups: list[list[int]] = [[] for _ in shapes]
    heap = [(0.0, g) for g in range(len(shapes)) if shapes[g] > 0]
    heapq.heapify(heap)
    for i in order:
        load, g = heapq.heappop(heap)
        groups[g].append(i)
        if len(groups[g]) < shapes[g]:
            heapq.heappush(heap, (load + values[i], g))
    return groups


def refine_pairs(groups: list[list[int]], loads: np.ndarray, full: int, passes: int = 64) -> None:
    """In place: pairwise swaps that even out the first ``full`` (equal-size) groups.

    Each pass pairs the k-th heaviest with the k-th lightest group and, in every
    pair at once (vectorised), makes the one-for-one member swap that minimises
    the pair's new load difference, if it lowers it. A swap keeps the pair's sum
    and shrinks its difference, so the sum of squared group loads strictly drops
    and the loop terminates; group sizes never change.
    """
    if full < 2:
        return
    members = np.array(groups[:full], dtype=np.int64)  # (full, g)
    w = np.asarray(loads, dtype=np.float64)[members]
    half = full // 2
    for _ in range(passes):
        order = np.argsort(w.sum(axis=1), kind="stable")
        light, heavy = order[:half], order[::-1][:half]
        gap = w[heavy].sum(axis=1) - w[light].sum(axis=1)
        diff = w[heavy][:, :, None] - w[light][:, None, :]  # heavy member out, light member in
        new_gap = np.abs(gap[:, None, None] - 2.0 * diff).reshape(half, -1)
        k = new_gap.argmin(axis=1)
        better = new_gap[np.arange(half), k] < gap * (1 - 1e-12)
        if not better.any():
            break
        h, l, k = heavy[better], light[better], k[better]
        a, b = np.divmod(k, w.shape[1])
        members[h, a], members[l, b] = members[l, b], members[h, a].copy()
        w[h, a], w[l, b] = w[l, b], w[h, a].copy()
    groups[:full] = members.tolist()


def interleave_long_short(members: list[int], loads: np.ndarray) -> list[int]:
    """Order one group: longest, shortest, 2nd longest, 2nd shortest, ... (a permutation)."""
    ranked = sorted(members, key=lambda i: (-loads[i], i))
    out: list[int] = []
    left, right = 0, len(ranked) - 1
    while left <= right:
        out.append(ranked[left])
        if left != right:
            out.append(ranked[right])
        left, right = left + 1, right - 1
    return out


def balanced_groups(loads: np.ndarray, group_size: int, refine_passes: int = 64) -> list[list[int]]:
    """Groups of minibatch indices in dispatch order, loads balanced (see module docstring).

    Invariants: the concatenation is a permutation of ``range(len(loads))``; every
    group has ``group_size`` members except possibly the last, which is smaller.
    ``refine_passes`` bounds the pairwise-swap passes (0 gives plain LPT).
    """
    loads = np.asarray(loads, dtype=np.float64)
    shapes = group_shapes(len(loads), group_size)
    groups = lpt_groups(loads, shapes)
    full = len(loads) // group_size
    refine_pairs(groups, loads, full, refine_passes)
    totals = [float(loads[g].sum()) for g in groups]
    order = sorted(range(full), key=lambda g: (-totals[g], g)) + list(range(full, len(groups)))
    return [interleave_long_short(groups[g], loads) for g in order]


def sequential_groups(num_minibatches: int, group_size: int) -> list[list[int]]:
    """Consecutive minibatches in order, ``group_size`` per group (fifo / sorted planners)."""
    shapes = group_shapes(num_minibatches, group_size)
    bounds = np.concatenate(([0], np.cumsum(shapes))).tolist()
    return [list(range(bounds[g], bounds[g + 1])) for g in range(len(shapes))]


def _ratio(big: np.ndarray, small: np.ndarray) -> np.ndarray:
    """Elementwise big / small with 0 / 0 = 1 (two empty loads are balanced) and x / 0 = inf."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(big == small, 1.0, big / small)


def load_spread(group_loads: np.ndarray) -> dict[str, float]:
    """Spread of group loads: max, min, mean, max/min, coefficient of variation, max adjacent ratio.

    ``max_adjacent_ratio`` is the largest ratio between consecutive groups (larger
    over smaller) in dispatch order: 1.0 means a perfectly steady pipeline.
    """
    x = np.asarray(group_loads, dtype=np.float64)
    if x.size == 0:
        raise ValueError("load_spread needs at least one group load")
    lo, hi, mean = float(x.min()), float(x.max()), float(x.mean())
    adj = _ratio(np.maximum(x[1:], x[:-1]), np.minimum(x[1:], x[:-1]))
    return {
        "groups": int(x.size),
        "max": hi,
        "min": lo,
        "mean": mean,
        "max_over_min": float(_ratio(np.float64(hi), np.float64(lo))),
        "cv": float(x.std() / mean) if mean > 0 else 0.0,
        "max_adjacent_ratio": float(adj.max()) if adj.size else 1.0,
    }
