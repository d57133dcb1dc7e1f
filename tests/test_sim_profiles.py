"""Simulator profiles: parameter counts computed from architecture numbers match the
published ones and the shipped checkpoint; hardware and engine profiles need a source for
every number; bad values fail with one message that names every key and its fix."""
import json
import math
from pathlib import Path

import pytest

from mindspeed_rl_asp.config.load import config_dir, list_group_options, load_config
from mindspeed_rl_asp.sim.profiles import (
    GIB, HARDWARE_NUMBERS, ModelProfile, ProfileError, engine_profile_from_config, hardware_profile_from_config,
    model_profile_from_config, model_profile_from_hf_config,
)

TINY_CHECKPOINT = Path(__file__).resolve().parents[1] / "mindspeed_rl_asp" / "assets" / "tiny-maze-qwen3"


def model(option: str) -> ModelProfile:
    return model_profile_from_config(load_config([f"model={option}", "layout=ascend910b3_t4g4"]).model)


# Published figures (Qwen's model cards, also quoted by vllm-ascend's Qwen3-30B-A3B
# tutorial): Qwen3-30B-A3B 30.5 B total, 3.3 B activated, 29.9 B non-embedding; Qwen3-32B
# 32.8 B total, 31.2 B non-embedding. They are rounded to 0.1 B, so the computed counts
# must agree within 0.1 B (one unit of that rounding): 3.35 B active is written "3.3B".
PUBLISHED_B = {
    "qwen3_30b_a3b": {"total": 30.5, "active": 3.3, "non_embedding": 29.9},
    "qwen3_32b": {"total": 32.8, "active": 32.8, "non_embedding": 31.2},
}


@pytest.mark.parametrize("option", sorted(PUBLISHED_B))
def test_computed_parameter_counts_match_the_model_cards(option):
    profile = model(option)
    published = PUBLISHED_B[option]
    non_embedding = profile.total_params - profile.embedding_params - profile.lm_head_params
    assert profile.total_params / 1e9 == pytest.approx(published["total"], abs=0.1)
    assert profile.active_params / 1e9 == pytest.approx(published["active"], abs=0.1)
    assert non_embedding / 1e9 == pytest.approx(published["non_embedding"], abs=0.1)


def test_qwen3_30b_a3b_exact_counts_by_hand():
    p = model("qwen3_30b_a3b")
    attention = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 2 * 128   # q, k, v, o, q_norm, k_norm
    per_layer_dense = attention + 2 * 2048 + 2048 * 128                 # + two norms + router
    expert = 3 * 2048 * 768
    embeddings = 2 * 151936 * 2048                                      # untied: embedding + lm_head
    assert p.params_per_expert == expert == 4_718_592
    assert p.dense_params == 48 * per_layer_dense + 2048 + embeddings == 1_541_093_376
    assert p.total_params == p.dense_params + 48 * 128 * expert == 30_532_122_624
    assert p.active_params == p.dense_params + 48 * 8 * expert == 3_353_032_704
    assert p.matmul_params == p.active_params - 151936 * 2048            # the input lookup does no FLOPs
    assert p.weight_bytes == 2 * 30_532_122_624
    assert p.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2 == 98_304


def test_qwen3_32b_exact_counts_by_hand():
    p = model("qwen3_32b")
    attention = 5120 * 8192 + 2 * 5120 * 1024 + 8192 * 5120 + 2 * 128
    per_layer = attention + 2 * 5120 + 3 * 5120 * 25600
    assert p.total_params == 64 * per_layer + 5120 + 2 * 151936 * 5120 == 32_762_123_264
    assert p.active_params == p.total_params and p.expert_params == 0 and not p.is_moe
    assert p.weight_bytes == 65_524_246_528
    assert p.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2 == 262_144


def count_checkpoint_parameters(path: Path, tied: bool) -> int:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="np") as f:
        names = list(f.keys())
        if tied:  # a tied LM head is the embedding table: count it once
            names = [n for n in names if n != "lm_head.weight"]
        return sum(math.prod(f.get_slice(n).get_shape()) for n in names)


def test_tiny_profile_is_the_shipped_checkpoint():
    from_yaml = model("tiny")
    config = json.loads((TINY_CHECKPOINT / "config.json").read_text())
    from_json = model_profile_from_hf_config(config, name=from_yaml.name)
    assert from_yaml == from_json  # configs/model/tiny.yaml cannot drift from config.json
    assert from_yaml.total_params == count_checkpoint_parameters(TINY_CHECKPOINT, config["tie_word_embeddings"])


def test_model_profile_from_hf_config_reads_a_qwen3_moe_config():
    config = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
              "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "vocab_size": 151936,
              "tie_word_embeddings": False, "num_experts": 128, "num_experts_per_tok": 8,
              "moe_intermediate_size": 768, "torch_dtype": "bfloat16"}
    assert model_profile_from_hf_config(config, name="Qwen3-30B-A3B") == model("qwen3_30b_a3b")


def profile_error(build, node) -> str:
    """The message of the ProfileError that ``build(node)`` must raise."""
    with pytest.raises(ProfileError) as info:
        build(node)
    return str(info.value)


BAD_ARCHITECTURE = dict(name="broken", dtype="bfloat16", num_layers=0, hidden_size=64, num_attention_heads=6,
                        num_key_value_heads=4, head_dim=16, intermediate_size=0, vocab_size=100,
                        tie_word_embeddings=False, num_experts=8, num_experts_per_tok=9, moe_intermediate_size=32)


# (profile builder, a bad config node (built when the test runs), what its one error must say)
COLLECTED_PROBLEMS = [
    pytest.param(model_profile_from_config, lambda: BAD_ARCHITECTURE, [
        "3 problem(s) in model 'broken'", "model.num_layers=0 must be > 0",
        "model.num_attention_heads=6 is not a multiple of model.num_key_value_heads=4",
        "model.num_experts_per_tok=9 must be in [1, model.num_experts=8]"], id="model"),
    pytest.param(hardware_profile_from_config, lambda: load_config(
        ["hardware=h200", "hardware.peak_bf16_tflops=-1", "hardware.training_mfu=1.5",
         "hardware.sources.hbm_gib=''"]).hardware, [
        "3 problem(s) in hardware profile 'h200'", "hardware.peak_bf16_tflops=-1.0 must be > 0",
        "hardware.training_mfu=1.5 must be <= 1",
        "hardware.sources.hbm_gib is missing: every number needs its source"], id="hardware"),
    pytest.param(engine_profile_from_config, lambda: load_config(
        ["engine=vllm", "engine.batching=paged", "engine.decode_step_overhead_s=0",
         "engine.gpu_memory_utilization=1.2"]).engine, [
        "3 problem(s) in engine profile 'vllm'",
        "engine.batching='paged' is not one of continuous, static: fix configs/engine/vllm.yaml",
        "engine.decode_step_overhead_s=0.0 must be > 0", "engine.gpu_memory_utilization=1.2 must be <= 1"],
        id="engine"),
]


@pytest.mark.parametrize("build, node, expected", COLLECTED_PROBLEMS)
def test_every_problem_of_a_profile_is_named_in_one_message(build, node, expected):
    message = profile_error(build, node())
    for line in expected:
        assert line in message


def test_missing_architecture_key_and_unknown_dtype_are_named():
    message = profile_error(model_profile_from_config, {"name": "x", "dtype": "int3", "num_layers": 2})
    assert "model.hidden_size is missing" in message
    assert "model.dtype='int3' is not one of" in message


def test_dense_model_needs_an_ffn():
    with pytest.raises(ProfileError, match=r"model.intermediate_size=0 must be > 0 for a dense model"):
        model_profile_from_config(load_config(["model.intermediate_size=0"]).model)


# ------------------------------------------------------------------------ hardware


@pytest.mark.parametrize("option", list_group_options("hardware"))
def test_every_shipped_hardware_builds_with_a_source_for_every_number(option):
    cfg = load_config([f"hardware={option}"])
    profile = hardware_profile_from_config(cfg.hardware)
    assert profile.name == option  # the fix hint names configs/hardware/<name>.yaml
    assert set(HARDWARE_NUMBERS) <= set(profile.sources)
    assert all(text.strip() for text in profile.sources.values())


def test_cpu_local_numbers_name_the_calibration_script():
    sources = hardware_profile_from_config(load_config(["hardware=cpu_local"]).hardware).sources
    measured = [k for k in HARDWARE_NUMBERS if k != "devices_per_node"]
    assert all("scripts/calibrate_cpu.py" in sources[k] for k in measured)


def test_hardware_units_are_converted():
    h = hardware_profile_from_config(load_config(["hardware=ascend910b3"]).hardware)
    assert h.peak_flops == 313e12 and h.hbm_bytes == 64 * GIB and h.hbm_bandwidth == 1.6e12
    assert h.inter_node_bandwidth == 25e9 and h.devices_per_node == 8
    assert h.sources["hbm_bandwidth_gbs"].startswith("assumption")  # not published for the B3


def test_zero_bandwidth_names_the_key_the_file_and_the_override():
    cfg = load_config(["hardware=ascend910b3", "hardware.hbm_bandwidth_gbs=0"])
    assert ("hardware.hbm_bandwidth_gbs=0.0 must be > 0: fix configs/hardware/ascend910b3.yaml or override "
            "hardware.hbm_bandwidth_gbs=...") in profile_error(hardware_profile_from_config, cfg.hardware)


def test_a_hardware_mapping_without_numbers_lists_them_all():
    message = profile_error(hardware_profile_from_config, {"name": "new_chip"})
    assert f"{len(HARDWARE_NUMBERS)} problem(s)" in message
    assert "hardware.hbm_gib is missing: fix configs/hardware/new_chip.yaml" in message


# -------------------------------------------------------------------------- engine


@pytest.mark.parametrize("option", list_group_options("engine"))
def test_every_shipped_engine_builds_with_sources(option):
    profile = engine_profile_from_config(load_config([f"engine={option}"]).engine)
    assert profile.name == option
    assert profile.batching == ("static" if option == "hf" else "continuous")
    for key in ("batching", "decode_step_overhead_s", "weight_sync_fixed_s", "mode_switch_s", "max_num_seqs",
                "gpu_memory_utilization"):
        assert profile.sources[key].strip(), key


# --------------------------------------------------------------------- experiments


@pytest.mark.parametrize("experiment", [o for o in list_group_options("experiment") if o.startswith("table3")])
def test_table3_experiments_build_every_profile_on_the_910b3(experiment):
    cfg = load_config([f"experiment={experiment}"])
    hardware = hardware_profile_from_config(cfg.hardware)
    model_profile = model_profile_from_config(cfg.model)
    engine = engine_profile_from_config(cfg.engine)
    assert hardware.name == "ascend910b3" and hardware.devices_per_node == cfg.layout.devices_per_node
    assert model_profile.dtype_bytes == 2 and engine.name == "mindspeed"


def test_default_run_builds_the_local_profiles():
    cfg = load_config()
    assert hardware_profile_from_config(cfg.hardware).name == "cpu_local"
    assert model_profile_from_config(cfg.model).total_params == 812_672
    assert engine_profile_from_config(cfg.engine).batching == "static"
    assert (config_dir() / "hardware" / "cpu_local.yaml").is_file()
