"""The one reader of length files: JSONL, one prompt a line, blank lines skipped.

Every file of lengths the project reads goes through :func:`read_length_file`, and every
bad file or record raises :class:`LengthFileError` naming ``file:line`` and the field:

* a profile (``scripts/profile_lengths.py``, ``length_profile.jsonl``, the history
  predictor's ``scheduler.lengths_file``): ``{"id", "prompt", "lengths": [...], ...}``;
* predicted lengths (``asp-schedule input=``, ``predicted_lengths.jsonl``):
  ``{"id", "predicted_length"}``;
* recorded lengths the simulator replays (``sim.lengths_file``): an ``id`` and one of
  ``lengths``, ``length`` (one observed length) or ``predicted_length``, with an
  optional ``prompt_length``.

Observed lengths and prompt lengths are token counts: integers >= 1 (31.0 reads as 31);
a predicted length is a finite number >= 0. Ids are strings, unique in the file.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, Mapping, Optional

from .partition import ScheduleError

__all__ = ["LENGTH_FIELDS", "LengthFileError", "LengthRecord", "read_length_file"]

LENGTH_FIELDS = ("lengths", "length", "predicted_length")   # looked for in this order
_RESPONSE_FLOOR = "a response has at least its end-of-text token"


class LengthFileError(ScheduleError):
    """A bad length file or record; the message names ``file:line``, the field and what
    was expected. (A ScheduleError, so the commands print it as one line.)"""


@dataclass(frozen=True)
class LengthRecord:
    """One line: ``lengths`` are the observed per-sample lengths (``lengths`` or ``length``;
    empty when the line has only a prediction), ``predicted`` the ``predicted_length``
    (None when absent), ``fields`` the whole object (a profile's ``prompt``, ``size``...)."""

    line: int
    id: str
    lengths: tuple[int, ...] = ()
    predicted: Optional[float] = None
    prompt_length: Optional[int] = None
    fields: Mapping[str, Any] = field(default_factory=dict)


def read_length_file(path, need: str = "any", required: tuple[str, ...] = ()) -> list[LengthRecord]:
    """The records of the file at ``path``. ``need``: ``observed`` (``lengths`` or
    ``length``), ``predicted`` (``predicted_length``) or ``any`` (one of the three);
    ``required``: more fields every record must have (a profile's ``prompt``)."""
    if need not in ("observed", "predicted", "any"):
        raise ValueError(f"need={need!r} is not one of observed, predicted, any")
    name = os.fspath(path)
    records: list[LengthRecord] = []
    first_line: dict[str, int] = {}
    with open(name, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = _record(json_object(line, f"{name}:{lineno}"), f"{name}:{lineno}", lineno, need, required)
            if record.id in first_line:
                raise LengthFileError(f"{name}:{lineno}: field 'id'={record.id!r} repeats line "
                                      f"{first_line[record.id]}; ids must be unique")
            first_line[record.id] = lineno
            records.append(record)
    if not records:
        raise LengthFileError(f"{name}: no records (the file is empty or blank); expected one JSON object a line "
                              f"with 'id' and {_expected(need)}")
    return records


def json_object(line: str, where: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise LengthFileError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise LengthFileError(f"{where}: expected a JSON object with 'id' and a length, got a {type(row).__name__}")
    return row


def _record(row: dict, where: str, lineno: int, need: str, required: tuple[str, ...]) -> LengthRecord:
    if "id" not in row:
        raise LengthFileError(f"{where}: field 'id' is missing; every record needs a string id")
    if not isinstance(row["id"], str):
        raise LengthFileError(f"{where}: field 'id'={row['id']!r} must be a string")
    missing = [k for k in required if k not in row]
    if missing:
        raise LengthFileError(f"{where}: field '{missing[0]}' is missing; every record here needs "
                              f"{', '.join(map(repr, required))}")
    lengths: tuple[int, ...] = ()
    if need != "predicted":
        lengths = _observed(row, where)
    predicted = None
    if need == "predicted" or (need == "any" and not lengths):
        predicted = _predicted(row, where, need)
    if need == "observed" and not lengths:
        raise LengthFileError(f"{where}: no observed length; expected 'lengths' (per-sample token counts, as "
                              "scripts/profile_lengths.py writes them) or 'length'")
    prompt_length = (token_count(row["prompt_length"], where, "prompt_length", "a prompt has at least one token")
                     if "prompt_length" in row else None)
    return LengthRecord(lineno, row["id"], lengths, predicted, prompt_length, row)


def _observed(row: dict, where: str) -> tuple[int, ...]:
    if "lengths" in row:
        values = row["lengths"]
        if not isinstance(values, list) or not values:
            raise LengthFileError(f"{where}: field 'lengths'={values!r} must be a non-empty list of token counts")
        return tuple(token_count(v, where, f"lengths[{j}]", _RESPONSE_FLOOR) for j, v in enumerate(values))
    if "length" in row:
        return (token_count(row["length"], where, "length", _RESPONSE_FLOOR),)
    return ()


def _predicted(row: dict, where: str, need: str) -> float:
    if "predicted_length" not in row:
        raise LengthFileError(f"{where}: no length field; expected {_expected(need)}")
    value = row["predicted_length"]
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
        raise LengthFileError(f"{where}: field 'predicted_length'={value!r} must be a finite number >= 0")
    return float(value)


def _expected(need: str) -> str:
    if need == "predicted":
        return "'predicted_length'"
    if need == "observed":
        return "'lengths'"
    return ("one of " + ", ".join(map(repr, LENGTH_FIELDS))
            + " ('lengths': observed per-sample lengths, as scripts/profile_lengths.py writes them)")


def token_count(value: Any, where: str, name: str, why_positive: str) -> int:
    """An observed token count: an integer >= 1 (a float such as 31.0 is accepted as 31)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise LengthFileError(f"{where}: field '{name}'={value!r} is not a number; expected an integer token count")
    if not math.isfinite(value):
        raise LengthFileError(f"{where}: field '{name}'={value} is not finite; expected an integer token count")
    if value != math.floor(value):
        raise LengthFileError(f"{where}: field '{name}'={value} is not an integer; token counts are whole numbers")
    if value < 0:
        raise LengthFileError(f"{where}: field '{name}'={value} is negative; token counts are >= 1")
    if value < 1:
        raise LengthFileError(f"{where}: field '{name}'={value} must be >= 1 ({why_positive})")
    return int(value)
