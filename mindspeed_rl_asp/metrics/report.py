"""Pictures of a run: the actor timeline as a Gantt chart, queue occupancy, rewards.

Reads ``timeline.jsonl``, ``queue.jsonl`` and ``metrics.jsonl`` from a run directory and
writes PNG files beside them. matplotlib runs headless (Agg). :func:`predictor_lines`
gives the per-epoch predictor report (``predictor_by_epoch.json``) as text.
"""
from __future__ import annotations

import json
from pathlib import Path

from .timeline import read_spans
from .writer import read_metrics

COLORS = {"generate": "#4C72B0", "load_weights": "#DD8452", "train": "#55A868", "publish": "#C44E52",
          "failed": "#222222"}


def _lane_order(lane: str) -> tuple[int, int]:
    if lane == "train":
        return (0, 0)
    kind, _, index = lane.partition("-")
    return (1, int(index) if index.isdigit() else 0)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # headless: files only
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, out: Path) -> Path:
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def gantt(run_dir: Path, out: Path) -> Path:
    plt = _pyplot()
    spans = read_spans(run_dir / "timeline.jsonl")
    if not spans:
        raise ValueError(f"{run_dir / 'timeline.jsonl'} holds no spans")
    t0 = min(s.start for s in spans)
    lanes = sorted({s.lane for s in spans}, key=_lane_order)
    fig, ax = plt.subplots(figsize=(12, 1 + 0.6 * len(lanes)))
    for y, lane in enumerate(lanes):
        for s in (s for s in spans if s.lane == lane):
            ax.barh(y, s.duration, left=s.start - t0, height=0.6, color=COLORS.get(s.kind, "grey"),
                    edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since start")
    ax.set_title(f"actor timeline: {run_dir.name}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.6 / len(lanes)),
              fontsize="small", ncol=len(COLORS), frameon=False)
    return _save(plt, fig, out)


def queue_plot(run_dir: Path, out: Path) -> Path:
    plt = _pyplot()
    with open(run_dir / "queue.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    t0 = rows[0]["time"]
    fig, ax = plt.subplots(figsize=(10, 3.5))
    ax.step([r["time"] - t0 for r in rows], [r["queued"] for r in rows], where="post", label="queued samples")
    ax.step([r["time"] - t0 for r in rows], [r["queued"] + r["in_flight"] for r in rows], where="post",
            label="queued + in flight", alpha=0.6)
    if rows and "capacity" in rows[0]:
        ax.axhline(rows[0]["capacity"], color="black", linestyle="--", linewidth=0.8, label="capacity")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("samples")
    ax.set_title("Training Queue occupancy")
    ax.legend(fontsize="small")
    return _save(plt, fig, out)


def epoch_means(rows: list[dict], key: str = "epoch_correctness") -> list[tuple[int, float, int]]:
    """``(epoch, mean, samples)`` per epoch from the steps' ``{epoch: [sum, count]}`` metric.

    A step may straddle two epochs; its samples count where they belong.
    """
    totals: dict[int, list[float]] = {}
    for r in rows:
        for epoch, (total, count) in r.get(key, {}).items():
            entry = totals.setdefault(int(epoch), [0.0, 0])
            entry[0] += total
            entry[1] += count
    return [(e, t / n, int(n)) for e, (t, n) in sorted(totals.items()) if n]


def is_complete(epochs: list[tuple[int, float, int]]) -> list[bool]:
    """Which epochs of :func:`epoch_means` are whole passes (as many samples as the
    largest). A partial epoch saw only the front of the plan (with ASP: the heaviest
    groups), so its mean is not comparable with the others."""
    full = max((n for _, _, n in epochs), default=0)
    return [n == full for _, _, n in epochs]


def reward_plot(run_dir: Path, out: Path) -> Path:
    plt = _pyplot()
    rows = read_metrics(run_dir)
    epochs = epoch_means(rows)
    panels = 2 if len(epochs) > 1 else 1
    fig, axes = plt.subplots(1, panels, figsize=(8 + 4 * (panels - 1), 3.5), squeeze=False)
    ax = axes[0][0]
    x = [r.get("elapsed_s", r["step"]) for r in rows]
    for (key, label), color in zip((("reward_mean", "mean reward"), ("correctness_rate", "correctness"),
                                    ("integrity_rate", "integrity")), ("C0", "C1", "C2")):
        if rows and key in rows[0]:
            values = [r[key] for r in rows]
            # Steps see different prompts, so single steps are noisy: show the trend too.
            ax.plot(x, values, marker="o", markersize=2, linewidth=0.6, alpha=0.35, color=color)
            ax.plot(x, rolling_mean(values, 10), linewidth=2, color=color, label=f"{label} (mean of 10 steps)")
    ax.set_xlabel("seconds since start" if rows and "elapsed_s" in rows[0] else "step")
    ax.set_title("rewards over time")
    if ax.get_legend_handles_labels()[0]:   # a simulated run has no rewards to draw
        ax.legend(fontsize="small")
    if panels == 2:
        # Each epoch replays the same prompts: the one like-for-like learning curve of a run.
        ax = axes[0][1]
        complete = is_complete(epochs)
        whole = [(e, m) for (e, m, _), c in zip(epochs, complete) if c]
        ax.plot([e for e, _ in whole], [m for _, m in whole], marker="o", color="C1", label="whole epoch")
        for (e, m, n), c in zip(epochs, complete):
            if not c:
                ax.plot([e], [m], marker="o", markerfacecolor="none", color="C1", linestyle="none",
                        label=f"partial epoch ({n} samples: the front of the plan only)")
        ax.legend(fontsize="small")
        ax.set_xlabel("epoch (the same prompts each epoch)")
        ax.set_ylabel("correctness")
        ax.set_title("on-policy correctness per epoch")
    return _save(plt, fig, out)


def rolling_mean(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _cell(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def predictor_lines(run_dir: Path) -> list[str]:
    """The per-epoch predictor report of a run (``predictor_by_epoch.json``, written by
    ``schedule/epoch_report.py``) as text: per epoch the rank correlation of the lengths its plan
    used and the observed ones, and the realised bubbles. [] when the run has none."""
    path = Path(run_dir) / "predictor_by_epoch.json"
    if not path.is_file():
        return []
    r = json.loads(path.read_text(encoding="utf-8"))
    lines = [f"predictor {r.get('predictor', '?')} (scheduler {r.get('scheduler', '?')}), refit {r['refit']} "
             f"(weight {r['refit_weight']}): {r['replans_accepted']} of {r['replans']} re-plans taken",
             f"{'epoch':>5}  {'plan':<10} {'spearman':>8} {'kendall':>8} {'prompts':>7} {'padding':>8} "
             f"{'slot':>6} {'minibatches':>11} {'mean len':>8}"]
    for e in r["epochs"]:
        plan = ("re-planned" if e["replanned"] else "first") + ("" if e["complete"] else "*")
        lines.append(f"{e['epoch']:>5}  {plan:<10} {_cell(e['spearman_rho'], '8.3f')} {_cell(e['kendall_tau'], '8.3f')} "
                     f"{e['prompts']:>7} {e['padding_bubble']:>8.3f} {e['slot_bubble']:>6.3f} {e['minibatches']:>11} "
                     f"{e['observed_mean_length']:>8.1f}")
    if any(not e["complete"] for e in r["epochs"]):
        lines.append("* partial epoch: not every prompt was generated in it")
    return lines


def make_report(run_dir: Path) -> list[Path]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    made = []
    for name, draw, needs in (("timeline.png", gantt, "timeline.jsonl"), ("queue.png", queue_plot, "queue.jsonl"),
                              ("rewards.png", reward_plot, "metrics.jsonl")):
        if (run_dir / needs).is_file():
            made.append(draw(run_dir, run_dir / name))
    if not made:
        raise FileNotFoundError(f"{run_dir} has none of timeline.jsonl, queue.jsonl, metrics.jsonl: not a run directory")
    return made
