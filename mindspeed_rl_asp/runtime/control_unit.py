"""Control Unit: the Ray shell around the pure :class:`~mindspeed_rl_asp.control.core.ControlCore`.

Lives in the driver process, beside the Training Unit it serves. It turns the core's
actions into Ray calls and Ray completions back into core events:

* ``Generate`` -> ``actor.generate`` with two returns: a small report (read here) and the
  samples' payload, which stays in Ray's object store; its reference is what the
  Training Queue holds. That is the streaming data channel: minibatches flow into the
  queue as they finish, and a step starts as soon as the core sees enough of them.
* ``LoadWeights`` -> ``actor.load_weights`` with the version's object reference from the
  :class:`~mindspeed_rl_asp.weights.store.VersionedStore`; the actor resolves it itself.
* ``TrainStep`` -> ``trainer.train_step`` with the references of the chosen prompt groups;
  when it returns, ``trainer.export_weights``; when that object is sealed, the version is
  published (atomically: the store maps the version to a complete, immutable object).
* A generation task that raises is reported as a failed minibatch: the core re-dispatches
  it and its partial output is never seen. A trainer error ends the run (``TrainerFailed``).

It loops until the core says ``Finish``. Every completion is recorded: timeline spans,
queue occupancy samples and, per step, the metrics (``StepRecorder``).
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

from ..control.core import ControlCore, Finish, Generate, LoadWeights, TrainStep
from ..weights.store import VersionedStore


class TrainerFailed(RuntimeError):
    """The Training Unit raised; the run stops, the run directory keeps what was written."""


@dataclass
class InFlight:
    kind: str                 # generate | load | train | publish
    action: object
    payload: object = None    # generate: the payload reference
    issued: float = field(default_factory=time.time)


class ControlUnit:
    def __init__(self, core: ControlCore, generators: list, trainer, prompt_tokens: dict[str, list[int]],
                 recorder, seed: int = 0):
        self.core = core
        self.generators = generators
        self.trainer = trainer
        self.prompt_tokens = prompt_tokens
        self.recorder = recorder
        self.seed = seed
        self.store: VersionedStore = VersionedStore()
        self.store.publish(0, None)   # version 0: the checkpoint every actor starts from
        self.queue_refs: dict[str, object] = {}  # Training Queue payloads: prompt id -> ref
        self.inflight: dict[object, InFlight] = {}
        self.finish: Finish | None = None

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> Finish:
        import ray

        while self.finish is None:
            for action in self.core.poll():
                self._start(action)
            if self.finish is not None or should_stop():
                break
            if not self.inflight:
                raise RuntimeError(f"control deadlock: nothing in flight and no action; {self.core.snapshot()}")
            ready, _ = ray.wait(list(self.inflight), num_returns=1)
            self._complete(ready[0], self.inflight.pop(ready[0]))
            self.recorder.queue_sample(self.core.snapshot())
        self._drain_publishes()
        return self.finish

    def _drain_publishes(self) -> None:
        """The last step's snapshot is still being exported when the core says Finish:
        publish it (and record its metrics). Overshoot generation is left to be dropped."""
        import ray

        while True:
            pending = [ref for ref, job in self.inflight.items() if job.kind == "publish"]
            if not pending:
                return
            ready, _ = ray.wait(pending, num_returns=1)
            self._complete(ready[0], self.inflight.pop(ready[0]))

    # ------------------------------------------------------------------ actions -> Ray
    def _start(self, action) -> None:
        if isinstance(action, Generate):
            prompts = [(pid, self.prompt_tokens[pid]) for pid in action.prompt_ids]
            seed = zlib.crc32(f"{self.seed}/{action.minibatch_id}/{action.version}".encode())
            report, payload = self.generators[action.actor].generate.options(num_returns=2).remote(
                action.minibatch_id, prompts, seed)
            self.inflight[report] = InFlight("generate", action, payload)
        elif isinstance(action, LoadWeights):
            handle = self.store.acquire(action.version, f"gen-{action.actor}")
            ref = self.generators[action.actor].load_weights.remote(action.version, handle)
            self.inflight[ref] = InFlight("load", action)
        elif isinstance(action, TrainStep):
            refs = list({id(self.queue_refs[p]): self.queue_refs[p] for p in action.prompt_ids}.values())
            ref = self.trainer.train_step.remote(action.step, list(action.prompt_ids), *refs)
            self.inflight[ref] = InFlight("train", action)
        elif isinstance(action, Finish):
            self.finish = action

    # ------------------------------------------------------------------ Ray -> events
    def _complete(self, ref, job: InFlight) -> None:
        import ray
        from ray.exceptions import RayTaskError

        action = job.action
        if job.kind == "generate":
            try:
                report = ray.get(ref)
            except RayTaskError as error:
                self.recorder.failure(action, job.issued, time.time(), error)
                self.core.on_minibatch_failed(action.actor, action.minibatch_id)
                return
            for pid in action.prompt_ids:
                self.queue_refs[pid] = job.payload
            self.core.on_generated(action.actor, action.minibatch_id)
            self.recorder.generated(report, len(action.prompt_ids))
        elif job.kind == "load":
            report = ray.get(ref)
            self.store.release(action.version, f"gen-{action.actor}")
            self.core.on_weights_loaded(action.actor, action.version)
            self.recorder.loaded(report, job.issued, time.time())
        elif job.kind == "train":
            try:
                report = ray.get(ref)
            except RayTaskError as error:
                raise TrainerFailed(f"training step {action.step} failed: {error}") from error
            for pid in action.prompt_ids:
                self.queue_refs.pop(pid, None)
            self.core.on_train_step_done(action.step)
            export = self.trainer.export_weights.remote()
            self.inflight[export] = InFlight("publish", report)
        elif job.kind == "publish":
            ray.wait([ref], fetch_local=False)  # sealed in the object store: complete
            report = action
            self.store.publish(report.version, ref)
            self.core.on_published(report.version)
            self.recorder.stepped(report, job.issued, time.time(), self.core.snapshot())
