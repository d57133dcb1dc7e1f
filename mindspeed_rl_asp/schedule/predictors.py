"""Response-length predictors for the offline scheduler, and rank-quality metrics.

Every predictor follows ``LengthPredictor``: ``fit(prompts, lengths)`` then
``predict(prompts) -> np.ndarray`` (float64, finite, >= 0). A prompt may appear
several times in ``fit`` (e.g. its n GRPO samples, or several epochs); each
occurrence is one observation. The scheduler only needs the ORDER of the
predictions to be right (it sorts by them) plus roughly right magnitudes for
load balancing, so ``rank_quality`` (Kendall tau-b, Spearman rho) is the metric
to watch.

Implemented here (numpy only):

* ``HistoryPredictor`` - mean observed length of the same prompt in earlier
  epochs; unseen prompts get a fallback predictor or the median of the
  per-prompt means.
* ``FeatureRidgePredictor`` - closed-form ridge regression of log-length on
  cheap prompt features (``PromptFeatures`` by default).

The LM-based predictor (a small causal LM of the target's family, fine-tuned with a
regression head) is ``lm_predictor.LMLengthPredictor``; it needs torch and
transformers, so ``PREDICTORS["lm"]`` is a factory that imports it only when called.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from .observations import observed_lengths
from .predictor_files import PredictorFileError, read_predictor_meta, write_predictor_dir

__all__ = [
    "LengthPredictor",
    "HistoryPredictor",
    "PromptFeatures",
    "FeatureRidgePredictor",
    "PREDICTORS",
    "rank_quality",
    "PredictorFileError",
    "save_predictor",
    "load_predictor",
    "kendall_tau",
    "spearman_rho",
]

_TAG = re.compile(r"<\|[^|<>]{1,64}\|>")
_TOKEN = re.compile(r"\w+|[^\w\s]")


@runtime_checkable
class LengthPredictor(Protocol):
    def fit(self, prompts: Sequence[str], lengths: Sequence[float]) -> "LengthPredictor": ...

    def predict(self, prompts: Sequence[str]) -> np.ndarray: ...


class HistoryPredictor:
    """Mean observed length per prompt key (the prompt text, or an id if you pass ids).

    ``fit`` starts over; ``update`` adds observations (call it once per epoch).
    Unseen prompts: ``fallback.predict`` if a fallback predictor is given (it is
    fitted on the same observations), else the median of the per-prompt means.
    """

    def __init__(self, fallback: LengthPredictor | None = None):
        self.fallback = fallback
        self._sum: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self._seen_prompts: list[str] = []
        self._seen_lengths: list[float] = []

    def fit(self, prompts: Sequence[str], lengths: Sequence[float]) -> "HistoryPredictor":
        self._sum, self._count = {}, {}
        self._seen_prompts, self._seen_lengths = [], []
        return self.update(prompts, lengths)

    def update(self, prompts: Sequence[str], lengths: Sequence[float]) -> "HistoryPredictor":
        y = observed_lengths(prompts, lengths)
        for p, v in zip(prompts, y.tolist()):
            self._sum[p] = self._sum.get(p, 0.0) + v
            self._count[p] = self._count.get(p, 0) + 1
        if self.fallback is not None:
            self._seen_prompts += list(prompts)
            self._seen_lengths += y.tolist()
            self.fallback.fit(self._seen_prompts, self._seen_lengths)
        return self

    def __contains__(self, prompt: str) -> bool:
        return prompt in self._count

    @property
    def default(self) -> float:
        """Prediction for unseen prompts without a fallback: median of per-prompt means."""
        if not self._count:
            raise ValueError("HistoryPredictor is not fitted")
        return float(np.median([self._sum[k] / self._count[k] for k in self._count]))

    def predict(self, prompts: Sequence[str]) -> np.ndarray:
        if not self._count:
            raise ValueError("HistoryPredictor is not fitted")
        out = np.empty(len(prompts))
        unseen = [k for k, p in enumerate(prompts) if p not in self._count]
        for k, p in enumerate(prompts):
            if p in self._count:
                out[k] = self._sum[p] / self._count[p]
        if unseen:
            if self.fallback is not None:
                out[unseen] = self.fallback.predict([prompts[k] for k in unseen])
            else:
                out[unseen] = self.default
        return out


class PromptFeatures:
    """Default cheap features: log1p(chars), log1p(token proxy), and one count per tag.

    The token proxy counts word runs and punctuation marks. Tags are the distinct
    ``<|...|>`` markers seen during ``fit`` (the ``max_tags`` most frequent), so
    a prompt format's structure (e.g. one tag per maze cell) becomes features.
    """

    def __init__(self, max_tags: int = 32):
        self.max_tags = max_tags
        self.tags: list[str] = []

    def fit(self, prompts: Sequence[str]) -> "PromptFeatures":
        counts = Counter(t for p in prompts for t in set(_TAG.findall(p)))
        self.tags = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: self.max_tags]]
        return self

    def __call__(self, prompts: Sequence[str]) -> np.ndarray:
        index = {t: k for k, t in enumerate(self.tags)}
        x = np.zeros((len(prompts), 2 + len(self.tags)))
        for row, p in enumerate(prompts):
            x[row, 0] = np.log1p(len(p))
            x[row, 1] = np.log1p(len(_TOKEN.findall(p)))
            for t in _TAG.findall(p):
                k = index.get(t)
                if k is not None:
                    x[row, 2 + k] += 1.0
        return x


class FeatureRidgePredictor:
    """Ridge regression of ``log1p(length)`` on prompt features, solved in closed form.

    ``features`` maps a list of prompts to an ``(n, d)`` array; it defaults to a
    fresh ``PromptFeatures`` (fitted on the training prompts). Columns are
    standardised; the intercept is not penalised. Predicting in log space fits
    the multiplicative spread of lengths and keeps predictions positive.
    """

    def __init__(self, features: Callable[[Sequence[str]], np.ndarray] | None = None, alpha: float = 1.0):
        if not np.isfinite(alpha) or alpha < 0:
            raise ValueError(f"alpha={alpha} must be finite and >= 0")
        self.features = features if features is not None else PromptFeatures()
        self.alpha = alpha
        self._coef: np.ndarray | None = None

    def _matrix(self, prompts: Sequence[str]) -> np.ndarray:
        x = np.asarray(self.features(prompts), dtype=np.float64)
        if x.ndim != 2 or x.shape[0] != len(prompts) or not np.all(np.isfinite(x)):
            raise ValueError(f"features must be a finite ({len(prompts)}, d) array, got shape {x.shape}")
        return x

    def fit(self, prompts: Sequence[str], lengths: Sequence[float]) -> "FeatureRidgePredictor":
        y = np.log1p(observed_lengths(prompts, lengths))
        if hasattr(self.features, "fit"):
            self.features.fit(prompts)
        x = self._matrix(prompts)
        self._mu = x.mean(axis=0)
        self._sd = np.where(x.std(axis=0) > 0, x.std(axis=0), 1.0)
        z = np.hstack([np.ones((len(y), 1)), (x - self._mu) / self._sd])
        penalty = self.alpha * np.eye(z.shape[1])
        penalty[0, 0] = 0.0  # the intercept is free
        self._coef = np.linalg.lstsq(z.T @ z + penalty, z.T @ y, rcond=None)[0]
        return self

    def predict(self, prompts: Sequence[str]) -> np.ndarray:
        if self._coef is None:
            raise ValueError("FeatureRidgePredictor is not fitted")
        z = (self._matrix(prompts) - self._mu) / self._sd
        log_len = self._coef[0] + z @ self._coef[1:]
        return np.expm1(np.clip(log_len, 0.0, 50.0))

    def save(self, path: str | Path) -> Path:
        """Write the fitted predictor to the directory ``path`` (atomically): ``meta.json``
        holds everything (the coefficients are a few floats; JSON floats round-trip exactly).
        Only the default :class:`PromptFeatures` can be saved."""
        if self._coef is None:
            raise ValueError("FeatureRidgePredictor is not fitted: nothing to save")
        if type(self.features) is not PromptFeatures:
            raise ValueError("only a FeatureRidgePredictor with the default PromptFeatures can be saved")
        meta = {"kind": "ridge", "alpha": self.alpha, "max_tags": self.features.max_tags,
                "tags": list(self.features.tags), "mu": self._mu.tolist(), "sd": self._sd.tolist(),
                "coef": self._coef.tolist()}
        return write_predictor_dir(path, meta, lambda tmp: None)

    @classmethod
    def load(cls, path: str | Path) -> "FeatureRidgePredictor":
        meta = read_predictor_meta(path, "ridge")
        try:
            features = PromptFeatures(int(meta["max_tags"]))
            features.tags = [str(t) for t in meta["tags"]]
            out = cls(features, float(meta["alpha"]))
            mu, sd, coef = (np.asarray(meta[k], dtype=np.float64) for k in ("mu", "sd", "coef"))
        except (KeyError, TypeError, ValueError) as error:
            raise PredictorFileError(f"{Path(path) / 'meta.json'}: not a ridge predictor ({error!r})") from None
        d = 2 + len(features.tags)
        if not (mu.shape == sd.shape == (d,) and coef.shape == (d + 1,)):
            raise PredictorFileError(
                f"{Path(path) / 'meta.json'}: {len(features.tags)} tags give {d} features, but mu/sd/coef have "
                f"{mu.shape}/{sd.shape}/{coef.shape} entries (expected {d}/{d}/{d + 1})")
        if not (np.all(np.isfinite(coef)) and np.all(np.isfinite(mu)) and np.all(sd > 0)):
            raise PredictorFileError(f"{Path(path) / 'meta.json'}: non-finite coefficients or non-positive sd")
        out._mu, out._sd, out._coef = mu, sd, coef
        return out


# --------------------------------------------------------------------------- save / load
def save_predictor(predictor, path) -> Path:
    """Save a fitted ridge or lm predictor into the directory ``path`` (atomic)."""
    if not hasattr(predictor, "save"):
        raise ValueError(f"{type(predictor).__name__} cannot be saved (ridge and lm predictors can)")
    return predictor.save(path)


def load_predictor(path, kind: str | None = None, **lm_kwargs) -> "LengthPredictor":
    """The predictor saved at ``path`` (its kind read from meta.json; ``kind`` checks it).
    ``lm_kwargs`` (e.g. ``num_threads``) go to :meth:`LMLengthPredictor.load`."""
    meta = read_predictor_meta(path, kind)
    if meta.get("kind") == "ridge":
        return FeatureRidgePredictor.load(path)
    if meta.get("kind") == "lm":
        from .lm_predictor import LMLengthPredictor

        return LMLengthPredictor.load(path, **lm_kwargs)
    raise PredictorFileError(f"{Path(path) / 'meta.json'}: unknown predictor kind {meta.get('kind')!r}")


def _lm_predictor(**kwargs) -> LengthPredictor:
    """``LMLengthPredictor(**kwargs)``, imported on call: this module never imports torch."""
    from .lm_predictor import LMLengthPredictor

    return LMLengthPredictor(**kwargs)


# name -> factory; names match configs (scheduler.predictor). ("reference" is
# task-specific: the CLI handles it.) "lm" takes LMLengthPredictor's keyword arguments.
PREDICTORS: dict[str, Callable[..., LengthPredictor]] = {
    "history": lambda: HistoryPredictor(fallback=FeatureRidgePredictor()),
    "ridge": FeatureRidgePredictor,
    "lm": _lm_predictor,
}


# --------------------------------------------------------------------------- rank quality
def _pair(predicted, observed) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(predicted, dtype=np.float64)
    y = np.asarray(observed, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"predicted and observed must be 1-D of equal length, got {x.shape} and {y.shape}")
    if x.size < 2:
        raise ValueError("rank quality needs at least 2 prompts")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("predicted and observed lengths must be finite")
    return x, y


def _dense_rank(v: np.ndarray) -> np.ndarray:
    return np.unique(v, return_inverse=True)[1].astype(np.int64)


def _tied_pairs(v: np.ndarray) -> int:
    counts = np.unique(v, return_counts=True)[1].astype(np.int64)
    return int(np.sum(counts * (counts - 1) // 2))


def _inversions(r: np.ndarray) -> int:
    """Pairs ``i < j`` with ``r[i] > r[j]`` (ties not counted), O(n log^2 n) with numpy.

    Bit by bit from the top: two values first differ at bit k iff they share the
    prefix above k; the pair is inverted iff the earlier one has bit k set. So at
    each level count, within each prefix class (in position order), the 1-bits
    before every 0-bit.
    """
    total = 0
    n = len(r)
    for k in range(max(int(r.max()).bit_length(), 1) - 1, -1, -1):
        order = np.argsort(r >> (k + 1), kind="stable")  # group by prefix, keep positions
        prefix = (r >> (k + 1))[order]
        bit = ((r >> k) & 1)[order]
        ones_before = np.cumsum(bit) - bit
        start = np.flatnonzero(np.r_[True, prefix[1:] != prefix[:-1]])
        group_start = np.repeat(start, np.diff(np.r_[start, n]))
        ones_in_class = ones_before - ones_before[group_start]
        total += int(np.sum(ones_in_class[bit == 0]))
    return total


def kendall_tau(predicted, observed) -> float:
    """Kendall tau-b (tie-corrected); nan when either side is constant."""
    x, y = _pair(predicted, observed)
    n = len(x)
    order = np.lexsort((y, x))  # by x, ties in x by y: such pairs are never inversions
    n0 = n * (n - 1) // 2
    n1, n2 = _tied_pairs(x), _tied_pairs(y)
    n3 = _joint_ties(x, y)
    discordant = _inversions(_dense_rank(y)[order])
    concordant_minus_discordant = n0 - n1 - n2 + n3 - 2 * discordant
    denom = np.sqrt(float(n0 - n1) * float(n0 - n2))
    return float(concordant_minus_discordant / denom) if denom > 0 else float("nan")


def _joint_ties(x: np.ndarray, y: np.ndarray) -> int:
    pairs = np.unique(np.stack([x, y], axis=1), axis=0, return_counts=True)[1].astype(np.int64)
    return int(np.sum(pairs * (pairs - 1) // 2))


def _average_rank(v: np.ndarray) -> np.ndarray:
    """1-based ranks, ties get the mean of the ranks they span."""
    _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return ((ends - counts + 1 + ends) / 2.0)[inverse]


def spearman_rho(predicted, observed) -> float:
    """Spearman rho: Pearson correlation of average ranks; nan when either side is constant."""
    x, y = _pair(predicted, observed)
    rx, ry = _average_rank(x), _average_rank(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = np.sqrt(np.sum(rx * rx) * np.sum(ry * ry))
    return float(np.sum(rx * ry) / denom) if denom > 0 else float("nan")


def rank_quality(predicted, observed) -> dict[str, float]:
    """``{"kendall_tau": ..., "spearman_rho": ...}`` of predicted vs observed lengths."""
    return {"kendall_tau": kendall_tau(predicted, observed), "spearman_rho": spearman_rho(predicted, observed)}
