"""Each actor's typed config (runtime/actor_configs.py): made once from the run's config,
resolved as every process needs it, frozen, and pickled across Ray as it is."""
import dataclasses
import pickle
from pathlib import Path

import pytest

from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.config.schema import EngineConfig, TaskConfig
from mindspeed_rl_asp.runtime.actor_configs import actor_configs
from mindspeed_rl_asp.schedule.configured import configured_task


def configs(*overrides, bundles=()):
    cfg = load_config(["task.num_prompts=8", "rl.global_batch_size=4", "rl.mini_batch_size=4", "rl.max_prompt_length=200",
                       "generate.sampling_config.max_tokens=100", *overrides], local_install=False)
    return cfg, actor_configs(cfg, configured_task(cfg), "/ckpt/start", bundles)


def test_configs_are_the_schema_types_resolved_once():
    cfg, made = configs("record.rollouts=3")
    gen, trainer = made.generation, made.trainer
    assert type(gen.engine) is EngineConfig and type(trainer.task) is TaskConfig
    assert gen.engine is trainer.engine                                   # made once, shared
    assert gen.engine.max_model_len == 300                                # prompt + response (0 in the config)
    assert gen.n_samples == cfg.rl.n_samples_per_prompt and gen.sampling.max_tokens == 100
    assert gen.scoring is None                                            # the trainer scores
    assert trainer.reference_path == "/ckpt/start" and trainer.record_rollouts == 3
    assert trainer.rl.global_batch_size == 4 and trainer.worker_bundles == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        trainer.temperature = 0.5


def test_dynamic_sampling_gives_the_actors_their_scoring():
    _, made = configs("algo.filter_groups=std", "algo.filter_groups_metric=acc")
    scoring = made.generation.scoring
    assert scoring.algo.filter_groups == "std" and scoring.max_tokens == 100 and scoring.max_prompt_length == 200
    assert scoring.task == made.trainer.task


def test_file_paths_become_absolute_and_everything_pickles(tmp_path, monkeypatch):
    """An actor's working directory need not be the driver's: the paths it reads are absolute."""
    monkeypatch.chdir(tmp_path)
    cfg = load_config(["task.num_prompts=8", "rl.global_batch_size=4", "rl.mini_batch_size=4"], local_install=False)
    cfg.task.eval_path, cfg.engine.mindspeed_config = "held_out.jsonl", "job.yaml"   # relative, as a user writes them
    made = actor_configs(cfg, configured_task(cfg), "/ckpt/start", [[{"NPU": 1.0}]])
    assert made.trainer.task.eval_path == str(tmp_path / "held_out.jsonl") and made.trainer.task.path == ""
    assert made.trainer.engine.mindspeed_config == str(tmp_path / "job.yaml")
    assert made.trainer.worker_bundles == ([{"NPU": 1.0}],)
    assert pickle.loads(pickle.dumps(made)) == made
