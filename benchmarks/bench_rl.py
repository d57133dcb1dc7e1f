"""Does GRPO raise the tiny policy's maze correctness, and where? Not a test.

Two arms of the real runtime (``run_training``: async, ASP, the default config), with the
same step count and sample budget, interleaved per seed:

* ``one-pass``: ``task.num_prompts=512``: 64 steps x 8 prompts see each prompt once;
* ``epochs``: ``task.num_prompts=64`` (the default): the same 64 steps are 8 passes over
  64 prompts;
* ``sft`` (control, no RL, no Ray): the same number of steps of supervised fine-tuning on
  reference solutions of fresh mazes, 32 per step (the RL steps' sample count), same lr:
  does more imitation of perfect answers move held-out correctness?

Each run ends with the driver's initial-vs-final check (same seeds, paired by prompt,
``eval.samples_per_prompt`` samples each): on the first ``eval.num_prompts`` training
prompts and on held-out mazes. Printed as a markdown table (pasted into
docs/benchmarks.md, "What RL does to the tiny policy")::

    HF_HUB_OFFLINE=1 python benchmarks/bench_rl.py                 # 2 seeds, ~8 min on 2 cores
    HF_HUB_OFFLINE=1 python benchmarks/bench_rl.py --seeds 0 --steps 16   # ~3 min

One local Ray cluster for the whole process, shut down at the end.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_modes import log, run_one  # noqa: E402
from train_tiny_policy import encode_examples  # noqa: E402

ARMS = (("one-pass", ["task.num_prompts=512"]), ("epochs", ["task.num_prompts=64"]), ("sft", []))
SFT_SEED = 4242  # a maze stream disjoint from task.seed (0), eval.seed and the shipped SFT's


def sft_control(overrides: list[str], root: Path, tag: str) -> dict:
    """``steps`` SFT steps from the starting checkpoint, then the driver's initial-vs-final check."""
    import random
    import time

    from mindspeed_rl_asp.config.load import load_config, make_run_dir
    from mindspeed_rl_asp.config.validate import resolve_model_path
    from mindspeed_rl_asp.engines.base import TrainBatch
    from mindspeed_rl_asp.engines.hf import HFTrainingEngine, nll_loss
    from mindspeed_rl_asp.runtime.driver import evaluate_initial_and_final
    from mindspeed_rl_asp.tasks.maze import MazeTaskSpec, make_dataset

    cfg = load_config(overrides + [f"run_dir={root / tag}"])
    run_dir = make_run_dir(cfg, "bench")
    model_path = str(resolve_model_path(cfg.model.path))
    batch = cfg.rl.global_batch_size * cfg.rl.n_samples_per_prompt
    engine = HFTrainingEngine(model_path, num_threads=max(cfg.engine.num_threads, 1), lr=cfg.train.lr,
                              clip_grad=cfg.train.clip_grad, micro_batch_size=batch)
    items = make_dataset(cfg.steps * batch, SFT_SEED,
                         MazeTaskSpec(cfg.task.min_size, cfg.task.max_size, cfg.task.size_decay))
    random.Random(cfg.seed).shuffle(items)
    examples = encode_examples(engine.tokenizer, items)  # the shipped policy's own SFT encoding
    start = time.time()
    for step in range(cfg.steps):
        chunk = examples[step * batch:(step + 1) * batch]
        engine.train_step(TrainBatch([p for p, _ in chunk], [r for _, r in chunk]), nll_loss)
    wall = time.time() - start
    engine.save(run_dir / "final_policy")
    summary = {"epochs": 1, "wall_time_s": wall,
               **evaluate_initial_and_final(cfg, model_path, str(run_dir / "final_policy"), items)}
    log(f"  {tag}: {cfg.steps} SFT steps of {batch} in {wall:.1f} s")
    return summary


def change_cell(change: dict) -> str:
    low, high = change["ci95"]
    return f"{change['before']:.3f} -> {change['after']:.3f} ({change['change']:+.3f}, CI {low:+.3f}..{high:+.3f})"


def row(arm: str, seed: int, summary: dict) -> str:
    epochs = [e for e in summary.get("on_policy_correctness_by_epoch", []) if e["complete"]]
    curve = " ".join(f"{e['correctness']:.2f}" for e in epochs) if len(epochs) > 1 else "-"
    return (f"| {arm} | {seed} | {summary['epochs']} | {change_cell(summary['training_prompts']['change']['correctness'])} "
            f"| {change_cell(summary['held_out']['change']['correctness'])} | {curve} | {summary['wall_time_s']:.0f} |")


def main(argv: list[str] | None = None) -> int:
    import json

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1", help="comma-separated run seeds (each arm runs once per seed)")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--arms", default=",".join(name for name, _ in ARMS), help="comma-separated subset of arms")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run directories under this folder")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = [(name, extra) for name, extra in ARMS if name in args.arms.split(",")]
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench_rl-"))
    root.mkdir(parents=True, exist_ok=True)

    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    rows = []
    try:
        for seed in seeds:
            for arm, extra in arms:
                log(f"{arm}, seed {seed}, load {os.getloadavg()[0]:.1f}")
                overrides = [*extra, f"steps={args.steps}", f"seed={seed}"]
                if arm == "sft":
                    summary = sft_control(overrides, root, f"{arm}-seed{seed}")
                else:
                    run_dir = run_one(overrides + ["eval.save_final_policy=false"], root, f"{arm}-seed{seed}")
                    summary = json.loads((run_dir / "summary.json").read_text())
                rows.append(row(arm, seed, summary))
    finally:
        ray.shutdown()
    print(f"\n{args.steps} steps x 8 prompts x 4 samples per run (sft: x 32 reference solutions); lr 3e-5; "
          "check: initial vs final policy, 4 samples per prompt, same seeds, paired by prompt (95% CI)\n")
    print("| arm | seed | epochs | training prompts: correctness | held-out (128 mazes): correctness "
          "| on-policy correctness per whole epoch | train wall s |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
