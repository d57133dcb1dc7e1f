"""The config of a resumed run (``asp-train resume=RUN_DIR [key=value ...]``): the run's
saved ``config.yaml`` with the overrides given on the resume command line.

What may change on resume: how and where the run executes (``layout``, ``engine``
threads and devices, ``weights``, ``train.ranks`` and the optimizer's knobs, ``eval``,
``save_every``, ``mode`` knobs the saved plan still satisfies: the core re-checks).
What may not, because the saved checkpoint and plan depend on it: the batch geometry
(``rl``), the model, the task, the sampling, the loss (``algo``), the scheduler (the plan
is saved), ``steps`` and ``seed``. A contradiction is one error naming the key.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from .schema import CONFIG_GROUPS
from .validate import ConfigError

# Key prefixes a resumed run must keep as saved.
MUST_MATCH = ("rl.", "model.", "task.", "generate.", "algo.", "scheduler.", "steps", "seed")


def _leaves(node, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_leaves(value, f"{name}."))
        else:
            out[name] = value
    return out


def contradictions(saved: dict, resumed: dict) -> list[str]:
    """``key: saved -> resumed`` for every leaf under :data:`MUST_MATCH` that differs."""
    before, after = _leaves(saved), _leaves(resumed)
    # Keys the saved config lacks (added to the schema since) take their defaults: not a change.
    keys = sorted(k for k in before if k.startswith(MUST_MATCH) or k in MUST_MATCH)
    return [f"{k}: saved {before.get(k)!r}, given {after.get(k)!r}" for k in keys if before.get(k) != after.get(k)]


def resume_config(run_dir: str, overrides: Sequence[str] = ()) -> DictConfig:
    """The saved config of ``run_dir`` merged with ``overrides`` (``key=value``; ``resume=``
    and ``--`` flags are left out), checked and validated; ``resume`` and ``run_dir`` set
    to ``run_dir``. Raises ConfigError naming the key for every refusal."""
    from .load import explain_unknown_key, to_dataclass
    from .schema import RootConfig
    from .validate import validate_config

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"resume={run_dir!r}: no config.yaml there; resume takes the directory of a run "
                          "that asp-train wrote (its run_dir)")
    own = [o for o in overrides if "=" in o and not o.startswith(("resume=", "-"))]
    groups = [o for o in own if o.split("=", 1)[0] in CONFIG_GROUPS]
    if groups:
        raise ConfigError(f"resume takes key=value overrides only, not the config group {groups[0]!r}: the saved "
                          f"run's groups stay (override single keys, e.g. layout.infer_instance_size=2)")
    given_dir = [o.split("=", 1)[1] for o in own if o.startswith("run_dir=")]
    if given_dir and Path(given_dir[0]).resolve() != Path(run_dir).resolve():
        raise ConfigError(f"run_dir={given_dir[0]!r} contradicts resume={run_dir!r}: a resumed run continues "
                          "in its own directory; drop run_dir=")
    saved = OmegaConf.load(path)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RootConfig), saved, OmegaConf.from_dotlist(own))
    except ConfigKeyError as error:
        raise ConfigError(explain_unknown_key(str(error.full_key))) from None
    except ValidationError as error:
        raise ConfigError(f"bad value for config key '{error.full_key}': {str(error).splitlines()[0]}") from None
    problems = contradictions(OmegaConf.to_container(saved, resolve=True),
                              OmegaConf.to_container(merged, resolve=True))
    if problems:
        raise ConfigError(f"resume={run_dir!r}: the overrides contradict the saved run on keys the checkpoint "
                          f"and the plan depend on ({'; '.join(problems)}); resume with the saved values or "
                          "start a new run")
    merged.resume = str(run_dir)
    merged.run_dir = str(run_dir)
    validate_config(to_dataclass(merged))
    return merged


__all__ = ["MUST_MATCH", "contradictions", "resume_config"]
