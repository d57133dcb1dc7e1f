"""The check every length predictor runs on the (prompt, length) pairs it is fitted on.

It lives below the predictors rather than in ``predictors.py`` because
``lm_predictor.py`` needs it too, and ``predictors.py`` already imports
``lm_predictor`` (lazily, for ``PREDICTORS["lm"]``): taking it from ``predictors`` made
the two modules import each other. numpy only.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["observed_lengths"]


def observed_lengths(prompts: Sequence[str], lengths: Sequence[float]) -> np.ndarray:
    """``lengths`` as float64 after checking a fit call: as many lengths as prompts, at
    least one, each finite and >= 0. Raises ValueError naming the first bad value."""
    y = np.asarray(lengths, dtype=np.float64)
    if y.ndim != 1 or len(prompts) != len(y):
        raise ValueError(f"got {len(prompts)} prompts but {y.size} lengths")
    if len(y) == 0:
        raise ValueError("cannot fit a length predictor on no observations")
    bad = np.flatnonzero(~np.isfinite(y) | (y < 0))
    if bad.size:
        raise ValueError(f"length {y[bad[0]]} of prompt {prompts[bad[0]]!r} must be finite and >= 0")
    return y
