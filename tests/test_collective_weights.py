"""Collective weight transport without Ray: flat layouts, buckets, gloo pair groups (both
ends in one process, on two threads), failures mid-transfer, ordering, and the config
keys and placement of trainer ranks."""
import threading

import pytest
import torch
from omegaconf import OmegaConf

from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.config.validate import ConfigError
from mindspeed_rl_asp.engines.hf_fsdp import micro_batches, shard_rows
from mindspeed_rl_asp.config.placement import plan_placement
from mindspeed_rl_asp.weights.collective import (FlatLayout, TransferError, Turns, WeightReceiver, WeightSender,
                                                 backend_for)
from mindspeed_rl_asp.weights.store import DirectorySnapshots


def state(seed=0):
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(50, 8, generator=g)
    return {"embed.weight": emb, "layer.w": torch.randn(3, 7, generator=g), "layer.b": torch.randn(7, generator=g),
            "norm": torch.randn(5, generator=g).to(torch.bfloat16), "steps": torch.arange(3), "lm_head.weight": emb}


def test_flat_layout_round_trips_and_stores_tied_tensors_once():
    tensors = state()
    layout = FlatLayout.of(tensors)
    assert layout.aliases == (("lm_head.weight", "embed.weight"),)
    assert all(s.offset % 64 == 0 for s in layout.specs)
    views = layout.views(layout.pack(tensors))
    assert set(views) == set(tensors)
    for name, t in tensors.items():
        assert views[name].dtype == t.dtype and torch.equal(views[name], t)
    assert views["lm_head.weight"].data_ptr() == views["embed.weight"].data_ptr()
    buckets = layout.buckets(100)
    assert buckets[0][0] == 0 and buckets[-1][1] == layout.total_bytes
    assert all(a[1] == b[0] for a, b in zip(buckets, buckets[1:])) and all(hi - lo <= 100 for lo, hi in buckets)


@pytest.mark.parametrize("n,world", [(32, 2), (9, 2), (7, 3), (1, 2)])
def test_rank_blocks_partition_the_batch(n, world):
    blocks = [shard_rows(n, r, world) for r in range(world)]
    assert [i for b in blocks for i in b] == list(range(n))
    assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
    assert [i for m in micro_batches(blocks[0], 4) for i in m] == list(blocks[0])


def transfer(sender, receiver, handle, version, generation, seq):
    """Run one transfer with the receiver on another thread; (receiver result or error, sender error)."""
    out = {}

    def receive():
        try:
            out["r"] = receiver.receive(handle, generation, seq)
        except Exception as error:  # noqa: BLE001
            out["r"] = error

    thread = threading.Thread(target=receive)
    thread.start()
    try:
        sender.send(0, version, generation, seq)
        out["s"] = None
    except Exception as error:  # noqa: BLE001
        out["s"] = error
    thread.join(30)
    return out["r"], out["s"]


def test_gloo_pair_transfer_in_buckets_fails_cleanly_mid_way_and_recovers():
    sender = WeightSender("gloo", bucket_bytes=256, timeout_s=20)
    receiver = WeightReceiver(0)
    handle = sender.stage(1, state(1))
    assert handle.host == "127.0.0.1" and handle.num_buckets > 3
    views, _, stats = transfer(sender, receiver, handle, 1, 0, 0)[0]
    assert stats.bytes == handle.layout.total_bytes and stats.buckets == handle.num_buckets
    assert all(torch.equal(views[k], v) for k, v in state(1).items())

    # Mid-way: the sender stops after 2 buckets and drops the group; the receiver fails at
    # once (not at the timeout) and says how far it got; nothing is returned to load.
    sender.inject_failure(2)
    result, send_error = transfer(sender, receiver, handle, 1, 0, 1)
    assert isinstance(send_error, TransferError) and isinstance(result, TransferError)
    assert f"failed after 2 of {handle.num_buckets} buckets" in str(result) and "keeps its old version" in str(result)
    # The failed generation is never reopened; the next one works.
    result, send_error = transfer(sender, receiver, handle, 1, 0, 2)
    assert isinstance(result, TransferError) and isinstance(send_error, TransferError)
    handle2 = sender.stage(2, state(2))
    views, _, _ = transfer(sender, receiver, handle2, 2, 1, 3)[0]
    assert all(torch.equal(views[k], v) for k, v in state(2).items())
    sender.keep_only([2])
    assert sender.versions == [2]


def test_a_version_the_sender_dropped_fails_that_transfer_only():
    sender = WeightSender("gloo", bucket_bytes=1 << 20, timeout_s=20)
    receiver = WeightReceiver(0)
    handle = sender.stage(1, state())
    sender.keep_only([])
    result, send_error = transfer(sender, receiver, handle, 1, 0, 0)
    assert "not staged" in str(send_error)
    assert isinstance(result, TransferError) and "no longer has version 1" in str(result)
    handle = sender.stage(2, state(2))   # the pair group is still good: same generation
    views, _, _ = transfer(sender, receiver, handle, 2, 0, 1)[0]
    assert all(torch.equal(views[k], v) for k, v in state(2).items())


def test_turns_run_transfers_in_their_numbered_order():
    turns, order = Turns(), []

    def run(seq):
        with turns.turn(0, seq, 10):
            order.append(seq)

    threads = [threading.Thread(target=run, args=(s,)) for s in (2, 0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2]
    with pytest.raises(TransferError, match="waited"):
        with turns.turn(1, 1, 0.05):
            pass


def test_directory_snapshots_write_tied_tensors_once(tmp_path):
    snaps = DirectorySnapshots(tmp_path, keep=None)
    snaps.publish(1, state())
    snaps.publish(2, state(2))
    version, loaded = snaps.load(1)
    assert version == 1 and set(loaded) == set(state())
    assert loaded["lm_head.weight"].data_ptr() == loaded["embed.weight"].data_ptr()
    assert snaps.versions() == [1, 2]   # keep=None prunes nothing
    snaps.drop(1)
    snaps.drop(2)                       # the latest stays
    assert snaps.versions() == [2]


def test_backends_follow_the_device_type():
    assert [backend_for(d) for d in ("cpu", "gpu", "npu")] == ["gloo", "nccl", "hccl"]
    with pytest.raises(ValueError, match="layout.device_type"):
        backend_for("tpu")


@pytest.mark.parametrize("overrides,key", [
    (["train.ranks=2"], "train.ranks=2 exceeds the 1 training device(s) (layout.train_nodes x layout.devices_per_node)"),
    (["train.ranks=0"], "train.ranks=0 must be a whole number >= 1 or 'auto'"),
    (["train.ranks=many"], "train.ranks='many'"),
    (["weights.transport=nccl"], "weights.transport='nccl' is not one of object_store, collective, files"),
    (["weights.bucket_mb=0"], "weights.bucket_mb=0.0 must be > 0"),
    (["mode=hybrid", "train.ranks=4"], "exceeds the 3 training device(s) (layout.nodes x layout.devices_per_node)"),
])
def test_bad_ranks_and_transport_keys_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as error:
        load_config(overrides)
    assert key in str(error.value) and "1 problem(s)" in str(error.value)


def test_every_trainer_rank_is_placed_on_the_t_nodes():
    cfg = load_config(["layout=ascend910b3_t4g4", "train.ranks=auto"])
    layout = OmegaConf.to_object(cfg.layout)
    placement = plan_placement(layout, "async", ranks=cfg.train.ranks)
    assert len(placement.trainers) == 32 and placement.trainer is placement.trainers[0]
    assert [s.bundle for s in placement.trainers] == [r // 8 for r in range(32)]
    used = {}
    for slot in (*placement.trainers, *placement.generators):
        used[slot.bundle] = used.get(slot.bundle, 0) + slot.amount
    assert all(amount <= placement.bundles[b][placement.resource] for b, amount in used.items())
    text = placement.describe()
    assert "32 data-parallel ranks" in text and "trainer rank 31: node 3 (1 NPU)" in text
    # One rank is today's trainer: its first node whole.
    assert plan_placement(layout, "async").trainers == (
        placement.trainers[0].__class__("train", 0, 0, 8.0, devices=tuple(range(8))),)   # one rank: the whole node


def test_dry_run_shows_every_rank_and_the_transport(capsys):
    from mindspeed_rl_asp.cli.train import main

    assert main(["--dry-run", "layout.train_nodes=2", "layout.gen_nodes=1", "train.ranks=auto",
                 "weights.transport=collective", "weights.bucket_mb=16"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "trainer rank 0: node 0 (1 CPU)" in out and "trainer rank 1: node 1 (1 CPU)" in out
    assert "collective (gloo pair group per actor, 16 MB buckets, prefetched as the core decides, once published)" in out


def test_dry_run_says_hybrid_sends_at_load_even_with_prefetch(capsys):
    """Colocated, every actor is idle at a publish: the core issues no Prefetch there."""
    from mindspeed_rl_asp.cli.train import main

    assert main(["--dry-run", "mode=hybrid", "weights.transport=collective", "weights.prefetch=true"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "MB buckets, sent at load)" in out
