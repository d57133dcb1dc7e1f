"""The simulator's workload: prompts, the lengths of their responses, and what a length
predictor of a chosen quality would say about them.

Three pieces, all pure functions over frozen data (numpy only):

* ``sample_workload(model, num_prompts, n_samples_per_prompt, max_tokens, seed)`` draws a
  synthetic workload from a ``LengthModel``: the n GRPO samples of one prompt share a
  latent log-length, so they are more alike than samples of different prompts, and the
  budget ``max_tokens`` puts a spike at the top (natural clipping plus runaway samples);
* ``replay_workload(path, ...)`` reads recorded lengths (a ``scripts/profile_lengths.py``
  profile, a ``{"id", "length"}`` file, or an ``asp-schedule`` input file);
* ``predict_lengths(workload, target_spearman, seed)`` makes predictions whose Spearman
  rank correlation with the prompts' true expected lengths is the target (a Gaussian
  copula), so the value of prediction can be swept; ``plan_items`` hands them to
  ``schedule.plan.make_plan``.

The formulas, the defaults and their sources are in docs/simulator.md, "Workload model".
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import cached_property
from numbers import Integral, Real
from statistics import NormalDist
from typing import Any, Mapping

import numpy as np

from ..schedule.length_files import LengthFileError, read_length_file
from ..schedule.predictors import spearman_rho

__all__ = [
    "WorkloadError",
    "LengthModel",
    "PromptWorkload",
    "Workload",
    "sample_workload",
    "replay_workload",
    "ORACLE",
    "predict_lengths",
    "achieved_spearman",
    "pearson_for_spearman",
    "spearman_for_pearson",
    "plan_items",
    "DEFAULT_REPLAY_PROMPT_LENGTH",
]


class WorkloadError(ValueError):
    """A bad workload parameter or input record; the message names the value and the fix."""


# One independent random stream per purpose (SeedSequence spawn keys). Changing one knob
# (say the runaway probability) leaves every other draw as it was, so sweeps compare like
# with like; and a predictor seeded like its workload never reuses the workload's normals,
# which would silently correlate the prediction noise with the truth.
_STREAM_PROMPT_LENGTH = 0
_STREAM_LATENT = 1
_STREAM_SAMPLE = 2
_STREAM_RUNAWAY = 3
_STREAM_PREDICTOR = 4
_STREAM_REPLAY = 5

_NORMAL = NormalDist()


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))


# --------------------------------------------------------------------------- checks
def _check_int(what: str, value: Any, minimum: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise WorkloadError(f"{what}={value!r} must be an int; {fix}")
    if value < minimum:
        raise WorkloadError(f"{what}={value} must be >= {minimum}; {fix}")


def _check_real(what: str, value: Any, fix: str, *, low: float, low_open: bool = False,
                high: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise WorkloadError(f"{what}={value!r} must be a number; {fix}")
    if not math.isfinite(value):
        raise WorkloadError(f"{what}={value} must be finite; {fix}")
    if value < low or (low_open and value == low) or value > high:
        bound = f"{'>' if low_open else '>='} {low:g}"
        if math.isfinite(high):
            bound = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
        raise WorkloadError(f"{what}={value} must be {bound}; {fix}")


# --------------------------------------------------------------------------- the length model
@dataclass(frozen=True)
class LengthModel:
    """Long-tailed response lengths with a shared per-prompt latent, and prompt lengths.

    Per prompt: latent log-length ``l ~ Normal(ln median_response_length, sigma_prompt)``.
    Per sample: ``round(exp(l + Normal(0, sigma_sample)))``, at least 1, at most the
    budget ``max_tokens`` (natural clipping); independently, with ``runaway_probability``
    a sample runs away (a repetition loop) and is cut at ``max_tokens``. Prompt lengths:
    ``round(prompt_length_median * exp(Normal(0, prompt_length_sigma)))`` clipped to
    ``[min_prompt_length, max_prompt_length]``, independent of the response length.

    Defaults (docs/simulator.md gives the derivations): the two sigmas are fitted to the
    project's own maze-policy profile (docs/scheduler.md, "Length predictors on the maze
    task"); the median, the runaway rate and the prompt lengths are assumptions for the
    paper's setup (maze prompts, responses up to 2048 tokens).
    """

    median_response_length: float = 512.0  # assumption: max_tokens / 4 (paper's lengths not public)
    sigma_prompt: float = 0.72  # measured: maze policy, sample-to-sample rank correlation 0.85
    sigma_sample: float = 0.29  # measured: maze policy, 8-11 % of prompts with one sample > 2x the other
    runaway_probability: float = 0.01  # assumption: rare degenerate repetition loops
    prompt_length_median: float = 320.0  # assumption: a 5x5 maze prompt (~1.6k characters)
    prompt_length_sigma: float = 0.05  # MAZE-REASONING-GRPO-V0.1 prompts span 1.57k-1.62k characters
    min_prompt_length: int = 16
    max_prompt_length: int = 512  # rl.max_prompt_length of the paper-scale experiment configs

    def __post_init__(self) -> None:
        def field(name: str) -> str:  # the name a message shows
            return f"LengthModel.{name}"

        _check_real(field("median_response_length"), self.median_response_length,
                    "the median response length in tokens, e.g. 512", low=0.0, low_open=True)
        _check_real(field("sigma_prompt"), self.sigma_prompt,
                    "the spread of the prompts' latent log-lengths must be positive, or no prompt is "
                    "longer than another and there is nothing to schedule; e.g. 0.72", low=0.0, low_open=True)
        _check_real(field("sigma_sample"), self.sigma_sample,
                    "the spread of one prompt's samples around its latent log-length (0: identical "
                    "samples); e.g. 0.29", low=0.0)
        _check_real(field("runaway_probability"), self.runaway_probability,
                    "a probability per sample, e.g. 0.01 (0 disables runaway samples)", low=0.0, high=1.0)
        _check_real(field("prompt_length_median"), self.prompt_length_median,
                    "the median prompt length in tokens, e.g. 320", low=0.0, low_open=True)
        _check_real(field("prompt_length_sigma"), self.prompt_length_sigma,
                    "the log-spread of prompt lengths (0: all prompts equally long), e.g. 0.05", low=0.0)
        _check_int(field("min_prompt_length"), self.min_prompt_length, 1, "a prompt has at least one token")
        _check_int(field("max_prompt_length"), self.max_prompt_length, self.min_prompt_length,
                   f"it bounds min_prompt_length={self.min_prompt_length} from above; raise it")

    @property
    def mu(self) -> float:
        """Mean of the latent log-length."""
        return math.log(self.median_response_length)

    @property
    def intra_prompt_correlation(self) -> float:
        """Correlation of two samples' log-lengths of one prompt (before clipping):
        ``sigma_prompt^2 / (sigma_prompt^2 + sigma_sample^2)``."""
        return self.sigma_prompt ** 2 / (self.sigma_prompt ** 2 + self.sigma_sample ** 2)

    def expected_length(self, latent_log_length: np.ndarray, max_tokens: int) -> np.ndarray:
        """Mean response length of prompts with these latents, floor, budget and runaways included.

        With ``X = exp(l + Normal(0, s))``, floor 1 and budget ``M``, ``E[clip(X, 1, M)]`` is
        ``Phi(-l/s) + exp(l + s^2/2) [Phi((ln M - l - s^2)/s) - Phi((-l - s^2)/s)]
        + M (1 - Phi((ln M - l)/s))``; a runaway sample is ``M``. Rounding to whole tokens
        is ignored (it moves the mean by far less than a token). Increasing in ``l``
        (strictly while ``s > 0``, up to float rounding where it saturates at 1 or M).
        """
        latent = np.asarray(latent_log_length, dtype=np.float64)
        budget = float(max_tokens)
        s = self.sigma_sample
        if s == 0.0:
            clipped = np.exp(np.clip(latent, 0.0, math.log(budget)))
        else:
            with np.errstate(over="ignore"):  # a tiny s sends these to +-inf, where Phi is exact
                at_floor = (0.0 - latent) / s
                at_budget = (math.log(budget) - latent) / s
            lo, hi = at_floor - s, at_budget - s
            # Phi(hi) - Phi(lo) from whichever tail keeps its digits, then in log space, so that
            # a huge latent gives exp(big) * 0 = 0 rather than inf * 0
            mass = np.where(hi < 0, _normal_sf(-hi) - _normal_sf(-lo), _normal_sf(lo) - _normal_sf(hi))
            with np.errstate(divide="ignore"):
                middle = np.exp(latent + s * s / 2.0 + np.log(np.maximum(mass, 0.0)))
            clipped = (1.0 - _normal_sf(at_floor)) + middle + budget * _normal_sf(at_budget)
        p = self.runaway_probability
        return np.clip(p * budget + (1.0 - p) * clipped, 1.0, budget)  # clip: float rounding at the ends

    def fraction_at_max_tokens(self, max_tokens: int) -> float:
        """Expected share of samples cut at the budget: ``p + (1 - p) P(X >= M - 1/2)``,
        ``ln X ~ Normal(mu, sigma_prompt^2 + sigma_sample^2)`` (the marginal of one sample)."""
        total = math.hypot(self.sigma_prompt, self.sigma_sample)
        if max_tokens <= 1:
            return 1.0
        natural = 1.0 - _NORMAL.cdf((math.log(max_tokens - 0.5) - self.mu) / total)
        p = self.runaway_probability
        return p + (1.0 - p) * natural


_erfc = np.frompyfunc(math.erfc, 1, 1)


def _normal_sf(x: np.ndarray) -> np.ndarray:
    """1 - Phi(x), accurate in the upper tail."""
    return 0.5 * _erfc(np.asarray(x, dtype=np.float64) / math.sqrt(2.0)).astype(np.float64)


# --------------------------------------------------------------------------- the workload
@dataclass(frozen=True)
class PromptWorkload:
    """One prompt: its id, prompt length, its n response lengths, its true expected length.

    ``expected_length`` is what a perfect predictor would say: for a sampled workload the
    mean of the prompt's length distribution (``LengthModel.expected_length``), for a
    replayed one the mean of its recorded lengths.
    """

    id: str
    prompt_length: int
    response_lengths: tuple[int, ...]
    expected_length: float


@dataclass(frozen=True)
class Workload:
    """Prompts in data order; every prompt has exactly ``n_samples_per_prompt`` responses,
    each of 1 to ``max_tokens`` tokens. ``source`` says where it came from (for reports)."""

    prompts: tuple[PromptWorkload, ...]
    n_samples_per_prompt: int
    max_tokens: int
    source: str = ""

    def __post_init__(self) -> None:
        _check_int("Workload.n_samples_per_prompt", self.n_samples_per_prompt, 1, "each prompt has n >= 1 samples")
        _check_int("Workload.max_tokens", self.max_tokens, 1, "the response budget is at least one token")
        if not isinstance(self.prompts, tuple) or not self.prompts:
            raise WorkloadError("Workload.prompts must be a non-empty tuple of PromptWorkload")
        n = self.n_samples_per_prompt
        seen: set[str] = set()
        for k, p in enumerate(self.prompts):
            if not isinstance(p, PromptWorkload):
                raise WorkloadError(f"Workload.prompts[{k}] is a {type(p).__name__}, expected PromptWorkload")
            if not isinstance(p.id, str):
                raise WorkloadError(f"Workload.prompts[{k}].id={p.id!r} must be a str")
            if p.id in seen:
                raise WorkloadError(f"Workload.prompts[{k}].id={p.id!r} is a duplicate; ids must be unique")
            seen.add(p.id)
            if not isinstance(p.response_lengths, tuple) or len(p.response_lengths) != n:
                raise WorkloadError(f"prompt {p.id!r} has response_lengths={p.response_lengths!r}; expected a tuple "
                                    f"of n_samples_per_prompt={n} ints")
        # The value checks look at the set of types and at numpy arrays first (a workload
        # can hold 10^6 samples); only a failing check walks the prompts to name the culprit.
        self._check_values("response_lengths", [v for p in self.prompts for v in p.response_lengths],
                           integral=True, low=1, high=self.max_tokens)
        self._check_values("prompt_length", [p.prompt_length for p in self.prompts], integral=True, low=1)
        self._check_values("expected_length", [p.expected_length for p in self.prompts], integral=False, low=0)

    def _check_values(self, name: str, values: list, *, integral: bool, low: float, high: float = math.inf) -> None:
        kind = Integral if integral else Real
        types_ok = all(t is not bool and issubclass(t, kind) for t in {type(v) for v in values})
        if types_ok:
            array = np.array(values, dtype=np.float64)
            if np.all(np.isfinite(array) & (array >= low) & (array <= high)):
                return
        per_prompt = self.n_samples_per_prompt if name == "response_lengths" else 1
        for k, v in enumerate(values):
            ok = (not isinstance(v, bool) and isinstance(v, kind) and math.isfinite(v) and low <= v <= high)
            if not ok:
                p = self.prompts[k // per_prompt]
                where = f"{name}[{k % per_prompt}]" if name == "response_lengths" else name
                bound = f"in [{low:g}, {high:g}]" if math.isfinite(high) else f">= {low:g}"
                raise WorkloadError(f"prompt {p.id!r} {where}={v!r} must be {'an int' if integral else 'a number'} "
                                    f"{bound}" + (f" (max_tokens={self.max_tokens})" if name == "response_lengths"
                                                  else ""))

    @property
    def num_prompts(self) -> int:
        return len(self.prompts)

    @property
    def num_samples(self) -> int:
        return len(self.prompts) * self.n_samples_per_prompt

    @cached_property
    def ids(self) -> tuple[str, ...]:
        return tuple(p.id for p in self.prompts)

    @cached_property
    def _by_id(self) -> dict[str, PromptWorkload]:
        return {p.id: p for p in self.prompts}

    def prompt(self, prompt_id: str) -> PromptWorkload:
        """The prompt with this id (KeyError names it when absent)."""
        try:
            return self._by_id[prompt_id]
        except KeyError:
            raise KeyError(f"no prompt {prompt_id!r} in this workload of {self.num_prompts} prompts") from None

    def lengths_array(self) -> np.ndarray:
        """Response lengths as a fresh ``(num_prompts, n_samples_per_prompt)`` int64 array."""
        return np.array([p.response_lengths for p in self.prompts], dtype=np.int64)

    @property
    def total_response_tokens(self) -> int:
        """Tokens decoded over all samples."""
        return int(self.lengths_array().sum())

    @property
    def total_prompt_tokens(self) -> int:
        """Prompt tokens over all samples (each of the n samples carries its prompt)."""
        return sum(p.prompt_length for p in self.prompts) * self.n_samples_per_prompt

    def max_lengths(self) -> dict[str, int]:
        """Per prompt, its longest response: how long its GRPO group holds a minibatch."""
        return {p.id: max(p.response_lengths) for p in self.prompts}

    def expected_lengths(self) -> dict[str, float]:
        """Per prompt, the true expected length (what an oracle predictor says)."""
        return {p.id: p.expected_length for p in self.prompts}

    @property
    def fraction_at_max_tokens(self) -> float:
        """Share of samples cut at the budget (length == max_tokens)."""
        return float(np.mean(self.lengths_array() == self.max_tokens))


# --------------------------------------------------------------------------- sampling
def sample_workload(model: LengthModel = LengthModel(), num_prompts: int = 256, n_samples_per_prompt: int = 8,
                    max_tokens: int = 2048, seed: int = 0) -> Workload:
    """Draw a workload from ``model``; the same arguments give the same workload.

    Prompt ids are ``p0, p1, ...``. Draws are made per purpose in data order, so the
    first k prompts of a workload are the workload of k prompts with the same seed.
    """
    if not isinstance(model, LengthModel):
        raise WorkloadError(f"model={model!r} must be a LengthModel")
    _check_int("num_prompts", num_prompts, 1, "sample at least one prompt")
    _check_int("n_samples_per_prompt", n_samples_per_prompt, 1, "GRPO needs at least one sample per prompt")
    _check_int("max_tokens", max_tokens, 1, "the response budget is at least one token, e.g. 2048")
    _check_int("seed", seed, 0, "use a non-negative int")

    latent = model.mu + model.sigma_prompt * _rng(seed, _STREAM_LATENT).standard_normal(num_prompts)
    noise = model.sigma_sample * _rng(seed, _STREAM_SAMPLE).standard_normal((num_prompts, n_samples_per_prompt))
    # cap the exponent just above the budget: the clip below cuts there anyway, and exp cannot overflow
    log_length = np.minimum(latent[:, None] + noise, math.log(max_tokens) + 1.0)
    lengths = np.clip(np.rint(np.exp(log_length)), 1, max_tokens).astype(np.int64)
    runaway = _rng(seed, _STREAM_RUNAWAY).random((num_prompts, n_samples_per_prompt)) < model.runaway_probability
    lengths[runaway] = max_tokens

    prompt_noise = model.prompt_length_sigma * _rng(seed, _STREAM_PROMPT_LENGTH).standard_normal(num_prompts)
    prompt_lengths = np.clip(np.rint(model.prompt_length_median * np.exp(prompt_noise)),
                             model.min_prompt_length, model.max_prompt_length).astype(np.int64)
    expected = model.expected_length(latent, max_tokens)

    prompts = tuple(PromptWorkload(f"p{k}", pl, tuple(row), e) for k, (pl, row, e) in
                    enumerate(zip(prompt_lengths.tolist(), lengths.tolist(), expected.tolist())))
    return Workload(prompts, n_samples_per_prompt, max_tokens, source=f"sampled from {model!r}, seed={seed}")


# --------------------------------------------------------------------------- replay
# Assumed prompt length for records without a "prompt_length" field (the profile script
# does not record one): LengthModel's default median. Pass default_prompt_length to change.
DEFAULT_REPLAY_PROMPT_LENGTH = int(LengthModel().prompt_length_median)


def replay_workload(path: str | os.PathLike, n_samples_per_prompt: int | None = None, max_tokens: int | None = None,
                    *, default_prompt_length: int = DEFAULT_REPLAY_PROMPT_LENGTH, single_length_sigma: float = 0.0,
                    seed: int = 0) -> Workload:
    """A workload from a JSONL file of recorded lengths, one prompt a line (blank lines skipped).

    Each line is an object with a string ``id`` and one length field, looked for in order:

    * ``lengths``: observed per-sample lengths, the ``scripts/profile_lengths.py`` profile
      (``{"id", "prompt", "size", "lengths", "mean_length", "finished"}``; fields other
      than ``id``, ``lengths`` and ``prompt_length`` are ignored);
    * ``length``: one observed length (the benchmark's maze reference-length file);
    * ``predicted_length``: the ``asp-schedule`` input (``{"id", "predicted_length"}``),
      a number >= 0, rounded half up to a token count of at least 1.

    Observed lengths must be integers >= 1. An optional ``prompt_length`` (int >= 1) is
    the prompt's length; records without it get ``default_prompt_length``.

    How the n samples are formed from k recorded lengths: ``n_samples_per_prompt``
    defaults to k (then every record must have the same k); sample j is recorded length
    ``j mod k`` (reuse in turn: every recording is used when n >= k, the first n when
    n < k). With a single recorded length (k = 1) the n samples are copies of it, unless
    ``single_length_sigma > 0``: then sample j is ``round(L * exp(Normal(0, sigma)))``
    (seeded by ``seed``; ``max_tokens`` is then required), which restores some of the
    spread inside a GRPO group that one recording cannot show. ``max_tokens`` defaults
    to the longest recorded length; lengths above it are cut to it (the budget
    truncates them). A prompt's true expected length is the mean of its recorded
    lengths after that cut.

    Raises ``LengthFileError`` (``schedule/length_files.py``, the one reader of length
    files) naming ``file:line`` and the field for a bad record.
    """
    _check_int("default_prompt_length", default_prompt_length, 1, "a prompt has at least one token")
    _check_real("single_length_sigma", single_length_sigma, "0 copies a single recorded length n times", low=0.0)
    _check_int("seed", seed, 0, "use a non-negative int")
    if n_samples_per_prompt is not None:
        _check_int("n_samples_per_prompt", n_samples_per_prompt, 1, "GRPO needs at least one sample per prompt")
    if max_tokens is not None:
        _check_int("max_tokens", max_tokens, 1, "the response budget is at least one token, e.g. 2048")
    elif single_length_sigma > 0:
        # the default budget (the longest recording) would cut every noisy sample above its recording
        raise WorkloadError(f"single_length_sigma={single_length_sigma} needs max_tokens: the budget the noisy "
                            "samples are cut at; pass e.g. max_tokens=2048")

    name = os.fspath(path)
    records = _read_records(name)
    n = n_samples_per_prompt if n_samples_per_prompt is not None else _recorded_per_prompt(name, records)
    budget = max_tokens if max_tokens is not None else max(max(r[2]) for r in records)
    noise = None
    if single_length_sigma > 0:
        noise = np.exp(single_length_sigma * _rng(seed, _STREAM_REPLAY).standard_normal((len(records), n)))
    prompts = [_replayed_prompt(record, n, budget, None if noise is None else noise[k], default_prompt_length)
               for k, record in enumerate(records)]
    ks = sorted({len(r[2]) for r in records})
    return Workload(tuple(prompts), n, budget,
                    source=f"replayed from {os.path.basename(name)} ({'/'.join(map(str, ks))} recorded length(s) "
                           f"per prompt, n={n}, max_tokens={budget})")


def _recorded_per_prompt(name: str, records) -> int:
    """The recorded lengths per prompt, the same on every line (else n_samples_per_prompt
    must say how many samples to form)."""
    lineno0, _, lengths0, _ = records[0]
    for lineno, _, lengths, _ in records:
        if len(lengths) != len(lengths0):
            raise LengthFileError(f"{name}:{lineno}: field 'lengths' has {len(lengths)} recorded lengths but line "
                                  f"{lineno0} has {len(lengths0)}; pass n_samples_per_prompt to reuse them in turn")
    return len(lengths0)


def _replayed_prompt(record, n: int, budget: int, noise, default_prompt_length: int) -> PromptWorkload:
    """One record's prompt: its n samples from its recorded lengths cut at ``budget`` (in
    turn; a single one times ``noise`` when given), its expected length their mean."""
    _, pid, recorded, prompt_length = record
    cut = [min(v, budget) for v in recorded]
    if noise is not None and len(cut) == 1:
        samples = tuple(int(v) for v in np.clip(np.rint(cut[0] * noise), 1, budget).tolist())
    else:
        samples = tuple(cut[j % len(cut)] for j in range(n))
    return PromptWorkload(pid, prompt_length if prompt_length is not None else default_prompt_length,
                          samples, math.fsum(cut) / len(cut))


def _read_records(name: str) -> list[tuple[int, str, list[int], int | None]]:
    """``(line number, id, recorded lengths, prompt length or None)`` per record; a
    predicted length is rounded half up to a token count of at least 1."""
    return [(r.line, r.id, list(r.lengths) or [max(1, math.floor(r.predicted + 0.5))], r.prompt_length)
            for r in read_length_file(name, "any")]


# --------------------------------------------------------------------------- predictions
ORACLE = "oracle"


def pearson_for_spearman(rho: float) -> float:
    """Pearson r of a bivariate normal whose Spearman rank correlation is ``rho``:
    ``r = 2 sin(pi rho / 6)`` (inverse of ``rho = (6 / pi) arcsin(r / 2)``)."""
    return 2.0 * math.sin(math.pi * rho / 6.0)


def spearman_for_pearson(r: float) -> float:
    """Spearman rho of a bivariate normal with Pearson correlation ``r``."""
    return 6.0 / math.pi * math.asin(r / 2.0)


def _normal_scores(values: np.ndarray) -> np.ndarray:
    """``Phi^-1((rank - 1/2) / N)`` of average ranks: equal values get equal scores."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    mid_ranks = (ends - counts + 1 + ends) / 2.0
    scores = np.array([_NORMAL.inv_cdf((r - 0.5) / len(values)) for r in mid_ranks.tolist()])
    return scores[inverse]


def predict_lengths(workload: Workload, target_spearman: float | str, seed: int = 0) -> dict[str, float]:
    """Predicted length per prompt id, of rank quality ``target_spearman`` in [0, 1].

    The Spearman rank correlation with the prompts' true expected lengths is the target
    up to sampling noise (about ``(1 - target^2) / sqrt(N)``). Gaussian copula: with
    ``z`` the normal scores of the true lengths' ranks, ``r = 2 sin(pi target / 6)`` and
    ``eps ~ Normal(0, 1)``, the predicted score is ``r z + sqrt(1 - r^2) eps``; the
    predicted lengths are the true lengths re-ordered by that score, so they have the
    true lengths' distribution (realistic magnitudes for the load model) and only the
    ranking is degraded. 1 gives the true lengths, 0 a random permutation of them.
    ``ORACLE`` (``"oracle"``) returns the true expected lengths. The same seed gives the
    same noise for every target, so a sweep over targets changes only the quality.
    """
    if not isinstance(workload, Workload):
        raise WorkloadError(f"workload={workload!r} must be a Workload")
    truth = np.array([p.expected_length for p in workload.prompts], dtype=np.float64)
    if isinstance(target_spearman, str):
        if target_spearman != ORACLE:
            raise WorkloadError(f"target_spearman={target_spearman!r}: the only named predictor is {ORACLE!r}; "
                                "otherwise pass a rank correlation in [0, 1]")
        return dict(zip(workload.ids, truth.tolist()))
    _check_real("target_spearman", target_spearman, "1.0 ranks perfectly, 0.0 at random", low=0.0, high=1.0)
    _check_int("seed", seed, 0, "use a non-negative int")
    # exact ends: 2 sin(pi / 6) is 0.9999999999999999, whose residual noise would be pointless
    r = 1.0 if target_spearman == 1 else pearson_for_spearman(float(target_spearman))
    z = _normal_scores(truth)
    eps = _rng(seed, _STREAM_PREDICTOR).standard_normal(len(truth))
    score = r * z + math.sqrt(max(0.0, 1.0 - r * r)) * eps
    predicted = np.empty_like(truth)
    predicted[np.argsort(score, kind="stable")] = np.sort(truth)
    return dict(zip(workload.ids, predicted.tolist()))


def achieved_spearman(workload: Workload, predicted: Mapping[str, float]) -> float:
    """Spearman rho of the predictions against the prompts' true expected lengths."""
    items = plan_items(workload, predicted)
    return spearman_rho([v for _, v in items], [p.expected_length for p in workload.prompts])


def plan_items(workload: Workload, predicted: Mapping[str, float]) -> list[tuple[str, float]]:
    """``(id, predicted_length)`` in data order: the input of ``schedule.plan.make_plan``.

    Every prompt of the workload needs a finite prediction >= 0; ids the workload does
    not have are ignored (predictions may cover a larger prompt set).
    """
    missing = [pid for pid in workload.ids if pid not in predicted]
    if missing:
        raise WorkloadError(f"no prediction for {len(missing)} of {workload.num_prompts} prompts, e.g. "
                            f"{missing[0]!r}; predict every prompt of the workload")
    items = []
    for pid in workload.ids:
        value = predicted[pid]
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
            raise WorkloadError(f"predicted length {value!r} of prompt {pid!r} must be a finite number >= 0")
        items.append((pid, float(value)))
    return items
