"""Maze reasoning task in the MAZE-REASONING-GRPO-V0.1 (AlphaMaze) token format.

Why this task: the ASP pipeline needs an RL workload whose response lengths vary
strongly from prompt to prompt (a long tail) *and* are predictable from the
prompt, so that length-aware scheduling has something to exploit. A maze solved
by an explicit depth-first search has exactly that property: the length of the
exploration trace is driven by the maze size and by its structure, both of
which are visible in the prompt. The vocabulary is tiny and closed, so a very
small policy can learn it from scratch.

Everything here is pure standard-library Python so that it runs anywhere
(CPU CI, data preprocessing workers, reward workers) without heavy imports.

Format summary (all exact; other modules build a tokenizer from
:func:`maze_vocabulary`, so do not change token spellings):

* Prompt::

    <|maze_start|>
    <|0-0|><|up_left_wall|><|origin|><|0-1|><|up_right_wall|><|blank|>
    <|1-0|><|down_left_wall|><|blank|><|1-1|><|down_right_wall|><|target|>
    <|maze_end|>

  (one line per row, each cell is the triple ``cell, walls, marker``; the
  prompt ends with a newline after ``<|maze_end|>``).

* Reference response::

    <think><|0-0|><|0-1|><|back|><|1-0|><|1-1|></think>
    <answer><|down|><|right|></answer>

  (without the line break inside: ``</think>`` is followed by a single ``\\n``
  and then ``<answer>``). The trace is a DFS from the origin trying
  neighbours in the order up, right, down, left; entering a cell writes its
  token, leaving a dead end writes ``<|back|>``; it stops when the target is
  entered. The answer is the resulting path as move tokens.

* The MAZE-REASONING-GRPO-V0.1 layout (``layout="alphamaze"``), the published
  dataset's own: an English instruction (:data:`ALPHAMAZE_INSTRUCTION`), a line
  ``MAZE:``, then one line per row of the same cell triples, with no start/end tags and
  no final newline. A response answers with the move tokens after ``</think>``, with no
  answer tags, and a dataset row's ``Response`` holds exactly those moves, for example
  ``<|up|><|up|><|left|>``. :func:`parse_maze` reads both layouts.

Conventions of the Python API:

* A cell is a ``(row, col)`` tuple, 0-based.
* A *move* is a direction name: ``"up"``, ``"down"``, ``"left"`` or
  ``"right"``; :func:`move_token` turns it into its token ``<|up|>`` etc.
  ``solve_dfs`` and ``extract_moves`` return names, ``can_move`` takes a name.
* Every text of the task is a sequence of :data:`TOKEN_PATTERN` tokens; use
  :func:`tokenize` / :func:`count_tokens` to measure lengths in those units.
"""
from __future__ import annotations

import functools
import itertools
import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = [
    "TOKEN_PATTERN",
    "DIRECTIONS",
    "DFS_ORDER",
    "MAZE_START",
    "MAZE_END",
    "THINK_OPEN",
    "THINK_CLOSE",
    "ANSWER_OPEN",
    "ANSWER_CLOSE",
    "BACK_TOKEN",
    "ORIGIN_MARKER",
    "TARGET_MARKER",
    "BLANK_MARKER",
    "MARKERS",
    "END_OF_TEXT_TOKENS",
    "LAYOUTS",
    "ALPHAMAZE_INSTRUCTION",
    "MazeFormatError",
    "VocabularyError",
    "check_unique_tokens",
    "Maze",
    "MazeTaskSpec",
    "MazePrompt",
    "MazeRewardWeights",
    "tokenize",
    "count_tokens",
    "cell_token",
    "wall_token",
    "move_token",
    "maze_vocabulary",
    "can_move",
    "step",
    "open_neighbours",
    "is_perfect",
    "generate_maze",
    "format_prompt",
    "parse_maze",
    "solve_dfs",
    "format_response",
    "response_token_bound",
    "extract_moves",
    "integrity_reward",
    "correctness_reward",
    "score_response",
    "alphamaze_answer",
    "alphamaze_integrity",
    "alphamaze_correctness",
    "alphamaze_xmlcount",
    "mazebench_correctness",
    "dataset_row",
    "solution_moves",
    "make_item",
    "make_dataset",
]

# --------------------------------------------------------------------------
# Tokens
# --------------------------------------------------------------------------

#: Every text of the task (prompt and response) is a concatenation of matches
#: of this pattern: a ``<|...|>`` tag, a think/answer tag, or one character.
TOKEN_PATTERN = r"<\|[^|<>]+\|>|</?think>|</?answer>|[\s\S]"
_TOKEN_RE = re.compile(TOKEN_PATTERN)

#: Order in which walls are listed in a wall token and stored in ``Maze.walls``.
DIRECTIONS: tuple[str, ...] = ("up", "down", "left", "right")
#: Order in which the reference DFS tries neighbours (clockwise from up).
DFS_ORDER: tuple[str, ...] = ("up", "right", "down", "left")

_DELTA = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}
_DIR_INDEX = {d: i for i, d in enumerate(DIRECTIONS)}

MAZE_START = "<|maze_start|>"
MAZE_END = "<|maze_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
BACK_TOKEN = "<|back|>"
ORIGIN_MARKER, TARGET_MARKER, BLANK_MARKER = "<|origin|>", "<|target|>", "<|blank|>"
MARKERS: tuple[str, ...] = (ORIGIN_MARKER, TARGET_MARKER, BLANK_MARKER)

#: End-of-text tokens a generation engine may leave at the end of a response.
#: They (and whitespace) are the only things tolerated after ``</answer>``.
END_OF_TEXT_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|end|>",
    "</s>",
)

_CELL_RE = re.compile(r"<\|(\d+)-(\d+)\|>")
_MOVE_TOKEN_RE = re.compile(r"<\|(up|down|left|right)\|>")
_ANSWER_BODY_RE = re.compile(r"(?:<\|(?:up|down|left|right)\|>)+")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into :data:`TOKEN_PATTERN` tokens (tags or single chars)."""
    return _TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    """Length of ``text`` in task tokens: a tag counts 1, any other char counts 1.

    This is the length unit of a tokenizer built from :func:`maze_vocabulary`
    plus single characters, so it is what scheduling and budgets should use.
    """
    return len(_TOKEN_RE.findall(text))


def cell_token(cell: tuple[int, int]) -> str:
    """``(r, c)`` -> ``<|r-c|>``."""
    r, c = cell
    return f"<|{r}-{c}|>"


def wall_token(walls: Sequence[bool]) -> str:
    """4 flags (up, down, left, right) -> e.g. ``<|up_left_wall|>`` / ``<|no_wall|>``."""
    names = [d for d, closed in zip(DIRECTIONS, walls) if closed]
    return f"<|{'_'.join(names)}_wall|>" if names else "<|no_wall|>"


def move_token(move: str) -> str:
    """Direction name -> move token, e.g. ``"up"`` -> ``<|up|>``."""
    if move not in _DELTA:
        raise ValueError(f"unknown move {move!r}; expected one of {DIRECTIONS}")
    return f"<|{move}|>"


def _all_wall_flags() -> list[tuple[bool, bool, bool, bool]]:
    """The 16 wall combinations, by number of walls then in DIRECTIONS order."""
    flags = []
    for k in range(len(DIRECTIONS) + 1):
        for combo in itertools.combinations(DIRECTIONS, k):
            flags.append(tuple(d in combo for d in DIRECTIONS))
    return flags  # type: ignore[return-value]


_WALL_TOKENS: dict[str, tuple[bool, bool, bool, bool]] = {
    wall_token(f): f for f in _all_wall_flags()
}
#: Spellings :func:`parse_maze` also reads: the dataset writes a cell closed on all four
#: sides as ``<|all_wall|>``. Not part of :func:`maze_vocabulary` (token ids stay as shipped).
_WALL_ALIASES: dict[str, tuple[bool, bool, bool, bool]] = {"<|all_wall|>": (True, True, True, True)}
_ALL_WALL_SPELLINGS = {**_WALL_TOKENS, **_WALL_ALIASES}

#: The two prompt layouts: the project's (tags only) and MAZE-REASONING-GRPO-V0.1's.
LAYOUTS: tuple[str, ...] = ("project", "alphamaze")
ALPHAMAZE_MAZE_LINE = "MAZE:"
#: The instruction every MAZE-REASONING-GRPO-V0.1 prompt starts with, character for
#: character (two spaces after "tokens." and "solves mazes.", as the dataset has them).
ALPHAMAZE_INSTRUCTION = (
    "You are a helpful assistant that solves mazes.  You will be given a maze represented by a series of "
    "tokens.  \n"
    "The tokens represent:\n"
    "- Coordinates: <|row-col|> (e.g., <|0-0|>, <|2-4|>)\n"
    "- Walls:  <|no_wall|>, <|up_wall|>, <|down_wall|>, <|left_wall|>, <|right_wall|>, <|up_down_wall|>, etc.\n"
    "- Origin: <|origin|>\n"
    "- Target: <|target|>\n"
    "- Movement: <|up|>, <|down|>, <|left|>, <|right|>, <|blank|>\n"
    "\n"
    "Your task is to output the sequence of movements (<|up|>, <|down|>, <|left|>, <|right|>) required to "
    "navigate from the origin to the target, based on the provided maze representation.  Think step by step. "
    "At each step, predict only the next movement token. Output only the move tokens, separated by spaces."
)


def maze_vocabulary(max_size: int) -> list[str]:
    """All multi-character tokens the task can produce for mazes up to ``max_size``.

    Ordered and duplicate-free so that a tokenizer built from it gets stable
    ids. Single characters (``\\n`` ...) are the tokenizer builder's business.
    """
    if not isinstance(max_size, int) or max_size < 1:
        raise ValueError(f"max_size must be an int >= 1, got {max_size!r}")
    vocab = [MAZE_START, MAZE_END]
    vocab += [cell_token((r, c)) for r in range(max_size) for c in range(max_size)]
    vocab += list(_WALL_TOKENS)
    vocab += list(MARKERS)
    vocab.append(BACK_TOKEN)
    vocab += [move_token(d) for d in DIRECTIONS]
    vocab += [THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE]
    check_unique_tokens(vocab, f"maze_vocabulary({max_size})")
    return vocab


class VocabularyError(ValueError):
    """A vocabulary lists a token twice, so the token would get two ids."""


def check_unique_tokens(tokens: Sequence[str], what: str) -> None:
    """Raise :class:`VocabularyError` naming every token ``tokens`` lists more than once.

    A checked error, not an ``assert``: a tokenizer built from a vocabulary with
    duplicates maps one token to two ids, and ``python -O`` would strip the assert."""
    repeated = sorted(token for token, count in Counter(tokens).items() if count > 1)
    if repeated:
        raise VocabularyError(f"{what} lists {', '.join(map(repr, repeated))} more than once; each token "
                              "needs exactly one id: rename the colliding token constant")


# --------------------------------------------------------------------------
# Maze
# --------------------------------------------------------------------------


class MazeFormatError(ValueError):
    """A prompt is not a well-formed maze; the message says what and where."""


Walls = tuple[tuple[tuple[bool, bool, bool, bool], ...], ...]


@dataclass(frozen=True)
class Maze:
    """A square grid maze.

    ``walls[r][c]`` is ``(up, down, left, right)``: True where the side of cell
    ``(r, c)`` is closed. Outer borders are walls. Construction only checks
    shapes and ranges; wall consistency is checked by :func:`parse_maze` (which
    reads untrusted text) and guaranteed by :func:`generate_maze`.
    """

    size: int
    walls: Walls
    origin: tuple[int, int]
    target: tuple[int, int]

    def __post_init__(self) -> None:
        n = self.size
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"maze size must be an int >= 1, got {n!r}")
        if len(self.walls) != n or any(len(row) != n for row in self.walls):
            raise ValueError(f"walls must be a {n}x{n} grid")
        if any(len(w) != 4 for row in self.walls for w in row):
            raise ValueError("each cell's walls must be 4 flags (up, down, left, right)")
        for name, cell in (("origin", self.origin), ("target", self.target)):
            if not _in_grid(n, cell):
                raise ValueError(f"{name} {cell!r} is outside the {n}x{n} grid")
        if tuple(self.origin) == tuple(self.target):
            raise ValueError(f"origin and target are the same cell {self.origin!r}")

    def cells(self) -> Iterable[tuple[int, int]]:
        """All cells in row-major order."""
        return ((r, c) for r in range(self.size) for c in range(self.size))


def _in_grid(size: int, cell: tuple[int, int]) -> bool:
    return (
        isinstance(cell, tuple)
        and len(cell) == 2
        and 0 <= cell[0] < size
        and 0 <= cell[1] < size
    )


def step(cell: tuple[int, int], move: str) -> tuple[int, int]:
    """The cell next to ``cell`` in direction ``move`` (may be outside the grid)."""
    dr, dc = _DELTA[move]
    return (cell[0] + dr, cell[1] + dc)


def can_move(maze: Maze, cell: tuple[int, int], move: str) -> bool:
    """True iff ``move`` (a direction name) from ``cell`` stays in the grid and
    crosses no wall. Unknown move names or cells outside the grid give False."""
    if move not in _DELTA or not _in_grid(maze.size, cell):
        return False
    r, c = cell
    if maze.walls[r][c][_DIR_INDEX[move]]:
        return False
    return _in_grid(maze.size, step(cell, move))


def open_neighbours(
    maze: Maze, cell: tuple[int, int], order: Sequence[str] = DIRECTIONS
) -> list[tuple[str, tuple[int, int]]]:
    """``(move, next_cell)`` for every open side of ``cell``, in ``order``."""
    return [(m, step(cell, m)) for m in order if can_move(maze, cell, m)]


def is_perfect(maze: Maze) -> bool:
    """True iff the open passages form a spanning tree (one path between any
    two cells): exactly n*n-1 open internal edges and everything connected."""
    n = maze.size
    edges = sum(
        1 for cell in maze.cells() for m in ("down", "right") if can_move(maze, cell, m)
    )
    if edges != n * n - 1:
        return False
    seen = {(0, 0)}
    stack = [(0, 0)]
    while stack:
        cell = stack.pop()
        for _, nxt in open_neighbours(maze, cell):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return len(seen) == n * n


def generate_maze(size: int, seed: int) -> Maze:
    """A perfect ``size`` x ``size`` maze by randomized depth-first search.

    Iterative recursive backtracker from a random start cell, driven by
    ``random.Random(seed)`` so that the same (size, seed) always gives the same
    maze. Origin and target are two distinct random cells (their placement is
    part of what makes response lengths vary).
    """
    if not isinstance(size, int) or size < 2:
        raise ValueError(f"maze size must be an int >= 2, got {size!r}")
    rng = random.Random(seed)
    n = size
    walls = [[[True, True, True, True] for _ in range(n)] for _ in range(n)]
    start = (rng.randrange(n), rng.randrange(n))
    visited = {start}
    stack = [start]
    while stack:
        cell = stack[-1]
        options = []
        for m in DIRECTIONS:
            nxt = step(cell, m)
            if _in_grid(n, nxt) and nxt not in visited:
                options.append((m, nxt))
        if not options:
            stack.pop()
            continue
        m, nxt = rng.choice(options)
        walls[cell[0]][cell[1]][_DIR_INDEX[m]] = False
        walls[nxt[0]][nxt[1]][_DIR_INDEX[_OPPOSITE[m]]] = False
        visited.add(nxt)
        stack.append(nxt)
    origin_idx, target_idx = rng.sample(range(n * n), 2)
    return Maze(
        size=n,
        walls=tuple(tuple(tuple(w) for w in row) for row in walls),  # type: ignore[misc]
        origin=divmod(origin_idx, n),
        target=divmod(target_idx, n),
    )


# --------------------------------------------------------------------------
# Prompt: format and parse
# --------------------------------------------------------------------------


def _marker(maze: Maze, cell: tuple[int, int]) -> str:
    if cell == maze.origin:
        return ORIGIN_MARKER
    if cell == maze.target:
        return TARGET_MARKER
    return BLANK_MARKER


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown maze layout {layout!r}; expected one of {', '.join(LAYOUTS)}")


def _row_lines(maze: Maze, all_wall: str | None = None) -> list[str]:
    def walls(cell):
        token = wall_token(maze.walls[cell[0]][cell[1]])
        return all_wall if all_wall and all(maze.walls[cell[0]][cell[1]]) else token

    return ["".join(cell_token((r, c)) + walls((r, c)) + _marker(maze, (r, c)) for c in range(maze.size))
            for r in range(maze.size)]


def format_prompt(maze: Maze, layout: str = "project") -> str:
    """The prompt text of ``maze``.

    ``project``: tokens only, no natural language (the policy is tiny and learns the task
    from scratch), between ``<|maze_start|>`` and ``<|maze_end|>`` lines. ``alphamaze``:
    exactly as a MAZE-REASONING-GRPO-V0.1 row's ``Prompt``: the dataset's instruction, a
    line ``MAZE:``, the rows (a cell walled on all sides is ``<|all_wall|>``), no final
    newline.
    """
    _check_layout(layout)
    if layout == "alphamaze":
        return "\n".join([ALPHAMAZE_INSTRUCTION, ALPHAMAZE_MAZE_LINE, *_row_lines(maze, "<|all_wall|>")])
    return "\n".join([MAZE_START, *_row_lines(maze), MAZE_END]) + "\n"


def _parse_row(line: str, r: int):
    """Parse one row line into [(walls, marker)], checking every token."""
    tokens = tokenize(line)
    cells = []
    i = 0
    c = 0
    while i < len(tokens):
        where = f"row {r}, column {c}"
        triple = tokens[i : i + 3]
        expected = cell_token((r, c))
        kinds = ("cell", "wall", "marker")
        for k, tok in enumerate(triple):
            if len(tok) == 1:
                raise MazeFormatError(
                    f"unexpected character {tok!r} at {where} (expected a {kinds[k]} token)"
                )
            known = (
                _CELL_RE.fullmatch(tok)
                or tok in _ALL_WALL_SPELLINGS
                or tok in MARKERS
                or tok in (MAZE_START, MAZE_END, BACK_TOKEN)
                or _MOVE_TOKEN_RE.fullmatch(tok)
                or tok in (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
            )
            if not known:
                raise MazeFormatError(f"unknown token {tok!r} at {where}")
        if len(triple) < 3:
            raise MazeFormatError(
                f"truncated cell at {where}: got {''.join(triple)!r}, "
                f"expected cell, wall and marker tokens"
            )
        cell_tok, wall_tok, marker_tok = triple
        if cell_tok != expected:
            if _CELL_RE.fullmatch(cell_tok):
                raise MazeFormatError(
                    f"missing or misplaced cell at {where}: expected {expected}, got {cell_tok}"
                )
            raise MazeFormatError(
                f"expected cell token {expected} at {where}, got {cell_tok!r}"
            )
        if wall_tok not in _ALL_WALL_SPELLINGS:
            raise MazeFormatError(f"expected a wall token at {where}, got {wall_tok!r}")
        if marker_tok not in MARKERS:
            raise MazeFormatError(f"expected a marker token at {where}, got {marker_tok!r}")
        cells.append((_ALL_WALL_SPELLINGS[wall_tok], marker_tok))
        i += 3
        c += 1
    return cells


def _maze_row_lines(prompt: str) -> list[str]:
    """The row lines of a prompt in either layout (see :func:`parse_maze`)."""
    lines = prompt.strip().split("\n")
    if lines and lines[0] == MAZE_START:
        if len(lines) < 2 or lines[-1] != MAZE_END:
            raise MazeFormatError(
                f"prompt must end with a line {MAZE_END}, got {lines[-1][-40:]!r}"
            )
        return lines[1:-1]
    stripped = [line.strip() for line in lines]
    if ALPHAMAZE_MAZE_LINE in stripped:
        rows = stripped[stripped.index(ALPHAMAZE_MAZE_LINE) + 1:]
        while rows and not rows[-1]:
            rows.pop()
        return rows
    raise MazeFormatError(
        f"prompt must start with a line {MAZE_START} (the project's layout) or hold a line "
        f"{ALPHAMAZE_MAZE_LINE} followed by the rows (the MAZE-REASONING-GRPO-V0.1 layout), "
        f"got {lines[0][:40]!r}"
    )


def parse_maze(prompt: str) -> Maze:
    """Parse a maze prompt, in either layout, into a :class:`Maze`.

    The project's layout (``<|maze_start|>`` ... ``<|maze_end|>``) is read exactly as
    :func:`format_prompt` writes it; only whitespace around the whole prompt is tolerated
    (chat templates and file I/O add or strip it). The MAZE-REASONING-GRPO-V0.1 layout is
    read from the line ``MAZE:`` on: everything before it (the instruction) is ignored,
    each following line is one row, whitespace around a row is tolerated, and a cell
    walled on all four sides may be spelled ``<|all_wall|>``. Anything else wrong raises
    :class:`MazeFormatError` naming what and where, because a silently misread maze would
    make rewards silently wrong.
    """
    if not isinstance(prompt, str):
        raise MazeFormatError(f"prompt must be a str, got {type(prompt).__name__}")
    rows = _square_rows(_maze_row_lines(prompt))
    n = len(rows)
    origin, target = _origin_and_target(rows)
    walls = tuple(tuple(rows[r][c][0] for c in range(n)) for r in range(n))
    _check_walls(walls)
    return Maze(size=n, walls=walls, origin=origin, target=target)


def _square_rows(row_lines: list[str]) -> list:
    """The parsed cells of every row; the rows must form a square of at least 2 x 2."""
    if not row_lines:
        raise MazeFormatError("maze has no rows")
    rows = []
    for r, line in enumerate(row_lines):
        if not line:
            raise MazeFormatError(f"row {r} is empty")
        rows.append(_parse_row(line, r))
    n_rows = len(rows)
    widths = [len(row) for row in rows]
    if len(set(widths)) != 1:
        r_bad = next(r for r, w in enumerate(widths) if w != widths[0])
        raise MazeFormatError(
            f"ragged rows: row {r_bad} has {widths[r_bad]} cells but row 0 has {widths[0]}"
        )
    if widths[0] != n_rows:
        raise MazeFormatError(
            f"maze is not square: {n_rows} rows of {widths[0]} cells"
        )
    if n_rows < 2:
        raise MazeFormatError(f"maze must be at least 2x2, got {n_rows}x{n_rows}")
    return rows


def _origin_and_target(rows: list) -> tuple[tuple[int, int], tuple[int, int]]:
    """The one origin and the one target cell."""
    found: dict[str, tuple[int, int]] = {}
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            marker = cell[1]
            name = {ORIGIN_MARKER: "origin", TARGET_MARKER: "target"}.get(marker)
            if name is None:
                continue
            if name in found:
                first = found[name]
                raise MazeFormatError(
                    f"duplicate {name} at row {r}, column {c} "
                    f"(first {name} at row {first[0]}, column {first[1]})"
                )
            found[name] = (r, c)
    for name in ("origin", "target"):
        if name not in found:
            raise MazeFormatError(f"no {name}: no cell has the marker <|{name}|>")
    return found["origin"], found["target"]


def _check_walls(walls) -> None:
    """Every border wall closed, and each wall seen alike from its two cells."""
    n = len(walls)
    for r in range(n):
        for c in range(n):
            w = walls[r][c]
            for d in DIRECTIONS:
                nr, nc = step((r, c), d)
                closed = w[_DIR_INDEX[d]]
                if not _in_grid(n, (nr, nc)):
                    if not closed:
                        raise MazeFormatError(
                            f"border wall missing: cell {cell_token((r, c))} at row {r}, "
                            f"column {c} has no {d} wall on the outer border"
                        )
                    continue
                if d in ("down", "right"):
                    other = walls[nr][nc][_DIR_INDEX[_OPPOSITE[d]]]
                    if other != closed:
                        raise MazeFormatError(
                            f"walls inconsistent between neighbours {cell_token((r, c))} "
                            f"and {cell_token((nr, nc))}: {d} wall of the first is "
                            f"{'closed' if closed else 'open'} but {_OPPOSITE[d]} wall "
                            f"of the second is {'closed' if other else 'open'}"
                        )


# --------------------------------------------------------------------------
# Reference solution
# --------------------------------------------------------------------------


def solve_dfs(maze: Maze) -> tuple[list[str], list[str]]:
    """Deterministic DFS from origin, neighbours tried in :data:`DFS_ORDER`.

    Returns ``(trace_tokens, path_moves)``: the trace is the cell token of
    every cell entered (origin first) and ``<|back|>`` for every dead end left;
    it stops when the target is entered. ``path_moves`` are direction names of
    the origin->target path (the DFS stack at the end). The trace is what makes
    response length depend on maze structure and origin/target placement.
    """
    trace = [cell_token(maze.origin)]
    visited = {maze.origin}
    # Stack of (cell, move that entered it, index of next direction to try).
    stack: list[list] = [[maze.origin, None, 0]]
    while stack:
        frame = stack[-1]
        cell = frame[0]
        if cell == maze.target:
            break
        advanced = False
        while frame[2] < len(DFS_ORDER):
            m = DFS_ORDER[frame[2]]
            frame[2] += 1
            if can_move(maze, cell, m):
                nxt = step(cell, m)
                if nxt not in visited:
                    visited.add(nxt)
                    trace.append(cell_token(nxt))
                    stack.append([nxt, m, 0])
                    advanced = True
                    break
        if not advanced:
            stack.pop()
            trace.append(BACK_TOKEN)
    if not stack:
        raise ValueError("target is not reachable from origin")
    moves = [frame[1] for frame in stack[1:]]
    return trace, moves


def response_token_bound(size: int) -> int:
    """Upper bound on the reference response length in tokens for a maze of
    ``size``: the DFS enters at most size*size cells and the response is
    ``2 * cells_entered + 4`` tokens. Useful as a generation budget."""
    return 2 * size * size + 4


def format_response(maze: Maze, layout: str = "project") -> str:
    """The reference response an ideal policy writes for ``maze``.

    ``project``: ``<think>`` + DFS trace + ``</think>``, a newline, then the moves between
    ``<answer>`` tags. ``alphamaze`` (the dataset's answer convention): ``<think>\\n`` +
    trace + ``\\n</think>\\n`` + the moves, no answer tags (the think tags as the
    original format bonus wants them)."""
    _check_layout(layout)
    trace, moves = solve_dfs(maze)
    answer = "".join(move_token(m) for m in moves)
    if layout == "alphamaze":
        return THINK_OPEN + "\n" + "".join(trace) + "\n" + THINK_CLOSE + "\n" + answer
    return THINK_OPEN + "".join(trace) + THINK_CLOSE + "\n" + ANSWER_OPEN + answer + ANSWER_CLOSE


def solution_moves(maze: Maze) -> str:
    """The origin -> target path as move tokens: a dataset row's ``Response``."""
    return "".join(move_token(m) for m in solve_dfs(maze)[1])


@functools.lru_cache(maxsize=4096)
def _solution_of(size: int, maze_seed: int) -> str:
    return solution_moves(generate_maze(size, maze_seed))


# --------------------------------------------------------------------------
# Rewards
# --------------------------------------------------------------------------


def _strip_trailer(text: str) -> str:
    """``text`` (what follows ``</answer>``) with leading whitespace and
    end-of-text tokens removed; non-empty iff something else is there."""
    rest = text
    while True:
        rest = rest.lstrip()
        for eot in END_OF_TEXT_TOKENS:
            if rest.startswith(eot):
                rest = rest[len(eot):]
                break
        else:
            return rest


def _answer_body(response: str) -> str | None:
    """The text between ``<answer>`` and ``</answer>`` if the response is
    well-formed (see :func:`integrity_reward`), else None."""
    if not isinstance(response, str):
        return None
    n_think_open = response.count(THINK_OPEN)
    n_think_close = response.count(THINK_CLOSE)
    if n_think_open > 1 or n_think_close > 1:
        return None
    if n_think_open and not n_think_close:
        return None  # unterminated think section
    think_end = 0
    if n_think_close:
        close_at = response.index(THINK_CLOSE)
        if n_think_open and response.index(THINK_OPEN) > close_at:
            return None
        think_end = close_at + len(THINK_CLOSE)
    if response.count(ANSWER_OPEN) != 1 or response.count(ANSWER_CLOSE) != 1:
        return None
    a_open = response.index(ANSWER_OPEN)
    a_close = response.index(ANSWER_CLOSE)
    if a_open < think_end or a_close < a_open:
        return None
    if _strip_trailer(response[a_close + len(ANSWER_CLOSE):]):
        return None
    return response[a_open + len(ANSWER_OPEN): a_close]


def extract_moves(response: str) -> list[str] | None:
    """Direction names of the answer, or None if the response lacks integrity."""
    body = _answer_body(response)
    if body is None or not _ANSWER_BODY_RE.fullmatch(body):
        return None
    return _MOVE_TOKEN_RE.findall(body)


def integrity_reward(response: str) -> float:
    """1.0 iff the response is well-formed, else 0.0.

    Well-formed means:

    * at most one ``<think>`` and one ``</think>``; if ``<think>`` is there,
      ``</think>`` must follow it (an unterminated think section fails). A
      bare ``</think>`` is allowed because chat templates often put the
      opening ``<think>`` in the prompt;
    * exactly one ``<answer>`` and one ``</answer>`` in the *whole*
      response (an answer inside the think section counts too: two answer
      blocks are ambiguous), in that order, after ``</think>`` if present;
    * the answer body is a non-empty run of ``<|up|>``, ``<|down|>``,
      ``<|left|>``, ``<|right|>`` tokens and nothing else, not even
      whitespace;
    * after ``</answer>`` only whitespace and :data:`END_OF_TEXT_TOKENS`:
      trailing text is rejected so that the policy learns to stop, which
      also keeps response lengths tied to the maze rather than to rambling.

    Text before ``<answer>`` (outside those tag rules) is not judged here.
    """
    return 1.0 if extract_moves(response) is not None else 0.0


def correctness_reward(maze: Maze, response: str) -> float:
    """1.0 iff integrity holds and following the moves from the origin never
    crosses a wall or leaves the grid and ends on the target, else 0.0.

    Revisiting cells (or passing over the target before the end) is allowed:
    only a legal walk ending on the target is required.
    """
    moves = extract_moves(response)
    if moves is None:
        return 0.0
    cell = maze.origin
    for m in moves:
        if not can_move(maze, cell, m):
            return 0.0
        cell = step(cell, m)
    return 1.0 if cell == maze.target else 0.0


# The MAZE-REASONING-GRPO-V0.1 answer convention (AlphaMaze's GRPO reward code): the answer
# is the text after ``</think>``, with no answer tags. Re-implemented from its definitions.

_ANY_TAG_RE = re.compile(r"<\|(.*?)\|>?")


def alphamaze_answer(response: str) -> str:
    """The text between the first ``</think>`` and the next (or the end), stripped; ``""``
    without ``</think>``: how the original reward code reads the answer."""
    parts = response.split(THINK_CLOSE) if isinstance(response, str) else []
    return parts[1].strip() if len(parts) > 1 else ""


def alphamaze_integrity(response: str) -> float:
    """1.0 iff the answer (:func:`alphamaze_answer`), whitespace removed, is a non-empty run
    of the four move tokens and nothing else (the original integrity reward)."""
    answer = re.sub(r"\s+", "", alphamaze_answer(response))
    return 1.0 if answer and _ANSWER_BODY_RE.fullmatch(answer) else 0.0


def alphamaze_correctness(expected: str, response: str) -> float:
    """0.2 per move iff the answer equals ``expected`` (a row's ``Response``, stripped)
    exactly, else 0.0 (the original correctness reward: moves counted as its code counts
    them, the pieces of the answer split at ``|><|``)."""
    answer = alphamaze_answer(response)
    if expected is None or answer != expected.strip() or not answer:
        return 0.0
    return 0.2 * len(answer.split("|><|"))


def alphamaze_xmlcount(response: str) -> float:
    """0.125 for exactly one ``<think>\\n`` plus 0.125 for exactly one ``\\n</think>\\n``:
    the original small bonus for well-formed think tags."""
    if not isinstance(response, str):
        return 0.0
    return 0.125 * (response.count(THINK_OPEN + "\n") == 1) + 0.125 * (response.count("\n" + THINK_CLOSE + "\n") == 1)


def mazebench_correctness(maze: Maze, response: str) -> float:
    """1.0 iff the move tokens of the answer (:func:`alphamaze_answer`), walked from the
    origin, never cross a wall or leave the grid and end on the target: any legal route
    counts, as MazeBench scores it. Other ``<|...|>`` tokens in the answer are no moves
    (MazeBench reads every such token and moves only for the four directions)."""
    cell = maze.origin
    for name in _ANY_TAG_RE.findall(alphamaze_answer(response)):
        if name not in _DELTA:
            continue
        if not can_move(maze, cell, name):
            return 0.0
        cell = step(cell, name)
    return 1.0 if cell == maze.target else 0.0


@dataclass(frozen=True)
class MazeRewardWeights:
    """Weights of the reward terms; integrity is a small shaping bonus so the
    format is learnt first, correctness is the real objective."""

    integrity: float = 0.2
    correctness: float = 1.0


def score_response(
    prompt: str, response: str, weights: MazeRewardWeights = MazeRewardWeights()
) -> dict[str, float]:
    """Score one response to one prompt.

    Returns ``{"integrity", "correctness", "reward"}`` with reward the weighted
    sum. A malformed prompt raises :class:`MazeFormatError` (a data bug, not a
    policy failure, so it must not be silently scored 0).
    """
    maze = parse_maze(prompt)
    integrity = integrity_reward(response)
    correctness = correctness_reward(maze, response)
    return {
        "integrity": integrity,
        "correctness": correctness,
        "reward": weights.integrity * integrity + weights.correctness * correctness,
    }


# --------------------------------------------------------------------------
# Dataset
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class MazeTaskSpec:
    """Distribution of maze sizes: P(size=s) ∝ size_decay**(s - min_size).

    With ``size_decay < 1`` small mazes dominate and big ones are rare, which
    gives the response lengths their long tail. The reference response of a
    maze whose DFS enters V cells is exactly ``2*V + 4`` tokens (V cell
    tokens, V - len(path) - 1 backs, len(path) moves, 5 tags and a newline),
    so its length is at most :func:`response_token_bound` ``= 2*n*n + 4``.
    The median sits around 20 tokens (3x3 and 4x4 mazes), so the max/median
    ratio is capped by the largest size: about 5.1 with max_size=7 (too tight
    to rely on) and 6.6 with max_size=8, hence the default of 8.
    """

    min_size: int = 3
    max_size: int = 8
    size_decay: float = 0.6

    def __post_init__(self) -> None:
        if not isinstance(self.min_size, int) or self.min_size < 2:
            raise ValueError(f"min_size must be an int >= 2, got {self.min_size!r}")
        if not isinstance(self.max_size, int) or self.max_size < self.min_size:
            raise ValueError(
                f"max_size must be an int >= min_size ({self.min_size}), got {self.max_size!r}"
            )
        if not self.size_decay > 0:
            raise ValueError(f"size_decay must be > 0, got {self.size_decay!r}")

    def sizes(self) -> list[int]:
        return list(range(self.min_size, self.max_size + 1))

    def size_weights(self) -> list[float]:
        """Unnormalised probabilities, aligned with :meth:`sizes`."""
        return [self.size_decay ** (s - self.min_size) for s in self.sizes()]


@dataclass(frozen=True)
class MazePrompt:
    """One dataset item; ``maze_seed`` regenerates the maze with
    ``generate_maze(size, maze_seed)``. Also a task prompt of the task protocol
    (:mod:`mindspeed_rl_asp.tasks.base`): ``question`` is the prompt itself, ``answer`` the
    solution's move tokens, ``group`` the maze size and ``reference_length`` the reference
    response's length in task tokens plus the end-of-text token."""

    id: str
    size: int
    prompt: str
    reference_response: str
    maze_seed: int = 0
    layout: str = "project"

    @property
    def question(self) -> str:
        return self.prompt

    @property
    def answer(self) -> str:
        return _solution_of(self.size, self.maze_seed)

    @property
    def metadata(self) -> dict:
        return {"size": self.size, "maze_seed": self.maze_seed, "layout": self.layout}

    @property
    def group(self) -> int:
        return self.size

    @property
    def reference_length(self) -> float:
        # +1: the response ends with the end-of-text token.
        return float(count_tokens(self.reference_response) + 1)


def _item_rng(seed: int, index: int) -> random.Random:
    # random.Random(str) hashes the string with SHA-512: stable across runs
    # and processes, unlike the salted built-in hash().
    return random.Random(f"maze-{seed}-{index}")


def make_item(seed: int, index: int, spec: MazeTaskSpec = MazeTaskSpec(), layout: str = "project") -> MazePrompt:
    """Item ``index`` of the dataset with ``seed``; depends only on its arguments. The
    maze is the same in both layouts; only its text differs."""
    _check_layout(layout)
    rng = _item_rng(seed, index)
    size = rng.choices(spec.sizes(), weights=spec.size_weights())[0]
    maze_seed = rng.getrandbits(63)
    maze = generate_maze(size, maze_seed)
    return MazePrompt(
        id=f"maze-{seed}-{index}",
        size=size,
        prompt=format_prompt(maze, layout),
        reference_response=format_response(maze, layout),
        maze_seed=maze_seed,
        layout=layout,
    )


def make_dataset(
    num_prompts: int, seed: int, spec: MazeTaskSpec = MazeTaskSpec(), layout: str = "project"
) -> list[MazePrompt]:
    """``num_prompts`` maze prompts, deterministic in (num_prompts, seed, spec);
    item i is the same whatever ``num_prompts`` is, so datasets of different
    lengths are prefixes of one another."""
    if not isinstance(num_prompts, int) or num_prompts <= 0:
        raise ValueError(f"num_prompts must be an int > 0, got {num_prompts!r}")
    if not isinstance(spec, MazeTaskSpec):
        raise ValueError(f"spec must be a MazeTaskSpec, got {type(spec).__name__}")
    return [make_item(seed, i, spec, layout) for i in range(num_prompts)]


def dataset_row(item: MazePrompt) -> dict[str, str]:
    """``item`` as a MAZE-REASONING-GRPO-V0.1 row: ``{"Prompt", "Response"}`` in the
    dataset's layout (whatever ``item.layout`` is), so that generated mazes and the
    published rows are interchangeable (``task=maze_dataset`` reads either)."""
    maze = generate_maze(item.size, item.maze_seed)
    return {"Prompt": format_prompt(maze, "alphamaze"), "Response": solution_moves(maze)}
