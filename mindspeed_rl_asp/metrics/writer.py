"""Per-step metrics to ``metrics.jsonl`` and TensorBoard events, in the run directory."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping


def _scalars(prefix: str, values: Mapping[str, Any]):
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _scalars(f"{name}/", value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield name, float(value)


class MetricsWriter:
    """Appends one JSON object per step; mirrors every numeric value to TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self._tb is not None:
            for name, value in _scalars("", metrics):
                self._tb.add_scalar(name, value, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
