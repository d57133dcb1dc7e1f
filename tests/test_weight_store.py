"""Versioned snapshots: only whole versions are visible; versions in use are kept."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.weights.store import DirectorySnapshots, VersionedStore, WeightStoreError

ops = st.lists(st.tuples(st.sampled_from(["publish", "acquire", "release"]), st.sampled_from("abc")), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_latest_and_acquired_versions_are_kept(script):
    store: VersionedStore[str] = VersionedStore()
    held: dict[str, set[int]] = {h: set() for h in "abc"}
    next_version = 0
    for op, holder in script:
        if op == "publish":
            store.publish(next_version, f"handle-{next_version}")
            next_version += 1
        elif op == "acquire" and store.latest >= 0:
            version, handle = store.acquire_latest(holder)
            assert handle == f"handle-{version}"
            held[holder].add(version)
        elif op == "release" and held[holder]:
            version = min(held[holder])
            held[holder].discard(version)
            store.release(version, holder)
        in_use = set().union(*held.values())
        expected = in_use | ({store.latest} if store.latest >= 0 else set())
        assert set(store.kept_versions) == expected


def test_versions_must_increase():
    store = VersionedStore()
    store.publish(3, "x")
    with pytest.raises(WeightStoreError, match="must increase"):
        store.publish(3, "y")
    with pytest.raises(WeightStoreError, match="not available"):
        store.acquire(1, "a")


def _tensors(value: float):
    return {"w": torch.full((2, 2), value), "b": torch.zeros(3)}


def test_directory_snapshots_round_trip_and_prune(tmp_path):
    snaps = DirectorySnapshots(tmp_path, keep=2)
    for v in range(4):
        snaps.publish(v, _tensors(float(v)), {"step": v})
    assert snaps.versions() == [2, 3] and snaps.latest_version() == 3
    version, tensors = snaps.load()
    assert version == 3 and torch.equal(tensors["w"], torch.full((2, 2), 3.0))
    with pytest.raises(WeightStoreError, match="not in"):
        snaps.load(0)


def test_a_failed_write_leaves_no_visible_version(tmp_path, monkeypatch):
    snaps = DirectorySnapshots(tmp_path)
    snaps.publish(0, _tensors(0.0))

    def crash(*args, **kwargs):
        raise OSError("disk full")

    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(OSError):
        snaps.publish(1, _tensors(1.0))
    assert snaps.versions() == [0] and snaps.latest_version() == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".v")]
    assert snaps.load()[0] == 0
