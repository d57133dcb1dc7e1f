"""The three modes side by side: hybrid (colocated, synchronous), async FIFO, async ASP.

Not a test. Prints markdown tables (pasted into docs/benchmarks.md, "Three modes side by
side"):

    HF_HUB_OFFLINE=1 python benchmarks/bench_modes.py --eval-prompts 128 --keep runs/bench_modes \
        --plot runs/bench_modes.png          # full: ~12 min on 2 shared cores
    HF_HUB_OFFLINE=1 python benchmarks/bench_modes.py --quick --plot runs/modes-quick.png   # ~1.5 min

``asp-report runs/bench_modes/async-asp-seed0`` then draws that run's Gantt chart.

Options: ``--steps`` (40), ``--prompts`` (task.num_prompts, 320: each prompt trained on
once), ``--repeats`` (3; repeat r uses seed ``--seed + r`` in every mode), ``--eval-prompts``
(held-out initial vs final check per run, 0 skips it), ``--keep DIR`` (keep the run
directories there, e.g. ``runs/bench_modes``, for ``asp-report``; default: a temporary
directory that is removed), ``--plot FILE`` (the reward curves as PNG), ``--reuse DIR``
(no training: re-read the run directories a ``--keep`` run left there).

The modes, all with the same seed, the same prompts and the same sample budget
(steps x rl.global_batch_size prompts x rl.n_samples_per_prompt samples trained on):

* ``hybrid``: ``mode=hybrid scheduler=fifo scheduler.slack=0``: MindSpeed-RL-style,
  colocated and synchronous (generate a step's samples on every node, then train);
* ``async-fifo``: ``mode=async scheduler=fifo scheduler.slack=0``: verl-style async,
  data-order minibatches of a fixed size;
* ``async-asp``: ``mode=async scheduler=asp``: the full system.

One local Ray cluster for the whole process (``ray.init`` once, ``ray.shutdown`` at the
end); the modes run interleaved (hybrid, fifo, asp, hybrid, fifo, asp, ...) so that load
from other jobs on a shared machine hits all of them alike. Each run is
``mindspeed_rl_asp.runtime.driver.run_training``; the figures come from its
``metrics.jsonl`` and ``summary.json``:

* wall time (the Control Unit's loop, actor start-up excluded), mean iteration time;
* tokens/s: every generated response token (also those of prompts generated but not
  trained on) / wall time;
* padding bubble, token-weighted: 1 - sum(useful tokens) / sum(padded decode slots);
* generation and trainer idle shares, time-weighted over the run;
* mean policy age of the consumed samples;
* the trainer's time per trained response token (``train_time_s``; it rises when
  generation competes for the same cores) and the generation actors' busy seconds (from
  ``timeline.jsonl``: decode work, padding included);
* reward: mean ``reward_mean`` over the last half of the steps;
* time to reward: the ``elapsed_s`` of the first step at which the rolling mean (window 5)
  of ``reward_mean`` reaches the threshold (the run's first rolling mean + ``--delta``).

**Prompt order confounds the training reward.** The modes see the same prompts, not in
the same order or grouping: ``fifo`` keeps data order, ``asp`` dispatches its balanced groups
by load, heaviest first, alternating long and short minibatches, so its steps alternate
large and small mazes and its last steps hold the smallest ones; the tiny policy's reward
depends strongly on maze size and on the maze itself. So the benchmark first samples the
*initial* policy ``--baseline-samples`` times on every training prompt and also reports a
prompt-adjusted reward: ``reward_mean`` minus the initial policy's mean reward on that
step's prompts (the step's prompts are ``summary.json``'s ``consumed_prompt_ids``, in
chunks of ``rl.global_batch_size``). 0 means "as good as the initial policy on these
very mazes"; its time to reward uses the threshold +``--delta``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = [
    ("hybrid", ["mode=hybrid", "scheduler=fifo", "scheduler.slack=0"]),
    ("async-fifo", ["mode=async", "scheduler=fifo", "scheduler.slack=0"]),
    ("async-asp", ["mode=async", "scheduler=asp"]),
]
COLORS = {"hybrid": "#C44E52", "async-fifo": "#4C72B0", "async-asp": "#55A868"}
WINDOW = 5


def log(msg: str) -> None:
    print(f"[{Path(sys.argv[0]).stem} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def table(headers: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


# ---------------------------------------------------------------------- baseline
def prompt_baseline(cfg, samples_per_prompt: int) -> tuple[dict[str, float], dict[int, float], float]:
    """The initial policy's mean reward on every training prompt (same sampling settings
    as training, its own seeds); also the mean per maze size and the seconds it took."""
    from mindspeed_rl_asp.engines.base import SamplingParams
    from mindspeed_rl_asp.config.validate import resolve_model_path
    from mindspeed_rl_asp.engines.hf import HFGenerationEngine
    from mindspeed_rl_asp.policy.evaluate import sample_and_score
    from mindspeed_rl_asp.tasks import make_task_prompts, reward_weights

    t0 = time.time()
    # One thread: on a shared 2-core machine two torch threads spin against each other and
    # the other jobs (measured: 50x slower). Sorted by size, small batches: little padding.
    engine = HFGenerationEngine(str(resolve_model_path(cfg.model.path)), num_threads=1)
    prompts = sorted(make_task_prompts(cfg.task), key=lambda p: p.size)
    samples, _ = sample_and_score(engine, engine.tokenizer, prompts, SamplingParams.from_config(cfg.generate.sampling_config, seed=9_999),
                                  reward_weights(cfg.task), n_samples_per_prompt=samples_per_prompt,
                                  batch_size=16)
    by_prompt: dict[str, list[float]] = defaultdict(list)
    by_size: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        by_prompt[s.prompt_id].append(s.reward)
        by_size[s.maze_size].append(s.reward)
    return ({k: mean(v) for k, v in by_prompt.items()}, {k: mean(v) for k, v in sorted(by_size.items())},
            time.time() - t0)


# ---------------------------------------------------------------------- one run
def rolling(values: list[float], window: int = WINDOW) -> list[float | None]:
    """Mean of the last ``window`` values at each index (None before the first full window)."""
    return [None if i + 1 < window else mean(values[i + 1 - window: i + 1]) for i in range(len(values))]


def first_reach(curve: list[float | None], times: list[float], threshold: float) -> tuple[float | None, int | None]:
    for i, (v, t) in enumerate(zip(curve, times)):
        if v is not None and v >= threshold - 1e-12:
            return t, i
    return None, None


def read_run(run_dir: Path) -> tuple[list[dict], dict, list[dict]]:
    """metrics.jsonl, summary.json and timeline.jsonl of one run."""
    def jsonl(name: str) -> list[dict]:
        return [json.loads(line) for line in (run_dir / name).read_text().splitlines() if line.strip()]

    return jsonl("metrics.jsonl"), json.loads((run_dir / "summary.json").read_text()), jsonl("timeline.jsonl")


def analyse(metrics: list[dict], summary: dict, spans: list[dict], sizes: dict[str, int],
            baseline: dict[str, float], gbs: int, delta: float) -> dict:
    steps = len(metrics)
    tokens = [m["generated_tokens"] for m in metrics]
    bubbles = [m["padding_bubble"] for m in metrics]
    iters = [m["iteration_time_s"] for m in metrics]
    padded = sum(t / (1.0 - b) for t, b in zip(tokens, bubbles) if t > 0 and b < 1.0)
    wall = summary["wall_time_s"]
    span = sum(iters)
    reward = [m["reward_mean"] for m in metrics]
    times = [m["elapsed_s"] for m in metrics]
    consumed = summary["consumed_prompt_ids"]
    step_base = [mean(baseline[p] for p in consumed[s * gbs:(s + 1) * gbs]) for s in range(steps)]
    step_size = [mean(sizes[p] for p in consumed[s * gbs:(s + 1) * gbs]) for s in range(steps)]
    adjusted = [r - b for r, b in zip(reward, step_base)]
    raw_curve, adj_curve = rolling(reward), rolling(adjusted)
    raw_start = raw_curve[WINDOW - 1] if steps >= WINDOW else None
    raw_threshold = None if raw_start is None else raw_start + delta
    ttr_raw, ttr_raw_step = (None, None) if raw_threshold is None else first_reach(raw_curve, times, raw_threshold)
    ttr_adj, ttr_adj_step = first_reach(adj_curve, times, delta)
    half = steps // 2
    out = {
        "steps": steps,
        "wall_s": wall,
        "iteration_s": mean(iters),
        "tokens_per_s": sum(tokens) / wall,
        "padding_bubble": 1.0 - sum(tokens) / padded if padded else 0.0,
        "gen_idle": sum(m["generation_idle_fraction"] * d for m, d in zip(metrics, iters)) / span,
        "trainer_idle": sum(m["trainer_idle_fraction"] * d for m, d in zip(metrics, iters)) / span,
        "policy_age": mean(m["policy_age_mean"] for m in metrics),
        "reward_last_half": mean(reward[half:]),
        "adjusted_first_half": mean(adjusted[:half]),
        "adjusted_last_half": mean(adjusted[half:]),
        "adjusted": adjusted,
        "correct_last_half": mean(m["correctness_rate"] for m in metrics[half:]),
        "raw_start": raw_start, "raw_threshold": raw_threshold,
        "ttr_raw": ttr_raw, "ttr_raw_step": ttr_raw_step, "ttr_adj": ttr_adj, "ttr_adj_step": ttr_adj_step,
        "times": times, "raw_curve": raw_curve, "adj_curve": adj_curve, "step_size": step_size,
        "size_first_half": mean(step_size[:half]), "size_last_half": mean(step_size[half:]),
        "generated_tokens": sum(tokens),
        "trained_tokens": sum(m.get("response_tokens", 0) for m in metrics),
        "train_s": sum(m["train_time_s"] for m in metrics),
        "gen_busy_s": sum(x["end"] - x["start"] for x in spans if x["kind"] == "generate"),
        "unused": summary.get("unused_prompts", {}),
        "failures": summary.get("generation_failures", 0),
    }
    out["train_ms_per_token"] = 1e3 * out["train_s"] / max(out["trained_tokens"], 1)
    held = summary.get("held_out")
    if held:
        out["held_initial"] = held["initial"]["correctness_rate"]
        out["held_final"] = held["final"]["correctness_rate"]
    return out


def run_one(overrides: list[str], root: Path, tag: str, before_training: str = "start-up") -> Path:
    """One asp-train run in ``root / tag`` (the run directory it returns); logs its wall time
    and the time with ``before_training`` (what the run does before its first step) added.
    The other benchmarks of real runs import it."""
    from mindspeed_rl_asp.config.load import load_config, make_run_dir
    from mindspeed_rl_asp.runtime.driver import run_training

    cfg = load_config(overrides + [f"run_dir={root / tag}"])
    run_dir = make_run_dir(cfg, "bench")
    t0 = time.time()
    summary = run_training(cfg, run_dir)
    log(f"  {tag}: wall {summary['wall_time_s']:.1f} s, with {before_training} {time.time() - t0:.1f} s")
    return run_dir


# ---------------------------------------------------------------------- report
def fmt_s(x: float | None) -> str:
    return "not reached" if x is None else f"{x:.1f}"


def ratio(a: float | None, b: float | None, digits: int = 2) -> str:
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.{digits}f}x"


def agg(runs: list[dict], key: str) -> float | None:
    """Mean over repeats; None if any repeat lacks the value (e.g. threshold not reached)."""
    values = [r[key] for r in runs]
    return None if any(v is None for v in values) else mean(values)


def spread(runs: list[dict], key: str, fmt: str) -> str:
    values = [r[key] for r in runs]
    if any(v is None for v in values):
        reached = [v for v in values if v is not None]
        return f"{len(reached)}/{len(values)} reached" + (f" (mean {mean(reached):{fmt}})" if reached else "")
    text = format(mean(values), fmt)
    if len(values) > 1:
        text += f" ({format(min(values), fmt)}-{format(max(values), fmt)})"
    return text


def noise(results: dict[str, list[dict]]) -> tuple[float, float]:
    """Pooled standard deviation of the per-step prompt-adjusted reward around each run's
    mean, and of its rolling mean (consecutive rolling values overlap: not independent)."""
    step_dev, roll_dev = [], []
    for runs in results.values():
        for x in runs:
            m = mean(x["adjusted"])
            step_dev += [(v - m) ** 2 for v in x["adjusted"]]
            roll_dev += [(v - m) ** 2 for v in x["adj_curve"] if v is not None]
    return mean(step_dev) ** 0.5, mean(roll_dev) ** 0.5


def report(results: dict[str, list[dict]], args, gbs: int, n: int, by_size: dict[int, float], base_s: float) -> str:
    names = [name for name, _ in MODES]
    hyb = results["hybrid"]
    held = all("held_final" in r for runs in results.values() for r in runs)
    rows = []
    for name in names:
        runs = results[name]
        rows.append([
            f"`{name}`",
            spread(runs, "wall_s", ".1f"), spread(runs, "iteration_s", ".2f"), spread(runs, "tokens_per_s", ".0f"),
            spread(runs, "padding_bubble", ".3f"), spread(runs, "gen_idle", ".3f"),
            spread(runs, "trainer_idle", ".3f"), spread(runs, "policy_age", ".2f"),
            spread(runs, "train_ms_per_token", ".2f"), spread(runs, "gen_busy_s", ".1f"),
        ])
    perf = table(["mode", "wall s", "iteration s", "tokens/s", "padding bubble", "gen idle", "trainer idle",
                  "policy age", "train ms per trained token", "generation busy s (all actors)"], rows)
    rows = []
    for name in names:
        runs = results[name]
        rows.append([
            f"`{name}`",
            spread(runs, "reward_last_half", ".3f"),
            spread(runs, "raw_start", ".3f"), spread(runs, "ttr_raw", ".1f"),
            spread(runs, "adjusted_first_half", "+.3f") + " / " + spread(runs, "adjusted_last_half", "+.3f"),
            spread(runs, "ttr_adj", ".1f"),
            f"{mean(r['size_first_half'] for r in runs):.2f} / {mean(r['size_last_half'] for r in runs):.2f}",
        ] + ([spread(runs, "held_initial", ".3f") + " -> " + spread(runs, "held_final", ".3f")] if held else []))
    learn_headers = ["mode", "reward, last half", "first rolling reward (threshold - d)",
                     f"time to rolling reward +{args.delta:g} s", "prompt-adjusted reward, 1st / 2nd half",
                     f"time to prompt-adjusted +{args.delta:g} s", "mean maze size, 1st / 2nd half"]
    if held:
        learn_headers.append(f"held-out correctness, initial -> final ({args.eval_prompts} mazes)")
    learn = table(learn_headers, rows)
    rows = []
    for name in names:
        runs = results[name]
        rows.append([
            f"`{name}`",
            ratio(agg(runs, "wall_s"), agg(hyb, "wall_s")),
            ratio(agg(runs, "tokens_per_s"), agg(hyb, "tokens_per_s")),
            ratio(agg(hyb, "wall_s"), agg(runs, "wall_s")),
            ratio(agg(runs, "ttr_raw"), agg(hyb, "ttr_raw")),
            ratio(agg(runs, "ttr_adj"), agg(hyb, "ttr_adj")),
        ])
    ratios = table(["mode", "wall time", "tokens/s", "speed-up (hybrid wall / wall)",
                    f"time to rolling +{args.delta:g}", f"time to prompt-adjusted +{args.delta:g}"], rows)
    per_run = []
    for r in range(args.repeats):
        for name in names:
            x = results[name][r]
            per_run.append([f"`{name}`", args.seed + r, f"{x['wall_s']:.1f}", f"{x['iteration_s']:.2f}",
                            f"{x['tokens_per_s']:.0f}", f"{x['padding_bubble']:.3f}", f"{x['gen_idle']:.3f}",
                            f"{x['trainer_idle']:.3f}", f"{x['policy_age']:.2f}", f"{x['reward_last_half']:.3f}",
                            fmt_s(x["ttr_raw"]), f"{x['adjusted_last_half']:+.3f}", fmt_s(x["ttr_adj"]),
                            x["generated_tokens"], x["trained_tokens"],
                            x["unused"].get("queued", 0) + x["unused"].get("running", 0)]
                           + ([f"{x['held_initial']:.3f} -> {x['held_final']:.3f}"] if held else []))
    runs_table = table(["mode", "seed", "wall s", "iteration s", "tokens/s", "padding bubble", "gen idle",
                        "trainer idle", "policy age", "reward, last half", "time to rolling +d s",
                        "adjusted, last half", "time to adjusted +d s", "generated tokens", "trained tokens",
                        "prompts generated, not trained"] + (["held-out"] if held else []), per_run)
    step_sd, roll_sd = noise(results)
    sizes = ", ".join(f"{k}: {v:.2f}" for k, v in by_size.items())
    head = (f"Date: {time.strftime('%Y-%m-%d %H:%M')} (machine clock); command: `python benchmarks/bench_modes.py"
            f"{' --quick' if args.quick else ''} --steps {args.steps} --prompts {args.prompts} "
            f"--repeats {args.repeats}{f' --eval-prompts {args.eval_prompts}' if args.eval_prompts else ''}`"
            f"{' (re-read from kept run directories)' if args.reuse else ''}; "
            f"{os.cpu_count()} CPU cores (shared). Every run: `steps={args.steps} task.num_prompts={args.prompts} "
            f"eval.num_prompts={args.eval_prompts}`, layout `local`, global_batch_size {gbs} x {n} samples = "
            f"{gbs * n} samples per step, {args.steps * gbs * n} samples trained on per run; seeds "
            f"{args.seed}..{args.seed + args.repeats - 1}, modes interleaved. Figures: mean over repeats "
            f"(min-max in brackets when repeats > 1).\n\n"
            f"Thresholds (d = {args.delta:g}): *time to rolling reward +d* is the `elapsed_s` of the first step "
            f"whose rolling mean (window {WINDOW}) of `reward_mean` reaches that run's first rolling mean (steps "
            f"0-{WINDOW - 1}) + d; *time to prompt-adjusted +d*: the same for the rolling mean of `reward_mean` "
            f"minus the initial policy's mean reward on the step's prompts, threshold +d. Initial policy: "
            f"{args.baseline_samples} samples per training prompt ({base_s:.0f} s); its mean reward by maze "
            f"size: {sizes}. Noise: the per-step prompt-adjusted reward has a pooled standard deviation of "
            f"{step_sd:.3f} around its run's mean, its rolling mean {roll_sd:.3f}.")
    return "\n\n".join([head, "**Throughput and bubbles**", perf, "**Learning**", learn,
                        "**Ratios vs hybrid** (of the means; n/a when a repeat did not reach the threshold)",
                        ratios, "**Every run**", runs_table])


def plot(results: dict[str, list[dict]], path: Path, delta: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    styles = ["-", "--", ":", "-."]
    for name, runs in results.items():
        for r, x in enumerate(runs):
            color, ls = COLORS[name], styles[r % len(styles)]
            for ax, curve, key in ((axes[0], x["raw_curve"], "ttr_raw"), (axes[1], x["adj_curve"], "ttr_adj")):
                pts = [(t, v) for t, v in zip(x["times"], curve) if v is not None]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, color=color, linewidth=1.4,
                        label=f"{name}, repeat {r}")
                if x[key] is not None:
                    step = x[key + "_step"]
                    ax.plot([x["times"][step]], [curve[step]], "o", color=color, markersize=7)
            if x["raw_threshold"] is not None:
                axes[0].axhline(x["raw_threshold"], color=color, linestyle=ls, linewidth=0.7, alpha=0.6)
    axes[1].axhline(delta, color="black", linestyle="--", linewidth=0.8, label=f"threshold +{delta:g}")
    axes[1].axhline(0.0, color="grey", linewidth=0.6)
    axes[0].set_title(f"training reward_mean, rolling mean of {WINDOW} steps\n(thin lines: each run's threshold "
                      f"= its first rolling mean + {delta:g}; dot: first reached)", fontsize=10)
    axes[1].set_title(f"prompt-adjusted: reward_mean minus the initial policy's mean reward\non the step's "
                      f"prompts, rolling {WINDOW} (dot: first reached +{delta:g})", fontsize=10)
    for ax in axes:
        ax.set_xlabel("elapsed seconds (Control Unit loop; actor start-up excluded)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("reward")
    axes[1].legend(fontsize="x-small", loc="lower right", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small run for development (steps 8, 64 prompts)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (40; --quick 8)")
    ap.add_argument("--prompts", type=int, default=None, help="task.num_prompts (320; --quick 64)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="runs per mode (3; --quick 1), seeds --seed .. --seed + repeats - 1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-prompts", type=int, default=0, help="eval.num_prompts per run (0 skips it)")
    ap.add_argument("--delta", type=float, default=0.05, help="reward gain that counts as reached")
    ap.add_argument("--baseline-samples", type=int, default=None,
                    help="initial-policy samples per training prompt (8; --quick 2)")
    ap.add_argument("--plot", type=Path, default=None, help="write the reward curves to this PNG")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run directories under this folder")
    ap.add_argument("--reuse", type=Path, default=None,
                    help="no training: re-read the run directories a --keep run left in this folder")
    args = ap.parse_args(argv)
    args.steps = args.steps or (8 if args.quick else 40)
    args.prompts = args.prompts or (64 if args.quick else 320)
    args.baseline_samples = args.baseline_samples or (2 if args.quick else 8)
    args.repeats = args.repeats or (1 if args.quick else 3)

    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.tasks import make_task_prompts

    common = [f"steps={args.steps}", f"task.num_prompts={args.prompts}", f"eval.num_prompts={args.eval_prompts}",
              "eval.save_final_policy=false"]
    for name, extra in MODES:  # fail fast on a config that does not validate
        load_config(common + extra + [f"seed={args.seed}"])
    cfg0 = load_config(common + [f"seed={args.seed}"])
    gbs, n = cfg0.rl.global_batch_size, cfg0.rl.n_samples_per_prompt
    sizes = {p.id: p.size for p in make_task_prompts(cfg0.task)}

    log(f"initial-policy baseline: {args.prompts} prompts x {args.baseline_samples} samples")
    baseline, by_size, base_s = prompt_baseline(cfg0, args.baseline_samples)
    log(f"  mean reward per maze size {({k: round(v, 3) for k, v in by_size.items()})} in {base_s:.0f} s")

    results: dict[str, list[dict]] = {name: [] for name, _ in MODES}
    if args.reuse:
        for r in range(args.repeats):
            for name, _ in MODES:
                run_dir = args.reuse / f"{name}-seed{args.seed + r}"
                results[name].append(analyse(*read_run(run_dir), sizes, baseline, gbs, args.delta))
        return finish(results, args, gbs, n, by_size, base_s)

    root = args.keep if args.keep else Path(tempfile.mkdtemp(prefix="bench_modes-"))
    root.mkdir(parents=True, exist_ok=True)

    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        for r in range(args.repeats):
            seed = args.seed + r
            for name, extra in MODES:
                log(f"repeat {r + 1}/{args.repeats}, {name}, seed {seed}, load {os.getloadavg()[0]:.1f}")
                run_dir = run_one(common + extra + [f"seed={seed}"], root, f"{name}-seed{seed}")
                results[name].append(analyse(*read_run(run_dir), sizes, baseline, gbs, args.delta))
    finally:
        ray.shutdown()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.keep:
        log(f"run directories kept under {root}")
    return finish(results, args, gbs, n, by_size, base_s)


def finish(results: dict[str, list[dict]], args, gbs: int, n: int, by_size: dict[int, float], base_s: float) -> int:
    print(report(results, args, gbs, n, by_size, base_s))
    if args.plot:
        plot(results, args.plot, args.delta)
        log(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
