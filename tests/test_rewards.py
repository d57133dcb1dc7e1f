"""The reward registry: each reward's definition on hand-made responses, the MindSpeed-RL
names, the original AlphaMaze rewards, MazeBench's rule, user functions, the rates."""
import os
import re
from pathlib import Path

import pytest

from mindspeed_rl_asp.tasks.base import TaskError, TaskPrompt
from mindspeed_rl_asp.tasks.maze import (ALPHAMAZE_INSTRUCTION, format_prompt, generate_maze, make_item,
                                         solution_moves)
from mindspeed_rl_asp.tasks.rewards import REGISTRY, make_reward_set, resolve, unknown_reward

MINDSPEED_RL_NAMES = {"acc", "base_acc", "format", "strict_format", "step", "math_17k_acc", "acc_for_ppo",
                      "math_verify_reward", "acc_for_dapo", "retool_reward"}


def math(answer="7"):
    return TaskPrompt("q", "What is 3 + 4?", "What is 3 + 4?", answer)


def score(name, response, prompt=None):
    return REGISTRY[name](response, prompt if prompt is not None else math())


def test_registry_names_and_kinds():
    assert MINDSPEED_RL_NAMES <= set(REGISTRY)
    assert {"exact_match", "math_verify", "nonempty_answer", "maze_integrity", "maze_correctness",
            "alphamaze_integrity", "alphamaze_correctness", "alphamaze_xmlcount", "mazebench_correctness"} <= set(REGISTRY)
    assert all(fn.kind in ("accuracy", "format", "shaping") and fn.definition for fn in REGISTRY.values())
    assert {n for n, fn in REGISTRY.items() if fn.origin == "MindSpeed-RL"} == MINDSPEED_RL_NAMES


GOOD = "<think>3 plus 4</think>\n<answer>The answer is \\boxed{7}</answer>"


@pytest.mark.parametrize("name, response, value", [
    ("acc", GOOD, 1.0), ("acc", "so \\boxed{8}", -0.5), ("acc", "7", -1.0),
    ("base_acc", GOOD, 1.0), ("base_acc", "The answer is \\boxed{7}", 0.0),
    ("base_acc", GOOD.replace("{7}", "{8}"), 0.0),
    ("math_17k_acc", "\\boxed{7}", 1.0), ("math_17k_acc", "\\boxed{\\frac{14}{2}}", 1.0),
    ("math_17k_acc", "7", 0.0), ("acc_for_ppo", "\\boxed{ 7 }", 1.0),
    ("math_verify_reward", GOOD, 1.0), ("math_verify_reward", "\\boxed{7}", 0.0),
    ("format", GOOD, 1.0), ("format", GOOD + " trailing", 0.0), ("format", "<answer>7</answer>", 0.0),
    ("strict_format", GOOD, 1.0), ("strict_format", GOOD.replace("\\boxed{7}", "7"), -0.5),
    ("strict_format", "<think></think><think></think><answer>\\boxed{7}</answer>", -0.5),
    ("step", "Step 1: a\nStep 2: b", pytest.approx(2 / 3)), ("step", "First, Second, Next, Finally,", 1.0),
    ("exact_match", "7", 1.0), ("exact_match", "<think>hmm</think> 7 ", 1.0),
    ("exact_match", "<think>7</think>8", 0.0), ("exact_match", "<answer> 7 </answer>", 1.0),
    ("math_verify", "The answer is $\\frac{14}{2}$", 1.0), ("math_verify", "<think>x</think>\\boxed{7.0}", 1.0),
    ("math_verify", "<think>the answer is 7</think>", 0.0), ("math_verify", "8", 0.0),
    ("nonempty_answer", "<think>x</think>  ", 0.0), ("nonempty_answer", "<think>x</think> 7<|im_end|>", 1.0),
])
def test_math_and_format_rewards(name, response, value):
    assert score(name, response) == value


@pytest.mark.parametrize("response, answer, value", [
    ("so 3 + 4 = 7.\nAnswer: 7", "7", 1.0), ("Answer: 8", "7", -1.0), ("7", "7", -1.0),   # no "Answer:" line
    ("Answer: 6\nno, Answer: $7$", "7", 1.0),                        # the last one counts
    ("Answer: 1,000 dollars", "1000", 1.0), ("Answer: x = \\frac12", "\\frac{1}{2}", 1.0),
    ("Answer: \\boxed{42}", "42", 1.0), ("Answer: 10^\\circ", "10", 1.0), ("Answer: 0.5", "\\frac{1}{2}", -1.0),
    ("Answer: 7" + " padding" * 60, "7", -1.0),                       # outside the last 300 characters
])
def test_acc_for_dapo_is_minerva_string_equality(response, answer, value):
    assert score("acc_for_dapo", response, math(answer)) == value


@pytest.mark.parametrize("response, answer, value", [
    ("work... \\boxed{7}", "7", 1.0), ("\\boxed{ 7 }", "7", -1.0),   # strict: the box holds exactly the answer
    ("\\boxed{8}", "7", -1.0), ("7", "7", -1.0), ("\\boxed{7}" + "." * 120, "7", -1.0),   # not in the last 100
])
def test_retool_reward_is_the_strict_box_rule(response, answer, value):
    assert score("retool_reward", response, math(answer)) == value


CHECKOUT = os.environ.get("MINDSPEED_RL_CHECKOUT")


@pytest.mark.skipif(not CHECKOUT, reason="MINDSPEED_RL_CHECKOUT is unset: no MindSpeed-RL checkout to read")
def test_every_name_of_mindspeed_rls_registry_is_here():
    """The names of MindSpeed-RL's rule_verifier_function table (read from its source, not imported)."""
    source = (Path(CHECKOUT) / "mindspeed_rl" / "models" / "rule_verifier.py").read_text()
    table = source[source.index("rule_verifier_function = {"):]
    names = set(re.findall(r'"(\w+)":\s*\w+', table[:table.index("}")]))
    assert len(names) >= 10 and names <= MINDSPEED_RL_NAMES <= set(REGISTRY)


def test_math_verify_compares_as_math():
    half = math("\\frac{1}{2}")
    assert score("math_verify", "0.5", half) == 1.0 and score("math_17k_acc", "\\boxed{0.5}", half) == 1.0
    assert score("math_verify", "\\boxed{1/3}", half) == 0.0


def test_end_of_text_tokens_do_not_break_the_format_rules():
    assert score("format", GOOD + "<|im_end|>") == 1.0 and score("strict_format", GOOD + "<|endoftext|>") == 1.0


def test_an_answer_reward_without_an_answer_names_the_key():
    with pytest.raises(TaskError, match="task.answer_key"):
        score("exact_match", "7", TaskPrompt("q", "p", "p", None))


# ------------------------------------------------------------------ mazes, dataset convention

@pytest.fixture(scope="module")
def row():
    """A maze in the published layout (MazeBench's example maze) and its Response."""
    rows = [
        "<|0-0|><|up_left_right_wall|><|blank|><|0-1|><|up_left_wall|><|blank|><|0-2|><|up_down_wall|><|blank|>"
        "<|0-3|><|up_down_wall|><|blank|><|0-4|><|up_right_wall|><|blank|>",
        "<|1-0|><|down_left_wall|><|blank|><|1-1|><|down_right_wall|><|blank|><|1-2|><|up_left_wall|><|blank|>"
        "<|1-3|><|up_down_wall|><|blank|><|1-4|><|down_right_wall|><|target|>",
        "<|2-0|><|up_left_wall|><|origin|><|2-1|><|up_right_wall|><|blank|><|2-2|><|left_right_wall|><|blank|>"
        "<|2-3|><|up_left_wall|><|blank|><|2-4|><|up_right_wall|><|blank|>",
        "<|3-0|><|left_right_wall|><|blank|><|3-1|><|down_left_wall|><|blank|><|3-2|><|down_right_wall|><|blank|>"
        "<|3-3|><|down_left_right_wall|><|blank|><|3-4|><|left_right_wall|><|blank|>",
        "<|4-0|><|down_left_wall|><|blank|><|4-1|><|up_down_wall|><|blank|><|4-2|><|up_down_wall|><|blank|>"
        "<|4-3|><|up_down_wall|><|blank|><|4-4|><|down_right_wall|><|blank|>",
    ]
    prompt = ALPHAMAZE_INSTRUCTION + "\nMAZE:\n" + "\n".join(rows)
    answer = "<|right|><|down|><|right|><|up|><|up|><|right|><|right|>"
    return TaskPrompt("r0", prompt, prompt, answer)


def think(answer, body="reasoning"):
    return f"<think>\n{body}\n</think>\n{answer}"


def test_original_alphamaze_rewards(row):
    right = think(row.answer)
    assert score("alphamaze_correctness", right, row) == pytest.approx(0.2 * 7)
    assert score("alphamaze_integrity", right, row) == 1.0
    assert score("alphamaze_xmlcount", right, row) == 0.25
    # Whitespace between moves: still intact (removed before the check), no longer an exact match.
    spaced = think(row.answer.replace("><", "> <"))
    assert score("alphamaze_integrity", spaced, row) == 1.0 and score("alphamaze_correctness", spaced, row) == 0.0
    assert score("alphamaze_integrity", think(row.answer + " done"), row) == 0.0
    assert score("alphamaze_integrity", row.answer, row) == 0.0  # no </think>: no answer
    assert score("alphamaze_integrity", think(""), row) == 0.0
    # The answer is read up to a second </think>, as the original code splits.
    assert score("alphamaze_correctness", think(row.answer) + "</think>junk", row) == pytest.approx(1.4)
    assert score("alphamaze_xmlcount", "<think>x</think>" + row.answer, row) == 0.0
    assert score("alphamaze_xmlcount", "<think>\nx</think>" + row.answer, row) == 0.125


def test_mazebench_counts_any_legal_route(row):
    detour = row.answer.replace("<|right|><|right|>", "<|right|><|left|><|right|><|right|>")
    assert score("mazebench_correctness", think(detour), row) == 1.0
    assert score("alphamaze_correctness", think(detour), row) == 0.0  # the original wants the Response itself
    assert score("mazebench_correctness", think(row.answer[:-len("<|right|>")]), row) == 0.0  # stops short
    assert score("mazebench_correctness", think("<|up|>" + row.answer), row) == 0.0  # into a wall
    # Other tokens and text between the moves are no moves, as MazeBench reads them.
    assert score("mazebench_correctness", think(row.answer.replace("><", "> <|blank|> and <", 1)), row) == 1.0


def test_project_maze_rewards_read_the_project_layout():
    item = make_item(0, 5)
    assert score("maze_integrity", item.reference_response, item) == 1.0
    assert score("maze_correctness", item.reference_response, item) == 1.0
    assert score("maze_correctness", item.reference_response.replace("<answer>", "<answer><|up|>"), item) == 0.0


def test_alphamaze_layout_item_scores_with_the_dataset_rewards():
    item = make_item(0, 5, layout="alphamaze")
    maze = generate_maze(item.size, item.maze_seed)
    assert item.prompt == format_prompt(maze, "alphamaze") and item.answer == solution_moves(maze)
    for name, value in (("alphamaze_integrity", 1.0), ("alphamaze_xmlcount", 0.25), ("mazebench_correctness", 1.0),
                        ("alphamaze_correctness", pytest.approx(0.2 * len(solution_moves(maze).split("|><|"))))):
        assert score(name, item.reference_response, item) == value


# ------------------------------------------------------------------ sets, rates, names

def test_weighted_sum_and_the_two_rates():
    rewards = make_reward_set(["format", "acc"], [0.5, 1.0])
    assert (rewards.correctness.name, rewards.integrity.name) == ("acc", "format")
    result = rewards.score(math(), "so \\boxed{8}")
    assert result == {"reward": -0.5, "correctness": 0.0, "integrity": 0.0,
                      "components": {"format": 0.0, "acc": -0.5}}
    assert rewards.score(math(), GOOD)["reward"] == 1.5


def test_rates_fall_back_and_can_be_named():
    only = make_reward_set(["exact_match"], [])
    assert only.integrity.name == "nonempty_answer" and only.terms[0][1] == 1.0
    # A component the rates read need not be in the reward: it is computed, weight 0.
    named = make_reward_set(["alphamaze_correctness"], [1.0], correctness="mazebench_correctness")
    assert named.correctness.name == "mazebench_correctness" and named.names == ["alphamaze_correctness"]
    with pytest.raises(TaskError, match="task.correctness_reward must name"):
        make_reward_set(["format"], [1.0])


@pytest.mark.parametrize("names, weights, message", [
    (["format", "acc"], [1.0], "2 rewards of task.verifier_function"),
    (["acc", "acc"], [], "lists a reward twice"),
    ([], [], "task.verifier_function is empty"),
    (["acccc"], [], "did you mean 'acc'"),
])
def test_bad_reward_sets_name_the_key(names, weights, message):
    with pytest.raises(TaskError, match=message):
        make_reward_set(names, weights)


def test_unknown_names_and_import_paths():
    assert "task.verifier_function[0]='math_verfy' is not a registered reward; did you mean 'math_verify'" in \
        unknown_reward("math_verfy", "task.verifier_function[0]")
    assert unknown_reward("my.module:fn", "k") is None and unknown_reward("exact_match", "k") is None
    with pytest.raises(TaskError, match="cannot import module 'no_such_module_xyz'"):
        resolve("no_such_module_xyz:fn", "task.verifier_function[0]")
    with pytest.raises(TaskError, match="has no function 'nope'"):
        resolve("math:nope", "task.verifier_function[0]")


def test_a_user_function_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def brevity(response, prompt):\n    return 1.0 / (1 + len(response))\n\n"
        "def has_seven(response, prompt):\n    return float('7' in response)\nhas_seven.kind = 'format'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rewards = make_reward_set(["exact_match", "my_rewards:brevity", "my_rewards.has_seven"], [1.0, 2.0, 0.0])
    assert rewards.integrity.name == "my_rewards.has_seven" and rewards.correctness.name == "exact_match"
    assert rewards.import_roots() == [str(tmp_path.resolve())]
    result = rewards.score(math(), "7")
    assert result["reward"] == pytest.approx(1.0 + 2.0 / 2) and result["integrity"] == 1.0
