"""Versioned weight snapshots: atomic publish, reference-counted retention.

The AsyncFlow CheckpointEngine idea (MVCC): readers only ever see complete versions.

* :class:`VersionedStore` is the pure bookkeeping. A handle (for the Ray runtime an
  ``ObjectRef`` whose object is already sealed in the object store) becomes visible to
  readers only inside :meth:`publish`, in one assignment, after the caller has made it
  complete; so a reader gets either the previous version or the new one, never a part.
  Versions only grow. A version is kept while it is the latest or while some holder
  (an actor loading it) has acquired it; everything else is dropped by :meth:`collect`.
* :class:`DirectorySnapshots` does the same on a file system, for resume and for
  transports outside Ray: a version is written into a temporary directory and renamed
  into place (an atomic rename on POSIX), and the ``LATEST`` pointer is replaced
  atomically after it.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Mapping, Optional, TypeVar

H = TypeVar("H")


class WeightStoreError(RuntimeError):
    pass


@dataclass
class VersionedStore(Generic[H]):
    """Invariant: ``latest`` is the greatest published version and its handle is kept;
    an acquired version is kept until every holder released it."""

    _handles: dict[int, H] = field(default_factory=dict)
    _holders: dict[int, set[str]] = field(default_factory=dict)
    latest: int = -1

    def publish(self, version: int, handle: H) -> list[int]:
        """Make ``version`` the newest; returns the versions dropped as a result."""
        if version <= self.latest:
            raise WeightStoreError(f"version {version} published after {self.latest}: versions must increase")
        self._handles[version] = handle
        self.latest = version
        return self.collect()

    def acquire(self, version: int, holder: str) -> H:
        if version not in self._handles:
            raise WeightStoreError(f"version {version} is not available (kept: {sorted(self._handles)})")
        self._holders.setdefault(version, set()).add(holder)
        return self._handles[version]

    def acquire_latest(self, holder: str) -> tuple[int, H]:
        if self.latest < 0:
            raise WeightStoreError("no version has been published yet")
        return self.latest, self.acquire(self.latest, holder)

    def release(self, version: int, holder: str) -> list[int]:
        self._holders.get(version, set()).discard(holder)
        return self.collect()

    def collect(self) -> list[int]:
        dropped = [v for v in self._handles if v != self.latest and not self._holders.get(v)]
        for v in dropped:
            del self._handles[v]
            self._holders.pop(v, None)
        return dropped

    @property
    def kept_versions(self) -> list[int]:
        return sorted(self._handles)


def version_dir(root: Path, version: int) -> Path:
    return Path(root) / f"v{version:08d}"


def _split_aliases(tensors: Mapping[str, Any]) -> tuple[dict, list[list[str]]]:
    """Tensors that share storage (tied weights) stored once: (unique tensors, [[alias, name]])."""
    unique, aliases, seen = {}, [], {}
    for name, t in tensors.items():
        key = (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride())) if t.numel() else None
        if key is not None and key in seen:
            aliases.append([name, seen[key]])
            continue
        if key is not None:
            seen[key] = name
        unique[name] = t.contiguous()
    return unique, aliases


@dataclass
class DirectorySnapshots:
    """Snapshots as ``root/v00000003/`` directories plus an atomically replaced ``LATEST``.

    ``keep`` newest versions are retained (plus any version named in ``pinned``);
    ``keep=None`` prunes nothing (the caller drops versions with :meth:`drop`). Tensors
    that share storage (tied weights) are written once and restored as one on load.
    """

    root: Path
    keep: Optional[int] = 2

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.root.mkdir(parents=True, exist_ok=True)

    def publish(self, version: int, tensors: Mapping[str, Any], metadata: Mapping[str, Any] | None = None,
                pinned: tuple[int, ...] = ()) -> Path:
        from safetensors.torch import save_file

        latest = self.latest_version()
        if latest is not None and version <= latest:
            raise WeightStoreError(f"version {version} published after {latest}: versions must increase")
        staging = Path(tempfile.mkdtemp(prefix=f".v{version:08d}-", dir=self.root))
        try:
            tensors, aliases = _split_aliases(tensors)
            save_file(tensors, str(staging / "model.safetensors"))
            meta = {"version": version, **(metadata or {}), **({"aliases": aliases} if aliases else {})}
            (staging / "meta.json").write_text(json.dumps(meta))
            final = version_dir(self.root, version)
            os.rename(staging, final)  # atomic: the directory appears complete or not at all
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        pointer = self.root / ".LATEST.tmp"
        pointer.write_text(str(version))
        os.replace(pointer, self.root / "LATEST")
        self._prune(pinned)
        return final

    def latest_version(self) -> int | None:
        pointer = self.root / "LATEST"
        return int(pointer.read_text()) if pointer.is_file() else None

    def load(self, version: int | None = None) -> tuple[int, dict]:
        from safetensors.torch import load_file

        version = self.latest_version() if version is None else version
        if version is None:
            raise WeightStoreError(f"no snapshot published under {self.root}")
        path = version_dir(self.root, version) / "model.safetensors"
        if not path.is_file():
            raise WeightStoreError(f"snapshot v{version} is not in {self.root} (kept: {self.versions()})")
        tensors = load_file(str(path))
        meta = path.parent / "meta.json"
        for alias, name in (json.loads(meta.read_text()).get("aliases", []) if meta.is_file() else []):
            tensors[alias] = tensors[name]
        return version, tensors

    def drop(self, version: int) -> None:
        """Delete ``version``'s directory (never the one ``LATEST`` names)."""
        if version != self.latest_version():
            shutil.rmtree(version_dir(self.root, version), ignore_errors=True)

    def versions(self) -> list[int]:
        return sorted(int(p.name[1:]) for p in self.root.glob("v[0-9]*") if p.is_dir())

    def _prune(self, pinned: tuple[int, ...]) -> None:
        if self.keep is None:
            return
        versions = self.versions()
        for v in versions[:-self.keep] if self.keep > 0 else versions:
            if v not in pinned:
                shutil.rmtree(version_dir(self.root, v), ignore_errors=True)
