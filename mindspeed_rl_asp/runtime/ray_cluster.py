"""``RayCluster``: the Control Unit's Ray shell, a cluster for :func:`control.loop.drive`.

Lives in the driver process, beside the Training Unit it serves. It turns the core's
actions into Ray calls and Ray completions into events; it holds no control rule (the
loop and the core have them all):

* ``Generate`` -> ``actor.generate`` with two returns: a small report (read here; with
  dynamic sampling it carries the groups' rewards, passed on in the event) and the
  samples' payload, which stays in Ray's object store; its reference is what the
  Training Queue holds. That is the streaming data channel: minibatches flow into the
  queue as they finish, and a step starts as soon as the core sees enough of them.
* ``LoadWeights`` -> ``actor.load_weights`` with the version's handle from the
  :class:`~mindspeed_rl_asp.weights.store.VersionedStore` (object store: the snapshot's
  reference, which the actor resolves itself; files: its directory; collective: its
  layout, plus the transfer to the actor unless a prefetch brought it), as the transport
  says (``runtime/transport.py``).
* ``Prefetch`` (collective transport) -> the transfer of the version to the actor on the
  transport threads of both sides, while the actor generates; done once every bucket has
  arrived, failed if the transfer did not complete (the core then loads the long way).
  The version is held in the store while it moves.
* ``TrainStep`` -> ``train_step`` on every trainer rank with the references of the chosen
  prompt groups (each rank trains its share of the samples; rank 0's report stands for
  the step, and the step is done when every rank is).
* ``Publish`` -> an export on every rank, as the transport says; every rank's small
  receipt is fetched here, so an export that raised (or a rank that died) is a
  ``Failed(Publish)`` whatever the transport. Once rank 0's result is complete (an object
  sealed in the store, a directory renamed into place, a version packed for sending), the
  store maps the version to it (atomic publish: a complete, immutable version or
  nothing) and the event says so.
* ``Checkpoint`` -> the checkpoint writer (``runtime/checkpoint.CheckpointWriter``):
  every trainer rank saves its part, then the control state the action carries is
  written and the directory committed. The write runs inside ``submit`` (the loop waits
  for it, as it always has; an asynchronous write is a later change), and its event is
  the next one ``next_event`` returns: ``Done`` with the directory, or ``Failed`` with
  the error (an ``OSError`` unwrapped from Ray's task error: a full disk), which ends
  the run (``CheckpointFailed``) with the previous checkpoint intact.
* A task that raises, or whose actor died, ends as a ``Failed`` event: the core
  re-dispatches a failed minibatch (its partial output is never seen) and retries a
  failed load; a failed step or publish ends the run (``TrainerFailed``, from the loop).
* A generation actor whose *process* died (Ray's ``RayActorError``: ``ActorDiedError``,
  ``ActorUnavailableError``; not an error raised in it) is reported lost
  (``Failed.lost``); so is one whose minibatch came back generated with another version
  than the one it was told (Ray restarted it between two calls: its samples are
  dropped). ``AwaitActor`` -> ``actor.weight_version``, which Ray runs once the actor is
  back: done with the version its new process holds, or failed (retired) once its
  restarts are spent. The probe sits in the same wait set as all other work, so the
  loop never blocks on a restart.
* ``cancel`` (work still running at Finish, or on Ctrl-C): best-effort ``ray.cancel``;
  the actors go with the placement group at the end of the run anyway.
"""
from __future__ import annotations

import time
import zlib
from typing import Sequence

from ..control.core import Action, AwaitActor, Checkpoint, Generate, LoadWeights, Prefetch, Publish, TrainStep
from ..control.loop import Done, Event, Failed, Observer, TrainerFailed
from ..weights.store import VersionedStore

__all__ = ["RayCluster", "RejectedPayloads", "TrainerFailed"]


def _describe(error) -> str:
    """What went wrong in a Ray call, first line first: the remote exception itself (a
    ``RayTaskError``'s own first line is only the task's name), then Ray's full text."""
    cause = getattr(error, "cause", None)
    text = str(error) or type(error).__name__
    if isinstance(cause, BaseException) and str(cause):
        return f"{type(cause).__name__}: {cause}\n{text}"
    return text


def os_error_of(error: BaseException) -> BaseException:
    """The OSError an actor raised (a checkpoint or export write: disk full, read-only),
    which Ray hands over wrapped in a task error; any other error as it is."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, OSError) else error


def process_died(error) -> bool:
    """Whether a Ray call failed because the actor's process died or is unreachable
    (``RayActorError`` and its kinds), not because the call raised (``RayTaskError``)."""
    import ray

    return isinstance(error, ray.exceptions.RayActorError)


def restarted_version_mismatch(actor: int, told: int, generated_with: int):
    """The error text when a minibatch was generated with another version than the one the
    core told the actor to use (its process was restarted in between), else None."""
    if told == generated_with:
        return None
    return (f"generation actor {actor} generated with weight version {generated_with}, not {told}: its "
            f"process was restarted since its last load; the samples are dropped and it is refreshed")


def _prefetcher(actor: int) -> str:
    """The store's holder name of a prefetch to ``actor`` (a load's is ``gen-<actor>``)."""
    return f"prefetch-{actor}"


class RayCluster:
    """``trainer``: the trainer actor, or the list of its rank actors (rank 0 first).
    ``transport``: how versions travel (``runtime/transport.py``; default: object store)."""

    def __init__(self, generators: list, trainer, prompt_tokens: dict[str, list[int]], seed: int = 0,
                 transport=None, waiting=None, start_version: int = 0, checkpoint=None):
        """``waiting()``: a context around the blocking wait for the next completion, the one
        place where nothing is half done (``runtime/interrupts.Interrupts.waiting`` lets a
        signal land there). ``start_version``: the version every actor starts with (the
        core's, a resumed run's checkpoint). ``checkpoint(action, t)``: writes a
        ``Checkpoint`` (``CheckpointWriter.write``); None: a core with ``save_every`` fails."""
        from contextlib import nullcontext

        from .transport import ObjectStoreTransport

        self.waiting = waiting or nullcontext

        self.generators = generators
        self.trainers = list(trainer) if isinstance(trainer, (list, tuple)) else [trainer]
        self.trainer = self.trainers[0]
        self.transport = transport or ObjectStoreTransport(self.trainers, generators)
        from ..tasks import base_prompt_id

        # By dataset id: a refill (dynamic sampling) dispatches epoch ids the plan had not.
        self.prompt_tokens = {base_prompt_id(pid): tokens for pid, tokens in prompt_tokens.items()}
        self.seed = seed
        self.store: VersionedStore = VersionedStore()
        self.store.publish(start_version, None)   # the checkpoint every actor starts from
        self.write_checkpoint = checkpoint
        self._ready: list[Event] = []   # events of work done inside submit (checkpoints)
        self.queue_refs: dict[str, object] = {}  # Training Queue payloads: prompt id -> ref
        self.inflight: dict[object, tuple[Action, object]] = {}  # result ref -> (action, payload ref)
        # The other trainer ranks' refs of a TrainStep / Publish, by rank 0's ref: the action
        # ends when all have; it fails as soon as one fails.
        self.companions: dict[object, list] = {}
        self._companion_of: dict[object, object] = {}
        self._waiting: set = set()   # rank 0 done, other ranks not yet

    def now(self) -> float:
        return time.time()

    def _drop(self, versions: list[int]) -> None:
        if versions:
            self.transport.dropped(versions)

    # ------------------------------------------------------------------ actions -> Ray
    def submit(self, action: Action) -> None:
        payload = None
        if isinstance(action, Generate):
            from ..tasks import base_prompt_id

            prompts = [(pid, self.prompt_tokens[base_prompt_id(pid)]) for pid in action.prompt_ids]
            seed = zlib.crc32(f"{self.seed}/{action.minibatch_id}/{action.version}".encode())
            ref, payload = self.generators[action.actor].generate.options(num_returns=2).remote(
                action.minibatch_id, prompts, seed)
        elif isinstance(action, LoadWeights):
            handle = self.store.acquire(action.version, f"gen-{action.actor}")
            ref = self.transport.load(action.actor, action.version, handle)
        elif isinstance(action, TrainStep):
            refs = list({id(self.queue_refs[p]): self.queue_refs[p] for p in action.prompt_ids}.values())
            ref, *others = [t.train_step.remote(action.step, list(action.prompt_ids), *refs) for t in self.trainers]
            self._companions(ref, others)
        elif isinstance(action, Publish):
            ref, others = self.transport.publish(action.version, self.store.kept_versions)
            self._companions(ref, others)
        elif isinstance(action, Prefetch):
            handle = self.store.acquire(action.version, _prefetcher(action.actor))
            ref = self.transport.prefetch(action.actor, action.version, handle)
        elif isinstance(action, AwaitActor):
            ref = self._probe(action.actor)
        elif isinstance(action, Checkpoint):
            self._ready.append(self._checkpoint(action))
            return
        else:
            raise TypeError(f"RayCluster cannot run {action!r}")
        self.inflight[ref] = (action, payload)

    def _checkpoint(self, action: Checkpoint) -> Event:
        """Write the checkpoint now; its event (``info``: the directory, or for a failure
        the error, an actor's ``OSError`` unwrapped from Ray's task error)."""
        if self.write_checkpoint is None:
            return Failed(action, "this cluster was given no checkpoint writer")
        try:
            return Done(action, self.write_checkpoint(action, self.now()))
        except Exception as error:  # noqa: BLE001 - any failure to write ends the run with its cause
            return Failed(action, _describe(error), info=os_error_of(error))

    def _probe(self, actor: int):
        """A call Ray runs once ``actor`` is alive again (or fails once it never will)."""
        return self.generators[actor].weight_version.remote()

    def _companions(self, ref, others: list) -> None:
        if others:
            self.companions[ref] = list(others)
            for other in others:
                self._companion_of[other] = ref

    # ------------------------------------------------------------------ Ray -> events
    def next_event(self) -> Event:
        import ray

        if self._ready:
            return self._ready.pop(0)
        while True:
            pending = [r for r in self.inflight if r not in self._waiting] + list(self._companion_of)
            with self.waiting():
                ref = ray.wait(pending, num_returns=1, fetch_local=False)[0][0]
            if ref in self._companion_of:   # another trainer rank ended
                primary = self._companion_of.pop(ref)
                self.companions[primary].remove(ref)
                try:
                    ray.get(ref)
                except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as error:
                    return self._fail_together(primary, error)
                if not self.companions[primary]:
                    del self.companions[primary]
                    if primary in self._waiting:
                        self._waiting.discard(primary)
                        return self._to_event(primary)
                continue
            if ref in self.companions:      # rank 0 ended first: a failure ends the action now
                action, _ = self.inflight[ref]
                try:
                    ray.get(ref)   # a step's report or a publish's receipt: small
                except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as error:
                    return self._fail_together(ref, error)
                self._waiting.add(ref)
                continue
            event = self._to_event(ref)
            if event is not None:
                return event

    def _fail_together(self, primary, error) -> Event:
        """A trainer rank failed: the action fails now (the other ranks' calls are abandoned)."""
        action, _ = self.inflight.pop(primary)
        self._waiting.discard(primary)
        for other in self.companions.pop(primary, []):
            self._companion_of.pop(other, None)
        return Failed(action, _describe(error))

    def _to_event(self, ref) -> Event | None:
        """The event of ``ref``, or None when it ended in nothing to report (a restart
        probe that found the actor still unreachable was sent again)."""
        import ray

        action, payload = self.inflight.pop(ref)
        if isinstance(action, AwaitActor):
            try:
                return Done(action, int(ray.get(ref)))
            except ray.exceptions.ActorUnavailableError:   # restarting still, or restarted and died again
                self.inflight[self._probe(action.actor)] = (action, None)
                return None
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as error:
                return Failed(action, _describe(error), lost=True)
        if isinstance(action, Publish):
            try:   # every transport's receipt is fetched: a failed export is a failed publish
                handle = self.transport.published(action.version, ref)
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as error:
                return Failed(action, _describe(error))
            self._drop(self.store.publish(action.version, handle))
            return Done(action)
        if isinstance(action, Prefetch):
            return self._prefetch_event(action, ref)
        try:
            report = ray.get(ref)
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as error:
            if isinstance(action, LoadWeights):
                self.transport.load_ended(action.actor, action.version, False)
                self._drop(self.store.release(action.version, f"gen-{action.actor}"))
            return Failed(action, _describe(error), lost=process_died(error))
        if isinstance(action, Generate):
            mismatch = restarted_version_mismatch(action.actor, action.version, report.version)
            if mismatch is not None:
                return Failed(action, mismatch, info=report, lost=True)
            for pid in action.prompt_ids:
                self.queue_refs[pid] = payload
            # The groups' rewards, scored on the rollout side: the core's reject rule reads them.
            return Done(action, report, rewards=report.rewards)
        elif isinstance(action, LoadWeights):
            self.transport.load_ended(action.actor, action.version, True)
            self._drop(self.store.release(action.version, f"gen-{action.actor}"))
        elif isinstance(action, TrainStep):
            for pid in action.prompt_ids:
                self.queue_refs.pop(pid, None)
        return Done(action, report)

    def _prefetch_event(self, action: Prefetch, ref) -> Event:
        """A prefetch's end: the receiving side's result says whether every bucket arrived."""
        import ray

        try:
            report = ray.get(ref)
            error, lost = (None if report["ok"] else report["error"]), False
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as raised:
            report, error, lost = None, _describe(raised), process_died(raised)
        self._prefetch_ended(action, error is None)
        return Done(action, report) if error is None else Failed(action, error, lost=lost)

    def _prefetch_ended(self, action: Prefetch, ok: bool) -> None:
        self.transport.prefetch_ended(action.actor, action.version, ok)
        self._drop(self.store.release(action.version, _prefetcher(action.actor)))

    def release(self, prompt_ids: Sequence[str]) -> None:
        """Forget the payload references of these groups (rejected by the core): a
        minibatch's payload leaves the object store once no group of it is referenced."""
        for pid in prompt_ids:
            self.queue_refs.pop(pid, None)

    def cancel(self, actions: Sequence[Action]) -> None:
        import ray

        doomed = set(actions)
        self._ready = [e for e in self._ready if e.action not in doomed]
        for ref, (action, _) in list(self.inflight.items()):
            if action in doomed:
                del self.inflight[ref]
                self._waiting.discard(ref)
                for other in self.companions.pop(ref, []):
                    self._companion_of.pop(other, None)
                if isinstance(action, LoadWeights):
                    self.transport.load_ended(action.actor, action.version, False)
                    self._drop(self.store.release(action.version, f"gen-{action.actor}"))
                if isinstance(action, Prefetch):
                    self._prefetch_ended(action, False)
                try:
                    ray.cancel(ref)
                except Exception:  # noqa: BLE001 - cancelling is best effort; the actor dies with the run
                    pass


class RejectedPayloads(Observer):
    """The loop's observer that hands the groups the core rejected (dynamic sampling) to
    ``cluster.release``, so their samples do not stay in the object store all run."""

    def __init__(self, cluster: RayCluster) -> None:
        self.cluster, self.seen = cluster, 0

    def observed(self, event, core, t: float) -> None:
        new = core.rejected_ids(self.seen)
        if new:
            self.cluster.release(new)
            self.seen += len(new)
