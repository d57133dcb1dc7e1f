"""``asp-simulate``: run the real control core on a simulated cluster.

    asp-simulate experiment=table3_qwen3_30b_a3b_asp      one configuration: its run directory
                                                          gets timeline/queue/metrics.jsonl
                                                          (asp-report draws them) and sim_result.json
    asp-simulate experiment=sim_table3                    a study: every row of the paper's
                                                          experiment, printed beside the paper's
                                                          figure, as study.json and study.png

Studies: ``sim_table3``, ``sim_ablation``, ``sim_scaling``, ``sim_lag``, ``sim_sensitivity``,
``sim_asyncflow``
(sim/studies.py);
``validation``: every published measurement in configs/validation/cases.yaml beside its
simulated figure (docs/validation.md).
Further overrides apply to every row (e.g. ``sim.predictor_spearman=0.6``).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .common import run_command

SUMMARY = ("Simulate async GRPO with ASP (or a baseline) on a modelled cluster: the real control core and "
           "planner on a virtual clock, cost models from the hardware, model and engine profiles.")
TOKEN_DEFINITIONS = (("tokens_per_s_per_gen_device", "per generation NPU"),
                     ("tokens_per_s_per_device", "per NPU of the layout"),
                     ("tokens_per_s_per_gen_device_busy", "per generation NPU, busy time"))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # A simulated cluster's engine is numbers, not a local install: nothing installed here is checked.
    return run_command("asp-simulate", SUMMARY, lambda cfg: simulate_command(cfg, argv), argv, local_install=False)


def simulate_command(cfg, argv: list[str]) -> int:
    from ..config.load import make_run_dir

    run_dir = make_run_dir(cfg, "simulate")
    if cfg.sim.study == "validation":
        extra = [a for a in argv if "=" in a and not a.startswith(("experiment=", "run_dir=", "sim."))]
        return run_validation(cfg.sim.validation_file, extra, run_dir)
    if cfg.sim.study:
        extra = [a for a in argv if "=" in a and not a.startswith(("experiment=", "run_dir="))]
        return run_study(cfg.sim.study, extra, run_dir)
    from ..sim.run import simulate

    start = time.time()
    result = simulate(cfg, run_dir)
    print(describe(cfg.experiment.name or "run", result))
    print(f"simulated {result.steps} steps in {time.time() - start:.2f} s; wrote {run_dir} "
          f"(asp-report {run_dir} draws it)")
    return 0


def run_validation(path: str, extra: list[str], run_dir: Path) -> int:
    """Every case of the cases file simulated beside its measurement (sim/studies.py)."""
    import yaml

    from ..config.load import config_dir
    from ..sim.studies import format_validation, load_cases, validation_rows
    from .common import UserError

    file = Path(path) if path else config_dir() / "validation" / "cases.yaml"
    if not file.is_file():
        raise UserError(f"sim.validation_file={str(file)!r}: no such file")
    rows = validation_rows(load_cases(yaml.safe_load(file.read_text()) or {}), extra)
    (run_dir / "validation.json").write_text(json.dumps({"file": str(file), "rows": rows}, indent=2) + "\n")
    print(format_validation(rows))
    print(f"wrote {run_dir / 'validation.json'}")
    return 0


def describe(label: str, r) -> str:
    return (f"{label}: iteration {r.iteration_s:.1f} s (lower bound {r.lower_bound_s:.1f} s: generation "
            f"{r.generation_bound_s:.1f}, training {r.training_bound_s:.1f}); tokens/s per generation device "
            f"{r.tokens_per_s_per_gen_device:.1f}; generation idle {r.generation_idle:.0%}, trainer idle "
            f"{r.trainer_idle:.0%}; mean policy age {r.policy_age_mean:.2f}")


def run_study(name: str, extra: list[str], run_dir: Path) -> int:
    from ..config.load import load_config
    from ..sim.run import simulate
    from ..sim.studies import get_study, ratio

    try:
        study = get_study(name)
    except KeyError as error:
        from .common import UserError
        raise UserError(str(error.args[0])) from None
    rows = []
    for k, row in enumerate(study.rows, 1):
        print(f"[{k}/{len(study.rows)}] {row.label}", file=sys.stderr, flush=True)
        cfg = load_config([*row.overrides, *extra], local_install=False)
        result = simulate(cfg, run_dir / _slug(row.label))
        rows.append({"label": row.label, "system": row.system, "model": row.model, "layout": row.layout,
                     "overrides": list(row.overrides) + extra, "paper": row.paper, "simulated": result.to_dict()})
    values = {r["label"]: _metrics(r["simulated"]) for r in rows}
    paper = {r["label"]: _paper_metrics(r["paper"]) for r in rows}
    ratios = []
    for title, num, den, metric in study.ratios:
        for key, what in ([(metric, "")] if metric != "tokens_per_s_per_npu" else
                          [(f"tokens_per_s_{d}", f" ({label})") for d, label in _token_keys()]):
            sim = ratio(values, num, den, key)
            target = study.paper_ratios.get(title) or ratio(paper, num, den, metric)
            ratios.append({"ratio": title + what, "simulated": sim, "paper": target,
                           "error": (sim / target - 1.0) if sim and target else None})
    table = {"study": study.name, "title": study.title, "rows": rows, "ratios": ratios, "notes": list(study.notes)}
    (run_dir / "study.json").write_text(json.dumps(table, indent=2) + "\n")
    print(format_study(table))
    plot = draw_study(table, run_dir / "study.png", run_dir)
    print(f"wrote {run_dir / 'study.json'} and {plot}; each row's run directory is under {run_dir}")
    return 0


def _token_keys():
    # MindSpeed-RL's e2e_tps first: the definition picked before looking at the result
    # (issue 18 item 4), then the project's three.
    return [("mindspeed", "MindSpeed-RL e2e_tps: max prompt + max response x samples / world / step"),
            ("per_gen_device", "per generation NPU"), ("per_device", "per NPU of the layout"),
            ("per_gen_device_busy", "per generation NPU, busy time")]


def _metrics(sim: dict) -> dict:
    out = {"iteration_s": sim["iteration_s"], "policy_age_mean": sim["policy_age_mean"]}
    for key, _ in _token_keys():
        out[f"tokens_per_s_{key}"] = sim["mindspeed_e2e_tps"] if key == "mindspeed" else sim[f"tokens_per_s_{key}"]
    return out


def _paper_metrics(paper: dict) -> dict:
    out = dict(paper)
    if "tokens_per_s_per_npu" in paper:
        for key, _ in _token_keys():
            out[f"tokens_per_s_{key}"] = paper["tokens_per_s_per_npu"]
    return out


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label.lower()).strip("-").replace("--", "-")


def _fmt(x, digits=1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def format_study(table: dict) -> str:
    lines = [f"## {table['title']}", "",
             "| row | layout | iteration s | paper | lower bound s | latency bound s | bound by | "
             "MindSpeed-RL e2e_tps (mean) | vllm_tps | tok/s/gen NPU | tok/s/NPU | "
             "tok/s/gen NPU busy | paper tok/s/NPU | gen idle | trainer idle | policy age | paper age |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        s, p = r["simulated"], r["paper"]
        lines.append(
            f"| {r['label']} | {r['layout']} | {s['iteration_s']:.1f} | {_fmt(p.get('iteration_s'))} | "
            f"{s['lower_bound_s']:.1f} | {s.get('latency_bound_s', 0.0):.1f} | {s.get('bound_by', '-')} | "
            f"{s.get('mindspeed_e2e_tps', 0.0):.1f} ({s.get('mindspeed_e2e_tps_mean', 0.0):.1f}) | "
            f"{s.get('mindspeed_vllm_tps', 0.0):.1f} | "
            f"{s['tokens_per_s_per_gen_device']:.1f} | {s['tokens_per_s_per_device']:.1f} | "
            f"{s['tokens_per_s_per_gen_device_busy']:.1f} | {_fmt(p.get('tokens_per_s_per_npu'))} | "
            f"{s['generation_idle']:.0%} | {s['trainer_idle']:.0%} | {s['policy_age_mean']:.2f} | "
            f"{_fmt(p.get('policy_age_mean'))} |")
    if table["ratios"]:
        lines += ["", "| ratio | simulated | paper | simulated / paper - 1 |", "|---|---|---|---|"]
        for q in table["ratios"]:
            err = "-" if q["error"] is None else f"{q['error']:+.0%}"
            lines.append(f"| {q['ratio']} | {_fmt(q['simulated'], 2)} | {_fmt(q['paper'], 2)} | {err} |")
    for note in table.get("notes", ()):
        lines += ["", note]
    return "\n".join(lines)


def draw_study(table: dict, out: Path, run_dir: Path) -> Path:
    """Bars of simulated iteration time (with the lower bound as a tick and the paper's
    figure as a marker); for the ablation also the queue occupancy of each row over time."""
    from ..metrics.report import _pyplot, _save

    plt = _pyplot()
    rows = table["rows"]
    queue = table["study"] == "ablation"
    fig, axes = plt.subplots(1, 2 if queue else 1, figsize=(13 if queue else 9, 4.2), squeeze=False)
    ax = axes[0][0]
    x = range(len(rows))
    ax.bar(x, [r["simulated"]["iteration_s"] for r in rows], color="C0", label="simulated")
    ax.scatter(x, [r["simulated"]["lower_bound_s"] for r in rows], marker="_", s=600, color="black",
               label="zero-bubble lower bound", zorder=3)
    paper = [(i, r["paper"]["iteration_s"]) for i, r in zip(x, rows) if "iteration_s" in r["paper"]]
    if paper:
        ax.scatter([i for i, _ in paper], [v for _, v in paper], marker="o", color="C3", label="paper", zorder=3)
    ax.set_xticks(list(x), [r["label"] for r in rows], rotation=20, ha="right", fontsize="small")
    ax.set_ylabel("iteration time (s)")
    ax.set_title(table["title"], fontsize="medium")
    ax.legend(fontsize="small")
    if queue:
        ax = axes[0][1]
        for i, r in enumerate(rows):
            path = run_dir / _slug(r["label"]) / "queue.jsonl"
            if path.is_file():
                pts = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                ax.step([p["time"] for p in pts], [p["queued"] for p in pts], where="post", linewidth=0.8,
                        color=f"C{i}", label=r["label"])
        ax.set_xlabel("simulated seconds")
        ax.set_ylabel("queued samples")
        ax.set_title("Training Queue occupancy")
        ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(plt, fig, out)


if __name__ == "__main__":
    raise SystemExit(main())
