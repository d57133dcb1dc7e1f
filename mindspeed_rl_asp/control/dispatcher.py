"""Dispatcher and refresh policy: which minibatch goes to which actor, and when it reloads.

The dispatcher walks the plan in order. The next minibatch is a failed one awaiting
re-dispatch (lowest plan index first) if any, else the first never-dispatched one; it goes
to the idle actor with the lowest id. It never skips ahead: if the next minibatch may not
go now (admission, capacity, throttle: the core decides), nothing later goes either.

Invariants:

* Every plan minibatch is in exactly one place: not yet dispatched (``index >= cursor``),
  waiting for re-dispatch (``retries``), or assigned to exactly one generating actor, or
  done. So its prompts are never lost nor duplicated.
* A completion or failure is accepted only from the actor the minibatch is assigned to;
  anything else is a ``ProtocolError`` (the shell drops partial output of failed work).
* An actor is given work only while idle, and a weight load only while idle; a load never
  lowers its version; the version only changes when the load completes (``finish_load``)
  or when the actor comes back from a restart (``restarted``: it holds what its restarted
  process loaded, usually the starting checkpoint, version 0).
* Actor faults: a lost actor (its process died) releases what it held (a minibatch goes
  to ``retries``, a load is dropped) and is ``RESTARTING`` until the shell reports it back
  (``restarted``) or gone for good (``retire``); neither status is ever given work.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional, Sequence

__all__ = ["ProtocolError", "PlannedMinibatch", "ActorStatus", "ActorState", "Dispatcher",
           "minibatches_from_plan", "as_minibatches"]


class ProtocolError(RuntimeError):
    """An event that contradicts the core's state (e.g. a completion for work not assigned)."""


@dataclass(frozen=True)
class PlannedMinibatch:
    minibatch_id: str
    prompt_ids: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.prompt_ids)


def minibatches_from_plan(plan: Any) -> list[PlannedMinibatch]:
    """Flatten a ``schedule.plan.SchedulePlan`` (``plan.groups[g][m].ids``) in dispatch
    order; minibatch ids are ``"g{g}m{m}"``. Duck-typed: only ``groups`` and ``ids`` are read."""
    return [PlannedMinibatch(f"g{g}m{m}", tuple(mb.ids))
            for g, group in enumerate(plan.groups) for m, mb in enumerate(group)]


def as_minibatches(minibatches: Any) -> list[PlannedMinibatch]:
    """Accept a plan (anything with ``groups``), or a sequence of ``PlannedMinibatch`` or
    ``(minibatch_id, prompt_ids)`` pairs."""
    if hasattr(minibatches, "groups"):
        return minibatches_from_plan(minibatches)
    out = []
    for k, mb in enumerate(minibatches):
        if isinstance(mb, PlannedMinibatch):
            out.append(mb)
            continue
        try:
            mb_id, ids = mb
        except (TypeError, ValueError):
            raise ValueError(f"minibatch {k} is {mb!r}, expected (minibatch_id, prompt_ids)") from None
        if isinstance(ids, str):
            raise ValueError(f"minibatch {mb_id!r}: prompt_ids must be a sequence of ids, not a str")
        out.append(PlannedMinibatch(str(mb_id), tuple(ids)))
    return out


class ActorStatus(str, Enum):
    IDLE = "idle"
    LOADING = "loading"
    GENERATING = "generating"
    RESTARTING = "restarting"   # its process died; Ray is bringing it back (or cannot)
    RETIRED = "retired"         # gone for good: never given work again


@dataclass
class ActorState:
    """``version`` is the weight version the actor holds (and generates with)."""

    actor: int
    version: int
    status: ActorStatus = ActorStatus.IDLE
    minibatch: Optional[int] = None       # plan index while GENERATING
    loading: Optional[int] = None         # target version while LOADING


class Dispatcher:
    """Plan walk, retries and per-actor state; see the module docstring for invariants."""

    def __init__(self, minibatches: Sequence[PlannedMinibatch], num_actors: int,
                 initial_version: int = 0) -> None:
        self.minibatches = tuple(minibatches)
        self.index_of = {mb.minibatch_id: k for k, mb in enumerate(self.minibatches)}
        self.actors = [ActorState(a, initial_version) for a in range(num_actors)]
        self.cursor = 0                   # first never-dispatched plan index
        self.retries: list[int] = []      # failed plan indices, sorted
        self.done: set[int] = set()

    # ------------------------------------------------------------------ queries
    def peek(self) -> Optional[tuple[int, bool]]:
        """(plan index, is_retry) of the minibatch to dispatch next, or None."""
        if self.retries:
            return self.retries[0], True
        if self.cursor < len(self.minibatches):
            return self.cursor, False
        return None

    def idle_actors(self) -> list[int]:
        return [a.actor for a in self.actors if a.status is ActorStatus.IDLE]

    def busy(self) -> bool:
        """Some actor is generating, loading, or restarting (a restarting actor is loading
        its checkpoint onto its devices; a retired one holds nothing)."""
        return any(a.status not in (ActorStatus.IDLE, ActorStatus.RETIRED) for a in self.actors)

    def live_actors(self) -> list[int]:
        """Actors that are not retired (restarting ones included: they come back)."""
        return [a.actor for a in self.actors if a.status is not ActorStatus.RETIRED]

    def restarting_actors(self) -> list[int]:
        return [a.actor for a in self.actors if a.status is ActorStatus.RESTARTING]

    def running(self) -> list[tuple[int, int]]:
        """(actor, plan index) of every minibatch being generated, by actor id."""
        return [(a.actor, a.minibatch) for a in self.actors if a.status is ActorStatus.GENERATING]

    def needs_refresh(self, actor: int, target: int) -> bool:
        """Refresh policy: an idle actor behind the refresh target should load it."""
        a = self.actors[actor]
        return a.status is ActorStatus.IDLE and a.version < target

    # ------------------------------------------------------------------ transitions
    def assign(self, actor: int) -> int:
        """Give the next minibatch (``peek``) to idle ``actor``; returns its plan index."""
        a = self._actor(actor)
        nxt = self.peek()
        if a.status is not ActorStatus.IDLE or nxt is None:
            raise ProtocolError(f"cannot assign to actor {actor} ({a.status.value}); next={nxt}")
        index, retry = nxt
        if retry:
            self.retries.pop(0)
        else:
            self.cursor += 1
        a.status, a.minibatch = ActorStatus.GENERATING, index
        return index

    def complete(self, actor: int, minibatch_id: str) -> int:
        index = self._release(actor, minibatch_id, "completion")
        self.done.add(index)
        return index

    def fail(self, actor: int, minibatch_id: str) -> int:
        index = self._release(actor, minibatch_id, "failure")
        bisect.insort(self.retries, index)
        return index

    def replace_pending(self, minibatches: Sequence[PlannedMinibatch]) -> None:
        """Swap the never-dispatched minibatches (plan indices ``>= cursor``) for
        ``minibatches``. Dispatched ones (running, done, awaiting retry) keep their plan
        indices, so ``retries``, ``done`` and every actor's ``minibatch`` stay valid. The
        core checks first that the new ones hold exactly the prompts they replace."""
        self.minibatches = self.minibatches[:self.cursor] + tuple(minibatches)
        self.index_of = {mb.minibatch_id: k for k, mb in enumerate(self.minibatches)}

    def start_load(self, actor: int, version: int) -> None:
        a = self._actor(actor)
        if a.status is not ActorStatus.IDLE or version <= a.version:
            raise ProtocolError(f"actor {actor} ({a.status.value}, version {a.version}) cannot load {version}")
        a.status, a.loading = ActorStatus.LOADING, version

    def finish_load(self, actor: int, version: int) -> None:
        a = self._loading(actor, version, "loaded")
        a.status, a.version, a.loading = ActorStatus.IDLE, version, None

    def abort_load(self, actor: int, version: int) -> None:
        """The load failed: the actor is idle with the weights it had."""
        a = self._loading(actor, version, "failed to load")
        a.status, a.loading = ActorStatus.IDLE, None

    def lose(self, actor: int) -> Optional[int]:
        """``actor``'s process died: the minibatch it generated (returned: its plan index)
        waits for re-dispatch, a load it ran is dropped, and it is ``RESTARTING``."""
        a = self._actor(actor)
        if a.status in (ActorStatus.RESTARTING, ActorStatus.RETIRED):
            raise ProtocolError(f"actor {actor} reported lost, but it is already {a.status.value}")
        index = a.minibatch
        if index is not None:
            bisect.insort(self.retries, index)
        a.status, a.minibatch, a.loading = ActorStatus.RESTARTING, None, None
        return index

    def restarted(self, actor: int, version: int) -> None:
        """``actor`` is back after a restart, holding ``version`` (what its new process
        loaded); idle, so the refresh policy brings it up to date before it generates."""
        a = self._actor(actor)
        if a.status is not ActorStatus.RESTARTING:
            raise ProtocolError(f"actor {actor} reported restarted, but it is {a.status.value}, not restarting")
        a.status, a.version = ActorStatus.IDLE, version

    def retire(self, actor: int) -> None:
        """``actor`` will not come back (its restarts are spent): never given work again."""
        a = self._actor(actor)
        if a.status is not ActorStatus.RESTARTING:
            raise ProtocolError(f"actor {actor} reported retired, but it is {a.status.value}, not restarting "
                                "(report it lost first)")
        a.status = ActorStatus.RETIRED

    def _loading(self, actor: int, version: int, what: str) -> ActorState:
        a = self._actor(actor)
        if a.status is not ActorStatus.LOADING or a.loading != version:
            raise ProtocolError(f"actor {actor} reported weights {version} {what} but it is "
                                f"{a.status.value} (loading {a.loading})")
        return a

    # ------------------------------------------------------------------ helpers
    def _actor(self, actor: int) -> ActorState:
        if not isinstance(actor, int) or not 0 <= actor < len(self.actors):
            raise ProtocolError(f"unknown actor {actor!r}; actors are 0..{len(self.actors) - 1}")
        return self.actors[actor]

    def _release(self, actor: int, minibatch_id: str, what: str) -> int:
        a = self._actor(actor)
        index = self.index_of.get(minibatch_id)
        if index is None:
            raise ProtocolError(f"{what} of unknown minibatch {minibatch_id!r} from actor {actor}")
        if a.status is not ActorStatus.GENERATING or a.minibatch != index:
            held = self.minibatches[a.minibatch].minibatch_id if a.minibatch is not None else None
            raise ProtocolError(f"{what} of minibatch {minibatch_id!r} from actor {actor}, "
                                f"which is {a.status.value} (holding {held!r})")
        a.status, a.minibatch = ActorStatus.IDLE, None
        return index
