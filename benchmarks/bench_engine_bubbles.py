"""Bubbles per engine: async fifo vs asp on engine=hf (static batching) and engine=vllm
(continuous batching), on the same prompts. Not a test. Prints one markdown table
(pasted into docs/benchmarks.md, "Bubbles per engine"):

    HF_HUB_OFFLINE=1 python benchmarks/bench_engine_bubbles.py            # 4 runs, 12 steps each
    HF_HUB_OFFLINE=1 python benchmarks/bench_engine_bubbles.py --engines hf --steps 4   # quick

Every run: ``mode=async steps=12 task.num_prompts=96 eval.num_prompts=0`` (12 steps x 8
prompts x 4 samples, each prompt trained on once), seed 0, layout ``local``; fifo is
``scheduler=fifo scheduler.slack=0``, asp ``scheduler=asp``. ``--vllm-max-num-seqs N``
sets ``engine.max_num_seqs`` of the vllm runs (default: the engine file's, 64, more than
a minibatch's rows, so every row fits at once). Runs go one at a time, one local Ray
cluster for the process (``ray.shutdown`` at the end), as bench_modes.py.

Per run, from the run directory (``timeline.jsonl`` generate spans carry each
minibatch's ``rows``, ``capacity``, ``steps``, ``tail_steps``; ``summary.json``):

* tokens/s: generated response tokens / wall time (the Control Unit's loop);
* padding bubble ``1 - sum(L) / sum(rows x max L)`` and slot bubble ``1 - sum(L) /
  sum(capacity x steps)`` (the engine's: static = padding, continuous = shortfall of the
  running batch below ``min(max_num_seqs, rows)``), both over all minibatches;
* tail share: decode steps with fewer than a quarter of the capacity running / all steps;
* minibatch duration spread: coefficient of variation and max / min of the generate
  spans' durations.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_modes import log, run_one  # noqa: E402  (one runner and log line for every real-run benchmark)

SCHEDULERS = {"fifo": ["scheduler=fifo", "scheduler.slack=0"], "asp": ["scheduler=asp"]}


def analyse(run_dir: Path) -> dict:
    spans = [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run_dir / "summary.json").read_text())
    gen = [s for s in spans if s["kind"] == "generate"]
    info = [s["info"] for s in gen]
    tokens = sum(i["tokens"] for i in info)
    padded = sum(i["rows"] * i["max_length"] for i in info)
    slots = sum(i["capacity"] * i["steps"] for i in info)
    steps = sum(i["steps"] for i in info)
    durations = [s["end"] - s["start"] for s in gen]
    mean = statistics.fmean(durations) if durations else 0.0
    return {
        "minibatches": len(gen),
        "rows": statistics.fmean(i["rows"] for i in info) if info else 0.0,
        "capacity": statistics.fmean(i["capacity"] for i in info) if info else 0.0,
        "wall_s": summary["wall_time_s"],
        "tokens": tokens,
        "tokens_per_s": tokens / summary["wall_time_s"],
        "padding_bubble": 1.0 - tokens / padded if padded else 0.0,
        "slot_bubble": 1.0 - tokens / slots if slots else 0.0,
        "tail_share": sum(i["tail_steps"] for i in info) / steps if steps else 0.0,
        "duration_mean_s": mean,
        "duration_cv": statistics.pstdev(durations) / mean if mean else 0.0,
        "duration_max_min": max(durations) / min(durations) if durations and min(durations) > 0 else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--schedulers", default="fifo,asp")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=96, help="task.num_prompts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vllm-max-num-seqs", type=int, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="keep the run directories under this folder")
    args = ap.parse_args(argv)

    common = ["mode=async", f"steps={args.steps}", f"task.num_prompts={args.prompts}", "eval.num_prompts=0",
              "eval.save_final_policy=false", f"seed={args.seed}"]
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench_engine_bubbles-"))
    root.mkdir(parents=True, exist_ok=True)
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        rows = run_all(args, common, root)
    finally:
        ray.shutdown()
    print_table(args, common, rows)
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0


def run_all(args, common: list[str], root: Path) -> list[list]:
    rows = []
    for engine in args.engines.split(","):
        extra = [f"engine={engine}"]
        if engine == "vllm" and args.vllm_max_num_seqs:
            extra.append(f"engine.max_num_seqs={args.vllm_max_num_seqs}")
        for sched in args.schedulers.split(","):
            tag = f"{engine}-{sched}"
            log(f"{tag}, load {os.getloadavg()[0]:.1f}")
            x = analyse(run_one(common + extra + SCHEDULERS[sched], root, tag))
            log(f"  {json.dumps(x)}")
            rows.append([f"`{engine}`", f"`{sched}`", x["minibatches"], f"{x['rows']:.1f} / {x['capacity']:.1f}",
                         f"{x['wall_s']:.1f}", x["tokens"], f"{x['tokens_per_s']:.0f}", f"{x['padding_bubble']:.3f}",
                         f"{x['slot_bubble']:.3f}", f"{x['tail_share']:.3f}", f"{x['duration_mean_s']:.2f}",
                         f"{x['duration_cv']:.2f}", f"{x['duration_max_min']:.1f}"])
    return rows


def print_table(args, common: list[str], rows: list[list]) -> None:
    headers = ["engine", "scheduler", "minibatches", "rows / capacity (mean)", "wall s", "tokens", "tokens/s",
               "padding bubble", "slot bubble", "tail share", "minibatch s (mean)", "duration CV",
               "duration max/min"]
    print(f"Date: {time.strftime('%Y-%m-%d %H:%M')} (machine clock); {os.cpu_count()} CPU cores (shared); "
          f"`{' '.join(common)}`" + (f", vllm `engine.max_num_seqs={args.vllm_max_num_seqs}`"
                                     if args.vllm_max_num_seqs else "") + "\n")
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" for _ in headers) + "|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


if __name__ == "__main__":
    sys.exit(main())
