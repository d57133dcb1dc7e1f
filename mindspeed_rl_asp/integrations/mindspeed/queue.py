"""The Training Queue's samples through MindSpeed-RL's own data channel (TransferDock or
TransferQueue), so that its reward, reference, log-prob, advantage and update stages read
ASP's samples with the columns and indexes they already use.

What stays here and what stays in the core: ASP's Training Queue is the control core's
(``control/queue.py``: capacity, watermarks, staleness admission, which groups a step
takes, when a version is refreshed); none of that moves into the dock. The dock is the
data channel of one training step, exactly as MindSpeed-RL uses it: sized to one step
(``prompts_num = global_batch_size`` prompt groups), filled, read by every stage, then
``clear()``-ed. When the core issues ``TrainStep(step, prompt_ids)``, the Training Unit
writes those groups into rows ``0 .. B*n-1`` (group ``g`` in rows ``g*n .. g*n+n-1``,
MindSpeed-RL's n-samples-per-prompt row layout) with the columns its rollout stage would
have written (``prompts``, ``prompt_length``, ``responses``, ``response_length``,
``input_ids``) plus two ASP columns registered as ``addition_columns``:
``rollout_log_prob`` (the behaviour log-probs the off-policy correction needs) and
``policy_version`` (the version on the data). Why not stream groups into a long-lived
dock as they finish: GRPOTransferDock frees rows only all at once (``clear``; the per-row
clear of its partial-rollout mode re-sorts rows by age), so a dock that outlives a step
would keep finished groups' rows until every group in it is trained.

Pure part (run everywhere): :class:`DockLayout`, :func:`groups_to_columns`,
:func:`columns_to_groups`. Shell: :class:`DockChannel` over one of three handles with the
same two calls (``put_experience`` / ``get_experience``): the real ``GRPOTransferDock``
Ray actor, MindSpeed-RL's ``TransferQueueClient`` (a topic), or the in-process model of
the dock's semantics (``dock_model.InProcessDock``) the tests use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

# The channel names and the start-up check live with the config (config/validate.py may
# not import this package); re-exported here.
from ...config.validate import DATA_CHANNELS, data_channel_problems

__all__ = ["ASP_COLUMNS", "DATA_CHANNELS", "DockGroup", "DockLayout", "DockChannel", "ChannelError",
           "groups_to_columns", "columns_to_groups", "make_channel", "data_channel_problems"]


# Columns GRPOTransferDock does not have and ASP adds (``addition_columns``).
ASP_COLUMNS = ("rollout_log_prob", "policy_version")
# What MindSpeed-RL's rollout stage writes for a sample (actor_hybrid_worker.sync_generate_process
# and put_prompts_experience), which its later stages read.
ROLLOUT_COLUMNS = ("prompts", "prompt_length", "responses", "response_length", "input_ids")
WRITTEN_COLUMNS = ROLLOUT_COLUMNS + ASP_COLUMNS
# The consumer the Training Unit reads back as (one of GRPOTransferDock's consumers).
TRAINER_CONSUMER = "actor_train"


class ChannelError(RuntimeError):
    """The data channel refused a put or a get; the message says what to change."""


@dataclass
class DockGroup:
    """One prompt group read back from the channel: the attributes of
    ``runtime.generation_unit.SampleGroup`` (numpy arrays), built here without importing
    the runtime (integrations is a lower layer)."""

    prompt_id: str
    prompt_ids: Any
    response_ids: list
    logprobs: list
    version: int


@dataclass(frozen=True)
class DockLayout:
    """Rows of one step: group slot ``g`` holds rows ``g*n .. g*n+n-1``."""

    prompts_num: int
    n_samples_per_prompt: int

    def __post_init__(self) -> None:
        if self.prompts_num < 1 or self.n_samples_per_prompt < 1:
            raise ChannelError(f"prompts_num={self.prompts_num} and n_samples_per_prompt="
                               f"{self.n_samples_per_prompt} must be >= 1")

    @property
    def max_len(self) -> int:
        return self.prompts_num * self.n_samples_per_prompt

    def rows(self, slot: int) -> list[int]:
        if not 0 <= slot < self.prompts_num:
            raise ChannelError(f"group slot {slot} outside the dock's {self.prompts_num} prompt groups")
        n = self.n_samples_per_prompt
        return list(range(slot * n, slot * n + n))

    def slot_of(self, row: int) -> int:
        return row // self.n_samples_per_prompt


def groups_to_columns(groups: Sequence[Any], layout: DockLayout) -> tuple[dict[str, list], list[int]]:
    """Groups (``SampleGroup``-like: prompt_ids, response_ids, logprobs, version) as the
    dock's per-row columns (lists of 1-D tensors, int32 ids, float32 log-probs, lengths
    as one-element tensors, as MindSpeed-RL stores them) and their row indexes."""
    import torch

    if len(groups) > layout.prompts_num:
        raise ChannelError(f"{len(groups)} prompt groups do not fit a dock of prompts_num={layout.prompts_num}; "
                           "size it to rl.global_batch_size")
    columns: dict[str, list] = {name: [] for name in WRITTEN_COLUMNS}
    indexes: list[int] = []
    for slot, group in enumerate(groups):
        if len(group.response_ids) != layout.n_samples_per_prompt:
            raise ChannelError(f"prompt {group.prompt_id!r} has {len(group.response_ids)} samples; the dock holds "
                               f"n_samples_per_prompt={layout.n_samples_per_prompt} per prompt")
        prompt = torch.as_tensor(group.prompt_ids, dtype=torch.int32).reshape(-1)
        for response, logprobs in zip(group.response_ids, group.logprobs):
            response = torch.as_tensor(response, dtype=torch.int32).reshape(-1)
            columns["prompts"].append(prompt.clone())
            columns["prompt_length"].append(torch.tensor([len(prompt)], dtype=torch.int32))
            columns["responses"].append(response)
            columns["response_length"].append(torch.tensor([len(response)], dtype=torch.int32))
            columns["input_ids"].append(torch.cat([prompt, response]))
            columns["rollout_log_prob"].append(torch.as_tensor(logprobs, dtype=torch.float32).reshape(-1))
            columns["policy_version"].append(torch.tensor([group.version], dtype=torch.int32))
        indexes.extend(layout.rows(slot))
    return columns, indexes


def _rows_of(batch: Mapping[str, Any], column: str, lengths: list[int]) -> list:
    """The rows of ``column`` cut to their true lengths: the dock returns right-padded
    2-D tensors (``padding_dict_to_tensor_dict``); a list of 1-D tensors is cut the same."""
    values = batch[column]
    return [values[i].reshape(-1)[:length] for i, length in enumerate(lengths)]


def columns_to_groups(batch: Mapping[str, Any], indexes: Sequence[int], layout: DockLayout,
                      prompt_ids: Mapping[int, str]) -> list[DockGroup]:
    """What ``get_experience`` returned (padded columns, row indexes in any order) back
    into whole groups, in slot order. ``prompt_ids``: slot -> ASP prompt id (the dock
    stores tensors only). Lengths come from the length columns, never from the padding."""
    import numpy as np

    missing = [c for c in ("prompts", "prompt_length", "responses", "response_length") if c not in batch]
    if missing:
        raise ChannelError(f"the channel returned no {missing} columns (got {sorted(batch)})")
    prompt_lengths = [int(x) for x in batch["prompt_length"].reshape(-1)]
    response_lengths = [int(x) for x in batch["response_length"].reshape(-1)]
    if len(response_lengths) != len(indexes):
        raise ChannelError(f"{len(response_lengths)} rows returned for {len(indexes)} indexes")
    prompts = _rows_of(batch, "prompts", prompt_lengths)
    responses = _rows_of(batch, "responses", response_lengths)
    logprobs = (_rows_of(batch, "rollout_log_prob", response_lengths) if "rollout_log_prob" in batch
                else [None] * len(indexes))
    versions = ([int(x) for x in batch["policy_version"].reshape(-1)] if "policy_version" in batch
                else [-1] * len(indexes))
    rows: dict[int, dict[int, int]] = {}
    for position, row in enumerate(indexes):
        rows.setdefault(layout.slot_of(row), {})[row % layout.n_samples_per_prompt] = position
    groups = []
    for slot in sorted(rows):
        members = rows[slot]
        if len(members) != layout.n_samples_per_prompt:
            raise ChannelError(f"group slot {slot}: {len(members)} of its {layout.n_samples_per_prompt} rows "
                               "returned; read whole groups (get_n_samples=True or all of a group's indexes)")
        if slot not in prompt_ids:
            raise ChannelError(f"group slot {slot} holds no prompt this channel put")
        order = [members[k] for k in range(layout.n_samples_per_prompt)]
        group_versions = {versions[p] for p in order}
        if len(group_versions) != 1:
            raise ChannelError(f"prompt {prompt_ids[slot]!r}: its samples carry versions {sorted(group_versions)}")
        groups.append(DockGroup(
            prompt_id=prompt_ids[slot], prompt_ids=prompts[order[0]].numpy().astype(np.int32),
            response_ids=[responses[p].numpy().astype(np.int32) for p in order],
            logprobs=[None if logprobs[p] is None else logprobs[p].numpy().astype(np.float32) for p in order],
            version=group_versions.pop()))
    return groups


# ----------------------------------------------------------------------------- shell
class DockChannel:
    """One step's groups through a dock-like channel. ``put`` / ``get`` are the two calls
    of the handle (``call(name, **kwargs)`` runs one: a Ray actor method, a client
    method, or the in-process model's)."""

    def __init__(self, call: Callable[..., Any], layout: DockLayout, clear: Callable[[], Any]):
        self._call = call
        self._clear = clear
        self.layout = layout
        self.prompt_ids: dict[int, str] = {}

    def put_groups(self, groups: Sequence[Any]) -> list[int]:
        if self.prompt_ids:
            raise ChannelError("the channel still holds the previous step's groups; clear() it after each step")
        columns, indexes = groups_to_columns(groups, self.layout)
        self._call("put_experience", data_dict=columns, indexes=indexes)
        self.prompt_ids = {slot: g.prompt_id for slot, g in enumerate(groups)}
        return indexes

    def get_groups(self, consumer: str = TRAINER_CONSUMER, columns: Sequence[str] = WRITTEN_COLUMNS) -> list[DockGroup]:
        """Every group put this step, read as ``consumer`` by explicit indexes (MindSpeed-RL's
        ``guarantee_order`` path: no random sampling, and no GBS_train gate)."""
        indexes = [row for slot in sorted(self.prompt_ids) for row in self.layout.rows(slot)]
        batch, returned = self._call("get_experience", consumer=consumer, experience_columns=list(columns),
                                     indexes=indexes)
        if batch is None:
            raise ChannelError(f"the channel returned nothing to {consumer!r} for {len(indexes)} rows")
        return columns_to_groups(batch, returned, self.layout, self.prompt_ids)

    def clear(self) -> None:
        self._clear()
        self.prompt_ids = {}


def make_channel(kind: str, prompts_num: int, n_samples_per_prompt: int) -> DockChannel | None:
    """The Training Unit's data channel for ``train.data_channel``: None for ``local`` (the
    payloads stay Ray object references), else MindSpeed-RL's dock or queue on the running
    Ray. Imports mindspeed_rl here only; without it, one error that says what to install."""
    if kind not in DATA_CHANNELS:
        raise ChannelError(f"train.data_channel={kind!r} is not one of {', '.join(DATA_CHANNELS)}")
    if kind == "local":
        return None
    layout = DockLayout(prompts_num, n_samples_per_prompt)
    try:
        import ray
        from mindspeed_rl.utils.metrics import Metric
    except ImportError as error:
        raise ChannelError(f"train.data_channel={kind} needs MindSpeed-RL importable ({error}); put a checkout "
                           "of Ascend/MindSpeed-RL on PYTHONPATH with its requirements (tensordict, codetiming, "
                           "...; docs/mindspeed_rl_adapters.md), or use train.data_channel=local") from error
    if kind == "transfer_dock":
        from mindspeed_rl.trainer.utils.transfer_dock import GRPOTransferDock

        # GBS_train = one step's prompts: its default 0 makes n-sample reads return nothing.
        dock = GRPOTransferDock.remote(prompts_num=prompts_num, n_samples_per_prompt=n_samples_per_prompt,
                                       metrics=Metric(), GBS_train=prompts_num, addition_columns=list(ASP_COLUMNS))
        channel = DockChannel(lambda name, **kw: ray.get(getattr(dock, name).remote(**kw)), layout,
                              lambda: ray.get(dock.clear.remote()))
        channel.handle = dock   # what MindSpeed-RL's workers get in init_transfer_dock(td)
        return channel
    from mindspeed_rl.utils.transfer_queue.tq_client import get_transfer_queue_client
    from mindspeed_rl.utils.transfer_queue.tq_mgr import TransferQueueManager

    try:
        manager = ray.get_actor("TransferQueueManager")
    except ValueError:
        manager = TransferQueueManager.remote(nums_tq_data=1, base_port=None)
        ray.get(manager.init_ready.remote())
    client = get_transfer_queue_client()
    topic = "asp_training_queue"
    client.add_topic(prompts_num=prompts_num, n_samples_per_prompt=n_samples_per_prompt,
                     experience_columns=list(WRITTEN_COLUMNS) + ["rm_scores", "old_log_prob", "ref_log_prob",
                                                                 "advantages", "returns", "token_level_rewards"],
                     experience_consumers=[TRAINER_CONSUMER, "rule_reward", "ref_log_prob", "actor_log_prob",
                                           "compute_advantage", "grpo_metrics"],
                     metrics=Metric(), topic=topic, GBS_train=prompts_num)
    channel = DockChannel(lambda name, **kw: getattr(client, name)(topic=topic, **kw), layout,
                          lambda: client.clear_topic(topic=topic))
    channel.handle = client
    # A named, non-detached Ray actor lives as long as its creator's handle: keep it.
    channel.manager = manager
    return channel
