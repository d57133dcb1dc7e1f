"""Effective tokens/s with and without DAPO's dynamic sampling (``algo.filter_groups``).

Not a test. Three real ``asp-train`` runs on the tiny maze task, same seed, prompts and
steps: ``algo.filter_groups=none``, ``std`` on the accuracy reward (``acc``, DAPO's default
metric) and ``std`` on the total reward (``algo.filter_groups_metric=reward``: exactly the
groups whose advantages are not all 0). The tiny policy solves some small mazes
every time and fails the bigger ones every time, so many groups are all-correct or
all-wrong: their advantages are all 0 and they train nothing. Per run::

    effective tokens/s = response tokens of the trained samples whose group's rewards have
                         a spread (``informative_response_tokens``, metrics.jsonl)
                         / the run's wall time (summary.json ``wall_time_s``)

and beside it every generated token per second (rejected groups' generation included),
the share of trained groups that carry a signal, and what filtering rejected. Prints a
markdown table (pasted into docs/benchmarks.md)::

    HF_HUB_OFFLINE=1 python benchmarks/bench_filter_groups.py --steps 6 --keep runs/bench_filter_groups
    HF_HUB_OFFLINE=1 python benchmarks/bench_filter_groups.py --reuse runs/bench_filter_groups   # re-read

Further arguments are config overrides for every run (e.g. ``rl.n_samples_per_prompt=8``).

``--sim EXPERIMENT [...]``: the same comparison on the simulator instead (``asp-simulate``:
the real core and planner on a virtual cluster, simulated rewards, ``sim/rewards.py``),
for each named experiment, e.g. the Table 3 presets; effective tokens/s per run there::

    python benchmarks/bench_filter_groups.py --sim table3_qwen3_30b_a3b_asp table3_qwen3_30b_a3b_hybrid \
        --steps 8 task.num_prompts=256
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_modes import run_one  # noqa: E402  (the runner every real-run benchmark shares)

BASE = ["task.num_prompts=16", "rl.global_batch_size=4", "rl.mini_batch_size=4", "rl.n_samples_per_prompt=4",
        "rl.micro_batch_size=8", "generate.sampling_config.max_tokens=64", "scheduler.base_batch_size=2",
        "scheduler.group_size=2", "mode.queue_capacity=48", "eval.num_prompts=0", "scheduler=asp", "mode=async"]
# std filters on the accuracy reward (DAPO's and MindSpeed-RL's default metric, acc), or on
# the total reward, which is what makes a group's advantages nonzero (the effective tokens).
RUNS = [("none", ["algo.filter_groups=none"]), ("std-acc", ["algo.filter_groups=std"]),
        ("std-reward", ["algo.filter_groups=std", "algo.filter_groups_metric=reward"])]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def figures(run_dir: Path) -> dict:
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    wall = summary["wall_time_s"]
    generated = sum(s["info"]["tokens"] for s in read_jsonl(run_dir / "timeline.jsonl") if s["kind"] == "generate")
    effective = sum(m["informative_response_tokens"] for m in metrics)
    trained_groups = len(summary["consumed_prompt_ids"])
    ds = summary.get("dynamic_sampling", {})
    return {"steps": summary["steps"], "wall_s": wall, "effective_tokens": effective,
            "effective_tokens_per_s": effective / wall, "generated_tokens_per_s": generated / wall,
            "trained_tokens": sum(m["response_tokens"] for m in metrics),
            "informative_share": sum(m["informative_groups"] for m in metrics) / trained_groups,
            "rejected_groups": ds.get("rejected_groups", 0), "extra_minibatches": ds.get("extra_minibatches", 0),
            "correctness": sum(m["correctness_rate"] for m in metrics) / len(metrics)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--keep", type=Path, help="keep the run directories here")
    parser.add_argument("--reuse", type=Path, help="re-read the runs kept in this directory")
    parser.add_argument("--sim", nargs="+", metavar="EXPERIMENT", help="simulate these experiments instead")
    args, overrides = parser.parse_known_args()
    if args.sim:
        simulated(args.sim, args.steps, overrides)
        return
    root = args.reuse or args.keep or Path(tempfile.mkdtemp(prefix="bench_filter_groups_"))
    rows = []
    for tag, extra in RUNS:
        run_dir = root / tag
        if args.reuse is None:
            run_dir = run_one([*BASE, f"steps={args.steps}", *extra, *overrides], root, tag)
        rows.append((tag, figures(run_dir)))
    print("| run | steps | wall s | effective tokens/s | generated tokens/s | trained groups with a signal "
          "| rejected groups | extra minibatches | correctness |")
    print("|---|---|---|---|---|---|---|---|---|")
    for tag, f in rows:
        print(f"| {tag} | {f['steps']} | {f['wall_s']:.1f} | {f['effective_tokens_per_s']:.1f} | "
              f"{f['generated_tokens_per_s']:.1f} | {f['informative_share']:.0%} | {f['rejected_groups']} | "
              f"{f['extra_minibatches']} | {f['correctness']:.3f} |")
    base = rows[0][1]
    for tag, f in rows[1:]:
        print(f"\neffective tokens/s, {tag} / none: {f['effective_tokens_per_s'] / base['effective_tokens_per_s']:.2f}x "
              f"(effective tokens per step: {f['effective_tokens'] / f['steps']:.0f} vs "
              f"{base['effective_tokens'] / base['steps']:.0f})")


def simulated(experiments: list[str], steps: int, overrides: list[str]) -> None:
    """The comparison on the simulator: effective tokens/s = response tokens trained in
    groups whose simulated rewards have a spread / the simulated run's time."""
    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.sim.run import simulate

    print("| experiment | filter_groups | iteration s | effective tokens/s | generated tokens/s "
          "| rejected groups | extra minibatches |")
    print("|---|---|---|---|---|---|---|")
    for experiment in experiments:
        base = None
        for rule in ("none", "std"):
            cfg = load_config([f"experiment={experiment}", f"steps={steps}", *overrides, f"algo.filter_groups={rule}"],
                              local_install=False)
            r = simulate(cfg)
            d = r.dynamic_sampling
            base = base or d["effective_tokens_per_s"]
            print(f"| {experiment} | {rule} | {r.iteration_s:.1f} | {d['effective_tokens_per_s']:.0f} "
                  f"({d['effective_tokens_per_s'] / base:.2f}x) | {r.tokens / r.total_s:.0f} | {d['rejected_groups']} "
                  f"| {d['extra_minibatches']} |")


if __name__ == "__main__":
    main()
