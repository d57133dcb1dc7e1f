"""The one loop over :class:`~mindspeed_rl_asp.control.core.ControlCore`.

Every driver runs this loop: the Ray runtime (``runtime/ray_cluster.RayCluster``, wall
clock), the discrete-event simulator (``sim/cluster.SimCluster``, virtual clock), the
property tests and the overhead benchmark (``control/clusters.py``). A *cluster* turns
actions into work and work into events and owns the clock; it holds no control rule::

    class Cluster(Protocol):
        def now(self) -> float                      # seconds on the cluster's clock
        def submit(self, action) -> None            # start Generate/LoadWeights/TrainStep/Publish/...
        def next_event(self) -> Done | Failed       # block until one submitted action ends
        def cancel(self, actions) -> None           # drop work still running at Finish

One iteration: poll the core and submit what it issued; if it said ``Finish``, settle
the work still in flight (``cancel`` or ``drain``, as ``ControlConfig.at_finish`` says)
and stop; else take the next event, report it to the core, tell the observer. A core
that issues nothing while nothing is in flight is deadlocked: ``ControlDeadlock``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, Union

from .core import (Action, AwaitActor, Checkpoint, ControlCore, Finish, Generate, LoadWeights, Prefetch, Publish,
                   TrainStep)

__all__ = ["Done", "Failed", "Event", "Cluster", "Observer", "Fanout", "Outcome", "Loop", "drive",
           "apply_event", "TrainerFailed", "CheckpointFailed", "ControlDeadlock"]


@dataclass(frozen=True)
class Done:
    """``action`` completed; ``info`` is the cluster's report of it (timing, lengths...),
    passed to the observer untouched. ``rewards``, for a ``Generate``: prompt id -> the
    filter metric of each of its samples, which the core's reject rule reads
    (``ControlConfig.filter_groups``; None when the cluster does not score)."""

    action: Action
    info: Any = None
    rewards: Optional[Mapping[str, Sequence[float]]] = None


@dataclass(frozen=True)
class Failed:
    """``action`` failed (its partial output, if any, is dropped); ``error`` says why.
    ``lost``: the actor's process died (killed, out of memory), as opposed to an error
    raised in it; for ``AwaitActor`` a failure always means the actor is gone for good."""

    action: Action
    error: str
    info: Any = None
    lost: bool = False


Event = Union[Done, Failed]


class TrainerFailed(RuntimeError):
    """The Training Unit failed a step or a publish: the run stops (what was written stays)."""


class CheckpointFailed(TrainerFailed):
    """A checkpoint could not be written (a full or read-only disk, a trainer rank that
    raised or died): the run stops, the previous checkpoint stays. ``cause``: what the
    cluster reported (``Failed.info``; an ``OSError`` for a disk error), so the command can
    print its one line."""

    def __init__(self, message: str, cause: Any = None) -> None:
        super().__init__(message)
        self.cause = cause


class ControlDeadlock(RuntimeError):
    """The core issued nothing while nothing was in flight: no event can ever arrive."""


class Cluster(Protocol):
    def now(self) -> float: ...

    def submit(self, action: Action) -> None: ...

    def next_event(self) -> Event: ...

    def cancel(self, actions: Sequence[Action]) -> None: ...


class Observer:
    """What the loop tells the world; every method is optional (this base does nothing).
    ``t`` is the cluster's clock, so a simulated run records the same timeline a real one does."""

    def submitted(self, action: Action, t: float) -> None: ...

    def observed(self, event: Event, core: ControlCore, t: float) -> None: ...

    def finished(self, outcome: "Outcome", core: ControlCore, t: float) -> None: ...


class Fanout(Observer):
    """Several observers as one (``None`` entries are skipped), called in order."""

    def __init__(self, *observers: Optional[Observer]) -> None:
        self.observers = [o for o in observers if o is not None]

    def submitted(self, action: Action, t: float) -> None:
        for o in self.observers:
            o.submitted(action, t)

    def observed(self, event: Event, core: ControlCore, t: float) -> None:
        for o in self.observers:
            o.observed(event, core, t)

    def finished(self, outcome: "Outcome", core: ControlCore, t: float) -> None:
        for o in self.observers:
            o.finished(outcome, core, t)


@dataclass
class Outcome:
    """How the run ended. ``at_finish`` is what was done with ``leftover`` (the work in
    flight at Finish): ``cancel`` or ``drain``; ``interrupted`` if the caller stopped the
    loop before Finish (then ``finish`` is None)."""

    finish: Optional[Finish]
    at_finish: str
    leftover: tuple[Action, ...] = ()
    events: int = 0
    end_time: float = 0.0
    interrupted: bool = False
    drained_events: list[Event] = field(default_factory=list)

    @property
    def leftover_minibatches(self) -> list[str]:
        return [a.minibatch_id for a in self.leftover if isinstance(a, Generate)]

    def summary(self) -> dict:
        """Plain data for summary.json."""
        return {"at_finish": self.at_finish, "interrupted": self.interrupted,
                "leftover_minibatches": self.leftover_minibatches,
                "leftover_loads": sum(isinstance(a, LoadWeights) for a in self.leftover),
                "events": self.events}


def apply_event(core: ControlCore, event: Event) -> None:
    """Report ``event`` to the core. A finished generation brings its rewards (the core
    rejects the groups its filter rule rejects) and its lengths (the re-plan rule's); a
    failed generation is re-dispatched by the core; a failed load is retried; a
    generation or load whose actor died (``Failed.lost``) marks the actor lost
    (restarting); ``AwaitActor`` done (``info``: the version the restarted actor holds)
    brings it back, failed retires it; a prefetch ends either way (failed or lost: the
    actor's load moves the version itself); a failed train step or publish raises
    ``TrainerFailed``, a failed checkpoint ``CheckpointFailed``."""
    a = event.action
    ok = isinstance(event, Done)
    if isinstance(a, (Generate, LoadWeights)) and not ok and event.lost:
        core.on_actor_lost(a.actor)
    elif isinstance(a, AwaitActor):
        if ok:
            core.on_actor_restarted(a.actor, event.info)
        else:
            core.on_actor_retired(a.actor)
    elif isinstance(a, Generate):
        if ok:
            # The report's ``lengths`` (any cluster's report has them, or None) feed the
            # core's re-plan rule; the rest of ``info`` is the observer's alone.
            core.on_generated(a.actor, a.minibatch_id, event.rewards, getattr(event.info, "lengths", None))
        else:
            core.on_minibatch_failed(a.actor, a.minibatch_id)
    elif isinstance(a, LoadWeights):
        (core.on_weights_loaded if ok else core.on_load_failed)(a.actor, a.version)
    elif isinstance(a, Prefetch):
        (core.on_prefetched if ok else core.on_prefetch_failed)(a.actor, a.version)
    elif isinstance(a, TrainStep):
        if not ok:
            raise TrainerFailed(f"training step {a.step} failed: {event.error}")
        core.on_train_step_done(a.step)
    elif isinstance(a, Publish):
        if not ok:
            raise TrainerFailed(f"publishing version {a.version} failed: {event.error}")
        core.on_published(a.version)
    elif isinstance(a, Checkpoint):
        if not ok:
            raise CheckpointFailed(f"checkpoint of version {a.version} failed: {event.error}", event.info)
        core.on_checkpointed(a.version)
    else:
        raise TypeError(f"no event is defined for {a!r}")


class Loop:
    """The loop, one iteration per ``advance()``; ``drive`` runs it to the end. Tests that
    pick the order of events step by step (hypothesis state machines) call ``advance``."""

    def __init__(self, core: ControlCore, cluster: Cluster, observer: Optional[Observer] = None) -> None:
        self.core, self.cluster = core, cluster
        self.observer = observer or Observer()
        self.outcome: Optional[Outcome] = None
        self.events = 0

    def advance(self) -> bool:
        """Submit what the core issues now, then wait for and apply one event. Returns
        False once the run has ended (``self.outcome`` says how)."""
        if self.outcome is not None:
            return False
        core, cluster = self.core, self.cluster
        for action in core.poll():
            if isinstance(action, Finish):
                self._end(action)
                return False
            cluster.submit(action)
            self.observer.submitted(action, cluster.now())
        if not core.in_flight():
            raise ControlDeadlock(f"control deadlock: nothing in flight and no action; {core.snapshot()}")
        self._deliver(cluster.next_event())
        return True

    def interrupt(self, finish_training: bool = False) -> Outcome:
        """Stop before Finish (Ctrl-C, SIGTERM): work in flight is cancelled. With
        ``finish_training`` a train step, publish or checkpoint in flight is waited for
        instead (the rest is cancelled first), and what the core's ``settle`` asks for
        runs: a step that finishes is published, so that it is recorded like any other
        step (the observer sees its ``Publish``), then (``save_every``) the trainer's
        version is checkpointed, so that the run resumes from there."""
        trainer_work = (TrainStep, Publish, Checkpoint)
        if finish_training:
            self._cancel(keep=trainer_work)
            while True:
                for action in self.core.settle():
                    self.cluster.submit(action)
                    self.observer.submitted(action, self.cluster.now())
                if not any(isinstance(a, trainer_work) for a in self.core.in_flight()):
                    break
                self._deliver(self.cluster.next_event())
        leftover = self._cancel()
        self.outcome = Outcome(None, "cancel", leftover, self.events, self.cluster.now(), interrupted=True)
        self.observer.finished(self.outcome, self.core, self.outcome.end_time)
        return self.outcome

    def _cancel(self, keep: tuple[type, ...] = ()) -> tuple[Action, ...]:
        """Cancel everything in flight on the cluster (but actions of the types ``keep``),
        and tell the core it ended unused (a cancelled generation counts as failed: its
        prompts are pending again, never lost; a cancelled load or prefetch too)."""
        leftover = tuple(a for a in self.core.in_flight() if not isinstance(a, keep))
        self.cluster.cancel(leftover)
        for action in leftover:
            if isinstance(action, (Generate, LoadWeights, Prefetch)):
                apply_event(self.core, Failed(action, "cancelled"))
        return leftover

    def _deliver(self, event: Event) -> None:
        apply_event(self.core, event)
        self.events += 1
        self.observer.observed(event, self.core, self.cluster.now())

    def _end(self, finish: Finish) -> None:
        policy = self.core.config.at_finish
        leftover = tuple(self.core.in_flight())
        drained: list[Event] = []
        if policy == "cancel":
            self._cancel()
        else:  # drain: wait for every piece of work; its samples are counted unused
            while self.core.in_flight():
                event = self.cluster.next_event()
                drained.append(event)
                self._deliver(event)
        self.outcome = Outcome(finish, policy, leftover, self.events, self.cluster.now(),
                               drained_events=drained)
        self.observer.finished(self.outcome, self.core, self.outcome.end_time)


def drive(core: ControlCore, cluster: Cluster, observer: Optional[Observer] = None,
          should_stop: Callable[[], bool] = lambda: False) -> Outcome:
    """Run the core on ``cluster`` until ``Finish`` (or until ``should_stop()`` is true,
    checked after every event: then the run is interrupted and in-flight work cancelled)."""
    loop = Loop(core, cluster, observer)
    while loop.advance():
        if should_stop():
            return loop.interrupt()
    return loop.outcome
