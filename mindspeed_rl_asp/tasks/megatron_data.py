"""Preprocessed (Megatron indexed) datasets, as MindSpeed-RL's ``data_path`` names them.

MindSpeed-RL's ``preprocess_data.py`` turns a prompt file into one indexed dataset per
field, ``<prefix>_packed_<field>_document.bin`` / ``.idx`` (fields ``input_ids``, the
chat-templated prompt, and the ``dataset_additional_keys`` such as ``labels``, the
reference answer), and a job's ``megatron_training.data_path`` is ``<prefix>``. This
module reads that layout itself (nothing of MindSpeed-RL or Megatron is imported), from
the format Megatron-LM documents for its ``MMIDIDX`` index:

    .idx: b"MMIDIDX\\x00\\x00", u64 version (1), u8 dtype code, u64 sequence count S,
          u64 document count D, int32 lengths[S], int64 byte offsets into .bin[S],
          int64 document boundaries[D] (the first 0, the last S)
    .bin: every sequence's tokens back to back, in the dtype of the code
          (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)

:func:`read_packed` gives each field's sequences; :func:`packed_rows` decodes them into
rows of text with the model's tokenizer (``task=dataset`` reads them like a jsonl file's).
:func:`write_indexed` writes the same layout (for tests and small conversions).
Every problem raises :class:`~mindspeed_rl_asp.tasks.base.TaskError` naming the path.
"""
from __future__ import annotations

import glob
import re
import struct
from pathlib import Path
from typing import Mapping, Sequence

from .base import TaskError

HEADER = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
IGNORE_INDEX = -100     # a label that is no token (Megatron's and MindSpeed-RL's)


def field_prefix(prefix: str, field: str) -> str:
    return f"{prefix}_packed_{field}_document"


def packed_fields(prefix: str) -> list[str]:
    """The fields that have both files under ``prefix`` (sorted); empty when none."""
    pattern = re.compile(re.escape(prefix) + r"_packed_(.+)_document\.idx$")
    fields = []
    for idx in glob.glob(glob.escape(prefix) + "_packed_*_document.idx"):
        match = pattern.match(idx)
        if match and Path(idx[:-4] + ".bin").is_file():
            fields.append(match.group(1))
    return sorted(fields)


def is_packed(prefix: str) -> bool:
    return bool(packed_fields(prefix))


def missing_message(prefix: str, key: str = "task.path") -> str:
    return (f"{key}={prefix!r}: no such file and no preprocessed dataset there (expected "
            f"{field_prefix(prefix, 'input_ids')}.idx and .bin, as MindSpeed-RL's preprocess_data.py writes them "
            "for megatron_training.data_path); point it at the prefix those files start with, or at a .jsonl / "
            ".parquet file")


def read_index(idx_path: str):
    """(dtype name, lengths, byte offsets) of one ``.idx`` file."""
    import numpy as np

    data = Path(idx_path).read_bytes()
    head = len(HEADER) + 8 + 1 + 8 + 8
    if len(data) < head or data[:len(HEADER)] != HEADER:
        raise TaskError(f"{idx_path}: not a Megatron indexed dataset index (no MMIDIDX header)")
    version, code, count, documents = struct.unpack_from("<QBQQ", data, len(HEADER))
    if version != VERSION or code not in DTYPES:
        raise TaskError(f"{idx_path}: index version {version} / dtype code {code} is not one this reader knows "
                        f"(version {VERSION}, codes {sorted(DTYPES)})")
    if len(data) < head + count * 12 + documents * 8:
        raise TaskError(f"{idx_path}: truncated: the header says {count} sequences, the file is shorter")
    lengths = np.frombuffer(data, dtype="<i4", count=count, offset=head)
    offsets = np.frombuffer(data, dtype="<i8", count=count, offset=head + count * 4)
    return DTYPES[code], lengths, offsets


def read_sequences(path_prefix: str) -> list:
    """Every sequence of ``<path_prefix>.idx`` / ``.bin`` as a numpy array."""
    import numpy as np

    dtype, lengths, offsets = read_index(path_prefix + ".idx")
    bin_path = path_prefix + ".bin"
    data = np.memmap(bin_path, dtype=np.uint8, mode="r") if Path(bin_path).stat().st_size else np.zeros(0, np.uint8)
    size = np.dtype(dtype).itemsize
    sequences = []
    for i, (length, offset) in enumerate(zip(lengths.tolist(), offsets.tolist())):
        end = offset + length * size
        if offset < 0 or end > len(data):
            raise TaskError(f"{bin_path}: sequence {i} ({length} tokens at byte {offset}) lies past the end of the "
                            f"file ({len(data)} bytes); the .bin and .idx files do not belong together")
        sequences.append(np.frombuffer(data[offset:end].tobytes(), dtype=dtype))
    return sequences


def read_packed(prefix: str, key: str = "task.path") -> dict[str, list]:
    """Each field's sequences under ``prefix``; the fields must have as many rows each."""
    fields = packed_fields(prefix)
    if not fields:
        raise TaskError(missing_message(prefix, key))
    packed = {field: read_sequences(field_prefix(prefix, field)) for field in fields}
    counts = {field: len(rows) for field, rows in packed.items()}
    if len(set(counts.values())) > 1:
        raise TaskError(f"{key}={prefix!r}: the fields have different row counts {counts}; preprocess them together")
    if not next(iter(counts.values())):
        raise TaskError(f"{key}={prefix!r}: the dataset has no rows")
    return packed


def packed_rows(prefix: str, tokenizer, key: str = "task.path") -> list[dict]:
    """The rows of the dataset at ``prefix``, each field decoded to text: ``input_ids`` with
    its special tokens (it is the whole chat-templated prompt), every other field (the
    answer in ``labels``) without them, as MindSpeed-RL's reward decodes it, label
    positions of ``IGNORE_INDEX`` dropped."""
    if tokenizer is None:
        raise TaskError(f"{key}={prefix!r} is a preprocessed dataset of token ids: reading it needs the model's "
                        "tokenizer (model.path)")
    packed = read_packed(prefix, key)
    rows = []
    for i in range(len(next(iter(packed.values())))):
        row = {}
        for field, sequences in packed.items():
            ids = [int(t) for t in sequences[i].tolist() if int(t) >= 0]
            row[field] = tokenizer.decode(ids, skip_special_tokens=field != "input_ids")
        rows.append(row)
    return rows


class Rows(list):
    """Rows as a list of dicts with ``column_names`` (what tasks/dataset.py reads of a
    ``datasets.Dataset``)."""

    @property
    def column_names(self) -> list[str]:
        return list(self[0]) if self else []


def write_indexed(path_prefix: str, sequences: Sequence[Sequence[int]], dtype: str = "int32") -> None:
    """Write ``sequences`` as ``<path_prefix>.bin`` / ``.idx`` in the layout above (one
    document per sequence)."""
    import numpy as np

    code = {name: c for c, name in DTYPES.items()}[dtype]
    arrays = [np.asarray(s, dtype=dtype) for s in sequences]
    lengths = np.array([len(a) for a in arrays], dtype="<i4")
    offsets = np.concatenate([[0], np.cumsum(lengths.astype("<i8") * np.dtype(dtype).itemsize)[:-1]]).astype("<i8") \
        if arrays else np.zeros(0, "<i8")
    documents = np.arange(len(arrays) + 1, dtype="<i8")
    with open(path_prefix + ".bin", "wb") as out:
        for a in arrays:
            out.write(a.tobytes(order="C"))
    with open(path_prefix + ".idx", "wb") as out:
        out.write(HEADER + struct.pack("<QBQQ", VERSION, code, len(arrays), len(documents)))
        out.write(lengths.tobytes() + offsets.tobytes() + documents.tobytes())


def write_packed(prefix: str, fields: Mapping[str, Sequence[Sequence[int]]], dtype: str = "int32") -> None:
    """Every field of ``fields`` under ``prefix`` (``<prefix>_packed_<field>_document``)."""
    for field, sequences in fields.items():
        write_indexed(field_prefix(prefix, field), sequences, dtype)
