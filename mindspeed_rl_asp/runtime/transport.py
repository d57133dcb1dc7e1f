"""How a published weight version reaches the generation actors (``weights.transport``).

The Ray shell (``runtime/ray_cluster.RayCluster``) asks a transport for the Ray calls of
a ``Publish`` and of a ``LoadWeights``; the transport holds no control rule (the core
decides who loads which version, and when), only where the bytes go:

* ``object_store`` (the default; fine for small models): every trainer rank exports
  (rank 0 returns the snapshot, the others take part in the gather), the snapshot is an
  object in Ray's object store, and an actor told to load gets its reference. Beside it
  each rank returns a small receipt that the driver fetches, so a failed export fails the
  publish, as with the other transports.
* ``files``: rank 0 writes the version as safetensors into ``weights.dir`` (default
  ``<run_dir>/weights``; on a cluster it must be a file system every node sees),
  renamed into place when complete; an actor reads it. Versions the store drops are
  deleted.
* ``collective``: rank 0 packs the version into a flat buffer it keeps for sending;
  each actor receives it over its own torch.distributed pair group with rank 0 (gloo on
  CPU, NCCL on GPUs, HCCL on Ascend), in buckets of ``weights.bucket_mb``
  (``weights/collective.py``). The actor swaps the version into its engine only once
  every bucket has arrived; a transfer that fails mid-way fails the ``LoadWeights``
  (the core retries it) and the actor keeps its old version. With
  ``weights.prefetch`` (default) the control core decides when a version moves ahead of
  its load: it issues ``Prefetch(actor, version)`` (docs/control.md, "Prefetch"), and the
  shell starts that transfer (``prefetch``) on a transport thread of each side while the
  actor keeps generating; the prefetch ends when every bucket has arrived (or failed).
  The core loads an actor only after its prefetch ended, so a load that follows a
  finished prefetch only copies the tensors into the engine; one that follows a failed
  prefetch (or none) moves the version itself.

Transfers to one actor are numbered (``seq``) and run one at a time in that order on
both sides. The transport mirrors which received versions an actor still keeps: a
receive discards the actor's completed transfers that no pending load names, and a
finished load discards those up to its own.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRANSPORTS = ("object_store", "collective", "files")
TRANSPORT_GROUP = "transport"   # the Ray concurrency group transfers run in, on both sides


@dataclass(frozen=True)
class FileHandle:
    """A version written by the files transport: ``root/v<version>`` (DirectorySnapshots)."""

    version: int
    root: str


class ObjectStoreTransport:
    """Every rank's ``export_snapshot`` returns a small receipt and the snapshot as two
    objects; the driver fetches the receipt (a failed export is a failed publish, as with
    every transport) and the store maps the version to the snapshot's reference."""

    name = "object_store"

    def __init__(self, trainers: list, generators: list):
        self.trainers, self.generators = trainers, generators
        self._snapshots: dict[int, Any] = {}   # version -> rank 0's snapshot ref, until published

    def export_args(self, version: int, kept: list[int]) -> tuple:
        """What every trainer rank's ``export_weights`` is called with for ``version``."""
        return ()

    def publish(self, version: int, kept: list[int]):
        """(primary ref: rank 0's receipt, the other ranks' receipts)."""
        calls = [t.export_snapshot.options(num_returns=2).remote() for t in self.trainers]
        self._snapshots[version] = calls[0][1]
        receipts = [receipt for receipt, _ in calls]
        return receipts[0], receipts[1:]

    def published(self, version: int, ref) -> Any:
        """The handle the store maps ``version`` to, once ``ref`` is ready; raises Ray's
        error when the export failed (fetching the receipt, never the snapshot)."""
        import ray

        snapshot = self._snapshots.pop(version)
        ray.get(ref)
        return snapshot   # sealed in the object store: complete; actors resolve it themselves

    def load(self, actor: int, version: int, handle):
        return self.generators[actor].load_weights.remote(version, handle)

    def load_ended(self, actor: int, version: int, ok: bool) -> None: ...

    def prefetch_ended(self, actor: int, version: int, ok: bool) -> None: ...

    def dropped(self, versions: list[int]) -> None: ...

    def prefetch(self, actor: int, version: int, handle):
        """The call that moves ``version`` to ``actor`` ahead of its load; only the
        collective transport has one (the core issues ``Prefetch`` only for it)."""
        raise ValueError(f"weights.transport={self.name} cannot prefetch a version (Prefetch({actor}, {version})); "
                         "only weights.transport=collective does")


class _FetchedHandleTransport(ObjectStoreTransport):
    """A transport whose publish returns a small handle (a directory, a kept buffer's
    description) rather than the snapshot: every rank's ``export_weights`` result is
    the receipt, and rank 0's is the handle itself."""

    def publish(self, version: int, kept: list[int]):
        refs = [t.export_weights.remote(*self.export_args(version, kept)) for t in self.trainers]
        return refs[0], refs[1:]

    def published(self, version: int, ref) -> Any:
        import ray

        return ray.get(ref)


class FilesTransport(_FetchedHandleTransport):
    name = "files"

    def __init__(self, trainers: list, generators: list, root: str):
        super().__init__(trainers, generators)
        self.root = str(Path(root).resolve())

    def export_args(self, version: int, kept: list[int]) -> tuple:
        return ("files", self.root)

    def dropped(self, versions: list[int]) -> None:
        from ..weights.store import version_dir

        for v in versions:
            if v > 0:
                shutil.rmtree(version_dir(Path(self.root), v), ignore_errors=True)


@dataclass
class _Transfer:
    seq: int
    version: int
    receive_ref: Any
    send_ref: Any


@dataclass
class _ActorLink:
    next_seq: int = 0
    generation: int = 0
    transfers: dict[int, _Transfer] = field(default_factory=dict)   # version -> live transfer
    pinned: dict[int, int] = field(default_factory=dict)            # seq -> loads waiting on it


class CollectiveTransport(_FetchedHandleTransport):
    name = "collective"

    def __init__(self, trainers: list, generators: list):
        super().__init__(trainers, generators)
        self.links = [_ActorLink() for _ in generators]
        self._loading: dict[tuple[int, int], int] = {}   # (actor, version) -> seq of its transfer

    def export_args(self, version: int, kept: list[int]) -> tuple:
        # Rank 0 keeps the buffers of every version a load may still name.
        return ("collective", sorted(set(kept) | {version}))

    def prefetch(self, actor: int, version: int, handle):
        """Start the transfer of ``version`` to ``actor`` (the core's ``Prefetch``); the
        returned reference is the receiving side's result (``ok`` and, if not, ``error``).
        The load that names this version later finds the buckets there and only swaps."""
        return self._start(actor, version, handle).receive_ref

    def prefetch_ended(self, actor: int, version: int, ok: bool) -> None:
        """A failed (or cancelled) prefetch's transfer is forgotten; its pair group may be
        broken, so the next transfer opens a new one."""
        link = self.links[actor]
        transfer = link.transfers.get(version)
        if ok or transfer is None:
            return
        del link.transfers[version]
        link.generation += 1

    def _failed(self, transfer: _Transfer) -> bool:
        import ray

        ready, _ = ray.wait([transfer.receive_ref], timeout=0, fetch_local=False)
        if not ready:
            return False
        try:
            return not ray.get(transfer.receive_ref)["ok"]
        except Exception:  # noqa: BLE001 - the actor died: the transfer did not deliver
            return True

    def _start(self, actor: int, version: int, handle) -> _Transfer:
        link = self.links[actor]
        seq = link.next_seq
        link.next_seq += 1
        keep = sorted(link.pinned)
        # The actor drops what it received before that no pending load names: so do we.
        for v, t in list(link.transfers.items()):
            if t.seq not in link.pinned:
                del link.transfers[v]
        trainer = self.trainers[0]
        send_ref = trainer.send_weights.options(concurrency_group=TRANSPORT_GROUP).remote(
            actor, version, link.generation, seq)
        receive_ref = self.generators[actor].receive_weights.options(concurrency_group=TRANSPORT_GROUP).remote(
            seq, link.generation, handle, keep)
        transfer = _Transfer(seq, version, receive_ref, send_ref)
        link.transfers[version] = transfer
        return transfer

    def load(self, actor: int, version: int, handle):
        link = self.links[actor]
        transfer = link.transfers.get(version)
        if transfer is not None and self._failed(transfer):
            del link.transfers[version]
            link.generation += 1
            transfer = None
        if transfer is None:
            transfer = self._start(actor, version, handle)
        link.pinned[transfer.seq] = link.pinned.get(transfer.seq, 0) + 1
        self._loading[(actor, version)] = transfer.seq
        return self.generators[actor].load_weights.remote(version, handle, transfer.seq)

    def load_ended(self, actor: int, version: int, ok: bool) -> None:
        link = self.links[actor]
        seq = self._loading.pop((actor, version), None)
        if seq is None:
            return
        link.pinned[seq] -= 1
        if not link.pinned[seq]:
            del link.pinned[seq]
        if ok:  # the actor discards every transfer up to this one
            for v, t in list(link.transfers.items()):
                if t.seq <= seq and t.seq not in link.pinned:
                    del link.transfers[v]
        else:   # the pair group may be broken: the next transfer opens a new one
            for v, t in list(link.transfers.items()):
                if t.seq == seq:
                    del link.transfers[v]
            link.generation += 1

def actor_class_options(transport: str, role: str, num_generators: int) -> dict:
    """``ray.remote`` options of an actor class: the collective transport runs transfers on
    threads of their own (a Ray concurrency group), beside the actor's main work. Enough
    of them that every transfer that may be pending (per actor: a prefetch, or a load's
    after a cancelled one still unwinding) has one, with room to spare."""
    if transport != "collective" or role not in ("train", "generate"):   # ranks other than 0 send nothing
        return {}
    threads = 3 * num_generators + 1 if role == "train" else 4
    return {"concurrency_groups": {TRANSPORT_GROUP: threads}}


def remote_class(cls, transport: str, role: str, num_generators: int):
    """``cls`` as a Ray actor class, with the transport's thread group if it needs one."""
    import ray

    options = actor_class_options(transport, role, num_generators)
    return ray.remote(**options)(cls) if options else ray.remote(cls)


def make_transport(weights_cfg, trainers: list, generators: list, run_dir: Path, device_type: str = "cpu",
                   local: bool = True):
    """The transport ``weights.transport`` names (config/schema.WeightsConfig); for the
    collective one this opens trainer rank 0's sending side (``local``: on 127.0.0.1)."""
    import ray

    name = weights_cfg.transport
    if name == "object_store":
        return ObjectStoreTransport(trainers, generators)
    if name == "files":
        return FilesTransport(trainers, generators, weights_cfg.dir or str(Path(run_dir) / "weights"))
    if name == "collective":
        ray.get(trainers[0].open_weight_sender.remote(device_type, local, weights_cfg.bucket_mb,
                                                      weights_cfg.timeout_s))
        return CollectiveTransport(trainers, generators)
    raise ValueError(f"weights.transport={name!r} is not one of {', '.join(TRANSPORTS)}")


__all__ = ["CollectiveTransport", "FileHandle", "FilesTransport", "ObjectStoreTransport", "TRANSPORTS",
           "TRANSPORT_GROUP", "actor_class_options", "make_transport", "remote_class"]
