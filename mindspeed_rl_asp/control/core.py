"""``ControlCore``: the one state machine of the Control Unit (events in, actions out).

Pure and deterministic: no Ray, torch, clock, threads or I/O. The Ray runtime and the
discrete-event simulator drive this same object through the one loop,
:func:`mindspeed_rl_asp.control.loop.drive`::

    for action in core.poll():              # decide and mark issued
        cluster.submit(action)              # Generate / LoadWeights / TrainStep / Publish
    event = cluster.next_event()            # then report it:
    # core.on_generated(actor, mb_id, rewards, lengths) | core.on_minibatch_failed(actor, mb_id)
    # core.on_groups_rejected(prompt_ids)
    # core.on_weights_loaded(actor, v) | core.on_load_failed(actor, v)
    # core.on_train_step_done(step) | core.on_published(v)
    # core.on_checkpointed(v)
    # ... until poll() returns Finish (after the last version is published).

The shell keeps the samples (keyed by prompt id); the core tracks ids, counts, versions,
and every piece of work in flight (``in_flight()``), so the loop needs no state of its own.

Rules (proofs in docs/control.md):

* Dispatch (``dispatcher``): plan order, failed minibatches first, idle actor with lowest
  id; a new minibatch needs the throttle off (``queue``), room in the queue for its samples
  counting in-flight work, and staleness admission (``staleness``) for the version it will
  be generated with. A throttle never starves the trainer: it is ignored while queued plus
  running prompts are fewer than one step needs. No dispatch once the prompts admitted
  cover every step (``total_steps * global_batch_size``).
* Refresh (``refresh="rolling"``, ASP): an idle actor behind the refresh target loads it
  before it generates again (only while there is work to give); so every Generate
  carries the target version. No global pause: the other actors keep going. The target
  is the newest published version that is a multiple of ``refresh_interval`` (1: the
  newest). ``refresh="global"`` (verl's fully-async trainer): when the target moves, no
  actor starts new work until every actor holds it: running minibatches drain, then all
  load, then all resume.
* Publish: after step ``s`` is done the core issues ``Publish(s + 1)``; step ``s + 1``
  waits for its ``on_published``. ``Finish`` comes only once the last version is published.
* Trainer: step ``s`` starts once version ``s`` is published, ``global_batch_size`` prompt
  groups are queued, and the oldest of them pass the staleness deadline check; else it
  waits. Finished work is never discarded.
* ``colocated`` (hybrid): no Generate or LoadWeights while a TrainStep or a Publish (the
  train -> generate switch) runs, no TrainStep while an actor generates or loads; once a
  step is ready no new generation starts, so the step gets the devices as soon as running
  generation drains.
* Actor faults (``on_actor_lost``): an actor whose process died releases what it held
  (its minibatch is re-dispatched first, as a failed one) and is ``restarting``: the core
  issues ``AwaitActor`` for it and gives it nothing until the shell reports it back
  (``on_actor_restarted(actor, version)``: it holds ``version``, what its new process
  loaded, and is refreshed before it generates) or gone (``on_actor_retired``: never
  given work again; the run goes on with the others). With every actor retired and no
  step able to run, ``poll`` raises ``ActorsExhausted`` (never a silent deadlock).
* Re-plan (``replan.py``, ``scheduler.refit``): given an ``EpochReplan``, the core
  records the lengths finished minibatches report and, just before the first minibatch
  of an epoch ``e >= 1`` would be dispatched, asks its planning function for that
  epoch's minibatches from the lengths observed so far; they replace the epoch's
  pending ones (``replan_pending``: same prompts, taken only if the whole plan still
  passes the window rule), and ``replans`` records what happened.
* Reject (``filter_groups="std"``, DAPO's dynamic sampling): a finished group whose
  rewards (carried by its generation report) have no spread is rejected by the pure rule
  of ``rejection.py`` (``on_generated(..., rewards)``; ``on_groups_rejected`` for a queued
  group): it leaves the queue, gives back its queue room and its admission, and is
  counted; dispatch goes on until every step has ``global_batch_size`` accepted groups.
  When the plan runs out, ``refill(k)`` (the shell's next pass over the data) extends it.
  A minibatch that cannot go whole while nothing is in flight is split to what admission
  and queue room allow (so rejection can never deadlock; with ``filter_groups`` on the
  plan's window rule is not needed, and not checked). A step that would need more
  than ``max_gen_batches`` generation batches of ``global_batch_size`` prompts (more than
  ``(max_gen_batches - 1) x global_batch_size`` groups rejected for it) stops the run
  (``TooManyRejected``), as MindSpeed-RL's DAPO trainer does.
* Prefetch (``prefetch``, a transport that moves a version ahead of its load: the
  collective one with ``weights.prefetch``): while work remains, a live actor behind the
  refresh target that is not loading gets ``Prefetch(actor, target)`` (the transfer
  only: its engine keeps generating with its version), at most one at a time per actor
  and at most once per (actor, version), whatever its outcome. No ``LoadWeights`` and no
  ``Generate`` go to an actor while its prefetch runs: the load that follows a finished
  prefetch only swaps, and one that follows a failed prefetch moves the version itself
  (the usual load), so a failed prefetch costs time, never the run.
* Checkpoint (``save_every=K``): once version ``v`` is published and ``v % K == 0``
  the core issues ``Checkpoint(v)`` (the trainer's state and the control state at ``v``);
  no step starts while it runs (the trainer ranks write it), and ``Finish`` waits for it.
  An interrupted run's shell asks :meth:`ControlCore.settle`: it publishes a trained
  version not yet published, then checkpoints the trainer's version once. No version is
  checkpointed twice; a resumed core's start version counts as checkpointed (it was
  loaded from one). A failed checkpoint stops the run (the loop's ``CheckpointFailed``).
* Resume (``start_version=v``): the core starts where a checkpoint of version ``v`` left
  off: trainer, published and actor versions are ``v``, and admission counts the ``v x
  global_batch_size`` prompts the earlier segments consumed, so every version, step,
  deadline and age is the run's own; ``total_steps`` is the run's, the plan covers the
  steps from ``v`` on.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence, Union

from .policy_age import age_histogram, merge_age_histograms
from .dispatcher import (Dispatcher, PlannedMinibatch, ProtocolError, as_minibatches,
                         minibatches_from_plan)
from .queue import QueuedGroup, TrainingQueue
from .rejection import FILTERS, rejected_groups
from .replan import EpochReplan, ReplanRecord, epoch_run, lengths_by_prompt
from .staleness import StalenessControl, first_window_gap

__all__ = ["ControlConfig", "ControlCore", "Generate", "LoadWeights", "TrainStep", "Publish", "Finish", "Action",
           "Prefetch",
           "Checkpoint",
           "is_colocated", "REFRESH_POLICIES", "AT_FINISH",
           "ActorSnapshot", "Snapshot", "Ledger", "ProtocolError", "PlannedMinibatch",
           "AwaitActor", "ActorsExhausted", "TooManyRejected",
           "minibatches_from_plan"]


REFRESH_POLICIES = ("rolling", "global")
AT_FINISH = ("cancel", "drain")


def _check_int(problems: list[str], name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{name}={value!r} must be an int")
    elif value < minimum:
        problems.append(f"{name}={value} must be >= {minimum}")


@dataclass(frozen=True)
class ControlConfig:
    """Control knobs; names follow ``RootConfig`` (``rl.*``, ``mode.*``).

    ``global_batch_size`` counts prompts per training step; ``queue_capacity`` counts
    samples (prompts x ``n_samples_per_prompt``); watermarks are fractions of capacity.
    ``total_steps=None`` runs every full step the plan can fill (``prompts // batch``).
    ``colocated``: generation and training share devices and never overlap (hybrid).
    ``refresh``: ``rolling`` (each actor refreshes between its own minibatches) or
    ``global`` (all actors pause and refresh together), every ``refresh_interval`` versions.
    ``at_finish``: what the loop does with work still running at ``Finish``: ``cancel``
    it or ``drain`` it (wait for it; its samples are reported unused).
    ``filter_groups``: ``none`` or ``std`` (DAPO's dynamic sampling: ``rejection.py``);
    ``max_gen_batches`` (``algo.max_num_gen_batches``, MindSpeed-RL's
    ``filter_groups_max_batches``): the most generation batches of ``global_batch_size``
    prompts one step may take, the first included: the run stops once more than
    ``(max_gen_batches - 1) x global_batch_size`` groups are rejected for one step
    (0: no limit).
    ``prefetch``: the weight transport can move a published version to an actor ahead of
    its load (``Prefetch``; the collective transport with ``weights.prefetch``).
    ``save_every``: checkpoint every that many versions (0: only at an interrupt, when
    the shell asks: never, for a shell that does not); ``start_version``: the version a
    resumed run starts at (its checkpoint's; 0 for a new run); ``total_steps`` counts
    from 0 either way.
    Plan-independent checks run here; ``ControlCore`` checks the rest against the plan.
    """

    num_actors: int
    global_batch_size: int
    n_samples_per_prompt: int
    max_staleness: int
    queue_capacity: int
    high_watermark: float = 0.75
    low_watermark: float = 0.25
    total_steps: Optional[int] = None
    colocated: bool = False
    refresh: str = "rolling"
    refresh_interval: int = 1
    at_finish: str = "cancel"
    filter_groups: str = "none"
    max_gen_batches: int = 0
    prefetch: bool = False
    save_every: int = 0
    start_version: int = 0

    def __post_init__(self) -> None:
        p: list[str] = []
        _check_int(p, "num_actors", self.num_actors, 1)
        _check_int(p, "global_batch_size", self.global_batch_size, 1)
        _check_int(p, "n_samples_per_prompt", self.n_samples_per_prompt, 1)
        _check_int(p, "max_staleness", self.max_staleness, 0)
        _check_int(p, "queue_capacity", self.queue_capacity, 1)
        if self.total_steps is not None:
            _check_int(p, "total_steps", self.total_steps, 1)
        _check_int(p, "refresh_interval", self.refresh_interval, 1)
        if self.refresh not in REFRESH_POLICIES:
            p.append(f"refresh={self.refresh!r} must be one of {', '.join(REFRESH_POLICIES)}")
        if self.at_finish not in AT_FINISH:
            p.append(f"at_finish={self.at_finish!r} must be one of {', '.join(AT_FINISH)}")
        if self.filter_groups not in FILTERS:
            p.append(f"filter_groups={self.filter_groups!r} must be one of {', '.join(FILTERS)}")
        _check_int(p, "max_gen_batches", self.max_gen_batches, 0)
        if not isinstance(self.prefetch, bool):
            p.append(f"prefetch={self.prefetch!r} must be a bool")
        _check_int(p, "save_every", self.save_every, 0)
        _check_int(p, "start_version", self.start_version, 0)
        if not p and self.total_steps is not None and self.start_version >= self.total_steps:
            p.append(f"start_version={self.start_version} leaves nothing to train: total_steps="
                     f"{self.total_steps}; resume with more steps, or start a new run")
        if not p and self.max_staleness < self.refresh_interval - 1:
            p.append(f"max_staleness={self.max_staleness} is below refresh_interval - 1 = "
                     f"{self.refresh_interval - 1}: actors keep their weights for refresh_interval "
                     f"steps, so their samples age that much; raise max_staleness or lower refresh_interval")
        if not 0.0 <= self.low_watermark <= self.high_watermark <= 1.0:
            p.append(f"watermarks must satisfy 0 <= low_watermark ({self.low_watermark}) <= "
                     f"high_watermark ({self.high_watermark}) <= 1")
        if not p and self.queue_capacity < self.step_samples:
            p.append(f"queue_capacity={self.queue_capacity} samples cannot hold one step: "
                     f"global_batch_size={self.global_batch_size} x n_samples_per_prompt="
                     f"{self.n_samples_per_prompt} = {self.step_samples}")
        if p:
            raise ValueError("invalid control config: " + "; ".join(p))

    @property
    def step_samples(self) -> int:
        return self.global_batch_size * self.n_samples_per_prompt

    @classmethod
    def from_root(cls, cfg: Any, num_actors: int, total_steps: Optional[int] = None,
                  start_version: int = 0) -> "ControlConfig":
        """From a ``RootConfig``: ``rl`` batch geometry, ``mode`` knobs, ``steps``,
        ``save_every``; colocated as :func:`is_colocated` says; ``prefetch`` as
        :func:`prefetches` says."""
        mode, rl = cfg.mode, cfg.rl
        algo = getattr(cfg, "algo", None)
        return cls(num_actors=num_actors, global_batch_size=rl.global_batch_size,
                   n_samples_per_prompt=rl.n_samples_per_prompt, max_staleness=mode.max_staleness,
                   queue_capacity=mode.queue_capacity, high_watermark=mode.high_watermark,
                   low_watermark=mode.low_watermark,
                   total_steps=cfg.steps if total_steps is None else total_steps,
                   colocated=is_colocated(mode), refresh=getattr(mode, "refresh", "rolling"),
                   refresh_interval=getattr(mode, "refresh_interval", 1),
                   at_finish=getattr(mode, "at_finish", "cancel"),
                   filter_groups=getattr(algo, "filter_groups", "none"),
                   max_gen_batches=getattr(algo, "max_num_gen_batches", 0),
                   prefetch=prefetches(cfg), save_every=getattr(cfg, "save_every", 0),
                   start_version=start_version)


def is_colocated(mode: Any) -> bool:
    """The one predicate for "generation and training share the devices": ``mode=hybrid``.
    (A hybrid run also has ``max_staleness=0``, which the planner needs; the converse does
    not hold: an async run may choose ``max_staleness=0`` on separate devices.)"""
    return mode.name == "hybrid"


def prefetches(cfg: Any) -> bool:
    """Whether a run's actors get ``Prefetch``: the collective transport with
    ``weights.prefetch``, in a decoupled mode (colocated, every actor is idle when a version
    is published, so its load moves the bytes itself)."""
    weights = getattr(cfg, "weights", None)
    return bool(getattr(weights, "transport", None) == "collective" and getattr(weights, "prefetch", False)
                and not is_colocated(cfg.mode))


# ---------------------------------------------------------------------- actions
@dataclass(frozen=True)
class Generate:
    """Generate ``n_samples_per_prompt`` samples for each prompt with weights ``version``."""

    actor: int
    minibatch_id: str
    prompt_ids: tuple[str, ...]
    version: int


@dataclass(frozen=True)
class LoadWeights:
    actor: int
    version: int


@dataclass(frozen=True)
class Prefetch:
    """Move published ``version`` to ``actor`` ahead of its load (the transfer only; the
    actor keeps generating with the version it holds). A ``LoadWeights`` of it that
    follows only swaps it in."""

    actor: int
    version: int


@dataclass(frozen=True)
class TrainStep:
    """Train ``step`` (version ``step`` -> ``step + 1``) on these prompt groups;
    ``versions[i]`` is the behaviour version of ``prompt_ids[i]`` (age = step - version)."""

    step: int
    prompt_ids: tuple[str, ...]
    versions: tuple[int, ...]


@dataclass(frozen=True)
class Publish:
    """Export the trainer's weights ``version`` and publish them atomically for actors."""

    version: int


@dataclass(frozen=True)
class Checkpoint:
    """Save the run at ``version`` atomically: the trainer's weights and optimizer, and the
    control state the core holds then: ``consumed`` (the prompt ids this core trained, in
    order), ``minibatches`` (its dispatch list, ``(minibatch id, prompt ids)``) and
    ``ages`` (its policy-age histogram, ``(age, prompt groups)`` pairs). Plain data, so
    the shell writes it without asking the core again."""

    version: int
    consumed: tuple[str, ...] = ()
    minibatches: tuple[tuple[str, tuple[str, ...]], ...] = ()
    ages: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Finish:
    """All ``steps`` are trained and the last version is published. Prompts never
    trained on, by reason: ``not_dispatched``: beyond what ``steps`` need (incl. the last
    ``prompts % batch``); ``queued``: generated, but the last minibatch overshot the final
    step; ``running``: still generating at the end (overshoot too): the loop cancels or
    drains that work, as ``ControlConfig.at_finish`` says. ``rejected``: generated and
    rejected by ``filter_groups`` (dynamic sampling), in the order they were rejected."""

    steps: int
    not_dispatched: tuple[str, ...] = ()
    queued: tuple[str, ...] = ()
    running: tuple[str, ...] = ()
    rejected: tuple[str, ...] = ()


@dataclass(frozen=True)
class AwaitActor:
    """``actor``'s process died: tell the core when it is back (``Done``, with the weight
    version its new process holds) or gone for good (``Failed``: it is retired)."""

    actor: int


class ActorsExhausted(RuntimeError):
    """Every generation actor is retired and no step can run without more generation."""


class TooManyRejected(RuntimeError):
    """Dynamic sampling rejected more groups for one step than ``max_gen_batches``
    generation batches (``algo.max_num_gen_batches``) allow, or the prompts ran out."""


Action = Union[Generate, LoadWeights, TrainStep, Publish, Checkpoint, Finish, AwaitActor, Prefetch]


# ---------------------------------------------------------------------- snapshots
@dataclass(frozen=True)
class ActorSnapshot:
    actor: int
    status: str
    version: int
    minibatch_id: Optional[str]
    loading: Optional[int]


@dataclass(frozen=True)
class Snapshot:
    """Metrics view. ``trainer_wait`` says why no step runs: ``publish`` (version not yet
    published), ``queue`` (fewer than a batch queued), ``deadline`` (an older prompt is
    still running), ``colocated`` (generation still draining), ``checkpoint`` (the
    trainer writes a checkpoint), or None."""

    trainer_version: int
    published_version: int
    training_step: Optional[int]
    total_steps: int
    finished: bool
    trainer_wait: Optional[str]
    queued_prompts: int
    queued_samples: int
    in_flight_samples: int
    queue_capacity: int
    throttled: bool
    admitted_prompts: int
    consumed_prompts: int
    pending_minibatches: int
    retry_minibatches: int
    actors: tuple[ActorSnapshot, ...]
    age_histogram: dict[int, int] = field(default_factory=dict)     # age -> prompt groups
    outstanding_by_version: dict[int, int] = field(default_factory=dict)
    rejected_prompts: int = 0       # groups rejected by filter_groups, in all
    extra_minibatches: int = 0      # minibatches a run without rejections never dispatches, in all


@dataclass(frozen=True)
class Ledger:
    """Where every plan prompt is; the five sets partition the plan's prompts (the plan
    as extended by refills, ``ControlCore.refills``)."""

    pending: frozenset[str]
    running: frozenset[str]
    queued: frozenset[str]
    consumed: frozenset[str]
    rejected: frozenset[str] = frozenset()


# ---------------------------------------------------------------------- the core
class ControlCore:
    """Composes dispatcher, queue and staleness control; see the module docstring."""

    def __init__(self, config: ControlConfig, minibatches: Any, refill: Optional[Any] = None,
                 replan: Optional[EpochReplan] = None) -> None:
        """``refill(k)`` (k = 1, 2, ...): more minibatches (same forms as ``minibatches``;
        new prompt and minibatch ids) for when rejected groups used the plan up: the
        shell's next pass over the data. Called only then, in order, pure. ``replan``:
        the re-plan rule's planning function (``replan.py``; None: the plan is kept)."""
        self.config = config
        mbs = as_minibatches(minibatches)
        self.total_steps = _check_plan(config, mbs)
        start = config.start_version
        self.dispatcher = Dispatcher(mbs, config.num_actors, initial_version=start)
        self.queue = TrainingQueue(config.queue_capacity, config.n_samples_per_prompt,
                                   config.high_watermark, config.low_watermark)
        self.staleness = StalenessControl(config.max_staleness, config.global_batch_size,
                                          self.total_steps, start_version=start)
        self.trainer_version = start
        self.published_version = start
        self.training: Optional[TrainStep] = None
        self.publishing: Optional[int] = None      # version being exported, not yet published
        self.finished = False
        self.ages: Counter[int] = Counter()
        self._consumed: list[str] = []
        self._awaiting: set[int] = set()           # restarting actors with an AwaitActor issued
        self.refill = refill
        self.refills = 0                           # passes appended by refill
        self._rejected: list[str] = []
        self._rejected_for_step = 0                # rejected since the last step started
        # Prompts dispatched (first dispatches only), counting those of the steps before start.
        self._dispatched = start * config.global_batch_size
        self.extra_minibatches = 0                 # dispatched after _dispatched reached every step's need
        self.epoch_replan = replan
        self.replans: list[ReplanRecord] = []      # what the re-plan rule did, in order
        self.observed_lengths: dict[str, tuple[int, ...]] = {}   # prompt id -> its samples' lengths
        self._replanned: set[int] = set(replan.done) if replan is not None else set()
        self._prefetching: dict[int, int] = {}     # actor -> version of its Prefetch in flight
        self._prefetch_tried: dict[int, int] = {}  # actor -> newest version a Prefetch was issued for
        self.checkpointing: Optional[Checkpoint] = None   # issued, not yet reported
        # The newest version checkpointed (a resumed core's start: it was loaded from one).
        self.checkpointed: Optional[int] = start if start else None

    # ------------------------------------------------------------------ decide
    def poll(self) -> list[Action]:
        """Actions the state allows now; each is committed as issued, so a second call
        without an event in between returns []. ``[Finish]`` once the last step's version
        is published (work may still be in flight: see ``in_flight``); [] after that."""
        if self.finished:
            return []
        checkpoint = self._checkpoint_due()
        if checkpoint is None and self.checkpointing is None and self.published_version == self.total_steps:
            self.finished = True
            return [self._finish()]
        self._check_rejections()
        actions: list[Action] = [] if checkpoint is None else [checkpoint]
        publish = self.publish_due()
        if publish is not None:
            actions.append(publish)
        colocated = self.config.colocated
        batch = self._ready_batch()
        if batch is not None and not (colocated and self.dispatcher.busy()):
            actions.append(self._start_step(batch))
        trainer_busy = self.training is not None or self.publishing is not None or batch is not None \
            or self.checkpointing is not None
        if not (colocated and trainer_busy):
            actions.extend(self._feed_actors())
            actions.extend(self._prefetches())
        for actor in self.dispatcher.restarting_actors():
            if actor not in self._awaiting:
                self._awaiting.add(actor)
                actions.append(AwaitActor(actor))
        if not actions and not self.in_flight() and self.config.filter_groups != "none":
            if self._split_next():
                actions.extend(self._feed_actors())
            elif self._rejected and self.dispatcher.peek() is None and \
                    self.staleness.admitted < self.total_steps * self.config.global_batch_size:
                raise TooManyRejected(
                    f"the plan's prompts ran out: dynamic sampling rejected {len(self._rejected)} prompt groups "
                    f"and step {self.trainer_version} cannot be filled; the core was given no refill "
                    "(the next pass over the data) to take more prompts from")
        if not actions and not self.dispatcher.live_actors() and not self.in_flight():
            raise ActorsExhausted(
                f"every generation actor ({self.config.num_actors}) is retired, with "
                f"{self.trainer_version} of {self.total_steps} steps trained and "
                f"{self.queue.queued_prompts} prompts queued and no step able to run; the run cannot go "
                "on. Raise fault.actor_restarts, or find out why the actors die (their logs: out of memory?)")
        return actions

    def publish_due(self) -> Optional[Publish]:
        """The publish of a trained version not yet published (committed as issued, like
        ``poll``'s), or None. ``poll`` issues it after every step; an interrupted run's shell
        asks for it alone, so that a step that finished during the interrupt is published
        (and recorded) like any other."""
        if self.training is None and self.publishing is None and self.published_version < self.trainer_version:
            self.publishing = self.trainer_version
            return Publish(self.trainer_version)
        return None

    @property
    def refresh_target(self) -> int:
        """The version actors should generate with: the newest published multiple of
        ``refresh_interval`` (version 0, the starting checkpoint, counts)."""
        k = self.config.refresh_interval
        return self.published_version - self.published_version % k

    def _paused(self) -> bool:
        """``refresh="global"``: no new work while some actor lacks the refresh target."""
        target = self.refresh_target
        # Restarting and retired actors do not hold it up: a retired one never generates
        # again, a restarting one is refreshed before it does.
        live = [self.dispatcher.actors[k] for k in self.dispatcher.live_actors()
                if k not in self.dispatcher.restarting_actors()]
        return self.config.refresh == "global" and any(a.version < target for a in live)

    def _ready_batch(self) -> Optional[list[QueuedGroup]]:
        """The oldest ``global_batch_size`` queued groups if the next step may take them."""
        if self.training is not None or self.trainer_version >= self.total_steps:
            return None
        if self._trainer_wait() is not None:
            return None
        return self.queue.oldest(self.config.global_batch_size)

    def _trainer_wait(self) -> Optional[str]:
        if self.training is not None or self.trainer_version >= self.total_steps:
            return None
        if self.published_version != self.trainer_version:
            return "publish"
        if self.checkpointing is not None:
            return "checkpoint"
        batch = self.queue.oldest(self.config.global_batch_size)
        if len(batch) < self.config.global_batch_size:
            return "queue"
        if not self.staleness.feasible(self.trainer_version, [g.version for g in batch]):
            return "deadline"
        return None

    def _start_step(self, batch: list[QueuedGroup]) -> TrainStep:
        step = self.trainer_version
        taken = self.queue.take(len(batch))
        versions = tuple(g.version for g in taken)
        self.staleness.consume(step, versions)
        self.ages.update(age_histogram(step, versions))
        self._rejected_for_step = 0
        ids = tuple(g.prompt_id for g in taken)
        self._consumed.extend(ids)
        self.training = TrainStep(step, ids, versions)
        return self.training

    def _free_actors(self) -> list[int]:
        """The idle actors, but those whose prefetch runs: they wait for it, and their load
        then only swaps (section Prefetch)."""
        return [a for a in self.dispatcher.idle_actors() if a not in self._prefetching]

    def _feed_actors(self) -> list[Action]:
        """Refresh every idle actor that is behind (if work remains), then hand out the
        next minibatches to the up-to-date idle actors, lowest id first, until one may not
        go (or, under a global refresh, until every actor holds the target)."""
        out: list[Action] = []
        if self._next_dispatch() is None:
            return out
        target = self.refresh_target
        for actor in self._free_actors():
            if self.dispatcher.needs_refresh(actor, target):
                self.dispatcher.start_load(actor, target)
                out.append(LoadWeights(actor, target))
        if self._paused():
            return out
        for actor in self._free_actors():   # those just sent a load are no longer idle
            nxt = self._next_dispatch()
            if nxt is None:
                break
            index, retry = nxt
            mb = self.dispatcher.minibatches[index]
            version = self.dispatcher.actors[actor].version
            if not retry and self._throttled():
                break
            if not (self.queue.fits(mb.size) and self.staleness.admits(mb.size, version)):
                break
            self.dispatcher.assign(actor)
            self.queue.reserve(mb.size)
            self.staleness.dispatch(mb.size, version)
            if not retry:   # beyond what a run without rejections dispatches: an extra one
                self.extra_minibatches += self._dispatched >= self.total_steps * self.config.global_batch_size
                self._dispatched += mb.size
            out.append(Generate(actor, mb.minibatch_id, mb.prompt_ids, version))
        return out

    def _next_dispatch(self) -> Optional[tuple[int, bool]]:
        """Next (plan index, is_retry), or None when no more prompts are needed."""
        if self.staleness.admitted >= self.total_steps * self.config.global_batch_size:
            return None
        nxt = self.dispatcher.peek()
        if nxt is None and self.refill is not None and self._rejected:
            self._extend()
            nxt = self.dispatcher.peek()
        if nxt is not None and not nxt[1] and self._replan_due():
            nxt = self.dispatcher.peek()
        return nxt

    def _replan_due(self) -> bool:
        """The re-plan rule (``replan.py``): the next new minibatch opens an epoch
        ``e >= 1`` not tried yet, so that epoch's pending minibatches are planned again from
        the lengths observed so far. Returns whether it tried (taken or refused: ``replans``)."""
        rule, d = self.epoch_replan, self.dispatcher
        if rule is None:
            return False
        pending = d.minibatches[d.cursor:]
        epoch = rule.epoch_of(pending[0].prompt_ids[0])
        if epoch < 1 or epoch in self._replanned:
            return False
        self._replanned.add(epoch)
        count = epoch_run(pending, epoch, rule.epoch_of)
        old = tuple(mb.prompt_ids for mb in pending[:count])
        note, error, made = None, None, 0
        try:   # a planner's refusal (ScheduleError) and the core's are both ValueErrors
            new, note = rule.plan(epoch, old, dict(self.observed_lengths))
            new = as_minibatches(new)
            self.replan_pending(list(new) + list(pending[count:]))
            made = len(new)
        except ValueError as refused:
            error = str(refused)
        self.replans.append(ReplanRecord(epoch, d.cursor, self.trainer_version, sum(map(len, old)), made,
                                         error is None, error, note))
        return True

    def _extend(self) -> None:
        """The plan is used up because groups were rejected: append ``refill(k)``."""
        d = self.dispatcher
        new = as_minibatches(self.refill(self.refills + 1))
        known = {pid for mb in d.minibatches for pid in mb.prompt_ids}
        clash = [mb.minibatch_id for mb in new if mb.minibatch_id in d.index_of] + \
            [pid for mb in new for pid in mb.prompt_ids if pid in known]
        if not new or clash or any(mb.size * self.config.n_samples_per_prompt > self.queue.capacity
                                   or not mb.size for mb in new):
            raise ProtocolError(f"refill({self.refills + 1}) gave {len(new)} minibatches; they must be "
                                f"non-empty, fit the queue and use new ids (reused: {clash[:3]})")
        self.refills += 1
        d.replace_pending(list(d.minibatches[d.cursor:]) + new)

    def _split_next(self) -> bool:
        """Nothing is in flight and nothing could be issued (``filter_groups`` on): the next
        new minibatch may be too big for what admission and queue room allow now (after
        rejections, its planned neighbours were cut for a run without them; a resumed
        plan has holes). Split it into the part that fits and the rest (same prompts, same
        order). Returns whether it did."""
        if self._next_dispatch() is None:
            return False
        index, retry = self._next_dispatch()
        d = self.dispatcher
        live = d.idle_actors()
        if retry or not live:
            return False
        mb = d.minibatches[index]
        version = d.actors[live[0]].version
        room = (self.queue.capacity - self.queue.reserved_samples) // self.config.n_samples_per_prompt
        fit = min(room, self.staleness.headroom(version), mb.size)
        if fit < 1 or fit == mb.size:
            return False
        head = PlannedMinibatch(f"{mb.minibatch_id}/a", mb.prompt_ids[:fit])
        tail = PlannedMinibatch(f"{mb.minibatch_id}/b", mb.prompt_ids[fit:])
        if head.minibatch_id in d.index_of or tail.minibatch_id in d.index_of:
            raise ProtocolError(f"cannot split minibatch {mb.minibatch_id!r}: its parts' ids are taken")
        d.replace_pending([head, tail] + list(d.minibatches[index + 1:]))
        return True

    def _check_rejections(self) -> None:
        """``max_gen_batches`` (M): the run stops once a step would need more than M
        generation batches of ``global_batch_size`` (B) prompts: more than (M - 1) x B
        groups rejected while it is being filled (MindSpeed-RL: fewer than B accepted
        after M batches)."""
        b, most = self.config.global_batch_size, self.config.max_gen_batches
        if most and self._rejected_for_step > (most - 1) * b:
            step = self.staleness.consumed // b
            raise TooManyRejected(
                f"dynamic sampling (filter_groups={self.config.filter_groups}) rejected "
                f"{self._rejected_for_step} prompt groups while step {step} was being filled, more than "
                f"(algo.max_num_gen_batches={most} - 1) x global_batch_size={b} = {(most - 1) * b}: almost every "
                f"group's rewards have no spread (all right or all wrong); MindSpeed-RL's DAPO trainer stops here "
                f"too (\"Generated too many\"). Raise algo.max_num_gen_batches (0: no limit), use prompts of a "
                f"difficulty the policy can tell apart, or set algo.filter_groups=none")

    def _throttled(self) -> bool:
        starving = self.queue.queued_prompts + self.running_prompts < self.config.global_batch_size
        return self.queue.throttled and not starving

    def _finish(self) -> Finish:
        pending = self._pending_ids()
        running = [pid for _, k in self.dispatcher.running()
                   for pid in self.dispatcher.minibatches[k].prompt_ids]
        return Finish(self.trainer_version, tuple(pending),
                      tuple(g.prompt_id for g in self.queue.groups()), tuple(running), tuple(self._rejected))

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_due(self, interrupted: bool = False) -> Optional[Checkpoint]:
        """The checkpoint the rules ask for now (committed as issued), or None: the
        trainer's version, once it is published and nothing of the trainer runs, if it is
        a multiple of ``save_every`` past the start (or the run is ``interrupted``: any
        version, with ``save_every``) and was not checkpointed yet."""
        every, v = self.config.save_every, self.trainer_version
        if not every or v == self.checkpointed or self.published_version != v:
            return None
        if self.training is not None or self.publishing is not None or self.checkpointing is not None:
            return None
        if (v % every or v == self.config.start_version) and not interrupted:
            return None
        self.checkpointing = Checkpoint(
            v, tuple(self._consumed),
            tuple((mb.minibatch_id, tuple(mb.prompt_ids)) for mb in self.dispatcher.minibatches),
            tuple(merge_age_histograms(self.ages).items()))
        self.checkpointed = v
        return self.checkpointing

    def settle(self) -> list[Action]:
        """What an interrupted run still does once the shell stopped generation (Ctrl-C,
        SIGTERM; ``loop.Loop.interrupt``): publish a trained version not yet published
        (so the step is recorded like any other), then, with ``save_every``, checkpoint the
        trainer's version if it was not yet (so the run resumes from there). Committed as
        issued; [] while a step, publish or checkpoint runs, or when nothing is left."""
        publish = self.publish_due()
        if publish is not None:
            return [publish]
        checkpoint = self._checkpoint_due(interrupted=True)
        return [] if checkpoint is None else [checkpoint]

    def on_checkpointed(self, version: int) -> None:
        """The checkpoint of ``version`` is written whole (committed); the trainer is free."""
        running = None if self.checkpointing is None else self.checkpointing.version
        if version != running:
            raise ProtocolError(f"checkpoint of version {version} reported written; the checkpoint "
                                f"being written is {running}")
        self.checkpointing = None

    # ------------------------------------------------------------------ events
    def on_generated(self, actor: int, minibatch_id: str,
                     rewards: Optional[Mapping[str, Sequence[float]]] = None,
                     lengths: Optional[Sequence[int]] = None) -> None:
        """``actor`` finished ``minibatch_id``: all its samples join the queue. ``rewards``
        (prompt id -> the filter metric of each sample) is what ``filter_groups`` reads:
        the groups the rule rejects (``rejection.rejected_groups``) leave at once, as in
        ``on_groups_rejected``. With ``filter_groups="std"`` every prompt needs its values.
        ``lengths`` (its samples' lengths, ``n_samples_per_prompt`` rows per prompt) feed
        the re-plan rule; kept only when the core has one."""
        d = self.dispatcher
        observed = self._lengths_of(minibatch_id, lengths)   # checked before anything changes
        if self.config.filter_groups != "none":
            index = d.index_of.get(minibatch_id)
            ids = d.minibatches[index].prompt_ids if index is not None else ()
            missing = [p for p in ids if p not in (rewards or {})]
            if missing:
                raise ProtocolError(f"filter_groups={self.config.filter_groups}: the report of minibatch "
                                    f"{minibatch_id!r} carries no rewards for {missing[:3]}")
        index = d.complete(actor, minibatch_id)
        self.observed_lengths.update(observed)
        version = d.actors[actor].version
        ids = d.minibatches[index].prompt_ids
        self.queue.arrive(ids, version)
        if self.config.filter_groups != "none":
            self.on_groups_rejected(rejected_groups(self.config.filter_groups, {p: rewards[p] for p in ids}))

    def _lengths_of(self, minibatch_id: str, lengths: Optional[Sequence[int]]) -> dict[str, tuple[int, ...]]:
        """A finished minibatch's lengths by prompt, for the re-plan rule ({} without one,
        or for a minibatch the dispatcher does not know: ``complete`` refuses that)."""
        index = self.dispatcher.index_of.get(minibatch_id)
        if lengths is None or self.epoch_replan is None or index is None:
            return {}
        try:
            return lengths_by_prompt(self.dispatcher.minibatches[index].prompt_ids, lengths,
                                     self.config.n_samples_per_prompt)
        except ValueError as error:
            raise ProtocolError(f"the report of minibatch {minibatch_id!r}: {error}") from None

    def on_groups_rejected(self, prompt_ids: Sequence[str]) -> None:
        """These queued groups are rejected (dynamic sampling): they leave the queue, their
        queue room and their admission are given back, and they are counted (``ledger``,
        ``Finish.rejected``); dispatch makes them up with more prompts. Ids not queued (or
        repeated) are a ``ProtocolError`` and change nothing."""
        ids = list(prompt_ids)
        queued = {g.prompt_id: g for g in self.queue.groups()}
        bad = [p for p in ids if p not in queued] + [p for p in set(ids) if ids.count(p) > 1]
        if bad:
            raise ProtocolError(f"cannot reject prompt groups {bad[:3]}: only queued groups can be "
                                "rejected, once each")
        if not ids:
            return
        self.queue.remove(ids)
        for pid in ids:
            self.staleness.retract(1, queued[pid].version)
        self._rejected.extend(ids)
        if self.staleness.consumed < self.total_steps * self.config.global_batch_size:
            self._rejected_for_step += len(ids)

    def on_minibatch_failed(self, actor: int, minibatch_id: str) -> None:
        """``actor`` lost ``minibatch_id``; the shell drops any partial output. It is
        re-dispatched before any new minibatch. The actor is idle again, same weights."""
        index = self.dispatcher.fail(actor, minibatch_id)
        size = self.dispatcher.minibatches[index].size
        self.queue.release(size)
        self.staleness.retract(size, self.dispatcher.actors[actor].version)

    def on_weights_loaded(self, actor: int, version: int) -> None:
        self.dispatcher.finish_load(actor, version)

    def on_load_failed(self, actor: int, version: int) -> None:
        """``actor`` could not load ``version``: it keeps its old weights, is idle again,
        and the next ``poll`` asks it to load again (never generating half-loaded)."""
        self.dispatcher.abort_load(actor, version)

    def on_actor_lost(self, actor: int) -> None:
        """``actor``'s process died (killed, out of memory: not an error it raised). What it
        held is released: its minibatch is re-dispatched before any new one (as in
        ``on_minibatch_failed``), a load it ran is dropped. It is ``restarting`` until
        ``on_actor_restarted`` or ``on_actor_retired``; the next ``poll`` issues
        ``AwaitActor`` for it."""
        index = self.dispatcher.lose(actor)
        if index is not None:
            size = self.dispatcher.minibatches[index].size
            self.queue.release(size)
            self.staleness.retract(size, self.dispatcher.actors[actor].version)

    def on_actor_restarted(self, actor: int, version: int) -> None:
        """``actor`` is back and holds ``version`` (what its new process loaded: the
        starting checkpoint, version 0, for an actor Ray restarted). It is idle; behind the
        refresh target it loads the target before it generates again."""
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= self.published_version:
            raise ProtocolError(f"actor {actor} restarted holding version {version!r}; the published "
                                f"versions are 0..{self.published_version}")
        self.dispatcher.restarted(actor, version)
        self._awaiting.discard(actor)

    def on_actor_retired(self, actor: int) -> None:
        """``actor`` will not come back: it is never given work again; the others go on."""
        self.dispatcher.retire(actor)
        self._awaiting.discard(actor)

    def on_train_step_done(self, step: int) -> None:
        running = None if self.training is None else self.training.step
        if step != running:
            raise ProtocolError(f"train step {step} reported done; running step is {running}")
        self.training = None
        self.trainer_version = step + 1

    def on_published(self, version: int) -> None:
        """The trainer's weights ``version`` are published (atomically) for actors to load."""
        if version != self.publishing:
            raise ProtocolError(f"published version {version}, but the version being published is "
                                f"{self.publishing}")
        self.publishing = None
        self.published_version = version

    # ------------------------------------------------------------------ re-planning
    def replan_pending(self, minibatches: Any) -> None:
        """Replace the minibatches not yet dispatched (from the dispatch cursor on) with
        ``minibatches`` (same forms as the constructor takes), e.g. the next epoch planned
        again from the lengths observed so far. Dispatched work (running, done, awaiting
        retry) is never touched.

        The new minibatches must hold exactly the prompt ids they replace, and the whole
        plan (dispatched part + new part) must pass the constructor's checks, the window
        rule (``staleness.first_window_gap``) included: the rule is a property of the
        plan order alone, so the dispatched prefix, unchanged, keeps its part of it.
        Otherwise ``ValueError`` naming the difference or the step that could never be
        filled, and the core is unchanged. Why this keeps every invariant: the prompts
        outside ``pending`` are untouched and ``pending`` keeps its set, so the ledger
        stays a partition; ``total_steps`` cannot change (same prompt count)."""
        if self.finished:
            raise ProtocolError("replan_pending after Finish: nothing is dispatched any more")
        d = self.dispatcher
        new = as_minibatches(minibatches)
        old_ids = Counter(pid for mb in d.minibatches[d.cursor:] for pid in mb.prompt_ids)
        new_ids = Counter(pid for mb in new for pid in mb.prompt_ids)
        if new_ids != old_ids:
            missing = sorted((old_ids - new_ids).keys())
            extra = sorted((new_ids - old_ids).keys())
            raise ValueError(
                "replan_pending: the new minibatches must hold exactly the prompt ids not yet dispatched "
                f"({sum(old_ids.values())} of them); missing {len(missing)} {missing[:5]}, extra or repeated "
                f"{len(extra)} {extra[:5]}")
        config = replace(self.config, total_steps=self.total_steps)   # refills add prompts, not steps
        steps = _check_plan(config, list(d.minibatches[:d.cursor]) + new)
        if steps != self.total_steps:  # same prompt count: a bug here, never a user error
            raise ProtocolError(f"replan_pending resolved total_steps={steps}, the run has {self.total_steps}")
        d.replace_pending(new)

    # ------------------------------------------------------------------ prefetch
    def _prefetches(self) -> list[Prefetch]:
        """The prefetch rule (``ControlConfig.prefetch``): while work remains, every live
        actor behind the refresh target that is not loading, has no prefetch running and
        was never sent a prefetch of the target gets ``Prefetch(actor, target)``. Idle
        actors behind with work to do were given their ``LoadWeights`` just before, so in
        practice it is the generating actors that prefetch."""
        if not self.config.prefetch or self._next_dispatch() is None:
            return []
        target, d, out = self.refresh_target, self.dispatcher, []
        waiting = set(d.restarting_actors())
        for actor in d.live_actors():
            a = d.actors[actor]
            if actor in waiting or a.loading is not None or actor in self._prefetching or a.version >= target \
                    or self._prefetch_tried.get(actor, -1) >= target:
                continue
            self._prefetching[actor] = target
            self._prefetch_tried[actor] = target
            out.append(Prefetch(actor, target))
        return out

    def on_prefetched(self, actor: int, version: int) -> None:
        """``actor`` holds ``version`` beside its engine (not in it): its load only swaps."""
        self._end_prefetch(actor, version, "done")

    def on_prefetch_failed(self, actor: int, version: int) -> None:
        """The prefetch did not deliver (or was cancelled): the actor's load moves the
        version itself; ``version`` is not prefetched to it again."""
        self._end_prefetch(actor, version, "failed")

    def _end_prefetch(self, actor: int, version: int, how: str) -> None:
        if self._prefetching.get(actor) != version:
            raise ProtocolError(f"prefetch of version {version} to actor {actor} reported {how}; the prefetch "
                                f"in flight to it is {self._prefetching.get(actor)}")
        del self._prefetching[actor]

    # ------------------------------------------------------------------ views
    def in_flight(self) -> list[Action]:
        """Every action issued whose completion has not been reported, in a fixed order
        (generation and loads by actor, then the train step, then the publish, then the
        checkpoint, then the restarts awaited, by actor, then the prefetches, by actor). Empty
        while the core waits on nothing: then a ``poll`` returning [] is a deadlock."""
        d = self.dispatcher
        out: list[Action] = []
        for a in d.actors:
            if a.minibatch is not None:
                mb = d.minibatches[a.minibatch]
                out.append(Generate(a.actor, mb.minibatch_id, mb.prompt_ids, a.version))
            elif a.loading is not None:
                out.append(LoadWeights(a.actor, a.loading))
        if self.training is not None:
            out.append(self.training)
        if self.publishing is not None:
            out.append(Publish(self.publishing))
        if self.checkpointing is not None:
            out.append(self.checkpointing)
        out.extend(AwaitActor(a) for a in sorted(self._awaiting))
        out.extend(Prefetch(a, v) for a, v in sorted(self._prefetching.items()))
        return out

    @property
    def running_prompts(self) -> int:
        return self.queue.in_flight_samples // self.config.n_samples_per_prompt

    def snapshot(self) -> Snapshot:
        d = self.dispatcher
        actors = tuple(
            ActorSnapshot(a.actor, a.status.value, a.version,
                          d.minibatches[a.minibatch].minibatch_id if a.minibatch is not None else None,
                          a.loading)
            for a in d.actors)
        wait = None if self.finished else self._trainer_wait()
        if wait is None and self.config.colocated and self.training is None and d.busy() \
                and not self.finished and self.trainer_version < self.total_steps:
            wait = "colocated"
        return Snapshot(
            trainer_version=self.trainer_version, published_version=self.published_version,
            training_step=None if self.training is None else self.training.step,
            total_steps=self.total_steps, finished=self.finished,
            trainer_wait=wait, queued_prompts=self.queue.queued_prompts,
            queued_samples=self.queue.queued_samples, in_flight_samples=self.queue.in_flight_samples,
            queue_capacity=self.queue.capacity, throttled=self.queue.throttled,
            admitted_prompts=self.staleness.admitted, consumed_prompts=self.staleness.consumed,
            pending_minibatches=len(d.minibatches) - d.cursor, retry_minibatches=len(d.retries),
            actors=actors, age_histogram=merge_age_histograms(self.ages),
            outstanding_by_version=self.staleness.outstanding(),
            rejected_prompts=len(self._rejected), extra_minibatches=self.extra_minibatches)

    def ledger(self) -> Ledger:
        d = self.dispatcher
        running = [pid for _, k in d.running() for pid in d.minibatches[k].prompt_ids]
        return Ledger(frozenset(self._pending_ids()), frozenset(running),
                      frozenset(g.prompt_id for g in self.queue.groups()), frozenset(self._consumed),
                      frozenset(self._rejected))

    def consumed_ids(self) -> list[str]:
        """Prompt ids in the order the trainer consumed them."""
        return list(self._consumed)

    def rejected_ids(self, since: int = 0) -> list[str]:
        """Prompt ids in the order dynamic sampling rejected them (from the ``since``-th on)."""
        return self._rejected[since:]

    def _pending_ids(self) -> list[str]:
        d = self.dispatcher
        order = sorted(d.retries) + list(range(d.cursor, len(d.minibatches)))
        return [pid for k in order for pid in d.minibatches[k].prompt_ids]


def _check_plan(config: ControlConfig, mbs: list[PlannedMinibatch]) -> int:
    """Validate the minibatches against the config; returns the resolved total_steps."""
    if not mbs:
        raise ValueError("no minibatches: the plan is empty")
    seen_mb: set[str] = set()
    seen: set[str] = set()
    for mb in mbs:
        if mb.minibatch_id in seen_mb:
            raise ValueError(f"duplicate minibatch id {mb.minibatch_id!r}")
        seen_mb.add(mb.minibatch_id)
        if not mb.prompt_ids:
            raise ValueError(f"minibatch {mb.minibatch_id!r} is empty")
        for pid in mb.prompt_ids:
            if pid in seen:
                raise ValueError(f"prompt id {pid!r} appears twice (again in minibatch {mb.minibatch_id!r})")
            seen.add(pid)
    b, n = config.global_batch_size, config.n_samples_per_prompt
    largest = max(mbs, key=lambda mb: mb.size)
    if largest.size * n > config.queue_capacity:
        raise ValueError(f"queue_capacity={config.queue_capacity} samples cannot hold minibatch "
                         f"{largest.minibatch_id!r}: {largest.size} prompts x n_samples_per_prompt={n} "
                         f"= {largest.size * n}")
    start = config.start_version
    full_steps = start + len(seen) // b   # a resumed core's plan covers the steps from start on
    if full_steps < start + 1:
        raise ValueError(f"the plan has {len(seen)} prompts, fewer than one step "
                         f"(global_batch_size={b})")
    steps = full_steps if config.total_steps is None else config.total_steps
    if steps > full_steps:
        since = f" from start_version={start}" if start else ""
        raise ValueError(f"total_steps={steps}{since} needs {(steps - start) * b} prompts "
                         f"(global_batch_size={b}); the plan has {len(seen)}, enough for {full_steps - start} steps")
    # With filter_groups the core splits a minibatch that cannot go whole at quiescence
    # (docs/control.md, "Rejection"), which keeps any plan live: no window rule then.
    gap = None if config.filter_groups != "none" else first_window_gap(
        [mb.size for mb in mbs], b, config.max_staleness, config.queue_capacity // n, steps, config.refresh_interval,
        start)
    if gap is not None:
        mb = mbs[gap.index]
        raise ValueError(
            f"step {gap.step} can never be filled: it needs {gap.needed} prompts dispatched, but "
            f"minibatch {mb.minibatch_id!r} ({mb.size} prompts) would take the {gap.before} before it "
            f"past the limit {gap.limit} = min((max_staleness + r + 1) x global_batch_size, "
            f"step x global_batch_size + queue_capacity // n_samples_per_prompt) with "
            f"r = max(start_version, step - step % refresh_interval) = "
            f"{max(start, gap.step - gap.step % config.refresh_interval)}, "
            f"max_staleness={config.max_staleness}, global_batch_size={b}, "
            f"queue_capacity={config.queue_capacity}, n_samples_per_prompt={n}. Raise max_staleness "
            f"or queue_capacity, or plan minibatches whose boundaries meet every multiple of "
            f"global_batch_size (required when max_staleness=0)")
    return steps
