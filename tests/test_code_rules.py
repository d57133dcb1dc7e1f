"""Rules the package's source must keep, checked with ``ast``; and the named errors that
replaced the rule's past offenders."""
import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import mindspeed_rl_asp

PACKAGE_DIR = Path(mindspeed_rl_asp.__file__).parent


def checked_sources() -> list[Path]:
    return sorted(PACKAGE_DIR.rglob("*.py"))


def imported_modules(source: str) -> set[str]:
    """Every module an ``import`` or ``from ... import`` names, at any depth; relative
    imports as ``.name`` (level dots kept), so a caller can tell them apart."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.add("." * node.level + (node.module or ""))
    return out


def test_imported_modules_sees_deferred_and_relative_imports():
    source = "import os\nfrom . import core\ndef f():\n    import numpy as np\n    from ..x import y\n"
    assert imported_modules(source) == {"os", ".", "numpy", "..x"}


def test_control_imports_only_the_standard_library():
    """The control core is the one thing every driver shares (Ray runtime, simulator,
    tests): it must run anywhere Python does, with no clock, device or framework."""
    stdlib = sys.stdlib_module_names
    bad = []
    for path in sorted((PACKAGE_DIR / "control").rglob("*.py")):
        for name in imported_modules(path.read_text(encoding="utf-8")):
            within = name.startswith(".") and not name.startswith("..")
            if not within and name.split(".")[0] not in stdlib:
                bad.append(f"{path.name}: {name}")
    assert not bad, "control/ may import only the standard library and itself: " + ", ".join(bad)


def subpackage_imports(source: str, subpackage: str) -> set[str]:
    """The modules of ``mindspeed_rl_asp.<subpackage>`` that a module's ``source`` imports
    from a sibling subpackage, absolute or relative (``..<subpackage>``), at any depth."""
    roots = (f"..{subpackage}", f"mindspeed_rl_asp.{subpackage}")
    return {name for name in imported_modules(source)
            if name in roots or name.startswith(tuple(root + "." for root in roots))}


def test_subpackage_imports_sees_deferred_absolute_and_relative_imports():
    source = ("from ..runtime import driver\ndef f():\n    from ..runtime.placement import x\n"
              "    import mindspeed_rl_asp.runtime.recorder\nfrom ..control.reports import StepReport\n"
              "from ..runtimes import y\n")
    assert subpackage_imports(source, "runtime") == {"..runtime", "..runtime.placement",
                                                     "mindspeed_rl_asp.runtime.recorder"}


@pytest.mark.parametrize("shell, peer", [("sim", "runtime"), ("runtime", "sim")])
def test_sim_and_runtime_are_peers(shell, peer):
    """The simulator and the Ray runtime are two shells beside each other around the same
    core: what both need (report types, planning, placement, the recorder) lives below
    them, so the simulator runs where Ray and the actors' code do not."""
    bad = sorted(f"{path.name}: {name}" for path in sorted((PACKAGE_DIR / shell).rglob("*.py"))
                 for name in subpackage_imports(path.read_text(encoding="utf-8"), peer))
    assert not bad, f"{shell}/ may not import {peer}/ (move what both need below them): " + ", ".join(bad)


def called_names(source: str) -> set[str]:
    """The names a module's ``source`` calls: ``f(...)`` and ``x.f(...)`` both as ``f``."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                out.add(func.id)
            elif isinstance(func, ast.Attribute):
                out.add(func.attr)
    return out


def test_called_names_sees_plain_attribute_and_nested_calls():
    source = "def f():\n    a = g(h.k(1))\n    return m.n.p()\nx = RunRecorder\n"
    assert called_names(source) == {"g", "k", "p"}


# What a run is assembled from; only schedule/assembly.py builds them for a run.
ASSEMBLED = {"make_control_core", "RunRecorder", "EpochReplanner", "epoch_replan"}


@pytest.mark.parametrize("shell, driver", [("sim", "run.py"), ("runtime", "driver.py")])
def test_sim_and_runtime_assemble_a_run_through_the_one_assembly(shell, driver):
    """The Ray driver and the simulator build the core (its re-plan and checkpoint rules)
    and the shared observers (recorder, epoch report) through the same two functions of
    ``schedule/assembly.py``, so neither can drift into its own construction."""
    bad = sorted(f"{path.name}: {name}" for path in sorted((PACKAGE_DIR / shell).rglob("*.py"))
                 for name in called_names(path.read_text(encoding="utf-8")) & ASSEMBLED)
    assert not bad, f"{shell}/ builds what schedule/assembly.py assembles; call assemble_core / " \
                    "assemble_observers instead: " + ", ".join(bad)
    calls = called_names((PACKAGE_DIR / shell / driver).read_text(encoding="utf-8"))
    assert {"assemble_core", "assemble_observers"} <= calls


def assert_lines(source: str) -> list[int]:
    """Line numbers of every ``assert`` statement in ``source``, at any depth."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Assert)]


def test_assert_lines_finds_nested_asserts_and_only_asserts():
    source = "def f(x):\n    if x:\n        assert x > 0, 'positive'\n    raise ValueError('assert')\n"
    assert assert_lines(source) == [3]


def test_no_assert_in_production_code():
    # `python -O` strips asserts, so an invariant checked by one is not checked at all:
    # raise a named exception whose message says what went wrong instead.
    found = [f"{path.relative_to(PACKAGE_DIR.parent).as_posix()}:{line}"
             for path in checked_sources() for line in assert_lines(path.read_text(encoding="utf-8"))]
    assert not found, ("assert statements in mindspeed_rl_asp (stripped by python -O; raise a named "
                       "exception instead): " + ", ".join(found))


def test_a_duplicate_maze_tag_is_a_vocabulary_error(monkeypatch):
    from mindspeed_rl_asp.tasks import maze

    monkeypatch.setattr(maze, "MARKERS", maze.MARKERS + (maze.BACK_TOKEN,))
    with pytest.raises(maze.VocabularyError, match=r"maze_vocabulary\(4\) lists '<\|back\|>' more than once"):
        maze.maze_vocabulary(4)


def test_a_special_token_that_is_a_maze_tag_is_a_vocabulary_error(monkeypatch):
    from mindspeed_rl_asp.policy import tokenizer
    from mindspeed_rl_asp.tasks.maze import MAZE_START, VocabularyError

    monkeypatch.setattr(tokenizer, "SPECIAL_TOKENS", tokenizer.SPECIAL_TOKENS + (MAZE_START,))
    with pytest.raises(VocabularyError, match=r"tokenizer vocabulary .* lists '<\|maze_start\|>' more than once"):
        tokenizer.vocabulary()


def test_an_engine_left_on_another_version_is_a_weight_version_error():
    from mindspeed_rl_asp.runtime.generation_unit import GenerationWorker, WeightVersionError

    class StaleEngine:  # applies every snapshot as version 3, whatever it was asked
        weight_version = 0

        def load_weights(self, snapshot):
            self.weight_version = 3

    worker = GenerationWorker.__new__(GenerationWorker)  # no engine build: only load_weights runs
    worker.actor_index, worker.engine = 1, StaleEngine()
    with pytest.raises(WeightVersionError, match="actor 1 was told to load weight version 5, but its engine "
                                                 "now holds version 3"):
        worker.load_weights(5, SimpleNamespace(version=5))
    worker.engine.load_weights = lambda snapshot: setattr(worker.engine, "weight_version", snapshot.version)
    assert worker.load_weights(5, SimpleNamespace(version=5)).version == 5


# A function longer than this reads in more than one sitting: split it by concern, or say
# why not in one docstring line that starts with "Long:".
MAX_FUNCTION_LINES = 60
# Long functions still waiting for their split, each with the work that will do it. The
# list may only shrink: a function that is short again must leave it.
STILL_LONG = {
}


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``{name: lines}`` of the functions (methods, nested ones) longer than ``limit``
    lines whose docstring has no line starting with ``Long:``."""
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            reason = any(line.strip().startswith("Long:") for line in (ast.get_docstring(node) or "").splitlines())
            if lines > limit and not reason:
                out[node.name] = lines
    return out


def test_long_functions_finds_long_ones_without_a_reason():
    body = "".join(f"    x{i} = {i}\n" for i in range(4))
    assert long_functions(f"def f():\n{body}", limit=4) == {"f": 5}
    assert long_functions(f'def f():\n    """Long: a table."""\n{body}', limit=4) == {}
    assert long_functions(f"def f():\n{body}", limit=5) == {}


def test_no_function_over_60_lines_without_a_reason():
    found = {f"{path.relative_to(PACKAGE_DIR).as_posix()}::{name}": lines
             for path in checked_sources() for name, lines in long_functions(path.read_text(encoding="utf-8")).items()}
    assert {k: v for k, v in found.items() if k not in STILL_LONG} == {}, "split it, or a 'Long:' docstring line"
    assert [k for k in STILL_LONG if k not in found] == [], "short again: take it off STILL_LONG"
