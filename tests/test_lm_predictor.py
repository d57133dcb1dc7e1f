"""LMLengthPredictor: learns a length ranking, validates its inputs, registers lazily."""
import math
import subprocess
import sys

import numpy as np
import pytest

from mindspeed_rl_asp.schedule.lm_predictor import LMLengthPredictor
from mindspeed_rl_asp.schedule.predictors import PREDICTORS, LengthPredictor, rank_quality
from mindspeed_rl_asp.tasks.maze import MazeTaskSpec, make_dataset


def synthetic(n, seed):
    """Maze prompts whose length is a clear function of the maze size, with 10 % noise."""
    items = make_dataset(n, seed, MazeTaskSpec())
    rng = np.random.default_rng(seed)
    lengths = [float(4 * p.size ** 2 * rng.lognormal(0.0, 0.1)) for p in items]
    return [p.prompt for p in items], lengths


def test_lm_predictor_learns_the_length_ranking_on_held_out_prompts():
    prompts, lengths = synthetic(160, 3)
    model = LMLengthPredictor(epochs=3, num_threads=1, seed=0).fit(prompts[:110], lengths[:110])
    assert model.loss_history_[-1] < 0.6 * model.loss_history_[0]
    predicted = model.predict(prompts[110:])
    assert predicted.dtype == np.float64 and predicted.shape == (50,)
    assert np.all(np.isfinite(predicted)) and np.all(predicted >= 0)
    quality = rank_quality(predicted, lengths[110:])
    assert quality["kendall_tau"] > 0.5, quality
    # magnitudes are roughly right, not only the order (the scheduler balances loads with them)
    assert 0.5 < np.median(predicted / np.asarray(lengths[110:])) < 2.0


def test_lm_predictor_is_seeded_and_handles_constant_lengths_and_empty_predict():
    prompts, _ = synthetic(12, 5)
    a = LMLengthPredictor(epochs=1, batch_size=4, num_threads=1, seed=1).fit(prompts, [7.0] * 12)
    b = LMLengthPredictor(epochs=1, batch_size=4, num_threads=1, seed=1).fit(prompts, [7.0] * 12)
    pa, pb = a.predict(prompts), b.predict(prompts)
    np.testing.assert_array_equal(pa, pb)
    np.testing.assert_allclose(pa, 7.0, rtol=0.3)  # constant target: predict about the constant
    assert a.predict([]).shape == (0,)
    assert isinstance(a, LengthPredictor) and "fitted" in repr(a)


def test_predict_before_fit_raises_a_clear_error():
    with pytest.raises(ValueError, match="not fitted: call fit"):
        LMLengthPredictor().predict(["<|maze_start|>"])


def test_bad_observations_raise_value_errors_naming_the_value():
    model = LMLengthPredictor()
    with pytest.raises(ValueError, match="no observations"):
        model.fit([], [])
    with pytest.raises(ValueError, match="2 prompts but 1 lengths"):
        model.fit(["a", "b"], [1.0])
    with pytest.raises(ValueError, match="length -3.0 of prompt 'b'"):
        model.fit(["a", "b"], [1.0, -3.0])
    with pytest.raises(ValueError, match="length nan of prompt 'a'"):
        model.fit(["a"], [float("nan")])
    with pytest.raises(ValueError, match="prompt 1 must be a str, got int"):
        model.fit(["a", 7], [1.0, 2.0])


def test_bad_parameters_raise_value_errors_naming_the_value(tmp_path):
    with pytest.raises(ValueError, match="pooling='max'"):
        LMLengthPredictor(pooling="max")
    with pytest.raises(ValueError, match="epochs=0"):
        LMLengthPredictor(epochs=0)
    with pytest.raises(ValueError, match="lr=-1"):
        LMLengthPredictor(lr=-1)
    with pytest.raises(ValueError, match="warmup=1.5"):
        LMLengthPredictor(warmup=1.5)
    with pytest.raises(ValueError, match="num_threads=-2"):
        LMLengthPredictor(num_threads=-2)
    with pytest.raises(ValueError, match="config.json missing"):
        LMLengthPredictor(model_path=tmp_path / "nothing").fit(["a"], [1.0])


def test_registry_returns_the_lm_predictor_without_importing_torch():
    code = (
        "import sys\n"
        "import mindspeed_rl_asp.schedule.predictors as p\n"
        "import mindspeed_rl_asp.schedule.lm_predictor\n"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "m = p.PREDICTORS['lm'](epochs=2)\n"
        "heavy += [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "print(type(m).__name__, m.epochs, ','.join(heavy) or 'none')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["LMLengthPredictor", "2", "none"]
    assert isinstance(PREDICTORS["lm"](), LMLengthPredictor)


def test_predictor_report_scores_and_writes_predictions(tmp_path):
    """scripts/predictor_report.py on a synthetic two-sample profile (numpy predictors only)."""
    import importlib.util
    import json
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    saved = list(sys.path)
    try:  # the script puts scripts/ and the repository on sys.path to find its helpers
        spec = importlib.util.spec_from_file_location("predictor_report", scripts / "predictor_report.py")
        report = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(report)
    finally:
        sys.path[:] = saved
    items = make_dataset(60, 11, MazeTaskSpec())
    rng = np.random.default_rng(0)
    records = [{"id": p.id, "prompt": p.prompt, "size": p.size,
                "lengths": [round(4 * p.size ** 2 * rng.lognormal(0, 0.1)) for _ in range(2)]} for p in items]  # token counts
    profile = tmp_path / "profile.jsonl"
    profile.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "pred.jsonl"
    assert report.main(["--profile", str(profile), "--predictors", "history,ridge", "--out", str(out),
                        "--best-among", "history,ridge"]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in lines] == [p.id for p in items]
    assert all(r["predicted_length"] > 0 for r in lines)
    rows, info = report.evaluate(records, ["history", "ridge"], log=lambda *a: None)
    assert [r["predictor"] for r in rows] == ["reference", "size", "size, ties in data order", "history", "ridge"]
    assert info["train"] == 42 and info["held_out"] == 18
    assert all(r["tau_last"] > 0.3 for r in rows)
    assert math.isnan(rows[3]["tau_mean"])  # history reads sample 1: no score against the mean
