"""The layout planner: which T/G split, instance size, staleness bound and minibatch size
make a cluster fastest, found by simulating each candidate (``asp-plan-layout``).

Everything but the model, the hardware, the cluster size, the batch geometry (``rl.*``)
and the length distribution (``sim.*``) is swept:

* the node split ``train_nodes + gen_nodes = nodes``, both >= 1;
* the inference instance size: the divisors of ``devices_per_node`` whose devices hold
  the weights and one whole sequence (``costs.kv_capacity_tokens``; the others are
  skipped with its message). The model's inference parallelism follows the size: the
  ``model.infer_*_parallel_size`` that spans the configured instance spans the new one
  (Qwen3-30B-A3B: EP, Qwen3-32B: TP);
* ``mode.max_staleness`` and ``scheduler.base_batch_size``, with the other scheduler and
  queue keys derived as the table3 presets derive them (:func:`asp_candidate`);

plus the MindSpeed-RL hybrid layout as a reference row (:func:`hybrid_candidate`). A
candidate the config validation or the control core refuses is kept as a
:class:`Skipped` row with the reason. Each candidate is a list of Hydra overrides, so the
winner is printed as a command line that ``asp-train`` loads as it is.

Two stages keep a paper-scale sweep under a minute: every candidate is screened at a few
steps, then the best few (and the reference) are simulated again at the run's full
``steps`` and ranked once more; the best of those is the answer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional, Sequence

SCREEN_STEPS = 10       # steps per candidate in the screening stage
CONFIRM_TOP = 5         # candidates simulated again at the run's full steps
STALENESS_BOUNDS = (1, 2, 3, 4)
INFER_PARALLEL_KEYS = ("infer_tensor_parallel_size", "infer_expert_parallel_size", "infer_pipeline_parallel_size")


class PlannerError(ValueError):
    """A sweep that cannot be made; the message names the value and what to change."""


# ----------------------------------------------------------------------- candidates
@dataclass(frozen=True)
class Candidate:
    """One point of the grid, as the overrides that select it."""

    mode: str                       # async | hybrid
    scheduler: str                  # asp (async) | fifo (the hybrid reference)
    train_nodes: int
    gen_nodes: int
    infer_instance_size: int
    num_instances: int              # generation instances (actors)
    max_staleness: int
    base_batch_size: int
    slack: int
    group_size: int
    queue_capacity: int
    inference_parallel: tuple[tuple[str, int], ...] = ()   # model.infer_* keys that follow the size

    @property
    def layout_label(self) -> str:
        split = "hybrid" if self.mode == "hybrid" else f"t{self.train_nodes}g{self.gen_nodes}"
        return f"{split} i{self.infer_instance_size}"

    @property
    def label(self) -> str:
        if self.mode == "hybrid":
            return f"{self.layout_label} b{self.base_batch_size}"
        return f"{self.layout_label} s{self.max_staleness} b{self.base_batch_size}"

    @property
    def group_overrides(self) -> tuple[str, ...]:
        """Config-group choices; they pick the base config the keys are merged onto."""
        return (f"mode={self.mode}", f"scheduler={self.scheduler}")

    @property
    def settings(self) -> tuple[tuple[str, int], ...]:
        """(dotted config key, value) for every key the candidate sets."""
        return (("layout.train_nodes", self.train_nodes), ("layout.gen_nodes", self.gen_nodes),
                ("layout.infer_instance_size", self.infer_instance_size),
                *((f"model.{key}", value) for key, value in self.inference_parallel),
                ("mode.max_staleness", self.max_staleness), ("mode.queue_capacity", self.queue_capacity),
                ("scheduler.base_batch_size", self.base_batch_size), ("scheduler.slack", self.slack),
                ("scheduler.group_size", self.group_size))

    @property
    def key_overrides(self) -> tuple[str, ...]:
        return tuple(f"{key}={value}" for key, value in self.settings)

    @property
    def overrides(self) -> tuple[str, ...]:
        return self.group_overrides + self.key_overrides


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def default_base_sizes(global_batch_size: int) -> list[int]:
    """Divisors of the step from an eighth to a half of it (at least 2 prompts): a step is
    a whole number of base-size minibatches, at least two, so its samples arrive over
    time, and at most eight, since smaller minibatches leave an instance's running batch
    short (on Qwen3-30B-A3B's paper geometry base 2's best run took 1.8 x the best
    one's iteration time); 32-prompt steps get 4, 8, 16."""
    low = max(2, global_batch_size // 8)
    sizes = [d for d in divisors(global_batch_size) if low <= d <= global_batch_size // 2]
    return sizes or [global_batch_size]


def slack_for(base_batch_size: int) -> int:
    """The float window of asp's sizes: 2 prompts as in the table3 presets, less for tiny
    bases (the validation needs slack < base)."""
    return min(2, base_batch_size - 1)


def queue_capacity_for(global_batch_size: int, group_size: int, base_batch_size: int, slack: int,
                       n_samples_per_prompt: int) -> int:
    """Samples: one step plus one dispatch group at the largest size asp may cut, as the
    table3 presets size it, so the trainer finds a whole step queued while every actor
    still has a minibatch in flight."""
    return (global_batch_size + group_size * (base_batch_size + slack)) * n_samples_per_prompt


def inference_parallel_for(model: Mapping[str, int], configured_size: int, size: int) -> tuple[tuple[str, int], ...]:
    """The ``model.infer_*_parallel_size`` keys to set for an instance of ``size`` devices:
    each one that spans the configured instance (equal to its size, above 1) spans the new
    one. Keys that span less stay; the validation then says if they do not divide."""
    return tuple((key, size) for key in INFER_PARALLEL_KEYS
                 if model[key] == configured_size > 1 and size != configured_size)


def asp_candidate(nodes: int, devices_per_node: int, train_nodes: int, size: int, max_staleness: int,
                  base_batch_size: int, global_batch_size: int, n_samples_per_prompt: int,
                  inference_parallel: tuple[tuple[str, int], ...] = ()) -> Candidate:
    """An async ASP candidate: one dispatch group is one minibatch per instance."""
    gen_nodes = nodes - train_nodes
    instances = gen_nodes * devices_per_node // size
    slack = slack_for(base_batch_size)
    return Candidate("async", "asp", train_nodes, gen_nodes, size, instances, max_staleness, base_batch_size, slack,
                     instances, queue_capacity_for(global_batch_size, instances, base_batch_size, slack,
                                                   n_samples_per_prompt), inference_parallel)


def hybrid_candidate(nodes: int, devices_per_node: int, size: int, global_batch_size: int, n_samples_per_prompt: int,
                     inference_parallel: tuple[tuple[str, int], ...] = ()) -> Candidate:
    """MindSpeed-RL's colocated mode as the table3 hybrid presets run it: every node
    trains and generates, the step split evenly over the instances (fifo, no slack), a
    queue of exactly one step."""
    instances = nodes * devices_per_node // size
    base = max(1, global_batch_size // instances)
    return Candidate("hybrid", "fifo", nodes, nodes, size, instances, 0, base, 0, 1,
                     global_batch_size * n_samples_per_prompt, inference_parallel)


def candidate_grid(nodes: int, devices_per_node: int, instance_sizes: Sequence[int], global_batch_size: int,
                   n_samples_per_prompt: int, staleness_bounds: Sequence[int] = STALENESS_BOUNDS,
                   base_sizes: Optional[Sequence[int]] = None,
                   inference_parallel: Callable[[int], tuple[tuple[str, int], ...]] = lambda size: (),
                   ) -> list[Candidate]:
    """Every async candidate of the cluster, in grid order (split, size, staleness, base).
    ``inference_parallel(size)`` gives the model keys an instance size needs."""
    if nodes < 2:
        raise PlannerError(f"layout.nodes={nodes}: an async layout needs one T and one G node; give "
                           f"layout.nodes >= 2")
    bases = list(base_sizes) if base_sizes else default_base_sizes(global_batch_size)
    return [asp_candidate(nodes, devices_per_node, t, size, s, b, global_batch_size, n_samples_per_prompt,
                          inference_parallel(size))
            for t in range(1, nodes) for size in instance_sizes for s in staleness_bounds for b in bases]


# ----------------------------------------------------------------------- outcomes
@dataclass(frozen=True)
class Evaluated:
    """A simulated candidate and the figures the table shows."""

    candidate: Candidate
    steps: int
    iteration_s: float
    tokens_per_s_per_device: float
    generation_idle: float
    trainer_idle: float
    policy_age_mean: float
    lower_bound_s: float

    def to_dict(self) -> dict:
        return {"label": self.candidate.label, **_candidate_dict(self.candidate), "steps": self.steps,
                "iteration_s": self.iteration_s, "tokens_per_s_per_device": self.tokens_per_s_per_device,
                "generation_idle": self.generation_idle, "trainer_idle": self.trainer_idle,
                "policy_age_mean": self.policy_age_mean, "lower_bound_s": self.lower_bound_s,
                "overrides": list(self.candidate.overrides)}


@dataclass(frozen=True)
class Skipped:
    candidate: Candidate
    reason: str

    def to_dict(self) -> dict:
        return {"label": self.candidate.label, **_candidate_dict(self.candidate), "reason": self.reason,
                "overrides": list(self.candidate.overrides)}


def _candidate_dict(c: Candidate) -> dict:
    return {"mode": c.mode, "scheduler": c.scheduler, "train_nodes": c.train_nodes, "gen_nodes": c.gen_nodes,
            "infer_instance_size": c.infer_instance_size, "num_instances": c.num_instances,
            "max_staleness": c.max_staleness, "base_batch_size": c.base_batch_size, "slack": c.slack,
            "group_size": c.group_size, "queue_capacity": c.queue_capacity}


def from_result(candidate: Candidate, result) -> Evaluated:
    """The table's figures from a ``sim.run.SimResult``."""
    return Evaluated(candidate, result.steps, result.iteration_s, result.tokens_per_s_per_device,
                     result.generation_idle, result.trainer_idle, result.policy_age_mean, result.lower_bound_s)


def rank(rows: Iterable[Evaluated]) -> list[Evaluated]:
    """Fastest iteration first. Equal times (a bound that does not bind gives the same
    run) go to the fresher policy, then the smaller staleness bound and queue (less
    memory, the same speed), then the label, so the order is total and repeatable."""
    return sorted(rows, key=lambda r: (r.iteration_s, r.policy_age_mean, r.candidate.max_staleness,
                                       r.candidate.queue_capacity, r.candidate.label))


def best_async(ranked: Sequence[Evaluated], top: int) -> list[Evaluated]:
    return [r for r in ranked if r.candidate.mode == "async"][:top]


# ----------------------------------------------------------------------- evaluation
def feasible_instance_sizes(cfg) -> tuple[list[int], list[str]]:
    """(divisors of ``layout.devices_per_node`` whose instance holds the model, one note
    per size that does not: ``costs.kv_capacity_tokens``'s message)."""
    from .costs import kv_capacity_tokens
    from .profiles import ProfileError, engine_profile_from_config, hardware_profile_from_config, \
        model_profile_from_config

    model = model_profile_from_config(cfg.model)
    hardware = hardware_profile_from_config(cfg.hardware)
    engine = engine_profile_from_config(cfg.engine)
    sequence = cfg.rl.max_prompt_length + cfg.generate.sampling_config.max_tokens
    sizes, notes = [], []
    for size in divisors(cfg.layout.devices_per_node):
        try:
            kv_capacity_tokens(model, hardware, engine, size, sequence)
        except ProfileError as error:
            notes.append(f"skipped {error}")
            continue
        sizes.append(size)
    return sizes, notes


class ConfigWorkspace:
    """One private copy of a base config that candidates are written into in turn.

    Merging overrides onto a fresh copy costs about 11 ms per candidate, setting a dozen
    keys in place under 1 ms, which matters over hundreds of candidates. Keys the last
    candidate set and this one does not are put back to the base's value first, so a
    candidate never inherits another's settings."""

    def __init__(self, base) -> None:
        import copy

        self.base = base
        self.cfg = copy.deepcopy(base)
        self._touched: set[str] = set()

    def apply(self, settings: Sequence[tuple[str, object]]):
        from omegaconf import OmegaConf

        wanted = dict(settings)
        for key in self._touched - wanted.keys():
            OmegaConf.update(self.cfg, key, OmegaConf.select(self.base, key), merge=False)
        self._touched = set(wanted)    # before the updates: one that fails is undone next time
        for key, value in wanted.items():
            OmegaConf.update(self.cfg, key, value, merge=False)
        return self.cfg


def candidate_config(workspace: ConfigWorkspace, candidate: Candidate, steps: int):
    """The workspace's base (composed with the candidate's group overrides) with its key
    overrides and ``steps``, validated as ``load_config`` validates. Raises ``ConfigError``."""
    from ..config.load import to_dataclass
    from ..config.validate import validate_config

    cfg = workspace.apply([*candidate.settings, ("steps", steps)])
    validate_config(to_dataclass(cfg), local_install=False)   # a simulated cluster: nothing installed here counts
    return cfg


def evaluate(workspaces: Mapping[str, ConfigWorkspace], candidate: Candidate, steps: int,
             workload=None) -> Evaluated | Skipped:
    """Simulate one candidate on the workspace of its mode; what the validation, the
    profiles, the planner or the control core refuse is a :class:`Skipped` with the reason."""
    from ..config.validate import ConfigError
    from ..schedule.partition import ScheduleError
    from .profiles import ProfileError
    from .run import simulate

    try:
        cfg = candidate_config(workspaces[candidate.mode], candidate, steps)
        return from_result(candidate, simulate(cfg, workload=workload))
    except (ConfigError, ProfileError, ScheduleError, ValueError) as error:
        # ValueError: the control core's own config check (control.core.ControlConfig,
        # raised by make_control_core before it wraps the core's refusals).
        return Skipped(candidate, " ".join(str(error).split()))


@dataclass
class Plan:
    """The outcome of a sweep: both stages, what was skipped and why, and the answer."""

    screened: list[Evaluated]                  # ranked, at screen_steps
    confirmed: list[Evaluated]                 # ranked, at confirm_steps
    skipped: list[Skipped]
    notes: list[str]
    screen_steps: int
    confirm_steps: int
    seconds: float = 0.0
    base_overrides: list[str] = field(default_factory=list)

    @property
    def best(self) -> Evaluated:
        return self.confirmed[0]

    def best_overrides(self) -> list[str]:
        return [*self.base_overrides, *self.best.candidate.overrides]

    def to_dict(self) -> dict:
        return {"screen_steps": self.screen_steps, "confirm_steps": self.confirm_steps, "seconds": self.seconds,
                "notes": self.notes, "best": {"label": self.best.candidate.label, "overrides": self.best_overrides(),
                                              "command": command_line(self.best_overrides())},
                "confirmed": [r.to_dict() for r in self.confirmed],
                "screened": [r.to_dict() for r in self.screened],
                "skipped": [s.to_dict() for s in self.skipped], "base_overrides": self.base_overrides}


def plan_layout(bases: Mapping[str, object], candidates: Sequence[Candidate], reference: Optional[Candidate],
                screen_steps: int, confirm_steps: int, top: int = CONFIRM_TOP, workload=None,
                notes: Sequence[str] = (), progress: Callable[[int, int, Evaluated | Skipped], None] = None,
                ) -> Plan:
    """Screen every candidate (and the reference) at ``screen_steps``, simulate the best
    ``top`` and the reference again at ``confirm_steps``, rank both stages. ``bases``
    maps a mode to its composed config; ``workload`` is shared by every run (one draw of
    the length model, so candidates differ only in the layout)."""
    workspaces = {mode: ConfigWorkspace(base) for mode, base in bases.items()}
    pool = [*candidates, *([reference] if reference else [])]
    evaluated, skipped = [], []
    for i, candidate in enumerate(pool):
        outcome = evaluate(workspaces, candidate, screen_steps, workload)
        (evaluated if isinstance(outcome, Evaluated) else skipped).append(outcome)
        if progress:
            progress(i + 1, len(pool), outcome)
    screened = rank(evaluated)
    if not screened:
        reasons = sorted({s.reason for s in skipped})
        raise PlannerError("no candidate layout can run; the reasons: " + " | ".join(reasons[:5]))
    notes = list(notes)
    if confirm_steps == screen_steps:
        confirmed = screened
    else:
        finalists = best_async(screened, top) + [r for r in screened if r.candidate.mode == "hybrid"]
        confirmed = rank(_confirm(workspaces, finalists, confirm_steps, workload, skipped))
        notes.append(f"screened {len(pool)} candidates at steps={screen_steps} to keep the sweep short; the best "
                     f"{min(top, len(best_async(screened, top)))} and the hybrid reference simulated again at "
                     f"steps={confirm_steps} and ranked again (the answer is the best of those)")
        if not confirmed:
            confirmed = screened
    notes += edge_notes(confirmed[0].candidate, candidates)
    return Plan(screened, confirmed, skipped, notes, screen_steps, confirm_steps)


def edge_notes(best: Candidate, candidates: Sequence[Candidate]) -> list[str]:
    """Where the winner sits on the grid's largest staleness bound or base size, the
    optimum may lie beyond the grid: say so, with the flag that widens it."""
    if best.mode != "async":
        return []
    grid = [c for c in candidates if c.mode == "async"]
    notes = []
    if grid and best.max_staleness == max(c.max_staleness for c in grid):
        notes.append(f"the best has the grid's largest mode.max_staleness={best.max_staleness} (mean policy age "
                     f"rises with it); --staleness 1,...,{best.max_staleness + 2} looks further, a smaller list "
                     f"caps the age")
    if grid and best.base_batch_size == max(c.base_batch_size for c in grid):
        notes.append(f"the best has the grid's largest scheduler.base_batch_size={best.base_batch_size}; "
                     f"--base-sizes with larger values looks further")
    return notes


def _confirm(workspaces, finalists: Sequence[Evaluated], steps: int, workload, skipped: list) -> list[Evaluated]:
    out = []
    for row in finalists:
        outcome = evaluate(workspaces, row.candidate, steps, workload)
        if isinstance(outcome, Evaluated):
            out.append(outcome)
        else:
            skipped.append(outcome)
    return out


# ----------------------------------------------------------------------- trust
# How far the planner trusts its answer: the simulated / measured error of the validation
# cases nearest to the plan (configs/validation/cases.yaml, docs/validation.md), per scope.
# Nearness counts what a case shares with the plan, weighted by how much of the cost
# models it carries: the hardware profile most, then the model family, then the engine's
# execution (eager / graph).
TRUST_KEYS = (("hardware", 4), ("model family", 2), ("execution", 1))


@dataclass(frozen=True)
class CaseKeys:
    """What a validation case shares or not with a plan."""

    id: str
    scope: str
    target: float
    keys: Mapping[str, str]           # TRUST_KEYS name -> value


def match_score(case: Mapping[str, str], plan: Mapping[str, str]) -> int:
    return sum(weight for key, weight in TRUST_KEYS if case.get(key) and case.get(key) == plan.get(key))


def nearest_cases(cases: Sequence[CaseKeys], plan: Mapping[str, str]) -> dict[str, list[CaseKeys]]:
    """Per scope, the cases with the highest positive match score (none: the scope is
    absent); cases in their file's order."""
    out: dict[str, list[CaseKeys]] = {}
    for scope in dict.fromkeys(c.scope for c in cases):
        scored = [(match_score(c.keys, plan), c) for c in cases if c.scope == scope]
        best = max((score for score, _ in scored), default=0)
        if best > 0:
            out[scope] = [c for score, c in scored if score == best]
    return out


def trust_lines(plan: Mapping[str, str], nearest: Mapping[str, Sequence[CaseKeys]],
                errors: Mapping[str, float], scopes: Sequence[str] = ("end_to_end", "micro")) -> list[str]:
    """One line per scope: which cases are nearest and what they share with the plan, the
    range of their errors, and how many meet their target; or that none shares anything."""
    what = ", ".join(f"{key} {plan.get(key)}" for key, _ in TRUST_KEYS)
    lines = []
    for scope in scopes:
        cases = nearest.get(scope, [])
        if not cases:
            lines.append(f"trust ({scope}): no validation case shares the plan's {what}: this scope is unvalidated")
            continue
        shared = [key for key, _ in TRUST_KEYS if cases[0].keys.get(key) == plan.get(key)]
        errs = [errors[c.id] for c in cases]
        within = sum(abs(errors[c.id]) <= c.target for c in cases)
        lines.append(f"trust ({scope}, nearest by {' + '.join(shared)}: {', '.join(c.id for c in cases)}): "
                     f"simulated / measured - 1 from {min(errs):+.0%} to {max(errs):+.0%}, {within} of {len(cases)} "
                     f"within the {cases[0].target:.0%} target")
    return lines


def plan_keys(cfg) -> dict[str, str]:
    return {"hardware": str(cfg.hardware.name), "model family": str(cfg.model.family),
            "execution": str(cfg.engine.execution)}


def validation_trust(cfg, cases_file=None) -> list[str]:
    """The trust lines of a plan's config: the validation cases (kind validation) of
    ``cases_file`` (the shipped table by default), the nearest per scope simulated."""
    import yaml

    from ..config.load import config_dir, load_config
    from .studies import load_cases, simulate_case

    path = cases_file or config_dir() / "validation" / "cases.yaml"
    cases = [c for c in load_cases(yaml.safe_load(open(path).read()) or {}) if c.kind == "validation"]
    keyed = []
    for case in cases:
        case_cfg = load_config(list(case.overrides), local_install=False)
        keyed.append(CaseKeys(case.id, case.scope, case.target, plan_keys(case_cfg)))
    plan = plan_keys(cfg)
    nearest = nearest_cases(keyed, plan)
    by_id = {c.id: c for c in cases}
    errors = {k.id: simulate_case(by_id[k.id]) / by_id[k.id].measured - 1.0
              for group in nearest.values() for k in group}
    return trust_lines(plan, nearest, errors)


# ----------------------------------------------------------------------- output
TABLE_COLUMNS = ("rank", "layout", "inst x n", "stale", "base+slack", "queue", "iter s", "tok/s/dev", "gen idle",
                 "train idle", "age", "bound s")


def table_row(position: int, r: Evaluated) -> tuple[str, ...]:
    c = r.candidate
    layout = f"hybrid {c.train_nodes}" if c.mode == "hybrid" else f"T{c.train_nodes}+G{c.gen_nodes}"
    return (str(position), layout, f"{c.infer_instance_size} x {c.num_instances}", str(c.max_staleness),
            f"{c.base_batch_size}+{c.slack}", str(c.queue_capacity), f"{r.iteration_s:.1f}",
            f"{r.tokens_per_s_per_device:.1f}", f"{r.generation_idle:.3f}", f"{r.trainer_idle:.3f}",
            f"{r.policy_age_mean:.2f}", f"{r.lower_bound_s:.1f}")


def format_table(ranked: Sequence[Evaluated], limit: Optional[int] = None) -> str:
    """A markdown table of the ranked rows (the first ``limit``, and the hybrid reference
    wherever it ranks, so the comparison is always on the page)."""
    shown = [(i + 1, r) for i, r in enumerate(ranked)
             if limit is None or i < limit or r.candidate.mode == "hybrid"]
    rows = [TABLE_COLUMNS] + [table_row(i, r) for i, r in shown]
    widths = [max(len(row[k]) for row in rows) for k in range(len(TABLE_COLUMNS))]

    def line(cells):
        return "| " + " | ".join(cell.rjust(w) for cell, w in zip(cells, widths)) + " |"

    return "\n".join([line(rows[0]), "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|",
                      *(line(r) for r in rows[1:])])


def summarize_skipped(skipped: Sequence[Skipped]) -> list[str]:
    """One line per distinct reason: how many candidates, which layouts."""
    by_reason: dict[str, list[str]] = {}
    for s in skipped:
        by_reason.setdefault(s.reason, []).append(s.candidate.layout_label)
    lines = []
    for reason, labels in by_reason.items():
        layouts = ", ".join(dict.fromkeys(labels))
        lines.append(f"skipped {len(labels)} candidate(s) ({layouts}): {reason}")
    return lines


def command_line(overrides: Sequence[str], program: str = "asp-train") -> str:
    import shlex

    return " ".join([program, *map(shlex.quote, overrides)])

