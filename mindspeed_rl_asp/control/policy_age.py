"""Policy age: how many versions a trained prompt group lags behind the trainer.

A group generated with behaviour version ``w`` and consumed by step ``s`` has age
``s - w`` (the version is on the data; the age is measured where the trainer consumes).
One histogram, counted in prompt groups, for every place that reports ages: the control
core (summary.json, the checkpoint's control state), the trainer's and the simulator's
per-step metrics (``policy_age_hist`` / ``_mean`` / ``_max``) and the simulator's
totals. Groups, not samples: every sample of a group carries the group's version, so the
mean is the same either way, and the core, which holds no samples, counts groups.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Union

__all__ = ["age_histogram", "age_metrics", "merge_age_histograms"]

Histogram = Mapping[Union[int, str], int]   # age -> prompt groups; str keys as read back from JSON


def age_histogram(step: int, versions: Iterable[int]) -> dict[int, int]:
    """``{age: groups}`` of the groups of behaviour ``versions`` consumed by ``step``,
    sorted by age. A version newer than the step is a bookkeeping error: ValueError."""
    ages = Counter(int(step) - int(v) for v in versions)
    negative = sorted(a for a in ages if a < 0)
    if negative:
        raise ValueError(f"behaviour versions newer than step {step}: ages {negative}")
    return dict(sorted(ages.items()))


def merge_age_histograms(*histograms: Histogram) -> dict[int, int]:
    """Histograms summed (the segments of a resumed run, the steps of a run), sorted by
    age; keys may be ints or the strings JSON gives back."""
    total: Counter[int] = Counter()
    for histogram in histograms:
        for age, count in histogram.items():
            total[int(age)] += int(count)
    return dict(sorted(total.items()))


def age_metrics(histogram: Histogram) -> dict:
    """A step's (or run's) age metrics: ``policy_age_hist`` (string keys, for JSON),
    ``policy_age_mean`` and ``policy_age_max`` (0 for no groups)."""
    merged = merge_age_histograms(histogram)
    groups = sum(merged.values())
    return {"policy_age_hist": {str(a): n for a, n in merged.items()},
            "policy_age_mean": sum(a * n for a, n in merged.items()) / groups if groups else 0.0,
            "policy_age_max": max(merged, default=0)}
