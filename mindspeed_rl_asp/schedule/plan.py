"""Schedule plans: the offline output of the scheduler, and the planners that make them.

``make_plan(items, params, n_samples_per_prompt)`` turns ``(id, predicted_length)``
pairs into a ``SchedulePlan``: groups (in dispatch order) -> minibatches (in dispatch
order) -> prompt ids. Sizes count PROMPTS; each prompt yields
``n_samples_per_prompt`` GRPO samples that always travel in the same minibatch.

Planners (``PLANNERS``, selected by ``SchedulerParams.name``) share one signature
``planner(lengths, params, cost) -> groups of index arrays``:

* ``fifo``   data order, fixed size ``base`` (remainder last), groups in order;
* ``sorted`` ascending predicted length, fixed size, groups in order (short first);
* ``asp``    ascending length, DP sizes in ``[base - slack, base + slack]`` minimising
  padded work at the fixed-size minibatch count ``ceil(N / base)``
  (``partition.priced_partition``), then load-balanced groups, heaviest first,
  long and short minibatches interleaved inside a group (``ordering.balanced_groups``).

``PLANNERS`` is a plain dict: registering another function under a new name makes
it selectable (the benchmark registers an ablation that way).

The JSON schema is documented in docs/scheduler.md.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields
from numbers import Integral, Real
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from .ordering import LoadFn, balanced_groups, load_spread, padded_decode_load, sequential_groups
from .partition import ScheduleError, dp_partition, fixed_partition, offsets, priced_partition

__all__ = [
    "ScheduleError",
    "SchedulerParams",
    "Minibatch",
    "SchedulePlan",
    "PLANNERS",
    "make_plan",
    "plan_from_jsonl",
    "read_items_jsonl",
    "group_load_stats",
    "padding_stats",
]

PLAN_FORMAT = "mindspeed_rl_asp.schedule_plan"
PLAN_VERSION = 1


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ScheduleError(f"{name}={value!r} must be an int")
    if value < minimum:
        raise ScheduleError(f"{name}={value} must be >= {minimum}")


@dataclass(frozen=True)
class SchedulerParams:
    """Scheduler knobs; the Hydra ``scheduler`` group uses the same field names.

    ``base_batch_size`` and ``slack`` count prompts; ``group_size`` counts minibatches.
    Numeric fields are validated on construction; ``name`` when a plan is made.
    """

    name: str = "asp"
    base_batch_size: int = 8
    slack: int = 2
    group_size: int = 2

    def __post_init__(self) -> None:
        _check_int("base_batch_size", self.base_batch_size, 1)
        _check_int("slack", self.slack, 0)
        _check_int("group_size", self.group_size, 1)
        if self.slack >= self.base_batch_size:
            raise ScheduleError(
                f"slack={self.slack} must be < base_batch_size={self.base_batch_size} "
                "(slack larger than base would allow empty minibatches)"
            )

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> "SchedulerParams":
        """Pick this class's fields from a mapping (e.g. a Hydra node); other keys are ignored."""
        return cls(**{f.name: cfg[f.name] for f in fields(cls) if f.name in cfg})


@dataclass(frozen=True)
class Minibatch:
    """Prompts that occupy one generation actor together.

    ``max_length``/``total_length`` are the max and sum of the members' PREDICTED
    lengths; ``load`` is the load model's predicted processing time.
    """

    ids: tuple[str, ...]
    max_length: float
    total_length: float
    load: float

    @property
    def size(self) -> int:
        return len(self.ids)

    def to_dict(self) -> dict[str, Any]:
        return {"ids": list(self.ids), "max_length": self.max_length,
                "total_length": self.total_length, "load": self.load}


@dataclass(frozen=True)
class SchedulePlan:
    """groups (dispatch order) -> minibatches (dispatch order) -> prompt ids.

    Invariant (checked by ``make_plan`` and ``from_dict``): every prompt id appears
    exactly once; every group but the last has ``params.group_size`` minibatches.
    """

    groups: tuple[tuple[Minibatch, ...], ...]
    params: SchedulerParams
    n_samples_per_prompt: int
    planner: str

    @property
    def group_loads(self) -> list[float]:
        """Per-group load: the sum of its minibatch loads."""
        return [math.fsum(mb.load for mb in g) for g in self.groups]

    def minibatches(self) -> Iterator[Minibatch]:
        """All minibatches in dispatch order."""
        for g in self.groups:
            yield from g

    @property
    def num_minibatches(self) -> int:
        return sum(len(g) for g in self.groups)

    def prompt_ids(self) -> list[str]:
        """All prompt ids in dispatch order."""
        return [i for mb in self.minibatches() for i in mb.ids]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "planner": self.planner,
            "params": asdict(self.params),
            "n_samples_per_prompt": self.n_samples_per_prompt,
            "group_loads": self.group_loads,
            "groups": [[mb.to_dict() for mb in g] for g in self.groups],
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SchedulePlan":
        """Inverse of ``to_dict``; raises ``ScheduleError`` naming the first bad field."""
        if d.get("format") != PLAN_FORMAT or d.get("version") != PLAN_VERSION:
            raise ScheduleError(
                f"not a schedule plan: format={d.get('format')!r} version={d.get('version')!r} "
                f"(expected {PLAN_FORMAT!r} version {PLAN_VERSION})"
            )
        try:
            params = SchedulerParams(**d["params"])
            groups = tuple(tuple(_minibatch_from_dict(mb) for mb in _as_list(g, "group"))
                           for g in _as_list(d["groups"], "groups"))
            n_samples = d["n_samples_per_prompt"]
            _check_int("n_samples_per_prompt", n_samples, 1)
            plan = cls(groups, params, n_samples, str(d["planner"]))
        except ScheduleError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ScheduleError(f"malformed schedule plan: {exc!r}") from exc
        _check_plan(plan)
        stored = d.get("group_loads")
        if stored is not None and (len(_as_list(stored, "group_loads")) != len(plan.groups)
                                   or not np.allclose(stored, plan.group_loads, rtol=1e-9, atol=0.0)):
            raise ScheduleError("group_loads do not match the sums of the minibatch loads")
        return plan

    @classmethod
    def from_json(cls, text: str) -> "SchedulePlan":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScheduleError(f"schedule plan is not valid JSON: {exc}") from exc
        if not isinstance(d, dict):
            raise ScheduleError("schedule plan JSON must be an object")
        return cls.from_dict(d)

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON atomically (temp file + rename) so readers never see half a plan."""
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self.to_json())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SchedulePlan":
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())


def _as_list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise ScheduleError(f"{what} must be a JSON list, got {type(value).__name__}")
    return value


def _minibatch_from_dict(mb: Any) -> Minibatch:
    if not isinstance(mb, dict):
        raise ScheduleError(f"a minibatch must be a JSON object, got {type(mb).__name__}")
    return Minibatch(tuple(_as_list(mb["ids"], "ids")), float(mb["max_length"]),
                     float(mb["total_length"]), float(mb["load"]))


# --------------------------------------------------------------------------- planners
# (lengths, params, cost) -> groups of minibatches of prompt indices, all in dispatch order.
# ``cost(sizes, max_lengths)`` is the minibatch load model with n_samples bound.
Planner = Callable[[np.ndarray, SchedulerParams, Callable], list[list[np.ndarray]]]


def _layout(order: np.ndarray, sizes: np.ndarray, groups: list[list[int]]) -> list[list[np.ndarray]]:
    bounds = offsets(sizes)
    return [[order[bounds[m]: bounds[m + 1]] for m in g] for g in groups]


def plan_fifo(lengths: np.ndarray, params: SchedulerParams, cost: Callable) -> list[list[np.ndarray]]:
    """Data order, fixed size base (remainder last), consecutive groups."""
    sizes = fixed_partition(len(lengths), params.base_batch_size)
    return _layout(np.arange(len(lengths)), sizes, sequential_groups(len(sizes), params.group_size))


def plan_sorted(lengths: np.ndarray, params: SchedulerParams, cost: Callable) -> list[list[np.ndarray]]:
    """Ascending predicted length (stable), fixed size base (remainder last, longest), short first."""
    order = np.argsort(lengths, kind="stable")
    sizes = fixed_partition(len(lengths), params.base_batch_size)
    return _layout(order, sizes, sequential_groups(len(sizes), params.group_size))


def plan_asp(lengths: np.ndarray, params: SchedulerParams, cost: Callable) -> list[list[np.ndarray]]:
    """Ascending length, priced DP cuts (count = ceil(N / base)), load-balanced interleaved groups."""
    return _asp_layout(lengths, params, cost, priced=True)


def plan_asp_unpriced(lengths: np.ndarray, params: SchedulerParams, cost: Callable) -> list[list[np.ndarray]]:
    """Ablation (not registered): DP without the minibatch price; sizes collapse toward lo."""
    return _asp_layout(lengths, params, cost, priced=False)


def _asp_layout(lengths: np.ndarray, params: SchedulerParams, cost: Callable, priced: bool):
    order = np.argsort(lengths, kind="stable")
    ordered = lengths[order]
    if priced:
        sizes, _ = priced_partition(ordered, params.base_batch_size, params.slack, cost)
    else:
        sizes = dp_partition(ordered, params.base_batch_size, params.slack, cost)
    loads = np.asarray(cost(sizes, ordered[offsets(sizes)[1:] - 1]), dtype=np.float64)
    return _layout(order, sizes, balanced_groups(loads, params.group_size))


PLANNERS: dict[str, Planner] = {"fifo": plan_fifo, "sorted": plan_sorted, "asp": plan_asp}


# --------------------------------------------------------------------------- make_plan
def _validate_items(items: Iterable[tuple[str, float]]) -> tuple[list[str], np.ndarray]:
    """Split and check items: non-empty, str ids, unique ids, finite lengths >= 0."""
    ids: list[str] = []
    raw: list[Any] = []
    for k, item in enumerate(items):
        try:
            pid, length = item
        except (TypeError, ValueError):
            raise ScheduleError(f"item {k} is {item!r}, expected an (id, predicted_length) pair") from None
        ids.append(pid)
        raw.append(length)
    if not ids:
        raise ScheduleError("no prompts to schedule: empty input")
    for k, pid in enumerate(ids):
        if not isinstance(pid, str):
            raise ScheduleError(f"prompt id {pid!r} (item {k}) must be a str")
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))
        raise ScheduleError(f"duplicate prompt id {dup!r}")
    if any(t is bool or not issubclass(t, Real) for t in {type(v) for v in raw}):
        k = next(k for k, v in enumerate(raw) if isinstance(v, bool) or not isinstance(v, Real))
        raise ScheduleError(f"predicted_length {raw[k]!r} of prompt {ids[k]!r} is not a number")
    lengths = np.array(raw, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(lengths) | (lengths < 0))
    if bad.size:
        k = int(bad[0])
        raise ScheduleError(f"predicted_length {lengths[k]} of prompt {ids[k]!r} must be finite and >= 0")
    return ids, lengths


def make_plan(items: Iterable[tuple[str, float]], params: SchedulerParams = SchedulerParams(),
              n_samples_per_prompt: int = 1, load_fn: LoadFn = padded_decode_load) -> SchedulePlan:
    """Plan ``(id, predicted_length)`` items with the planner ``params.name``.

    ``load_fn(sizes, max_lengths, n_samples)`` is the minibatch load model (elementwise,
    numpy); it is both the DP objective of ``asp`` and the balancing weight.
    Raises ``ScheduleError`` for bad input, naming the bad value.
    """
    if params.name not in PLANNERS:
        raise ScheduleError(f"unknown planner {params.name!r}; valid: {', '.join(sorted(PLANNERS))}")
    _check_int("n_samples_per_prompt", n_samples_per_prompt, 1)
    ids, lengths = _validate_items(items)

    def cost(sizes: np.ndarray, max_lengths: np.ndarray) -> np.ndarray:
        return load_fn(sizes, max_lengths, n_samples_per_prompt)

    layout = PLANNERS[params.name](lengths, params, cost)
    num_mb = sum(len(g) for g in layout)
    if params.group_size > num_mb:
        raise ScheduleError(
            f"group_size={params.group_size} exceeds the {num_mb} minibatch(es) planned for "
            f"{len(ids)} prompt(s): no full dispatch group; lower group_size or base_batch_size"
        )
    plan = SchedulePlan(_assemble(layout, ids, lengths, cost), params, n_samples_per_prompt, params.name)
    _check_plan(plan)
    return plan


def _assemble(layout: list[list[np.ndarray]], ids: list[str], lengths: np.ndarray,
              cost: Callable) -> tuple[tuple[Minibatch, ...], ...]:
    """Build the frozen plan structure; per-minibatch max/sum/load computed in one vectorised pass."""
    flat_mbs = [m for g in layout for m in g]
    flat = np.concatenate(flat_mbs)
    sizes = np.array([len(m) for m in flat_mbs], dtype=np.int64)
    bounds = offsets(sizes)
    ordered = lengths[flat]
    maxes = np.maximum.reduceat(ordered, bounds[:-1])
    loads = np.asarray(cost(sizes, maxes), dtype=np.float64).tolist()
    sums = np.add.reduceat(ordered, bounds[:-1]).tolist()
    ordered_ids = np.array(ids, dtype=object)[flat].tolist()
    b = bounds.tolist()
    mbs = [Minibatch(tuple(ordered_ids[b[k]: b[k + 1]]), mx, sums[k], loads[k])
           for k, mx in enumerate(maxes.tolist())]
    group_bounds = offsets(np.array([len(g) for g in layout])).tolist()
    return tuple(tuple(mbs[group_bounds[g]: group_bounds[g + 1]]) for g in range(len(layout)))


def _check_plan(plan: SchedulePlan) -> None:
    """Structural invariants: unique ids, no empty minibatch, only the last group short."""
    if not plan.groups:
        raise ScheduleError("schedule plan has no groups")
    g = plan.params.group_size
    for k, group in enumerate(plan.groups):
        if not group or len(group) > g or (len(group) < g and k != len(plan.groups) - 1):
            raise ScheduleError(f"group {k} has {len(group)} minibatches; group_size={g}, only the last may be short")
        if any(mb.size == 0 for mb in group):
            raise ScheduleError(f"group {k} holds an empty minibatch")
    ids = plan.prompt_ids()
    if not all(isinstance(i, str) for i in ids):
        raise ScheduleError("schedule plan has a non-str prompt id")
    if len(set(ids)) != len(ids):
        raise ScheduleError("schedule plan lists a prompt id more than once")


# --------------------------------------------------------------------------- inputs / metrics
def read_items_jsonl(path: str | os.PathLike) -> list[tuple[str, float]]:
    """Read ``{"id": ..., "predicted_length": ...}`` lines (blank lines skipped; a bad one
    raises ``schedule/length_files.LengthFileError``, a ScheduleError)."""
    from .length_files import read_length_file

    return [(r.id, r.predicted) for r in read_length_file(path, "predicted")]


def plan_from_jsonl(path: str | os.PathLike, params: SchedulerParams = SchedulerParams(),
                    n_samples_per_prompt: int = 1, load_fn: LoadFn = padded_decode_load) -> SchedulePlan:
    """``make_plan`` over the items of a JSONL file (see ``read_items_jsonl``)."""
    return make_plan(read_items_jsonl(path), params, n_samples_per_prompt, load_fn)


def group_load_stats(plan: SchedulePlan) -> dict[str, float]:
    """Spread of the FULL groups' loads (``ordering.load_spread``) plus the partial group.

    The final short group (when the minibatch count is not a multiple of
    group_size) is excluded from max/min/cv because it is short by construction;
    ``partial_load_ratio`` reports its load over the full-group mean (nan if none).
    """
    loads = plan.group_loads
    full = [l for g, l in zip(plan.groups, loads) if len(g) == plan.params.group_size]
    stats = load_spread(np.array(full))
    partial = len(full) < len(loads)
    stats["partial_load_ratio"] = loads[-1] / stats["mean"] if partial and stats["mean"] > 0 else float("nan")
    return stats


def padding_stats(plan: SchedulePlan, lengths: Mapping[str, float] | None = None) -> dict[str, float]:
    """Padding bubble ``(padded - useful) / padded`` with ``padded = sum(size * max_len)``.

    With ``lengths`` (id -> observed length) the bubble is measured on those
    lengths (the realised bubble of a plan made from predictions); otherwise on
    the plan's predicted lengths. n_samples_per_prompt cancels out.
    """
    padded = useful = 0.0
    for mb in plan.minibatches():
        if lengths is None:
            padded += mb.size * mb.max_length
            useful += mb.total_length
        else:
            obs = [lengths[i] for i in mb.ids]
            padded += mb.size * max(obs)
            useful += math.fsum(obs)
    return {"padded": padded, "useful": useful,
            "bubble_fraction": (padded - useful) / padded if padded > 0 else 0.0}
