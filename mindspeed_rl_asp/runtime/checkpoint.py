"""Checkpoints, and resuming a run from one (``save_every=K``, ``asp-train resume=RUN_DIR``).

::

    <run_dir>/checkpoints/
        step_000004/          the state after 4 trained steps (version 4)
            policy/           the trainer's weights, a Hugging Face checkpoint (rank 0 gathers)
            trainer_state.pt  AdamW state by parameter name, the RNG states of every rank
            control.json      version, trained prompt ids in order, the dispatch list, ages
            manifest.json     size and sha256 of every other file, written last
        latest                the name of the newest complete checkpoint

Atomic: a checkpoint is written into ``step_N.partial-<pid>-<k>/`` and renamed to
``step_N/`` only once every file is in it; ``latest`` is then replaced with
``os.replace``. A crash, SIGKILL or Ctrl-C in the middle leaves a ``.partial`` directory
(swept at the next save or resume) and the previous checkpoint as it was.

Intact: the manifest (written last, atomically) lists every file with its size and sha256;
resume verifies it before anything starts and, when the newest checkpoint is damaged (a
file truncated, changed or gone after the commit: a full disk, a copy cut short), falls back
to the newest intact one, saying which and why (``ResumePoint.skipped``). A checkpoint from
before manifests existed is checked for its parts only.

Queued samples are regenerated on resume, not restored. The samples queued or being
generated when a checkpoint is taken live in Ray's object store, which dies with the
driver, so restoring them would mean writing up to ``mode.queue_capacity`` samples at
every checkpoint; regenerating them costs at most that much generation once per resume,
and the regenerated samples come from the resumed weights, so the policy-age bound
holds across the resume without carrying versions over. The resumed run dispatches the
saved dispatch list minus the prompts already trained, in the same order: within every
epoch each prompt is trained exactly once (``remaining_minibatches``).

Versions continue: the resumed core starts at the saved version
(``ControlConfig.start_version`` = ``ResumePoint.version``), so every version and step the
run writes down is its own. When to checkpoint is the core's rule (``Checkpoint`` actions:
every ``save_every`` versions, and at an interrupt); :class:`CheckpointWriter` only writes
what the action carries, merged with what the earlier segments saved.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..config.validate import ConfigError
from ..control.core import Checkpoint

CHECKPOINTS = "checkpoints"
LATEST = "latest"
CONTROL = "control.json"
TRAINER_STATE = "trainer_state.pt"
POLICY = "policy"
MANIFEST = "manifest.json"


# ---------------------------------------------------------------------- pure parts
@dataclass
class ControlState:
    """What the Control Unit needs to continue: ``version`` steps are trained; ``consumed``
    are the prompt ids trained, in order, since the run began; ``minibatches`` the
    dispatch list the core held (its ids may include prompts already trained)."""

    version: int
    consumed: list[str]
    minibatches: list[tuple[str, list[str]]]
    epochs: int
    total_steps: int
    age_histogram: dict[str, int] = field(default_factory=dict)
    wall_time_s: float = 0.0
    generation_failures: int = 0
    faults: list = field(default_factory=list)   # the run's actor faults so far (summary.json's "faults")
    saved_at: float = 0.0   # the cluster's clock when saved: later spans of a dead segment are set aside on resume

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "ControlState":
        raw = json.loads(text)
        raw["minibatches"] = [(mb_id, list(ids)) for mb_id, ids in raw["minibatches"]]
        return cls(**raw)


def remaining_minibatches(minibatches: Sequence[tuple[str, Sequence[str]]],
                          consumed: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """The dispatch list without the prompts already trained, in the same order; a
    minibatch that a step boundary split keeps its untrained part (same id)."""
    done = set(consumed)
    out = []
    for mb_id, ids in minibatches:
        left = tuple(p for p in ids if p not in done)
        if left:
            out.append((mb_id, left))
    return out


def merge_histograms(*histograms: dict) -> dict[str, int]:
    """Policy-age histograms (age -> prompt groups) summed, as JSON keeps them: keys as
    strings, sorted by age (``control/policy_age.py``)."""
    from ..control.policy_age import merge_age_histograms

    return {str(age): n for age, n in merge_age_histograms(*histograms).items()}


def checkpoint_name(version: int) -> str:
    return f"step_{version:06d}"


def rng_states() -> dict:
    """This process's RNG states (python, numpy, torch CPU and, if present, CUDA)."""
    import random

    import numpy as np
    import torch

    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


# ---------------------------------------------------------------------- files
def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def missing_parts(path: Path) -> list[str]:
    """What a checkpoint directory lacks to be loadable ([] when complete)."""
    missing = [name for name in (CONTROL, TRAINER_STATE) if not (path / name).is_file()]
    if not (path / POLICY / "config.json").is_file():
        missing.append(f"{POLICY}/config.json")
    if not any((path / POLICY).glob("*.safetensors")):
        missing.append(f"{POLICY}/*.safetensors")
    return missing


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(path: Path) -> dict:
    """Write ``manifest.json`` into the checkpoint directory ``path``: every other file's
    size and sha256 (atomically, last: a checkpoint with a manifest was written whole)."""
    files = {str(f.relative_to(path)): {"bytes": f.stat().st_size, "sha256": _sha256(f)}
             for f in sorted(path.rglob("*")) if f.is_file() and f.name != MANIFEST and not f.name.startswith(".")}
    manifest = {"files": files}
    _write_atomic(path / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return manifest


def damage(path: Path) -> list[str]:
    """Why the checkpoint directory ``path`` cannot be resumed from ([] when intact): a
    missing part, or a file whose size or sha256 differs from its manifest's."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():   # written before manifests existed: its parts only
        return [f"{part} missing" for part in missing_parts(path)]
    try:
        files = json.loads(manifest_path.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError, TypeError):
        return [f"{MANIFEST} unreadable"]
    problems = [f"{part} missing" for part in missing_parts(path) if part not in files and "*" not in part]
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            problems.append(f"{name} missing")
        elif f.stat().st_size != want["bytes"]:
            problems.append(f"{name} has {f.stat().st_size} bytes, the manifest says {want['bytes']}")
        elif _sha256(f) != want["sha256"]:
            problems.append(f"{name} differs from the manifest's sha256")
    return problems


def intact_checkpoints(run_dir: Path) -> tuple[Optional[Path], list[str]]:
    """The newest intact checkpoint (None when there is none) and, for each newer committed
    one that is damaged, why. Newest by version, not by ``latest``: a directory is renamed
    to ``step_N`` only once written whole, so a crash between that rename and the update of
    ``latest`` leaves a newer checkpoint that is as good."""
    skipped = []
    for path in reversed(committed(checkpoints_dir(run_dir))):
        problems = damage(path)
        if not problems:
            return path, skipped
        skipped.append(f"{path.name}: {'; '.join(problems)}")
    return None, skipped


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    """The newest intact checkpoint of a run (:func:`intact_checkpoints`); None when there is none."""
    return intact_checkpoints(run_dir)[0]


def committed(root: Path) -> list[Path]:
    """The committed checkpoint directories (``step_N``, not ``.partial``), oldest first."""
    return [p for p in sorted(root.glob("step_*")) if p.is_dir() and "." not in p.name]


def sweep_partials(root: Path) -> list[str]:
    """Remove the ``.partial`` directories that interrupted writes of other (dead)
    processes left; this process's own may still be being written by a trainer after an
    interrupted save. Returns the names removed."""
    swept = []
    for path in sorted(root.glob("step_*.partial-*")):
        if f".partial-{os.getpid()}-" not in path.name:
            shutil.rmtree(path, ignore_errors=True)
            swept.append(path.name)
    return swept


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def commit_checkpoint(partial: Path, version: int, keep: int) -> Path:
    """Rename a fully written ``partial`` directory to ``step_<version>``, point ``latest``
    at it, and keep only the newest ``keep`` checkpoints."""
    root = partial.parent
    problems = missing_parts(partial)
    if problems:
        raise RuntimeError(f"checkpoint {partial} is incomplete (missing {', '.join(problems)}); not committed")
    final = root / checkpoint_name(version)
    if final.exists():   # the same version saved by an earlier run segment that crashed later
        stale = root / f"{final.name}.partial-replaced-{os.getpid()}"
        os.replace(final, stale)
        shutil.rmtree(stale, ignore_errors=True)
    os.replace(partial, final)
    _write_atomic(root / LATEST, final.name + "\n")
    for old in committed(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def write_checkpoint(run_dir: Path, state: ControlState, write_trainer: Callable[[Path], None],
                     keep: int, attempt: int = 0) -> Path:
    """Write one checkpoint atomically: ``write_trainer(dir)`` writes ``policy/`` and
    ``trainer_state.pt`` into the partial directory, then the control state goes in and
    the directory is committed. Anything raised (Ctrl-C included) leaves the previous
    checkpoint and ``latest`` untouched."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    sweep_partials(root)
    partial = root / f"{checkpoint_name(state.version)}.partial-{os.getpid()}-{attempt}"
    partial.mkdir()
    write_trainer(partial)
    _write_atomic(partial / CONTROL, state.to_json())
    write_manifest(partial)
    return commit_checkpoint(partial, state.version, keep)


class CheckpointWriter:
    """Writes the checkpoints the core asks for (``Checkpoint`` actions; the shell calls
    :meth:`write`). ``prior``: the control state the run segment started from (zero, or
    the resumed checkpoint's), merged into every state written; ``start``: the segment's
    start on the cluster clock; ``write_trainer(dir)``: the trainer ranks write their
    part into ``dir``."""

    def __init__(self, run_dir: Path, keep: int, prior: ControlState, start: float,
                 write_trainer: Callable[[Path], None], faults=None) -> None:
        """``faults``: what counts this segment's faults (the run recorder: ``failures``,
        ``faults``), carried into the control state so that they survive a resume."""
        self.run_dir, self.keep = Path(run_dir), keep
        self.prior, self.start, self.write_trainer = prior, start, write_trainer
        self.faults = faults
        self.last_path: Optional[Path] = None
        self.attempts = 0

    def state(self, action: Checkpoint, t: float) -> ControlState:
        """The control state of ``action`` (the core's, at its version), after the prior's."""
        prior = self.prior
        return ControlState(
            version=action.version, consumed=prior.consumed + list(action.consumed),
            minibatches=[(mb_id, list(ids)) for mb_id, ids in action.minibatches],
            epochs=prior.epochs, total_steps=prior.total_steps,
            age_histogram=merge_histograms(prior.age_histogram, dict(action.ages)),
            wall_time_s=prior.wall_time_s + (t - self.start),
            generation_failures=prior.generation_failures + (self.faults.failures if self.faults else 0),
            faults=list(prior.faults) + (list(self.faults.faults) if self.faults else []), saved_at=t)

    def write(self, action: Checkpoint, t: float) -> Path:
        """Write the checkpoint of ``action`` at cluster time ``t``; returns its directory.
        What it cost (the loop waits for the write) goes to ``checkpoints.jsonl``."""
        state = self.state(action, t)
        self.attempts += 1
        began = time.time()
        self.last_path = write_checkpoint(self.run_dir, state, self.write_trainer, self.keep, self.attempts)
        size = sum(f.stat().st_size for f in self.last_path.rglob("*") if f.is_file())
        with open(self.run_dir / "checkpoints.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"version": state.version, "seconds": time.time() - began, "bytes": size,
                                "path": self.last_path.name}) + "\n")
        return self.last_path


# ---------------------------------------------------------------------- resume
@dataclass(frozen=True)
class ResumePoint:
    """A checkpoint to continue from: ``path`` (its directory) and its control state."""

    path: Path
    control: ControlState
    skipped: tuple[str, ...] = ()   # newer checkpoints that were damaged, and why

    @property
    def version(self) -> int:
        return self.control.version

    @property
    def policy(self) -> Path:
        return self.path / POLICY


def find_resume_point(run_dir: Path) -> ResumePoint:
    """The run's newest complete checkpoint, or a ConfigError saying what is missing."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"resume={str(run_dir)!r}: no config.yaml there; resume takes the directory of a run "
                          "that asp-train wrote")
    path, skipped = intact_checkpoints(run_dir)
    if path is None:
        root = checkpoints_dir(run_dir)
        found = sorted(p.name for p in root.glob("step_*"))   # committed and partial
        if not found:
            raise ConfigError(f"resume={str(run_dir)!r}: nothing to resume from: it has no {CHECKPOINTS}/ "
                              "(the run had save_every=0; set save_every=K to checkpoint)")
        why = "; ".join(skipped) or "only partial writes"
        raise ConfigError(f"resume={str(run_dir)!r}: nothing to resume from: no checkpoint is intact "
                          f"({', '.join(found)}: {why})")
    control = ControlState.from_json((path / CONTROL).read_text(encoding="utf-8"))
    return ResumePoint(path, control, tuple(skipped))


def check_steps_left(resume: ResumePoint, steps: int, run_dir) -> None:
    """A ConfigError when the checkpoint already holds every step (nothing to resume)."""
    if resume.version >= steps:
        raise ConfigError(f"resume={str(run_dir)!r}: the run already trained all steps={steps} "
                          f"(checkpoint {resume.path.name}); nothing to resume (a larger steps=N continues it)")


def set_aside_metrics_after(run_dir: Path, version: int) -> int:
    """Move the rows of steps >= ``version`` (trained after the checkpoint by the run
    segment that died; the resume trains them again) from ``metrics.jsonl`` and
    ``rollouts.jsonl`` to ``metrics.discarded.jsonl`` / ``rollouts.discarded.jsonl``.
    Returns how many metrics rows moved."""
    moved_metrics = 0
    for name in ("metrics", "rollouts"):
        path = Path(run_dir) / f"{name}.jsonl"
        if not path.is_file():
            continue
        keep, moved = [], []
        for row in path.read_text(encoding="utf-8").splitlines():
            if row.strip():
                (keep if json.loads(row)["step"] < version else moved).append(row)
        if moved:
            with open(Path(run_dir) / f"{name}.discarded.jsonl", "a", encoding="utf-8") as f:
                f.write("".join(r + "\n" for r in moved))
            _write_atomic(path, "".join(r + "\n" for r in keep))
        if name == "metrics":
            moved_metrics = len(moved)
    return moved_metrics


def set_aside_spans_after(run_dir: Path, saved_at: float) -> int:
    """Move the spans of ``timeline.jsonl`` that end after ``saved_at`` (the resumed
    checkpoint's time: work of the dead segment after it, which the resume does again) to
    ``timeline.discarded.jsonl``. A checkpoint from before ``saved_at`` was kept (0) moves
    nothing. Returns how many moved."""
    path = Path(run_dir) / "timeline.jsonl"
    if not saved_at or not path.is_file():
        return 0
    keep, moved = [], []
    for row in path.read_text(encoding="utf-8").splitlines():
        if row.strip():
            (moved if json.loads(row)["end"] > saved_at else keep).append(row)
    if moved:
        with open(Path(run_dir) / "timeline.discarded.jsonl", "a", encoding="utf-8") as f:
            f.write("".join(r + "\n" for r in moved))
        _write_atomic(path, "".join(r + "\n" for r in keep))
    return len(moved)


__all__ = ["ControlState", "ResumePoint", "CheckpointWriter", "remaining_minibatches", "merge_histograms", "checkpoint_name",
           "rng_states", "set_rng_states", "checkpoints_dir", "missing_parts", "latest_checkpoint", "damage",
           "write_manifest", "intact_checkpoints",
           "sweep_partials", "commit_checkpoint", "write_checkpoint", "find_resume_point", "check_steps_left",
           "set_aside_metrics_after", "set_aside_spans_after"]
