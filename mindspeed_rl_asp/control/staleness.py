"""Bounded staleness: AReaL-style admission at dispatch plus a deadline check at the trainer.

Notation (docs/control.md has the proofs): ``B`` = global_batch_size (prompts per step),
``eta`` = max_staleness, ``T`` = total_steps, step ``s`` trains version ``s`` into ``s + 1``.
A prompt carries its behaviour version ``w`` (the generating actor's weights); consumed at
step ``s`` its policy age is ``s - w``. Its *deadline* is ``w + eta``: the last step that
may consume it.

Two rules, both counted in prompts:

* **Admission** (AReaL's ``staleness_manager``): a minibatch of ``k`` prompts that will be
  generated with version ``w`` is admitted only if ``admitted + k <= (eta + w + 1) * B``,
  ``admitted`` = every dispatched prompt not returned by a failure (running, queued and
  consumed alike). AReaL reads the current version; here it is the version the minibatch
  will carry, which the refresh policy makes the latest published one.
* **Deadline check**: the trainer starts step ``s`` with the ``B`` oldest queued prompts
  ``S`` only if, for every ``t`` in ``[s, T - 1]``, the outstanding prompts (queued or
  running) outside ``S`` with deadline ``<= t`` number at most ``(t - s) * B``. Otherwise
  it waits. Prompts with deadline ``>= T`` are unconstrained: no later step exists.

Invariant (I): with ``s`` = steps started, for every ``t <= T - 1`` the outstanding prompts
with deadline ``<= t`` number at most ``max(0, t - s + 1) * B``. Admission preserves it
for new work with ``w >= s - 1`` (the core guarantees that), the deadline check preserves
it at step start; with (I), no consumed prompt is older than ``eta`` and a trainer whose
work has all arrived can always start (the oldest-first pick passes the check).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

__all__ = ["StalenessControl", "WindowGap", "first_window_gap"]


class StalenessControl:
    """Admission counter and deadline check; holds counts and versions, never prompt ids.

    Invariant: ``admitted`` equals the prompts dispatched and not retracted; the
    ``outstanding`` counts per behaviour version sum to ``admitted`` minus the consumed
    prompts; no prompt is ever consumed with age above ``max_staleness`` (``consume``
    raises ``AssertionError`` on such an internal error rather than record it).
    """

    def __init__(self, max_staleness: int, global_batch_size: int, total_steps: int,
                 start_version: int = 0) -> None:
        """``start_version``: a resumed run's first step; the ``start_version x B`` prompts
        the steps before it consumed count as admitted and consumed, so admission reads the
        same numbers as in a run that was never stopped (its queued and running work is
        regenerated, so nothing is outstanding at the start)."""
        self.max_staleness = max_staleness
        self.global_batch_size = global_batch_size
        self.total_steps = total_steps
        self.admitted = start_version * global_batch_size
        self.consumed = start_version * global_batch_size
        self._outstanding: Counter[int] = Counter()

    # ------------------------------------------------------------------ admission
    def headroom(self, version: int) -> int:
        """Prompts that may still be admitted for generation with ``version``."""
        return (self.max_staleness + version + 1) * self.global_batch_size - self.admitted

    def admits(self, prompts: int, version: int) -> bool:
        return prompts <= self.headroom(version)

    def dispatch(self, prompts: int, version: int) -> None:
        if not self.admits(prompts, version):
            raise ValueError(f"{prompts} prompts at version {version} exceed the headroom "
                             f"{self.headroom(version)}")
        self.admitted += prompts
        self._outstanding[version] += prompts

    def retract(self, prompts: int, version: int) -> None:
        """A failed minibatch's prompts go back to the plan: they were never accepted."""
        if self._outstanding[version] < prompts:
            raise ValueError(f"cannot retract {prompts} prompts of version {version}: "
                             f"only {self._outstanding[version]} outstanding")
        self.admitted -= prompts
        self._outstanding[version] -= prompts
        if not self._outstanding[version]:
            del self._outstanding[version]

    # ------------------------------------------------------------------ trainer side
    def deadline(self, version: int) -> int:
        return version + self.max_staleness

    def outstanding(self) -> dict[int, int]:
        """Behaviour version -> dispatched prompts not yet consumed (queued or running)."""
        return dict(sorted(self._outstanding.items()))

    def feasible(self, step: int, selected_versions: Iterable[int]) -> bool:
        """The deadline check: may ``step`` start consuming prompts of ``selected_versions``?"""
        selected = Counter(selected_versions)
        if any(self.deadline(w) < step or w > step for w in selected):
            return False
        if any(self._outstanding[w] < c for w, c in selected.items()):
            raise ValueError(f"selection {dict(selected)} is not outstanding")
        remaining = self._outstanding - selected
        due = 0
        for w in sorted(remaining):
            t = self.deadline(w)
            if t > self.total_steps - 1:
                break
            due += remaining[w]
            if due > (t - step) * self.global_batch_size:
                return False
        return True

    def consume(self, step: int, versions: Sequence[int]) -> list[int]:
        """Commit step ``step`` taking prompts of ``versions``; returns their policy ages."""
        ages = [step - w for w in versions]
        if not all(0 <= a <= self.max_staleness for a in ages):
            # feasible() is checked first, so this is a bug in the caller, never a user error.
            raise ValueError(f"step {step} cannot consume behaviour versions {list(versions)}: "
                             f"ages must lie in 0..max_staleness={self.max_staleness}")
        for w in versions:
            self._outstanding[w] -= 1
            if not self._outstanding[w]:
                del self._outstanding[w]
        self.consumed += len(versions)
        return ages


# ---------------------------------------------------------------------- plan check
@dataclass(frozen=True)
class WindowGap:
    """Step ``step`` can never be filled: the minibatch at plan index ``index`` straddles
    its window. ``before`` prompts precede it; ``limit`` is the most that may be dispatched
    while the trainer waits at that step; ``needed`` = (step + 1) * B."""

    step: int
    index: int
    before: int
    limit: int
    needed: int


def first_window_gap(sizes: Sequence[int], global_batch_size: int, max_staleness: int,
                     capacity_prompts: int, total_steps: int,
                     refresh_interval: int = 1, start_version: int = 0) -> Optional[WindowGap]:
    """Exact liveness test of an in-order plan (sizes in prompts, dispatch order).

    While the trainer waits at step ``s`` (versions ``0..s`` published, ``s * B`` consumed)
    actors generate with ``r_s = s - s % refresh_interval`` (the refresh target), so
    dispatch can reach the longest plan prefix of at most
    ``limit_s = min((eta + r_s + 1) * B, s * B + capacity_prompts)`` prompts and no further;
    the step needs ``(s + 1) * B``. Returns the first step for which no prefix sum lies in
    ``[(s + 1) * B, limit_s]``, or None when every step up to ``total_steps`` can fill.
    A plan resumed at ``start_version`` (``v``) starts with ``v * B`` prompts consumed, its
    steps run from ``v``, and its actors hold ``v``, so ``r_s = max(v, s - s % refresh_interval)``.
    """
    b = global_batch_size
    j, prefix = 0, start_version * b  # prefix = v * B + sizes[0] + ... + sizes[j - 1]
    for s in range(start_version, total_steps):
        refresh = max(start_version, s - s % refresh_interval)
        limit = min((max_staleness + refresh + 1) * b, s * b + capacity_prompts)
        while j < len(sizes) and prefix + sizes[j] <= limit:
            prefix += sizes[j]
            j += 1
        if prefix < (s + 1) * b:
            return WindowGap(step=s, index=j, before=prefix, limit=limit, needed=(s + 1) * b)
    return None
