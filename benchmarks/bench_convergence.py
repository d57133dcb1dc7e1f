"""Convergence under bounded staleness: hybrid (every sample on-policy) against async ASP
at ``mode.max_staleness=3``, same sample budget, several seeds. Not a test.

Prints markdown tables (pasted into docs/benchmarks.md, "Convergence under bounded
staleness")::

    HF_HUB_OFFLINE=1 python benchmarks/bench_convergence.py --seeds 0,1,2 --eval-prompts 64 --eval-samples 2 \
        --keep runs/bench_convergence --plot runs/bench_convergence.png
        # ~25 min on a quiet 2-core machine (extrapolated from --quick); 41 min measured at load 2 to 14
    HF_HUB_OFFLINE=1 python benchmarks/bench_convergence.py --quick     # ~3 min, for development
    HF_HUB_OFFLINE=1 python benchmarks/bench_convergence.py --reuse runs/bench_convergence --seeds 0,1,2   # re-read

The two modes, with the same seeds, the same prompts and the same sample budget (``steps``
x ``rl.global_batch_size`` prompts x ``rl.n_samples_per_prompt`` samples trained on; by
default the main job's 64 steps over ``task.num_prompts=64``, 8 epochs):

* ``hybrid``: ``mode=hybrid scheduler=fifo scheduler.slack=0``: colocated and
  synchronous, policy age 0 for every sample;
* ``async-s3``: ``mode=async scheduler=asp mode.max_staleness=3
  mode.queue_capacity=128``: the full system with samples up to 3 versions old
  (``algo.off_policy=tis`` corrects them, as in the default config).

**Why the larger queue.** Dispatch at trainer step ``s`` may reach ``min((eta + s + 1) x B,
s x B + queue_capacity // n)`` prompts (``control/staleness.first_window_gap``; eta = max
staleness, B = ``rl.global_batch_size``, n = samples per prompt). With the default
``queue_capacity=64`` that is ``8 s + 16`` for every eta >= 1: the queue, not the
staleness bound, sets how far generation runs ahead, and eta=3 would run exactly like
eta=1 or 2. ``--queue-capacity`` (default ``(eta + 1) x B x n`` = 128) makes the two
bounds equal, so that the staleness bound is the one that binds. Before training, every
mode's config is validated and its plan is built and checked by the control core exactly
as ``asp-train --dry-run`` does (a plan the rules cannot run is refused there).

Per run (``runtime.driver.run_training``; ``metrics.jsonl`` and ``summary.json``):

* training correctness and integrity per epoch: sums over the samples each step trained
  on (``epoch_correctness``, ``epoch_integrity``), so a step that straddles two epochs
  counts where its samples belong. Every epoch replays the same prompts, so the epochs
  are comparable; in ``async-s3`` a sample is scored as the (possibly stale) policy that
  generated it wrote it;
* the policy age of the trained samples: mean and histogram (``policy_age_hist``, in prompt
  groups), wall time (the Control Unit's loop) and the run's time with actor start-up
  and the final check;
* the driver's final check: initial vs final policy, same sampling seeds, paired by
  prompt, on the first ``--eval-prompts`` training prompts and on as many held-out mazes.

Across seeds: mean with a 95 % t interval (``t(0.975, k - 1) x sd / sqrt(k)`` for k
seeds); the difference async - hybrid with Welch's interval. One local Ray cluster for the
whole process (``ray.init`` once, ``ray.shutdown`` at the end); the modes run interleaved
per seed (hybrid, async, hybrid, async, ...) so that load from other jobs hits both alike.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench_modes import log, mean, read_run, run_one, table  # noqa: E402

HYBRID = ("hybrid", ["mode=hybrid", "scheduler=fifo", "scheduler.slack=0"])
COLORS = {"hybrid": "#C44E52", "async": "#55A868"}

# t(0.975, df) for df = 1..30; beyond that 1.96 is within 2 %.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]


def t975(df: float) -> float:
    """Two-sided 95 % t quantile; a fractional df is rounded down (a wider interval)."""
    k = int(math.floor(df))
    return float("nan") if k < 1 else T975[k - 1] if k <= len(T975) else 1.96


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t interval (nan for a single value)."""
    k = len(values)
    m = mean(values)
    if k < 2:
        return m, float("nan")
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (k - 1))
    return m, t975(k - 1) * sd / math.sqrt(k)


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
    """mean(a) - mean(b) and the half-width of Welch's 95 % interval."""
    if len(a) < 2 or len(b) < 2:
        return mean(a) - mean(b), float("nan")
    va = sum((x - mean(a)) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - mean(b)) ** 2 for x in b) / (len(b) - 1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return mean(a) - mean(b), 0.0
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return mean(a) - mean(b), t975(df) * se


def cell(m: float, half: float, fmt: str = ".3f") -> str:
    if math.isnan(half):
        return format(m, fmt)
    return f"{format(m, fmt)} ± {format(half, fmt.lstrip('+'))}"


# ---------------------------------------------------------------------- one run
def analyse(run_dir: Path, run_s: float | None) -> dict:
    from mindspeed_rl_asp.metrics.report import epoch_means, is_complete

    metrics, summary, _ = read_run(run_dir)
    out: dict = {"run_dir": str(run_dir), "steps": len(metrics), "wall_s": summary["wall_time_s"], "run_s": run_s}
    for key in ("correctness", "integrity"):
        by_epoch = epoch_means(metrics, f"epoch_{key}")
        if not by_epoch:
            raise SystemExit(f"{run_dir}: metrics.jsonl has no epoch_{key}; the run predates that metric")
        out[key] = [m for (_, m, _), whole in zip(by_epoch, is_complete(by_epoch)) if whole]
        out[f"{key}_samples"] = [n for _, _, n in by_epoch]
    ages: dict[int, int] = {}
    for m in metrics:
        for k, v in m["policy_age_hist"].items():
            ages[int(k)] = ages.get(int(k), 0) + v
    out["age_hist"] = dict(sorted(ages.items()))
    out["age_mean"] = sum(k * v for k, v in ages.items()) / sum(ages.values())
    out["age_max"] = max(ages)
    for key in ("training_prompts", "held_out"):
        if key in summary:
            out[key] = summary[key]["change"]["correctness"]
    out["unused"] = sum(summary.get("unused_prompts", {}).get(k, 0) for k in ("queued", "running"))
    return out


def check_plans(modes: list[tuple[str, list[str]]]) -> dict[str, str]:
    """Validate each mode's config and build its plan and control core like ``asp-train
    --dry-run`` (refuses a plan the staleness and queue rules cannot run)."""
    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.config.placement import plan_placement
    from mindspeed_rl_asp.schedule.planning import make_control_core, plan_run
    from mindspeed_rl_asp.tasks import make_task_prompts
    from omegaconf import OmegaConf

    described = {}
    for name, overrides in modes:
        cfg = load_config(overrides)
        placement = plan_placement(OmegaConf.to_object(cfg.layout), cfg.mode.name)
        plan, epochs, minibatches = plan_run(cfg, make_task_prompts(cfg.task))
        make_control_core(cfg, minibatches, len(placement.generators))
        b, n = cfg.rl.global_batch_size, cfg.rl.n_samples_per_prompt
        eta, cap = cfg.mode.max_staleness, cfg.mode.queue_capacity // n
        binds = ("none (synchronous)" if eta == 0 else "staleness" if (eta + 1) * b <= cap else "queue capacity")
        described[name] = (f"plan {plan.planner}, {len(minibatches)} minibatches over {epochs} epoch(s), "
                           f"{len(placement.generators)} generation actor(s), max_staleness {eta}, "
                           f"queue {cfg.mode.queue_capacity} samples; dispatch look-ahead bound: {binds}")
    return described


# ---------------------------------------------------------------------- report
def report(results: dict[str, list[dict]], names: list[str], args, described: dict[str, str], head: str) -> str:
    hyb, asy = (results[n] for n in names)
    epochs = min(len(r["correctness"]) for runs in results.values() for r in runs)
    parts = [head]

    rows = []
    for e in range(epochs):
        row = [e]
        for key in ("correctness", "integrity"):
            a_vals = [r[key][e] for r in asy]
            h_vals = [r[key][e] for r in hyb]
            row += [cell(*interval(h_vals)), cell(*interval(a_vals)), cell(*welch(a_vals, h_vals), "+.3f")]
        rows.append(row)
    late = list(range(epochs // 2, epochs))
    for label, idx in ((f"epochs {late[0]}-{late[-1]} (mean)", late), (f"all {epochs} epochs (mean)", range(epochs))):
        row = [label]
        for key in ("correctness", "integrity"):
            a_vals = [mean(r[key][e] for e in idx) for r in asy]
            h_vals = [mean(r[key][e] for e in idx) for r in hyb]
            row += [cell(*interval(h_vals)), cell(*interval(a_vals)), cell(*welch(a_vals, h_vals), "+.3f")]
        rows.append(row)
    row = [f"gain: epoch {epochs - 1} - epoch 0"]
    for key in ("correctness", "integrity"):
        a_vals = [r[key][-1] - r[key][0] for r in asy]
        h_vals = [r[key][-1] - r[key][0] for r in hyb]
        row += [cell(*interval(h_vals), "+.3f"), cell(*interval(a_vals), "+.3f"), cell(*welch(a_vals, h_vals), "+.3f")]
    rows.append(row)
    parts += ["**Training correctness and integrity per epoch** (on the samples trained on; mean ± 95 % "
              f"half-width over {len(hyb)} seeds; difference = {names[1]} - {names[0]}, Welch)",
              table(["epoch", f"correctness `{names[0]}`", f"correctness `{names[1]}`", "difference",
                     f"integrity `{names[0]}`", f"integrity `{names[1]}`", "difference"], rows)]

    rows = []
    for name in names:
        runs = results[name]
        pooled: dict[int, int] = {}
        for r in runs:
            for k, v in r["age_hist"].items():
                pooled[k] = pooled.get(k, 0) + v
        total = sum(pooled.values())
        hist = ", ".join(f"{k}: {v / total:.3f}" for k, v in sorted(pooled.items()))
        wall = interval([r["wall_s"] for r in runs])
        run_s = [r["run_s"] for r in runs if r["run_s"] is not None]
        rows.append([f"`{name}`", cell(*interval([r["age_mean"] for r in runs]), ".2f"), hist,
                     max(r["age_max"] for r in runs), cell(*wall, ".1f"),
                     f"{mean(hyb_r['wall_s'] for hyb_r in hyb) / wall[0]:.2f}x",
                     cell(*interval(run_s), ".0f") if run_s else "-"])
    parts += ["**Policy age and time** (policy age of the trained samples: mean over seeds ± 95 %, histogram "
              "pooled over seeds as shares of prompt groups; wall = the Control Unit's loop; run = with actor "
              "start-up and the final check)",
              table(["mode", "policy age, mean", "policy age histogram", "max age", "wall s", "speed-up vs hybrid",
                     "run s"], rows)]

    if all("training_prompts" in r for runs in results.values() for r in runs):
        rows = []
        for key, title in (("training_prompts", "training prompts"), ("held_out", "held-out mazes")):
            h_vals = [r[key]["change"] for r in hyb]
            a_vals = [r[key]["change"] for r in asy]
            prompts = hyb[0][key]["prompts"]
            rows.append([f"{title} ({prompts})", f"{mean(r[key]['before'] for r in hyb):.3f}",
                         cell(*interval(h_vals), "+.3f"), cell(*interval(a_vals), "+.3f"),
                         cell(*welch(a_vals, h_vals), "+.3f")])
        parts += ["**Final check: correctness change, initial -> final policy** (each run: paired by prompt, "
                  f"{args.eval_samples} samples per prompt, same sampling seeds; here the mean of the runs' changes "
                  "± 95 % over seeds)",
                  table(["prompt set", "initial correctness", f"change `{names[0]}`", f"change `{names[1]}`",
                         "difference"], rows)]

    rows = []
    for seed_index in range(len(hyb)):
        for name in names:
            r = results[name][seed_index]
            change = []
            for key in ("training_prompts", "held_out"):
                if key in r:
                    c = r[key]
                    change.append(f"{c['change']:+.3f} ({c['ci95'][0]:+.3f}..{c['ci95'][1]:+.3f})")
                else:
                    change.append("-")
            rows.append([f"`{name}`", args.seed_list[seed_index], f"{r['wall_s']:.1f}", f"{r['age_mean']:.2f}",
                         " ".join(f"{k}:{v}" for k, v in r["age_hist"].items()),
                         " ".join(f"{v:.3f}" for v in r["correctness"]),
                         " ".join(f"{v:.3f}" for v in r["integrity"]), *change, r["unused"]])
    parts += ["**Every run**",
              table(["mode", "seed", "wall s", "age mean", "age histogram (prompt groups)", "correctness per epoch",
                     "integrity per epoch", "training prompts: change (95 % CI)", "held-out: change (95 % CI)",
                     "prompts generated, not trained"], rows)]
    return "\n\n".join(parts)


def plot(results: dict[str, list[dict]], names: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), gridspec_kw={"width_ratios": [1, 1, 0.7]})
    for name in names:
        runs = results[name]
        color = COLORS["hybrid" if name == "hybrid" else "async"]
        epochs = min(len(r["correctness"]) for r in runs)
        xs = list(range(epochs))
        for ax, key in ((axes[0], "correctness"), (axes[1], "integrity")):
            stats = [interval([r[key][e] for r in runs]) for e in xs]
            m = [s[0] for s in stats]
            h = [0.0 if math.isnan(s[1]) else s[1] for s in stats]
            for r in runs:
                ax.plot(xs, r[key][:epochs], color=color, linewidth=0.6, alpha=0.35)
            ax.plot(xs, m, "o-", color=color, linewidth=1.8, markersize=4, label=f"{name} (mean of {len(runs)})")
            ax.fill_between(xs, [a - b for a, b in zip(m, h)], [a + b for a, b in zip(m, h)], color=color,
                            alpha=0.18, linewidth=0)
        pooled: dict[int, int] = {}
        for r in runs:
            for k, v in r["age_hist"].items():
                pooled[k] = pooled.get(k, 0) + v
        total = sum(pooled.values())
        offset = -0.2 if name == names[0] else 0.2
        axes[2].bar([k + offset for k in pooled], [v / total for v in pooled.values()], width=0.4, color=color,
                    label=name)
    for ax, key in ((axes[0], "correctness"), (axes[1], "integrity")):
        ax.set_xticks(range(min(len(r["correctness"]) for runs in results.values() for r in runs)))
        ax.set_xlabel("epoch (same prompts every epoch)")
        ax.set_title(f"training {key} per epoch\n(band: 95 % t interval over seeds; thin: each seed)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="lower right")
    axes[2].set_xlabel("policy age (versions)")
    axes[2].set_ylabel("share of trained samples")
    axes[2].set_title("policy age, pooled over seeds", fontsize=10)
    axes[2].legend(fontsize="small")
    axes[2].grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small run for development (16 steps, 32 prompts, "
                    "eval 16, seed 0)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (64; --quick 16)")
    ap.add_argument("--prompts", type=int, default=None, help="task.num_prompts (64; --quick 32)")
    ap.add_argument("--seeds", default=None, help="comma-separated run seeds (0,1,2; --quick 0)")
    ap.add_argument("--staleness", type=int, default=3, help="mode.max_staleness of the async run")
    ap.add_argument("--queue-capacity", type=int, default=None,
                    help="mode.queue_capacity of the async run in samples (default (staleness + 1) x "
                         "global_batch_size x n_samples_per_prompt)")
    ap.add_argument("--eval-prompts", type=int, default=None, help="eval.num_prompts (64; --quick 16; 0 skips)")
    ap.add_argument("--eval-samples", type=int, default=4, help="eval.samples_per_prompt")
    ap.add_argument("--plot", type=Path, default=None, help="write the per-epoch curves to this PNG")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run directories under this folder")
    ap.add_argument("--reuse", type=Path, default=None,
                    help="no training: re-read the run directories a --keep run left in this folder")
    args = ap.parse_args(argv)
    args.steps = args.steps or (16 if args.quick else 64)
    args.prompts = args.prompts or (32 if args.quick else 64)
    args.eval_prompts = args.eval_prompts if args.eval_prompts is not None else (16 if args.quick else 64)
    args.seed_list = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]

    from mindspeed_rl_asp.config.load import load_config

    common = [f"steps={args.steps}", f"task.num_prompts={args.prompts}", f"eval.num_prompts={args.eval_prompts}",
              f"eval.samples_per_prompt={args.eval_samples}", "eval.save_final_policy=false"]
    cfg0 = load_config(common)
    b, n = cfg0.rl.global_batch_size, cfg0.rl.n_samples_per_prompt
    capacity = args.queue_capacity or (args.staleness + 1) * b * n
    async_name = f"async-s{args.staleness}"
    modes = [HYBRID, (async_name, ["mode=async", "scheduler=asp", f"mode.max_staleness={args.staleness}",
                                   f"mode.queue_capacity={capacity}"])]
    names = [name for name, _ in modes]
    described = check_plans([(name, common + extra) for name, extra in modes])
    for name in names:
        log(f"{name}: {described[name]}")

    results: dict[str, list[dict]] = {name: [] for name in names}
    started = time.strftime("%Y-%m-%d %H:%M")
    t_all = time.time()
    if args.reuse:
        for seed in args.seed_list:
            for name in names:
                results[name].append(analyse(args.reuse / f"{name}-seed{seed}", None))
    else:
        root = args.keep if args.keep else Path(tempfile.mkdtemp(prefix="bench_convergence-"))
        root.mkdir(parents=True, exist_ok=True)
        import ray

        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            for i, seed in enumerate(args.seed_list):
                for name, extra in modes:
                    log(f"seed {seed} ({i + 1}/{len(args.seed_list)}), {name}, load {os.getloadavg()[0]:.1f}")
                    t0 = time.time()
                    run_dir = run_one(common + extra + [f"seed={seed}"], root, f"{name}-seed{seed}")
                    results[name].append(analyse(run_dir, time.time() - t0))
                    r = results[name][-1]
                    log(f"  age {r['age_mean']:.2f} {r['age_hist']}, correctness per epoch "
                        + " ".join(f"{v:.3f}" for v in r["correctness"]))
        finally:
            ray.shutdown()
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
        if args.keep:
            log(f"run directories kept under {root}")

    mode_lines = "; ".join(f"`{name}`: `{' '.join(extra)}` ({described[name]})" for name, extra in modes)
    command = ("python benchmarks/bench_convergence.py" + (" --quick" if args.quick else "")
               + f" --steps {args.steps} --prompts {args.prompts} --seeds {','.join(map(str, args.seed_list))} "
               f"--staleness {args.staleness} --queue-capacity {capacity} --eval-prompts {args.eval_prompts} "
               f"--eval-samples {args.eval_samples}" + (f" --reuse {args.reuse}" if args.reuse else ""))
    head = (f"Date: {started} (machine clock){'' if args.reuse else f', {time.time() - t_all:.0f} s in all'}; "
            f"command: `{command}`; {os.cpu_count()} CPU cores (shared). Every run: `{' '.join(common)}`, "
            f"layout `local`, {b} prompts x {n} samples = {b * n} samples per step, {args.steps * b * n} samples "
            f"trained on per run ({args.steps * b // args.prompts} epochs over the same {args.prompts} prompts); "
            f"seeds {','.join(map(str, args.seed_list))}, modes interleaved per seed. Modes: {mode_lines}.")
    print(report(results, names, args, described, head))
    if args.plot:
        plot(results, names, args.plot)
        log(f"wrote {args.plot} ({args.plot.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
