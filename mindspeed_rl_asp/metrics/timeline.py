"""What each actor did when, and the bubbles measured from it. Pure functions over spans.

A :class:`Span` is one piece of work of one lane (``gen-0``, ``gen-1``, ..., ``train``):
generate a minibatch, load weights, train a step, publish. Bubbles are measured, not
predicted:

* padding bubble: within a generated minibatch the engine holds every row until the
  longest ends, so of ``n x max_len`` decode slots only ``sum(len)`` are useful;
* slot bubble, by the engine's batching (:func:`slot_use`): static batching (``hf``) is
  the padding bubble; continuous batching (``vllm``) is the shortfall of the running
  batch below its capacity over the minibatch's life, and its *tail* is the share of
  decode steps with fewer than ``TAIL_SHARE`` of the capacity running;
* idle (skewness) bubble: the share of generation-actor time in a window spent doing
  nothing, e.g. waiting for the slowest actor of a synchronous phase;
* trainer idle: the share of the window the trainer waited for samples (a drained
  queue, the sorting bubble's symptom).
"""
from __future__ import annotations

import heapq
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

#: "Few sequences left": a decode step with fewer than this share of the running-batch
#: capacity running is a tail step. One definition for the real runs (here) and the
#: simulator (``sim/batching.py`` imports it), docs/simulator.md "Batching and the bubbles
#: per engine".
TAIL_SHARE = 0.25


@dataclass(frozen=True)
class Span:
    lane: str
    kind: str           # generate | load_weights | train | publish
    start: float
    end: float
    label: str = ""
    info: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def duration(self) -> float:
        return self.end - self.start


def padding_bubble(length_groups: Iterable[Sequence[int]]) -> float:
    """1 - useful / padded over minibatches, each given as its samples' lengths."""
    useful = padded = 0
    for lengths in length_groups:
        if lengths:
            useful += sum(lengths)
            padded += len(lengths) * max(lengths)
    return 1.0 - useful / padded if padded else 0.0


def running_capacity(batching: str, rows: int, max_num_seqs: int | None = None) -> int:
    """Sequences a minibatch of ``rows`` can have running at once: ``rows`` for static
    batching (``hf`` takes the whole minibatch), ``min(max_num_seqs, rows)`` for
    continuous batching (``vllm``: ``engine.max_num_seqs`` slots)."""
    if batching == "continuous" and max_num_seqs:
        return max(1, min(int(max_num_seqs), rows))
    return max(1, rows)


@dataclass(frozen=True)
class SlotUse:
    """How one minibatch used the engine's running-batch slots, in decode steps."""

    useful: int        # sequence-steps: sum of the response lengths (one token per step)
    steps: int         # decode steps from the first token to the last
    capacity: int      # running-batch capacity (sequences)
    tail_steps: int    # steps with fewer than TAIL_SHARE x capacity sequences running

    @property
    def bubble(self) -> float:
        """``1 - sum(L) / (capacity x steps)``: the running batch's shortfall below capacity."""
        slots = self.capacity * self.steps
        return 1.0 - self.useful / slots if slots else 0.0

    @property
    def tail_share(self) -> float:
        return self.tail_steps / self.steps if self.steps else 0.0


def slot_use(lengths: Sequence[int], capacity: int) -> SlotUse:
    """Continuous batching of one minibatch, as ``sim/batching.continuous_minibatch``
    schedules it (KV room aside): sequences join in order, each as soon as one of the
    ``capacity`` slots is free, and each holds its slot for one step per response token
    (the prompt's prefill emits the first). ``steps`` is when the last one ends.

    ``capacity`` is clamped to the rows. When every row fits at once
    (``capacity >= len(lengths)``) all start at step 0,
    ``steps = max(L)`` and the bubble is the padding bubble ``1 - sum(L) / (rows x max L)``.
    For static batching pass ``capacity = rows``: the bubble is then the padding bubble
    (finished rows hold their slots) and the tail counts the steps with fewer than a
    quarter of the rows still unfinished (the simulator reports a static tail of 0: its
    held slots still compute).
    """
    lengths = [max(0, int(n)) for n in lengths]
    capacity = max(1, min(int(capacity), len(lengths)))  # never more slots than rows
    free = [0] * capacity                               # the step each slot is free again
    events: list[tuple[int, int]] = []                  # (step, +1 join / -1 leave)
    steps = 0
    for n in lengths:
        if n == 0:
            continue
        start = heapq.heappop(free)
        heapq.heappush(free, start + n)
        events += [(start, 1), (start + n, -1)]
        steps = max(steps, start + n)
    events.sort()
    tail = running = 0
    last = 0
    for step, delta in events:
        if step > last and running < TAIL_SHARE * capacity:
            tail += step - last
        running += delta
        last = step
    return SlotUse(sum(lengths), steps, capacity, tail)


def slot_bubble(length_groups: Iterable[Sequence[int]], capacities: Iterable[int]) -> float:
    """``1 - sum(useful) / sum(capacity x steps)`` over minibatches (token-weighted, as
    :func:`padding_bubble`), each given as its lengths and its running capacity."""
    useful = slots = 0
    for lengths, capacity in zip(length_groups, capacities):
        use = slot_use(lengths, capacity)
        useful += use.useful
        slots += use.capacity * use.steps
    return 1.0 - useful / slots if slots else 0.0


def tail_step_share(length_groups: Iterable[Sequence[int]], capacities: Iterable[int]) -> float:
    """Share of the minibatches' decode steps with fewer than ``TAIL_SHARE`` of the capacity running."""
    tail = steps = 0
    for lengths, capacity in zip(length_groups, capacities):
        use = slot_use(lengths, capacity)
        tail += use.tail_steps
        steps += use.steps
    return tail / steps if steps else 0.0


def busy_time(spans: Iterable[Span], lane: str, start: float, end: float) -> float:
    """Seconds of ``lane`` covered by its spans inside [start, end] (spans of a lane do not overlap)."""
    return sum(max(0.0, min(s.end, end) - max(s.start, start)) for s in spans if s.lane == lane)


def idle_fraction(spans: Sequence[Span], lanes: Sequence[str], start: float, end: float) -> float:
    """Share of lane-time in [start, end] that no span of the lane covers."""
    window = (end - start) * len(lanes)
    if window <= 0:
        return 0.0
    return 1.0 - sum(busy_time(spans, lane, start, end) for lane in lanes) / window


def write_spans(path: Path, spans: Iterable[Span]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for span in spans:
            f.write(json.dumps(asdict(span)) + "\n")


def read_spans(path: Path) -> list[Span]:
    with open(path, encoding="utf-8") as f:
        return [Span(**json.loads(line)) for line in f if line.strip()]
