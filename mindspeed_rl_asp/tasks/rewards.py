"""Rewards by name: the registry a task's ``task.verifier_function`` picks from.

A reward is a function ``(response, prompt) -> float`` (``prompt`` a task prompt, see
:mod:`~mindspeed_rl_asp.tasks.base`) with a *kind*: ``accuracy`` (is the answer right),
``format`` (is the response well-formed) or ``shaping`` (a bonus that is neither). A run's
reward is ``sum(verifier_weight[i] * verifier_function[i](response, prompt))``, as in
MindSpeed-RL, whose key names these are. Every step also reports two rates:
``correctness`` = share of samples whose ``task.correctness_reward`` (default: the first
accuracy reward listed) is above 0, and ``integrity`` = the same for
``task.integrity_reward`` (default: the first format reward listed, else
``nonempty_answer``). docs/tasks.md lists every name with its definition and source.

A name with a ``:`` or a ``.`` is a user's function, ``package.module:function``: it is
imported (``ImportError`` -> one :class:`~mindspeed_rl_asp.tasks.base.TaskError`) and
called like the built-in ones; its ``kind`` attribute, if it has one, gives its kind
(default ``accuracy``).

The math rewards use math-verify (imported when first called) to compare answers.
"""
from __future__ import annotations

import difflib
import functools
import importlib
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from . import maze as maze_task
from .base import TaskError

KINDS = ("accuracy", "format", "shaping")


@dataclass(frozen=True)
class RewardFn:
    name: str
    fn: Callable[[str, object], float]
    kind: str
    needs: tuple[str, ...] = ()      # "answer": a reference answer; "maze": a maze in the question
    origin: str = "project"          # MindSpeed-RL | AlphaMaze | MazeBench | project | user
    definition: str = ""
    import_root: Optional[str] = None

    def __call__(self, response: str, prompt) -> float:
        return float(self.fn(response, prompt))


REGISTRY: dict[str, RewardFn] = {}


def register(name: str, kind: str, needs: tuple[str, ...] = (), origin: str = "project"):
    def wrap(fn):
        REGISTRY[name] = RewardFn(name, fn, kind, needs, origin, " ".join((fn.__doc__ or "").split()))
        return fn
    return wrap


# ----------------------------------------------------------------------------- text helpers

def strip_end_tokens(text: str) -> str:
    """``text`` without trailing whitespace and end-of-text tokens (``<|im_end|>`` ...)."""
    while True:
        text = text.rstrip()
        for eot in maze_task.END_OF_TEXT_TOKENS:
            if text.endswith(eot):
                text = text[: -len(eot)]
                break
        else:
            return text


def final_text(response: str) -> str:
    """What follows the last ``</think>`` (the whole response without one), without end
    tokens, stripped: where the rewards that do not name another place read the answer."""
    text = strip_end_tokens(response)
    if maze_task.THINK_CLOSE in text:
        text = text.rsplit(maze_task.THINK_CLOSE, 1)[1]
    return text.strip()


def last_boxed(text: str) -> Optional[str]:
    r"""The content of the last ``\boxed{...}`` in ``text`` (braces matched), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


def _normal(text: str) -> str:
    text = text.strip().strip("$").strip()
    text = re.sub(r"\\text\{([^{}]*)\}", r"\1", text)
    return re.sub(r"\s+", "", text).rstrip(".")


def _timeout() -> Optional[int]:
    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    return 5 if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=8192)
def _parsed(text: str, boxed: bool):
    from math_verify import parse

    return parse(f"\\boxed{{{text}}}" if boxed else text, parsing_timeout=_timeout())


def math_equal(pred: Optional[str], gold: Optional[str]) -> bool:
    """``pred`` and ``gold`` (answer expressions, no ``\\boxed``) are the same answer: equal
    after normalising spaces, ``$`` and ``\\text{}``, or equal as math by math-verify."""
    if pred is None or gold is None or not pred.strip():
        return False
    if _normal(pred) == _normal(gold):
        return True
    try:
        from math_verify import verify

        g, p = _parsed(gold, True), _parsed(pred, True)
        return bool(g and p and verify(g, p, timeout_seconds=_timeout()))
    except Exception:  # a parser failure on model output is a wrong answer, not a crash
        return False


def _gold(prompt) -> str:
    answer = getattr(prompt, "answer", None)
    if answer is None:
        raise TaskError(f"prompt {prompt.id!r} has no reference answer, which this reward needs; set task.answer_key")
    return str(answer)


_MS_FORMAT = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>$", re.DOTALL | re.MULTILINE)
_MS_BOXED_FORMAT = re.compile(r"<think>.*</think>.*<answer>.*\\boxed\{.*\}.*</answer>", re.DOTALL)
_MS_STEPS = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)")


def _ms_structure_ok(text: str) -> bool:
    """MindSpeed-RL's strict structure: exactly one ``<think>``, ``</think>``, ``<answer>``,
    ``\\boxed{...}`` and ``</answer>``, in that order, starting with ``<think>`` and
    ending with ``</answer>``."""
    counts = (text.count("<think>"), text.count("</think>"), text.count("<answer>"),
              len(re.findall(r"\\boxed\{.*?\}", text)), text.count("</answer>"))
    if counts != (1, 1, 1, 1, 1):
        return False
    boxed = re.search(r"\\boxed\{.*?\}", text).start()
    order = (text.find("<think>"), text.find("</think>"), text.find("<answer>"), boxed, text.find("</answer>"))
    return list(order) == sorted(order) and text.startswith("<think>") and text.endswith("</answer>")


# ----------------------------------------------------------------------------- MindSpeed-RL's names

@register("acc", "accuracy", ("answer",), "MindSpeed-RL")
def acc(response, prompt):
    """1.0 if the last \\boxed{} answer equals the reference, -0.5 if it does not, -1.0
    if the response has no \\boxed{} answer."""
    boxed = last_boxed(strip_end_tokens(response))
    if not boxed:
        return -1.0
    return 1.0 if math_equal(boxed, _gold(prompt)) else -0.5


@register("base_acc", "accuracy", ("answer",), "MindSpeed-RL")
def base_acc(response, prompt):
    """1.0 iff the response matches <think>...</think>...<answer>...\\boxed{...}...</answer>
    and the last \\boxed{} answer equals the reference, else 0.0."""
    text = strip_end_tokens(response)
    ok = _MS_BOXED_FORMAT.fullmatch(text) and math_equal(last_boxed(text), _gold(prompt))
    return 1.0 if ok else 0.0


@register("math_17k_acc", "accuracy", ("answer",), "MindSpeed-RL")
def math_17k_acc(response, prompt):
    """1.0 iff the last \\boxed{} answer equals the reference, else 0.0."""
    return 1.0 if math_equal(last_boxed(strip_end_tokens(response)), _gold(prompt)) else 0.0


@register("acc_for_ppo", "accuracy", ("answer",), "MindSpeed-RL")
def acc_for_ppo(response, prompt):
    """1.0 iff the last \\boxed{} answer equals the reference, else 0.0 (as math_17k_acc)."""
    return math_17k_acc(response, prompt)


@register("math_verify_reward", "accuracy", ("answer",), "MindSpeed-RL")
def math_verify_reward(response, prompt):
    """1.0 iff the response matches <think>...</think>...<answer>...\\boxed{...}...</answer>
    and math-verify finds its answer equal to the reference, else 0.0."""
    text = strip_end_tokens(response)
    return math_verify(text, prompt) if _MS_BOXED_FORMAT.fullmatch(text) else 0.0


@register("format", "format", (), "MindSpeed-RL")
def format_(response, prompt):
    """1.0 iff the whole response is <think>...</think> then <answer>...</answer>, else 0.0."""
    return 1.0 if _MS_FORMAT.match(strip_end_tokens(response)) else 0.0


@register("strict_format", "format", (), "MindSpeed-RL")
def strict_format(response, prompt):
    """1.0 iff exactly one <think>, </think>, <answer>, \\boxed{...}, </answer> appear in that
    order, the response starting with <think> and ending with </answer>; else -0.5."""
    return 1.0 if _ms_structure_ok(strip_end_tokens(response)) else -0.5


@register("step", "shaping", (), "MindSpeed-RL")
def step(response, prompt):
    """min(1, n / 3) for n step markers ("Step 1:", "1.", bullets, "First," ...)."""
    return min(1.0, len(_MS_STEPS.findall(response)) / 3)


# DAPO's answer check (MindSpeed-RL's acc_for_dapo and retool_reward, models/math_dapo.py):
# the "Minerva" normalisation of a final answer (Lewkowycz et al. 2022, "Solving Quantitative
# Reasoning Problems with Language Models", appendix D), then string equality. Written from that
# description and checked on MindSpeed-RL's behaviour; the rule tables are the paper's.
_MINERVA_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
                    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_MINERVA_DROP = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
                 "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
                 "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
                 "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
                 ",\\!", "{,}", '"', "\\dots")
_DAPO_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_DAPO_TAIL = 300       # characters of the response that are read (MindSpeed-RL: the longest MATH-500 answer is 159)


def minerva_normalize(answer: str) -> str:
    """A final answer in the Minerva normal form: the part after the last ``=``, units, spaces
    and TeX decoration removed, ``\\fracab`` written ``\\frac{a}{b}``, ``1,000`` as ``1000``."""
    text = answer.split("=")[-1]
    for before, after in _MINERVA_REPLACE:
        text = text.replace(before, after)
    for dropped in _MINERVA_DROP:
        text = text.replace(dropped, "")
    text = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", text)
    for command in ("text", "textbf", "overline"):
        text = re.sub(r"(\\" + command + r"\{)(.*?)(\})", r"\2", text)
    text = re.sub(r"(\\boxed\{)(.*)(\})", r"\2", text)
    text = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", text)
    text = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", text).replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


@register("acc_for_dapo", "accuracy", ("answer",), "MindSpeed-RL")
def acc_for_dapo(response, prompt):
    """DAPO's rule: in the last 300 characters, the last "Answer: X" line, Minerva-normalised,
    equals the normalised reference: 1.0, else -1.0 (also without such a line)."""
    found = _DAPO_ANSWER.findall(strip_end_tokens(response)[-_DAPO_TAIL:])
    predicted = minerva_normalize(found[-1]) if found else None
    return 1.0 if predicted is not None and predicted == minerva_normalize(_gold(prompt)) else -1.0


@register("retool_reward", "accuracy", ("answer",), "MindSpeed-RL")
def retool_reward(response, prompt):
    """ReTool's strict rule, single-turn: the last \\boxed{} in the last 100 characters holds
    exactly the reference: 1.0, else -1.0. (MindSpeed-RL adds 0.1 per tool call to a negative
    score, capped at 0; a single-turn response makes no tool calls.)"""
    boxed = last_boxed(strip_end_tokens(response)[-_DAPO_TAIL:][-100:])
    return 1.0 if boxed is not None and boxed == _gold(prompt) else -1.0


# ----------------------------------------------------------------------------- generic

@register("exact_match", "accuracy", ("answer",))
def exact_match(response, prompt):
    """1.0 iff the final text (after the last </think>; the inside of its <answer> block if it
    has exactly one) equals the reference answer, both stripped; else 0.0."""
    text = final_text(response)
    if text.count("<answer>") == 1 and text.count("</answer>") == 1:
        text = text.split("<answer>", 1)[1].split("</answer>", 1)[0].strip()
    return 1.0 if text == _gold(prompt).strip() else 0.0


@register("math_verify", "accuracy", ("answer",))
def math_verify(response, prompt):
    """1.0 iff math-verify finds the answer in the final text (a \\boxed{} answer first,
    else a LaTeX or plain expression) equal to the reference answer, else 0.0."""
    text = final_text(response)
    if not text:
        return 0.0
    gold = _gold(prompt)
    boxed = last_boxed(text)
    if boxed is not None and math_equal(boxed, gold):
        return 1.0
    try:
        from math_verify import verify

        pred = _parsed(text, False)
        return 1.0 if pred and verify(_parsed(gold, True), pred, timeout_seconds=_timeout()) else 0.0
    except Exception:
        return 0.0


@register("nonempty_answer", "format", ())
def nonempty_answer(response, prompt):
    """1.0 iff the final text (after the last </think>, end tokens removed) is not empty."""
    return 1.0 if final_text(response) else 0.0


# ----------------------------------------------------------------------------- mazes

@functools.lru_cache(maxsize=4096)
def _maze(question: str):
    return maze_task.parse_maze(question)


@register("maze_integrity", "format", ("maze",))
def maze_integrity(response, prompt):
    """The project's layout: 1.0 iff one <answer> block after the think block, made only of
    move tokens, with nothing but end tokens after it (tasks/maze.integrity_reward)."""
    return maze_task.integrity_reward(response)


@register("maze_correctness", "accuracy", ("maze",))
def maze_correctness(response, prompt):
    """The project's layout: 1.0 iff integrity holds and the moves are a legal route from
    origin to target (any legal route; tasks/maze.correctness_reward)."""
    return maze_task.correctness_reward(_maze(prompt.question), response)


@register("alphamaze_integrity", "format", (), "AlphaMaze")
def alphamaze_integrity(response, prompt):
    """The dataset's convention: 1.0 iff the text after </think>, whitespace removed, is a
    non-empty run of <|up|> <|down|> <|left|> <|right|> tokens only."""
    return maze_task.alphamaze_integrity(response)


@register("alphamaze_correctness", "accuracy", ("answer",), "AlphaMaze")
def alphamaze_correctness(response, prompt):
    """The dataset's convention: 0.2 per move iff the text after </think> equals the row's
    Response exactly, else 0.0."""
    return maze_task.alphamaze_correctness(_gold(prompt), response)


@register("alphamaze_xmlcount", "shaping", (), "AlphaMaze")
def alphamaze_xmlcount(response, prompt):
    """0.125 for exactly one "<think>\\n" plus 0.125 for exactly one "\\n</think>\\n"."""
    return maze_task.alphamaze_xmlcount(response)


@register("mazebench_correctness", "accuracy", ("maze",), "MazeBench")
def mazebench_correctness(response, prompt):
    """The dataset's convention: 1.0 iff the move tokens after </think>, walked from the
    origin, cross no wall and end on the target (any legal route, MazeBench's rule)."""
    return maze_task.mazebench_correctness(_maze(prompt.question), response)


# ----------------------------------------------------------------------------- lookup

def is_import_path(name: str) -> bool:
    return ":" in name or "." in name


def unknown_reward(name: str, key: str) -> Optional[str]:
    """The problem with reward name ``name`` at config key ``key``, or None: a registry
    name or something shaped like an import path (imported later, by :func:`resolve`)."""
    if not isinstance(name, str) or not name:
        return f"{key}={name!r} is empty; give a reward name ({', '.join(sorted(REGISTRY))}) or package.module:function"
    if name in REGISTRY or is_import_path(name):
        return None
    close = difflib.get_close_matches(name, list(REGISTRY), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return (f"{key}={name!r} is not a registered reward{hint} Registered: {', '.join(sorted(REGISTRY))}; "
            "or give a function of your own as package.module:function")


def resolve(name: str, key: str) -> RewardFn:
    """The reward called ``name`` (config key ``key``, for the error): a registry entry or
    a user's function imported from ``package.module:function``."""
    problem = unknown_reward(name, key)
    if problem:
        raise TaskError(problem)
    if name in REGISTRY:
        return REGISTRY[name]
    module_name, sep, attr = name.partition(":")
    if not sep:
        module_name, _, attr = name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise TaskError(f"{key}={name!r}: cannot import module {module_name!r} ({type(error).__name__}: {error}); "
                        "it must be importable where asp-train runs (installed, or on PYTHONPATH)") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise TaskError(f"{key}={name!r}: module {module_name!r} has no function {attr!r}")
    kind = getattr(fn, "kind", "accuracy")
    if kind not in KINDS:
        raise TaskError(f"{key}={name!r}: its kind attribute {kind!r} is not one of {', '.join(KINDS)}")
    needs = tuple(getattr(fn, "needs", ()))
    return RewardFn(name, fn, kind, needs, "user", (fn.__doc__ or "").strip(), _import_root(module))


def _import_root(module) -> Optional[str]:
    """The directory to put on sys.path so that ``module`` (a top-level package or module)
    imports, when it came from a file."""
    path = getattr(module, "__file__", None)
    if not path:
        return None
    root = Path(path).resolve().parent
    for _ in range(module.__name__.count(".")):
        root = root.parent
    return str(root)


@dataclass(frozen=True)
class RewardSet:
    """The weighted rewards of a task and the two components its rates read."""

    terms: tuple[tuple[RewardFn, float], ...]
    correctness: RewardFn
    integrity: RewardFn

    @property
    def names(self) -> list[str]:
        return [fn.name for fn, _ in self.terms]

    def needs(self, what: str) -> bool:
        return any(what in fn.needs for fn in self.all())

    def all(self) -> list[RewardFn]:
        seen = {fn.name: fn for fn, _ in self.terms}
        for fn in (self.correctness, self.integrity):
            seen.setdefault(fn.name, fn)
        return list(seen.values())

    def import_roots(self) -> list[str]:
        return sorted({fn.import_root for fn in self.all() if fn.import_root})

    def score(self, prompt, response: str) -> dict:
        values = {fn.name: fn(response, prompt) for fn in self.all()}
        return {
            "reward": sum(weight * values[fn.name] for fn, weight in self.terms),
            "correctness": 1.0 if values[self.correctness.name] > 0 else 0.0,
            "integrity": 1.0 if values[self.integrity.name] > 0 else 0.0,
            "components": {fn.name: values[fn.name] for fn, _ in self.terms},
        }


def make_reward_set(names: Sequence[str], weights: Sequence[float], correctness: str = "",
                    integrity: str = "") -> RewardSet:
    """The rewards ``task.verifier_function`` names, weighted by ``task.verifier_weight``
    (empty: 1.0 each), and the components the two rates read."""
    names, weights = list(names), [float(w) for w in weights]
    if not names:
        raise TaskError("task.verifier_function is empty: name at least one reward")
    if weights and len(weights) != len(names):
        raise TaskError(f"task.verifier_weight has {len(weights)} weights for the {len(names)} rewards of "
                        "task.verifier_function; give one weight per reward (or none: 1.0 each)")
    fns = [resolve(name, f"task.verifier_function[{i}]") for i, name in enumerate(names)]
    if len({fn.name for fn in fns}) != len(fns):
        raise TaskError(f"task.verifier_function={names} lists a reward twice")

    def pick(key: str, given: str, kind: str, fallback: Optional[str]) -> RewardFn:
        if given:
            listed = {fn.name: fn for fn in fns}
            return listed.get(given) or resolve(given, key)
        for fn in fns:
            if fn.kind == kind:
                return fn
        if fallback:
            return REGISTRY[fallback]
        raise TaskError(f"none of task.verifier_function={names} is an {kind} reward, so {key} must name the "
                        "reward that says whether an answer is right")

    return RewardSet(tuple(zip(fns, weights or [1.0] * len(fns))),
                     pick("task.correctness_reward", correctness, "accuracy", None),
                     pick("task.integrity_reward", integrity, "format", "nonempty_answer"))


def user_import_roots_on_path(roots: Sequence[str]) -> None:
    """Put the directories of a task's user rewards on ``sys.path`` (in a worker process)."""
    for root in roots:
        if root not in sys.path:
            sys.path.insert(0, root)
