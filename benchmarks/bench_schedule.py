"""Scheduler benchmark: padding bubble, group balance and planning time per planner.

Not a test. Prints markdown tables (pasted into docs/scheduler.md):

    python benchmarks/bench_schedule.py [--maze-lengths FILE] [--n 4096] ...

Workloads (predicted == true lengths unless noted, i.e. an oracle predictor):
* ``lognormal``  lengths ~ LogNormal(mu=6, sigma=1) tokens (median 403, long right tail);
* ``mix``        85% LogNormal(log 300, 0.5) + 15% LogNormal(log 4000, 0.3): short
                 answers plus a block of long reasoning traces;
* ``maze``       ``--maze-lengths FILE``: JSONL lines ``{"id": ..., "length": ...}``
                 (``predicted_length`` is accepted too); skipped if not given.

Metrics per planner: padding bubble ``(padded - useful) / padded`` with
``padded = sum(size * max_len)`` on the plan's lengths; the same bubble measured
on the TRUE lengths when the plan is made from noisy predictions
(true * LogNormal(0, sigma), ``--noise-sigmas``); group load max/min,
coefficient of variation and largest adjacent ratio over the full groups
(``group_load_stats``, predicted loads); minibatch count and mean size.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mindspeed_rl_asp.schedule.ordering import balanced_groups, padded_decode_load  # noqa: E402
from mindspeed_rl_asp.schedule.partition import offsets, priced_partition  # noqa: E402
from mindspeed_rl_asp.schedule.plan import (  # noqa: E402
    PLANNERS,
    SchedulePlan,
    SchedulerParams,
    group_load_stats,
    make_plan,
    padding_stats,
    plan_asp_unpriced,
)

ABLATION = "asp-unpriced"
PLANNERS.setdefault(ABLATION, plan_asp_unpriced)  # this process only: asp without the minibatch price

def lognormal(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.lognormal(6.0, 1.0, n)


def mix(n: int, rng: np.random.Generator) -> np.ndarray:
    long = rng.random(n) < 0.15
    return np.where(long, rng.lognormal(np.log(4000), 0.3, n), rng.lognormal(np.log(300), 0.5, n))


def read_lengths(path: str) -> tuple[list[str], np.ndarray]:
    ids, lengths = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                ids.append(str(row["id"]))
                lengths.append(float(row.get("length", row.get("predicted_length"))))
    return ids, np.array(lengths)


def spread_cells(plan: SchedulePlan) -> str:
    s = group_load_stats(plan)
    return f"{s['max_over_min']:.2f} / {s['cv']:.3f} / {s['max_adjacent_ratio']:.2f}"


def quality_table(name: str, ids: list[str], lengths: np.ndarray, args, rng: np.random.Generator) -> None:
    truth = dict(zip(ids, lengths.tolist()))
    items = list(zip(ids, lengths.tolist()))
    noisy = {sigma: list(zip(ids, (lengths * rng.lognormal(0.0, sigma, len(lengths))).tolist()))
             for sigma in args.noise_sigmas}
    gs = args.group_sizes
    print(f"\n### {name}: N={len(ids)} prompts, base_batch_size={args.base}, "
          f"n_samples_per_prompt={args.n_samples}\n")
    print("| planner | slack | bubble (oracle) | " + " | ".join(f"bubble (pred σ={s})" for s in noisy)
          + " | minibatches | mean size | " + " | ".join(f"group_size={g}: max/min / CV / max adj" for g in gs) + " |")
    print("|---" * (5 + len(noisy) + len(gs)) + "|")
    print("| lower bound: zero padding, equal groups | - | 0.0000 | " + " | ".join("0.0000" for _ in noisy)
          + " | - | - | " + " | ".join("1.00 / 0.000 / 1.00" for _ in gs) + " |")
    runs = [("fifo", args.slacks[0]), ("sorted", args.slacks[0])]
    runs += [(planner, s) for planner in ("asp", ABLATION) for s in args.slacks]
    for planner, slack in runs:
        plans = [make_plan(items, SchedulerParams(planner, args.base, slack, g), args.n_samples) for g in gs]
        realised = [padding_stats(make_plan(its, SchedulerParams(planner, args.base, slack, gs[0]),
                                            args.n_samples), truth)["bubble_fraction"] for its in noisy.values()]
        p = plans[0]
        mean_size = sum(mb.size for mb in p.minibatches()) / p.num_minibatches
        label = {ABLATION: "asp without price (ablation)", "sorted": "sorted (best fixed size)"}.get(planner, planner)
        slack_cell = "-" if planner in ("fifo", "sorted") else str(slack)
        print(f"| {label} | {slack_cell} | {padding_stats(p)['bubble_fraction']:.4f} | "
              + " | ".join(f"{r:.4f}" for r in realised) + f" | {p.num_minibatches} | {mean_size:.2f} | "
              + " | ".join(spread_cells(q) for q in plans) + " |")


def best_of(fn, repeats: int) -> tuple[float, float]:
    """Best wall time (perf_counter) and best CPU time (process_time) over ``repeats`` runs."""
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return min(wall), min(cpu)


def timing_table(args) -> None:
    print(f"\n### asp planning time (lognormal lengths, base_batch_size={args.base}, group_size={args.group_sizes[0]}, "
          f"best of {args.repeats})\n")
    print("| prompts | slack | sort + partition + ordering: wall / CPU [s] "
          "| make_plan end to end: wall / CPU [s] | minibatches |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(args.seed)
    for n in args.timing_sizes:
        lengths = lognormal(n, rng)
        items = [(f"p{i}", v) for i, v in enumerate(lengths.tolist())]
        for slack in args.slacks:
            count = []

            def core():
                order = np.argsort(lengths, kind="stable")
                ordered = lengths[order]

                def cost(s, m):
                    return padded_decode_load(s, m, args.n_samples)

                sizes, _ = priced_partition(ordered, args.base, slack, cost)
                balanced_groups(cost(sizes, ordered[offsets(sizes)[1:] - 1]), args.group_sizes[0])
                count.append(len(sizes))

            params = SchedulerParams("asp", args.base, slack, args.group_sizes[0])
            core_wall, core_cpu = best_of(core, args.repeats)
            full_wall, full_cpu = best_of(lambda: make_plan(items, params, args.n_samples), args.repeats)
            print(f"| {n:,} | {slack} | {core_wall:.2f} / {core_cpu:.2f} | {full_wall:.2f} / {full_cpu:.2f} "
                  f"| {count[-1]:,} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4096, help="prompts per synthetic workload")
    ap.add_argument("--base", type=int, default=8, help="base_batch_size (prompts)")
    ap.add_argument("--slacks", type=int, nargs="+", default=[2, 4], help="slack values for asp")
    ap.add_argument("--group-sizes", type=int, nargs="+", default=[4, 8], help="minibatches per dispatch group")
    ap.add_argument("--n-samples", type=int, default=8, help="n_samples_per_prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--noise-sigmas", type=float, nargs="*", default=[0.25, 0.5],
                    help="plan from true * LogNormal(0, sigma) predictions, measure on true lengths")
    ap.add_argument("--maze-lengths", help="JSONL of {id, length}; adds a maze workload")
    ap.add_argument("--timing-sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    print("## Scheduler benchmark\n")
    print(f"`python benchmarks/bench_schedule.py {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip())
    for name, gen in (("lognormal", lognormal), ("mix", mix)):
        lengths = gen(args.n, rng)
        quality_table(name, [f"p{i}" for i in range(args.n)], lengths, args, rng)
    if args.maze_lengths:
        ids, lengths = read_lengths(args.maze_lengths)
        quality_table(f"maze ({Path(args.maze_lengths).name})", ids, lengths, args, rng)
    if args.timing_sizes:
        timing_table(args)


if __name__ == "__main__":
    main()
