"""One assembly of a run, for the Ray driver (``runtime/driver.py``) and the simulator
(``sim/run.py``) alike, so both run the same planner, re-planner, checkpoint rule and
metrics:

    assemble_core       the control core (``schedule/planning.make_control_core``: the
                        config's rules, ``save_every``'s checkpoints, dynamic sampling's
                        refill) with the re-plan rule of ``scheduler.refit``
                        (:func:`replan_rule`, over the run's planner)
    assemble_observers  the observers every run has: the recorder
                        (``metrics/recorder.RunRecorder``: timeline, queue, metrics) and
                        the epoch report (``schedule/epoch_report.EpochReplanner``: the
                        re-plans the core made, the per-epoch predictor report)

Two functions, not one, because a run has two moments: the core is built before anything
is written (a resumed run checks everything first), the recorder once the cluster's clock
starts. Each shell then adds only observers of its own (Ray: the rejected payloads'
release, the first-generation phase; the simulator: its statistics).

Both take the lengths the first plan used (:class:`PlanLengths`): the runtime reads them
from its run directory (:func:`run_plan_lengths`), the simulator has them from its plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence


@dataclass(frozen=True)
class PlanLengths:
    """What the first plan was made from, for the re-plan rule's prior and the epoch
    report: base prompt id -> predicted length; the predictor that gave them (for the
    report: ``scheduler.predictor``, or ``simulated``); and why there are none (None when
    there are: then there is no re-plan, and the report says why)."""

    lengths: Mapping[str, float] = field(default_factory=dict)
    predictor: str = "reference"
    missing: Optional[str] = None


def run_plan_lengths(cfg, prompts, run_dir: Path) -> PlanLengths:
    """A real run's :class:`PlanLengths`: the task's reference lengths, or
    ``run_dir/predicted_lengths.jsonl`` that the predictor in the loop wrote; none for a
    run directory from before that file existed (resumed)."""
    from .configured import task_items
    from .length_profile import PREDICTED_LENGTHS
    from .plan import read_items_jsonl

    predictor = str(cfg.scheduler.predictor)
    lengths_file = Path(run_dir) / PREDICTED_LENGTHS
    if predictor == "reference":
        return PlanLengths(dict(task_items(cfg, prompts)), predictor)
    if lengths_file.is_file():
        return PlanLengths(dict(read_items_jsonl(lengths_file)), predictor)
    return PlanLengths({}, predictor, f"no {PREDICTED_LENGTHS} in the run directory: no refit, no rank correlation")


def replanned_epochs(run_dir: Path) -> set[int]:
    """The epochs a run's earlier segments re-planned: those with a ``plan_e<e>.json``
    (the epoch report writes one per accepted re-plan)."""
    return {int(p.stem[len("plan_e"):]) for p in Path(run_dir).glob("plan_e*.json")
            if p.stem[len("plan_e"):].isdigit()}


def refit_of(cfg) -> str:
    """``scheduler.refit`` (``none`` when the key is absent)."""
    return str(getattr(cfg.scheduler, "refit", "none"))


def replan_rule(cfg, plan: PlanLengths, taken: Sequence[str] = (), replanned: Iterable[int] = ()):
    """The core's re-plan rule (``schedule/refit.epoch_replan`` over the run's planner, the
    first plan's lengths as the prior), or None with ``scheduler.refit=none`` or without
    those lengths. Epochs it leaves alone: ``replanned`` (re-planned by earlier segments:
    the checkpoint's dispatch list holds their plan) and those of ``taken`` (a resumed
    run's ids trained before: started, so spoken for)."""
    from ..tasks import prompt_epoch
    from .configured import build_plan
    from .refit import epoch_replan

    if refit_of(cfg) == "none" or plan.missing is not None:
        return None
    done = set(replanned) | {prompt_epoch(p) for p in taken}
    return epoch_replan(lambda items: build_plan(cfg, items), plan.lengths,
                        float(getattr(cfg.scheduler, "refit_weight", 4.0)), done)


def assemble_core(cfg, minibatches, plan: PlanLengths, num_actors: int, start_version: int = 0,
                  taken: Sequence[str] = (), replanned: Iterable[int] = ()):
    """The run's control core over ``minibatches`` for ``num_actors`` generation actors,
    with :func:`replan_rule`. ``start_version``: a resumed run's checkpoint version, where
    its core starts; ``taken``: the prompt ids its earlier segments trained;
    ``replanned``: the epochs they re-planned (:func:`replanned_epochs`). A plan the rules
    cannot run is a ``ConfigError`` (``schedule/planning.make_control_core``)."""
    from .planning import make_control_core

    return make_control_core(cfg, minibatches, num_actors, start_version=start_version, taken=taken,
                             replan=replan_rule(cfg, plan, taken, replanned))


@dataclass
class RunObservers:
    """The observers every run has; :meth:`fanout` adds a shell's own."""

    recorder: Any                # metrics/recorder.RunRecorder
    epochs: Any                  # schedule/epoch_report.EpochReplanner

    def fanout(self, *shell_observers):
        """One observer for the loop: the recorder, the epoch report, then the shell's."""
        from ..control.loop import Fanout

        return Fanout(self.recorder, self.epochs, *shell_observers)

    def close(self) -> None:
        self.recorder.close()


def generation_devices(cfg) -> int:
    """The devices generation runs on, for tokens/s per device: every device of the
    layout when generation and training share them (``control.core.is_colocated``),
    else the G nodes'."""
    from ..control.core import is_colocated

    layout = cfg.layout
    nodes = layout.nodes if is_colocated(cfg.mode) else layout.gen_nodes
    return nodes * layout.devices_per_node


def assemble_observers(cfg, run_dir: Path, num_actors: int, plan: PlanLengths, start: float,
                       on_step: Callable[[dict], None] | None = None, tensorboard: bool = True,
                       segment: int = 0, elapsed_before: float = 0.0) -> RunObservers:
    """The recorder and the epoch report of a run writing into ``run_dir``, both on the
    cluster's clock from ``start``. ``on_step(metrics)`` after every step;
    ``tensorboard``: also TensorBoard event files (the simulator writes none);
    ``segment``: the version a resumed segment starts from; ``elapsed_before``: the
    seconds of the segments before it."""
    from ..metrics.recorder import RunRecorder
    from .epoch_report import EpochReplanner

    engine, sched = cfg.engine, cfg.scheduler
    recorder = RunRecorder(run_dir, num_actors, generation_devices(cfg), on_step, tensorboard=tensorboard,
                           start=start, engine=engine, segment=segment, elapsed_before=elapsed_before)
    describe = {"scheduler": sched.name, "predictor": plan.predictor, **({"note": plan.missing} if plan.missing else {})}
    epochs = EpochReplanner(run_dir, plan.lengths, cfg.rl.n_samples_per_prompt,
                            refit="none" if plan.missing else refit_of(cfg),
                            weight=float(getattr(sched, "refit_weight", 4.0)), start=start,
                            batching=str(engine.get("batching", "static") or "static"),
                            max_num_seqs=engine.get("max_num_seqs"), describe=describe)
    return RunObservers(recorder, epochs)
