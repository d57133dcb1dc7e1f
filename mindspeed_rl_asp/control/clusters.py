"""Pure clusters for the loop: work that ends in an order someone else chooses.

``OrderedCluster`` has no cost model and no devices: every submitted action is pending
until ``next_event`` picks one to end (complete or fail) by a ``chooser``. The property
tests choose with hypothesis or a seeded RNG (any order the outside world could produce),
the overhead benchmark with a seeded RNG; the clock counts events. The simulator
(``sim/cluster.py``) is the same idea with cost models and a virtual clock.
"""
from __future__ import annotations

import random
from typing import Callable, Mapping, Optional, Sequence

from .core import Action, Generate
from .loop import Done, Event, Failed

# (pending actions in submission order) -> (index to end, whether it fails)
Chooser = Callable[[Sequence[Action]], "tuple[int, bool]"]


def random_chooser(seed: int = 0, fail_rate: float = 0.0, max_failures: int = 0,
                   starve: float = 0.0) -> Chooser:
    """Any pending action, uniformly; a generation fails with ``fail_rate`` (at most
    ``max_failures`` times). With probability ``starve`` the running minibatches of the
    oldest behaviour version are held back while anything else can end, so slow
    minibatches get overtaken (the case where staleness bounds are tight)."""
    rng = random.Random(seed)
    failures = 0

    def choose(pending: Sequence[Action]) -> tuple[int, bool]:
        nonlocal failures
        indices = list(range(len(pending)))
        gens = [i for i in indices if isinstance(pending[i], Generate)]
        if gens and rng.random() < starve:
            oldest = min(pending[i].version for i in gens)
            others = [i for i in indices if not (i in gens and pending[i].version == oldest)]
            indices = others or indices
        index = rng.choice(indices)
        fail = (isinstance(pending[index], Generate) and failures < max_failures
                and rng.random() < fail_rate)
        failures += fail
        return index, fail

    return choose


class OrderedCluster:
    """Submitted actions stay pending until ``next_event`` ends the one the chooser picks.
    ``check(action)``, if given, sees every submitted action first (tests assert there)."""

    def __init__(self, chooser: Optional[Chooser] = None,
                 check: Optional[Callable[[Action], None]] = None,
                 rewards: Optional[Callable[[Generate], Mapping[str, Sequence[float]]]] = None) -> None:
        """``rewards(action)``: what a finished ``Generate`` reports as its groups' rewards
        (the core's reject rule reads them); None: no rewards reported."""
        self.chooser = chooser or random_chooser()
        self.check = check
        self.rewards = rewards
        self.pending: list[Action] = []
        self.cancelled: list[Action] = []
        self.clock = 0.0

    def now(self) -> float:
        return self.clock

    def submit(self, action: Action) -> None:
        if self.check is not None:
            self.check(action)
        self.pending.append(action)

    def next_event(self) -> Event:
        if not self.pending:
            raise RuntimeError("next_event with nothing pending")
        index, fail = self.chooser(self.pending)
        action = self.pending.pop(index)
        self.clock += 1.0
        if fail:
            return Failed(action, "injected failure")
        if isinstance(action, Generate) and self.rewards is not None:
            return Done(action, rewards=self.rewards(action))
        return Done(action)

    def cancel(self, actions: Sequence[Action]) -> None:
        for action in actions:
            self.pending.remove(action)
            self.cancelled.append(action)
