"""What each unit reports to the Control Unit when its work ends: plain data, standard
library only, so the Ray actors (``runtime/generation_unit.py``, ``runtime/training_unit.py``)
and the simulator's cluster (``sim/cluster.py``) return the same types and the loop's
observers (``metrics/recorder.py``) read either without knowing which shell ran."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class MinibatchReport:
    """What the Control Unit learns from a finished minibatch (no token payload)."""

    minibatch_id: str
    actor: int
    version: int
    start: float
    end: float
    lengths: list[int] = field(default_factory=list)
    # prompt id -> the filter metric of each sample (algo.filter_groups_metric), when scored here
    rewards: dict[str, list[float]] | None = None

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)


@dataclass
class LoadReport:
    """``start``..``end``: the actor not generating because of this refresh. With the
    collective transport, ``wait_s`` of it waited for buckets still arriving, ``swap_s``
    copied the complete version into the engine, and ``transfer_s`` is how long the
    transfer took (on the transport thread, overlapping generation when prefetched)."""

    actor: int
    version: int
    start: float
    end: float
    transport: str = "object_store"
    bytes: int = 0
    wait_s: float = 0.0
    swap_s: float = 0.0
    transfer_s: float = 0.0


@dataclass
class StepReport:
    """What the Control Unit learns from a finished training step: ``version`` is the one
    the trainer holds after it (its count of completed steps), ``metrics`` the step's row of
    metrics.jsonl."""

    step: int
    version: int
    start: float
    end: float
    metrics: dict
    # What the model wrote (record.rollouts): one record per sample, ``rollout_records``.
    rollouts: list = field(default_factory=list)
