"""Collective weight transport: a version's tensors from the trainer to a generation
actor over a torch.distributed pair group, in buckets, swapped in only when complete.

No Ray here: the runtime (``runtime/transport.py``) decides who sends what to whom; this
module moves bytes.

* :class:`FlatLayout` lays a state dict out as one flat byte buffer (tensors aligned,
  tied tensors stored once and recorded as aliases). The sender packs a version into one
  such buffer when it is published (an immutable copy: training goes on), a receiver
  receives into a buffer of the same layout, and a version's tensors are views into it.
* A transfer is a one-number header (the version coming, or -1 if the sender no longer
  has it: the receiver checks it against the version it expects) and then the buffer
  cut into buckets of ``bucket_bytes`` sent one after the other over a two-rank process group (rank 0 the trainer, rank 1 the actor): gloo on CPU,
  NCCL on GPUs, HCCL on Ascend (torch_npu), as the layout's device type says. Each
  actor has its own pair group, so actors refresh one at a time, whenever the control
  core says, without a global pause. On gloo a bucket is sent straight from (and
  received straight into) its slice of the buffer; on NCCL / HCCL it goes through a
  bucket-sized device buffer, so ``bucket_bytes`` bounds the transport's device memory.
* :class:`WeightReceiver` returns the views only once every bucket has arrived; a
  transfer that fails mid-way raises :class:`TransferError` and the caller's engine is
  never touched, so the actor keeps generating with its old version. A failed pair
  group is dropped on both sides (its sockets closed, so the peer fails at once rather
  than at the timeout) and the next transfer opens a new one (``generation`` + 1).

Pair groups are stand-alone process groups over a ``PrefixStore`` of the sender's
``TCPStore`` (``dist.ProcessGroupGloo(store, rank, size, timeout)`` and the NCCL / HCCL
equivalents), not subgroups of a default world: the trainer's default group is its
data-parallel world (FSDP), and a vLLM actor may own one of its own.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Mapping

ALIGN = 64  # bytes: every tensor starts on a 64-byte boundary of the flat buffer
BACKENDS = {"cpu": "gloo", "gpu": "nccl", "npu": "hccl"}


class TransferError(RuntimeError):
    """A weight transfer did not complete; the receiver's engine still holds its old version."""


class Turns:
    """Transfers to one actor, one at a time, in the order the runtime numbered them.

    Both sides of a pair group must see its transfers in the same order (a transfer is a
    fixed sequence of bucket messages), but Ray runs calls on several threads and does
    not promise their order; so each transfer carries ``seq`` (0, 1, 2, ... per actor)
    and waits here until the ones before it have ended, however they ended."""

    def __init__(self) -> None:
        self._next: dict = {}
        self._cond = threading.Condition()

    @contextmanager
    def turn(self, key, seq: int, timeout_s: float):
        with self._cond:
            if not self._cond.wait_for(lambda: self._next.get(key, 0) >= seq, timeout=timeout_s):
                self._next[key] = seq + 1  # the ones before are lost: later transfers go on
                self._cond.notify_all()
                raise TransferError(f"weight transfer {seq} to generation actor {key} waited {timeout_s:g} s for "
                                    f"transfer {self._next.get(key, 0)} before it; raise weights.timeout_s")
            if self._next.get(key, 0) > seq:
                raise TransferError(f"weight transfer {seq} to generation actor {key} came after a later one")
        try:
            yield
        finally:
            with self._cond:
                self._next[key] = seq + 1
                self._cond.notify_all()


def backend_for(device_type: str) -> str:
    """The torch.distributed backend of a layout's ``device_type``: gloo, nccl or hccl."""
    try:
        return BACKENDS[device_type]
    except KeyError:
        raise ValueError(f"layout.device_type={device_type!r} has no collective backend "
                         f"(one of {', '.join(BACKENDS)})") from None


def _dtype(name: str):
    import torch

    value = getattr(torch, name.rsplit(".", 1)[-1], None)
    if not isinstance(value, torch.dtype):
        raise TransferError(f"unknown tensor dtype {name!r} in a weight layout")
    return value


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str        # e.g. "float32"
    shape: tuple
    offset: int       # bytes into the flat buffer
    nbytes: int


@dataclass(frozen=True)
class FlatLayout:
    """Where each tensor of a state dict lives in one flat byte buffer."""

    specs: tuple
    aliases: tuple = ()   # (name, name of the tensor it shares storage with)
    total_bytes: int = 0

    @classmethod
    def of(cls, tensors: Mapping[str, Any]) -> "FlatLayout":
        specs, aliases, seen, offset = [], [], {}, 0
        for name, t in tensors.items():
            key = (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride())) if t.numel() else None
            if key is not None and key in seen:  # tied weights (embedding = lm_head): stored once
                aliases.append((name, seen[key]))
                continue
            if key is not None:
                seen[key] = name
            nbytes = t.numel() * t.element_size()
            specs.append(TensorSpec(name, str(t.dtype).rsplit(".", 1)[-1], tuple(t.shape), offset, nbytes))
            offset += -(-nbytes // ALIGN) * ALIGN
        return cls(tuple(specs), tuple(aliases), offset)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs] + [a for a, _ in self.aliases]

    def empty(self, device: str = "cpu"):
        import torch

        return torch.empty(max(self.total_bytes, 1), dtype=torch.uint8, device=device)

    def pack(self, tensors: Mapping[str, Any], out=None):
        """A new flat buffer (or ``out``) holding copies of ``tensors``."""
        flat = self.empty() if out is None else out
        views = self.views(flat)
        for spec in self.specs:
            views[spec.name].copy_(tensors[spec.name].detach())
        return flat

    def views(self, flat) -> dict:
        """name -> tensor view into ``flat`` (aliases share their target's view)."""
        out = {}
        for s in self.specs:
            out[s.name] = flat[s.offset:s.offset + s.nbytes].view(_dtype(s.dtype)).view(s.shape)
        for name, target in self.aliases:
            out[name] = out[target]
        return out

    def buckets(self, bucket_bytes: int) -> list[tuple[int, int]]:
        """Byte ranges ``[start, end)`` of the transfer, ``bucket_bytes`` each (the last shorter)."""
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes={bucket_bytes} must be >= 1")
        return [(s, min(s + bucket_bytes, self.total_bytes)) for s in range(0, self.total_bytes, bucket_bytes)]


@dataclass(frozen=True)
class CollectiveHandle:
    """What an actor needs to receive a version: its layout, the bucket size, and where
    the sender's rendezvous store listens. Small; travels through Ray as an argument."""

    version: int
    layout: FlatLayout
    bucket_bytes: int
    host: str
    port: int
    backend: str
    timeout_s: float

    @property
    def num_buckets(self) -> int:
        return len(self.layout.buckets(self.bucket_bytes))


@dataclass
class TransferStats:
    version: int
    bytes: int
    buckets: int
    seconds: float

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else float("inf")


def open_pair_group(host: str, port: int, backend: str, actor: int, generation: int, rank: int, timeout_s: float):
    """The two-rank group between the sender (rank 0) and actor ``actor`` (rank 1), attempt
    ``generation``, over the sender's store at ``host:port``; both sides call this with the
    same arguments but ``rank``. Each group rendezvous over a store connection of its own
    (one client socket shared by threads would make concurrent rendezvous wait on each other)."""
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    prefix = dist.PrefixStore(f"asp-weights/actor{actor}/gen{generation}", store)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        return dist.ProcessGroupGloo(prefix, rank, 2, timeout)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefix, rank, 2, options)
    if backend == "hccl":
        try:
            import torch_npu  # noqa: F401
            from torch_npu._C._distributed_c10d import ProcessGroupHCCL
        except ImportError as error:
            raise TransferError("weights.transport=collective on npu needs torch_npu (HCCL)") from error
        options = ProcessGroupHCCL.Options()
        options._timeout = timeout
        return ProcessGroupHCCL(prefix, rank, 2, options)
    raise TransferError(f"no collective backend {backend!r} (gloo, nccl, hccl)")


def _comm_device(backend: str):
    """Where buckets must be for the backend: host memory for gloo, the current device else."""
    import torch

    if backend == "gloo":
        return None
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("npu", torch.npu.current_device())


class WeightSender:
    """Trainer rank 0's side: the rendezvous store, the published versions' flat buffers,
    and one pair group per actor. ``send`` may run on several threads at once (one per
    actor); ``stage`` and ``drop`` on another."""

    def __init__(self, backend: str, host: str = "127.0.0.1", bucket_bytes: int = 64 << 20,
                 timeout_s: float = 120.0):
        import torch.distributed as dist

        self.backend, self.host, self.bucket_bytes, self.timeout_s = backend, host, bucket_bytes, timeout_s
        # port 0: the OS picks a free port; the actors learn it from the handle.
        self.store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False,
                                   timeout=_timedelta(timeout_s))
        self.port = self.store.port
        self._lock = threading.Lock()
        self._versions: dict[int, tuple[FlatLayout, Any]] = {}
        self._groups: dict[int, tuple[int, Any]] = {}  # actor -> (generation, group)
        self._opened: dict[int, int] = {}               # actor -> newest generation opened
        self._turns = Turns()
        self._fail_after: int | None = None

    def stage(self, version: int, tensors: Mapping[str, Any]) -> CollectiveHandle:
        """Pack ``tensors`` into a new flat buffer kept for sending; returns the handle."""
        layout = FlatLayout.of(tensors)
        flat = layout.pack(tensors)
        with self._lock:
            self._versions[version] = (layout, flat)
        return CollectiveHandle(version, layout, self.bucket_bytes, self.host, self.port, self.backend,
                                self.timeout_s)

    def keep_only(self, versions) -> None:
        """Free the buffers of every version not in ``versions``."""
        keep = set(versions)
        with self._lock:
            for v in [v for v in self._versions if v not in keep]:
                del self._versions[v]

    @property
    def versions(self) -> list[int]:
        with self._lock:
            return sorted(self._versions)

    def inject_failure(self, after_buckets: int) -> None:
        """Fault seam for tests: the next send stops after ``after_buckets`` buckets and drops
        its pair group, as a trainer that dies mid-transfer does."""
        self._fail_after = after_buckets

    def _group(self, actor: int, generation: int):
        with self._lock:
            current = self._groups.get(actor)
            if current is not None and current[0] == generation:
                return current[1]
            if generation <= self._opened.get(actor, -1):
                # A group's rendezvous keys are used once: a failed generation stays failed.
                raise TransferError(f"pair group {generation} to generation actor {actor} failed before; "
                                    "the next transfer opens a new one")
            self._groups.pop(actor, None)
            self._opened[actor] = generation
        group = open_pair_group(self.host, self.port, self.backend, actor, generation, 0, self.timeout_s)
        with self._lock:
            self._groups[actor] = (generation, group)
        return group

    def _drop_group(self, actor: int, generation: int) -> None:
        with self._lock:
            current = self._groups.get(actor)
            if current is None or current[0] != generation:
                return
            del self._groups[actor]   # the last reference: its sockets close, the peer fails now

    def send(self, actor: int, version: int, generation: int, seq: int) -> TransferStats:
        """Send ``version`` to ``actor`` over its pair group (attempt ``generation``), as the
        actor's transfer number ``seq``. On any failure the pair group is dropped, so the
        receiver fails at once and the next transfer opens a new group."""
        with self._turns.turn(actor, seq, self.timeout_s):
            start = time.perf_counter()
            try:
                # The group first: if anything below fails, dropping it frees the receiver.
                group = self._group(actor, generation)
                device = _comm_device(self.backend)
                with self._lock:
                    staged = self._versions.get(version)
                    kept = sorted(self._versions)
                    fail_after, self._fail_after = (self._fail_after, None) if staged else (None, self._fail_after)
                # The header: the version about to come, or -1 if it is gone (the receiver
                # then fails this transfer and the group stays usable).
                _send_header(group, version if staged else -1, device)
                if staged is None:
                    raise _SenderGone()
                layout, flat = staged
                buckets = layout.buckets(self.bucket_bytes)
                staging = None
                for i, (lo, hi) in enumerate(buckets):
                    if fail_after is not None and i == fail_after:
                        raise TransferError(f"injected transfer failure after {i} of {len(buckets)} buckets")
                    chunk = flat[lo:hi]
                    if device is not None:
                        if staging is None:
                            staging = flat.new_empty(self.bucket_bytes, device=device)
                        staging[:hi - lo].copy_(chunk, non_blocking=True)
                        chunk = staging[:hi - lo]
                    group.send([chunk], 1, i + 1).wait()
            except _SenderGone:
                raise TransferError(f"version {version} is not staged for sending (kept: {kept})") from None
            except BaseException:
                # Drop every reference (a kept traceback holds this frame): the last one going
                # closes the group's sockets, so the receiver fails now, not at its timeout.
                group = None  # noqa: F841
                self._drop_group(actor, generation)
                raise
            return TransferStats(version, layout.total_bytes, len(buckets), time.perf_counter() - start)


class WeightReceiver:
    """An actor's side: receives a version into a flat buffer and returns its tensors
    only when every bucket has arrived. Keeps one spare buffer to receive into, so
    steady-state refreshes allocate nothing."""

    def __init__(self, actor: int, device: str = "cpu"):
        self.actor, self.device = actor, device
        self._group: tuple[tuple, Any] | None = None   # ((host, port, generation), group)
        self._opened: dict[tuple, int] = {}             # sender (host, port) -> newest generation opened
        self._spare = None
        self._lock = threading.Lock()
        self._turns = Turns()

    def _pair(self, handle: CollectiveHandle, generation: int):
        sender = (handle.host, handle.port)   # a restarted sender listens elsewhere: groups start afresh
        if self._group is not None and self._group[0] == (*sender, generation):
            return self._group[1]
        if generation <= self._opened.get(sender, -1):
            raise TransferError(f"pair group {generation} failed before; the next transfer opens a new one")
        self._close()
        self._opened[sender] = generation
        group = open_pair_group(handle.host, handle.port, handle.backend, self.actor, generation, 1,
                                handle.timeout_s)
        self._group = ((*sender, generation), group)
        return group

    def _close(self) -> None:
        self._group = None   # the last reference: its sockets close

    def _buffer(self, layout: FlatLayout):
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and spare.numel() >= max(layout.total_bytes, 1):
            return spare
        return layout.empty(self.device)

    def recycle(self, flat) -> None:
        """Give back a buffer whose tensors are no longer needed (loaded into the engine)."""
        with self._lock:
            if self._spare is None or flat.numel() > self._spare.numel():
                self._spare = flat

    def receive(self, handle: CollectiveHandle, generation: int, seq: int,
                before=None) -> tuple[dict, Any, TransferStats]:
        """(name -> tensor views, the flat buffer they view, stats) once every bucket has
        arrived; raises TransferError otherwise. ``seq``: this actor's transfer number;
        ``before()`` runs once the transfers before it have ended."""
        with self._turns.turn((handle.host, handle.port), seq, handle.timeout_s):   # numbered per sender
            if before is not None:
                before()
            start = time.perf_counter()
            layout = handle.layout
            buckets = layout.buckets(handle.bucket_bytes)
            flat, done = None, 0
            try:
                group = self._pair(handle, generation)  # the group first: a failure below frees the sender
                device = _comm_device(handle.backend)
                coming = _recv_header(group, device)
                if coming != handle.version:
                    problem = (f"the sender no longer has version {handle.version}" if coming == -1 else
                               f"the sender sent version {coming} for version {handle.version}")
                    raise _HeaderMismatch(problem, healthy=coming == -1)
                flat = self._buffer(layout)
                staging = None
                for i, (lo, hi) in enumerate(buckets):
                    target = flat[lo:hi]
                    if device is not None:
                        if staging is None:
                            staging = flat.new_empty(handle.bucket_bytes, device=device)
                        group.recv([staging[:hi - lo]], 0, i + 1).wait()
                        target.copy_(staging[:hi - lo])
                    else:
                        group.recv([target], 0, i + 1).wait()
                    done += 1
            except Exception as error:  # noqa: BLE001 - any failure of the group is a failed transfer
                group = None  # noqa: F841  (see WeightSender.send)
                if not getattr(error, "healthy", False):
                    self._close()  # closes this side's sockets; the next transfer opens a new group
                if flat is not None:
                    self.recycle(flat)
                raise TransferError(
                    f"weight transfer of version {handle.version} to generation actor {self.actor} failed after "
                    f"{done} of {len(buckets)} buckets ({_first_line(error)}); the actor keeps its old version"
                ) from error
            stats = TransferStats(handle.version, layout.total_bytes, len(buckets), time.perf_counter() - start)
            return layout.views(flat), flat, stats


class _SenderGone(Exception):
    pass


class _HeaderMismatch(Exception):
    def __init__(self, message: str, healthy: bool):
        super().__init__(message)
        self.healthy = healthy   # the group itself is fine: keep it


def _send_header(group, version: int, device) -> None:
    import torch

    header = torch.tensor([version], dtype=torch.int64)
    group.send([header if device is None else header.to(device)], 1, 0).wait()


def _recv_header(group, device) -> int:
    import torch

    header = torch.zeros(1, dtype=torch.int64, device=device or "cpu")
    group.recv([header], 0, 0).wait()
    return int(header.cpu()[0])


def _timedelta(seconds: float):
    import datetime

    return datetime.timedelta(seconds=seconds)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return (lines[0][:240] if lines else type(error).__name__)


__all__ = ["ALIGN", "BACKENDS", "CollectiveHandle", "FlatLayout", "TensorSpec", "TransferError", "TransferStats",
           "Turns", "WeightReceiver", "WeightSender", "backend_for", "open_pair_group"]
