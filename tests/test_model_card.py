"""config.yaml records the model at model.path, not the tiny policy's name and shape."""
import yaml

from hf_random import save_random_checkpoint

from mindspeed_rl_asp.config.load import load_config, make_run_dir
from mindspeed_rl_asp.config.model_card import architecture_of


def test_a_users_checkpoint_is_what_the_config_records(tmp_path):
    path = save_random_checkpoint(tmp_path / "MyQwen2-2L", family="qwen2", max_positions=2048)
    cfg = load_config([f"model.path={path}", f"run_dir={tmp_path / 'run'}", "generate.sampling_config.max_tokens=64"])
    saved = yaml.safe_load((make_run_dir(cfg, "test") / "config.yaml").read_text())["model"]
    hf = yaml.safe_load((path / "config.json").read_text())
    assert saved["name"] == "MyQwen2-2L" and saved["family"] == "qwen2" and saved["max_position_embeddings"] == 2048
    assert saved["num_layers"] == hf["num_hidden_layers"] and saved["hidden_size"] == hf["hidden_size"]
    assert saved["max_position_embeddings"] == hf["max_position_embeddings"]


def test_the_tiny_policy_is_left_as_its_group_file_says():
    """The shipped model group already says what the shipped checkpoint is (and tests vary
    its numbers on purpose): nothing moves; a simulated model is numbers too."""
    cfg = load_config(["model.intermediate_size=100"], validate=False)
    assert cfg.model.intermediate_size == 100 and cfg.model == load_config(
        ["model.intermediate_size=100"], validate=False, local_install=False).model


def test_architecture_of_fills_what_transformers_defaults():
    values = architecture_of({"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 64,
                              "num_attention_heads": 8, "vocab_size": 100})
    assert values["head_dim"] == 8 and values["num_key_value_heads"] == 8 and values["num_experts"] == 0
    assert values["family"] == "qwen2" and values["num_layers"] == 2


def test_the_tiny_policy_by_any_path_is_left_alone():
    """Tests and users point model.path at the shipped policy by its absolute path too (as a
    stand-in for a model that is not here): the group's numbers stay."""
    from mindspeed_rl_asp.config.paths import locate
    from mindspeed_rl_asp.config.schema import ModelConfig

    absolute = locate(ModelConfig.path).resolve()
    cfg = load_config([f"model.path={absolute}", "model.max_position_embeddings=4096"], validate=False)
    assert cfg.model.max_position_embeddings == 4096
