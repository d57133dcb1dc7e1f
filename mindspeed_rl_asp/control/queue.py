"""Training Queue logic: bounded capacity, in-flight reservations, watermark hysteresis.

The queue holds finished prompt groups (ids and behaviour versions only; the shell keeps
the samples) until the trainer takes them, oldest behaviour version first, then arrival
order. Everything is counted in SAMPLES (prompts x n_samples_per_prompt) except where a
name says prompts.

Invariants:

* ``queued_samples + in_flight_samples <= capacity`` at all times. A minibatch's samples
  arrive together when it completes, so its samples are reserved at dispatch
  (``reserve``); completion turns the reservation into queued groups and can never
  overflow.
* ``take`` returns the groups in ``(version, arrival)`` order: the trainer consumes the
  oldest behaviour versions first, which is the order the staleness deadline check needs.
* Throttling has hysteresis: it engages when ``queued_samples >= high_watermark *
  capacity`` and releases when ``queued_samples <= low_watermark * capacity``; in between
  it keeps its last state. Only queued (finished) samples count for the watermarks: they
  are what the queue exposes to the Control Unit; in-flight work is bounded by capacity.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable

__all__ = ["QueuedGroup", "TrainingQueue"]


@dataclass(frozen=True, order=True)
class QueuedGroup:
    """One finished prompt group (all its samples), ordered by (version, arrival)."""

    version: int
    seq: int
    prompt_id: str = field(compare=False)


class TrainingQueue:
    """Bounded queue of finished prompt groups; see the module docstring for invariants."""

    def __init__(self, capacity: int, n_samples_per_prompt: int, high_watermark: float,
                 low_watermark: float) -> None:
        if capacity < 1 or n_samples_per_prompt < 1:
            raise ValueError(f"queue_capacity={capacity} and n_samples_per_prompt="
                             f"{n_samples_per_prompt} must be >= 1")
        if not 0.0 <= low_watermark <= high_watermark <= 1.0:
            raise ValueError(f"watermarks must satisfy 0 <= low_watermark ({low_watermark}) "
                             f"<= high_watermark ({high_watermark}) <= 1")
        self.capacity = capacity
        self.n_samples_per_prompt = n_samples_per_prompt
        self.high_watermark = high_watermark
        self.low_watermark = low_watermark
        self.in_flight_samples = 0
        self.throttled = False
        self._groups: list[QueuedGroup] = []
        self._seq = 0
        self._update_throttle()

    # ------------------------------------------------------------------ occupancy
    @property
    def queued_prompts(self) -> int:
        return len(self._groups)

    @property
    def queued_samples(self) -> int:
        return len(self._groups) * self.n_samples_per_prompt

    @property
    def reserved_samples(self) -> int:
        """Queued plus in-flight samples: what counts against capacity."""
        return self.queued_samples + self.in_flight_samples

    @property
    def occupancy(self) -> float:
        """Queued samples over capacity: the fraction the watermarks compare against."""
        return self.queued_samples / self.capacity

    def fits(self, prompts: int) -> bool:
        return self.reserved_samples + prompts * self.n_samples_per_prompt <= self.capacity

    # ------------------------------------------------------------------ transitions
    def reserve(self, prompts: int) -> None:
        """Count a dispatched minibatch's samples against capacity before they exist."""
        if not self.fits(prompts):
            raise ValueError(f"{prompts} prompts x {self.n_samples_per_prompt} samples do not fit: "
                             f"{self.reserved_samples} of {self.capacity} reserved")
        self.in_flight_samples += prompts * self.n_samples_per_prompt

    def release(self, prompts: int) -> None:
        """Drop the reservation of a minibatch that failed (its prompts go back to the plan)."""
        samples = prompts * self.n_samples_per_prompt
        if samples > self.in_flight_samples:
            raise ValueError(f"cannot release {samples} samples: {self.in_flight_samples} in flight")
        self.in_flight_samples -= samples

    def arrive(self, prompt_ids: Iterable[str], version: int) -> None:
        """A minibatch completed: its reservation becomes queued groups, in prompt order."""
        ids = list(prompt_ids)
        self.release(len(ids))
        for pid in ids:
            bisect.insort(self._groups, QueuedGroup(version, self._seq, pid))
            self._seq += 1
        self._update_throttle()

    def oldest(self, count: int) -> list[QueuedGroup]:
        """The ``count`` groups ``take`` would return (fewer if fewer are queued)."""
        return self._groups[:count]

    def take(self, count: int) -> list[QueuedGroup]:
        if count > len(self._groups):
            raise ValueError(f"cannot take {count} groups: {len(self._groups)} queued")
        taken, self._groups = self._groups[:count], self._groups[count:]
        self._update_throttle()
        return taken

    def remove(self, prompt_ids: Iterable[str]) -> list[QueuedGroup]:
        """Take these groups out (rejected by dynamic sampling); returns them. Every id
        must be queued (``ValueError`` otherwise, and nothing changes)."""
        wanted = set(prompt_ids)
        gone = [g for g in self._groups if g.prompt_id in wanted]
        if len(gone) != len(wanted):
            missing = sorted(wanted - {g.prompt_id for g in gone})
            raise ValueError(f"cannot remove prompt groups {missing[:3]}: not queued")
        self._groups = [g for g in self._groups if g.prompt_id not in wanted]
        self._update_throttle()
        return gone

    def groups(self) -> list[QueuedGroup]:
        return list(self._groups)

    def _update_throttle(self) -> None:
        queued = self.queued_samples
        if queued >= self.high_watermark * self.capacity:
            self.throttled = True
        elif queued <= self.low_watermark * self.capacity:
            self.throttled = False
