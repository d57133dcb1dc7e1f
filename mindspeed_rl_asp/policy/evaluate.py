"""Sample a policy on a task's prompts and score it: the main job's generate-and-reward step.

Used by ``asp-generate``, by the end-of-run comparison of the initial and the final
policy, by the tiny policy's training script (to record its rates) and by the tests.
Scoring goes through the task protocol (``Task.score``); a bare
:class:`~mindspeed_rl_asp.tasks.maze.MazeRewardWeights` still scores maze prompts with
``tasks.maze.score_response``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence, Union

from ..engines.base import GenerationEngine, SamplingParams
from ..tasks.base import Group
from ..tasks.maze import MazeRewardWeights, score_response


@dataclass
class ScoredSample:
    prompt_id: str
    group: Group             # the prompt's evaluation group: a maze size, or a dataset's group field
    response: str
    response_length: int
    finished: bool
    integrity: float
    correctness: float
    reward: float
    components: dict = field(default_factory=dict)

    @property
    def maze_size(self) -> Group:  # the name before tasks had groups
        return self.group


def strip_eos(text: str, eos_token: str) -> str:
    return text[: -len(eos_token)] if text.endswith(eos_token) else text


Scoring = Union[MazeRewardWeights, Callable, object]


def scorer(scoring: Scoring) -> Callable:
    """``(prompt, response) -> score dict`` from a task (anything with ``score``), a
    function of that shape, or maze reward weights."""
    if isinstance(scoring, MazeRewardWeights):
        return lambda prompt, text: score_response(prompt.prompt, text, scoring)
    if hasattr(scoring, "score"):
        return scoring.score
    if callable(scoring):
        return scoring
    raise TypeError(f"cannot score with {type(scoring).__name__}: give a task, a function or MazeRewardWeights")


def sample_and_score(
    engine: GenerationEngine,
    tokenizer,
    prompts: Sequence,
    sampling: SamplingParams,
    weights: Scoring = MazeRewardWeights(),
    n_samples_per_prompt: int = 1,
    batch_size: int = 16,
    on_batch: Callable[[int, float], None] | None = None,
) -> tuple[list[ScoredSample], dict[str, float]]:
    """Generate ``n_samples_per_prompt`` responses per prompt, in batches, and score them
    (``weights``: the task, or anything :func:`scorer` takes).

    Returns the scored samples and a summary (rates, lengths, tokens/s). ``on_batch`` is
    called with (samples done, batch tokens/s) after each batch, for progress display.
    """
    score = scorer(weights)
    expanded = [p for p in prompts for _ in range(n_samples_per_prompt)]
    samples: list[ScoredSample] = []
    total_tokens, total_seconds = 0, 0.0
    for start in range(0, len(expanded), batch_size):
        chunk = expanded[start:start + batch_size]
        ids = [tokenizer(p.prompt, add_special_tokens=False)["input_ids"] for p in chunk]
        seed = None if sampling.seed is None else sampling.seed + start
        out = engine.generate(ids, replace(sampling, seed=seed))
        total_tokens += out.num_tokens
        total_seconds += out.end_time - out.start_time
        for item, response_ids, done in zip(chunk, out.response_ids, out.finished):
            text = strip_eos(tokenizer.decode(response_ids, skip_special_tokens=False), tokenizer.eos_token)
            scores = score(item, text)
            samples.append(ScoredSample(item.id, item.group, text, len(response_ids), done, scores["integrity"],
                                        scores["correctness"], scores["reward"], dict(scores.get("components", {}))))
        if on_batch:
            on_batch(len(samples), out.tokens_per_second)
    return samples, summarize(samples, total_tokens, total_seconds)


def summarize(samples: Sequence[ScoredSample], tokens: int, seconds: float) -> dict[str, float]:
    n = max(len(samples), 1)
    lengths = sorted(s.response_length for s in samples)
    return {
        "samples": len(samples),
        "integrity_rate": sum(s.integrity for s in samples) / n,
        "correctness_rate": sum(s.correctness for s in samples) / n,
        "mean_reward": sum(s.reward for s in samples) / n,
        "finished_rate": sum(s.finished for s in samples) / n,
        "median_length": float(lengths[len(lengths) // 2]) if lengths else 0.0,
        "max_length": float(lengths[-1]) if lengths else 0.0,
        "generated_tokens": tokens,
        "generation_seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
    }


def rates_by_group(samples: Sequence[ScoredSample]) -> dict[Group, dict[str, float]]:
    """``{group: {"samples", "integrity_rate", "correctness_rate"}}``, groups ascending
    (for the maze task the groups are maze sizes)."""
    groups: dict[Group, list[ScoredSample]] = {}
    for s in samples:
        groups.setdefault(s.group, []).append(s)
    return {size: {"samples": len(g),
                   "integrity_rate": sum(s.integrity for s in g) / len(g),
                   "correctness_rate": sum(s.correctness for s in g) / len(g)}
            for size, g in sorted(groups.items())}


rates_by_size = rates_by_group  # the name before tasks had groups


def paired_change(before: Sequence[ScoredSample], after: Sequence[ScoredSample], key: str = "correctness") -> dict:
    """How ``key`` changed from ``before`` to ``after`` on the same prompts, paired by prompt.

    Each prompt contributes ``d_p = mean(after) - mean(before)`` over its samples; the
    change is the mean of ``d_p`` with its standard error ``sd(d_p) / sqrt(P)`` and a
    normal 95 % interval. Pairing removes the prompt-to-prompt difficulty spread from
    the noise, so a few hundred prompts resolve changes of a few points. ``improved`` /
    ``worsened`` count prompts whose mean went up / down.
    """
    def per_prompt(samples):
        sums: dict[str, list[float]] = {}
        for s in samples:
            sums.setdefault(s.prompt_id, []).append(float(getattr(s, key)))
        return {pid: sum(v) / len(v) for pid, v in sums.items()}

    b, a = per_prompt(before), per_prompt(after)
    if set(b) != set(a):
        raise ValueError(f"paired_change needs the same prompts on both sides: {len(set(b) ^ set(a))} differ")
    if not b:
        raise ValueError("paired_change got no samples")
    diffs = [a[pid] - b[pid] for pid in b]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    se = sd / math.sqrt(n)
    return {"metric": key, "prompts": n, "before": sum(b.values()) / n, "after": sum(a.values()) / n,
            "change": mean, "stderr": se, "ci95": [mean - 1.96 * se, mean + 1.96 * se],
            "improved": sum(d > 0 for d in diffs), "worsened": sum(d < 0 for d in diffs)}


def held_out_comparison(paths: dict[str, str], prompts: Sequence, sampling: SamplingParams,
                        weights: Scoring, engine_kwargs: dict | None = None,
                        n_samples_per_prompt: int = 1,
                        progress: Callable[[str, int, int], None] | None = None) -> dict[str, dict]:
    """Score each named checkpoint on the same held-out prompts with the same seeds
    (``weights``: the task, or anything :func:`scorer` takes).

    Returns ``{name: summary with "by_group"}`` and, when there is more than one checkpoint,
    ``"change"``: :func:`paired_change` of correctness and integrity from the first
    checkpoint to the last. ``progress(checkpoint name, samples done, samples in all)``
    after each batch, counting over all checkpoints.
    """
    from ..engines.hf import HFGenerationEngine

    results, scored = {}, {}
    per_checkpoint = len(prompts) * n_samples_per_prompt
    for k, (name, path) in enumerate(paths.items()):
        engine = HFGenerationEngine(path, **(engine_kwargs or {}))
        on_batch = progress and (lambda done, _tokens_per_s, name=name, before=k * per_checkpoint:
                                 progress(name, before + done, len(paths) * per_checkpoint))
        scored[name], results[name] = sample_and_score(engine, engine.tokenizer, prompts, sampling, weights,
                                                       n_samples_per_prompt=n_samples_per_prompt, batch_size=64,
                                                       on_batch=on_batch)
        results[name]["by_group"] = rates_by_group(scored[name])
    names = list(paths)
    if len(names) > 1:
        first, last = scored[names[0]], scored[names[-1]]
        results["change"] = {key: paired_change(first, last, key) for key in ("correctness", "integrity")}
    return results
