"""The predictor in the loop, end to end: fifo, asp + reference lengths, asp + lm,
asp + lm refitted between epochs (``scheduler.refit=history``, schedule/epoch_report.py) and
asp + ridge (``scheduler.predictor``, schedule/length_profile.py) on the same maze prompts.
Not a test. Prints a markdown table (pasted into docs/scheduler.md, "Predictors in the
loop") and, for runs of several epochs, a per-epoch table::

    HF_HUB_OFFLINE=1 python benchmarks/bench_predictors_in_loop.py --steps 16 --keep runs/bench_predictors \
        rl.global_batch_size=4 rl.mini_batch_size=4      # one pass over the 64 prompts; ~12 min on 2 busy cores
    HF_HUB_OFFLINE=1 python benchmarks/bench_predictors_in_loop.py --reuse runs/bench_predictors   # re-read
    HF_HUB_OFFLINE=1 python benchmarks/bench_predictors_in_loop.py --steps 18 --prompts 24 --score-samples 0 \
        --keep runs/bench_refit --only asp+reference,asp+lm,asp+lm+history,fifo \
        rl.global_batch_size=4 rl.mini_batch_size=4 scheduler.profile_share=0.5   # 3 epochs; ~10 min

Every run: ``mode=async``, the same seed and prompts (``task.num_prompts``, default 64),
``--steps`` steps, no final check (``eval.num_prompts=0``); one process, one local Ray
cluster, the runs one after another (``runtime.driver.run_training``). Per run:

* padding bubble, token-weighted over the run: 1 - sum(useful tokens) / sum(padded slots);
* iteration time: mean and median of ``iteration_time_s`` (step 0 included), and the
  Control Unit's wall time; for lm / ridge also the seconds spent profiling the starting
  policy and fitting (``predictor.json``; before the run, not in its wall time);
* held-out rank quality (``predictor.json``): Kendall tau / Spearman rho of predicted vs
  observed mean length on the profiled prompts kept out of the fit (few prompts: noisy);
* rank quality on the predicted prompts: after the runs the starting policy is sampled
  once more (``--score-samples`` per prompt, another seed) on every prompt; each
  predictor's predictions for the prompts its run did not profile are scored against
  those lengths (reference: the task's reference lengths, on the prompts the learned
  predictors predicted);
* minibatch rank quality in the run: Spearman rho of each dispatched minibatch's
  planned ``max_length`` (plan.json) and its observed longest response (timeline.jsonl),
  over every minibatch of the run (nan for fifo's equal-size data-order minibatches
  when all predictions tie); a re-planned epoch's minibatches against ``plan_e<e>.json``;
* per epoch (``predictor_by_epoch.json``): Spearman rho of the lengths the epoch's plan
  used and the observed mean length per prompt, and the epoch's realised padding bubble.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_modes import run_one  # noqa: E402  (the runner every real-run benchmark shares)

RUNS = [
    ("fifo", ["scheduler=fifo", "scheduler.slack=0"]),
    ("asp+reference", ["scheduler=asp", "scheduler.predictor=reference"]),
    ("asp+lm", ["scheduler=asp", "scheduler.predictor=lm"]),
    ("asp+lm+history", ["scheduler=asp", "scheduler.predictor=lm", "scheduler.refit=history"]),
    ("asp+ridge", ["scheduler=asp", "scheduler.predictor=ridge"]),
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def minibatch_rho(run_dir: Path) -> tuple[float, int]:
    """Spearman rho of planned vs observed minibatch max length, over the run's minibatches."""
    from mindspeed_rl_asp.schedule.predictors import spearman_rho

    def max_lengths(path: Path) -> dict[str, float]:
        plan = json.loads(path.read_text())
        return {f"g{g}m{m}": mb["max_length"] for g, group in enumerate(plan["groups"]) for m, mb in enumerate(group)}

    planned = max_lengths(run_dir / "plan.json")
    replanned = {int(p.stem[len("plan_e"):]): max_lengths(p) for p in run_dir.glob("plan_e*.json")}
    pred, obs = [], []
    for s in jsonl(run_dir / "timeline.jsonl"):
        if s["kind"] == "generate" and s["label"].startswith("e"):
            epoch, key = s["label"][1:s["label"].index("g")], s["label"][s["label"].index("g"):]
            plan = replanned.get(int(epoch), planned) if epoch.isdigit() else planned
            if key in plan:
                pred.append(plan[key])
                obs.append(s["info"]["max_length"])
    if len(pred) < 2:
        return float("nan"), len(pred)
    return spearman_rho(pred, obs), len(pred)


def analyse(run_dir: Path) -> dict:
    metrics = jsonl(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    tokens = [m["generated_tokens"] for m in metrics]
    bubbles = [m["padding_bubble"] for m in metrics]
    padded = sum(t / (1.0 - b) for t, b in zip(tokens, bubbles) if t > 0 and b < 1.0)
    iters = [m["iteration_time_s"] for m in metrics]
    rho, n_mb = minibatch_rho(run_dir)
    out = {"steps": len(metrics), "wall_s": summary["wall_time_s"], "iteration_s": statistics.mean(iters),
           "iteration_median_s": statistics.median(iters), "padding_bubble": 1.0 - sum(tokens) / padded,
           "minibatch_rho": rho, "minibatches": n_mb}
    by_epoch = run_dir / "predictor_by_epoch.json"
    if by_epoch.is_file():
        out["epochs"] = json.loads(by_epoch.read_text())["epochs"]
    report = run_dir / "predictor.json"
    if report.is_file():
        out["predictor"] = json.loads(report.read_text())
    return out


def score_on_rest(common: list[str], runs: dict[str, Path], samples: int) -> dict[str, dict]:
    """Rank quality of each predictor on the prompts its run did not profile, against a
    fresh sample of the starting policy (seed + 1)."""
    import numpy as np

    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.config.validate import resolve_model_path
    from mindspeed_rl_asp.engines.hf import HFGenerationEngine
    from mindspeed_rl_asp.schedule.length_profile import sample_lengths
    from mindspeed_rl_asp.schedule.configured import configured_task
    from mindspeed_rl_asp.schedule.predictors import load_predictor, rank_quality

    cfg = load_config(common)
    prompts = configured_task(cfg).prompts
    engine = HFGenerationEngine(resolve_model_path(cfg.model.path), num_threads=cfg.engine.num_threads)
    t0 = time.time()
    lengths, _ = sample_lengths(engine, engine.tokenizer, prompts, samples, int(cfg.generate.sampling_config.max_tokens),
                                int(cfg.seed) + 1, temperature=float(cfg.generate.sampling_config.temperature))
    log(f"  scoring sample: {len(prompts)} prompts x {samples} in {time.time() - t0:.1f} s")
    observed = {pid: float(np.mean(v)) for pid, v in lengths.items()}
    out = {}
    # The learned predictors' runs profile the same prompts (same seed and shares); the
    # reference is scored on the prompts they predicted, for a like-for-like row.
    learned = [d / "length_profile.jsonl" for d in runs.values() if (d / "length_profile.jsonl").is_file()]
    learned_profiled = {r["id"] for r in jsonl(learned[0])} if learned else set()
    for tag, run_dir in runs.items():
        profiled = learned_profiled
        if (run_dir / "length_profile.jsonl").is_file():
            profiled = {r["id"] for r in jsonl(run_dir / "length_profile.jsonl")}
        rest = [p for p in prompts if p.id not in profiled]
        if tag.endswith("+reference"):
            pred = [float(p.reference_length) for p in rest]
        elif (run_dir / "length_predictor").is_dir():
            pred = load_predictor(run_dir / "length_predictor", num_threads=1).predict([p.prompt for p in rest])
        else:
            continue
        q = rank_quality(pred, [observed[p.id] for p in rest])
        out[tag] = {**q, "prompts": len(rest)}
    return out


def fmt(x, spec=".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def table(results: dict[str, dict], scored: dict[str, dict]) -> str:
    head = ("| run | padding bubble | iteration s (mean / median) | wall s | profile + fit s | held-out tau / rho "
            "(prompts) | predicted prompts tau / rho (prompts) | minibatch rho (minibatches) |")
    lines = [head, "|" + "---|" * 8]
    for tag, r in results.items():
        p = r.get("predictor", {})
        held = p.get("held_out")
        held_s = (f"{fmt(held['kendall_tau'], '.2f')} / {fmt(held['spearman_rho'], '.2f')} ({held['prompts']})"
                  if held else "-")
        pf = (f"{p['profile_seconds']:.1f} + {p['fit_seconds']:.1f}" if "profile_seconds" in p else "-")
        s = scored.get(tag)
        s_s = f"{fmt(s['kendall_tau'], '.2f')} / {fmt(s['spearman_rho'], '.2f')} ({s['prompts']})" if s else "-"
        lines.append(f"| {tag} | {fmt(r['padding_bubble'])} | {r['iteration_s']:.2f} / {r['iteration_median_s']:.2f} | "
                     f"{r['wall_s']:.1f} | {pf} | {held_s} | {s_s} | {fmt(r['minibatch_rho'], '.2f')} "
                     f"({r['minibatches']}) |")
    return "\n".join(lines)


def epoch_table(results: dict[str, dict]) -> str:
    """Per run and epoch (``predictor_by_epoch.json``): rank correlation of the lengths
    the epoch's plan used vs observed, and the epoch's realised bubbles."""
    lines = ["| run | epoch | plan | Spearman rho / Kendall tau (prompts) | padding bubble | slot bubble | "
             "mean length |", "|" + "---|" * 7]
    for tag, r in results.items():
        for e in r.get("epochs", []):
            plan = ("re-planned" if e["replanned"] else "first plan") + ("" if e["complete"] else " (partial)")
            lines.append(f"| {tag} | {e['epoch']} | {plan} | {fmt(e['spearman_rho'], '.2f')} / "
                         f"{fmt(e['kendall_tau'], '.2f')} ({e['prompts']}) | {fmt(e['padding_bubble'])} | "
                         f"{fmt(e['slot_bubble'])} | {e['observed_mean_length']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=64, help="task.num_prompts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--score-samples", type=int, default=2, help="samples per prompt of the scoring sample (0: skip)")
    ap.add_argument("--only", default="", help="comma-separated run tags (default: all)")
    ap.add_argument("--keep", default="", help="keep the run directories here (e.g. runs/bench_predictors)")
    ap.add_argument("--reuse", default="", help="no training: re-read the run directories of a --keep run")
    ap.add_argument("overrides", nargs="*", help="extra config overrides for every run")
    args = ap.parse_args(argv)
    common = [f"steps={args.steps}", f"task.num_prompts={args.prompts}", f"seed={args.seed}", "mode=async",
              "eval.num_prompts=0", *args.overrides]
    runs = [(t, o) for t, o in RUNS if not args.only or t in args.only.split(",")]
    root = Path(args.reuse or args.keep or tempfile.mkdtemp(prefix="bench_predictors_"))
    dirs: dict[str, Path] = {}
    started = time.time()
    try:
        if args.reuse:
            for tag, _ in runs:
                found = sorted((root / tag).glob("*/metrics.jsonl")) or sorted((root / tag).glob("metrics.jsonl"))
                if found:
                    dirs[tag] = found[-1].parent
        else:
            import ray

            ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
            try:
                for tag, overrides in runs:
                    log(f"run {tag}")
                    dirs[tag] = run_one(common + overrides, root, tag, before_training="start-up, profile and fit")
            finally:
                ray.shutdown()
        results = {tag: analyse(d) for tag, d in dirs.items()}
        scored = score_on_rest(common, dirs, args.score_samples) if args.score_samples else {}
        if args.reuse:   # the runs' own settings are in their config.yaml, not in these arguments
            print(f"re-read from {root}\n")
        else:
            print(f"{args.steps} steps, task.num_prompts={args.prompts}, seed {args.seed}, mode=async; "
                  f"{time.time() - started:.0f} s in all\n")
        print(table(results, scored))
        if any(len(r.get("epochs", [])) > 1 for r in results.values()):
            print("\nPer epoch:\n")
            print(epoch_table(results))
        (root / "bench_predictors.json").write_text(json.dumps({"results": results, "scored": scored}, indent=1))
    finally:
        if not (args.keep or args.reuse):
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
