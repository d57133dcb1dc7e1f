"""Profile response lengths: run the target policy on a sample of maze prompts.

This is step 0 of the length predictor (docs/scheduler.md, "Length predictors on the
maze task"): the (prompt, observed length) pairs the predictors are fitted on. Each
of the ``--samples-per-prompt`` samples is a separate sampling pass over all prompts
with its own seed (an independent "epoch"), so sample 1 can serve as the history of
an earlier epoch and sample 2 as the length to predict.

Run from the repository root (no model hub: ``--model`` is a local checkpoint)::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/profile_lengths.py \\
        --num-prompts 600 --samples-per-prompt 2 --max-tokens 256 --out runs/profile.jsonl

Output: one JSON line per prompt, in dataset order::

    {"id": "maze-0-0", "prompt": "...", "size": 5, "lengths": [31, 27],
     "mean_length": 29.0, "finished": [true, true]}

``lengths`` are response tokens including the end-of-text token (a response cut at
``--max-tokens`` has ``finished`` false and length ``--max-tokens``). Prompts are
``make_dataset(num_prompts, seed)`` (``--seed`` also seeds the sampling), so the
profile of N prompts is a prefix of the task's prompt set with the same seed.
Generation batches are formed from prompts sorted by prompt length (less padding);
the output order is the dataset order.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

# Allow running from a checkout without installing the package.
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_MODEL = "mindspeed_rl_asp/assets/tiny-maze-qwen3"


def resolve_model(path: str) -> str:
    """A relative path that does not exist from the cwd is read from the repository root."""
    if not Path(path).exists() and (REPO / path).exists():
        return str(REPO / path)
    return path


def profile(model: str = DEFAULT_MODEL, num_prompts: int = 600, seed: int = 0, samples_per_prompt: int = 2,
            max_tokens: int = 256, batch_size: int = 32, num_threads: int = 1, temperature: float = 1.0,
            progress: bool = True) -> list[dict]:
    """Sample the policy; return one record per prompt (the JSONL lines, as dicts).

    The sampling is the package's (``schedule/length_profile.sample_lengths``), the one
    ``asp-train scheduler.predictor=ridge|lm`` profiles its prompts with."""
    from tqdm import tqdm

    from mindspeed_rl_asp.engines.hf import HFGenerationEngine
    from mindspeed_rl_asp.schedule.length_profile import profile_records, sample_lengths
    from mindspeed_rl_asp.tasks.maze import MazeTaskSpec, make_dataset

    for name, value in (("num_prompts", num_prompts), ("samples_per_prompt", samples_per_prompt),
                        ("max_tokens", max_tokens), ("batch_size", batch_size)):
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    items = make_dataset(num_prompts, seed, MazeTaskSpec())
    engine = HFGenerationEngine(resolve_model(model), num_threads=num_threads)
    bar = tqdm(total=num_prompts * samples_per_prompt, unit="sample", disable=not progress, desc="profiling")

    def on_batch(k: int, done: int, tokens_per_second: float) -> None:
        bar.n = k * num_prompts + done
        bar.set_postfix(pass_=k + 1, tok_s=f"{tokens_per_second:.0f}")
        bar.refresh()

    lengths, finished = sample_lengths(engine, engine.tokenizer, items, samples_per_prompt, max_tokens, seed,
                                       batch_size=batch_size, temperature=temperature, on_batch=on_batch)
    bar.close()
    return profile_records(items, lengths, finished, extra=lambda p: {"size": p.size})


def write_jsonl(records: Sequence[dict], path: str | Path) -> None:
    """Write atomically (temp file + rename)."""
    from mindspeed_rl_asp.schedule.length_profile import write_profile

    write_profile(records, path)


def read_jsonl(path: str | Path) -> list[dict]:
    """Read a profile; each line needs id, prompt and a non-empty list of lengths."""
    from mindspeed_rl_asp.schedule.length_profile import read_profile

    return read_profile(path)


def summary_line(records: Sequence[dict], seconds: float) -> str:
    lengths = sorted(v for r in records for v in r["lengths"])
    cut = sum(not f for r in records for f in r.get("finished", []))
    return (f"{len(records)} prompts, {len(lengths)} samples in {seconds:.1f} s "
            f"({len(lengths) / max(seconds, 1e-9):.1f} samples/s); length median {lengths[len(lengths) // 2]}, "
            f"mean {sum(lengths) / len(lengths):.1f}, max {lengths[-1]}; cut at max_tokens: {cut}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help="local checkpoint directory (default: the shipped tiny policy)")
    ap.add_argument("--num-prompts", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0, help="task seed of the prompts; also seeds the sampling")
    ap.add_argument("--samples-per-prompt", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--num-threads", type=int, default=1,
                    help="torch threads (1: on a shared machine more threads spin-wait and can be 50x slower)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--out", required=True, help="output JSONL (e.g. runs/profile.jsonl)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    records = profile(args.model, args.num_prompts, args.seed, args.samples_per_prompt, args.max_tokens,
                      args.batch_size, args.num_threads, args.temperature)
    write_jsonl(records, args.out)
    print(summary_line(records, time.perf_counter() - started))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
