"""Generation Unit: one Ray actor per inference instance, wrapping a generation engine.

An actor generates one minibatch at a time (all ``n_samples_per_prompt`` samples of each
of its prompts in one engine batch) and loads a weight version when the Control Unit
says so, between minibatches: never a global pause. It returns two objects per
minibatch: small metadata the Control Unit reads (lengths, version, timing) and the
payload (tokens, log-probs) that goes into the Training Queue as an object reference
and is only ever fetched by the trainer.

A version arrives as the transport says (``runtime/transport.py``): a snapshot from the
object store, a directory of safetensors, or, with the collective transport, buckets
received over a pair group on the actor's transport thread (``receive_weights``, which
may run while the actor generates). ``load_weights`` swaps a version into the engine
only once all of it is there; a transfer that failed leaves the engine untouched.

Rewards on the rollout side (``algo.filter_groups=std``, DAPO's dynamic sampling): the
actor scores its samples with the task (``algo/dapo.score_samples``: the task's rewards,
then the overlong shaping), keeps the scores with the samples (the trainer uses them and
does not score again) and reports each group's filter metric in ``MinibatchReport.rewards``,
which the control core's reject rule reads. Without it the trainer scores, as before.

Faults (``fault.actor_restarts``, docs/architecture.md "Faults"): Ray restarts an actor
whose process died up to that many times (:func:`restart_options`); the restarted
process runs ``__init__`` again, so it holds the starting checkpoint (``start_version``:
0, or a resumed run's checkpoint) until the Control Unit refreshes it. The shell asks ``weight_version`` to learn it is back.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace

import numpy as np

from ..control.reports import LoadReport, MinibatchReport


def restart_options(actor_restarts) -> dict:
    """Ray actor options for a generation actor that may be restarted ``actor_restarts``
    times after its process dies (``fault.actor_restarts``). Calls running when it died
    are not retried by Ray (``max_task_retries=0``): the Control Unit re-dispatches the
    minibatch itself, so no minibatch is ever generated twice behind its back."""
    from ..config.validate import ConfigError

    if isinstance(actor_restarts, bool) or not isinstance(actor_restarts, int) or actor_restarts < 0:
        raise ConfigError(f"fault.actor_restarts={actor_restarts!r} must be an int >= 0 (how many times a "
                         "generation actor whose process died is restarted before it is retired)")
    return {"max_restarts": actor_restarts, "max_task_retries": 0}


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


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
    scores: list[dict] | None = None   # the task's score of each sample, when scored here

    @property
    def lengths(self) -> list[int]:
        return [len(r) for r in self.response_ids]


class GenerationWorker:
    """The actor body (wrapped with ``ray.remote`` by the runtime)."""

    def __init__(self, actor_index: int, config, model_path: str, start_version: int = 0):
        """``config``: the actor's ``GenerationActorConfig`` (``runtime/actor_configs.py``);
        with ``config.scoring`` the actor scores its samples, for dynamic sampling.
        ``start_version``: the run's version of the weights at ``model_path`` (a resumed
        run's checkpoint), which its samples carry until the first load."""
        from ..engines.base import SamplingParams
        from ..engines.registry import make_generation_engine

        self.actor_index = actor_index
        self.engine = make_generation_engine(config.engine, model_path)
        self.engine.weight_version = start_version
        self.sampling = SamplingParams.from_config(config.sampling)
        self.n_samples = config.n_samples
        self._fail_next = False
        self._hold: tuple[str, float] | None = None
        # Collective transport: (sender host, port, transfer seq) -> ("ok", views, flat, stats)
        # | ("failed", error); discarded keys, so that a load waiting on one fails at once.
        self._staged: dict[tuple, tuple] = {}
        self._discarded: set[tuple] = set()
        self._arrivals = threading.Condition()
        self._receiver = None
        self.scoring = config.scoring
        if self.scoring is not None:
            from ..policy.tokenizer import load_tokenizer
            from ..tasks import make_task
            from ..tasks.rewards import user_import_roots_on_path

            user_import_roots_on_path(self.scoring.import_roots)
            self.tokenizer = load_tokenizer(model_path)
            self.task = make_task(self.scoring.task, self.tokenizer, self.scoring.max_prompt_length)
            self.prompts = self.task.by_id()

    def _score(self, groups: dict) -> dict[str, list[float]]:
        """Score every group (the scores stay with its samples); returns each group's
        filter metric per sample, for the control core's reject rule."""
        from ..algo.dapo import filter_metric, score_samples
        from ..policy.evaluate import strip_eos
        from ..tasks import base_prompt_id

        sc, eos = self.scoring, self.tokenizer.eos_token
        rewards = {}
        for pid, group in groups.items():
            texts = [strip_eos(self.tokenizer.decode(r.tolist(), skip_special_tokens=False), eos)
                     for r in group.response_ids]
            group.scores = score_samples(self.task.score, self.prompts[base_prompt_id(pid)], texts, group.lengths,
                                         sc.algo, sc.max_tokens)
            rewards[pid] = [filter_metric(s, sc.algo.filter_groups_metric) for s in group.scores]
        return rewards

    def generate(self, minibatch_id: str, prompts: list[tuple[str, list[int]]], seed: int):
        """Generate every sample of ``prompts``; returns (MinibatchReport, {prompt_id: SampleGroup})."""
        if self._fail_next:
            self._fail_next = False
            raise RuntimeError(f"injected failure in actor {self.actor_index} on {minibatch_id}")
        if self._hold is not None:
            flag, timeout = self._hold
            self._hold = None
            _write_atomically(flag, str(os.getpid()))   # "I am mid-minibatch": kill me now
            time.sleep(timeout)
            raise RuntimeError(f"hold_next_generate: actor {self.actor_index} was not killed within "
                               f"{timeout:g} s on {minibatch_id}")
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
        rewards = self._score(groups) if self.scoring is not None else None
        if self.scoring is not None and self.scoring.algo.filter_groups == "none":
            rewards = None   # shaping only: nothing to reject
        report = MinibatchReport(minibatch_id, self.actor_index, out.weight_version, start, time.time(),
                                 out.response_lengths, rewards)
        return report, groups

    def load_weights(self, version: int, snapshot, transfer: int | None = None) -> LoadReport:
        """Swap ``version`` into the engine. ``snapshot``: a ``WeightSnapshot`` (object
        store), a ``FileHandle`` (files) or a ``CollectiveHandle`` whose transfer number
        ``transfer`` this waits for (collective)."""
        from ..engines.base import WeightSnapshot
        from ..weights.collective import CollectiveHandle, TransferError
        from ..weights.store import DirectorySnapshots
        from .transport import FileHandle

        start = time.time()
        report = {"transport": "object_store"}
        if isinstance(snapshot, FileHandle):
            _, tensors = DirectorySnapshots(snapshot.root, keep=None).load(snapshot.version)
            snapshot = WeightSnapshot(snapshot.version, tensors)
            report = {"transport": "files", "bytes": sum(t.numel() * t.element_size() for t in tensors.values())}
        elif isinstance(snapshot, CollectiveHandle):
            timeout = snapshot.timeout_s
            transfer = (snapshot.host, snapshot.port, transfer)   # transfers are numbered per sender
            with self._arrivals:
                if not self._arrivals.wait_for(lambda: transfer in self._staged or transfer in self._discarded,
                                               timeout=timeout):
                    raise TransferError(f"generation actor {self.actor_index}: version {version} did not arrive "
                                        f"within weights.timeout_s={timeout:g} s; the actor keeps version "
                                        f"{self.engine.weight_version}")
                entry = self._staged.get(transfer)
            if entry is None:
                raise TransferError(f"generation actor {self.actor_index}: transfer {transfer[2]} of version "
                                    f"{version} was superseded before it was loaded")
            if entry[0] == "failed":
                raise TransferError(entry[1])
            _, views, _, stats = entry
            snapshot = WeightSnapshot(snapshot.version, views)
            report = {"transport": "collective", "bytes": stats.bytes, "transfer_s": stats.seconds,
                      "wait_s": time.time() - start}
        swap = time.time()
        self.engine.load_weights(snapshot)
        check_loaded_version(self.actor_index, version, self.engine.weight_version)
        if transfer is not None:
            self._discard(lambda key: key[:2] == transfer[:2] and key[2] <= transfer[2])
        end = time.time()
        return LoadReport(self.actor_index, version, start, end, swap_s=end - swap, **report)

    def receive_weights(self, seq: int, generation: int, handle, keep: list[int]) -> dict:
        """The collective transport's receiving side (on the transport thread): transfer
        number ``seq`` of ``handle.version`` over pair-group attempt ``generation``. Once
        earlier transfers have ended, completed ones not in ``keep`` (no load waits on
        them) are discarded. The engine is never touched here. Returns what happened
        (``ok``, and ``error`` if not: the load that waits on it fails with that)."""
        from ..weights.collective import WeightReceiver

        if self._receiver is None:
            self._receiver = WeightReceiver(self.actor_index)
        sender, keep = (handle.host, handle.port), set(keep)
        key = (*sender, seq)
        try:
            views, flat, stats = self._receiver.receive(
                handle, generation, seq,
                before=lambda: self._discard(lambda k: k[:2] != sender or (k[2] < seq and k[2] not in keep)))
        except Exception as error:  # noqa: BLE001 - recorded for the load, which fails with it
            with self._arrivals:
                self._staged[key] = ("failed", str(error))
                self._arrivals.notify_all()
            return {"ok": False, "version": handle.version, "error": str(error)}
        with self._arrivals:
            self._staged[key] = ("ok", views, flat, stats)
            self._arrivals.notify_all()
        return {"ok": True, "version": stats.version, "bytes": stats.bytes, "seconds": stats.seconds}

    def _discard(self, which) -> None:
        with self._arrivals:
            for key in [k for k in self._staged if which(k)]:
                entry = self._staged.pop(key)
                self._discarded.add(key)
                if entry[0] == "ok" and self._receiver is not None:
                    self._receiver.recycle(entry[2])
            self._arrivals.notify_all()

    def inject_failure(self) -> None:
        """Debug seam for fault tests: the next ``generate`` raises mid-minibatch."""
        self._fail_next = True

    def hold_next_generate(self, flag_path: str, timeout_s: float = 300.0) -> None:
        """Debug seam for fault tests: the next ``generate`` writes this process's id into
        ``flag_path`` and blocks (raising after ``timeout_s``), so that a test kills the
        process mid-minibatch for sure. A restarted process does not hold."""
        self._hold = (str(flag_path), float(timeout_s))

    def pid(self) -> int:
        return os.getpid()

    def weight_version(self) -> int:
        """The version the engine holds: after a restart, what the new process loaded."""
        return self.engine.weight_version

    def engine_weights(self) -> tuple[int, dict]:
        """Debug seam for tests: (the engine's version, copies of its tensors)."""
        model = getattr(self.engine, "model", None)
        tensors = {} if model is None else {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        return self.engine.weight_version, tensors

    def ready(self) -> int:
        return self.actor_index

