"""Train the tiny maze policy from scratch by supervised fine-tuning, and evaluate it.

Reproduces the checkpoint shipped in ``mindspeed_rl_asp/assets/tiny-maze-qwen3``::

    python scripts/train_tiny_policy.py            # defaults below, ~15 min on 2 CPU cores

It builds the maze tokenizer and a tiny Qwen3 model in-process, trains it with the
project's own ``hf`` training engine on reference solutions of generated mazes (seed
1000+, disjoint from the evaluation prompts of ``task.seed=0``), samples it on the
evaluation prompts at temperature 1 and writes ``training_card.json`` (the command, the
hyper-parameters, the loss curve and the integrity / correctness rates) next to the
weights. Training is kept short on purpose: the policy must be imperfect so that RL has
room to improve it.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tqdm import tqdm  # noqa: E402

from mindspeed_rl_asp.engines.base import SamplingParams, TrainBatch  # noqa: E402
from mindspeed_rl_asp.engines.hf import HFGenerationEngine, HFTrainingEngine, nll_loss  # noqa: E402
from mindspeed_rl_asp.policy.evaluate import sample_and_score  # noqa: E402
from mindspeed_rl_asp.policy.tiny_model import build_tiny_policy  # noqa: E402
from mindspeed_rl_asp.policy.tokenizer import build_tokenizer  # noqa: E402
from mindspeed_rl_asp.tasks.maze import MazeTaskSpec, make_dataset  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "mindspeed_rl_asp" / "assets" / "tiny-maze-qwen3"
TRAIN_SEED = 1000  # the evaluation prompts use task.seed=0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--train-prompts", type=int, default=20000)
    parser.add_argument("--eval-prompts", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def encode_examples(tokenizer, items):
    eos = tokenizer.eos_token_id
    return [
        (tokenizer(it.prompt, add_special_tokens=False)["input_ids"],
         tokenizer(it.reference_response, add_special_tokens=False)["input_ids"] + [eos])
        for it in items
    ]


def cosine_lr(step: int, total: int, peak: float, warmup: int = 50) -> float:
    import math

    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def main(argv=None) -> dict:
    args = parse_args(argv)
    started = time.time()
    tokenizer = build_tokenizer()
    spec = MazeTaskSpec()
    examples = encode_examples(tokenizer, make_dataset(args.train_prompts, TRAIN_SEED, spec))
    rng = random.Random(args.seed)

    with tempfile.TemporaryDirectory() as init_dir:
        build_tiny_policy(tokenizer, seed=args.seed).save_pretrained(init_dir, safe_serialization=True)
        tokenizer.save_pretrained(init_dir)
        engine = HFTrainingEngine(init_dir, num_threads=args.threads, lr=args.lr, micro_batch_size=args.batch_size)

    losses = []
    progress = tqdm(range(args.steps), desc="SFT", unit="step")
    for step in progress:
        for group in engine.optimizer.param_groups:
            group["lr"] = cosine_lr(step, args.steps, args.lr)
        batch = rng.sample(examples, args.batch_size)
        metrics = engine.train_step(TrainBatch([p for p, _ in batch], [r for _, r in batch]), nll_loss)
        losses.append(round(metrics["loss"], 4))
        progress.set_postfix(loss=f"{metrics['loss']:.3f}")

    args.out.mkdir(parents=True, exist_ok=True)
    # Sample from the full distribution by default (HF would otherwise apply top_k=50).
    engine.model.generation_config.do_sample = True
    engine.model.generation_config.top_k = 0
    engine.save(args.out)
    train_seconds = time.time() - started

    generator = HFGenerationEngine(args.out, num_threads=args.threads)
    eval_items = make_dataset(args.eval_prompts, 0, spec)
    _, summary = sample_and_score(generator, tokenizer, eval_items, SamplingParams(max_tokens=256, seed=0),
                                  batch_size=32)
    card = {
        "command": "python scripts/train_tiny_policy.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "hyperparameters": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"},
        "parameters": sum(p.numel() for p in engine.model.parameters()),
        "train_seconds": round(train_seconds, 1),
        "loss_every_50_steps": losses[::50] + losses[-1:],
        "evaluation": {"prompts": args.eval_prompts, "task_seed": 0, "temperature": 1.0, **summary},
    }
    (args.out / "training_card.json").write_text(json.dumps(card, indent=2) + "\n")
    print(json.dumps(card["evaluation"], indent=2))
    return card


if __name__ == "__main__":
    main()
