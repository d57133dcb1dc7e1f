"""The per-epoch predictor report and the re-plan records: an observer of the one loop.

The plan is made once, before training, from predicted lengths (schedule/planning.py),
and replayed every epoch. With ``scheduler.refit=history`` the control core re-plans each
later epoch from the lengths it observed (the rule: ``control/replan.py``; the planning
function and its statistics: ``schedule/refit.py``; ``schedule/assembly.assemble_core``
builds the core with the rule, and ``schedule/assembly.assemble_observers`` this
observer, for the Ray driver and the simulator alike). This observer decides nothing: it
reads what the core recorded (``ControlCore.replans``) and what the events report, and writes:

* ``replan.jsonl``: one line per re-plan: epoch, when (seconds since the start, trainer
  step, minibatches dispatched), prompts and minibatches, prompts observed, Spearman rho
  of the previous epoch's planned vs observed lengths, of the blended vs observed lengths
  so far (in-sample: the blend contains them), the predicted padding bubble of the
  epoch's old order and of the new plan under the blended lengths, accepted or the
  refusal; ``plan_e<e>.json``: the accepted plan.
* ``predictor_by_epoch.json`` (at the end, refit or not): per epoch the Spearman rho /
  Kendall tau of the lengths the plan used for it and the observed mean length per
  prompt, and the realised padding and slot bubble of its minibatches
  (``metrics.timeline``), token-weighted over the epoch.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Optional, Sequence

from ..control.core import Generate
from ..control.loop import Done, Observer
from ..control.replan import ReplanRecord, lengths_by_prompt
from ..metrics.timeline import padding_bubble, running_capacity, slot_bubble
from ..tasks import base_prompt_id, prompt_epoch
from .refit import blend_lengths, order_bubble, rank_stats

__all__ = ["EpochReplanner", "blend_lengths", "lengths_per_prompt",
           "rank_stats", "minibatch_epoch", "order_bubble", "REPLAN_FILE", "REPORT_FILE"]

REPLAN_FILE = "replan.jsonl"
REPORT_FILE = "predictor_by_epoch.json"


def lengths_per_prompt(prompt_ids: Sequence[str], lengths: Sequence[int], n_samples: int) -> dict[str, list[int]]:
    """A generated minibatch's lengths by prompt id (``control.replan.lengths_by_prompt``, as lists)."""
    return {pid: list(ls) for pid, ls in lengths_by_prompt(prompt_ids, lengths, n_samples).items()}


def minibatch_epoch(prompt_ids: Sequence[str]) -> int:
    """The epoch of a minibatch: its first prompt's (``tasks.prompt_epoch``)."""
    return prompt_epoch(prompt_ids[0])


# --------------------------------------------------------------------------- the observer
class EpochReplanner(Observer):
    """Collects observed lengths for the per-epoch report and writes each re-plan the core
    recorded (``ControlCore.replans``) to ``replan.jsonl`` and ``plan_e<e>.json``; at the
    end, ``predictor_by_epoch.json`` (see the module docstring).

    ``predicted``: base prompt id -> the length the first plan used; ``refit``: the
    run's ``scheduler.refit`` (for the report only: the core holds the rule)."""

    def __init__(self, run_dir: Path, predicted: Mapping[str, float], n_samples: int, refit: str = "none",
                 weight: float = 4.0, start: float = 0.0, batching: str = "static",
                 max_num_seqs: Optional[int] = None, describe: Optional[dict] = None):
        self.run_dir = Path(run_dir)
        self.prior = dict(predicted)
        self.n_samples = n_samples
        self.refit = refit
        self.weight = weight
        self.start = start
        self.batching = batching
        self.max_num_seqs = max_num_seqs
        self.describe = dict(describe or {})
        self.planned: dict[int, dict[str, float]] = {}        # epoch -> base id -> length its plan used
        self.seen: dict[int, dict[str, list[int]]] = {}       # epoch -> base id -> observed lengths
        self.history_count: dict[str, int] = {}
        self.minibatches: dict[int, list[list[int]]] = {}     # epoch -> lengths of each generated minibatch
        self.replans: list[dict] = []
        self.last_t = start                                   # the clock at the last event

    # ------------------------------------------------------------------ loop events
    def record_lengths(self, action: Generate, lengths: Sequence[int]) -> None:
        for pid, ls in lengths_per_prompt(action.prompt_ids, lengths, self.n_samples).items():
            base, e = base_prompt_id(pid), prompt_epoch(pid)
            self.seen.setdefault(e, {}).setdefault(base, []).extend(ls)
            self.history_count[base] = self.history_count.get(base, 0) + len(ls)
        self.minibatches.setdefault(minibatch_epoch(action.prompt_ids), []).append(list(lengths))

    def observed(self, event, core, t: float) -> None:
        # The core re-plans inside the poll that followed the previous event, when the
        # clock read ``last_t`` (the clock does not move between an event and that poll).
        self.write_replans(core.replans[len(self.replans):])
        if isinstance(event, Done) and isinstance(event.action, Generate) and event.info is not None:
            self.record_lengths(event.action, event.info.lengths)
        self.last_t = t

    def finished(self, outcome, core, t: float) -> None:
        self.write_replans(core.replans[len(self.replans):])
        self.write_report()

    # ------------------------------------------------------------------ re-plans
    def write_replans(self, made: Sequence[ReplanRecord]) -> None:
        for r in made:
            record = self.replan_line(r)
            if r.accepted:
                self.planned[r.epoch] = {**self.planned_for(r.epoch), **r.note["lengths"]}
                r.note["plan"].save(self.run_dir / f"plan_e{r.epoch}.json")
            self.replans.append(record)
            with open(self.run_dir / REPLAN_FILE, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def replan_line(self, r: ReplanRecord) -> dict:
        """One line of ``replan.jsonl`` from the core's record and its planner's note."""
        note = r.note or {}
        previous = rank_stats(self.planned_for(r.epoch - 1), note.get("previous_epoch_observed", {}))
        record = {"epoch": r.epoch, "time_s": round(self.last_t - self.start, 3), "trainer_step": r.trainer_version,
                  "dispatched_minibatches": r.dispatched_minibatches, "prompts": r.prompts,
                  "spearman_previous_epoch": previous["spearman_rho"], "previous_epoch_prompts": previous["prompts"],
                  **note.get("stats", {}), "accepted": r.accepted}
        if r.accepted:
            record["minibatches"] = r.minibatches
        else:
            record["error"] = r.error
        return record

    def planned_for(self, epoch: int) -> dict[str, float]:
        """Base id -> the length the plan of ``epoch`` used (the first plan's unless re-planned)."""
        return self.planned.get(epoch, self.prior)

    # ------------------------------------------------------------------ report
    def epoch_report(self) -> list[dict]:
        out = []
        for e in sorted(set(self.seen) | set(self.minibatches)):
            observed = {b: sum(v) / len(v) for b, v in self.seen.get(e, {}).items()}
            groups = self.minibatches.get(e, [])
            capacities = [running_capacity(self.batching, len(g), self.max_num_seqs) for g in groups]
            out.append({
                "epoch": e, "replanned": e in self.planned,
                **rank_stats(self.planned_for(e), observed),
                "complete": len(observed) == len(self.history_count),   # every prompt the run has seen
                "padding_bubble": round(padding_bubble(groups), 4),
                "slot_bubble": round(slot_bubble(groups, capacities), 4),
                "minibatches": len(groups), "generated_tokens": sum(sum(g) for g in groups),
                "observed_mean_length": round(sum(sum(g) for g in groups) / max(sum(len(g) for g in groups), 1), 2),
            })
        return out

    def write_report(self) -> Path:
        report = {**self.describe, "refit": self.refit, "refit_weight": self.weight,
                  "replans": len(self.replans), "replans_accepted": sum(r.get("accepted", False) for r in self.replans),
                  "epochs": self.epoch_report()}
        path = self.run_dir / REPORT_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path
