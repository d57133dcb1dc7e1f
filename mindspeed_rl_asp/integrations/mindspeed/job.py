"""A MindSpeed-RL job assembled the way its ``cli/train_grpo.py`` assembles it.

What MindSpeed-RL does, and what this module does with it:

1. Hydra composes the job YAML with its ``defaults`` (``- model: NAME`` reads
   ``model/NAME.yaml`` beside it): :func:`compose_job`, a ``DictConfig`` as MindSpeed-RL's
   ``main`` receives it.
2. Its ``parse_training_config`` builds ``MegatronConfig`` / ``RLConfig`` /
   ``GenerateConfig`` / ``ProfilerConfig`` / ``MsprobeConfig`` from the DictConfig sections
   and calls ``validate_rl_args``: :func:`build_job` calls MindSpeed-RL's own function
   (loaded from the checkout's ``cli/train_grpo.py``), after :func:`fit_job_to_t_side`
   gave the actor the Training Unit's devices (MindSpeed-RL's ``actor_resource.num_npus``
   is the whole colocated job; under ASP the actor has the T nodes only).
3. ``RayActorGroup(worker=IntegratedWorker, placement_group=...)``: ASP passes its own
   placement groups (``config/placement.mindspeed_worker_bundles``: one per T node, a
   bundle per device), so
   MindSpeed-RL never builds STRICT_PACK groups over devices ASP's actors already hold.
4. The trainer's KL controller: :func:`make_kl_controller`, MindSpeed-RL's own
   ``FixedKLController`` / ``AdaptiveKLController`` for ``kl_ctrl_type`` / ``init_kl_coef``,
   the object its ``update(kl_ctrl, ...)`` reads ``.value`` from.

Where MindSpeed-RL runs from: a checkout (``MINDSPEED_RL_CHECKOUT``, or ``mindspeed_rl``
importable), and, with ``engine.mindspeed_workers=cpu``, the project's stand-ins of the NPU
stack (``assets/npu_standins``: torch_npu, vllm, vllm_ascend, mindspeed, acl, ...: inert
modules, so MindSpeed-RL's orchestration imports on a machine without NPUs; nothing in them
computes). The stand-ins go on ``sys.path`` only of processes that run MindSpeed-RL's code
(the driver's engine=mindspeed setup, the Training Unit, MindSpeed-RL's workers), never of
the generation actors: the stand-in named ``vllm`` would shadow a real one.
"""
from __future__ import annotations

import importlib.resources
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from ...config.validate import ConfigError

__all__ = ["MindSpeedJobError", "npu_standins_dir", "mindspeed_rl_checkout", "mindspeed_rl_paths",
           "use_mindspeed_rl", "worker_env", "compose_job", "fit_job_to_t_side", "build_job", "make_kl_controller",
           "WORKER_BACKENDS", "LOGICAL_NPUS_ENV", "CLI_FUNCTIONS", "load_cli_functions"]

WORKER_BACKENDS = ("npu", "cpu")
# Read by the acl stand-in: how many (logical) NPUs a node has, as AscendCL would say.
LOGICAL_NPUS_ENV = "ASP_LOGICAL_NPUS_PER_NODE"


class MindSpeedJobError(ConfigError):
    """A MindSpeed-RL job that cannot run under ASP; the message names the key and the fix
    (a ConfigError: the commands print it as one line)."""


def npu_standins_dir() -> Path:
    """The stand-ins of the NPU stack shipped with the package."""
    return Path(str(importlib.resources.files("mindspeed_rl_asp") / "assets" / "npu_standins"))


def mindspeed_rl_checkout() -> str | None:
    """Where MindSpeed-RL's source is: ``MINDSPEED_RL_CHECKOUT``, else the importable
    package's parent, else None."""
    root = os.environ.get("MINDSPEED_RL_CHECKOUT")
    if root:
        return str(Path(root).resolve())
    spec = importlib.util.find_spec("mindspeed_rl")
    if spec is not None and spec.origin:
        return str(Path(spec.origin).resolve().parents[1])
    return None


def mindspeed_rl_paths(workers: str) -> list[str]:
    """What goes first on ``sys.path`` / ``PYTHONPATH`` of a process that runs MindSpeed-RL:
    the NPU stand-ins (``workers='cpu'``) and the checkout."""
    if workers not in WORKER_BACKENDS:
        raise MindSpeedJobError(f"engine.mindspeed_workers={workers!r} is not one of {', '.join(WORKER_BACKENDS)}")
    checkout = mindspeed_rl_checkout()
    if checkout is None:
        raise MindSpeedJobError("engine=mindspeed: MindSpeed-RL is not found; set MINDSPEED_RL_CHECKOUT to a "
                                "checkout of Ascend/MindSpeed-RL (or put it on PYTHONPATH)")
    return ([str(npu_standins_dir())] if workers == "cpu" else []) + [checkout]


def use_mindspeed_rl(workers: str) -> None:
    """Make MindSpeed-RL importable in this process (see :func:`mindspeed_rl_paths`)."""
    for path in reversed(mindspeed_rl_paths(workers)):
        if path not in sys.path:
            sys.path.insert(0, path)
    if workers == "cpu" and "vllm" in sys.modules and not str(getattr(sys.modules["vllm"], "__file__", "")).startswith(
            str(npu_standins_dir())):
        raise MindSpeedJobError("engine.mindspeed_workers=cpu: this process already imported the real vllm, which "
                                "MindSpeed-RL's modules would then use; run the job in a fresh process")


def worker_env(workers: str, npus_per_node: int, base: dict | None = None) -> dict[str, str]:
    """Environment variables for Ray processes that run MindSpeed-RL code."""
    base = os.environ if base is None else base
    paths = mindspeed_rl_paths(workers) + ([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])
    env = {"PYTHONPATH": os.pathsep.join(paths)}
    if workers == "cpu":
        env[LOGICAL_NPUS_ENV] = str(npus_per_node)
    return env


def compose_job(path: str | Path, overrides: tuple[str, ...] = ()):
    """The job as MindSpeed-RL's ``@hydra.main`` gives it to ``train``: Hydra composes the
    YAML with its ``defaults`` (``model/NAME.yaml`` in the job's folder)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    job = Path(path).resolve()
    if not job.is_file():
        raise MindSpeedJobError(f"engine.mindspeed_config={str(path)!r}: no such file")
    if GlobalHydra.instance().is_initialized():
        raise MindSpeedJobError("compose_job: Hydra is already initialised in this process (inside another "
                                "compose); compose the MindSpeed-RL job before or after it")
    try:
        with warnings.catch_warnings():
            # MindSpeed-RL's jobs list no `_self_` in their defaults; Hydra 1.1+ warns and
            # composes them as MindSpeed-RL's own launch does (version_base=None).
            warnings.simplefilter("ignore", UserWarning)
            with initialize_config_dir(config_dir=str(job.parent), version_base=None):
                return compose(config_name=job.stem, overrides=list(overrides))
    except HydraException as error:
        first = str(error).strip().splitlines()[0]
        raise MindSpeedJobError(f"engine.mindspeed_config={str(path)!r}: Hydra could not compose it with its "
                                f"defaults: {first}") from None


def fit_job_to_t_side(job, train_devices: int, workers: str = "npu"):
    """The job as ASP runs it: MindSpeed-RL's actor on the Training Unit's ``train_devices``
    (``rl_config.actor_resource.num_npus``), as one integrated worker (actor and reference
    in one group, which MindSpeed-RL's GRPO requires). With ``workers='cpu'`` the precision
    keys are set to what ``validate_rl_args`` demands of NPU workers (``megatron_training.bf16``
    true, ``generate_config.dtype`` bfloat16): the cpu workers compute in ``engine.dtype``
    (cpu_workers.py), so they say nothing about the run. Returns a new DictConfig."""
    from omegaconf import OmegaConf, open_dict

    job = OmegaConf.create(OmegaConf.to_container(job, resolve=True))
    for section in ("megatron_training", "actor_config", "rl_config", "generate_config"):
        if section not in job:
            raise MindSpeedJobError(f"the MindSpeed-RL job has no {section} section; a GRPO job needs "
                                    "megatron_training, actor_config, rl_config and generate_config")
    rl = job.rl_config
    if rl.get("use_integrated_worker", True) is False:
        raise MindSpeedJobError("rl_config.use_integrated_worker=false: MindSpeed-RL's GRPO runs actor and "
                                "reference as one IntegratedWorker; set it to true (or remove it)")
    for key in ("ref_config", "reward_config"):
        if key in job:
            raise MindSpeedJobError(f"{key}: a separate {key.split('_')[0]} worker is not built with "
                                    "use_integrated_worker; remove the section")
    with open_dict(job):
        rl.use_integrated_worker = True
        rl.actor_resource = {**(rl.get("actor_resource") or {}), "num_npus": int(train_devices)}
        if workers == "cpu":
            job.megatron_training.bf16 = True
            job.generate_config.dtype = "bfloat16"
    return job


# From the checkout's cli/train_grpo.py (not a package): what RayActorGroup is given, and
# the function that builds the job's config classes.
CLI_FUNCTIONS = ("gpt_model_provider", "initialize_megatron", "get_megatron_module", "parse_training_config")


def load_cli_functions(checkout: str | None = None) -> dict:
    """``gpt_model_provider``, ``initialize_megatron``, ``get_megatron_module`` and
    ``parse_training_config`` from the checkout's ``cli/train_grpo.py`` (MindSpeed-RL's own;
    its cli/ is not a package)."""
    root = checkout or mindspeed_rl_checkout()
    path = Path(root or ".") / "cli" / "train_grpo.py"
    if not root or not path.is_file():
        raise MindSpeedJobError(f"no {path}: set MINDSPEED_RL_CHECKOUT to the MindSpeed-RL checkout")
    spec = importlib.util.spec_from_file_location("mindspeed_rl_cli_train_grpo", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return {name: getattr(module, name) for name in CLI_FUNCTIONS}


def build_job(job) -> dict[str, Any]:
    """MindSpeed-RL's config objects from the DictConfig, by its own ``parse_training_config``
    (which calls ``validate_rl_args``): actor_config, ref_config, reward_config, rl_config,
    generate_config, profiler_config, msprobe_config. A value MindSpeed-RL rejects is one
    error naming what it said."""
    parse = load_cli_functions()["parse_training_config"]
    try:
        return parse(job)
    except (ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError) as error:
        raise MindSpeedJobError(f"MindSpeed-RL refused the job ({type(error).__name__}: {error}); fix the key it "
                                "names in the YAML") from None


def make_kl_controller(rl_config):
    """MindSpeed-RL's KL controller for ``kl_ctrl_type`` / ``init_kl_coef`` (``kl_target``,
    ``kl_horizon`` for ``adaptive``), as its ``RayBaseTrainer`` makes it."""
    from mindspeed_rl.trainer.utils.compute_utils import AdaptiveKLController, FixedKLController

    kind = getattr(rl_config, "kl_ctrl_type", "fixed")
    if kind == "fixed":
        return FixedKLController(init_kl_coef=rl_config.init_kl_coef)
    if kind == "adaptive":
        if not rl_config.kl_horizon > 0:
            raise MindSpeedJobError(f"rl_config.kl_horizon={rl_config.kl_horizon} must be > 0 with "
                                    "kl_ctrl_type=adaptive")
        return AdaptiveKLController(init_kl_coef=rl_config.init_kl_coef, target_kl=rl_config.kl_target,
                                    horizon=rl_config.kl_horizon)
    raise MindSpeedJobError(f"rl_config.kl_ctrl_type={kind!r} is not one of fixed, adaptive")

