"""Every shipped config composes and validates; bad values fail with errors that name them."""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mindspeed_rl_asp.config.load import config_dir, list_group_options, load_config, make_run_dir
from mindspeed_rl_asp.config.schema import CONFIG_GROUPS as GROUPS
from mindspeed_rl_asp.config.validate import ConfigError


def test_default_is_a_local_cpu_tiny_run():
    cfg = load_config()
    assert cfg.layout.name == "local" and cfg.layout.device_type == "cpu"
    assert cfg.model.name == "tiny-maze-qwen3" and cfg.engine.name == "hf"
    assert cfg.mode.name == "async" and cfg.scheduler.name == "asp"


@pytest.mark.parametrize("group", GROUPS)
def test_every_shipped_option_composes(group):
    options = list_group_options(group)
    assert options, f"no options in configs/{group}"
    for option in options:
        overrides = [f"{group}={option}"]
        if group == "model" and option != "tiny":
            # The paper's models need the paper's cluster: on `local` their parallel
            # sizes do not fit, which validation rightly refuses.
            overrides.append("layout=ascend910b3_t4g4")
        if group == "layout" and option.endswith("hybrid"):
            overrides.append("mode=hybrid")
        if group == "task" and option != "maze":
            # A dataset task reads a file the user names (read when the task is built, not here).
            overrides.append("task.path=train.jsonl")
        cfg = load_config(overrides)
        assert cfg[group].name if group != "experiment" else cfg.experiment.name


def test_every_config_file_is_reachable():
    shipped = {p.relative_to(config_dir()).with_suffix("").as_posix() for p in config_dir().rglob("*.yaml")}
    listed = {f"{g}/{o}" for g in GROUPS for o in list_group_options(g)} | {"config"}
    # MindSpeed-RL job YAMLs (read by asp-import-mindspeed; tests/test_mindspeed_config_import.py
    # imports each), not config groups of this project.
    jobs = {s for s in shipped if s.startswith("mindspeed_rl/")}
    # The simulator's table of published measurements (asp-simulate experiment=validation).
    data = {s for s in shipped if s.startswith("validation/")}
    assert jobs and shipped - jobs - data == listed


@pytest.mark.parametrize("experiment", [o for o in list_group_options("experiment") if o.startswith("table3")])
def test_table3_experiments_describe_the_paper_setup(experiment):
    cfg = load_config([f"experiment={experiment}"])
    assert cfg.layout.accelerator == "Ascend 910B3" and cfg.layout.devices_per_node == 8
    assert cfg.rl.global_batch_size == 32 and cfg.rl.n_samples_per_prompt == 8
    # Decoupled runs split the 8 nodes into T and G; the colocated baseline uses all 8 for both.
    split = {"async": (cfg.layout.train_nodes + cfg.layout.gen_nodes, 8),
             "hybrid": ((cfg.layout.train_nodes, cfg.layout.gen_nodes), (8, 8))}
    assert cfg.layout.nodes == 8 and split[cfg.mode.name][0] == split[cfg.mode.name][1], cfg.layout


@pytest.mark.parametrize(
    "layout,train,gen,actors",
    [("ascend910b3_t4g4", 4, 4, 4), ("ascend910b3_t2g6", 2, 6, 6), ("ascend910b3_t1g3", 1, 3, 3),
     ("ascend910b3_t4g1", 4, 1, 1), ("ascend910b3_t4g3", 4, 3, 3), ("local", 1, 2, 2)],
)
def test_layout_splits(layout, train, gen, actors):
    cfg = OmegaConf.to_object(load_config([f"layout={layout}"]))
    assert (cfg.layout.train_nodes, cfg.layout.gen_nodes, cfg.layout.num_generation_actors) == (train, gen, actors)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["layout.train_nodes=3"], "exceeds layout.nodes=3"),
        (["layout=ascend910b3_t4g4", "layout.infer_instance_size=3"], "layout.infer_instance_size=3 does not divide"),
        (["rl.mini_batch_size=3"], "rl.mini_batch_size=3 does not divide rl.global_batch_size=8"),
        (["rl.micro_batch_size=5"], "rl.micro_batch_size=5"),
        (["scheduler.slack=4"], "scheduler.slack=4"),
        (["scheduler.base_batch_size=0"], "scheduler.base_batch_size=0 must be > 0"),
        (["layout.nodse=4"], "did you mean 'layout.nodes'"),
        (["+rl.foo=1"], "unknown config key 'rl.foo'"),
        (["layout=nope"], "Could not find 'layout/nope'"),
        (["layout.nodes=abc"], "'layout.nodes'"),
        (["mode.name=sync"], "mode.name='sync' is not one of async, hybrid"),
        (["generate.sampling_config.max_tokens=2000"], "exceeds model.max_position_embeddings"),
        (["experiment=table3_qwen3_32b_asp", "layout=ascend910b3_t1g3"], "does not divide the 8 training devices"),
        (["task.num_prompts=4"], "rl.global_batch_size=8 exceeds task.num_prompts=4: a step would hold a prompt"),
    ],
)
def test_bad_configs_name_the_key(overrides, expected):
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    assert expected in str(info.value)


def test_colocated_layout_needs_hybrid_mode():
    with pytest.raises(ConfigError, match="mode=hybrid"):
        load_config(["layout=ascend910b3_hybrid", "mode=async"])


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as info:
        load_config(["rl.mini_batch_size=3", "scheduler.slack=9", "mode.max_staleness=-1"])
    assert "4 problem(s)" in str(info.value)


def test_run_dir_holds_resolved_config(tmp_path: Path):
    cfg = load_config([f"run_dir={tmp_path / 'run'}", "seed=7"])
    run_dir = make_run_dir(cfg, "test")
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.seed == 7 and saved.layout.name == "local"
    assert load_config([f"{k}={v}" for k, v in [("seed", 7)]]).seed == saved.seed


def test_a_mindspeed_data_channel_is_checked_with_the_config():
    import importlib.util

    with pytest.raises(ConfigError, match="train.data_channel='dock' is not one of"):
        load_config(["train.data_channel=dock"])
    if importlib.util.find_spec("mindspeed_rl") is None:
        with pytest.raises(ConfigError, match="needs mindspeed_rl importable"):
            load_config(["train.data_channel=transfer_dock"])
