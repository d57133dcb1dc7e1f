"""The predictor in the loop (the paper's step 1, for prompts without a reference length).

``scheduler.predictor=ridge|lm``: a ``scheduler.profile_share`` of the task's prompts
(a seeded random subset) is sampled ``scheduler.profile_samples`` times with the
**starting** policy through the project's own engine (:class:`~mindspeed_rl_asp.engines.hf.HFGenerationEngine`,
as ``scripts/profile_lengths.py`` does, with the same seeds); the predictor is fitted on
the profiled prompts except a ``scheduler.profile_holdout`` share of them, which is
scored (:func:`~mindspeed_rl_asp.schedule.predictors.rank_quality`: Kendall tau,
Spearman rho of predicted vs observed mean length); it predicts every prompt that was
not profiled. **Profiled prompts (fitted and held out) keep their observed mean
length**: it is a better estimate than any prediction. ``lm`` fine-tunes the policy's
own transformer with a regression head (:class:`~mindspeed_rl_asp.schedule.lm_predictor.LMLengthPredictor`),
``ridge`` is :class:`~mindspeed_rl_asp.schedule.predictors.FeatureRidgePredictor`.

``history``: no sampling; :class:`~mindspeed_rl_asp.schedule.predictors.HistoryPredictor`
(ridge fallback for unseen prompts) over ``scheduler.lengths_file`` (profile JSONL
records, keyed by prompt text); the held-out share of the file's records is scored
with a predictor fitted on the rest (so it measures the fallback on unseen prompts),
then the predictor is refitted on the whole file.

``scheduler.predictor_path``: a predictor saved by an earlier run is loaded and
predicts every prompt; nothing is sampled or scored.

Into the run directory: ``length_predictor/`` (the fitted ridge/lm predictor,
:func:`~mindspeed_rl_asp.schedule.predictors.load_predictor` reads it; give it as
``scheduler.predictor_path``), ``length_profile.jsonl`` (the profile, in
``scripts/profile_lengths.py``'s format: a later run's ``scheduler.lengths_file``) and
``predictor.json`` (kind, shares, counts, profile and fit seconds, held-out rank quality)
and ``predicted_lengths.jsonl`` (every prompt's planned length: :func:`write_predicted_lengths`).
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

__all__ = ["EPOCH_SEED_STRIDE", "sample_lengths", "write_profile", "read_profile", "split_profile",
           "profile_and_predict", "describe_predictor", "needs_profile", "write_predicted_lengths",
           "PREDICTED_LENGTHS"]

EPOCH_SEED_STRIDE = 1_000_003  # sampling seeds of pass k: seed + k * stride + batch offset
PROFILE_SPLIT_SALT = 7_919  # the profiled subset's rng: seed + salt (independent of the task's own rng)


def needs_profile(sched) -> bool:
    """Whether ``scheduler`` asks for the starting policy to be sampled before planning."""
    return sched.predictor in ("ridge", "lm") and not sched.predictor_path


# --------------------------------------------------------------------------- sampling
def sample_lengths(engine, tokenizer, prompts: Sequence, samples_per_prompt: int, max_tokens: int, seed: int,
                   batch_size: int = 32, temperature: float = 1.0,
                   on_batch: Callable[[int, int, float], None] | None = None,
                   ) -> tuple[dict[str, list[int]], dict[str, list[bool]]]:
    """Response lengths (tokens, end-of-text included; a cut response counts ``max_tokens``)
    and finished flags per prompt id, ``samples_per_prompt`` independent passes.

    Pass ``k`` samples with seed ``seed + k * EPOCH_SEED_STRIDE`` (+ the batch's offset,
    as :func:`~mindspeed_rl_asp.policy.evaluate.sample_and_score` seeds); batches are cut
    from the prompts sorted by prompt length (less padding). ``prompts``: objects with
    ``id`` and ``prompt``. ``on_batch(pass, samples done in the pass, tokens/s)``."""
    from dataclasses import replace

    from ..engines.base import SamplingParams

    for name, value in (("samples_per_prompt", samples_per_prompt), ("max_tokens", max_tokens),
                        ("batch_size", batch_size)):
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    ids = {p.id: tokenizer(p.prompt, add_special_tokens=False)["input_ids"] for p in prompts}
    ordered = sorted(prompts, key=lambda p: len(ids[p.id]))
    lengths: dict[str, list[int]] = {p.id: [] for p in prompts}
    finished: dict[str, list[bool]] = {p.id: [] for p in prompts}
    for k in range(samples_per_prompt):
        sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed + k * EPOCH_SEED_STRIDE)
        for start in range(0, len(ordered), batch_size):
            chunk = ordered[start:start + batch_size]
            out = engine.generate([ids[p.id] for p in chunk], replace(sampling, seed=sampling.seed + start))
            for p, response, done in zip(chunk, out.response_ids, out.finished):
                lengths[p.id].append(len(response))
                finished[p.id].append(bool(done))
            if on_batch:
                on_batch(k, start + len(chunk), out.tokens_per_second)
    return lengths, finished


def write_profile(records: Sequence[dict], path: str | Path) -> None:
    """Write profile records as JSONL, atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def read_profile(path: str | Path) -> list[dict]:
    """Read a profile; each line needs id, prompt and observed lengths (a bad one raises
    ``schedule/length_files.LengthFileError``). Records as written, ``lengths`` a list."""
    from .length_files import read_length_file

    return [dict(r.fields, lengths=list(r.lengths)) for r in read_length_file(path, "observed", ("prompt",))]


def profile_records(prompts: Sequence, lengths: dict, finished: dict, extra: Callable | None = None) -> list[dict]:
    """One ``scripts/profile_lengths.py`` record per prompt, in the order of ``prompts``."""
    out = []
    for p in prompts:
        r = {"id": p.id, "prompt": p.prompt}
        if extra is not None:
            r.update(extra(p))
        r.update(lengths=lengths[p.id], mean_length=sum(lengths[p.id]) / len(lengths[p.id]),
                 finished=finished[p.id])
        out.append(r)
    return out


PREDICTED_LENGTHS = "predicted_lengths.jsonl"


def write_predicted_lengths(items: Sequence[tuple[str, float]], run_dir: str | Path) -> Path:
    """The lengths the plan is made from, one ``{"id", "predicted_length"}`` line per
    prompt (``asp-schedule input=``'s format), as ``run_dir/predicted_lengths.jsonl``:
    the refit between epochs (schedule/epoch_report.py) blends its observations with them."""
    path = Path(run_dir) / PREDICTED_LENGTHS
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for pid, length in items:
            f.write(json.dumps({"id": pid, "predicted_length": float(length)}) + "\n")
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------- split
def split_profile(n: int, share: float, holdout: float, seed: int) -> tuple[list[int], list[int]]:
    """(fit indices, held-out indices) into ``n`` prompts: ``round(share * n)`` prompts
    (at least 4, at most n) drawn at random (seeded), of which ``round(holdout * k)``
    (at least 2 when ``holdout > 0``, and at least 2 left to fit) are held out. Both
    lists ascending, disjoint."""
    if n < 1:
        raise ValueError("no prompts to profile")
    k = min(n, max(4, round(share * n)))
    held = 0 if holdout <= 0 else min(max(2, round(holdout * k)), k - 2)
    held = max(held, 0)
    chosen = np.random.default_rng(seed + PROFILE_SPLIT_SALT).permutation(n)[:k]
    return sorted(chosen[held:].tolist()), sorted(chosen[:held].tolist())


# Fewer held-out prompts than this and a rank quality is reported with a caveat: Kendall tau of
# an unrelated ranking has a standard deviation of sqrt(2 (2n + 5) / (9 n (n - 1))), 0.16 at
# n = 20 but 0.41 at 5, and at n = 2 every tau is +1 or -1.
MIN_HELD_OUT = 20


def held_out_caveat(prompts: int) -> str | None:
    """Why a rank quality measured on ``prompts`` held-out prompts says little, or None."""
    if prompts >= MIN_HELD_OUT:
        return None
    spread = math.sqrt(2 * (2 * prompts + 5) / (9 * prompts * (prompts - 1))) if prompts > 1 else float("inf")
    return (f"only {prompts} held-out prompt(s), fewer than {MIN_HELD_OUT}: an unrelated ranking's tau "
            f"spreads by {spread:.2f} here, so this says little; raise scheduler.profile_holdout or profile_share")


def _quality(predicted, observed) -> dict | None:
    from .predictors import rank_quality

    if len(observed) < 2:
        return None
    q = rank_quality(predicted, observed)
    out = {k: (None if math.isnan(v) else round(v, 4)) for k, v in q.items()} | {"prompts": len(observed)}
    caveat = held_out_caveat(len(observed))
    return out | {"caveat": caveat} if caveat else out


# --------------------------------------------------------------------------- the loop
def _make_predictor(cfg, kind: str):
    from ..config.validate import resolve_model_path
    from .predictors import PREDICTORS

    if kind == "lm":
        return PREDICTORS["lm"](model_path=resolve_model_path(cfg.model.path), device=cfg.engine.device,
                                num_threads=max(int(cfg.engine.num_threads), 0), seed=int(cfg.seed))
    return PREDICTORS[kind]()


def describe_predictor(cfg, num_prompts: int) -> str:
    """One line: what the run would do to get its predicted lengths (the dry run prints
    it), and, with ``scheduler.refit``, how later epochs are re-planned."""
    s = cfg.scheduler
    refit = getattr(s, "refit", "none")
    if refit != "none":
        return (_describe_first_plan(cfg, num_prompts) + f"; refit: {refit}, each epoch >= 1 re-planned on "
                f"(refit_weight={s.refit_weight} x predicted + observed lengths) / (refit_weight + samples)")
    return _describe_first_plan(cfg, num_prompts)


def _describe_first_plan(cfg, num_prompts: int) -> str:
    s = cfg.scheduler
    if s.predictor == "reference":
        return "predictor: the task's reference lengths"
    if s.predictor == "history":
        return f"predictor: history of {s.lengths_file} (ridge fallback for prompts not in it); no sampling"
    if s.predictor_path:
        return f"predictor: {s.predictor} loaded from {s.predictor_path}; no sampling"
    fit, held = split_profile(num_prompts, s.profile_share, s.profile_holdout, int(cfg.seed))
    what = ("the policy's own transformer + a regression head (LMLengthPredictor)" if s.predictor == "lm"
            else "ridge on prompt features (FeatureRidgePredictor)")
    return (f"predictor: {s.predictor} = {what}, fitted on {len(fit)} prompts profiled with the starting policy "
            f"({s.profile_samples} sample(s) each, {len(held)} more held out for rank quality), predicting the "
            f"other {num_prompts - len(fit) - len(held)}; a real run samples and fits before training "
            "(this dry run plans every prompt at the generation budget)")


def profile_and_predict(cfg, prompts: Sequence, run_dir: str | Path | None = None,
                        log: Callable[[str], None] | None = None) -> tuple[list[tuple[str, float]], dict]:
    """(prompt id, predicted length) for every prompt of ``prompts`` (in their order), and
    the report written to ``run_dir/predictor.json`` (see the module docstring)."""
    s = cfg.scheduler
    run_dir = Path(run_dir) if run_dir is not None else None
    say = log or (lambda _m: None)
    started = time.perf_counter()
    if s.predictor == "history":
        items, found = _predict_from_history(cfg, prompts)
    elif s.predictor_path:
        items, found = _predict_with_saved(cfg, prompts)
    else:
        items, found = _profile_fit_predict(cfg, prompts, run_dir, say)
    report = {"kind": s.predictor, "prompts": len(prompts), **found, "seconds": time.perf_counter() - started}
    if report.get("held_out"):
        q = report["held_out"]
        say(f"predictor {s.predictor}: held-out rank quality tau {q['kendall_tau']} rho {q['spearman_rho']} "
            f"on {q['prompts']} prompts" + (f" ({q['caveat']})" if q.get("caveat") else ""))
    if run_dir is not None:
        _write_prediction(items, report, run_dir)
    return items, report


def _predict_from_history(cfg, prompts: Sequence) -> tuple[list[tuple[str, float]], dict]:
    """``history``: the lengths file's held-out records scored by a predictor fitted on the
    rest, then every prompt predicted by one fitted on the whole file."""
    from .predictors import FeatureRidgePredictor, HistoryPredictor

    s = cfg.scheduler
    records = read_profile(s.lengths_file)
    fit_idx, held_idx = split_profile(len(records), 1.0, s.profile_holdout, int(cfg.seed))
    rec_text = [r["prompt"] for r in records]
    rec_mean = np.array([float(np.mean(r["lengths"])) for r in records])

    def fit_on(idx):
        xs = [rec_text[i] for i in idx for _ in records[i]["lengths"]]
        ys = [float(v) for i in idx for v in records[i]["lengths"]]
        return HistoryPredictor(fallback=FeatureRidgePredictor()).fit(xs, ys)

    t0 = time.perf_counter()
    report: dict = {}
    if held_idx:
        held_pred = fit_on(fit_idx).predict([rec_text[i] for i in held_idx])
        report["held_out"] = _quality(held_pred, rec_mean[held_idx])
    predictor = fit_on(range(len(records)))
    texts = [p.prompt for p in prompts]
    predicted = predictor.predict(texts)
    report.update(lengths_file=s.lengths_file, file_records=len(records), held_out_records=len(held_idx),
                  prompts_in_file=sum(t in predictor for t in texts), fit_seconds=time.perf_counter() - t0,
                  note="held-out records are predicted by the ridge fallback (unseen prompts)")
    return [(p.id, float(v)) for p, v in zip(prompts, predicted)], report


def _predict_with_saved(cfg, prompts: Sequence) -> tuple[list[tuple[str, float]], dict]:
    """``scheduler.predictor_path``: a saved predictor predicts every prompt; nothing is scored."""
    from .predictors import load_predictor

    s = cfg.scheduler
    t0 = time.perf_counter()
    predictor = load_predictor(s.predictor_path, s.predictor, **(
        {"num_threads": max(int(cfg.engine.num_threads), 0), "device": cfg.engine.device}
        if s.predictor == "lm" else {}))
    predicted = predictor.predict([p.prompt for p in prompts])
    report = {"predictor_path": s.predictor_path, "load_seconds": time.perf_counter() - t0, "held_out": None}
    return [(p.id, float(v)) for p, v in zip(prompts, predicted)], report


def _sample_starting_policy(cfg, profiled: Sequence) -> tuple[dict, dict, float]:
    """The profiled prompts' sampled lengths and finished flags with the starting policy
    (an hf engine built for this and dropped after), and the seconds it took."""
    from ..config.validate import resolve_model_path
    from ..engines.hf import HFGenerationEngine

    t0 = time.perf_counter()
    engine = HFGenerationEngine(resolve_model_path(cfg.model.path), device=cfg.engine.device,
                                dtype=cfg.engine.dtype, num_threads=cfg.engine.num_threads)
    sc = cfg.generate.sampling_config
    lengths, finished = sample_lengths(engine, engine.tokenizer, profiled, int(cfg.scheduler.profile_samples),
                                       int(sc.max_tokens), int(cfg.seed), temperature=float(sc.temperature))
    del engine
    return lengths, finished, time.perf_counter() - t0


def _profile_fit_predict(cfg, prompts: Sequence, run_dir: Path | None,
                         say: Callable[[str], None]) -> tuple[list[tuple[str, float]], dict]:
    """``ridge`` / ``lm``: profile a share of the prompts, fit on all but the held-out ones,
    score those, predict the rest; profiled prompts keep their observed mean length. With
    ``run_dir``, the profile and the fitted predictor are saved there."""
    s, kind = cfg.scheduler, cfg.scheduler.predictor
    fit_idx, held_idx = split_profile(len(prompts), s.profile_share, s.profile_holdout, int(cfg.seed))
    profiled = [prompts[i] for i in sorted(fit_idx + held_idx)]
    say(f"predictor {kind}: sampling {len(profiled)} of {len(prompts)} prompts x {s.profile_samples} "
        "with the starting policy")
    lengths, finished, profile_seconds = _sample_starting_policy(cfg, profiled)
    observed = {pid: float(np.mean(v)) for pid, v in lengths.items()}
    t0 = time.perf_counter()
    predictor = _make_predictor(cfg, kind)
    fit_prompts = [prompts[i] for i in fit_idx]
    predictor.fit([p.prompt for p in fit_prompts for _ in lengths[p.id]],
                  [float(v) for p in fit_prompts for v in lengths[p.id]])
    fit_seconds = time.perf_counter() - t0
    rest = [k for k, p in enumerate(prompts) if p.id not in observed]
    held = [prompts[i] for i in held_idx]
    to_predict = held + [prompts[k] for k in rest]
    predicted = predictor.predict([p.prompt for p in to_predict]) if to_predict else np.empty(0)
    by_id = dict(observed)
    by_id.update({p.id: float(v) for p, v in zip(to_predict[len(held):], predicted[len(held):])})
    report = dict(profile_share=s.profile_share, profile_holdout=s.profile_holdout,
                  profile_samples=int(s.profile_samples), profiled=len(profiled), fitted_on=len(fit_idx),
                  held_out_prompts=len(held_idx), predicted=len(rest), profile_seconds=profile_seconds,
                  fit_seconds=fit_seconds,
                  held_out=_quality(predicted[:len(held)], [observed[p.id] for p in held]),
                  cut_at_max_tokens=sum(not f for v in finished.values() for f in v))
    if run_dir is not None:
        write_profile(profile_records(profiled, lengths, finished), run_dir / "length_profile.jsonl")
        predictor.save(run_dir / "length_predictor")
        report["saved"] = "length_predictor"
    return [(p.id, by_id[p.id]) for p in prompts], report


def _write_prediction(items: Sequence[tuple[str, float]], report: dict, run_dir: Path) -> None:
    """``predicted_lengths.jsonl`` and ``predictor.json`` (written whole, then renamed)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_predicted_lengths(items, run_dir)
    tmp = run_dir / "predictor.json.tmp"
    tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / "predictor.json")
