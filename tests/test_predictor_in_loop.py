"""The predictor in the loop: save/load of the fitted predictors, the profile split, the
items of every prompt, the dry run (no sampling), and short real asp-train runs."""
import json

import numpy as np
import pytest

from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.config.validate import ConfigError
from mindspeed_rl_asp.schedule import length_profile
from mindspeed_rl_asp.schedule.length_profile import profile_and_predict, split_profile
from mindspeed_rl_asp.schedule.predictors import (FeatureRidgePredictor, PredictorFileError, load_predictor,
                                                   save_predictor)
from mindspeed_rl_asp.tasks.maze import MazeTaskSpec, make_dataset


@pytest.fixture(scope="module")
def maze():
    items = make_dataset(48, 0, MazeTaskSpec())
    prompts = [p.prompt for p in items]
    lengths = [float(p.reference_length) for p in items]
    return prompts, lengths


def test_ridge_save_load_round_trip(tmp_path, maze):
    prompts, lengths = maze
    ridge = FeatureRidgePredictor().fit(prompts[:32], lengths[:32])
    path = save_predictor(ridge, tmp_path / "ridge")
    loaded = load_predictor(path, "ridge")
    assert isinstance(loaded, FeatureRidgePredictor)
    np.testing.assert_array_equal(loaded.predict(prompts), ridge.predict(prompts))
    save_predictor(ridge, path)  # overwriting an existing directory is atomic too
    np.testing.assert_array_equal(load_predictor(path).predict(prompts), ridge.predict(prompts))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_lm_save_load_round_trip(tmp_path, maze, random_policy_dir):
    from mindspeed_rl_asp.schedule.lm_predictor import LMLengthPredictor

    prompts, lengths = maze
    lm = LMLengthPredictor(model_path=random_policy_dir, epochs=1, batch_size=16, num_threads=1).fit(
        prompts[:24], lengths[:24])
    path = lm.save(tmp_path / "lm")
    # Only what was trained (the top 2 of its 2 layers here, the final norm; not the
    # embeddings), and the backbone it points at: no copy of the model, no tokenizer.
    assert {p.name for p in path.iterdir()} == {"meta.json", "head.safetensors", "trained.safetensors"}
    from safetensors.torch import load_file

    saved = load_file(str(path / "trained.safetensors"))
    assert saved and not any("embed" in k for k in saved)
    assert json.loads((path / "meta.json").read_text())["backbone_path"] == str(random_policy_dir.resolve())
    loaded = load_predictor(path, "lm", num_threads=1)
    np.testing.assert_array_equal(loaded.predict(prompts), lm.predict(prompts))


def test_an_lm_predictor_saves_only_its_trained_layers(tmp_path, maze):
    """On the shipped 4-layer policy, train_layers=1 trains and saves layer 3 and the final
    norm; the file is a fraction of the backbone's, and a moved backbone is one clear error."""
    import shutil

    from safetensors.torch import load_file

    from mindspeed_rl_asp.schedule.lm_predictor import DEFAULT_MODEL_PATH, LMLengthPredictor

    prompts, lengths = maze
    base = tmp_path / "base"
    shutil.copytree(DEFAULT_MODEL_PATH, base)
    lm = LMLengthPredictor(model_path=base, epochs=1, batch_size=16, num_threads=1, train_layers=1).fit(
        prompts[:16], lengths[:16])
    path = lm.save(tmp_path / "lm")
    saved = load_file(str(path / "trained.safetensors"))
    assert {k.split(".")[1] for k in saved if k.startswith("layers.")} == {"3"} and "norm.weight" in saved
    assert (path / "trained.safetensors").stat().st_size < 0.35 * (base / "model.safetensors").stat().st_size
    np.testing.assert_array_equal(load_predictor(path, "lm", num_threads=1).predict(prompts), lm.predict(prompts))
    shutil.rmtree(base)
    with pytest.raises(PredictorFileError, match="the backbone it was trained on, .* is not there"):
        load_predictor(path, "lm")


def test_a_bad_predictor_file_is_one_clear_error(tmp_path, maze, random_policy_dir):
    prompts, lengths = maze
    with pytest.raises(PredictorFileError, match="no meta.json"):
        load_predictor(tmp_path / "nothing")
    path = save_predictor(FeatureRidgePredictor().fit(prompts, lengths), tmp_path / "ridge")
    with pytest.raises(PredictorFileError, match="holds a 'ridge' predictor, not 'lm'"):
        load_predictor(path, "lm")
    meta = json.loads((path / "meta.json").read_text())
    meta["coef"] = meta["coef"][:-1]
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PredictorFileError, match="features, but mu/sd/coef"):
        load_predictor(path)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(PredictorFileError, match="not JSON"):
        load_predictor(path)
    # An lm head that does not fit its backbone.
    from mindspeed_rl_asp.schedule.lm_predictor import LMLengthPredictor
    from safetensors.torch import save_file
    import torch

    lm = LMLengthPredictor(model_path=random_policy_dir, epochs=1, num_threads=1).fit(prompts[:8], lengths[:8])
    lm_path = lm.save(tmp_path / "lm")
    save_file({"weight": torch.zeros(1, 7), "bias": torch.zeros(1)}, str(lm_path / "head.safetensors"))
    with pytest.raises(PredictorFileError, match="does not fit the backbone"):
        load_predictor(lm_path)


def test_profile_share_and_held_out_split():
    fit, held = split_profile(64, 0.25, 0.25, seed=0)
    assert len(fit) + len(held) == 16 and len(held) == 4
    assert not set(fit) & set(held) and all(0 <= i < 64 for i in fit + held)
    assert split_profile(64, 0.25, 0.25, seed=0) == (fit, held)  # seeded
    assert split_profile(64, 0.25, 0.25, seed=1) != (fit, held)
    f, h = split_profile(64, 1.0, 0.0, seed=0)
    assert len(f) == 64 and h == []
    f, h = split_profile(5, 0.1, 0.5, seed=0)  # at least 4 profiled, 2 held out, 2 to fit
    assert len(f) == 2 and len(h) == 2


SMALL = ["task.num_prompts=24", "rl.global_batch_size=4", "rl.mini_batch_size=2", "rl.n_samples_per_prompt=2",
         "rl.micro_batch_size=4", "generate.sampling_config.max_tokens=64", "scheduler.base_batch_size=2",
         "scheduler.group_size=2", "mode.queue_capacity=32", "eval.num_prompts=0", "engine.num_threads=1"]


def _task(cfg):
    from mindspeed_rl_asp.schedule.configured import configured_task

    return configured_task(cfg).prompts


def test_items_cover_every_prompt_and_profiled_keep_observed(tmp_path):
    cfg = load_config([*SMALL, "scheduler.predictor=ridge", "scheduler.profile_share=0.5",
                       "scheduler.profile_samples=2"])
    prompts = _task(cfg)
    items, report = profile_and_predict(cfg, prompts, tmp_path)
    assert [i for i, _ in items] == [p.id for p in prompts]
    assert all(np.isfinite(v) and v >= 0 for _, v in items)
    assert report["profiled"] == 12 and report["fitted_on"] + report["held_out_prompts"] == 12
    assert report["predicted"] == 12 and set(report["held_out"]) == {"kendall_tau", "spearman_rho", "prompts", "caveat"}
    # So few held-out prompts: the rank quality comes with why it says little.
    assert f"only {report['held_out']['prompts']} held-out prompt(s)" in report["held_out"]["caveat"]
    profile = [json.loads(line) for line in (tmp_path / "length_profile.jsonl").read_text().splitlines()]
    assert len(profile) == 12 and all(len(r["lengths"]) == 2 for r in profile)
    by_id = dict(items)
    for r in profile:
        assert by_id[r["id"]] == pytest.approx(r["mean_length"])
    assert json.loads((tmp_path / "predictor.json").read_text())["kind"] == "ridge"
    # The saved predictor, loaded by a second run, predicts every prompt without sampling.
    again = load_config([*SMALL, "scheduler.predictor=ridge", f"scheduler.predictor_path={tmp_path / 'length_predictor'}"])
    items2, report2 = profile_and_predict(again, prompts, tmp_path / "second")
    assert [i for i, _ in items2] == [p.id for p in prompts] and "profiled" not in report2
    # history over that profile: profiled prompts get their mean, the rest the ridge fallback.
    hist = load_config([*SMALL, "scheduler.predictor=history", f"scheduler.lengths_file={tmp_path / 'length_profile.jsonl'}"])
    items3, report3 = profile_and_predict(hist, prompts, None)
    assert report3["prompts_in_file"] == 12 and len(items3) == 24
    for r in profile:
        assert dict(items3)[r["id"]] == pytest.approx(r["mean_length"])


def test_predictor_keys_are_validated(tmp_path):
    for overrides, key in ((["scheduler.profile_share=0"], "scheduler.profile_share"),
                           (["scheduler.profile_holdout=1.0"], "scheduler.profile_holdout"),
                           (["scheduler.profile_samples=0"], "scheduler.profile_samples"),
                           (["scheduler.predictor=history"], "scheduler.lengths_file"),
                           (["scheduler.predictor=history", f"scheduler.lengths_file={tmp_path / 'no.jsonl'}"],
                            "scheduler.lengths_file"),
                           (["scheduler.predictor=lm", f"scheduler.predictor_path={tmp_path}"],
                            "scheduler.predictor_path"),
                           (["scheduler.predictor_path=somewhere"], "scheduler.predictor_path")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(overrides)


def test_dry_run_does_not_sample(monkeypatch, capsys):
    from mindspeed_rl_asp.cli.train import main

    def refuse(*args, **kwargs):
        raise AssertionError("the dry run sampled the policy")

    monkeypatch.setattr(length_profile, "sample_lengths", refuse)
    monkeypatch.setattr(length_profile, "profile_and_predict", refuse)
    for kind in ("lm", "ridge"):
        assert main([f"scheduler.predictor={kind}", "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert f"predictor: {kind}" in out and "profiled with the starting policy" in " ".join(out.split())


def _train(tmp_path, kind):
    from mindspeed_rl_asp.config.load import make_run_dir
    from mindspeed_rl_asp.runtime.driver import run_training

    # One generation actor: the checks are on the predictor and the plan, not on actors.
    cfg = load_config([*SMALL, "steps=2", "scheduler=asp", f"scheduler.predictor={kind}",
                       "layout.nodes=2", "layout.gen_nodes=1", f"run_dir={tmp_path / kind}"])
    run_dir = make_run_dir(cfg, "test")
    return run_dir, run_training(cfg, run_dir)


@pytest.mark.slow
def test_asp_train_with_the_ridge_predictor_in_the_loop(ray_cluster, tmp_path):
    # The lm predictor's run in the loop, with these same checks, is test_tasks_e2e's maze rows
    # run: a run of actors fewer, and only the predictor differs.
    run_dir, summary = _train(tmp_path, "ridge")
    assert summary["steps"] == 2
    report = json.loads((run_dir / "predictor.json").read_text())
    assert report["kind"] == "ridge" and report["profiled"] == 6 and report["held_out"]["prompts"] == 2
    assert (run_dir / "length_predictor" / "meta.json").is_file()
    plan = json.loads((run_dir / "plan.json").read_text())
    assert sorted(i for g in plan["groups"] for mb in g for i in mb["ids"]) == sorted(
        p.id for p in _task(load_config(SMALL)))
    load_predictor(run_dir / "length_predictor", "ridge")  # the saved predictor loads


def test_held_out_caveat_from_few_prompts_only():
    from mindspeed_rl_asp.schedule.length_profile import MIN_HELD_OUT, held_out_caveat

    assert "only 2 held-out prompt(s)" in held_out_caveat(2) and "spreads by 1.00" in held_out_caveat(2)
    assert MIN_HELD_OUT == 20 and "spreads by 0.17" in held_out_caveat(19)
    assert held_out_caveat(MIN_HELD_OUT) is None
