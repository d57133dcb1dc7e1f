"""The generator's second output format, MAZE-REASONING-GRPO-V0.1's own, and the parser on
the real layout."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.tasks.maze import (ALPHAMAZE_INSTRUCTION, Maze, MazeFormatError, dataset_row, format_prompt,
                                         format_response, generate_maze, make_dataset, make_item, parse_maze,
                                         solution_moves)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 8), st.integers(0, 2**31))
def test_both_layouts_parse_back_to_the_same_maze(size, seed):
    maze = generate_maze(size, seed)
    text = format_prompt(maze, "alphamaze")
    assert parse_maze(text) == parse_maze(format_prompt(maze)) == maze
    assert format_prompt(parse_maze(text), "alphamaze") == text


def test_alphamaze_layout_is_the_datasets():
    maze = generate_maze(5, 3)
    text = format_prompt(maze, "alphamaze")
    lines = text.split("\n")
    # The instruction, a line MAZE:, one line per row, no final newline, no start/end tags.
    assert text.startswith(ALPHAMAZE_INSTRUCTION + "\nMAZE:\n") and not text.endswith("\n")
    assert lines[-6] == "MAZE:" and all(line.startswith(f"<|{r}-0|>") for r, line in enumerate(lines[-5:]))
    assert "<|maze_start|>" not in text and text.startswith("You are a helpful assistant that solves mazes.  You")
    assert dataset_row(make_item(0, 1)) == dataset_row(make_item(0, 1, layout="alphamaze"))
    row = dataset_row(make_item(0, 1, layout="alphamaze"))
    assert set(row) == {"Prompt", "Response"} and row["Response"] == make_item(0, 1).answer
    assert "<answer>" not in format_response(maze, "alphamaze")
    assert format_response(maze, "alphamaze").endswith("\n</think>\n" + solution_moves(maze))


def test_the_parser_reads_the_real_layout_leniently_where_the_data_is():
    maze = generate_maze(4, 9)
    rows = format_prompt(maze, "alphamaze").split("MAZE:\n")[1].split("\n")
    # Whitespace around rows and a trailing newline, as file round trips leave them.
    assert parse_maze("Any instruction.\nMAZE:\n" + "\n".join(f"  {r} " for r in rows) + "\n\n") == maze
    T, F = True, False
    walled = Maze(2, (((T, T, T, T), (T, F, T, T)), ((T, T, T, F), (F, T, F, T))), (0, 1), (1, 1))
    text = format_prompt(walled, "alphamaze")
    assert "<|all_wall|>" in text and parse_maze(text) == walled


@pytest.mark.parametrize("mutate, pattern", [
    (lambda t: t.replace("MAZE:\n", ""), r"must start with .*maze_start.* or hold a line MAZE:"),
    (lambda t: t.split("MAZE:")[0] + "MAZE:\n", "no rows"),
    (lambda t: t.replace("<|origin|>", "<|blank|>"), "no origin"),
    (lambda t: t.replace("<|1-0|>", "<|1-9|>", 1), r"missing or misplaced cell at row 1, column 0"),
])
def test_real_layout_errors_name_the_place(mutate, pattern):
    with pytest.raises(MazeFormatError, match=pattern):
        parse_maze(mutate(format_prompt(generate_maze(3, 4), "alphamaze")))


def test_layouts_share_mazes_and_refuse_unknown_names():
    project, alpha = make_dataset(5, 2), make_dataset(5, 2, layout="alphamaze")
    assert [(p.size, p.maze_seed, p.id) for p in project] == [(p.size, p.maze_seed, p.id) for p in alpha]
    assert all(parse_maze(a.prompt) == parse_maze(p.prompt) for p, a in zip(project, alpha))
    with pytest.raises(ValueError, match="unknown maze layout 'latex'"):
        make_item(0, 0, layout="latex")
