"""Generation Unit: one Ray actor per inference instance, wrapping a generation engine.

An actor generates one minibatch at a time (all ``n_samples_per_prompt`` samples of each
of its prompts in one engine batch) and loads a weight version when the Control Unit
says so, between minibatches: never a global pause. It returns two objects per
minibatch: small metadata the Control Unit reads (lengths, version, timing) and the
payload (tokens, log-probs) that goes into the Training Queue as an object reference
and is only ever fetched by the trainer.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np


class WeightVersionError(RuntimeError):
    """An actor's engine holds another weight version than the one it was told to load."""


def check_loaded_version(actor: int, expected: int, loaded: int) -> None:
    """Raise :class:`WeightVersionError` unless the engine now holds ``expected``.

    A checked error, not an ``assert`` (``python -O`` strips those): samples are tagged
    with the engine's version, so a mismatch would mislabel their policy age."""
    if loaded != expected:
        raise WeightVersionError(
            f"generation actor {actor} was told to load weight version {expected}, but its engine "
            f"now holds version {loaded}: the snapshot handed to it carries another version "
            "(check what the weight store maps that version to) or the engine ignored it")


@dataclass
class SampleGroup:
    """All samples of one prompt, produced by one actor with one weight version.

    Token ids are int32 and log-probs float32 numpy arrays, not Python lists: Ray moves
    numpy buffers without pickling them element by element (measured at 256 samples x
    2048 tokens: ~8x cheaper for the trainer to receive, docs/benchmarks.md)."""

    prompt_id: str
    prompt_ids: np.ndarray
    response_ids: list[np.ndarray]
    logprobs: list[np.ndarray]
    version: int

    @property
    def lengths(self) -> list[int]:
        return [len(r) for r in self.response_ids]


@dataclass
class MinibatchReport:
    """What the Control Unit learns from a finished minibatch (no token payload)."""

    minibatch_id: str
    actor: int
    version: int
    start: float
    end: float
    lengths: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)


@dataclass
class LoadReport:
    actor: int
    version: int
    start: float
    end: float


class GenerationWorker:
    """The actor body (wrapped with ``ray.remote`` by the runtime)."""

    def __init__(self, actor_index: int, engine_cfg: dict, model_path: str, sampling: dict, n_samples: int):
        from types import SimpleNamespace

        from ..engines.base import SamplingParams
        from ..engines.registry import make_generation_engine

        self.actor_index = actor_index
        self.engine = make_generation_engine(SimpleNamespace(**engine_cfg), model_path)
        self.sampling = SamplingParams.from_config(sampling)
        self.n_samples = n_samples
        self._fail_next = False

    def generate(self, minibatch_id: str, prompts: list[tuple[str, list[int]]], seed: int):
        """Generate every sample of ``prompts``; returns (MinibatchReport, {prompt_id: SampleGroup})."""
        if self._fail_next:
            self._fail_next = False
            raise RuntimeError(f"injected failure in actor {self.actor_index} on {minibatch_id}")
        start = time.time()
        flat = [ids for _, ids in prompts for _ in range(self.n_samples)]
        out = self.engine.generate(flat, replace(self.sampling, seed=seed))
        groups = {}
        for i, (prompt_id, ids) in enumerate(prompts):
            rows = range(i * self.n_samples, (i + 1) * self.n_samples)
            groups[prompt_id] = SampleGroup(
                prompt_id, np.asarray(ids, dtype=np.int32),
                [np.asarray(out.response_ids[r], dtype=np.int32) for r in rows],
                [np.asarray(out.response_logprobs[r], dtype=np.float32) for r in rows], out.weight_version)
        report = MinibatchReport(minibatch_id, self.actor_index, out.weight_version, start, time.time(),
                                 out.response_lengths)
        return report, groups

    def load_weights(self, version: int, snapshot) -> LoadReport:
        start = time.time()
        self.engine.load_weights(snapshot)
        check_loaded_version(self.actor_index, version, self.engine.weight_version)
        return LoadReport(self.actor_index, version, start, time.time())

    def inject_failure(self) -> None:
        """Debug seam for fault tests: the next ``generate`` raises mid-minibatch."""
        self._fail_next = True

    def ready(self) -> int:
        return self.actor_index

