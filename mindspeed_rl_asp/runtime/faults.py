"""Faults a test injects into a real run: one small plan, applied in one place (right
after the actors are up, before the loop starts), so that the driver's signature and its
body hold no fault seams of their own.

    run_training(cfg, run_dir, faults=FaultPlan(fail_actor_once=0))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class FaultPlan:
    """``fail_actor_once``: that generation actor's next minibatch raises;
    ``fail_trainer_at_step``: every trainer rank's ``train_step`` of that step raises;
    ``fail_transfer_once``: the first collective weight transfer stops after that many
    buckets; ``hold_actor_once=(actor, flag_path)``: that actor's next minibatch writes its
    process id into ``flag_path`` and blocks, for a test to kill it mid-minibatch."""

    fail_actor_once: Optional[int] = None
    fail_trainer_at_step: Optional[int] = None
    fail_transfer_once: Optional[int] = None
    hold_actor_once: Optional[tuple[int, str]] = None

    def apply(self, generators, trainers) -> None:
        """Arm the actors' debug seams (Ray actor handles); returns once every one is armed."""
        import ray

        calls = []
        if self.fail_actor_once is not None:
            calls.append(generators[self.fail_actor_once].inject_failure.remote())
        if self.hold_actor_once is not None:
            actor, flag = self.hold_actor_once
            calls.append(generators[actor].hold_next_generate.remote(flag))
        if self.fail_trainer_at_step is not None:
            calls += [t.inject_failure.remote(self.fail_trainer_at_step) for t in trainers]
        if self.fail_transfer_once is not None:
            calls.append(trainers[0].inject_transfer_failure.remote(self.fail_transfer_once))
        ray.get(calls)
