"""Wire the roles and run async (or hybrid) GRPO on Ray. The loop is the one loop,
``control.loop.Loop``; this module builds the pieces from the config and cleans up.
:func:`run_training` reads top to bottom:

    prepare_task        the task and the model's tokenizer, built once (the CLI builds
                        them before the run directory exists and passes them in)
    open_segment        plan the prompts (schedule/planning.py; a resumed run: its
                        checkpoint's dispatch list), every check, the pure control core
    ray_session         Ray up (a local cluster started here is shut down on the way out)
    placed_actors       Generation Unit and Training Unit actors in their placement group,
                        each built from its typed config (runtime/actor_configs.py)
    assembled_run       Loop(core, RayCluster(actors), observers), advanced to the end
                        (or interrupted)
    segment_summary     the one summary builder: done, interrupted or failed
    finish_run          per-epoch correctness, summary.json, the final check
"""
from __future__ import annotations

import contextlib
import json
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from omegaconf import OmegaConf

from .faults import FaultPlan
from .ray_cluster import os_error_of


def _ray_options(placement_group, slot, resource: str, threads: int, extra_env: dict | None = None) -> dict:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(placement_group=placement_group,
                                                placement_group_bundle_index=slot.bundle)
    options = {"scheduling_strategy": strategy, "max_concurrency": 1}
    if resource == "CPU":
        options["num_cpus"] = slot.amount
    elif resource == "GPU":
        options.update(num_cpus=0, num_gpus=slot.amount)
    else:
        options.update(num_cpus=0, resources={resource: slot.amount})
    env = {"OMP_NUM_THREADS": str(max(threads, 1)), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           # Snapshots are fresh copies nobody mutates, so Ray may hand tensors over without
           # another copy (measured: publish + load about 35% faster, docs/benchmarks.md).
           "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}
    if resource == "NPU":  # MindSpeed-RL's Ascend environment, and only the slot's own NPUs visible
        from ..config.placement import npu_actor_env

        env.update(npu_actor_env(slot, os.environ))
    env.update(extra_env or {})
    options["runtime_env"] = {"env_vars": env}
    return options


def ensure_ray(layout, extra_resources: dict | None = None) -> bool:
    """Start a local Ray cluster sized to a CPU layout unless one is running (or
    ``ray start`` made one, which ``RAY_ADDRESS`` points to). Returns whether we started it.
    ``extra_resources``: logical resources the local cluster offers besides (the NPUs of
    ``engine.mindspeed_workers=cpu``)."""
    import ray

    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        return True
    devices = layout.nodes * layout.devices_per_node
    if extra_resources and "NPU" in extra_resources:
        # Logical NPUs: Ray's NPU detection finds no AscendCL here and logs a traceback for it.
        import logging

        logging.getLogger("ray._private.accelerators.npu").setLevel(logging.CRITICAL)
    ray.init(num_cpus=devices if layout.device_type == "cpu" else None, include_dashboard=False,
             log_to_driver=False, configure_logging=False, resources=extra_resources or None)
    return True


def mindspeed_logical_npus(cfg, layout) -> dict | None:
    """``{"NPU": T devices}`` for engine=mindspeed with ``mindspeed_workers=cpu``: MindSpeed-RL's
    worker group is placed on bundles of (logical) NPUs, one per T device."""
    if cfg.engine.name != "mindspeed" or cfg.engine.mindspeed_workers != "cpu":
        return None
    return {"NPU": float(layout.train_nodes * layout.devices_per_node)}


def mindspeed_trainer_setup(cfg, layout, pin_nodes: bool) -> tuple[list, dict]:
    """engine=mindspeed: the bundles of MindSpeed-RL's worker group, which ASP places (a CPU
    per bundle on NPU hosts, none for logical NPUs), and the environment of the processes
    that run MindSpeed-RL's code (its checkout, and with ``mindspeed_workers=cpu`` the NPU
    stand-ins, on PYTHONPATH). Other engines: no bundles, no environment."""
    if cfg.engine.name != "mindspeed":
        return [], {}
    from ..integrations.mindspeed.job import worker_env
    from ..config.placement import mindspeed_worker_bundles

    cpus = 0.0 if cfg.engine.mindspeed_workers == "cpu" else 1.0
    return (mindspeed_worker_bundles(layout, cfg.mode.name, cpus, pin_nodes),
            worker_env(cfg.engine.mindspeed_workers, layout.devices_per_node))


def launched_by_asp_launch() -> bool:
    """Whether the Ray cluster is one that ``asp-launch`` brought up (its nodes carry the
    ``asp_node_<k>`` markers): then bundles are pinned to nodes and rendezvous use the
    nodes' addresses; else (a local cluster, started here or joined by RAY_ADDRESS) all is local."""
    import ray

    from ..config.placement import node_resource

    return node_resource(0) in ray.cluster_resources()


def start_segment(cfg, run_dir: Path, prompts, resume=None):
    """Where this run segment starts: ``(resume point or None, prior control state,
    minibatches to dispatch)``. A new run plans (``plan.json``); a resumed one takes the
    checkpoint's dispatch list minus what was trained and writes nothing yet
    (:func:`begin_resumed_segment`, once every check passed). ``resume``: the resume point
    if the caller found (and so verified) it already: verifying hashes every file of the
    checkpoint, once is enough."""
    from .checkpoint import ControlState, check_steps_left, find_resume_point, remaining_minibatches
    from ..schedule.planning import plan_run

    if not cfg.resume:
        plan, epochs, minibatches = plan_run(cfg, prompts, run_dir=run_dir)
        plan.save(run_dir / "plan.json")
        return None, ControlState(0, [], [], epochs, cfg.steps), minibatches
    resume = resume or find_resume_point(run_dir)
    prior = resume.control
    check_steps_left(resume, cfg.steps, cfg.resume)
    return resume, prior, remaining_minibatches(prior.minibatches, prior.consumed)


def check_prompts_known(minibatches, known, resume) -> None:
    """A ConfigError when the resumed dispatch list names prompts the task does not have
    (its file changed since the run began): one line, before anything is written."""
    from ..config.validate import ConfigError
    from ..tasks import base_prompt_id

    unknown = [pid for _, ids in minibatches for pid in ids if base_prompt_id(pid) not in known]
    if unknown:
        raise ConfigError(f"resume from {resume.path}: {len(unknown)} prompt(s) of its dispatch list are not in the "
                          f"task (first: {unknown[0]!r}); the task's data changed since the run began: restore it, "
                          "or start a new run")


def begin_resumed_segment(cfg, run_dir: Path, resume) -> None:
    """Once a resume passed every check: sweep partial checkpoints, set aside what the dead
    segment wrote after its checkpoint (metrics and rollouts of the steps trained again,
    timeline spans after the checkpoint's time) and save this segment's config beside the
    run's (``config.resume-<version>.yaml``)."""
    from .checkpoint import checkpoints_dir, set_aside_metrics_after, set_aside_spans_after, sweep_partials

    sweep_partials(checkpoints_dir(run_dir))
    set_aside_metrics_after(run_dir, resume.version)
    set_aside_spans_after(run_dir, resume.control.saved_at)
    (run_dir / f"config.resume-{resume.version:06d}.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))


def start_actors(cfg, pg, placement, weights_path: str, model_path: str, task,
                 start_version: int = 0) -> tuple[list, list]:
    """The generation actors and the trainer rank actors in their placement-group slots,
    each built from its typed config (``runtime/actor_configs.py``), starting from
    ``weights_path`` (a resumed run: its checkpoint's policy, version ``start_version``);
    the trainer's KL reference is ``model_path``, the run's starting checkpoint."""
    from .actor_configs import actor_configs
    from .generation_unit import GenerationWorker, restart_options
    from .training_unit import TrainingWorker
    from .transport import remote_class

    threads, transport_name, num_gen = cfg.engine.num_threads, cfg.weights.transport, len(placement.generators)
    bundles, trainer_env = mindspeed_trainer_setup(cfg, OmegaConf.to_object(cfg.layout), launched_by_asp_launch())
    configs = actor_configs(cfg, task, model_path, bundles)
    gen_cls = remote_class(GenerationWorker, transport_name, "generate", num_gen)
    generators = [
        gen_cls.options(**_ray_options(pg, slot, placement.resource, threads),
                        **restart_options(cfg.fault.actor_restarts)).remote(
            slot.index, configs.generation, weights_path, start_version)
        for slot in placement.generators
    ]
    # One actor per trainer rank (train.ranks); rank 0 sends weights for the collective transport.
    trainers = [
        remote_class(TrainingWorker, transport_name, "train" if slot.index == 0 else "rank", num_gen).options(
            **_ray_options(pg, slot, slot.resource or placement.resource, threads, trainer_env)).remote(
            configs.trainer, weights_path)
        for slot in placement.trainers
    ]
    return generators, trainers


@dataclass(frozen=True)
class PreparedTask:
    """The run's task, built once, before the run directory exists (a bad file, field, row
    or reward stops there), with the model's tokenizer its prompts were measured with
    (None for a dry run of the maze task, which loads no checkpoint), and the line saying
    which length predictor ``scheduler.predictor=auto`` became."""

    task: Any
    tokenizer: Any
    predictor_note: str


def prepare_task(cfg, with_tokenizer: bool = True) -> PreparedTask:
    """Build the task of ``cfg`` (``schedule/configured.configured_task``) and make
    ``scheduler.predictor=auto`` concrete in ``cfg`` (before config.yaml is written)."""
    from ..config.validate import resolve_model_path
    from ..engines.hf import load_tokenizer
    from ..schedule.configured import apply_predictor, configured_task

    tokenizer = load_tokenizer(resolve_model_path(cfg.model.path)) if with_tokenizer else None
    task = configured_task(cfg, tokenizer, training=True)
    return PreparedTask(task, tokenizer, apply_predictor(cfg, task.prompts))


class FirstGeneration:
    """Observer: tells ``phase`` when the first minibatch is generated (the last start-up
    phase; the first step follows once a step's prompts are in)."""

    def __init__(self, phase: Callable[[str], None]):
        self.phase, self.seen = phase, False

    def submitted(self, action, t: float) -> None:
        pass

    def observed(self, event, core, t: float) -> None:
        from ..control.core import Generate
        from ..control.loop import Done

        if not self.seen and isinstance(event, Done) and isinstance(event.action, Generate):
            self.seen = True
            self.phase("first minibatch generated")

    def finished(self, outcome, core, t: float) -> None:
        pass


def run_training(cfg, run_dir: Path, on_step: Callable[[dict], None] | None = None,
                 on_eval: Callable[[str, int, int], None] | None = None, prepared: PreparedTask | None = None,
                 on_phase: Callable[[str], None] | None = None, resume_point=None,
                 faults: FaultPlan | None = None) -> dict:
    """Run ``cfg.steps`` GRPO steps; writes everything into ``run_dir``; returns the summary.

    ``on_step(metrics)`` after every step; ``on_eval(what, samples done, samples in all)``
    during the final initial-vs-final check; ``on_phase(what)`` as start-up goes through its
    phases (plan, Ray, placement, models loaded, first generation), so a user sees progress
    before the first step. ``prepared``: the run's task and tokenizer if the caller built
    them already (:func:`prepare_task`, before writing the run directory);
    ``resume_point``: the checkpoint to resume from if the caller found it already;
    ``faults``: what a test injects (``runtime/faults.FaultPlan``).

    ``cfg.resume`` (= ``run_dir``): continue from the run's newest checkpoint
    (``runtime/checkpoint.py``). ``cfg.save_every``: checkpoint every that many versions.
    Ctrl-C or SIGTERM: generation stops, a step in training finishes, a checkpoint is
    written (with ``save_every``) and the summary says ``interrupted``."""
    from .interrupts import interrupt_signals

    phase = on_phase or (lambda what: None)
    prepared = prepared or prepare_task(cfg)
    segment = open_segment(cfg, run_dir, prepared, resume_point, phase)   # every check passed: it writes now
    # Signals are taken over once Ray is up: ray.init installs its own SIGTERM handler.
    with ray_session(cfg, phase), interrupt_signals() as interrupts, contextlib.ExitStack() as held:
        run = None
        try:
            actors = held.enter_context(placed_actors(cfg, segment, prepared.task, phase, faults))
            run = held.enter_context(assembled_run(cfg, segment, actors, interrupts, on_step, phase))
            with interrupts.held():   # a first signal lands only where the loop waits (runtime/interrupts.py)
                while run.loop.advance():
                    pass
            summary = segment_summary(segment, run, "done")
            save_final_policy(cfg, run_dir, actors.trainers)
        except KeyboardInterrupt:   # Ctrl-C or SIGTERM (runtime/interrupts.py)
            settled = settle_interrupt(run, interrupts)
            summary = segment_summary(segment, run, "interrupted", interrupts=interrupts, settled=settled)
        except Exception as error:   # the run cannot go on: summary.json says why, then one line for the user
            error = os_error_of(error)
            write_failed_summary(run_dir, segment_summary(segment, run, "failed", error=error))
            raise with_resume_hint(error, run_dir, last_checkpoint(run, segment.resume)) from None
    if summary.get("interrupted"):
        write_summary(run_dir, summary)
        return summary
    return finish_run(cfg, run_dir, summary, prepared.task, segment.model_path, on_eval)


@dataclass
class Segment:
    """One segment of a run (a new run, or one resumed from a checkpoint): where it starts,
    the control core it drives, and what the segments before it did (``prior``: zeros for a
    new run)."""

    run_dir: Path
    resume: Any                  # runtime/checkpoint.ResumePoint, or None
    prior: Any                   # runtime/checkpoint.ControlState
    core: Any
    plan_lengths: Any            # schedule/assembly.PlanLengths: what the first plan was made from
    prompt_tokens: dict          # prompt id (epoch-qualified) -> its token ids, for every id of the segment
    model_path: str              # the run's starting checkpoint (and the KL reference)
    task_summary: dict

    @property
    def weights_path(self) -> str:
        """Where this segment's policy starts: the model, or the checkpoint's policy."""
        return self.model_path if self.resume is None else str(self.resume.policy)


def open_segment(cfg, run_dir: Path, prepared: PreparedTask, resume_point, phase) -> Segment:
    """Plan (a new run) or take up the checkpoint's dispatch list (a resumed run), check
    everything that can be checked, build the control core; only then does a resumed
    segment write (:func:`begin_resumed_segment`)."""
    from ..config.validate import resolve_model_path
    from ..tasks import base_prompt_id
    from ..config.placement import plan_placement, trainer_holds_devices
    from ..schedule.assembly import assemble_core, replanned_epochs, run_plan_lengths

    check_engine_mode(cfg)
    task, tokenizer = prepared.task, prepared.tokenizer
    resume, prior, minibatches = start_segment(cfg, run_dir, task.prompts, resume_point)
    phase(f"plan ready: {len(minibatches)} minibatches" + ("" if resume is None else f" left (resuming {resume.path.name})"))
    tokens = {p.id: tokenizer(p.prompt, add_special_tokens=False)["input_ids"] for p in task.prompts}
    if resume is not None:
        check_prompts_known(minibatches, tokens, resume)
    placement = plan_placement(OmegaConf.to_object(cfg.layout), cfg.mode.name, ranks=cfg.train.ranks,
                               trainer_holds_devices=trainer_holds_devices(cfg.engine.name, cfg.mode.name))
    plan_lengths = run_plan_lengths(cfg, task.prompts, run_dir)
    core = assemble_core(cfg, minibatches, plan_lengths, len(placement.generators), start_version=prior.version,
                         taken=prior.consumed, replanned=replanned_epochs(run_dir))
    if resume is not None:
        begin_resumed_segment(cfg, run_dir, resume)
    task_summary = {"name": task.name, "prompts": len(task.prompts), "rewards": task.rewards.names,
                    "correctness_reward": task.rewards.correctness.name,
                    "integrity_reward": task.rewards.integrity.name, "skipped_overlong_prompts": len(task.skipped)}
    return Segment(run_dir, resume, prior, core, plan_lengths,
                   {pid: tokens[base_prompt_id(pid)] for _, ids in minibatches for pid in ids},
                   str(resolve_model_path(cfg.model.path)), task_summary)


def check_engine_mode(cfg) -> None:
    """The one combination ASP leaves to its host: MindSpeed-RL's colocated run."""
    from ..config.validate import ConfigError

    if cfg.engine.name == "mindspeed" and cfg.mode.name == "hybrid":
        raise ConfigError("mode=hybrid with engine=mindspeed is MindSpeed-RL's own colocated run (launch its "
                          "cli/train_grpo.py for that baseline); ASP's engine=mindspeed runs mode=async")


@contextlib.contextmanager
def ray_session(cfg, phase):
    """Ray for the run: the one running (or that ``RAY_ADDRESS`` names), else a local one
    started here and shut down on the way out."""
    import ray

    layout = OmegaConf.to_object(cfg.layout)
    started = ensure_ray(layout, extra_resources=mindspeed_logical_npus(cfg, layout))
    phase("Ray cluster up")
    try:
        yield
    finally:
        if started:
            ray.shutdown()


@dataclass
class Actors:
    generators: list
    trainers: list
    transport: Any
    multi_node: bool


@contextlib.contextmanager
def placed_actors(cfg, segment: Segment, task, phase, faults: FaultPlan | None):
    """The run's placement group and every actor in it, ready (models loaded, trainer
    ranks joined, a resumed run's trainer state loaded, the weight transport open, a
    test's faults armed); the placement group, and the actors with it, removed on the way out."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from .distributed import connect_trainer_ranks
    from ..config.placement import plan_placement, trainer_holds_devices, worker_groups_of
    from .transport import make_transport

    layout, multi_node = OmegaConf.to_object(cfg.layout), launched_by_asp_launch()
    placement = plan_placement(layout, cfg.mode.name, pin_nodes=multi_node, ranks=cfg.train.ranks,   # bundle k on
                               trainer_holds_devices=trainer_holds_devices(cfg.engine.name, cfg.mode.name))   # node k
    (segment.run_dir / "placement.txt").write_text(
        placement.describe(worker_groups_of(cfg.engine.name, cfg.mode.name, layout)) + "\n")
    pg = placement_group(list(placement.bundles), strategy="PACK")
    try:
        ray.get(pg.ready())
        phase(f"placement ready: {len(placement.bundles)} node bundle(s)")
        generators, trainers = start_actors(cfg, pg, placement, segment.weights_path, segment.model_path, task,
                                            segment.prior.version)
        ray.get([g.ready.remote() for g in generators] + [t.ready.remote() for t in trainers])
        phase(f"models loaded: {len(generators)} generation actor(s), {len(trainers)} trainer rank(s)")
        connect_trainer_ranks(trainers, layout.device_type, local=not multi_node)
        if segment.resume is not None:
            ray.get([t.load_checkpoint.remote(str(segment.resume.path), segment.resume.version) for t in trainers])
        transport = make_transport(cfg.weights, trainers, generators, segment.run_dir, layout.device_type,
                                   local=not multi_node)
        if faults is not None:
            faults.apply(generators, trainers)
        yield Actors(generators, trainers, transport, multi_node)
    finally:
        remove_placement_group(pg)


@dataclass
class Run:
    """The loop of a segment and the observers whose state the summary reads."""

    loop: Any
    cluster: Any
    recorder: Any
    writer: Any                  # runtime/checkpoint.CheckpointWriter: the checkpoints the core asked for
    start: float


@contextlib.contextmanager
def assembled_run(cfg, segment: Segment, actors: Actors, interrupts, on_step, phase):
    """The loop over the segment's core on a ``RayCluster`` of ``actors`` (which writes the
    checkpoints the core asks for), with its observers: the recorder (closed on the way
    out), the epoch report, the rejected payloads' release, the first-generation phase."""
    import ray

    from ..control.loop import Loop
    from ..schedule.assembly import assemble_observers
    from .checkpoint import CheckpointWriter
    from .ray_cluster import RayCluster, RejectedPayloads

    prior, trainers = segment.prior, actors.trainers
    # A resumed segment samples afresh: the steps after its checkpoint, trained again,
    # do not repeat the dead segment's samples.
    seed = cfg.seed if not prior.version else zlib.crc32(f"{cfg.seed}/resume/{prior.version}".encode())
    start = time.time()   # RayCluster's clock (the wall clock), read before it is built
    # The recorder and the epoch report (re-plans, per-epoch rank quality and bubbles), as the simulator's.
    observers = assemble_observers(cfg, segment.run_dir, len(actors.generators), segment.plan_lengths, start,
                                   on_step, segment=prior.version, elapsed_before=prior.wall_time_s)
    recorder = observers.recorder
    try:
        writer = CheckpointWriter(segment.run_dir, cfg.keep_checkpoints, prior, start,
                                  lambda path: ray.get([t.save_checkpoint.remote(str(path)) for t in trainers]),
                                  faults=recorder)
        cluster = RayCluster(actors.generators, trainers, segment.prompt_tokens, seed, actors.transport,
                             waiting=interrupts.waiting, start_version=prior.version, checkpoint=writer.write)
        loop = Loop(segment.core, cluster, observers.fanout(RejectedPayloads(cluster), FirstGeneration(phase)))
        yield Run(loop, cluster, recorder, writer, start)
    finally:
        observers.close()


def segment_summary(segment: Segment, run: Run | None, ending: str, error: BaseException | None = None,
                    interrupts=None, settled: bool = True) -> dict:
    """The one summary of a segment, for each way it ends (``ending``): ``done`` (the loop's
    outcome: finish, ages, failures, unused prompts, dynamic sampling), ``interrupted``
    (the signal, where it landed, the command that resumes) or ``failed`` (``error``, and
    the command that resumes). ``run``: None when the segment ended before its loop existed."""
    from .checkpoint import merge_histograms
    from ..metrics.recorder import dynamic_sampling_summary

    core, prior = segment.core, segment.prior
    latest = last_checkpoint(run, segment.resume)
    summary = {"steps": core.trainer_version, "epochs": prior.epochs,
               "consumed_prompt_ids": prior.consumed + core.consumed_ids(),
               "faults": list(prior.faults) + (run.recorder.faults if run is not None else []),
               "resumed_from": None if segment.resume is None else {"checkpoint": str(segment.resume.path),
                                                                    "version": segment.resume.version},
               "task": segment.task_summary, "checkpoint": latest and str(latest)}
    if ending != "done":
        summary["resume_command"] = f"asp-train resume={segment.run_dir}" if latest else None
    if ending == "interrupted":
        summary.update(interrupted=True, signal=interrupts.received[0] if interrupts.received else "SIGINT",
                       stage="training" if run is not None else "starting actors",
                       **({} if settled else {"stopped_at_once": True}))
    if ending == "failed":
        summary.update(failure_fields(error))
    if ending == "done":
        outcome, snapshot = run.loop.outcome, core.snapshot()
        finish = outcome.finish
        summary.update(
            checkpoint=run.writer.last_path and str(run.writer.last_path),
            wall_time_s=run.cluster.now() - run.start + prior.wall_time_s, at_finish=outcome.summary(),
            policy_age_histogram=merge_histograms(prior.age_histogram, snapshot.age_histogram),
            generation_failures=prior.generation_failures + run.recorder.failures,
            unused_prompts={"not_dispatched": len(finish.not_dispatched), "queued": len(finish.queued),
                            "running": len(finish.running), "rejected": len(finish.rejected)},
            dynamic_sampling=dynamic_sampling_summary(snapshot, core.config.filter_groups))
    return summary


def save_final_policy(cfg, run_dir: Path, trainers) -> None:
    """``final_policy/`` (ranks gather, rank 0 writes), when kept or needed by the final check."""
    import ray

    if cfg.eval.save_final_policy or cfg.eval.num_prompts:
        ray.get([t.save.remote(str(run_dir / "final_policy")) for t in trainers])


def finish_run(cfg, run_dir: Path, summary: dict, task, model_path: str, on_eval) -> dict:
    """After the training: the per-epoch on-policy correctness, summary.json, then the
    initial-vs-final check (``eval.num_prompts``; an interrupt cuts only the check, an
    error in it is written down and raised)."""
    from ..metrics.report import epoch_means, is_complete
    from ..metrics.writer import read_metrics
    from ..tasks import base_prompt_id

    by_epoch = epoch_means(read_metrics(run_dir))
    summary["on_policy_correctness_by_epoch"] = [
        {"epoch": e, "correctness": m, "samples": n, "complete": c}
        for (e, m, n), c in zip(by_epoch, is_complete(by_epoch))]
    write_summary(run_dir, summary)   # training is done
    if cfg.eval.num_prompts:
        by_id = task.by_id()
        trained = [by_id[i] for i in dict.fromkeys(base_prompt_id(i) for i in summary["consumed_prompt_ids"])]
        try:
            summary.update(evaluate_initial_and_final(cfg, model_path, str(run_dir / "final_policy"), trained,
                                                      on_eval, task))
        except KeyboardInterrupt:   # the training and its final policy are kept; only the check is cut
            summary.update(interrupted=True, stage="final evaluation")
        except Exception as error:   # the training is kept; summary.json says the check failed and why
            error = os_error_of(error)
            write_failed_summary(run_dir, {**summary, **failure_fields(error), "stage": "final evaluation"})
            raise error from None
    write_summary(run_dir, summary)
    return summary


def settle_interrupt(run: Run | None, interrupts) -> bool:
    """After the first signal: stop generating, let a step in training finish and be
    published (recorded like any other), then checkpoint (with ``save_every``: the core's
    ``settle`` asks for it). Returns False when a second signal cut that short: the run
    stops at once, the last checkpoint stays."""
    if run is None or run.loop.outcome is not None:
        return not interrupts.repeated
    try:
        run.loop.interrupt(finish_training=True)
    except KeyboardInterrupt:
        return False
    return True


def last_checkpoint(run: Run | None, resume):
    """The checkpoint a resume would start from, without reading it again: the one this
    segment wrote last, else the one it resumed from (verified then); None for a new run
    that wrote none."""
    if run is not None and run.writer.last_path is not None:
        return run.writer.last_path
    return resume.path if resume is not None else None


def first_line(error: BaseException) -> str:
    text = str(error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def with_resume_hint(error: BaseException, run_dir: Path, latest) -> BaseException:
    """A run-ending error of the run (trainer failed or died, every actor retired, too many
    groups rejected) as one line with what to do next; any other error as it is."""
    from ..control.core import ActorsExhausted, TooManyRejected
    from ..control.loop import TrainerFailed

    if not isinstance(error, (TrainerFailed, ActorsExhausted, TooManyRejected)):
        return error
    line = first_line(error) + actor_named(str(error))
    hint = (f"; resume with `asp-train resume={run_dir}` (from {Path(latest).name})" if latest
            else "; no checkpoint to resume from (save_every=K writes them)")
    return type(error)(line + hint)


def actor_named(detail: str) -> str:
    """`` (actor CLASS, pid N)`` from Ray's text of a dead actor (its ``class_name`` and
    ``pid`` lines), so that the one line says which process died; '' when Ray's text has none."""
    import re

    name, pid = re.search(r"class_name: (\w+)", detail), re.search(r"\bpid[:=] ?(\d+)", detail)
    if name is None:
        return ""
    return f" (actor {name.group(1)}" + (f", pid {pid.group(1)})" if pid else ")")


def write_summary(run_dir: Path, summary: dict) -> None:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def failure_fields(error: BaseException) -> dict:
    """What summary.json says of an error that ended the run (or its final check)."""
    return {"failed": True, "error": first_line(error), "error_type": type(error).__name__,
            "error_detail": str(error)}


def write_failed_summary(run_dir: Path, summary: dict) -> None:
    """summary.json of a failed run, as far as the disk allows: the disk that failed the run
    may fail this write too, and then the error the caller raises says why."""
    try:
        write_summary(run_dir, summary)
    except OSError:
        pass


def evaluate_initial_and_final(cfg, initial_path: str, final_path: str, training_prompts,
                               progress: Callable[[str, int, int], None] | None = None, task=None) -> dict:
    """Correctness of the starting and the trained policy, same seeds, paired by prompt (see
    :func:`~mindspeed_rl_asp.policy.evaluate.paired_change`), on two prompt sets:
    ``held_out`` (the task's held-out prompts: for the maze a stream disjoint from the
    task's, for a dataset ``task.eval_path``; left out when the task has none) and
    ``training_prompts`` (the first ``eval.num_prompts`` of ``training_prompts``, the
    prompts the run trained on). Scored by the task (``task``, or the config's)."""
    from ..engines.base import SamplingParams
    from ..policy.evaluate import held_out_comparison
    from ..schedule.configured import configured_task

    task = task if task is not None else configured_task(cfg)
    held_out = task.held_out(cfg.eval.num_prompts, cfg.eval.seed)
    sampling = SamplingParams.from_config(cfg.generate.sampling_config, seed=cfg.eval.seed)
    paths = {"initial": initial_path, "final": final_path}
    sets = [("training_prompts", training_prompts[:cfg.eval.num_prompts])]
    if held_out:
        sets.insert(0, ("held_out", held_out))
    total = len(paths) * cfg.eval.samples_per_prompt * sum(len(prompts) for _, prompts in sets)
    results, before = {}, 0
    for name, prompts in sets:
        results[name] = held_out_comparison(
            paths, prompts, sampling, task,
            # One thread: on a busy 2-core machine torch's default of all cores was
            # measured up to 50x slower, not faster.
            {"num_threads": max(cfg.engine.num_threads, 1)}, n_samples_per_prompt=cfg.eval.samples_per_prompt,
            progress=progress and (lambda policy, done, _, name=name, before=before:
                                   progress(f"{name}, {policy} policy", before + done, total)))
        before += len(paths) * cfg.eval.samples_per_prompt * len(prompts)
    return results
