"""What a run leaves behind: timeline spans, queue occupancy, per-step metrics.

Files in the run directory: ``timeline.jsonl`` (every actor's spans), ``queue.jsonl``
(occupancy after every event), ``metrics.jsonl`` + ``tensorboard/`` (one record per
training step). Bubbles are measured over the window since the previous step.

``RunRecorder`` is the loop's observer (``control.loop.Observer``): it sees every action
submitted and every event with the cluster's clock, so the Ray runtime (wall clock) and
the simulator (virtual clock) write the same files. The events' ``info`` is the
cluster's report: ``MinibatchReport`` for generation, ``LoadReport`` for a load,
``StepReport`` for a train step (``control/reports.py``).

Bubbles per engine (``metrics/timeline.py``): ``padding_bubble`` is always the static
padding measure; ``slot_bubble`` is the one of the engine's batching (``engine.batching``:
static = the padding bubble, continuous = the running batch's shortfall below
``min(engine.max_num_seqs, rows)``), and ``tail_step_share`` the share of decode steps
with fewer than a quarter of that capacity running (static: of the rows unfinished).
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from ..control.core import AwaitActor, Generate, LoadWeights, Publish, TrainStep
from ..control.loop import Done, Observer
from .timeline import (Span, idle_fraction, padding_bubble, running_capacity, slot_bubble,
                                slot_use, tail_step_share)
from .writer import MetricsWriter


class RunRecorder(Observer):
    def __init__(self, run_dir: Path, num_actors: int, gen_devices: int, on_step: Callable[[dict], None] | None = None,
                 tensorboard: bool = True, start: float = 0.0, engine=None, segment: int = 0,
                 elapsed_before: float = 0.0):
        """``engine``: the engine config (``cfg.engine``); its ``batching`` (static or
        continuous) and ``max_num_seqs`` decide ``slot_bubble`` (default: static).
        Steps and versions are written as the reports carry them (a resumed core starts
        at its checkpoint's version). ``segment``: the version this run segment started
        from (0: the run's first), in every span of ``timeline.jsonl`` (``info["segment"]``);
        ``elapsed_before``: the seconds of the segments before, added to ``elapsed_s``."""
        self.segment, self.elapsed_before = segment, elapsed_before
        self.run_dir = Path(run_dir)
        engine = engine if engine is not None else {}
        self.batching = str(engine.get("batching", "static") or "static")
        self.max_num_seqs = engine.get("max_num_seqs")
        self.lanes = [f"gen-{i}" for i in range(num_actors)]
        self.gen_devices = gen_devices
        self.writer = MetricsWriter(self.run_dir, tensorboard)
        self.on_step = on_step
        self.start = start            # the cluster's clock when the run starts
        self.window_start = self.start
        self._issued: dict = {}       # action -> cluster time it was submitted
        self._train_report = None
        # Only what the current window needs is kept in memory; the files keep everything.
        self.spans: list[Span] = []
        self._window_lengths: list[list[int]] = []
        self._window_capacity: list[int] = []   # running-batch capacity of each minibatch
        self._window_tokens = 0
        self._window_refresh_s: list[float] = []
        self._queue_rows: list[dict] = []
        self._timeline = open(self.run_dir / "timeline.jsonl", "a", encoding="utf-8")
        self._queue = open(self.run_dir / "queue.jsonl", "a", encoding="utf-8")
        self.failures = 0
        self.load_failures = 0
        # Every fault, for summary.json "faults": {t (s since the start), actor, kind, minibatch}
        # with kind died | restarted | retired | restart_pending (at the end) | generate_failed |
        # load_failed | load_retried.
        self.faults: list[dict] = []
        self._died_at: dict[int, float] = {}      # actor -> cluster time its process was lost
        self._rejected_before = 0                 # dynamic sampling counts at the last step
        self._extra_before = 0
        self._load_failed: set[int] = set()       # actors whose last load failed (raised)

    # ------------------------------------------------------------------ the loop's observer
    def submitted(self, action, t: float) -> None:
        self._issued[action] = t
        if isinstance(action, LoadWeights) and action.actor in self._load_failed:
            self._load_failed.discard(action.actor)
            self.fault(t, action.actor, "load_retried", version=action.version)

    def observed(self, event, core, t: float) -> None:
        action = event.action
        issued = self._issued.pop(action, t)
        lost = getattr(event, "lost", False)
        if isinstance(action, Generate):
            if isinstance(event, Done):
                self.generated(event.info, len(action.prompt_ids))
            else:
                self.failure(action, issued, t, event.error)
                self.fault(t, action.actor, "died" if lost else "generate_failed", action.minibatch_id,
                           error=_first_line(event.error))
        elif isinstance(action, LoadWeights):
            if isinstance(event, Done):
                self.loaded(event.info, issued, t)
            else:
                self.load_failure(action, issued, t, event.error)
                self.fault(t, action.actor, "died" if lost else "load_failed", version=action.version,
                           error=_first_line(event.error))
                if not lost:
                    self._load_failed.add(action.actor)
        elif isinstance(action, AwaitActor):
            self.actor_back(action.actor, isinstance(event, Done), t,
                            event.info if isinstance(event, Done) else event.error)
        elif isinstance(action, TrainStep):
            self._train_report = event.info
        elif isinstance(action, Publish):
            self.stepped(self._train_report, issued, t, core.snapshot())
        self.queue_sample(core.snapshot(), t)

    def _add(self, span: Span) -> None:
        self.spans.append(span)
        self._write_span(span)

    def _write_span(self, span: Span) -> None:
        row = asdict(span)
        row["info"]["segment"] = self.segment
        self._timeline.write(json.dumps(row) + "\n")
        self._timeline.flush()

    def generated(self, report, prompts: int) -> None:
        self._window_lengths.append(report.lengths)
        capacity = running_capacity(self.batching, len(report.lengths), self.max_num_seqs)
        self._window_capacity.append(capacity)
        use = slot_use(report.lengths, capacity)
        self._window_tokens += report.num_tokens
        self._add(Span(f"gen-{report.actor}", "generate", report.start, report.end, report.minibatch_id,
                       {"version": report.version, "prompts": prompts, "tokens": report.num_tokens,
                        "max_length": max(report.lengths, default=0), "rows": len(report.lengths),
                        "capacity": capacity, "steps": use.steps, "tail_steps": use.tail_steps}))

    def loaded(self, report, issued: float, done: float) -> None:
        """``issued``..``done`` is the refresh as the Control Unit sees it, including
        Ray fetching the snapshot to the actor, which the actor's own span leaves out."""
        self._window_refresh_s.append(done - issued)
        meta = {"round_trip_s": done - issued}
        # How the version came (runtime/transport.py): bytes, and for the collective
        # transport the wait for buckets, the swap into the engine, the transfer itself.
        for key in ("transport", "bytes", "wait_s", "swap_s", "transfer_s"):
            if getattr(report, key, None):
                meta[key] = getattr(report, key)
        self._add(Span(f"gen-{report.actor}", "load_weights", report.start, report.end,
                       f"v{report.version}", meta))

    def failure(self, action, start: float, end: float, error: str) -> None:
        self.failures += 1
        self._add(Span(f"gen-{action.actor}", "failed", start, end, action.minibatch_id,
                       {"error": _first_line(error)}))

    def fault(self, t: float, actor: int, kind: str, minibatch: str | None = None, **detail) -> None:
        """One fault for summary.json."""
        if kind == "died":
            self._died_at[actor] = t
            self._load_failed.discard(actor)
        self.faults.append({"t": round(t - self.start, 3), "actor": actor, "kind": kind,
                            "minibatch": minibatch, **detail})

    def actor_back(self, actor: int, restarted: bool, t: float, detail) -> None:
        """A lost actor came back (``detail``: the version it holds) or was retired; the
        time it was away is a ``restart`` (or ``retired``) span on its lane."""
        died = self._died_at.pop(actor, t)
        if restarted:
            self.fault(t, actor, "restarted", version=int(detail))
        else:
            self.fault(t, actor, "retired", error=_first_line(detail))
        # In timeline.jsonl only: the time away counts as idle in generation_idle_fraction.
        self._write_span(Span(f"gen-{actor}", "restart" if restarted else "retired", died, t, "", {"back": restarted}))

    def load_failure(self, action, start: float, end: float, error: str) -> None:
        self.load_failures += 1
        self._add(Span(f"gen-{action.actor}", "load_failed", start, end, f"v{action.version}",
                       {"error": _first_line(error)}))

    def queue_sample(self, snap, t: float) -> None:
        row = {"time": t, "queued": snap.queued_samples, "in_flight": snap.in_flight_samples,
               "capacity": snap.queue_capacity, "throttled": snap.throttled, "trainer_wait": snap.trainer_wait}
        self._queue_rows.append(row)
        self._queue.write(json.dumps(row) + "\n")
        self._queue.flush()

    def stepped(self, report, publish_start: float, publish_end: float, snap) -> dict:
        """Close the window of training step ``report.step`` and write its metrics."""
        now = publish_end
        step, version = report.step, report.version
        self._add(Span("train", "train", report.start, report.end, f"step {step}"))
        self._add(Span("train", "publish", publish_start, publish_end, f"v{version}"))
        window = [s for s in self.spans if s.end > self.window_start]
        tokens = self._window_tokens  # of the minibatches that finished in the window
        elapsed = now - self.window_start
        loads = self._window_refresh_s
        queued = [r["queued"] for r in self._queue_rows]
        metrics = {
            "elapsed_s": now - self.start + self.elapsed_before,
            "iteration_time_s": elapsed,
            "train_time_s": report.end - report.start,
            "publish_time_s": publish_end - publish_start,
            "generated_tokens": tokens,
            "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
            "tokens_per_s_per_device": tokens / elapsed / max(self.gen_devices, 1) if elapsed > 0 else 0.0,
            "padding_bubble": padding_bubble(self._window_lengths),
            "slot_bubble": slot_bubble(self._window_lengths, self._window_capacity),
            "tail_step_share": tail_step_share(self._window_lengths, self._window_capacity),
            "generation_idle_fraction": idle_fraction(window, self.lanes, self.window_start, now),
            "trainer_idle_fraction": idle_fraction(window, ["train"], self.window_start, now),
            "weight_refresh_s_mean": sum(loads) / len(loads) if loads else 0.0,
            "weight_refreshes": len(loads),
            "queue_samples_mean": sum(queued) / len(queued) if queued else 0.0,
            "queue_samples_max": max(queued, default=0),
            "generation_failures": self.failures,
            "load_failures": self.load_failures,
            "actor_deaths": sum(f["kind"] == "died" for f in self.faults),
            # Dynamic sampling (algo.filter_groups): groups rejected and minibatches generated
            # to make up for them since the previous step (0 without it).
            "rejected_groups": snap.rejected_prompts - self._rejected_before,
            "extra_minibatches": snap.extra_minibatches - self._extra_before,
            **report.metrics,
        }
        self._rejected_before, self._extra_before = snap.rejected_prompts, snap.extra_minibatches
        self.writer.write(step, metrics)
        self.write_rollouts(step, getattr(report, "rollouts", ()))
        self.window_start = now
        self._window_lengths, self._window_tokens, self._window_refresh_s = [], 0, []
        self._window_capacity = []
        self._queue_rows = []
        self.spans = [s for s in self.spans if s.end > now]
        if self.on_step:
            self.on_step({"step": step, **metrics})
        return metrics

    def write_rollouts(self, step: int, records) -> None:
        """What the model wrote in step ``step`` (record.rollouts): rollouts.jsonl."""
        if not records:
            return
        with open(self.run_dir / "rollouts.jsonl", "a", encoding="utf-8") as f:
            f.write("".join(json.dumps({"step": step, **r}) + "\n" for r in records))

    def finished(self, outcome, core, t: float) -> None:
        """An actor still restarting when the run ended (its probe cancelled or drained
        without an answer) is recorded as ``restart_pending``."""
        for action in outcome.leftover:
            if isinstance(action, AwaitActor) and action.actor in self._died_at:
                self.fault(t, action.actor, "restart_pending")

    def close(self) -> None:
        self.writer.close()
        self._timeline.close()
        self._queue.close()


def _first_line(error: str) -> str:
    lines = str(error).splitlines()
    return lines[0][:200] if lines else ""


def dynamic_sampling_summary(snap, filter_groups: str) -> dict:
    """summary.json's ``dynamic_sampling``: the rule, and in all the groups it rejected
    and the minibatches generated to make up for them (a ``core.snapshot()``)."""
    return {"filter_groups": filter_groups, "rejected_groups": snap.rejected_prompts,
            "extra_minibatches": snap.extra_minibatches}
