"""``SimCluster``: a cluster for :func:`~mindspeed_rl_asp.control.loop.drive` on a virtual clock.

The real ``ControlCore`` and the real loop run unchanged; only the work is simulated.
``submit`` prices an action with the cost models (``batching.py``, ``costs.py``) and
schedules its completion on a heap ordered by (time, sequence number), so a run is
deterministic for a workload; ``next_event`` pops the earliest and moves the clock there.
Like ``RayCluster`` it holds no control rule: the core never gives an actor (or the
trainer) two pieces of work at once, so work starts the moment it is submitted.

What each action costs (docs/simulator.md, "Cost of each action"):

* ``Generate``: the minibatch's rows (its prompts x n samples, lengths from the
  workload) on one instance, with the engine's batching (``batching.minibatch_timing``);
* ``TrainStep``: ``costs.training_time`` over the step's tokens on the training devices
  (an update plus ``extra_forwards`` no-grad passes), or, for a trainer that pads
  (``engine.train_layout: padded``), ``costs.padded_training_time`` over its padded
  micro-batches; colocated (hybrid) runs add the
  generate -> train switch (onload of optimizer and weights);
* ``Publish``: the trainer's export: ``engine.weight_sync_fixed`` (gather the shards,
  convert to the inference layout); colocated runs add the train -> generate switch;
* ``LoadWeights``: the instance receives the weights over its devices' links
  (inter-node in async layouts, intra-node when colocated) and loads them;
* ``Prefetch`` (the collective transport with ``weights.prefetch``): the weight bytes
  move from the trainer to the instance while it generates, at ``min(the instance's
  links, the trainer's egress / transfers running)``: every transfer in flight shares
  the trainer's sending links (``engine.weight_sync_senders`` of them), so each start and
  end moves the others' ends. A ``LoadWeights`` after a finished prefetch costs only the
  local swap (the bytes copied into the engine over HBM); one without moves its bytes
  through the same shared egress.
* ``Checkpoint`` (``save_every``): ``SimSetup.checkpoint_s``, zero: no hardware profile
  carries a disk or file-system write bandwidth with a source yet, so the write is not
  priced. The core's rule still holds on the virtual clock (no step starts while a
  checkpoint runs, ``Finish`` waits for the last), so asp-simulate issues the same
  checkpoints a real run does; a measured write time set here delays the next step.

**Shared host cores** (``hardware.host_cores``, a CPU machine such as ``cpu_local``,
where the layout's logical nodes are processes on one host): a price is then the work's
CPU seconds on a core of its own, and the work in flight shares the cores by processor
sharing. With ``n`` pieces of work running on ``c`` cores each advances at
``min(1, c / n) / ((1 + s (b - 1)) (1 + t [n > c]))`` core-seconds per second, ``b =
min(n, c)`` the busy cores, ``s`` the host's measured slowdown of a core beside a busy
one (``hardware.corun_slowdown``: shared cache and memory bandwidth) and ``t`` the
measured extra CPU time of work time-sliced with more threads than cores
(``hardware.timeslice_slowdown``: cache refills after each switch), so its end moves
every time work starts or ends; ``next_event`` advances the clock to the earliest end at
the current rates. Each actor and the trainer runs one thread (``engine.num_threads:
1``), so one piece of work is one runnable thread. Without ``host_cores`` every piece of work has devices of its
own and ends at ``start + price``.

The reports it returns are those of the real actors (``MinibatchReport``, ``LoadReport``,
``StepReport``), stamped with virtual times, so ``RunRecorder`` writes the same files.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from ..control.core import Action, Checkpoint, Generate, LoadWeights, Prefetch, Publish, TrainStep
from ..control.loop import Done, Event
from ..control.policy_age import age_histogram, age_metrics
from ..control.reports import LoadReport, MinibatchReport, StepReport
from ..tasks import base_prompt_id
from .batching import Instance, MinibatchTiming, minibatch_timing
from .costs import padded_training_time, training_time, weight_transfer_time
from .workload import PromptWorkload


@dataclass(frozen=True)
class SimSetup:
    """Everything the cluster prices work with; built from a config by ``sim/run.py``."""

    instance: Instance           # every generation instance is alike
    num_actors: int
    train_devices: int
    colocated: bool
    extra_forwards: int          # no-grad passes per step besides the update (old, reference log-probs)
    publish_s: float             # trainer side of a refresh (export, reshard, convert)
    load_bandwidth: float        # bytes/s into one instance (its links, capped by the sender's)
    switch_s: float              # colocated: one train <-> generate switch
    recompute: bool = False      # training recomputes activations (one more forward)
    grad_sync_s: float = 0.0     # exposed data-parallel gradient reduction per step
    host_cores: int = 0          # cores all work shares (processor sharing); 0: each has its own devices
    corun_slowdown: float = 0.0  # with host_cores: a core's slowdown while another core is busy
    timeslice_slowdown: float = 0.0   # with host_cores: extra CPU time when threads outnumber cores
    train_padding_rows: int = 0  # the trainer pads micro-batches of this many rows (engine.train_layout: padded)
    prefetch: bool = False       # the core prefetches (collective transport): transfers share the egress
    ingress_bandwidth: float = 0.0   # with prefetch: bytes/s into one instance over its own links
    trainer_egress: float = 0.0  # with prefetch: bytes/s out of the trainer's sending links (0: not limiting)
    swap_s: float = 0.0          # with prefetch: a prefetched version copied into the engine
    checkpoint_s: float = 0.0    # one checkpoint write (save_every); 0: unpriced, see the module docstring

    def load_s(self) -> float:
        return weight_transfer_time(self.instance.model.weight_bytes, self.load_bandwidth, 0.0)

    def transfer_rate(self, transfers: int) -> float:
        """Bytes/s of each of ``transfers`` weight transfers running at once: its instance's
        links, capped by its share of the trainer's egress."""
        if self.trainer_egress <= 0:
            return self.ingress_bandwidth
        return min(self.ingress_bandwidth, self.trainer_egress / max(transfers, 1))


class SimCluster:
    def __init__(self, setup: SimSetup, prompts: Mapping[str, PromptWorkload], rewards=None) -> None:
        """``rewards(action)``: a finished ``Generate``'s groups' rewards, for the core's
        reject rule (dynamic sampling, ``sim/rewards.py``); None: none reported."""
        self.setup = setup
        self.rewards = rewards
        self.prompts = prompts
        self.clock = 0.0
        self._heap: list[tuple[float, int, Action, object]] = []
        self._seq = 0
        self._cancelled: set[int] = set()
        self._seq_of: dict[Action, int] = {}
        self._sharing: dict[int, list] = {}   # host_cores: seq -> [core-seconds left, action, report]
        self._transfers: dict[int, list] = {}   # prefetch: seq -> [bytes left, action, start]
        self._prefetched: set[tuple[int, int]] = set()   # (actor, version) of prefetches that ended
        self.timings: dict[str, MinibatchTiming] = {}   # minibatch id -> its timing (bubbles)
        self.dispatched_prompts = 0
        self.group_rewards: dict[str, Sequence[float]] = {}   # prompt id -> its finished group's rewards
        self.effective_tokens = 0   # response tokens trained in groups whose rewards have a spread

    def now(self) -> float:
        return self.clock

    def submit(self, action: Action) -> None:
        start = self.clock
        if self._moves_bytes(action):
            self._transfers[self._seq] = [float(self.setup.instance.model.weight_bytes), action, start]
            self._seq_of[action] = self._seq
            self._seq += 1
            return
        duration, report = self._price(action, start)
        if self.setup.host_cores:
            self._sharing[self._seq] = [duration, action, report]
        else:
            heapq.heappush(self._heap, (start + duration, self._seq, action, report))
        self._seq_of[action] = self._seq
        self._seq += 1

    def _moves_bytes(self, action: Action) -> bool:
        """With prefetch, a ``Prefetch`` and a load of a version not prefetched move the
        weight bytes through the trainer's shared egress."""
        if not self.setup.prefetch:
            return False
        return isinstance(action, Prefetch) or (isinstance(action, LoadWeights)
                                                and (action.actor, action.version) not in self._prefetched)

    def next_event(self) -> Event:
        while self._heap or self._sharing or self._transfers:
            transfer = self._transfer_due()
            if transfer is not None:
                seq, action, report = transfer
            elif self._sharing:
                seq, action, report = self._next_shared()
            else:
                end, seq, action, report = heapq.heappop(self._heap)
                self.clock = end
            self._seq_of.pop(action, None)
            if seq in self._cancelled:
                continue
            if isinstance(action, Generate) and self.rewards is not None:
                rewards = self.rewards(action)
                self.group_rewards.update(rewards)
                return Done(action, report, rewards=rewards)
            return Done(action, report)
        raise RuntimeError("next_event with nothing in flight")

    def _transfer_due(self):
        """The transfer that ends before any other work does, ended (the clock moved to
        its end, the other transfers and any shared work charged for the interval), or
        None (the transfers charged up to the other work's end, which the caller takes).
        Every transfer runs at ``setup.transfer_rate(running)``."""
        if not self._transfers:
            return None
        rate = self.setup.transfer_rate(len(self._transfers))
        seq = min(self._transfers, key=lambda k: (self._transfers[k][0], k))
        interval = max(0.0, self._transfers[seq][0]) / rate
        other = self._heap[0][0] - self.clock if self._heap else \
            self._shared_interval()[1] if self._sharing else None
        if other is not None and other <= interval:
            self._charge_transfers(other, rate)
            return None
        self._charge_shared(interval)
        self._charge_transfers(interval, rate)
        self.clock += interval
        _, action, start = self._transfers.pop(seq)
        return seq, action, self._transfer_report(action, start)

    def _charge_transfers(self, interval: float, rate: float) -> None:
        for item in self._transfers.values():
            item[0] -= interval * rate

    def _transfer_report(self, action: Action, start: float):
        """What the real shell reports: the receiving side's result for a prefetch (which
        makes the load that follows a swap), a ``LoadReport`` for a load."""
        weight_bytes = self.setup.instance.model.weight_bytes
        if isinstance(action, Prefetch):
            self._prefetched.add((action.actor, action.version))
            return {"ok": True, "version": action.version, "bytes": weight_bytes, "seconds": self.clock - start}
        return LoadReport(action.actor, action.version, start, self.clock, "collective", int(weight_bytes),
                          transfer_s=self.clock - start)

    def _shared_interval(self) -> tuple[int, float]:
        """Processor sharing: (the work that ends first, seconds until it does) at the current rate."""
        seq = min(self._sharing, key=lambda k: (self._sharing[k][0], k))
        return seq, max(0.0, self._sharing[seq][0]) / self._shared_rate()   # a tie can leave -1e-17 behind

    def _shared_rate(self) -> float:
        running, cores = len(self._sharing), self.setup.host_cores
        slowdown = 1.0 + self.setup.corun_slowdown * (min(running, cores) - 1)
        if running > cores:
            slowdown *= 1.0 + self.setup.timeslice_slowdown
        return min(1.0, cores / running) / slowdown

    def _charge_shared(self, interval: float) -> None:
        if self._sharing:
            rate = self._shared_rate()
            for item in self._sharing.values():
                item[0] -= interval * rate

    def _next_shared(self) -> tuple[int, Action, object]:
        """Processor sharing: advance the clock to the first end at the current rate,
        charge every running piece of work for the interval, and take the one that ended
        (its report's end is the clock: when it really ended, not ``start + price``)."""
        seq, interval = self._shared_interval()
        self._charge_shared(interval)
        self.clock += interval
        _, action, report = self._sharing.pop(seq)
        if report is not None:
            report = replace(report, end=self.clock)
        return seq, action, report

    def cancel(self, actions: Sequence[Action]) -> None:
        for action in actions:
            seq = self._seq_of.pop(action, None)
            if seq is not None:
                self._cancelled.add(seq)
                self._sharing.pop(seq, None)   # cancelled work stops taking a core share
                self._transfers.pop(seq, None)   # or a share of the egress

    # ------------------------------------------------------------------ prices
    def _rows(self, prompt_ids: Sequence[str]) -> tuple[list[int], list[int]]:
        prompt_lengths, response_lengths = [], []
        for pid in prompt_ids:
            work = self.prompts[base_prompt_id(pid)]
            prompt_lengths += [work.prompt_length] * len(work.response_lengths)
            response_lengths += list(work.response_lengths)
        return prompt_lengths, response_lengths

    def _price(self, action: Action, start: float) -> tuple[float, object]:
        s = self.setup
        if isinstance(action, Generate):
            prompts, lengths = self._rows(action.prompt_ids)
            timing = minibatch_timing(s.instance, prompts, lengths)
            self.timings[action.minibatch_id] = timing
            self.dispatched_prompts += len(action.prompt_ids)
            return timing.duration, MinibatchReport(action.minibatch_id, action.actor, action.version, start,
                                                    start + timing.duration, lengths)
        if isinstance(action, LoadWeights):
            if (action.actor, action.version) in self._prefetched:   # the bytes are there: swap only
                self._prefetched.discard((action.actor, action.version))
                return s.swap_s, LoadReport(action.actor, action.version, start, start + s.swap_s, "collective",
                                            swap_s=s.swap_s)
            duration = s.load_s()
            return duration, LoadReport(action.actor, action.version, start, start + duration)
        if isinstance(action, TrainStep):
            prompts, lengths = self._rows(action.prompt_ids)
            tokens = sum(prompts) + sum(lengths)
            squares = sum((p + r) ** 2 for p, r in zip(prompts, lengths))   # attention: sum of L^2
            if s.train_padding_rows:
                compute = padded_training_time(s.instance.model, s.instance.hardware, s.train_devices, prompts,
                                               lengths, s.train_padding_rows, s.extra_forwards, s.recompute)
            else:
                compute = training_time(s.instance.model, s.instance.hardware, s.train_devices, tokens,
                                        s.extra_forwards, squares, s.recompute)
            duration = compute + s.grad_sync_s + (s.switch_s if s.colocated else 0.0)
            metrics = {"samples": len(lengths), "response_tokens": sum(lengths),
                       "response_length_mean": sum(lengths) / max(len(lengths), 1), "trained_tokens": tokens,
                       "response_length_max": max(lengths, default=0), "prompt_length_max": max(prompts, default=0),
                       **age_metrics(age_histogram(action.step, action.versions))}
            if self.rewards is not None:   # the groups with a GRPO signal (rewards with a spread)
                signal = [p for p in action.prompt_ids if max(self.group_rewards[p]) != min(self.group_rewards[p])]
                effective = sum(self._rows(signal)[1])
                self.effective_tokens += effective
                metrics.update(informative_groups=len(signal), informative_response_tokens=effective)
            return duration, StepReport(action.step, action.step + 1, start, start + duration, metrics)
        if isinstance(action, Publish):
            return s.publish_s + (s.switch_s if s.colocated else 0.0), None
        if isinstance(action, Checkpoint):
            return s.checkpoint_s, None
        raise TypeError(f"SimCluster cannot run {action!r}")
