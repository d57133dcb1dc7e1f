"""Refit between epochs (``scheduler.refit=history``): the planning function of the core's
re-plan rule (``control/replan.py``), and the statistics its records carry. Pure.

* **The rule** (:func:`blend_lengths`): ``(w * predicted + sum of observed lengths) /
  (w + observed samples)`` per prompt, ``w = scheduler.refit_weight`` (counted in
  samples): the prediction the run started from is a prior worth ``w`` samples; every
  observed sample (of any epoch: a prompt is the same prompt in every pass) moves the
  estimate towards the observed mean. Prompts not observed yet keep the prediction.
* **The re-plan** (:func:`refit_epoch`): the epoch's pending prompts, with the blended
  lengths, go through the run's own planner; minibatch ids ``e<e>g<g>m<m>`` and prompt
  ids ``<id>@e<e>`` as ``schedule.configured.repeat_for_epochs`` gives them (the core
  re-plans an epoch before any of it is dispatched, so the ids it replaces are free).
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, Iterable, Mapping, Sequence

from ..metrics.timeline import padding_bubble
from ..tasks import base_prompt_id, epoch_prompt_id, prompt_epoch

__all__ = ["blend_lengths", "observed_totals", "rank_stats", "order_bubble", "refit_epoch", "epoch_replan"]


def blend_lengths(predicted: Mapping[str, float], observed_sum: Mapping[str, float],
                  observed_count: Mapping[str, int], weight: float) -> dict[str, float]:
    """``(weight * predicted + observed sum) / (weight + observed count)`` per prompt of
    ``predicted``; a prompt never observed keeps its prediction."""
    if not weight > 0:
        raise ValueError(f"refit weight {weight} must be > 0")
    return {pid: (weight * q + observed_sum.get(pid, 0.0)) / (weight + observed_count.get(pid, 0))
            for pid, q in predicted.items()}


def observed_totals(observed: Mapping[str, Sequence[int]], epoch: int | None = None) -> tuple[dict, dict]:
    """(base id -> sum of observed lengths, base id -> samples observed) over every epoch,
    or over ``epoch``'s ids alone."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for pid, lengths in observed.items():
        if epoch is None or prompt_epoch(pid) == epoch:
            base = base_prompt_id(pid)
            sums[base] = sums.get(base, 0.0) + float(sum(lengths))
            counts[base] = counts.get(base, 0) + len(lengths)
    return sums, counts


def means(sums: Mapping[str, float], counts: Mapping[str, int]) -> dict[str, float]:
    return {b: sums[b] / counts[b] for b in sums if counts.get(b)}


def rank_stats(predicted: Mapping[str, float], observed: Mapping[str, float]) -> dict:
    """Spearman rho and Kendall tau of predicted vs observed over the prompts in both
    (None when fewer than 2, or when one side is constant)."""
    from .predictors import kendall_tau, spearman_rho

    keys = sorted(set(predicted) & set(observed))
    out: dict = {"prompts": len(keys), "spearman_rho": None, "kendall_tau": None}
    if len(keys) >= 2:
        x, y = [predicted[k] for k in keys], [observed[k] for k in keys]
        for name, fn in (("spearman_rho", spearman_rho), ("kendall_tau", kendall_tau)):
            v = fn(x, y)
            out[name] = None if math.isnan(v) else round(v, 4)
    return out


def order_bubble(minibatches: Iterable[Sequence[str]], lengths: Mapping[str, float]) -> float:
    """Padding bubble of minibatches (base prompt ids) if each prompt had ``lengths`` (n cancels)."""
    return padding_bubble([[lengths[p] for p in ids] for ids in minibatches])


def refit_epoch(plan_items: Callable, prior: Mapping[str, float], weight: float, epoch: int,
                old: Sequence[Sequence[str]], observed: Mapping[str, Sequence[int]]) -> tuple[list, dict]:
    """The planning function of ``control.replan.EpochReplan`` (with ``plan_items``, ``prior``
    and ``weight`` bound by :func:`epoch_replan`): epoch ``epoch``'s pending minibatches
    ``old`` (prompt ids) planned again on the blended lengths. Returns the minibatches
    (``(id, prompt ids)``) and a note: the plan, the lengths it used (base id ->), the
    previous epoch's observed means, and the record's statistics. A planner's refusal is
    its ``ScheduleError`` (a ``ValueError``: the core records it and keeps the plan)."""
    old_bases = [[base_prompt_id(p) for p in ids] for ids in old]
    bases = [b for ids in old_bases for b in ids]
    sums, counts = observed_totals(observed)
    blended = blend_lengths({b: prior[b] for b in bases}, sums, counts, weight)
    so_far = means({b: sums[b] for b in bases if b in sums}, counts)
    plan = plan_items([(b, blended[b]) for b in bases])
    new = [(f"e{epoch}g{g}m{m}", tuple(epoch_prompt_id(i, epoch) for i in mb.ids))
           for g, group in enumerate(plan.groups) for m, mb in enumerate(group)]
    stats = {
        "observed_prompts": len(so_far), "observed_samples": sum(counts.get(b, 0) for b in bases),
        "refit_weight": weight,
        "spearman_blended_vs_observed_so_far": rank_stats(blended, so_far)["spearman_rho"],
        "spearman_blended_vs_prior": rank_stats(blended, {b: prior[b] for b in bases})["spearman_rho"],
        "predicted_bubble_old_order": round(order_bubble(old_bases, blended), 4),
        "predicted_bubble_new_plan": round(order_bubble([[base_prompt_id(p) for p in ids] for _, ids in new],
                                                        blended), 4),
    }
    previous = means(*observed_totals(observed, epoch - 1))
    return new, {"plan": plan, "lengths": blended, "previous_epoch_observed": previous, "stats": stats}


def epoch_replan(plan_items: Callable, prior: Mapping[str, float], weight: float, done: Iterable[int] = ()):
    """The core's re-plan rule for a run: :func:`refit_epoch` over the run's planner
    (``plan_items``: ``(base id, length)`` items -> ``SchedulePlan``) and the lengths its
    first plan used (``prior``: base id ->); ``done``: epochs re-planned before (a resumed run's)."""
    from ..control.replan import EpochReplan

    return EpochReplan(partial(refit_epoch, plan_items, dict(prior), float(weight)), prompt_epoch,
                       frozenset(done))
