"""The Training Queue's samples through MindSpeed-RL's data channel (integrations/mindspeed/
queue.py), over the in-process model of GRPOTransferDock (dock_model.py). The same calls
run against the real dock in tests/test_mindspeed_contract.py."""
import importlib.util

import numpy as np
import pytest
import torch

from mindspeed_rl_asp.integrations.mindspeed.dock_model import InProcessDock, pad_columns, unpad_columns
from mindspeed_rl_asp.integrations.mindspeed.queue import (
    ASP_COLUMNS, ChannelError, DockChannel, DockLayout, columns_to_groups, data_channel_problems,
    groups_to_columns, make_channel)
from mindspeed_rl_asp.runtime.generation_unit import SampleGroup

N = 3


def sample_group(pid: str, seed: int, version: int = 0, n: int = N) -> SampleGroup:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(1, 100, size=int(rng.integers(2, 6)), dtype=np.int32)
    responses = [rng.integers(1, 100, size=int(rng.integers(1, 7)), dtype=np.int32) for _ in range(n)]
    return SampleGroup(pid, prompt, responses, [rng.standard_normal(len(r)).astype(np.float32) for r in responses],
                       version)


def in_process_channel(prompts: int, n: int = N, gbs: int | None = None) -> tuple[DockChannel, InProcessDock]:
    dock = InProcessDock(prompts, n, GBS_train=prompts if gbs is None else gbs, addition_columns=list(ASP_COLUMNS))
    return DockChannel(lambda name, **kw: getattr(dock, name)(**kw), DockLayout(prompts, n), dock.clear), dock


def assert_same_groups(got, want):
    assert [g.prompt_id for g in got] == [g.prompt_id for g in want]
    for a, b in zip(got, want):
        assert a.version == b.version
        assert np.array_equal(a.prompt_ids, b.prompt_ids) and a.prompt_ids.dtype == np.int32
        assert all(np.array_equal(x, y) for x, y in zip(a.response_ids, b.response_ids))
        assert all(np.array_equal(x, y) for x, y in zip(a.logprobs, b.logprobs))


def test_columns_follow_mindspeed_rl_row_layout():
    groups = [sample_group("p0", 0, version=4), sample_group("p1", 1, version=5)]
    columns, indexes = groups_to_columns(groups, DockLayout(2, N))
    assert indexes == [0, 1, 2, 3, 4, 5]
    assert len(columns["prompts"]) == 6 and columns["responses"][4].dtype == torch.int32
    # Every sample of a prompt repeats the prompt (put_prompts_experience); input_ids = prompt + response.
    assert torch.equal(columns["prompts"][3], torch.as_tensor(groups[1].prompt_ids))
    assert torch.equal(columns["input_ids"][4], torch.cat([torch.as_tensor(groups[1].prompt_ids),
                                                           torch.as_tensor(groups[1].response_ids[1])]))
    assert columns["response_length"][2].tolist() == [len(groups[0].response_ids[2])]
    assert columns["policy_version"][5].tolist() == [5]
    assert columns["rollout_log_prob"][0].dtype == torch.float32


def test_round_trip_through_the_dock_model():
    channel, dock = in_process_channel(4)
    groups = [sample_group(f"p{i}", i, version=i % 2) for i in range(4)]
    channel.put_groups(groups)
    assert_same_groups(channel.get_groups(), groups)
    assert dock.all_consumed("actor_train")
    channel.clear()
    assert not dock.all_consumed("actor_train") and channel.prompt_ids == {}


def test_mindspeed_rl_stages_read_whole_groups_and_write_back():
    """What rule_reward / compute_advantage do: n-sample reads, then put their column."""
    channel, dock = in_process_channel(4)
    groups = [sample_group(f"p{i}", i) for i in range(4)]
    channel.put_groups(groups)
    batch, index = dock.get_experience("rule_reward", ["prompts", "responses", "response_length"],
                                       experience_count=2 * N, get_n_samples=True)
    assert len(index) == 2 * N and sorted({i // N for i in index}) == [0, 1]
    dock.put_experience({"rm_scores": [torch.tensor([1.0])] * len(index)}, indexes=index)
    batch, index2 = dock.get_experience("rule_reward", ["prompts", "responses", "response_length"],
                                        experience_count=2 * N)
    assert sorted({i // N for i in index2}) == [2, 3]
    assert dock.get_experience("rule_reward", ["responses"], experience_count=2 * N) == (None, None)
    # The advantage stage sees only groups whose scores are in.
    _, ready = dock.get_experience("compute_advantage", ["responses", "rm_scores", "response_length"],
                                   experience_count=2 * N)
    assert sorted(ready) == list(range(2 * N))


def test_default_gbs_train_returns_nothing():
    """GRPOTransferDock's GBS_train=0 makes n-sample reads return nothing, forever."""
    channel, dock = in_process_channel(2, gbs=0)
    channel.put_groups([sample_group("a", 0), sample_group("b", 1)])
    assert dock.get_experience("rule_reward", ["responses"], experience_count=N) == (None, None)


def test_rows_returned_in_any_order_rebuild_the_groups():
    groups = [sample_group("x", 7, version=2), sample_group("y", 8, version=3)]
    layout = DockLayout(2, N)
    columns, indexes = groups_to_columns(groups, layout)
    order = [4, 0, 5, 2, 1, 3]
    batch = pad_columns({k: [v[i] for i in order] for k, v in columns.items()})
    assert_same_groups(columns_to_groups(batch, order, layout, {0: "x", 1: "y"}), groups)
    assert [len(r) for r in unpad_columns(batch)["responses"]] == [len(columns["responses"][i]) for i in order]


def test_bad_use_says_what_to_change():
    channel, _ = in_process_channel(2)
    with pytest.raises(ChannelError, match="size it to rl.global_batch_size"):
        channel.put_groups([sample_group(p, i) for i, p in enumerate("abc")])
    with pytest.raises(ChannelError, match="has 2 samples"):
        channel.put_groups([sample_group("a", 0, n=2)])
    channel.put_groups([sample_group("a", 0)])
    with pytest.raises(ChannelError, match="clear\\(\\) it after each step"):
        channel.put_groups([sample_group("b", 1)])
    layout = DockLayout(1, N)
    columns, _ = groups_to_columns([sample_group("a", 0)], layout)
    half = pad_columns({k: v[:2] for k, v in columns.items()})
    with pytest.raises(ChannelError, match="2 of its 3 rows"):
        columns_to_groups(half, [0, 1], layout, {0: "a"})
    with pytest.raises(ChannelError, match="train.data_channel='bogus'"):
        make_channel("bogus", 2, N)
    assert make_channel("local", 2, N) is None


def test_dock_model_keeps_the_real_docks_errors():
    dock = InProcessDock(2, N)
    with pytest.raises(ValueError, match="not in TD experience_column"):
        dock.put_experience({"rollout_log_prob": [torch.zeros(1)]}, indexes=[0])
    with pytest.raises(ValueError, match="exceeds the Transfer Dock range"):
        dock.put_experience({"responses": [torch.zeros(1)]}, indexes=[6])
    with pytest.raises(ValueError, match="without indexes"):
        dock.put_experience({"responses": [torch.zeros(1)]}, indexes=[])
    with pytest.raises(ValueError, match="not in TD experience_consumers"):
        dock.get_experience("nobody", ["responses"], indexes=[0])


@pytest.mark.skipif(importlib.util.find_spec("mindspeed_rl") is not None, reason="mindspeed_rl is importable here")
def test_dock_channel_without_mindspeed_rl_says_what_to_install():
    with pytest.raises(ChannelError, match="needs MindSpeed-RL importable.*train.data_channel=local"):
        make_channel("transfer_dock", 2, N)


def test_data_channel_problems_before_anything_starts():
    assert data_channel_problems("local", ranks=4) == []
    assert data_channel_problems("dock") == ["train.data_channel='dock' is not one of local, transfer_dock, "
                                             "transfer_queue"]
    assert any("train.ranks=1 (got 2)" in p for p in data_channel_problems("transfer_queue", ranks=2))
    importable = importlib.util.find_spec("mindspeed_rl") is not None
    assert any("needs mindspeed_rl importable" in p for p in data_channel_problems("transfer_dock")) != importable
