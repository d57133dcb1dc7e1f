"""The GRPO loss keys are declared once (algo/grpo.GRPOLossKeys): the config tree's
``algo`` group extends them, YAML and overrides merge into them with their types, and the
config file and docs/grpo.md list exactly them."""
import re
from dataclasses import fields
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mindspeed_rl_asp.algo.grpo import GRPOLossConfig, GRPOLossKeys
from mindspeed_rl_asp.config.load import config_dir, load_config
from mindspeed_rl_asp.config.schema import AlgoConfig
from mindspeed_rl_asp.config.validate import ConfigError

# The algo keys that are not the loss's: how group advantages are normalised.
# Besides the loss keys: how advantages are normalised, and DAPO's reward-side keys.
ADVANTAGE_KEYS = {"scale_advantages", "adv_std", "adv_eps", "filter_groups", "filter_groups_metric",
                  "max_num_gen_batches", "overlong_buffer_len", "overlong_penalty_factor"}
DOCS = Path(__file__).resolve().parents[1] / "docs" / "grpo.md"


def signature(dataclass) -> dict:
    """name -> (type annotation, default) of a dataclass's fields."""
    return {f.name: (f.type, f.default) for f in fields(dataclass)}


def test_algo_config_is_the_loss_keys_plus_advantage_normalisation():
    algo = signature(AlgoConfig)
    assert set(algo) - set(signature(GRPOLossKeys)) == ADVANTAGE_KEYS
    assert {k: v for k, v in algo.items() if k not in ADVANTAGE_KEYS} == signature(GRPOLossKeys)
    assert signature(GRPOLossConfig) == signature(GRPOLossKeys)


def test_config_file_lists_every_algo_key():
    # config.yaml repeats the defaults as documentation; a key added to the loss must show there.
    shipped = OmegaConf.load(config_dir() / "config.yaml").algo
    assert set(shipped) == set(signature(AlgoConfig))
    assert OmegaConf.to_container(load_config().algo) == OmegaConf.to_container(OmegaConf.structured(AlgoConfig))


def test_docs_table_lists_every_loss_key():
    documented = set(re.findall(r"^\| `(\w+)` \|", DOCS.read_text(encoding="utf-8"), flags=re.M))
    assert set(signature(GRPOLossKeys)) <= documented


def test_overrides_merge_typed_and_build_the_loss_config():
    cfg = load_config(["algo.off_policy=decoupled", "algo.tis_cap=null", "algo.kl_coef=0.05",
                       "algo.scale_advantages=false"])
    loss = GRPOLossConfig.from_mapping(OmegaConf.to_container(cfg.algo))
    assert (loss.off_policy, loss.tis_cap, loss.kl_coef) == ("decoupled", None, 0.05)
    assert isinstance(OmegaConf.to_object(cfg).algo, AlgoConfig) and cfg.algo.scale_advantages is False


@pytest.mark.parametrize("overrides, expected", [
    (["algo.kl_coef=abc"], "'algo.kl_coef'"),                        # typed by the shared declaration
    (["algo.kl_cof=0.1"], "did you mean 'algo.kl_coef'"),            # unknown key, inherited fields listed
    (["algo.off_policy=is"], "algo: off_policy='is' is not one of"),  # the loss config's own check
    (["algo.tis_cap=null"], "tis_cap=None is not valid with off_policy='tis'"),
])
def test_bad_algo_values_name_the_key(overrides, expected):
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    assert expected in str(info.value)


def test_from_mapping_ignores_advantage_keys_and_defaults_missing_ones():
    assert GRPOLossConfig.from_mapping({"scale_advantages": False, "clip_ratio_high": 0.28}) == GRPOLossConfig(
        clip_ratio_high=0.28)
