"""Validate the simulator against real runs: predicted vs measured iteration time and tokens/s per mode.

The three modes of ``benchmarks/bench_modes.py`` at its geometry (40 steps x 8 prompts x
4 samples, ``task.num_prompts=320``, layout ``local``, engine ``hf``), simulated with
``hardware=cpu_local`` (calibrated by ``scripts/calibrate_cpu.py``) and compared with
real runs::

    # re-read the run directories of `bench_modes.py --repeats 1 --keep runs/validate_modes`
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/validate_sim.py --measured runs/validate_modes
    # or make the real runs first (one repeat per seed, ~3 min per seed on 2 idle cores), then compare
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/validate_sim.py --run runs/validate_modes --seeds 0,1

With ``--run`` the script also samples the CPU time of the runs' processes (by role:
generation actors, trainer, driver, Ray's own processes) and of the whole machine while
each run's loop runs, and prints what the run used and what other jobs took: on a
shared machine the measured wall times include waiting for a core, which the simulator
(calibrated on CPU time, ``scripts/calibrate_cpu.py``) does not model. The runs' Ray
workers get ``--worker-niceness`` (default 0, as the other jobs; Ray's own default of 15
lets any other job starve them).

What the simulator is given, per mode, so that it sees what the real run saw:

* **the workload the real run produced**: every generation span of the run's
  ``timeline.jsonl`` carries its minibatch id, its response tokens and its longest
  response; the minibatch's prompts come from the run's plan, rebuilt with the runtime's
  own planning (``schedule/planning.plan_run``) and checked against the run's
  ``plan.json``. Each prompt's n
  response lengths are rebuilt from those: the first row of the minibatch gets the
  longest length, the other rows share the rest evenly. Static batching (``engine.batching:
  static``) prices a minibatch by its rows, its longest response and its padded prompt,
  so the simulated minibatch costs what the real one's lengths cost, and a run's
  trained tokens are the real total. Prompts the run never generated (cancelled at the
  finish) get their reference length. Prompt lengths: the prompts' token counts under
  the policy's tokenizer. The file is written beside the report
  (``<out>/<mode>-seed<s>.lengths.jsonl``, the ``sim.lengths_file`` format) and read back
  with ``sim/workload.replay_workload``.
* **the real predictor**: ``scheduler.predictor=reference`` plans the real run from the
  maze reference-solution lengths (``schedule/configured.task_items``). The simulated
  planner is handed exactly those predictions (not a rank quality of the replayed
  lengths), so it builds the same plan; the script checks that the simulated
  ``plan.json`` equals the real one minibatch for minibatch and stops if it does not.

Measured figures, from each run directory with the benchmark's own reader
(``bench_modes.read_run``): iteration time = mean ``iteration_time_s``; tokens/s = all
generated response tokens / ``wall_time_s`` (the Control Unit's loop). The simulated
figures come from the simulated run's ``metrics.jsonl`` the same way (the real
``RunRecorder`` writes both). A second table splits the time: generation busy seconds
(all actors), train-step seconds, weight publish and load seconds, and the median
real/simulated ratio of the same minibatch's duration and of the same step's train time.

"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_modes  # noqa: E402  (benchmarks/bench_modes.py: MODES, read_run, run_one)

TARGET = 0.15


def log(msg: str) -> None:
    print(f"[validate_sim {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def common_overrides(steps: int, prompts: int) -> list[str]:
    """The overrides bench_modes gives every run."""
    return [f"steps={steps}", f"task.num_prompts={prompts}", "eval.num_prompts=0", "eval.save_final_policy=false"]


# ---------------------------------------------------------------------- real runs
class CpuSampler:
    """Samples, every ``interval`` s, the CPU seconds of this process's descendants (the
    Ray cluster it started: its Generation and Training workers, raylet, ...) and of the
    whole machine (``/proc/stat``), so that a run's CPU time can be split into its roles
    and the other jobs on a shared machine. Samples: (time, {pid: (role, cpu s)}, machine busy s)."""

    def __init__(self, interval: float = 0.5) -> None:
        import threading

        self.interval = interval
        self.samples: list[tuple[float, dict, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def role(cmdline: str) -> str:
        for key, name in (("TrainingWorker", "trainer"), ("GenerationWorker", "generators")):
            if key in cmdline:
                return name
        return "ray system"

    @staticmethod
    def machine_busy() -> tuple[float, float]:
        """(busy, stolen) CPU seconds of the whole machine so far: busy excludes idle, iowait
        and steal; steal is the time a virtual machine's cores were running someone else."""
        fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle, steal = fields[3] + fields[4], fields[7]
        tick = os.sysconf("SC_CLK_TCK")
        return (sum(fields[:8]) - idle - steal) / tick, steal / tick

    def _loop(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            t = time.time()
            procs = {}
            for proc in [me] + me.children(recursive=True):
                try:
                    cpu = proc.cpu_times()
                    role = "driver" if proc.pid == me.pid else self.role(" ".join(proc.cmdline()))
                    procs[proc.pid] = (role, cpu.user + cpu.system)
                except Exception:  # noqa: BLE001 - a process may end between listing and reading
                    continue
            self.samples.append((t, procs, self.machine_busy()))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False

    def window(self, start: float, end: float) -> dict:
        """CPU seconds per role and of the whole machine between the samples nearest
        ``start`` and ``end`` (a process seen only inside the window counts from its first sample)."""
        inside = [x for x in self.samples if start <= x[0] <= end]
        if len(inside) < 2:
            return {}
        first: dict[int, tuple[str, float]] = {}
        last: dict[int, tuple[str, float]] = {}
        for _, procs, _ in inside:
            for pid, value in procs.items():
                first.setdefault(pid, value)
                last[pid] = value
        roles: dict[str, float] = {}
        for pid, (role, cpu) in last.items():
            roles[role] = roles.get(role, 0.0) + cpu - first[pid][1]
        roles["run total"] = sum(roles.values())
        roles["machine"] = inside[-1][2][0] - inside[0][2][0]
        roles["stolen"] = inside[-1][2][1] - inside[0][2][1]
        roles["other jobs"] = roles["machine"] - roles["run total"]
        roles["seconds"] = inside[-1][0] - inside[0][0]
        return roles


def make_runs(root: Path, steps: int, prompts: int, seeds: list[int], niceness: int) -> None:
    """One repeat of bench_modes' three modes per seed (its order, one Ray cluster, its run
    function), with this process's descendants' CPU time sampled (``cpu.json``, keyed
    ``<mode>-seed<s>``)."""
    os.environ["RAY_worker_niceness"] = str(niceness)
    import ray

    root.mkdir(parents=True, exist_ok=True)
    info = {}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        with CpuSampler() as sampler:
            for seed in seeds:
                for name, extra in bench_modes.MODES:
                    load = os.getloadavg()[0]
                    log(f"real run {name}, seed {seed}, load {load:.1f}")
                    run_dir = bench_modes.run_one(common_overrides(steps, prompts) + extra + [f"seed={seed}"], root,
                                                  f"{name}-seed{seed}")
                    _, _, spans = bench_modes.read_run(run_dir)
                    start, end = min(x["start"] for x in spans), max(x["end"] for x in spans)
                    info[f"{name}-seed{seed}"] = {"load_average": load, "worker_niceness": niceness,
                                                  "window": [start, end]}
            time.sleep(2 * sampler.interval)
        for name, value in info.items():
            value["cpu_s"] = sampler.window(*value["window"])
    finally:
        ray.shutdown()
    (root / "cpu.json").write_text(json.dumps(info, indent=2) + "\n")


def measured_figures(run_dir: Path) -> dict:
    metrics, summary, spans = bench_modes.read_run(run_dir)
    return figures(metrics, summary["wall_time_s"], spans)


def figures(metrics: list[dict], wall: float, spans: list[dict]) -> dict:
    def busy(kind):
        return sum(s["end"] - s["start"] for s in spans if s["kind"] == kind)

    return {
        "steps": len(metrics),
        "iteration_s": statistics.fmean(m["iteration_time_s"] for m in metrics),
        "tokens_per_s": sum(m["generated_tokens"] for m in metrics) / wall,
        "wall_s": wall,
        "gen_busy_s": busy("generate"), "train_s": busy("train"), "publish_s": busy("publish"),
        "load_s": sum(s["info"].get("round_trip_s", s["end"] - s["start"]) for s in spans
                      if s["kind"] == "load_weights"),
        "gen_idle": sum(m["generation_idle_fraction"] * m["iteration_time_s"] for m in metrics) / max(
            sum(m["iteration_time_s"] for m in metrics), 1e-12),
        "trainer_idle": sum(m["trainer_idle_fraction"] * m["iteration_time_s"] for m in metrics) / max(
            sum(m["iteration_time_s"] for m in metrics), 1e-12),
        "minibatch_s": {s["label"]: s["end"] - s["start"] for s in spans if s["kind"] == "generate"},
        "step_train_s": {s["label"]: s["end"] - s["start"] for s in spans if s["kind"] == "train"},
    }


# ---------------------------------------------------------------------- workload
def plan_ids(path: Path) -> list[list[str]]:
    """The minibatches of a saved ``plan.json``, as lists of prompt ids."""
    plan = json.loads(path.read_text())
    return [mb["ids"] for group in plan["groups"] for mb in group]


def run_minibatches(cfg, prompts, run_dir: Path) -> dict[str, list[str]]:
    """minibatch id -> prompt ids as the real run dispatched them: its plan rebuilt with the
    runtime's own planning (``schedule/planning.plan_run``), checked against its plan.json."""
    from mindspeed_rl_asp.schedule.planning import plan_run

    plan, _, minibatches = plan_run(cfg, prompts)
    if [list(mb.ids) for mb in plan.minibatches()] != plan_ids(run_dir / "plan.json"):
        raise SystemExit(f"{run_dir}/plan.json is not the plan this config makes; was the run made with "
                         "bench_modes' overrides and this seed?")
    return {mb_id: list(ids) for mb_id, ids in minibatches}


def workload_file(run_dir: Path, cfg, prompts, prompt_tokens: dict[str, int], reference: dict[str, float],
                  out: Path) -> tuple[Path, dict]:
    """Per prompt the n response lengths the real run produced (see the module docstring)."""
    n = cfg.rl.n_samples_per_prompt
    members = run_minibatches(cfg, prompts, run_dir)
    _, _, spans = bench_modes.read_run(run_dir)
    lengths: dict[str, list[int]] = {}
    for s in spans:
        if s["kind"] != "generate":
            continue
        ids = members[s["label"]]
        rows, total, longest = len(ids) * n, s["info"]["tokens"], s["info"]["max_length"]
        rest = total - longest
        share, extra = (divmod(rest, rows - 1) if rows > 1 else (0, 0))
        row_lengths = [longest] + [share + (1 if k < extra else 0) for k in range(rows - 1)]
        if min(row_lengths) < 1 or max(row_lengths) > longest:
            raise ValueError(f"{run_dir}: minibatch {s['label']} ({rows} rows, {total} tokens, longest {longest}) "
                             "cannot be split into rows of 1..longest tokens")
        for k, pid in enumerate(ids):
            lengths[pid] = row_lengths[k * n:(k + 1) * n]
    missing = [p.id for p in prompts if p.id not in lengths]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for p in prompts:
            rec = lengths.get(p.id) or [max(1, round(reference[p.id]))] * n
            f.write(json.dumps({"id": p.id, "lengths": rec, "prompt_length": prompt_tokens[p.id]}) + "\n")
    return out, {"generated_prompts": len(lengths), "reference_filled": len(missing),
                 "tokens": sum(sum(v) for v in lengths.values())}


# ---------------------------------------------------------------------- simulation
def simulate_as_planned(cfg, workload, reference: dict[str, float], run_dir: Path):
    """``sim.run.simulate`` with the planner handed the reference-solution lengths, as the
    real run's planner is (``same_plan`` checks the result)."""
    from mindspeed_rl_asp.sim import run as simrun

    return simrun.simulate(cfg, run_dir=run_dir, workload=workload,
                           predicted={p.id: reference[p.id] for p in workload.prompts})


def same_plan(real: Path, sim: Path) -> bool:
    return plan_ids(real) == plan_ids(sim)


def median_ratio(real: dict[str, float], sim: dict[str, float]) -> float | None:
    common = [k for k in real if k in sim and sim[k] > 0]
    return statistics.median(real[k] / sim[k] for k in common) if common else None


# ---------------------------------------------------------------------- report
def table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def pct(sim: float, real: float) -> str:
    return f"{100 * (sim - real) / real:+.1f}%"


def compare_one(args, root: Path, out: Path, name: str, extra: list[str], seed: int):
    """One mode and seed: the real run's figures, the simulated run's on its lengths, and the replay's counts."""
    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.config.validate import resolve_model_path
    from mindspeed_rl_asp.policy.tokenizer import load_tokenizer
    from mindspeed_rl_asp.schedule.configured import task_items
    from mindspeed_rl_asp.sim.workload import replay_workload
    from mindspeed_rl_asp.tasks import make_task_prompts

    run_dir = root / f"{name}-seed{seed}"
    if not (run_dir / "summary.json").exists():
        raise SystemExit(f"{run_dir}: no finished run there (summary.json missing); run bench_modes.py --keep "
                         f"{root} or use --run")
    cfg = load_config(common_overrides(args.steps, args.prompts) + extra + [f"seed={seed}", f"hardware={args.hardware}"])
    prompts = make_task_prompts(cfg.task)
    tokenizer = load_tokenizer(str(resolve_model_path(cfg.model.path)))
    prompt_tokens = {p.id: len(tokenizer(p.prompt, add_special_tokens=False)["input_ids"]) for p in prompts}
    reference = dict(task_items(cfg, prompts))
    lengths_path, info = workload_file(run_dir, cfg, prompts, prompt_tokens, reference,
                                       out / f"{name}-seed{seed}.lengths.jsonl")
    workload = replay_workload(lengths_path, n_samples_per_prompt=cfg.rl.n_samples_per_prompt,
                               max_tokens=cfg.generate.sampling_config.max_tokens)
    sim_dir = out / f"{name}-seed{seed}"
    real = measured_figures(run_dir)
    for stale in ("timeline.jsonl", "queue.jsonl", "metrics.jsonl"):
        (sim_dir / stale).unlink(missing_ok=True)
    result = simulate_as_planned(cfg, workload, reference, sim_dir)
    if not same_plan(run_dir / "plan.json", sim_dir / "plan.json"):
        raise SystemExit(f"{name}: the simulated plan differs from the real run's plan.json")
    sim_metrics = [json.loads(line) for line in (sim_dir / "metrics.jsonl").read_text().splitlines() if line]
    sim_spans = [json.loads(line) for line in (sim_dir / "timeline.jsonl").read_text().splitlines() if line]
    sim = figures(sim_metrics, result.total_s, sim_spans)
    log(f"{name} seed {seed}: measured {real['iteration_s']:.3f} s/iteration, simulated {sim['iteration_s']:.3f} "
        f"({info['generated_prompts']} prompts with real lengths, {info['reference_filled']} filled)")
    return real, sim, info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--measured", type=Path, help="bench_modes --keep directory (<mode>-seed<s>/ run directories)")
    src.add_argument("--run", type=Path, help="make one repeat of real runs into this directory first")
    ap.add_argument("--worker-niceness", type=int, default=0,
                    help="with --run: RAY_worker_niceness of the runs' actors (0: as other jobs; Ray's default 15 "
                         "lets any other job on a shared machine starve them)")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds: one real run per mode and seed (default 0)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=320)
    ap.add_argument("--out", type=Path, default=None,
                    help="where the replayed lengths and simulated runs go (default <measured>/sim)")
    ap.add_argument("--hardware", default="cpu_local", help="hardware profile (configs/hardware/)")
    ap.add_argument("--modes", default=",".join(name for name, _ in bench_modes.MODES),
                    help="with --measured: the modes to compare (default all three)")
    args = ap.parse_args(argv)

    from mindspeed_rl_asp.config.load import load_config

    root = args.measured or args.run
    seeds = [int(x) for x in args.seeds.split(",")]
    if args.run:
        make_runs(args.run, args.steps, args.prompts, seeds, args.worker_niceness)
    out = args.out or root / "sim"
    cpu_file = root / "cpu.json"
    cpu = json.loads(cpu_file.read_text()) if cpu_file.exists() else {}

    results = {}
    wanted = args.modes.split(",")
    for seed in seeds:
        for name, extra in [m for m in bench_modes.MODES if m[0] in wanted]:
            results[f"{name}-seed{seed}"] = compare_one(args, root, out, name, extra, seed)

    rows, worst = [], 0.0
    for name, (real, sim, _) in results.items():
        e_it = (sim["iteration_s"] - real["iteration_s"]) / real["iteration_s"]
        e_tok = (sim["tokens_per_s"] - real["tokens_per_s"]) / real["tokens_per_s"]
        worst = max(worst, abs(e_it), abs(e_tok))
        rows.append([f"`{name}`", f"{real['iteration_s']:.3f}", f"{sim['iteration_s']:.3f}", pct(sim["iteration_s"],
                    real["iteration_s"]), f"{real['tokens_per_s']:.0f}", f"{sim['tokens_per_s']:.0f}",
                     pct(sim["tokens_per_s"], real["tokens_per_s"])])
    main_table = table(["mode", "measured iteration s", "simulated", "error", "measured tokens/s", "simulated",
                        "error"], rows)
    rows = []
    for name, (real, sim, _) in results.items():
        mb = median_ratio(real["minibatch_s"], sim["minibatch_s"])
        tr = median_ratio(real["step_train_s"], sim["step_train_s"])
        rows.append([f"`{name}`", f"{real['gen_busy_s']:.1f} / {sim['gen_busy_s']:.1f}",
                     f"{mb:.2f}" if mb else "n/a",
                     f"{real['train_s']:.1f} / {sim['train_s']:.1f}", f"{tr:.2f}" if tr else "n/a",
                     f"{real['publish_s']:.2f} / {sim['publish_s']:.2f}", f"{real['load_s']:.2f} / {sim['load_s']:.2f}",
                     f"{real['gen_idle']:.2f} / {sim['gen_idle']:.2f}",
                     f"{real['trainer_idle']:.2f} / {sim['trainer_idle']:.2f}"])
    split = table(["mode", "generation busy s, real / sim", "minibatch duration real / sim (median)",
                   "train s, real / sim", "train step real / sim (median)", "publish s", "load s (round trips)",
                   "gen idle", "trainer idle"], rows)
    rows = []
    for name, (real, sim, _) in results.items():
        c = cpu.get(name, {}).get("cpu_s")
        if not c:
            continue
        wall = c["seconds"]
        gen, train = c.get("generators", 0.0), c.get("trainer", 0.0)
        sim_train = sim["train_s"] + sim["publish_s"]
        rows.append([f"`{name}`", f"{cpu[name]['load_average']:.1f}", f"{wall:.1f}",
                     f"{gen:.1f} / {sim['gen_busy_s'] + sim['load_s']:.1f}", f"{train:.1f} / {sim_train:.1f}",
                     f"{c.get('driver', 0):.1f}", f"{c.get('ray system', 0):.1f}",
                     f"{c['run total'] / wall:.2f}", f"{c['other jobs'] / wall:.2f}",
                     f"{c['machine'] / wall:.2f} of {os.cpu_count()}", f"{c.get('stolen', 0.0) / wall:.2f}"])
    cpu_table = table(["mode", "load average at start", "loop s",
                       "generation actors: CPU s / simulated span s (generate + load)",
                       "trainer: CPU s / simulated span s (train + publish)",
                       "driver CPU s", "Ray system CPU s", "cores the run used", "cores other jobs used",
                       "machine busy cores", "cores stolen (VM steal)"], rows) if rows else ""
    hw = load_config([f"hardware={args.hardware}"]).hardware
    print(f"Validation {time.strftime('%Y-%m-%d %H:%M')} (machine clock): `python scripts/validate_sim.py "
          f"{'--run' if args.run else '--measured'} {root}`; real runs: bench_modes geometry, {args.steps} steps x "
          f"8 prompts x 4 samples, task.num_prompts={args.prompts}, seeds {args.seeds}, layout local, engine hf; "
          f"simulated: hardware={args.hardware} ({hw.sources.get('training_mfu', '')[:60]}...), the real runs' "
          f"lengths, the reference predictor.\n")
    print(main_table + "\n")
    print(f"Largest error {100 * worst:.1f}% (target < {100 * TARGET:.0f}%).")
    for name, _ in bench_modes.MODES:
        errors = [(sim["iteration_s"] - real["iteration_s"]) / real["iteration_s"]
                  for key, (real, sim, _) in results.items() if key.rsplit("-seed", 1)[0] == name]
        if errors:
            print(f"- `{name}`: iteration-time error {', '.join(f'{100 * e:+.1f}%' for e in errors)} "
                  f"(mean {100 * statistics.fmean(errors):+.1f}%) over {len(errors)} seed(s)")
    print()
    print("**Where the time goes** (real / simulated)\n\n" + split)
    if cpu_table:
        print("\n**CPU time during each run's loop** (sampled every 0.5 s from /proc: this process's descendants "
              "by role, and the whole machine. A simulated span is wall time on the virtual clock: where work "
              "shares the host's cores it stretches beyond the CPU seconds the work takes, so the two columns "
              "agree only where nothing shares a core)\n\n" + cpu_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
