"""Importing the package (every module of it) never pulls in an accelerator stack."""
import subprocess
import sys

# mindspeed covers mindspeed_rl by prefix below only if spelled out: the check compares
# top-level module names, so MindSpeed-RL's package and vllm-ascend's are listed too.
FORBIDDEN = ("torch_npu", "vllm", "vllm_ascend", "mindspeed", "mindspeed_rl", "megatron")

CHECK = """
import importlib, pkgutil, sys
import mindspeed_rl_asp
for info in pkgutil.walk_packages(mindspeed_rl_asp.__path__, "mindspeed_rl_asp."):
    importlib.import_module(info.name)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {forbidden!r})
print(",".join(loaded))
"""


def test_no_accelerator_stack_on_import():
    out = subprocess.run([sys.executable, "-c", CHECK.format(forbidden=set(FORBIDDEN))],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"imported: {out.stdout.strip()}"


def test_forbidden_names_are_the_ones_the_integration_must_avoid():
    # The MindSpeed-RL integration (integrations/mindspeed/) must stay import-guarded.
    assert {"mindspeed_rl", "torch_npu", "megatron", "vllm_ascend"} <= set(FORBIDDEN)


def test_package_import_is_light():
    out = subprocess.run([sys.executable, "-c", "import sys, mindspeed_rl_asp; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- import circles
#
# Every import counts here, including the ones deliberately deferred into a function body
# (to keep torch out of `import mindspeed_rl_asp`): deferring changes *when* a module
# loads, not that it depends on the other. Both circles a review found ran through a
# deferred import (schedule.predictors -> lm_predictor for PREDICTORS["lm"], and
# engines.hf -> policy.tokenizer inside load_policy), so a graph of module-level imports
# alone was acyclic and would not notice either coming back. Imports under
# `if TYPE_CHECKING:` never run and are left out.

import ast
from pathlib import Path

import mindspeed_rl_asp

PACKAGE = "mindspeed_rl_asp"


def package_modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package."""
    root = Path(mindspeed_rl_asp.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def import_nodes(tree: ast.AST):
    """Every import statement in ``tree`` at any depth, except under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(tree):
        if _is_type_checking_block(child):
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from import_nodes(child)


def imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Absolute names ``node`` may import: ``from a import b`` gives ``a.b`` (b may be a
    submodule) and ``a``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [source] + [f"{source}.{alias.name}" for alias in node.names]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (a submodule when ``from a import sub``
    names one, else the module ``a`` itself)."""
    graph = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        targets = set()
        for node in import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = imported_names(node, module, is_package)
            submodules = [n for n in names[1:] if n in modules] if isinstance(node, ast.ImportFrom) else []
            targets |= set(submodules) if submodules else {n for n in names if n in modules}
        graph[module] = targets - {module}
    return graph


def subpackage_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same edges between subpackages (``mindspeed_rl_asp.engines`` ...): a circle of
    layers, such as engines -> policy -> engines, need not be a circle of modules."""
    def layer(module: str) -> str:
        return ".".join(module.split(".")[:2])

    layers: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = layers.setdefault(layer(module), set())
        edges |= {layer(t) for t in targets} - {layer(module)}
    return layers


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path whose last node is its first, or None."""
    state: dict[str, str] = {}  # "open" while on the DFS stack, "done" after
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_find_cycle_sees_a_circle_and_only_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_import_graph_counts_deferred_imports_and_skips_type_checking(tmp_path):
    source = ("from typing import TYPE_CHECKING\nfrom . import b\nif TYPE_CHECKING:\n    from .c import X\n"
              "def f():\n    from ..other import mod\n")
    (tmp_path / "a.py").write_text(source)
    modules = {"pkg.sub.a": tmp_path / "a.py", "pkg.sub.b": tmp_path / "b.py", "pkg.sub.c": tmp_path / "c.py",
               "pkg.other": tmp_path / "other.py", "pkg.other.mod": tmp_path / "mod.py"}
    for name in ("b", "c", "other", "mod"):
        (tmp_path / f"{name}.py").write_text("")
    assert import_graph(modules)["pkg.sub.a"] == {"pkg.sub.b", "pkg.other.mod"}


def test_no_module_imports_itself_through_others():
    cycle = find_cycle(import_graph(package_modules()))
    assert cycle is None, ("import circle: " + " -> ".join(cycle) + "; move what both need into the lower "
                           "module (e.g. schedule/observations.py) instead of importing back up")


def test_no_subpackage_imports_itself_through_others():
    cycle = find_cycle(subpackage_graph(import_graph(package_modules())))
    assert cycle is None, ("circle of subpackages: " + " -> ".join(cycle) + "; the lower layer must not "
                           "import the higher one, not even inside a function")
