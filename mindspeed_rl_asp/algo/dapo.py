"""DAPO's two reward-side pieces (Yu et al. 2025, "DAPO: an open-source LLM reinforcement
learning system at scale"), small pure functions over plain data:

* **Overlong reward shaping** (the paper's "soft overlong punishment"): with ``L_max`` =
  ``generate.sampling_config.max_tokens`` and ``L_cache`` = ``algo.overlong_buffer_len``,
  a response of ``|y|`` tokens gets ``0`` while ``|y| <= L_max - L_cache`` and
  ``((L_max - L_cache) - |y|) / L_cache`` inside the buffer, times
  ``algo.overlong_penalty_factor``: down to ``-factor`` at ``|y| = L_max``, never below
  (the excess is capped at ``L_cache``, as MindSpeed-RL's ``rule_verifier`` caps it).
  It is added to the reward as a component named ``overlong``.
* **The filter metric** of dynamic sampling (``algo.filter_groups_metric``): which number
  of a sample's score the reject rule (``control/rejection.py``) compares within a group.

Both are applied where samples are scored, on the rollout side (``score_samples``).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["OVERLONG", "overlong_penalty", "shape_score", "filter_metric", "check_filter_metric",
           "score_samples"]

OVERLONG = "overlong"


def overlong_penalty(length: int, max_tokens: int, buffer_len: int, factor: float) -> float:
    """DAPO's soft overlong punishment of a response of ``length`` tokens (see the module
    docstring); ``buffer_len=0``: 0 (off). ``ValueError`` if the buffer is not shorter
    than ``max_tokens`` (MindSpeed-RL refuses that too) or a value is negative."""
    if buffer_len < 0 or factor < 0 or length < 0:
        raise ValueError(f"overlong_penalty(length={length}, buffer_len={buffer_len}, factor={factor}): "
                         "none may be negative")
    if buffer_len == 0:
        return 0.0
    if buffer_len >= max_tokens:
        raise ValueError(f"algo.overlong_buffer_len={buffer_len} must be below "
                         f"generate.sampling_config.max_tokens={max_tokens}")
    exceed = min(length - (max_tokens - buffer_len), buffer_len)
    return min(-exceed / buffer_len * factor, 0.0)


def shape_score(score: Mapping[str, Any], length: int, max_tokens: int, buffer_len: int,
                factor: float) -> dict:
    """``score`` (a task's ``{"reward", "correctness", "integrity", "components"}``) with
    the overlong penalty added to ``reward`` and listed as the ``overlong`` component;
    unchanged (a copy) when ``buffer_len=0``."""
    out = dict(score)
    out["components"] = dict(score["components"])
    if buffer_len > 0:
        penalty = overlong_penalty(length, max_tokens, buffer_len, factor)
        out["reward"] = score["reward"] + penalty
        out["components"][OVERLONG] = penalty
    return out


def check_filter_metric(metric: str, components: Sequence[str]) -> None:
    """``ValueError`` naming the choices unless :func:`filter_metric` can read ``metric``."""
    if metric not in ("acc", "reward", "correctness") and metric not in components:
        raise ValueError(f"algo.filter_groups_metric={metric!r} is not a reward of this task; use one of "
                         f"{', '.join(sorted(set(components) | {'acc', 'reward'}))} (acc: the task's "
                         "correctness reward; reward: the total, shaped reward)")


def filter_metric(score: Mapping[str, Any], metric: str) -> float:
    """The number the reject rule compares: the reward component named ``metric`` (the
    task's ``task.verifier_function`` names, as MindSpeed-RL's ``filter_groups_metric``
    names a verifier); ``acc`` (when no component has that name) or ``correctness``: the
    task's correctness (1.0 or 0.0); ``reward``: the total reward, shaping included."""
    components = score["components"]
    if metric in components:
        return float(components[metric])
    if metric in ("acc", "correctness"):
        return float(score["correctness"])
    if metric == "reward":
        return float(score["reward"])
    check_filter_metric(metric, list(components))
    raise AssertionError("unreachable")   # check_filter_metric raised


def score_samples(score_fn, prompt, texts: Sequence[str], lengths: Sequence[int], algo: Any,
                  max_tokens: int) -> list[dict]:
    """Score one prompt's samples: ``score_fn(prompt, text)`` (the task's ``score``), then
    the overlong shaping of ``algo`` (``overlong_buffer_len``, ``overlong_penalty_factor``;
    a mapping or an object). The one place both sides score through."""
    get = algo.get if isinstance(algo, Mapping) else (lambda k, d=None: getattr(algo, k, d))
    buffer_len, factor = int(get("overlong_buffer_len", 0) or 0), float(get("overlong_penalty_factor", 1.0))
    return [shape_score(score_fn(prompt, text), length, max_tokens, buffer_len, factor)
            for text, length in zip(texts, lengths)]
