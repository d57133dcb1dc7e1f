"""SchedulePlan: planners, invariants, padding guarantees, JSON schema, input errors."""
import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.schedule import plan as plan_mod
from mindspeed_rl_asp.schedule.ordering import decode_step_load
from mindspeed_rl_asp.schedule.partition import is_representable, size_bounds
from mindspeed_rl_asp.schedule.plan import (
    PLANNERS,
    Minibatch,
    ScheduleError,
    SchedulePlan,
    SchedulerParams,
    group_load_stats,
    make_plan,
    padding_stats,
    plan_from_jsonl,
    read_items_jsonl,
)

SCHEDULE_DIR = Path(plan_mod.__file__).parent


def items_of(lengths):
    return [(f"p{i}", float(v)) for i, v in enumerate(lengths)]


@st.composite
def workloads(draw, max_n=60):
    base = draw(st.integers(1, 8))
    slack = draw(st.integers(0, base - 1))
    n = draw(st.integers(1, max_n))
    lengths = draw(st.lists(st.floats(0, 5000) | st.sampled_from([0.0, 1.0, 64.0, 4096.0]), min_size=n, max_size=n))
    return lengths, base, slack


@settings(max_examples=120, deadline=None)
@given(workloads(), st.sampled_from(sorted(PLANNERS)), st.integers(1, 4))
def test_every_prompt_is_scheduled_exactly_once(work, name, n_samples):
    lengths, base, slack = work
    p = make_plan(items_of(lengths), SchedulerParams(name, base, slack, 1), n_samples)
    assert sorted(p.prompt_ids()) == sorted(f"p{i}" for i in range(len(lengths)))
    assert p.planner == name and p.n_samples_per_prompt == n_samples
    for mb in p.minibatches():
        member = [lengths[int(i[1:])] for i in mb.ids]
        assert mb.max_length == max(member)
        assert mb.total_length == pytest.approx(math.fsum(member))
        assert mb.load == mb.size * n_samples * mb.max_length


@settings(max_examples=120, deadline=None)
@given(workloads())
def test_minibatch_sizes_follow_the_rules(work):
    lengths, base, slack = work
    n = len(lengths)
    lo, hi = size_bounds(base, slack)
    asp = [mb.size for mb in make_plan(items_of(lengths), SchedulerParams("asp", base, slack, 1)).minibatches()]
    assert all(s <= hi for s in asp)
    if is_representable(n, lo, hi):
        assert all(s >= lo for s in asp)
    else:  # the documented remainder: exactly one minibatch below lo
        assert sum(s < lo for s in asp) == 1
    for name in ("fifo", "sorted"):
        fixed = [mb.size for mb in make_plan(items_of(lengths), SchedulerParams(name, base, slack, 1)).minibatches()]
        assert fixed[:-1] == [base] * (len(fixed) - 1) and 1 <= fixed[-1] <= base


def padded(p):
    return padding_stats(p)["padded"]


@settings(max_examples=150, deadline=None)
@given(workloads(max_n=80), st.integers(1, 3))
def test_asp_never_pads_more_than_sorted_when_fixed_size_is_feasible(work, g):
    """asp <= sorted whenever sorted's own partition obeys asp's size rules.

    That is: N % base == 0, or the remainder N % base >= lo, or N is not a sum of
    sizes in [lo, hi] (then one remainder < lo is allowed, the fixed-size one
    included). asp's count is >= ceil(N / base) (or it is the unconstrained
    optimum), so by Lagrangian optimality its padded work is minimal among
    partitions with at most its count, which includes sorted's partition.
    """
    lengths, base, slack = work
    n = len(lengths)
    lo, hi = size_bounds(base, slack)
    if n % base and n % base < lo and is_representable(n, lo, hi):
        return  # sorted's short remainder is not a partition asp may use
    plans = {}
    for name in ("asp", "sorted", "fifo"):
        try:
            plans[name] = make_plan(items_of(lengths), SchedulerParams(name, base, slack, g), 2)
        except ScheduleError as exc:  # group_size larger than the minibatch count
            assert "no full dispatch group" in str(exc)
            return
    assert padded(plans["asp"]) <= padded(plans["sorted"]) * (1 + 1e-9) + 1e-9
    if n % base == 0:  # equal sizes: sorted contiguous blocks minimise padding (exchange argument)
        assert padded(plans["sorted"]) <= padded(plans["fifo"]) * (1 + 1e-9) + 1e-9


@settings(max_examples=80, deadline=None)
@given(workloads(max_n=80), st.integers(1, 5), st.sampled_from(sorted(PLANNERS)))
def test_groups_have_group_size_minibatches_except_the_last(work, g, name):
    lengths, base, slack = work
    try:
        p = make_plan(items_of(lengths), SchedulerParams(name, base, slack, g))
    except ScheduleError as exc:
        assert "no full dispatch group" in str(exc)
        return
    sizes = [len(grp) for grp in p.groups]
    assert all(s == g for s in sizes[:-1]) and 1 <= sizes[-1] <= g
    assert p.group_loads == pytest.approx([sum(mb.load for mb in grp) for grp in p.groups])


def lognormal_items(n=2048, seed=0):
    return items_of(np.random.default_rng(seed).lognormal(6, 1, n))


def test_asp_beats_fifo_and_sorted_on_padding_and_balance():
    params = dict(base_batch_size=8, slack=2, group_size=4)
    res = {name: make_plan(lognormal_items(), SchedulerParams(name, **params), 8) for name in PLANNERS}
    bubble = {k: padding_stats(p)["bubble_fraction"] for k, p in res.items()}
    spread = {k: group_load_stats(p) for k, p in res.items()}
    assert bubble["asp"] < bubble["sorted"] < bubble["fifo"]
    for other in ("fifo", "sorted"):
        assert spread["asp"]["cv"] < spread[other]["cv"]
        assert spread["asp"]["max_over_min"] < spread[other]["max_over_min"]
    assert res["asp"].num_minibatches == res["sorted"].num_minibatches == 256  # same count, sizes float


def test_fifo_keeps_data_order_and_sorted_goes_short_first():
    items = [("a", 5.0), ("b", 1.0), ("c", 3.0), ("d", 2.0), ("e", 4.0)]
    fifo = make_plan(items, SchedulerParams("fifo", 2, 0, 1))
    assert [mb.ids for mb in fifo.minibatches()] == [("a", "b"), ("c", "d"), ("e",)]
    srt = make_plan(items, SchedulerParams("sorted", 2, 0, 1))
    assert [mb.ids for mb in srt.minibatches()] == [("b", "d"), ("c", "e"), ("a",)]


def test_custom_load_model_drives_loads():
    p = make_plan(lognormal_items(256), SchedulerParams("asp", 8, 2, 2), 4, decode_step_load(16.0))
    for mb in p.minibatches():
        assert mb.load == pytest.approx(mb.max_length * (16.0 + mb.size * 4))


def test_group_load_stats_leave_the_partial_group_out():
    items = items_of([10.0] * 9)
    p = make_plan(items, SchedulerParams("fifo", 3, 0, 2), 1)  # 3 minibatches -> groups [2, 1]
    stats = group_load_stats(p)
    assert stats["groups"] == 1 and stats["max_over_min"] == 1.0 and stats["cv"] == 0.0
    assert stats["partial_load_ratio"] == pytest.approx(0.5)
    full = group_load_stats(make_plan(items_of([10.0] * 8), SchedulerParams("fifo", 2, 0, 2)))
    assert math.isnan(full["partial_load_ratio"])


def test_padding_stats_on_predicted_and_observed_lengths():
    p = make_plan([("a", 1.0), ("b", 3.0)], SchedulerParams("fifo", 2, 0, 1))
    assert padding_stats(p) == {"padded": 6.0, "useful": 4.0, "bubble_fraction": pytest.approx(1 / 3)}
    assert padding_stats(p, {"a": 2.0, "b": 2.0})["bubble_fraction"] == 0.0


# --------------------------------------------------------------------------- JSON
def test_json_round_trip_and_schema(tmp_path):
    p = make_plan(lognormal_items(300), SchedulerParams("asp", 8, 2, 4), 8)
    assert SchedulePlan.from_json(p.to_json()) == p
    d = json.loads(p.to_json())
    assert set(d) == {"format", "version", "planner", "params", "n_samples_per_prompt", "group_loads", "groups"}
    assert d["params"] == {"name": "asp", "base_batch_size": 8, "slack": 2, "group_size": 4}
    mb = d["groups"][0][0]
    assert set(mb) == {"ids", "max_length", "total_length", "load"} and isinstance(mb["ids"], list)
    path = tmp_path / "plan.json"
    p.save(path)
    assert SchedulePlan.load(path) == p and not (tmp_path / "plan.json.tmp").exists()


def test_json_example_in_docs_parses():
    doc = (Path(__file__).parents[1] / "docs" / "scheduler.md").read_text(encoding="utf-8")
    block = doc.split("```json\n", 1)[1].split("```", 1)[0]
    p = SchedulePlan.from_json(block)
    assert p.planner == "asp" and p.prompt_ids()


def _plan_dict():
    return json.loads(make_plan(items_of([1.0, 2.0, 3.0, 4.0]), SchedulerParams("asp", 2, 0, 1)).to_json())


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d.update(format="other"), "not a schedule plan"),
        (lambda d: d.update(version=99), "version"),
        (lambda d: d.pop("groups"), "malformed"),
        (lambda d: d["groups"][0][0].pop("load"), "malformed"),
        (lambda d: d["groups"][0][0].update(ids="p0"), "ids must be a JSON list"),
        (lambda d: d["groups"][1][0].update(ids=d["groups"][0][0]["ids"]), "more than once"),
        (lambda d: d.update(group_loads=[1.0]), "group_loads"),
        (lambda d: d["params"].update(slack=5), "slack larger than base"),
        (lambda d: d.update(n_samples_per_prompt=0), "n_samples_per_prompt=0"),
    ],
)
def test_from_json_rejects_malformed_plans(mutate, match):
    d = _plan_dict()
    mutate(d)
    with pytest.raises(ScheduleError, match=match):
        SchedulePlan.from_json(json.dumps(d))


def test_from_json_rejects_non_json():
    with pytest.raises(ScheduleError, match="not valid JSON"):
        SchedulePlan.from_json("{")
    with pytest.raises(ScheduleError, match="object"):
        SchedulePlan.from_json("[]")


def test_plan_from_jsonl(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text('{"id": "x", "predicted_length": 3}\n\n{"id": "y", "predicted_length": 1.5}\n')
    p = plan_from_jsonl(path, SchedulerParams("sorted", 2, 0, 1), 4)
    assert [mb.ids for mb in p.minibatches()] == [("y", "x")] and p.n_samples_per_prompt == 4
    path.write_text('{"id": "x", "predicted_length": 3}\n{"id": "y"}\n')
    with pytest.raises(ScheduleError, match=r"items.jsonl:2"):
        read_items_jsonl(path)


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "items, match",
    [
        ([], "empty input"),
        ([("a", 1.0), ("b", -2.0)], r"-2.0 of prompt 'b'"),
        ([("a", float("nan"))], r"nan of prompt 'a'"),
        ([("a", 1.0), ("z", float("inf"))], r"inf of prompt 'z'"),
        ([("a", 1.0), ("b", 2.0), ("a", 3.0)], "duplicate prompt id 'a'"),
        ([("a", "12")], r"'12' of prompt 'a' is not a number"),
        ([("a", True)], "not a number"),
        ([(7, 1.0)], "prompt id 7"),
        ([("a", 1.0, 2.0)], "expected an \\(id, predicted_length\\) pair"),
    ],
)
def test_bad_items_are_refused_with_the_bad_value_named(items, match):
    with pytest.raises(ScheduleError, match=match):
        make_plan(items, SchedulerParams("asp", 2, 0, 1))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(base_batch_size=0), "base_batch_size=0"),
        (dict(base_batch_size=-1, slack=0), "base_batch_size=-1"),
        (dict(slack=-1), "slack=-1"),
        (dict(base_batch_size=4, slack=4), "slack larger than base"),
        (dict(group_size=0), "group_size=0"),
        (dict(group_size=2.5), "group_size=2.5 must be an int"),
    ],
)
def test_bad_params_are_refused(kwargs, match):
    with pytest.raises(ScheduleError, match=match):
        SchedulerParams(**kwargs)


def test_unknown_planner_lists_the_valid_ones():
    with pytest.raises(ScheduleError, match="unknown planner 'lpt'; valid: asp, fifo, sorted"):
        make_plan(items_of([1.0]), SchedulerParams("lpt", 1, 0, 1))


def test_group_size_beyond_the_minibatch_count_is_refused():
    with pytest.raises(ScheduleError, match="group_size=4 exceeds the 2 minibatch"):
        make_plan(items_of(range(16)), SchedulerParams("fifo", 8, 0, 4))


def test_n_samples_must_be_positive():
    with pytest.raises(ScheduleError, match="n_samples_per_prompt=0"):
        make_plan(items_of([1.0]), SchedulerParams("asp", 1, 0, 1), 0)


def test_params_from_a_hydra_like_mapping_ignore_other_keys():
    cfg = {"name": "sorted", "predictor": "history", "base_batch_size": 4, "slack": 0, "group_size": 2}
    assert SchedulerParams.from_mapping(cfg) == SchedulerParams("sorted", 4, 0, 2)


def test_minibatch_to_dict_lists_ids():
    assert Minibatch(("a",), 1.0, 1.0, 2.0).to_dict()["ids"] == ["a"]


# The LM predictor is the one module that needs torch; it imports it inside its methods
# (tests/test_lm_predictor.py checks in a subprocess that importing it stays light).
ACCELERATOR_STACK_ALLOWED_IN_FUNCTIONS = {"lm_predictor.py"}


def _imported(nodes) -> set[str]:
    names = {a.name.split(".")[0] for n in nodes if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module.split(".")[0] for n in nodes if isinstance(n, ast.ImportFrom) and n.module}


def test_scheduler_modules_import_neither_torch_nor_ray():
    for path in SCHEDULE_DIR.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        heavy = {"torch", "ray", "scipy", "transformers"}
        assert not _imported(tree.body) & heavy, path.name  # module level: never
        if path.name not in ACCELERATOR_STACK_ALLOWED_IN_FUNCTIONS:
            assert not _imported(ast.walk(tree)) & heavy, path.name  # pure modules: nowhere
