"""``RayCluster``: the Control Unit's Ray shell, a cluster for :func:`control.loop.drive`.

Lives in the driver process, beside the Training Unit it serves. It turns the core's
actions into Ray calls and Ray completions into events; it holds no control rule (the
loop and the core have them all):

* ``Generate`` -> ``actor.generate`` with two returns: a small report (read here) and the
  samples' payload, which stays in Ray's object store; its reference is what the
  Training Queue holds. That is the streaming data channel: minibatches flow into the
  queue as they finish, and a step starts as soon as the core sees enough of them.
* ``LoadWeights`` -> ``actor.load_weights`` with the version's object reference from the
  :class:`~mindspeed_rl_asp.weights.store.VersionedStore`; the actor resolves it itself.
* ``TrainStep`` -> ``trainer.train_step`` with the references of the chosen prompt groups.
* ``Publish`` -> ``trainer.export_weights``; once that object is sealed, the store maps
  the version to it (atomic publish: a complete, immutable object or nothing) and the
  event says so.
* A task that raises, or whose actor died, ends as a ``Failed`` event: the core
  re-dispatches a failed minibatch (its partial output is never seen) and retries a
  failed load; a failed step or publish ends the run (``TrainerFailed``, from the loop).
* ``cancel`` (work still running at Finish, or on Ctrl-C): best-effort ``ray.cancel``;
  the actors go with the placement group at the end of the run anyway.
"""
from __future__ import annotations

import time
import zlib
from typing import Sequence

from ..control.core import Action, Generate, LoadWeights, Publish, TrainStep
from ..control.loop import Done, Event, Failed, TrainerFailed
from ..weights.store import VersionedStore

__all__ = ["RayCluster", "TrainerFailed"]


class RayCluster:
    def __init__(self, generators: list, trainer, prompt_tokens: dict[str, list[int]], seed: int = 0):
        self.generators = generators
        self.trainer = trainer
        self.prompt_tokens = prompt_tokens
        self.seed = seed
        self.store: VersionedStore = VersionedStore()
        self.store.publish(0, None)   # version 0: the checkpoint every actor starts from
        self.queue_refs: dict[str, object] = {}  # Training Queue payloads: prompt id -> ref
        self.inflight: dict[object, tuple[Action, object]] = {}  # result ref -> (action, payload ref)

    def now(self) -> float:
        return time.time()

    # ------------------------------------------------------------------ actions -> Ray
    def submit(self, action: Action) -> None:
        payload = None
        if isinstance(action, Generate):
            prompts = [(pid, self.prompt_tokens[pid]) for pid in action.prompt_ids]
            seed = zlib.crc32(f"{self.seed}/{action.minibatch_id}/{action.version}".encode())
            ref, payload = self.generators[action.actor].generate.options(num_returns=2).remote(
                action.minibatch_id, prompts, seed)
        elif isinstance(action, LoadWeights):
            handle = self.store.acquire(action.version, f"gen-{action.actor}")
            ref = self.generators[action.actor].load_weights.remote(action.version, handle)
        elif isinstance(action, TrainStep):
            refs = list({id(self.queue_refs[p]): self.queue_refs[p] for p in action.prompt_ids}.values())
            ref = self.trainer.train_step.remote(action.step, list(action.prompt_ids), *refs)
        elif isinstance(action, Publish):
            ref = self.trainer.export_weights.remote()
        else:
            raise TypeError(f"RayCluster cannot run {action!r}")
        self.inflight[ref] = (action, payload)

    # ------------------------------------------------------------------ Ray -> events
    def next_event(self) -> Event:
        import ray

        ready, _ = ray.wait(list(self.inflight), num_returns=1)
        return self._to_event(ready[0])

    def _to_event(self, ref) -> Event:
        import ray

        action, payload = self.inflight.pop(ref)
        if isinstance(action, Publish):
            ray.wait([ref], fetch_local=False)  # sealed in the object store: complete
            self.store.publish(action.version, ref)
            return Done(action)
        try:
            report = ray.get(ref)
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as error:
            if isinstance(action, LoadWeights):
                self.store.release(action.version, f"gen-{action.actor}")
            return Failed(action, str(error) or type(error).__name__)
        if isinstance(action, Generate):
            for pid in action.prompt_ids:
                self.queue_refs[pid] = payload
        elif isinstance(action, LoadWeights):
            self.store.release(action.version, f"gen-{action.actor}")
        elif isinstance(action, TrainStep):
            for pid in action.prompt_ids:
                self.queue_refs.pop(pid, None)
        return Done(action, report)

    def cancel(self, actions: Sequence[Action]) -> None:
        import ray

        doomed = set(actions)
        for ref, (action, _) in list(self.inflight.items()):
            if action in doomed:
                del self.inflight[ref]
                if isinstance(action, LoadWeights):
                    self.store.release(action.version, f"gen-{action.actor}")
                try:
                    ray.cancel(ref)
                except Exception:  # noqa: BLE001 - cancelling is best effort; the actor dies with the run
                    pass
