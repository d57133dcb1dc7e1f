"""What the MindSpeed-RL check lists share (contract_child.py, cpu_path_child.py): a list
of checks, each a function that raises on failure, run in order; all_checks_child.py runs
the lists in one process and writes every outcome as {list: {check: "ok" | error}} to a
JSON file for the parent test (tests/mindspeed_child.py)."""
from __future__ import annotations

import json
import traceback
from typing import Callable


class Checks:
    def __init__(self):
        self.functions: list[Callable[[], None]] = []

    def __call__(self, fn):
        """Decorator: register ``fn`` as the next check."""
        self.functions.append(fn)
        return fn

    def run(self, before: Callable[[str], None] = lambda name: None) -> dict[str, str]:
        """Run every check (``before(name)`` first: e.g. start Ray when the first check that
        needs it comes) and return {check: "ok" | error}."""
        results = {}
        for fn in self.functions:
            try:
                before(fn.__name__)
                fn()
                results[fn.__name__] = "ok"
            except Exception as error:  # noqa: BLE001 - reported to the parent test
                results[fn.__name__] = f"{type(error).__name__}: {error}\n{traceback.format_exc()[-3000:]}"
        return results


def write_results(out_path: str, results: dict) -> int:
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
    return 0


def expect(condition, message):
    if not condition:
        raise AssertionError(message)
