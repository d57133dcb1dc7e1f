"""What each actor did when, and the bubbles measured from it. Pure functions over spans.

A :class:`Span` is one piece of work of one lane (``gen-0``, ``gen-1``, ..., ``train``):
generate a minibatch, load weights, train a step, publish. Bubbles are measured, not
predicted:

* padding bubble: within a generated minibatch the engine holds every row until the
  longest ends, so of ``n x max_len`` decode slots only ``sum(len)`` are useful;
* idle (skewness) bubble: the share of generation-actor time in a window spent doing
  nothing, e.g. waiting for the slowest actor of a synchronous phase;
* trainer idle: the share of the window the trainer waited for samples (a drained
  queue, the sorting bubble's symptom).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence


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
