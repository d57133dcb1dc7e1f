"""The on-disk form of a fitted length predictor (a directory: ``meta.json`` + tensors),
shared by ``predictors.FeatureRidgePredictor`` and ``lm_predictor.LMLengthPredictor``.
Pure Python: no numpy, no torch."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

__all__ = ["PREDICTOR_FORMAT", "PREDICTOR_VERSION", "PredictorFileError", "write_predictor_dir",
           "read_predictor_meta"]

PREDICTOR_FORMAT = "mindspeed_rl_asp.length_predictor"
PREDICTOR_VERSION = 1


class PredictorFileError(ValueError):
    """A saved predictor that cannot be loaded; the message names the file and the problem."""


def write_predictor_dir(path, meta: dict, write_tensors) -> Path:
    """``path``/meta.json (+ what ``write_tensors(tmp_dir)`` writes), built in a temp
    directory beside ``path`` and renamed into place: a reader never sees half a predictor."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write_tensors(tmp)
        full = {"format": PREDICTOR_FORMAT, "version": PREDICTOR_VERSION, **meta}
        (tmp / "meta.json").write_text(json.dumps(full, indent=1) + "\n", encoding="utf-8")
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def read_predictor_meta(path, kind: str | None = None) -> dict:
    """``meta.json`` of a saved predictor, checked: format, version and (if given) kind."""
    file = Path(path) / "meta.json"
    if not file.is_file():
        raise PredictorFileError(f"{path}: not a saved length predictor (no meta.json)")
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PredictorFileError(f"{file}: not JSON ({error})") from None
    if not isinstance(meta, dict) or meta.get("format") != PREDICTOR_FORMAT:
        raise PredictorFileError(f"{file}: not a saved length predictor (format is not {PREDICTOR_FORMAT!r})")
    if meta.get("version") != PREDICTOR_VERSION:
        raise PredictorFileError(f"{file}: version {meta.get('version')!r}, this code reads {PREDICTOR_VERSION}")
    if kind is not None and meta.get("kind") != kind:
        raise PredictorFileError(f"{file}: holds a {meta.get('kind')!r} predictor, not {kind!r}")
    return meta
