"""Rank quality of the length predictors on a profile of the target policy.

Reads a profile written by ``scripts/profile_lengths.py`` (or profiles on the fly when
``--profile`` is not given), splits the prompts into train / held-out (seeded, by
prompt), fits each predictor and prints a markdown table of Kendall tau-b and
Spearman rho against the held-out observed lengths. Then writes the predictions of
the best predictor (highest tau) as ``{"id", "predicted_length"}`` JSONL lines, the
input of ``asp-schedule input=FILE``.

Run from the repository root::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/profile_lengths.py \\
        --num-prompts 600 --samples-per-prompt 2 --out runs/profile.jsonl
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/predictor_report.py \\
        --profile runs/profile.jsonl --out runs/predicted_lengths.jsonl
    asp-schedule input=runs/predicted_lengths.jsonl output=runs/plan.json

Protocol (k = samples per prompt, each an independent sampling pass):

* target: the **last** sample of each held-out prompt (the "current epoch"); a
  second pair of columns scores against the mean of all k samples (less noisy; not
  shown for ``history``, which reads samples 1..k-1 of the same prompts);
* ``history``: mean of samples 1..k-1 of the same prompt (an earlier epoch of
  every prompt, the held-out ones included); needs k >= 2;
* ``ridge``, ``lm``: fitted on every sample of the train prompts only;
* ``reference``: the length of the maze's reference (DFS) solution in tokens + 1
  (end of text); needs no fit;
* ``size``: the maze size (the profile's ``size`` field), the trivial baseline; its
  many ties lift Kendall tau-b (tied pairs leave its denominator), so a second row
  breaks them in data order, as the scheduler's stable sort does;
* ``asp bubble``: the padding bubble, measured on the target lengths, of an asp
  plan of the held-out prompts made from the predictions (base 8, slack 2, one
  sample per prompt); the setup line gives the bubble of the fifo plan and of the
  asp plan made from the target lengths themselves (the floor) for comparison.

The predictions file covers the profiled prompts (for ``ridge``/``lm`` the train
prompts are in-sample), or with ``--predict-num-prompts N`` the first N prompts of
the maze task with ``--predict-seed`` (the profile is a prefix of that set when the
seeds agree; history predicts unprofiled prompts with its ridge fallback).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # profile_lengths
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the package, from a checkout

from profile_lengths import DEFAULT_MODEL, profile, read_jsonl, resolve_model, summary_line, write_jsonl  # noqa: E402

from mindspeed_rl_asp.schedule.predictors import PREDICTORS, rank_quality  # noqa: E402

FITTED = ("history", "ridge", "lm")


def reference_length(prompt: str) -> float:
    """Tokens of the maze's reference solution, + 1 for the end-of-text token."""
    from mindspeed_rl_asp.tasks.maze import count_tokens, format_response, parse_maze

    return float(count_tokens(format_response(parse_maze(prompt))) + 1)


def split(n: int, train_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction={train_fraction} must lie in (0, 1)")
    order = np.random.default_rng(seed).permutation(n)
    cut = int(round(train_fraction * n))
    if cut < 2 or n - cut < 2:
        raise ValueError(f"{n} prompts are too few for a {train_fraction:.0%} split (need >= 2 on each side)")
    return np.sort(order[:cut]), np.sort(order[cut:])


def realised_bubble(ids: Sequence[str], predicted, observed, planner: str = "asp") -> float:
    """Padding bubble, on the observed lengths, of a plan made from the predictions
    (base_batch_size 8, slack 2, group_size 2, one sample per prompt)."""
    from mindspeed_rl_asp.schedule.plan import SchedulerParams, make_plan, padding_stats

    params = SchedulerParams(name=planner, base_batch_size=8, slack=2, group_size=2)
    plan = make_plan(list(zip(ids, map(float, predicted))), params, n_samples_per_prompt=1)
    return padding_stats(plan, dict(zip(ids, map(float, observed))))["bubble_fraction"]


def make_predictor(name: str, lm_kwargs: dict):
    if name not in PREDICTORS:
        raise ValueError(f"unknown predictor {name!r}; known: {', '.join(sorted(PREDICTORS))}")
    return PREDICTORS[name](**lm_kwargs) if name == "lm" else PREDICTORS[name]()


def evaluate(records: Sequence[dict], names: Sequence[str], train_fraction: float = 0.7, split_seed: int = 0,
             lm_kwargs: dict | None = None, log=print) -> tuple[list[dict], dict]:
    """Fit and score every predictor; return (table rows, fitted predictors by name)."""
    lm_kwargs = lm_kwargs or {}
    k = min(len(r["lengths"]) for r in records)
    prompts = [r["prompt"] for r in records]
    lengths = np.array([r["lengths"][:k] for r in records], dtype=np.float64)
    train, held = split(len(records), train_fraction, split_seed)
    held_prompts = [prompts[i] for i in held]
    held_ids = [str(records[i]["id"]) for i in held]
    target_last = lengths[held, k - 1]
    target_mean = lengths[held].mean(axis=1)
    rows, fitted = [], {}

    def add(name: str, trained_on: str, predicted: np.ndarray, fit_s: float, predict_s: float, leak: bool):
        last = rank_quality(predicted, target_last)
        mean = rank_quality(predicted, target_mean) if not leak else {"kendall_tau": math.nan, "spearman_rho": math.nan}
        rows.append({"predictor": name, "trained_on": trained_on, "tau_last": last["kendall_tau"],
                     "rho_last": last["spearman_rho"], "tau_mean": mean["kendall_tau"],
                     "rho_mean": mean["spearman_rho"], "fit_s": fit_s, "predict_s": predict_s,
                     "bubble": realised_bubble(held_ids, predicted, target_last)})
        log(f"  {name}: tau {last['kendall_tau']:.3f}, rho {last['spearman_rho']:.3f} "
            f"(fit {fit_s:.1f} s, predict {predict_s:.1f} s)")

    try:
        start = time.perf_counter()
        ref = np.array([reference_length(p) for p in held_prompts])
        add("reference", "- (reference solution, no fit)", ref, 0.0, time.perf_counter() - start, leak=False)
    except ValueError as error:  # not maze prompts
        log(f"  reference: skipped ({error})")

    if all(isinstance(records[i].get("size"), (int, float)) for i in held):
        size = np.array([float(records[i]["size"]) for i in held])
        add("size", "- (maze size, no fit)", size, 0.0, 0.0, leak=False)
        # What a scheduler does with ties: a stable sort keeps them in data order.
        add("size, ties in data order", "- (maze size, no fit)", size + 0.5 * np.arange(len(held)) / len(held),
            0.0, 0.0, leak=False)

    train_prompts = [prompts[i] for i in train for _ in range(k)]
    train_lengths = lengths[train].reshape(-1)
    for name in names:
        if name == "history":
            if k < 2:
                log("  history: skipped (needs >= 2 samples per prompt)")
                continue
            fit_prompts = [p for p in prompts for _ in range(k - 1)]
            fit_lengths = lengths[:, : k - 1].reshape(-1)
            trained_on = f"samples 1..{k - 1} of all {len(records)} prompts" if k > 2 else \
                f"sample 1 of all {len(records)} prompts"
        else:
            fit_prompts, fit_lengths = train_prompts, train_lengths
            trained_on = f"{k} samples x {len(train)} train prompts"
        predictor = make_predictor(name, lm_kwargs)
        start = time.perf_counter()
        predictor.fit(fit_prompts, fit_lengths)
        fit_s = time.perf_counter() - start
        start = time.perf_counter()
        predicted = predictor.predict(held_prompts)
        add(name, trained_on, predicted, fit_s, time.perf_counter() - start, leak=(name == "history"))
        fitted[name] = predictor
    fifo = realised_bubble(held_ids, np.ones(len(held)), target_last, planner="fifo")
    oracle = realised_bubble(held_ids, target_last, target_last)
    return rows, {"k": k, "train": len(train), "held_out": len(held), "fitted": fitted, "fifo_bubble": fifo,
                  "oracle_bubble": oracle}


def _cell(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.3f}"


def markdown_table(rows: Sequence[dict], k: int) -> str:
    lines = [f"| predictor | fitted on | Kendall tau (sample {k}) | Spearman rho (sample {k}) | "
             f"Kendall tau (mean of {k}) | Spearman rho (mean of {k}) | asp bubble (sample {k}) | "
             "fit [s] | predict [s] |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['predictor']} | {r['trained_on']} | {_cell(r['tau_last'])} | {_cell(r['rho_last'])} | "
                     f"{_cell(r['tau_mean'])} | {_cell(r['rho_mean'])} | {r['bubble']:.3f} | {r['fit_s']:.1f} | "
                     f"{r['predict_s']:.1f} |")
    return "\n".join(lines)


def best_row(rows: Sequence[dict], among: Sequence[str] | None = None) -> dict:
    valid = [r for r in rows if not math.isnan(r["tau_last"]) and (among is None or r["predictor"] in among)]
    if not valid:
        raise ValueError(f"no predictor among {', '.join(among or ['all'])} produced a rank correlation")
    return max(valid, key=lambda r: r["tau_last"])


def write_predictions(name: str, fitted: dict, ids: Sequence[str], prompts: Sequence[str], path: str | Path) -> None:
    if name == "reference":
        predicted = np.array([reference_length(p) for p in prompts])
    else:
        predicted = fitted[name].predict(list(prompts))
    write_jsonl([{"id": i, "predicted_length": float(v)} for i, v in zip(ids, predicted)], path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", help="profile JSONL from scripts/profile_lengths.py (default: profile now)")
    g = ap.add_argument_group("profiling on the fly (without --profile)")
    g.add_argument("--model", default=DEFAULT_MODEL)
    g.add_argument("--num-prompts", type=int, default=600)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--samples-per-prompt", type=int, default=2)
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--save-profile", help="also write the on-the-fly profile here")
    ap.add_argument("--predictors", default=",".join(FITTED), help="comma list of PREDICTORS names")
    ap.add_argument("--train-fraction", type=float, default=0.7)
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--num-threads", type=int, default=1, help="torch threads for profiling and the lm predictor")
    g = ap.add_argument_group("lm predictor")
    g.add_argument("--lm-model", help="backbone checkpoint (default: the shipped tiny policy)")
    g.add_argument("--lm-epochs", type=int, default=4)
    g.add_argument("--lm-batch-size", type=int, default=32)
    g.add_argument("--lm-lr", type=float, default=5e-4)
    g.add_argument("--lm-pooling", default="mean", choices=("mean", "last"))
    g.add_argument("--lm-seed", type=int, default=0)
    ap.add_argument("--out", default="runs/predicted_lengths.jsonl", help="predictions of the best predictor")
    ap.add_argument("--best-among", default="reference,size," + ",".join(FITTED),
                    help="comma list: the predictor written to --out is the one of these with the highest tau")
    ap.add_argument("--predict-num-prompts", type=int, default=0,
                    help="write predictions for the first N maze task prompts instead of the profiled ones")
    ap.add_argument("--predict-seed", type=int, default=0)
    ap.add_argument("--markdown", help="also write the table (and the setup line) to this file")
    args = ap.parse_args(argv)

    started = time.perf_counter()
    if args.profile:
        records = read_jsonl(args.profile)
        source = args.profile
    else:
        records = profile(resolve_model(args.model), args.num_prompts, args.seed, args.samples_per_prompt,
                          args.max_tokens, num_threads=args.num_threads)
        print(summary_line(records, time.perf_counter() - started))
        if args.save_profile:
            write_jsonl(records, args.save_profile)
        source = f"profiled now ({args.num_prompts} prompts, seed {args.seed})"
    names = [n.strip() for n in args.predictors.split(",") if n.strip()]
    lm_kwargs = {"epochs": args.lm_epochs, "batch_size": args.lm_batch_size, "lr": args.lm_lr,
                 "pooling": args.lm_pooling, "seed": args.lm_seed, "num_threads": args.num_threads}
    if args.lm_model:
        lm_kwargs["model_path"] = resolve_model(args.lm_model)
    print(f"fitting on {source}:")
    rows, info = evaluate(records, names, args.train_fraction, args.split_seed, lm_kwargs)
    setup = (f"{len(records)} prompts x {info['k']} samples; train {info['train']} / held-out {info['held_out']} "
             f"prompts (split seed {args.split_seed}); target: sample {info['k']} of each held-out prompt; "
             f"asp bubble: realised padding bubble of an asp plan (base 8, slack 2) made from the predictions "
             f"(fifo, no prediction: {info['fifo_bubble']:.3f}; "
             f"asp from the target itself: {info['oracle_bubble']:.3f})")
    table = markdown_table(rows, info["k"])
    print()
    print(setup)
    print()
    print(table)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(setup + "\n\n" + table + "\n", encoding="utf-8")

    best = best_row(rows, [n.strip() for n in args.best_among.split(",") if n.strip()])
    if args.predict_num_prompts > 0:
        from mindspeed_rl_asp.tasks.maze import MazeTaskSpec, make_dataset

        items = make_dataset(args.predict_num_prompts, args.predict_seed, MazeTaskSpec())
        ids, prompts = [p.id for p in items], [p.prompt for p in items]
    else:
        ids, prompts = [r["id"] for r in records], [r["prompt"] for r in records]
    write_predictions(best["predictor"], info["fitted"], ids, prompts, args.out)
    print(f"\nbest: {best['predictor']} (tau {best['tau_last']:.3f}); wrote {len(ids)} predictions to {args.out}")
    print(f"total {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
