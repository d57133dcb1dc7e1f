"""Length predictors and the numpy rank-quality metrics."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.schedule.predictors import (
    PREDICTORS,
    FeatureRidgePredictor,
    HistoryPredictor,
    LengthPredictor,
    PromptFeatures,
    kendall_tau,
    rank_quality,
    spearman_rho,
)


# --------------------------------------------------------------------------- history
def test_history_means_per_prompt_and_accumulates_epochs():
    h = HistoryPredictor().fit(["a", "a", "b"], [10, 20, 5])
    assert h.predict(["a", "b"]).tolist() == [15.0, 5.0]
    h.update(["b"], [7])
    assert h.predict(["b"]).tolist() == [6.0]
    h.fit(["c"], [1])  # fit starts over
    assert "a" not in h and h.predict(["c"]).tolist() == [1.0]


def test_history_unseen_prompts_get_the_median_of_prompt_means():
    h = HistoryPredictor().fit(["a", "b", "c", "c"], [1, 100, 7, 9])
    assert h.default == 8.0
    assert h.predict(["zzz", "a"]).tolist() == [8.0, 1.0]


def test_history_unseen_prompts_use_the_fallback_predictor():
    class Constant:
        def fit(self, prompts, lengths):
            self.n = len(prompts)
            return self

        def predict(self, prompts):
            return np.full(len(prompts), 42.0)

    fallback = Constant()
    h = HistoryPredictor(fallback=fallback).fit(["a"], [3])
    h.update(["b"], [4])
    assert fallback.n == 2  # refitted on everything seen so far
    assert h.predict(["a", "new"]).tolist() == [3.0, 42.0]


def test_history_rejects_bad_observations():
    with pytest.raises(ValueError, match="no observations"):
        HistoryPredictor().fit([], [])
    with pytest.raises(ValueError, match="2 prompts but 1 lengths"):
        HistoryPredictor().fit(["a", "b"], [1])
    with pytest.raises(ValueError, match="-1.0 of prompt 'b'"):
        HistoryPredictor().fit(["a", "b"], [1, -1])
    with pytest.raises(ValueError, match="not fitted"):
        HistoryPredictor().predict(["a"])


# --------------------------------------------------------------------------- ridge
def _synthetic(n, seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(3, 12, n)
    prompts = [f"<|maze|>" + "<|cell|>" * (s * s) + " solve it" for s in sizes]
    lengths = 20.0 * sizes ** 2 * rng.lognormal(0, 0.1, n)  # length grows with the cell count
    return prompts, lengths


def test_feature_ridge_learns_the_length_ranking():
    prompts, lengths = _synthetic(400, 0)
    model = FeatureRidgePredictor().fit(prompts, lengths)
    test_prompts, test_lengths = _synthetic(200, 1)
    pred = model.predict(test_prompts)
    assert pred.shape == (200,) and np.all(pred >= 0)
    q = rank_quality(pred, test_lengths)
    assert q["kendall_tau"] > 0.8 and q["spearman_rho"] > 0.9
    assert np.median(np.abs(np.log(pred / test_lengths))) < 0.2


def test_prompt_features_count_tags_and_tokens():
    f = PromptFeatures().fit(["<|a|><|b|>", "<|a|> x"])
    x = f(["<|a|><|a|> hi there", "plain"])
    assert f.tags == ["<|a|>", "<|b|>"]
    assert x[0, 2:].tolist() == [2.0, 0.0] and x[1, 2:].tolist() == [0.0, 0.0]
    assert x[0, 0] == pytest.approx(math.log1p(len("<|a|><|a|> hi there")))


def test_feature_ridge_with_a_user_feature_function_and_constant_columns():
    model = FeatureRidgePredictor(features=lambda ps: np.array([[len(p), 1.0] for p in ps]), alpha=0.0)
    model.fit(["a" * k for k in range(1, 30)], [math.expm1(0.1 * k) for k in range(1, 30)])
    assert model.predict(["a" * 10]) == pytest.approx([math.expm1(1.0)], rel=1e-6)


def test_feature_ridge_errors():
    with pytest.raises(ValueError, match="alpha"):
        FeatureRidgePredictor(alpha=-1)
    with pytest.raises(ValueError, match="not fitted"):
        FeatureRidgePredictor().predict(["x"])
    bad = FeatureRidgePredictor(features=lambda ps: np.ones(len(ps)))
    with pytest.raises(ValueError, match="features must be"):
        bad.fit(["a", "b"], [1, 2])


def test_registry_and_protocol():
    assert {"history", "ridge"} <= set(PREDICTORS)
    for make in PREDICTORS.values():
        assert isinstance(make(), LengthPredictor)
    h = PREDICTORS["history"]().fit(["<|a|>", "<|a|><|a|>"], [10, 20])
    assert h.predict(["<|a|><|a|><|a|>"])[0] > 0


# --------------------------------------------------------------------------- rank quality
def brute_tau_b(x, y):
    c = d = tx = ty = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            a, b = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
            if a == 0 and b == 0:
                continue
            if a == 0:
                tx += 1
            elif b == 0:
                ty += 1
            elif a == b:
                c += 1
            else:
                d += 1
    denom = math.sqrt((c + d + tx) * (c + d + ty))
    return (c - d) / denom if denom else float("nan")


def brute_rho(x, y):
    def ranks(v):
        return np.array([np.sum(v < a) + (np.sum(v == a) + 1) / 2 for a in v])

    rx, ry = ranks(np.asarray(x)), ranks(np.asarray(y))
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


pairs = st.integers(2, 40).flatmap(
    lambda n: st.tuples(st.lists(st.integers(0, 6), min_size=n, max_size=n),
                        st.lists(st.integers(0, 6) | st.floats(-1e3, 1e3), min_size=n, max_size=n))
)


@settings(max_examples=200, deadline=None)
@given(pairs)
def test_rank_quality_matches_brute_force_with_ties(xy):
    x, y = (np.array(v, dtype=float) for v in xy)
    tau, rho = kendall_tau(x, y), spearman_rho(x, y)
    for got, want in ((tau, brute_tau_b(x, y)), (rho, brute_rho(x, y))):
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-9)


def test_rank_quality_extremes_and_errors():
    x = np.arange(50.0)
    assert rank_quality(x, x ** 2) == {"kendall_tau": 1.0, "spearman_rho": 1.0}
    assert rank_quality(x, -x) == {"kendall_tau": -1.0, "spearman_rho": -1.0}
    assert math.isnan(kendall_tau(x, np.ones(50)))
    with pytest.raises(ValueError, match="equal length"):
        rank_quality([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="at least 2"):
        rank_quality([1], [1])
    with pytest.raises(ValueError, match="finite"):
        rank_quality([1, float("nan")], [1, 2])


def test_kendall_tau_scales_to_large_inputs():
    rng = np.random.default_rng(0)
    x = rng.random(50_000)
    assert kendall_tau(x, x + rng.random(50_000)) == pytest.approx(0.5, abs=0.01)
