"""Simulator speed: the wall time of simulated paper-scale runs against the targets.

Not a test. Prints a markdown table (pasted into docs/benchmarks.md, "Simulator speed"):

    HF_HUB_OFFLINE=1 python benchmarks/bench_sim.py                 # 5 repeats, ~30 s on 2 cores
    HF_HUB_OFFLINE=1 python benchmarks/bench_sim.py --repeats 3 --profile

For each table3 experiment (Qwen3-30B-A3B and Qwen3-32B; asp, async_fifo, hybrid) the
config is composed once (timed apart: ``load_config``), then ``sim.run.simulate`` runs
end to end as ``asp-simulate`` runs it (workload draw, the real planner over the 960
prompts, the real control core on the virtual clock) with ``steps=1`` and with the
preset's ``steps=30``. Each figure is the median of ``--repeats`` runs, interleaved so
that load from other processes on a shared machine spreads over all of them; CPU time
(``time.process_time``) is given beside the wall time, as it is the steadier of the two.
"per extra iteration" is ``(t30 - t1) / 29``: what one more step costs once the fixed
part (workload, plan) is paid.

Targets: under 1 s per paper-scale iteration (the ``steps=1`` run, fixed part included),
under 10 s per 30-iteration run. Where one is missed, or with ``--profile``, the cProfile
top entries of the slowest 30-iteration run say where the time goes.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

EXPERIMENTS = [f"table3_{model}_{system}" for model in ("qwen3_30b_a3b", "qwen3_32b")
               for system in ("asp", "async_fifo", "hybrid")]
ITERATION_TARGET_S = 1.0
RUN_TARGET_S = 10.0
RUN_STEPS = 30


def timed(fn):
    """(wall seconds, CPU seconds, result) of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def with_steps(cfg, steps: int):
    from omegaconf import OmegaConf

    return OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"steps={steps}"]))


def measure(configs: dict, repeats: int) -> dict:
    """experiment -> {steps: [(wall, cpu), ...]}, repeats interleaved over experiments."""
    from mindspeed_rl_asp.sim.run import simulate

    runs = {name: {1: [], RUN_STEPS: []} for name in configs}
    for _ in range(repeats):
        for name, cfg in configs.items():
            for steps in (1, RUN_STEPS):
                wall, cpu, result = timed(lambda: simulate(cfg[steps]))
                if result.steps != steps:
                    raise RuntimeError(f"{name}: asked for {steps} steps, the run made {result.steps}")
                runs[name][steps].append((wall, cpu))
    return runs


def median(pairs, index: int) -> float:
    return statistics.median(p[index] for p in pairs)


def table(configs: dict, runs: dict, compose_s: dict) -> tuple[str, list[str]]:
    """The markdown table and the experiments that miss a target."""
    lines = ["| experiment | mode | scheduler | compose s | 1 iteration s (CPU) | 30 iterations s (CPU) | "
             "per extra iteration s (CPU) | targets |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    missed = []
    for name, cfg in configs.items():
        one, full = runs[name][1], runs[name][RUN_STEPS]
        t1, t30 = median(one, 0), median(full, 0)
        extra_cpu = (median(full, 1) - median(one, 1)) / (RUN_STEPS - 1)
        ok = t1 < ITERATION_TARGET_S and t30 < RUN_TARGET_S
        if not ok:
            missed.append(name)
        lines.append(f"| {name} | {cfg[1].mode.name} | {cfg[1].scheduler.name} | {compose_s[name]:.2f} | "
                     f"{t1:.3f} ({median(one, 1):.3f}) | {t30:.3f} ({median(full, 1):.3f}) | "
                     f"{(t30 - t1) / (RUN_STEPS - 1):.4f} ({extra_cpu:.4f}) | {'met' if ok else 'MISSED'} |")
    return "\n".join(lines), missed


def profile(cfg, top: int) -> str:
    from mindspeed_rl_asp.sim.run import simulate

    profiler = cProfile.Profile()
    profiler.runcall(simulate, cfg)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    # Keep the table, drop the header lines pstats writes before it, and show paths
    # relative to the checkout so the output names no machine's directories.
    text = out.getvalue()
    text = text[text.index("   ncalls"):] if "   ncalls" in text else text
    root = str(Path(__file__).resolve().parents[1]) + os.sep
    return text.replace(root, "").replace(sys.prefix + os.sep, "").rstrip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (the median is shown)")
    parser.add_argument("--profile", action="store_true", help="profile the slowest run even if targets are met")
    parser.add_argument("--top", type=int, default=12, help="cProfile entries to show")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give at least 1")

    from mindspeed_rl_asp.config.load import load_config

    configs, compose_s = {}, {}
    for name in EXPERIMENTS:
        wall, _, cfg = timed(lambda: load_config([f"experiment={name}"]))
        compose_s[name] = wall
        if cfg.steps != RUN_STEPS:
            raise SystemExit(f"experiment={name} has steps={cfg.steps}; this benchmark times {RUN_STEPS}-step runs")
        configs[name] = {1: with_steps(cfg, 1), RUN_STEPS: cfg}
    print(f"simulator speed: median of {args.repeats} runs each; targets: 1 iteration < {ITERATION_TARGET_S:g} s, "
          f"{RUN_STEPS} iterations < {RUN_TARGET_S:g} s (wall; CPU in brackets)", file=sys.stderr)
    runs = measure(configs, args.repeats)
    text, missed = table(configs, runs, compose_s)
    print(text)
    print()
    if missed:
        print(f"targets missed by: {', '.join(missed)}")
    else:
        print("every target met")
    if missed or args.profile:
        slowest = max(configs, key=lambda n: median(runs[n][RUN_STEPS], 0))
        print(f"\nwhere the time goes: cProfile of {slowest} (steps={RUN_STEPS}), top {args.top} by own time\n")
        print("```")
        print(profile(configs[slowest][RUN_STEPS], args.top))
        print("```")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
