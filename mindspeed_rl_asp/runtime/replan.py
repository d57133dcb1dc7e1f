"""Refit between epochs, and the per-epoch predictor report: an observer of the one loop.

The plan is made once, before training, from predicted lengths (runtime/planning.py),
and replayed every epoch. A run that trains several epochs observes the real lengths of
every prompt it generates; ``scheduler.refit=history`` uses them:

* **What is observed.** Every ``Done(Generate)`` carries a ``MinibatchReport`` whose
  ``lengths`` hold ``n_samples_per_prompt`` rows per prompt, in the order of
  ``Generate.prompt_ids`` (runtime/generation_unit.py). They are collected per base
  prompt id (``tasks.base_prompt_id``: epoch ``e`` renames prompt ``p`` to ``p@e<e>``),
  over the whole run, and per epoch.
* **When.** As soon as at most ``num_actors`` not-yet-dispatched minibatches come before
  the first one of epoch ``e >= 1`` (one ``poll`` hands out at most one minibatch per
  idle actor, so the next one could enter epoch ``e``): :func:`replan_trigger`. Each
  epoch is re-planned once, from what has been observed by then (the previous epoch's
  last minibatches may still be running; their lengths count for the epoch after).
* **The rule** (:func:`blend_lengths`): ``(w * predicted + sum of observed lengths) /
  (w + observed samples)`` per prompt, ``w = scheduler.refit_weight`` (counted in
  samples, default 4): the prediction the run started from is a prior worth ``w``
  samples; every observed sample moves the estimate towards the observed mean. Prompts
  not observed yet keep the prediction.
* **The re-plan.** The epoch's prompts (still pending), with the blended lengths, go
  through the run's own planner (``schedule.configured.build_plan``), epoch ids as
  ``schedule.configured.repeat_for_epochs`` gives them, and are handed to
  ``ControlCore.replan_pending``, which refuses (and changes nothing) a plan the window
  rule rejects; the refusal is recorded and that epoch keeps its first plan.

Files in the run directory:

* ``replan.jsonl``: one line per re-plan: epoch, when (seconds since the start, trainer
  step, minibatches dispatched), prompts observed, Spearman rho of the previous epoch's
  planned vs observed lengths, of the blended vs observed lengths so far (in-sample: the
  blend contains them), the predicted padding bubble of the epoch's old order and of the
  new plan under the blended lengths, planning seconds, accepted or the refusal;
  ``plan_e<e>.json``: the accepted plan.
* ``predictor_by_epoch.json`` (at the end, refit or not): per epoch the Spearman rho /
  Kendall tau of the lengths the plan used for it and the observed mean length per
  prompt, and the realised padding and slot bubble of its minibatches
  (``metrics.timeline``), token-weighted over the epoch.

The observer changes the core only through ``replan_pending``, between two events, when
no ``poll`` is running; a finished core is left alone.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence

from ..control.core import Generate
from ..control.loop import Done, Observer
from ..metrics.timeline import padding_bubble, running_capacity, slot_bubble
from ..tasks import base_prompt_id, epoch_prompt_id, prompt_epoch

__all__ = ["EpochReplanner", "make_epoch_observer", "blend_lengths", "lengths_per_prompt", "replan_trigger",
           "rank_stats", "minibatch_epoch", "REPLAN_FILE", "REPORT_FILE"]

REPLAN_FILE = "replan.jsonl"
REPORT_FILE = "predictor_by_epoch.json"


# --------------------------------------------------------------------------- pure pieces
def lengths_per_prompt(prompt_ids: Sequence[str], lengths: Sequence[int], n_samples: int) -> dict[str, list[int]]:
    """A generated minibatch's lengths by prompt id: rows ``k*n .. (k+1)*n - 1`` belong to
    ``prompt_ids[k]`` (the layout of ``GenerationWorker.generate``)."""
    if len(lengths) != len(prompt_ids) * n_samples:
        raise ValueError(f"{len(lengths)} lengths for {len(prompt_ids)} prompts x n_samples_per_prompt={n_samples}")
    return {pid: list(lengths[k * n_samples:(k + 1) * n_samples]) for k, pid in enumerate(prompt_ids)}


def blend_lengths(predicted: Mapping[str, float], observed_sum: Mapping[str, float],
                  observed_count: Mapping[str, int], weight: float) -> dict[str, float]:
    """``(weight * predicted + observed sum) / (weight + observed count)`` per prompt of
    ``predicted``; a prompt never observed keeps its prediction."""
    if not weight > 0:
        raise ValueError(f"refit weight {weight} must be > 0")
    return {pid: (weight * q + observed_sum.get(pid, 0.0)) / (weight + observed_count.get(pid, 0))
            for pid, q in predicted.items()}


def minibatch_epoch(prompt_ids: Sequence[str]) -> int:
    """The epoch of a minibatch: its first prompt's (``tasks.prompt_epoch``)."""
    return prompt_epoch(prompt_ids[0])


def replan_trigger(pending: Sequence[Sequence[str]], num_actors: int, handled: Iterable[int]) -> Optional[int]:
    """The epoch to re-plan now, or None. ``pending``: the prompt ids of each minibatch not
    yet dispatched, in plan order. It is the first epoch ``e >= 1`` there that is not in
    ``handled``, once at most ``num_actors`` pending minibatches come before its first."""
    done = set(handled)
    for before, ids in enumerate(pending):
        e = minibatch_epoch(ids)
        if e >= 1 and e not in done:
            return e if before <= num_actors else None
    return None


def rank_stats(predicted: Mapping[str, float], observed: Mapping[str, float]) -> dict:
    """Spearman rho and Kendall tau of predicted vs observed over the prompts in both
    (None when fewer than 2, or when one side is constant)."""
    from ..schedule.predictors import kendall_tau, spearman_rho

    keys = sorted(set(predicted) & set(observed))
    out: dict = {"prompts": len(keys), "spearman_rho": None, "kendall_tau": None}
    if len(keys) >= 2:
        x, y = [predicted[k] for k in keys], [observed[k] for k in keys]
        for name, fn in (("spearman_rho", spearman_rho), ("kendall_tau", kendall_tau)):
            v = fn(x, y)
            out[name] = None if math.isnan(v) else round(v, 4)
    return out


def order_bubble(minibatches: Sequence[Sequence[str]], lengths: Mapping[str, float]) -> float:
    """Padding bubble of minibatches (prompt ids) if each prompt had ``lengths`` (n cancels)."""
    return padding_bubble([[lengths[p] for p in ids] for ids in minibatches])


# --------------------------------------------------------------------------- the observer
class EpochReplanner(Observer):
    """Collects observed lengths; with ``refit="history"`` re-plans each later epoch (see the
    module docstring); writes ``replan.jsonl`` and, at the end, ``predictor_by_epoch.json``.

    ``predicted``: base prompt id -> the length the first plan used; ``plan_epoch(items)``:
    the run's planner on ``(base prompt id, length)`` items, returning a ``SchedulePlan``."""

    def __init__(self, run_dir: Path, predicted: Mapping[str, float], n_samples: int, num_actors: int,
                 plan_epoch: Callable, refit: str = "none", weight: float = 4.0, start: float = 0.0,
                 batching: str = "static", max_num_seqs: Optional[int] = None, describe: Optional[dict] = None,
                 handled: Iterable[int] = ()):
        self.run_dir = Path(run_dir)
        self.prior = dict(predicted)
        self.n_samples = n_samples
        self.num_actors = num_actors
        self.plan_epoch = plan_epoch
        self.refit = refit
        self.weight = weight
        self.start = start
        self.batching = batching
        self.max_num_seqs = max_num_seqs
        self.describe = dict(describe or {})
        self.planned: dict[int, dict[str, float]] = {}        # epoch -> base id -> length its plan used
        self.seen: dict[int, dict[str, list[int]]] = {}       # epoch -> base id -> observed lengths
        self.history_sum: dict[str, float] = {}
        self.history_count: dict[str, int] = {}
        self.minibatches: dict[int, list[list[int]]] = {}     # epoch -> lengths of each generated minibatch
        self.handled: set[int] = set(handled)                 # epochs re-planned (or refused) already
        self.replans: list[dict] = []

    # ------------------------------------------------------------------ loop events
    def record_lengths(self, action: Generate, lengths: Sequence[int]) -> None:
        for pid, ls in lengths_per_prompt(action.prompt_ids, lengths, self.n_samples).items():
            base, e = base_prompt_id(pid), prompt_epoch(pid)
            self.seen.setdefault(e, {}).setdefault(base, []).extend(ls)
            self.history_sum[base] = self.history_sum.get(base, 0.0) + float(sum(ls))
            self.history_count[base] = self.history_count.get(base, 0) + len(ls)
        self.minibatches.setdefault(minibatch_epoch(action.prompt_ids), []).append(list(lengths))

    def observed(self, event, core, t: float) -> None:
        if isinstance(event, Done) and isinstance(event.action, Generate) and event.info is not None:
            self.record_lengths(event.action, event.info.lengths)
        if self.refit != "none" and not core.finished:
            d = core.dispatcher
            epoch = replan_trigger([mb.prompt_ids for mb in d.minibatches[d.cursor:]], self.num_actors, self.handled)
            if epoch is not None:
                self.handled.add(epoch)
                self._replan(core, epoch, t)

    def finished(self, outcome, core, t: float) -> None:
        self.write_report()

    # ------------------------------------------------------------------ re-plan
    def _replan(self, core, epoch: int, t: float) -> dict:
        d = core.dispatcher
        pending = list(d.minibatches[d.cursor:])
        mine = [k for k, mb in enumerate(pending) if minibatch_epoch(mb.prompt_ids) == epoch]
        ids = [pid for k in mine for pid in pending[k].prompt_ids]
        bases = [base_prompt_id(pid) for pid in ids]
        prior = {b: self.prior[b] for b in bases}
        blended = blend_lengths(prior, self.history_sum, self.history_count, self.weight)
        last = {b: sum(v) / len(v) for b, v in self.seen.get(epoch - 1, {}).items()}
        so_far = {b: self.history_sum[b] / self.history_count[b] for b in bases if self.history_count.get(b)}
        previous = rank_stats(self.planned_for(epoch - 1), last)
        dispatched_of_epoch = sum(1 for mb in d.minibatches[:d.cursor] if minibatch_epoch(mb.prompt_ids) == epoch)
        record = {
            "epoch": epoch, "time_s": round(t - self.start, 3), "trainer_step": core.trainer_version,
            "dispatched_minibatches": d.cursor, "prompts": len(ids),
            "minibatches_of_epoch_already_dispatched": dispatched_of_epoch,
            "observed_prompts": len(so_far), "observed_samples": sum(self.history_count.get(b, 0) for b in bases),
            "refit_weight": self.weight,
            "spearman_previous_epoch": previous["spearman_rho"], "previous_epoch_prompts": previous["prompts"],
            "spearman_blended_vs_observed_so_far": rank_stats(blended, so_far)["spearman_rho"],
            "spearman_blended_vs_prior": rank_stats(blended, prior)["spearman_rho"],
            "predicted_bubble_old_order": round(order_bubble(
                [[base_prompt_id(p) for p in pending[k].prompt_ids] for k in mine], blended), 4),
        }
        t0 = time.perf_counter()
        try:
            plan = self.plan_epoch([(b, blended[b]) for b in bases])
            # Ids the plan keeps (the replaced minibatches give theirs up); the "r" suffix
            # only when a minibatch of this epoch already went out under such an id.
            replaced = {pending[k].minibatch_id for k in mine}
            taken = {mb.minibatch_id for mb in d.minibatches} - replaced
            suffix = "r" if any(f"e{epoch}g{g}m{m}" in taken for g, group in enumerate(plan.groups)
                                for m in range(len(group))) else ""
            new = [(f"e{epoch}g{g}m{m}{suffix}", tuple(epoch_prompt_id(i, epoch) for i in mb.ids))
                   for g, group in enumerate(plan.groups) for m, mb in enumerate(group)]
            record["predicted_bubble_new_plan"] = round(order_bubble(
                [[base_prompt_id(p) for p in ids_] for _, ids_ in new], blended), 4)
            record["minibatches"] = len(new)
            spliced = ([(mb.minibatch_id, mb.prompt_ids) for mb in pending[:mine[0]]] + new
                       + [(mb.minibatch_id, mb.prompt_ids) for mb in pending[mine[-1] + 1:]])
            core.replan_pending(spliced)
        except ValueError as error:     # ScheduleError is a ValueError too
            record.update(accepted=False, error=str(error), plan_seconds=round(time.perf_counter() - t0, 4))
        else:
            record.update(accepted=True, plan_seconds=round(time.perf_counter() - t0, 4))
            self.planned[epoch] = {**self.planned_for(epoch), **blended}
            plan.save(self.run_dir / f"plan_e{epoch}.json")
        self.replans.append(record)
        with open(self.run_dir / REPLAN_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
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


def make_epoch_observer(cfg, prompts, run_dir: Path, num_actors: int, start: float = 0.0) -> EpochReplanner:
    """The replanner of a run: the first plan's lengths (the task's reference lengths, or
    ``run_dir/predicted_lengths.jsonl`` that the predictor in the loop wrote), the run's
    planner, ``scheduler.refit`` / ``refit_weight``, the engine's batching for the bubbles."""
    from ..schedule.configured import build_plan, task_items
    from ..schedule.plan import read_items_jsonl
    from .length_profile import PREDICTED_LENGTHS

    sched = cfg.scheduler
    refit = str(getattr(sched, "refit", "none"))
    describe = {"scheduler": sched.name, "predictor": sched.predictor}
    lengths_file = Path(run_dir) / PREDICTED_LENGTHS
    if sched.predictor == "reference":
        predicted = dict(task_items(cfg, prompts))
    elif lengths_file.is_file():
        predicted = dict(read_items_jsonl(lengths_file))
    else:   # a run directory from before the file existed (resumed): report only
        predicted, refit = {}, "none"
        describe["note"] = f"no {PREDICTED_LENGTHS} in the run directory: no refit, no rank correlation"
    engine = cfg.engine
    # A resumed run keeps the plans its first segment re-planned (the checkpoint holds
    # the dispatch list): those epochs are not planned again.
    handled = {int(p.stem[len("plan_e"):]) for p in Path(run_dir).glob("plan_e*.json")
               if p.stem[len("plan_e"):].isdigit()}
    return EpochReplanner(
        run_dir, predicted, cfg.rl.n_samples_per_prompt, num_actors, lambda items: build_plan(cfg, items),
        refit=refit, weight=float(getattr(sched, "refit_weight", 4.0)),
        start=start, batching=str(engine.get("batching", "static") or "static"),
        max_num_seqs=engine.get("max_num_seqs"),
        describe=describe, handled=handled)
