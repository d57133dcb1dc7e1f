"""DP minibatch partitioning: optimality against brute force, size rules, remainder, price."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.schedule.ordering import decode_step_load
from mindspeed_rl_asp.schedule.partition import (
    ScheduleError,
    dp_partition,
    fixed_partition,
    is_representable,
    padded_cost,
    padded_work,
    priced_partition,
    size_bounds,
)

SETTINGS = settings(max_examples=150, deadline=None)


def compositions(n):
    """All ordered partitions of n into positive parts."""
    for cuts in itertools.product((False, True), repeat=n - 1):
        parts, run = [], 1
        for cut in cuts:
            if cut:
                parts.append(run)
                run = 1
            else:
                run += 1
        yield parts + [run]


def valid_partitions(n, lo, hi):
    """The documented feasible set: parts in [lo, hi]; if none, exactly one part < lo."""
    regular = [p for p in compositions(n) if all(lo <= s <= hi for s in p)]
    if regular:
        return regular
    return [p for p in compositions(n)
            if sum(s < lo for s in p) == 1 and all(s <= hi for s in p if s >= lo)]


def total_cost(lengths, parts, cost_fn=padded_cost, price=0.0):
    ends = np.cumsum(parts)
    return float(sum(cost_fn(np.int64(s), lengths[e - 1]) + price for s, e in zip(parts, ends)))


@st.composite
def instances(draw, max_n=12):
    base = draw(st.integers(1, 6))
    slack = draw(st.integers(0, base - 1))
    n = draw(st.integers(1, max_n))
    # a small value set makes ties (the tie-breaking path) common
    values = draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.5, 10.0, 57.0, 1000.0]) | st.floats(0, 1e4),
                           min_size=n, max_size=n))
    return np.sort(np.array(values)), base, slack


@SETTINGS
@given(instances())
def test_dp_matches_brute_force_minimum(inst):
    lengths, base, slack = inst
    lo, hi = size_bounds(base, slack)
    parts = dp_partition(lengths, base, slack).tolist()
    feasible = valid_partitions(len(lengths), lo, hi)
    assert parts in feasible
    best = min(total_cost(lengths, p) for p in feasible)
    assert total_cost(lengths, parts) == pytest.approx(best, rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("n", [9, 11, 12])
@pytest.mark.parametrize("base, slack", [(1, 0), (3, 0), (4, 1), (5, 2), (6, 1), (6, 5)])
def test_dp_matches_brute_force_at_the_largest_sizes(n, base, slack):
    rng = np.random.default_rng(n * 100 + base * 10 + slack)
    lo, hi = size_bounds(base, slack)
    feasible = valid_partitions(n, lo, hi)
    for lengths in (np.sort(rng.lognormal(3, 1.5, n)), np.sort(rng.integers(0, 4, n).astype(float))):
        best = min(total_cost(lengths, p) for p in feasible)
        assert total_cost(lengths, dp_partition(lengths, base, slack).tolist()) == pytest.approx(best)


@SETTINGS
@given(instances(max_n=10), st.floats(0.0, 2e4), st.floats(0.0, 50.0))
def test_dp_is_optimal_for_any_block_cost_and_price(inst, price, overhead):
    lengths, base, slack = inst
    lo, hi = size_bounds(base, slack)
    load = decode_step_load(overhead)

    def cost(sizes, max_lengths):
        return load(sizes, max_lengths, 3)

    parts = dp_partition(lengths, base, slack, cost, price).tolist()
    best = min(total_cost(lengths, p, cost, price) for p in valid_partitions(len(lengths), lo, hi))
    assert total_cost(lengths, parts, cost, price) == pytest.approx(best, rel=1e-9, abs=1e-6)


@SETTINGS
@given(instances())
def test_sizes_obey_the_rules(inst):
    lengths, base, slack = inst
    lo, hi = size_bounds(base, slack)
    sizes = dp_partition(lengths, base, slack)
    n = len(lengths)
    assert sizes.sum() == n and np.all(sizes >= 1) and np.all(sizes <= hi)
    if is_representable(n, lo, hi):
        assert np.all(sizes >= lo)
    else:
        assert np.sum(sizes < lo) == 1


@given(st.integers(0, 200), st.integers(1, 9), st.integers(0, 8))
def test_is_representable_matches_enumeration(n, lo, width):
    hi = lo + width
    reachable = {0}
    for m in range(1, n + 1):
        if any(m - s in reachable for s in range(lo, hi + 1)):
            reachable.add(m)
    assert is_representable(n, lo, hi) == (n in reachable)


def test_fewer_prompts_than_lo_make_one_minibatch():
    assert dp_partition(np.arange(5.0), 8, 2).tolist() == [5]


def test_remainder_goes_where_it_saves_most():
    # slack 0, N = 6: one remainder of size 1; isolating the outlier is optimal.
    assert dp_partition(np.array([1, 1, 1, 1, 1, 100.0]), 5, 0).tolist() == [5, 1]
    # with equal lengths every position ties; the regular part wins, so it goes first
    assert dp_partition(np.ones(20), 8, 0).tolist() == [4, 8, 8]


def test_equal_lengths_prefer_base_sized_minibatches():
    assert dp_partition(np.full(64, 7.0), 8, 3).tolist() == [8] * 8


def test_unpriced_dp_shrinks_blocks_toward_lo():
    lengths = np.sort(np.random.default_rng(0).lognormal(6, 1, 600))
    assert np.mean(dp_partition(lengths, 8, 2)) < 6.5


@settings(max_examples=60, deadline=None)
@given(instances(max_n=12))
def test_priced_partition_is_lagrangian_optimal(inst):
    lengths, base, slack = inst
    lo, hi = size_bounds(base, slack)
    n = len(lengths)
    sizes, price = priced_partition(lengths, base, slack)
    target = -(-n // base)
    assert len(sizes) >= target or price == 0.0
    work = padded_work(lengths, sizes)
    rivals = [p for p in valid_partitions(n, lo, hi) if len(p) <= len(sizes)]
    assert work <= min(total_cost(lengths, p) for p in rivals) * (1 + 1e-9) + 1e-9


def test_priced_partition_hits_the_fixed_size_count():
    rng = np.random.default_rng(1)
    lengths = np.sort(rng.lognormal(6, 1, 4096))
    sizes, price = priced_partition(lengths, 8, 2)
    assert len(sizes) == 512 and price > 0
    assert 7.9 < sizes.mean() < 8.1
    assert padded_work(lengths, sizes) <= padded_work(lengths, fixed_partition(4096, 8))


def test_priced_partition_sampled_search_lands_just_above_target():
    rng = np.random.default_rng(2)
    lengths = np.sort(rng.lognormal(6, 1, 40_000))
    sizes, _ = priced_partition(lengths, 8, 2, sample_limit=4096, tol=0.004)
    assert 5000 <= len(sizes) <= 5000 * 1.004
    assert padded_work(lengths, sizes) <= padded_work(lengths, fixed_partition(40_000, 8))


def test_priced_partition_keeps_the_unpriced_optimum_when_ties_already_hit_the_count():
    # many tied integer lengths: any positive price would jump far below the target
    lengths = np.sort(np.random.default_rng(4).integers(5, 40, 40_000).astype(float))
    sizes, price = priced_partition(lengths, 8, 4, sample_limit=4096)
    assert price == 0.0 and 5000 <= len(sizes) <= 5000 * 1.002


def test_dp_handles_large_inputs_linearly():
    lengths = np.sort(np.random.default_rng(3).lognormal(6, 1, 200_000))
    sizes = dp_partition(lengths, 8, 2, price=50.0)
    assert sizes.sum() == 200_000 and sizes.min() >= 6 and sizes.max() <= 10


def test_fixed_partition_puts_the_remainder_last():
    assert fixed_partition(19, 8).tolist() == [8, 8, 3]
    assert fixed_partition(16, 8).tolist() == [8, 8]


def test_padded_work_uses_block_maxima():
    assert padded_work(np.array([1.0, 5.0, 2.0, 2.0]), np.array([2, 2])) == 2 * 5 + 2 * 2


@pytest.mark.parametrize(
    "base, slack, match",
    [(0, 0, "base_batch_size=0"), (-3, 0, "base_batch_size=-3"), (4, -1, "slack=-1"),
     (4, 4, "slack larger than base"), (4, 9, "slack=9")],
)
def test_bad_bounds_are_refused(base, slack, match):
    with pytest.raises(ScheduleError, match=match):
        dp_partition(np.ones(8), base, slack)


def test_bad_lengths_are_refused():
    with pytest.raises(ScheduleError, match="empty"):
        dp_partition(np.array([]), 4, 1)
    with pytest.raises(ScheduleError, match="sorted"):
        dp_partition(np.array([3.0, 1.0]), 4, 1)
    with pytest.raises(ValueError):
        fixed_partition(0, 4)
