"""An in-process model of MindSpeed-RL's ``GRPOTransferDock`` (non-partial-rollout mode,
``max_age=1``), written from its source (``trainer/utils/transfer_dock.py``) so that the
queue adapter is tested on machines without MindSpeed-RL. tests/test_mindspeed_contract.py
runs the same calls against the real dock and compares.

The semantics it keeps (each one a rule of the real dock):

* ``prompts_num * n_samples_per_prompt`` rows; prompt group ``g`` is rows ``g*n .. g*n+n-1``.
* Columns: the dock's fifteen GRPO columns plus ``addition_columns``; a put or get of any
  other column raises ``ValueError``; so does a consumer that is not registered.
* ``put_experience(data_dict, indexes)``: ``indexes`` required; an index ``>= max_len``
  raises; each row's value is stored and its column marked ready.
* ``get_experience(consumer, columns, experience_count=None, indexes=None,
  get_n_samples=True)`` with ``indexes``: marks them consumed by ``consumer`` and returns
  them (the real dock blocks until they are ready; this model raises instead of waiting
  forever). Without ``indexes``: ``experience_count`` must divide ``max_len`` (and be a
  multiple of n with ``get_n_samples``); it returns whole ready, unconsumed groups, or
  ``(None, None)`` if fewer are ready, or if ``consumer`` has already consumed
  ``GBS_train * n`` rows (so ``GBS_train=0``, the default, returns nothing, ever).
  The real dock picks among ready groups at random; this model takes the lowest rows
  (the adapter never depends on which).
* Returns right-padded 2-D tensors per column plus ``original_length``
  (``padding_dict_to_tensor_dict``), as a plain dict where the real one is a TensorDict.
* ``all_consumed(consumer)``: every row consumed. ``clear()``: everything reset.
"""
from __future__ import annotations

from typing import Any, Sequence

# GRPOTransferDock.__init__'s experience_columns and experience_consumers (names only).
GRPO_COLUMNS = ("prompts", "prompt_length", "responses", "response_length", "attention_mask", "labels",
                "input_ids", "input_ids_length", "actor_rollout", "rm_scores", "token_level_rewards",
                "old_log_prob", "ref_log_prob", "advantages", "returns")
GRPO_CONSUMERS = ("trainer", "actor_rollout", "actor_image_embeds", "actor_log_prob", "ref_log_prob",
                  "actor_train", "compute_advantage", "rule_reward", "reward_scores", "grpo_metrics")


def pad_columns(columns: dict[str, list]) -> dict[str, Any]:
    """Rows of 1-D tensors -> right-padded (with 0) 2-D tensors, plus ``original_length``
    (every column's row lengths, in column order), as MindSpeed-RL pads what it returns."""
    import torch

    out, lengths = {}, []
    for name, rows in columns.items():
        width = max(len(r) for r in rows)
        out[name] = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])
        lengths.extend(torch.tensor(len(r)) for r in rows)
    out["original_length"] = torch.stack(lengths)
    return out


def unpad_columns(batch: dict[str, Any]) -> dict[str, list]:
    """The inverse of :func:`pad_columns` (``remove_padding_tensor_dict_to_dict``); a batch
    without ``original_length`` is taken as rows already."""
    if "original_length" not in batch:
        return {name: list(rows) for name, rows in batch.items()}
    lengths = batch["original_length"]
    names = [n for n in batch if n != "original_length"]
    out = {}
    for i, name in enumerate(names):
        values = batch[name]
        rows = len(values)
        out[name] = [values[r][: int(lengths[i * rows + r])] for r in range(rows)]
    return out


class InProcessDock:
    """See the module docstring. Method names and keywords are the real dock's."""

    def __init__(self, prompts_num: int, n_samples_per_prompt: int, metrics=None, max_age: int = 1,
                 GBS_train: int = 0, addition_columns: Sequence[str] | None = None,  # noqa: N803 - its name
                 addition_consumers: Sequence[str] | None = None):
        if max_age != 1:
            raise NotImplementedError("the model covers GRPOTransferDock without partial rollout (max_age=1)")
        self.prompts_num = prompts_num
        self.n_samples_per_prompt = n_samples_per_prompt
        self.max_len = prompts_num * n_samples_per_prompt
        self.GBS_train = GBS_train
        self.columns = list(GRPO_COLUMNS) + [c for c in addition_columns or () if c not in GRPO_COLUMNS]
        self.consumers = list(GRPO_CONSUMERS) + [c for c in addition_consumers or () if c not in GRPO_CONSUMERS]
        self.clear()

    def clear(self, consumer: str = "actor_train") -> None:
        self.data = {c: [None] * self.max_len for c in self.columns}
        self.ready = {c: [False] * self.max_len for c in self.columns}
        self.consumed = {c: [False] * self.max_len for c in self.consumers}

    def put_experience(self, data_dict: dict, indexes: list[int] | None = None, is_prompt: bool = False) -> None:
        if not indexes:
            raise ValueError("put experience into TD without indexes, indexes must be provided")
        rows = unpad_columns(data_dict)
        for name in rows:
            if name not in self.columns:
                raise ValueError(f"put experience ERROR: {name} not in TD experience_column {self.columns}")
        if max(indexes) >= self.max_len:
            raise ValueError(f"Put experience index {max(indexes)} exceeds the Transfer Dock range {self.max_len}.")
        for name, values in rows.items():
            for value, index in zip(values, indexes):
                if index >= 0:
                    self.data[name][index] = value
                    self.ready[name][index] = True

    def _ready_groups(self, consumer: str, columns: Sequence[str]) -> list[int]:
        n = self.n_samples_per_prompt
        return [g for g in range(self.prompts_num)
                if not any(self.consumed[consumer][g * n + k] for k in range(n))
                and all(self.ready[c][g * n + k] for c in columns for k in range(n))]

    def get_experience(self, consumer: str, experience_columns: list[str], experience_count: int | None = None,
                       dp_size: int = 1, indexes: list[int] | None = None, get_n_samples: bool = True,
                       use_batch_seqlen_balance: bool = False, allow_partial_ready_data: bool = False):
        if consumer not in self.consumers:
            raise ValueError(f"get experience ERROR: {consumer} not in TD experience_consumers {self.consumers}")
        for name in experience_columns:
            if name not in self.columns:
                raise ValueError(f"get experience ERROR: {name} not in TD experience_column {self.columns}")
        n = self.n_samples_per_prompt
        if indexes is None:
            if experience_count > self.max_len or self.max_len % experience_count:
                raise ValueError(f"TD max_len:{self.max_len} need be divisible by experience_count: "
                                 f"{experience_count}")
            if get_n_samples and experience_count % n:
                raise ValueError(f"get_n_samples need experience_count:{experience_count} must be divisible by "
                                 f"n_samples_per_prompt: {n}")
            if not get_n_samples:
                raise NotImplementedError("the model reads whole groups (get_n_samples=True) or explicit indexes")
            groups = self._ready_groups(consumer, experience_columns)
            if len(groups) < experience_count // n or sum(self.consumed[consumer]) >= self.GBS_train * n:
                return None, None
            indexes = [g * n + k for g in groups[: experience_count // n] for k in range(n)]
        not_ready = [(c, i) for c in experience_columns for i in indexes if not self.ready[c][i]]
        if not_ready:
            raise TimeoutError(f"rows not ready (the real dock would wait for them): {not_ready[:3]}")
        for index in indexes:
            self.consumed[consumer][index] = True
        return pad_columns({c: [self.data[c][i] for i in indexes] for c in experience_columns}), list(indexes)

    def all_consumed(self, consumer: str, get_n_samples: bool = True) -> bool:
        return sum(self.consumed[consumer]) == self.max_len

    def get_consumer_status(self) -> dict:
        return {c: list(v) for c, v in self.consumed.items()}
