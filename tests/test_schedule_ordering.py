"""Balanced group ordering: permutation, group shapes, balance, interleaving, load models."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.schedule.ordering import (
    balanced_groups,
    decode_step_load,
    group_shapes,
    interleave_long_short,
    load_spread,
    lpt_groups,
    padded_decode_load,
    refine_pairs,
    sequential_groups,
)

loads_st = st.lists(st.floats(0.0, 1e6), min_size=1, max_size=80).map(np.array)


@settings(max_examples=150, deadline=None)
@given(loads_st, st.integers(1, 9))
def test_balanced_groups_is_a_permutation_with_documented_shapes(loads, g):
    groups = balanced_groups(loads, g)
    flat = [i for grp in groups for i in grp]
    assert sorted(flat) == list(range(len(loads)))
    assert [len(grp) for grp in groups] == group_shapes(len(loads), g)
    assert all(len(grp) == g for grp in groups[:-1]) and 1 <= len(groups[-1]) <= g


@settings(max_examples=100, deadline=None)
@given(loads_st, st.integers(1, 6))
def test_refinement_never_worsens_the_sum_of_squares(loads, g):
    full = len(loads) // g
    groups = lpt_groups(loads, group_shapes(len(loads), g))
    before = sum(loads[grp].sum() ** 2 for grp in groups[:full])
    sizes = [len(grp) for grp in groups]
    refine_pairs(groups, loads, full)
    after = sum(loads[grp].sum() ** 2 for grp in groups[:full])
    assert after <= before * (1 + 1e-12) + 1e-9
    assert [len(grp) for grp in groups] == sizes
    assert sorted(i for grp in groups for i in grp) == list(range(len(loads)))


def test_group_shapes_put_the_short_group_last():
    assert group_shapes(10, 4) == [4, 4, 2]
    assert group_shapes(8, 4) == [4, 4]
    assert group_shapes(3, 4) == [3]
    with pytest.raises(ValueError, match="group_size=0"):
        group_shapes(3, 0)


def test_balanced_groups_equalise_sorted_loads():
    loads = np.arange(1.0, 33.0)  # sorted minibatch loads, like a length-sorted plan
    groups = balanced_groups(loads, 4)
    totals = [loads[g].sum() for g in groups]
    assert max(totals) == min(totals) == loads.sum() / 8
    seq = [loads[g].sum() for g in sequential_groups(32, 4)]
    assert max(seq) / min(seq) > 10


def test_full_groups_come_heaviest_first_and_partial_last():
    loads = np.array([9.0, 1, 1, 1, 8, 2, 2, 100])
    groups = balanced_groups(loads, 3)
    totals = [loads[g].sum() for g in groups]
    assert [len(g) for g in groups] == [3, 3, 2]
    assert totals[0] >= totals[1]


def test_lpt_fills_capacities():
    groups = lpt_groups(np.array([5.0, 4, 3, 3, 3]), [2, 2, 1])
    assert [len(g) for g in groups] == [2, 2, 1]
    assert sorted(sum(groups, [])) == [0, 1, 2, 3, 4]


def test_interleave_alternates_long_and_short():
    loads = np.array([5.0, 1.0, 4.0, 2.0, 3.0])
    assert interleave_long_short([0, 1, 2, 3, 4], loads) == [0, 1, 2, 3, 4]
    assert interleave_long_short([4, 3, 2, 1, 0], loads) == [0, 1, 2, 3, 4]
    assert interleave_long_short([7], np.arange(8.0)) == [7]


def test_sequential_groups_keep_order():
    assert sequential_groups(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]


def test_load_spread_reports_balance():
    stats = load_spread(np.array([2.0, 4.0, 4.0, 2.0]))
    assert stats["max_over_min"] == 2.0
    assert stats["cv"] == pytest.approx(1 / 3)
    assert stats["max_adjacent_ratio"] == 2.0
    assert load_spread(np.array([0.0, 0.0]))["cv"] == 0.0
    with pytest.raises(ValueError):
        load_spread(np.array([]))


def test_load_models():
    sizes, maxes = np.array([2, 4]), np.array([10.0, 5.0])
    assert padded_decode_load(sizes, maxes, 8).tolist() == [160.0, 160.0]
    assert decode_step_load(0.0)(sizes, maxes, 8).tolist() == [160.0, 160.0]
    assert decode_step_load(16.0)(sizes, maxes, 8).tolist() == [320.0, 240.0]
    with pytest.raises(ValueError, match="step_overhead"):
        decode_step_load(-1.0)
