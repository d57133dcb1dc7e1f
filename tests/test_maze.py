"""Tests of the maze reasoning task (generator, format, parser, rewards, dataset)."""
from __future__ import annotations

import re
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.tasks.maze import (
    BACK_TOKEN,
    DIRECTIONS,
    TOKEN_PATTERN,
    Maze,
    MazeFormatError,
    MazePrompt,
    MazeRewardWeights,
    MazeTaskSpec,
    can_move,
    cell_token,
    correctness_reward,
    count_tokens,
    extract_moves,
    format_prompt,
    format_response,
    generate_maze,
    integrity_reward,
    is_perfect,
    make_dataset,
    maze_vocabulary,
    move_token,
    parse_maze,
    response_token_bound,
    score_response,
    solve_dfs,
    step,
    tokenize,
    wall_token,
)

SIZES = st.integers(min_value=2, max_value=9)
SEEDS = st.integers(min_value=0, max_value=2**63 - 1)
FAST = settings(max_examples=60, deadline=None)


def _answer(moves) -> str:
    return "".join(move_token(m) for m in moves)


def _response(maze: Maze, moves) -> str:
    trace, _ = solve_dfs(maze)
    return f"<think>{''.join(trace)}</think>\n<answer>{_answer(moves)}</answer>"


def _simple_maze() -> Maze:
    """2x2 maze, passage 0-0 -> 1-0 -> 1-1 -> 0-1 (wall between 0-0 and 0-1)."""
    T, F = True, False
    walls = (
        ((T, F, T, T), (T, F, T, T)),  # (0,0): open down; (0,1): open down
        ((F, T, T, F), (F, T, F, T)),  # (1,0): open up,right; (1,1): open up,left
    )
    return Maze(size=2, walls=walls, origin=(0, 0), target=(0, 1))


# ---------------------------------------------------------------- generator


@FAST
@given(SIZES, SEEDS)
def test_generated_maze_is_perfect_consistent_and_walled(size, seed):
    m = generate_maze(size, seed)
    assert m.size == size
    assert m.origin != m.target
    open_edges = 0
    for r in range(size):
        for c in range(size):
            for i, d in enumerate(DIRECTIONS):
                nr, nc = step((r, c), d)
                inside = 0 <= nr < size and 0 <= nc < size
                if not inside:
                    assert m.walls[r][c][i], "border must be walled"
                    continue
                opposite = {"up": 1, "down": 0, "left": 3, "right": 2}[d]
                assert m.walls[r][c][i] == m.walls[nr][nc][opposite]
                if d in ("down", "right") and not m.walls[r][c][i]:
                    open_edges += 1
    assert open_edges == size * size - 1
    assert is_perfect(m)


def test_generate_is_deterministic_and_seed_sensitive():
    assert generate_maze(6, 123) == generate_maze(6, 123)
    assert len({generate_maze(6, s) for s in range(20)}) > 15


def test_generate_rejects_tiny_sizes():
    with pytest.raises(ValueError, match="size"):
        generate_maze(1, 0)


def test_can_move():
    m = _simple_maze()
    assert can_move(m, (0, 0), "down")
    assert not can_move(m, (0, 0), "right")  # wall
    assert not can_move(m, (0, 0), "up")  # border
    assert not can_move(m, (0, 0), "diagonal")
    assert not can_move(m, (5, 5), "up")


def test_is_perfect_detects_loops_and_islands():
    m = _simple_maze()
    assert is_perfect(m)
    T, F = True, False
    loop = Maze(2, (((T, F, T, F), (T, F, F, T)), ((F, T, T, F), (F, T, F, T))), (0, 0), (1, 1))
    assert not is_perfect(loop)
    closed = Maze(2, (((T, T, T, T),) * 2,) * 2, (0, 0), (1, 1))
    assert not is_perfect(closed)


# ---------------------------------------------------------------- prompt format


def test_prompt_format_exact():
    m = _simple_maze()
    assert format_prompt(m) == (
        "<|maze_start|>\n"
        "<|0-0|><|up_left_right_wall|><|origin|><|0-1|><|up_left_right_wall|><|target|>\n"
        "<|1-0|><|down_left_wall|><|blank|><|1-1|><|down_right_wall|><|blank|>\n"
        "<|maze_end|>\n"
    )


def test_wall_token_spelling():
    assert wall_token((False, False, False, False)) == "<|no_wall|>"
    assert wall_token((True, False, True, False)) == "<|up_left_wall|>"
    assert wall_token((True, True, True, True)) == "<|up_down_left_right_wall|>"


@FAST
@given(SIZES, SEEDS)
def test_parse_is_inverse_of_format(size, seed):
    m = generate_maze(size, seed)
    p = format_prompt(m)
    assert parse_maze(p) == m
    assert format_prompt(parse_maze(p)) == p


def test_parse_tolerates_surrounding_whitespace_only():
    m = generate_maze(4, 7)
    assert parse_maze("\n  " + format_prompt(m) + "  \n") == m


def _rows(prompt: str) -> list[str]:
    return prompt.split("\n")


@pytest.fixture
def prompt4() -> str:
    # A fixed 4x4 maze, with origin/target set to known cells for the edits below.
    m = generate_maze(4, 11)
    return format_prompt(Maze(m.size, m.walls, (0, 0), (3, 3)))


def _edit(prompt: str, line: int, old: str, new: str, count: int = 1) -> str:
    lines = _rows(prompt)
    assert old in lines[line]
    lines[line] = lines[line].replace(old, new, count)
    return "\n".join(lines)


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda p: _edit(p, 3, "<|blank|>", "<|foo|>"), r"unknown token '<\|foo\|>' at row 2"),
        (lambda p: _edit(p, 3, "<|blank|>", " <|blank|>"), r"unexpected character ' ' at row 2"),
        (lambda p: p.replace("<|maze_start|>\n", ""), r"must start with .*maze_start"),
        (lambda p: p.replace("<|maze_end|>", ""), r"must end with .*maze_end"),
        (lambda p: "<|maze_start|>\n<|maze_end|>\n", r"no rows"),
        (lambda p: p.replace("<|origin|>", "<|blank|>"), r"no origin"),
        (lambda p: p.replace("<|target|>", "<|blank|>"), r"no target"),
        (lambda p: _edit(p, 2, "<|blank|>", "<|origin|>"), r"duplicate origin at row 1.*first origin at row 0, column 0"),
        (lambda p: _edit(p, 1, "<|blank|>", "<|target|>"), r"duplicate target at row 3, column 3 \(first target at row 0, column 1\)"),
        (lambda p: "\n".join(_rows(p)[:2] + _rows(p)[3:]), r"missing or misplaced cell at row 1, column 0: expected <\|1-0\|>, got <\|2-0\|>"),
        (lambda p: "\n".join(_rows(p)[:4] + _rows(p)[5:]), r"not square: 3 rows of 4 cells"),
    ],
)
def test_malformed_prompts_raise_informative_errors(prompt4, mutate, pattern):
    with pytest.raises(MazeFormatError, match=pattern):
        parse_maze(mutate(prompt4))


def test_missing_cell_in_row_is_reported(prompt4):
    lines = _rows(prompt4)
    # drop the cell triple of (1, 2)
    lines[2] = re.sub(r"<\|1-2\|><\|[^|]+\|><\|[^|]+\|>", "", lines[2])
    with pytest.raises(MazeFormatError, match=r"row 1, column 2: expected <\|1-2\|>, got <\|1-3\|>"):
        parse_maze("\n".join(lines))


def test_ragged_rows_are_reported(prompt4):
    lines = _rows(prompt4)
    lines[3] = re.sub(r"<\|2-3\|><\|[^|]+\|><\|[^|]+\|>$", "", lines[3])
    with pytest.raises(MazeFormatError, match=r"ragged rows: row 2 has 3 cells but row 0 has 4"):
        parse_maze("\n".join(lines))


def test_truncated_cell_is_reported(prompt4):
    lines = _rows(prompt4)
    lines[4] = re.sub(r"<\|[^|]+\|>$", "", lines[4])
    with pytest.raises(MazeFormatError, match=r"truncated cell at row 3, column 3"):
        parse_maze("\n".join(lines))


def test_wrong_slot_token_is_reported(prompt4):
    bad = _edit(prompt4, 1, "<|origin|>", "<|up_wall|>")
    with pytest.raises(MazeFormatError, match=r"expected a marker token at row 0, column 0, got '<\|up_wall\|>'"):
        parse_maze(bad)
    lines = _rows(prompt4)
    lines[1] = re.sub(r"^(<\|0-0\|>)<\|[^|]+\|>", r"\1<|blank|>", lines[1])
    with pytest.raises(MazeFormatError, match=r"expected a wall token at row 0, column 0"):
        parse_maze("\n".join(lines))


def _prompt_with_walls(walls, origin=(0, 0), target=(1, 1)) -> str:
    # Maze() does not check wall consistency; parse_maze must.
    return format_prompt(Maze(2, walls, origin, target))


def test_inconsistent_walls_are_reported():
    T, F = True, False
    walls = (((T, F, T, F), (T, F, T, T)), ((F, T, T, F), (F, T, F, T)))
    # (0,0) says right is open, (0,1) says left is closed.
    with pytest.raises(MazeFormatError, match=r"walls inconsistent between neighbours <\|0-0\|> and <\|0-1\|>"):
        parse_maze(_prompt_with_walls(walls))


def test_missing_border_wall_is_reported():
    T, F = True, False
    walls = (((F, F, T, T), (T, F, T, T)), ((F, T, T, F), (F, T, F, T)))
    with pytest.raises(MazeFormatError, match=r"border wall missing: .*row 0, column 0 has no up wall"):
        parse_maze(_prompt_with_walls(walls))


def test_format_error_is_value_error():
    assert issubclass(MazeFormatError, ValueError)


# ---------------------------------------------------------------- reference solution


def test_solve_dfs_trace_on_known_maze():
    m = _simple_maze()
    trace, moves = solve_dfs(m)
    assert trace == ["<|0-0|>", "<|1-0|>", "<|1-1|>", "<|0-1|>"]
    assert moves == ["down", "right", "up"]
    assert format_response(m) == (
        "<think><|0-0|><|1-0|><|1-1|><|0-1|></think>\n"
        "<answer><|down|><|right|><|up|></answer>"
    )


def test_solve_dfs_backtracks_with_back_tokens():
    # 1x3 corridor folded in a 2x2: origin (1,0); DFS order up,right,down,left
    # goes up to (0,0) first (dead end), backs, then right to target (1,1).
    T, F = True, False
    walls = (((T, F, T, T), (T, T, T, T)), ((F, T, T, F), (T, T, F, T)))
    # (0,1) is walled off entirely: not a perfect maze, but the DFS must cope.
    m = Maze(2, walls, origin=(1, 0), target=(1, 1))
    trace, moves = solve_dfs(m)
    assert trace == ["<|1-0|>", "<|0-0|>", BACK_TOKEN, "<|1-1|>"]
    assert moves == ["right"]


@FAST
@given(SIZES, SEEDS)
def test_reference_response_is_perfect_and_length_formula(size, seed):
    m = generate_maze(size, seed)
    resp = format_response(m)
    assert integrity_reward(resp) == 1.0
    assert correctness_reward(m, resp) == 1.0
    trace, moves = solve_dfs(m)
    visited = sum(1 for t in trace if t != BACK_TOKEN)
    assert len(set(t for t in trace if t != BACK_TOKEN)) == visited  # never revisits
    assert trace[0] == cell_token(m.origin) and trace[-1] == cell_token(m.target)
    assert count_tokens(resp) == 2 * visited + 4 <= response_token_bound(size)
    assert extract_moves(resp) == moves
    out = score_response(format_prompt(m), resp, MazeRewardWeights())
    assert out == {"integrity": 1.0, "correctness": 1.0, "reward": pytest.approx(1.2)}


# ---------------------------------------------------------------- rewards


@pytest.fixture
def maze_and_moves():
    m = generate_maze(6, 2000)
    _, moves = solve_dfs(m)
    assert len(moves) >= 2
    return m, moves


def _wall_move(m: Maze, cell) -> str:
    return next(d for d in DIRECTIONS if not can_move(m, cell, d))


def test_wrong_move_is_incorrect(maze_and_moves):
    m, moves = maze_and_moves
    wrong = {"up": "down", "down": "up", "left": "right", "right": "left"}
    resp = _response(m, [wrong[moves[0]]] + moves[1:])
    assert integrity_reward(resp) == 1.0
    assert correctness_reward(m, resp) == 0.0


def test_move_through_wall_is_incorrect(maze_and_moves):
    m, moves = maze_and_moves
    resp = _response(m, [_wall_move(m, m.origin)] + moves)
    assert integrity_reward(resp) == 1.0
    assert correctness_reward(m, resp) == 0.0


def test_moves_that_stop_short_are_incorrect(maze_and_moves):
    m, moves = maze_and_moves
    resp = _response(m, moves[:-1])
    assert integrity_reward(resp) == 1.0
    assert correctness_reward(m, resp) == 0.0


def test_detour_that_ends_on_target_is_correct(maze_and_moves):
    m, moves = maze_and_moves
    back = {"up": "down", "down": "up", "left": "right", "right": "left"}
    detour = moves[:1] + [back[moves[0]]] + moves
    assert correctness_reward(m, _response(m, detour)) == 1.0


@pytest.mark.parametrize(
    "make",
    [
        lambda a: f"<think>x</think>\n<answer>{a} </answer>",  # whitespace inside
        lambda a: f"<think>x</think>\n<answer>{a}ok</answer>",  # extra text inside
        lambda a: f"<think>x</think>\n<answer>\n{a}</answer>",
        lambda a: f"<think>x</think>\n<answer>{a}<|back|></answer>",
        lambda a: f"<think>x</think>\n<answer></answer>",  # empty
        lambda a: f"<think>x</think>\n{a}",  # missing answer tags
        lambda a: f"<think>x</think>\n<answer>{a}",  # missing </answer>
        lambda a: f"<think>x</think>\n{a}</answer>",  # missing <answer>
        lambda a: f"<think>x\n<answer>{a}</answer>",  # unterminated think
        lambda a: f"<answer>{a}</answer><think>x</think>",  # answer before think
        lambda a: f"<think>x</think><think>y</think><answer>{a}</answer>",
        lambda a: f"<think>x</think>\n<answer>{a}</answer><answer>{a}</answer>",  # two blocks
        lambda a: f"<think><answer>{a}</answer></think>\n<answer>{a}</answer>",  # answer in think
        lambda a: f"<think>x</think>\n<answer>{a}</answer> trailing",  # text after
        lambda a: f"<think>x</think>\n<answer>{a}</answer><|up|>",
        lambda a: f"</think><think>x<answer>{a}</answer>",
        lambda a: f"<think>x</think>\n<answer>{a.replace('|>', '|> ', 1)}</answer>",
        lambda a: f"<think>x</think>\n<answer>{a.upper()}</answer>",
    ],
)
def test_malformed_responses_get_zero(maze_and_moves, make):
    m, moves = maze_and_moves
    resp = make(_answer(moves))
    assert integrity_reward(resp) == 0.0
    assert correctness_reward(m, resp) == 0.0
    assert extract_moves(resp) is None
    assert score_response(format_prompt(m), resp)["reward"] == 0.0


@pytest.mark.parametrize(
    "make",
    [
        lambda a: f"<think>x</think>\n<answer>{a}</answer>",
        lambda a: f"<answer>{a}</answer>",  # no think section
        lambda a: f"x</think><answer>{a}</answer>",  # <think> was in the prompt
        lambda a: f"<think>x</think>\n<answer>{a}</answer>\n",
        lambda a: f"<think>x</think>\n<answer>{a}</answer><|endoftext|>",
        lambda a: f"<think>x</think>\n<answer>{a}</answer> <|im_end|>\n",
    ],
)
def test_wellformed_variants_get_full_reward(maze_and_moves, make):
    m, moves = maze_and_moves
    resp = make(_answer(moves))
    assert integrity_reward(resp) == 1.0
    assert correctness_reward(m, resp) == 1.0


def test_score_response_weights_and_bad_prompt(maze_and_moves):
    m, moves = maze_and_moves
    prompt = format_prompt(m)
    w = MazeRewardWeights(integrity=0.5, correctness=2.0)
    assert score_response(prompt, _response(m, moves), w)["reward"] == pytest.approx(2.5)
    assert score_response(prompt, _response(m, moves[:-1]), w) == {
        "integrity": 1.0,
        "correctness": 0.0,
        "reward": pytest.approx(0.5),
    }
    assert MazeRewardWeights() == MazeRewardWeights(0.2, 1.0)
    with pytest.raises(MazeFormatError):
        score_response(prompt.replace("<|target|>", "<|blank|>"), _response(m, moves))


# ---------------------------------------------------------------- vocabulary


def test_vocabulary_contents():
    v = maze_vocabulary(3)
    assert len(v) == len(set(v))
    assert v[:2] == ["<|maze_start|>", "<|maze_end|>"]
    assert v[-4:] == ["<think>", "</think>", "<answer>", "</answer>"]
    assert sum(1 for t in v if t.endswith("wall|>")) == 16
    assert "<|2-2|>" in v and "<|3-0|>" not in v
    assert len(v) == 2 + 9 + 16 + 3 + 1 + 4 + 4
    assert all(re.fullmatch(TOKEN_PATTERN, t) for t in v)
    assert maze_vocabulary(7) == maze_vocabulary(7)


def test_every_token_is_in_vocabulary():
    spec = MazeTaskSpec()
    vocab = set(maze_vocabulary(spec.max_size))
    for item in make_dataset(200, 5, spec):
        for text in (item.prompt, item.reference_response):
            assert "".join(tokenize(text)) == text
            for tok in tokenize(text):
                assert tok in vocab or len(tok) == 1, tok


# ---------------------------------------------------------------- dataset


def test_dataset_is_deterministic_and_prefix_stable():
    spec = MazeTaskSpec(3, 6, 0.7)
    a = make_dataset(40, 9, spec)
    assert a == make_dataset(40, 9, spec)
    assert make_dataset(10, 9, spec) == a[:10]
    assert make_dataset(40, 10, spec) != a
    assert [x.id for x in a[:3]] == ["maze-9-0", "maze-9-1", "maze-9-2"]
    for item in a:
        assert isinstance(item, MazePrompt)
        assert spec.min_size <= item.size <= spec.max_size
        maze = parse_maze(item.prompt)
        assert maze.size == item.size
        assert maze == generate_maze(item.size, item.maze_seed)
        assert item.reference_response == format_response(maze)


def test_dataset_size_distribution_prefers_small_mazes():
    items = make_dataset(600, 1, MazeTaskSpec(3, 6, 0.5))
    counts = {s: sum(1 for x in items if x.size == s) for s in range(3, 7)}
    assert counts[3] > counts[4] > counts[5] > counts[6] > 0


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(min_size=1), r"min_size .* got 1"),
        (dict(min_size=5, max_size=4), r"max_size .* got 4"),
        (dict(size_decay=0.0), r"size_decay .* got 0.0"),
        (dict(size_decay=-1.0), r"size_decay .* got -1.0"),
    ],
)
def test_spec_validation(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        MazeTaskSpec(**kwargs)


@pytest.mark.parametrize("n", [0, -3])
def test_make_dataset_rejects_bad_num_prompts(n):
    with pytest.raises(ValueError, match=rf"num_prompts .* got {n}"):
        make_dataset(n, 0)


def test_length_distribution_has_long_tail():
    items = make_dataset(500, 0, MazeTaskSpec())
    lengths = [count_tokens(x.reference_response) for x in items]
    assert max(lengths) / statistics.median(lengths) >= 5
    # Length is driven by maze size: mean grows with size.
    means = [
        statistics.mean(count_tokens(x.reference_response) for x in items if x.size == s)
        for s in sorted({x.size for x in items})
    ]
    assert means == sorted(means)
