"""Compose, type-check, validate and save the configuration.

Hydra's compose API builds the tree from ``configs/`` plus command-line overrides; the
result is merged onto the typed schema (unknown keys and wrong types fail here, with
the key's full name and a suggestion) and then checked by
:func:`mindspeed_rl_asp.config.validate.validate_config`.
"""
from __future__ import annotations

import difflib
import os
import re
import time
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from .paths import package_path
from .schema import RootConfig
from .validate import ConfigError, validate_config


def config_dir() -> Path:
    """The Hydra ``configs/`` directory: ``ASP_CONFIG_DIR`` if set, else the one shipped in the
    package (the checkout's top-level ``configs/``, through the link in the package)."""
    override = os.environ.get("ASP_CONFIG_DIR")
    candidate = Path(override) if override else package_path("configs")
    if not (candidate / "config.yaml").is_file():
        where = "ASP_CONFIG_DIR" if override else "the installed package"
        raise ConfigError(
            f"config directory {candidate} ({where}) has no config.yaml; set ASP_CONFIG_DIR to a configs/ "
            "folder, or reinstall the package (`pip install -e .` in a checkout, whose mindspeed_rl_asp/configs "
            "links to configs/)"
        )
    return candidate


def list_group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))


def _schema_type_at(path: str):
    """The schema dataclass at a dotted path ('' is the root), or None past a leaf."""
    node_type = RootConfig
    for part in [p for p in path.split(".") if p]:
        match = [f for f in fields(node_type) if f.name == part and callable(f.default_factory)]
        if not match:
            return None
        node_type = type(match[0].default_factory())
    return node_type


def explain_unknown_key(full_key: str) -> str:
    """Name the unknown key, the closest valid one and the valid keys beside it."""
    parent_path, _, key = full_key.rpartition(".")
    node_type = _schema_type_at(parent_path)
    valid = [f.name for f in fields(node_type)] if node_type and is_dataclass(node_type) else []
    close = difflib.get_close_matches(key, valid, n=1)
    prefix = f"{parent_path}." if parent_path else ""
    hint = f"; did you mean '{prefix}{close[0]}'?" if close else ""
    where = f" of '{parent_path}'" if parent_path else ""
    listing = f" Valid keys{where}: {', '.join(valid)}." if valid else ""
    return f"unknown config key '{full_key}'{hint}{listing}"


def _compose(overrides: Sequence[str], config_name: str) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import MissingMandatoryValue

    from hydra.core.config_store import ConfigStore

    # The typed schema is the first entry of config.yaml's defaults list, so every key
    # it declares exists (and is typed) before any YAML or override is merged.
    ConfigStore.instance().store(name="asp_schema", node=RootConfig)
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, MissingMandatoryValue) as error:
        cause = error.__cause__
        if isinstance(cause, ValidationError):
            reason = str(cause).splitlines()[0]
            raise ConfigError(f"bad value for config key '{cause.full_key}': {reason}") from None
        message = str(error).strip().split("\nConfig search path:")[0].strip()
        unknown = re.search(r"Could not override '([^']+)'", message)
        if unknown:
            raise ConfigError(explain_unknown_key(unknown.group(1))) from None
        raise ConfigError(f"could not compose the config: {message}") from None
    except OmegaConfBaseException as error:
        raise ConfigError(f"could not compose the config: {error}") from None


def unknown_keys(node, schema_type=RootConfig, prefix: str = "") -> list[str]:
    """Keys of a composed config that the schema does not declare (``+key=`` can add them)."""
    declared = {f.name: f for f in fields(schema_type)}
    found = []
    for key in node.keys():
        if key not in declared:
            found.append(f"{prefix}{key}")
            continue
        child_type = _schema_type_at(f"{prefix}{key}")
        if child_type is not None and is_dataclass(child_type) and isinstance(node[key], DictConfig):
            found += unknown_keys(node[key], child_type, f"{prefix}{key}.")
    return found


def load_config(overrides: Sequence[str] = (), config_name: str = "config", validate: bool = True,
                training: bool = True, local_install: bool = True) -> DictConfig:
    """Compose ``configs/<config_name>.yaml`` with Hydra overrides and check it.

    Returns a structured DictConfig (typed like :class:`RootConfig`). Raises
    :class:`ConfigError` with a message that names the bad key or value.
    ``local_install=False``: do not check what is installed here (simulated clusters;
    ``validate_config``).
    """
    composed = _compose(overrides, config_name)
    extra = unknown_keys(composed)
    if extra:
        raise ConfigError(explain_unknown_key(extra[0]))
    schema = OmegaConf.structured(RootConfig)
    try:
        cfg = OmegaConf.merge(schema, composed)
    except ConfigKeyError as error:
        raise ConfigError(explain_unknown_key(str(error.full_key))) from None
    except ValidationError as error:
        reason = str(error).splitlines()[0]
        raise ConfigError(f"bad value for config key '{error.full_key}': {reason}") from None
    OmegaConf.set_readonly(cfg, False)
    if local_install:   # a checkpoint that is here says what the model is (config/model_card.py)
        from .model_card import fill_from_checkpoint
        from .paths import locate

        fill_from_checkpoint(cfg, locate(cfg.model.path))
    if validate:
        validate_config(to_dataclass(cfg), training, local_install)
    return cfg


def to_dataclass(cfg: DictConfig) -> RootConfig:
    """A plain typed object (handy in pure code that must not depend on OmegaConf)."""
    return OmegaConf.to_object(cfg)


def make_run_dir(cfg: DictConfig, command: str) -> Path:
    """Create the run directory (``run_dir=`` or ``runs/<time>-<command>``) and save the
    resolved config in it as ``config.yaml``."""
    if cfg.run_dir:
        run_dir = Path(cfg.run_dir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = Path("runs") / f"{stamp}-{command}-{cfg.experiment.name}"
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.run_dir = str(run_dir)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True), encoding="utf-8")
    return run_dir
