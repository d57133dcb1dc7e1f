"""``asp-generate``: sample the policy on the task's prompts and print the rewards.

Writes ``config.yaml``, ``samples.jsonl`` (every response with its scores) and
``summary.json`` into the run directory.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict

SUMMARY = "Sample the policy on the task's prompts (task.*), score the responses and print the rewards."


def rewards_table(samples) -> "Table":
    from rich.table import Table

    from ..tasks.base import group_label

    by_group = defaultdict(list)
    for s in samples:
        by_group[s.group].append(s)
    mazes = all(isinstance(k, int) for k in by_group)
    table = Table(title="maze rewards by size" if mazes else "rewards by group")
    for column in ("size" if mazes else "group", "samples", "integrity", "correctness", "mean reward",
                   "median length"):
        table.add_column(column, justify="right")
    for key in sorted(by_group) + [None]:
        rows = samples if key is None else by_group[key]
        lengths = sorted(s.response_length for s in rows)
        n = len(rows)
        table.add_row("all" if key is None else group_label(key), str(n),
                      f"{sum(s.integrity for s in rows) / n:.2f}", f"{sum(s.correctness for s in rows) / n:.2f}",
                      f"{sum(s.reward for s in rows) / n:.3f}", str(lengths[n // 2]))
    return table


def sampling_of(cfg, seed: int):
    """The sampling asp-generate uses: ``generate.sampling_config``, or with
    ``generate.greedy=true`` the most likely token at each step (top_k=1: the same on every
    engine and for every seed; the log-probs recorded are then 0)."""
    from dataclasses import replace

    from ..engines.base import SamplingParams

    sampling = SamplingParams.from_config(cfg.generate.sampling_config, seed=seed)
    return replace(sampling, temperature=1.0, top_p=1.0, top_k=1, min_p=0.0) if cfg.generate.greedy else sampling


def generate(cfg) -> int:
    from .common import make_console
    from rich.progress import Progress

    from ..config.engine import engine_settings
    from ..config.load import make_run_dir
    from ..config.validate import resolve_model_path
    from ..engines.registry import make_generation_engine
    from ..engines.hf import load_tokenizer
    from ..policy.evaluate import sample_and_score
    from ..schedule.configured import configured_task

    console = make_console()
    model_path = resolve_model_path(cfg.model.path)
    the_task = configured_task(cfg, load_tokenizer(model_path))  # before the run directory: bad input writes nothing
    prompts = the_task.prompts
    run_dir = make_run_dir(cfg, "generate")
    console.print(f"[bold]asp-generate[/] {model_path.name} on {len(prompts)} prompts ({the_task.description}) "
                  f"x {cfg.rl.n_samples_per_prompt} samples, engine={cfg.engine.name}"
                  f"{', greedy' if cfg.generate.greedy else ''}; run dir {run_dir}")
    engine = make_generation_engine(engine_settings(cfg), str(model_path))
    total = len(prompts) * cfg.rl.n_samples_per_prompt
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("generating", total=total)

        def on_batch(done: int, tokens_per_second: float) -> None:
            progress.update(task, completed=done, description=f"generating ({tokens_per_second:,.0f} tok/s)")

        samples, summary = sample_and_score(
            engine, engine.tokenizer, prompts, sampling_of(cfg, cfg.seed), the_task,
            n_samples_per_prompt=cfg.rl.n_samples_per_prompt, batch_size=cfg.engine.max_num_seqs, on_batch=on_batch,
        )
    with open(run_dir / "samples.jsonl", "w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps(asdict(s)) + "\n")
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(rewards_table(samples))
    console.print(f"integrity {summary['integrity_rate']:.2f}, correctness {summary['correctness_rate']:.2f}, "
                  f"mean reward {summary['mean_reward']:.3f}, {summary['tokens_per_second']:,.0f} tokens/s "
                  f"({summary['generated_tokens']} tokens in {summary['generation_seconds']:.1f} s)")
    return 0


def main(argv=None) -> int:
    from .common import run_command

    return run_command("asp-generate", SUMMARY, generate, argv, training=False)


if __name__ == "__main__":
    raise SystemExit(main())
