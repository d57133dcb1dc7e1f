"""Length distribution of the maze task's reference responses.

Why: the scheduler work needs response lengths that vary strongly from prompt
to prompt, with a long tail, and that are predictable from the prompt. This
script shows how the lengths of the reference (ideal-policy) responses are
spread overall and per maze size, in characters and in task tokens (a
``<|...|>`` tag, a think/answer tag, or else one character; see
``mindspeed_rl_asp.tasks.maze.count_tokens``).

Run from the repository root::

    python scripts/maze_lengths.py                      # 2000 prompts, seed 0, default spec
    python scripts/maze_lengths.py --num-prompts 500 --seed 3 \\
        --min-size 3 --max-size 8 --size-decay 0.6

It prints, for responses (and prompts for reference), the quantiles
p10/p25/p50/p75/p90/p99, max, max/median and mean, first over all prompts and
then by maze size.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from collections import defaultdict
from typing import Sequence

# Allow running from a checkout without installing the package.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from mindspeed_rl_asp.tasks.maze import MazeTaskSpec, count_tokens, make_dataset  # noqa: E402

QUANTILES = (10, 25, 50, 75, 90, 99)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Quantiles, max, max/median and mean of ``values``."""
    s = sorted(values)
    out = {f"p{q}": percentile(s, q) for q in QUANTILES}
    out["max"] = s[-1]
    out["max/med"] = s[-1] / out["p50"] if out["p50"] else float("inf")
    out["mean"] = sum(s) / len(s)
    return out


def format_table(title: str, groups: dict[str, Sequence[float]]) -> str:
    keys = [f"p{q}" for q in QUANTILES] + ["max", "max/med", "mean"]
    header = f"{'group':>8} {'n':>6} " + " ".join(f"{k:>8}" for k in keys)
    lines = [title, header]
    for name, values in groups.items():
        st = summarize(values)
        cells = " ".join(f"{st[k]:>8.1f}" if k != "max/med" else f"{st[k]:>8.2f}" for k in keys)
        lines.append(f"{name:>8} {len(values):>6} {cells}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    default = MazeTaskSpec()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-prompts", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-size", type=int, default=default.min_size)
    ap.add_argument("--max-size", type=int, default=default.max_size)
    ap.add_argument("--size-decay", type=float, default=default.size_decay)
    args = ap.parse_args(argv)

    spec = MazeTaskSpec(args.min_size, args.max_size, args.size_decay)
    items = make_dataset(args.num_prompts, args.seed, spec)
    print(
        f"maze reference lengths: num_prompts={args.num_prompts} seed={args.seed} "
        f"min_size={spec.min_size} max_size={spec.max_size} size_decay={spec.size_decay}"
    )

    for what, attr in (("response", "reference_response"), ("prompt", "prompt")):
        for unit, measure in (("tokens", count_tokens), ("chars", len)):
            groups: dict[str, list[float]] = {"all": []}
            by_size: dict[int, list[float]] = defaultdict(list)
            for item in items:
                v = measure(getattr(item, attr))
                groups["all"].append(v)
                by_size[item.size].append(v)
            for size in sorted(by_size):
                groups[f"{size}x{size}"] = by_size[size]
            print()
            print(format_table(f"== {what} length in {unit} ==", groups))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
