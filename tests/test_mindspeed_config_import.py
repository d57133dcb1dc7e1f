"""MindSpeed-RL job YAMLs as this project's overrides (integrations/mindspeed/config_import.py):
every mapping, each refusal, the overrides composed with the Hydra config, the CLIs, and,
with MINDSPEED_RL_CHECKOUT set, a contract test against MindSpeed-RL's own configs/."""
import copy
import os
from pathlib import Path

import pytest
import yaml

from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.integrations.mindspeed.config_import import (
    GENERATE_KEYS, MindSpeedImportError, SAMPLING_KEYS, SECTION_KEYS, choose_layout, import_file, import_job,
    merge_overrides, reward_registry_names, shipped_layouts)

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "configs" / "mindspeed_rl"
TINY = EXAMPLES / "grpo_tiny_cpu.yaml"
TINY_USER = ["layout=local", "task=maze"]

MODEL_GROUP = {"demo_qwen3": {"num_layers": 6, "hidden_size": 256, "ffn_hidden_size": 768, "num_attention_heads": 8,
                              "group_query_attention": True, "num_query_groups": 2, "kv_channels": 32,
                              "padded_vocab_size": 1000, "max_position_embeddings": 4096,
                              "untie_embeddings_and_output_weights": True, "qk_layernorm": True}}


def job():
    """A GRPO job with every mapped key set to a value different from this project's default."""
    return {
        "defaults": [{"model": ["demo_qwen3"]}],
        "megatron_training": {"model": "demo_qwen3", "tokenizer_type": "PretrainedFromHF",
                              "tokenizer_name_or_path": "./ckpt/Demo-Qwen3", "global_batch_size": 16,
                              "seq_length": 4096, "train_iters": 12, "save_interval": 5, "stage": "ray_grpo",
                              "seed": 7, "bf16": True, "use_flash_attn": True, "data_path": "./data/train.jsonl"},
        "actor_config": {"model": "demo_qwen3", "micro_batch_size": 4, "tensor_model_parallel_size": 4,
                         "pipeline_model_parallel_size": 2, "expert_model_parallel_size": 1,
                         "context_parallel_size": 2, "lr": "2e-6", "lr_decay_style": "constant",
                         "lr_warmup_fraction": 0.0, "min_lr": 0, "weight_decay": 0.05, "clip_grad": 0.5,
                         "adam_beta1": 0.9, "adam_beta2": 0.999},
        "rl_config": {"n_samples_per_prompt": 8, "mini_batch_size": 8, "max_prompt_length": 768, "epochs": 1,
                      "adv_estimator": "group_norm", "clip_ratio": 0.25, "kl_penalty": "kl", "kl_ctrl_type": "fixed",
                      "init_kl_coef": 0.02, "entropy_coeff": 0.0, "rule_reward": True,
                      "verifier_function": ["base_acc", "format"], "verifier_weight": [1.0, 0.5],
                      "use_tensorboard": True, "actor_resource": {"num_npus": 64}},
        "generate_config": {"infer_tensor_parallel_size": 4, "infer_pipeline_parallel_size": 1,
                            "infer_expert_parallel_size": 1, "max_num_seqs": 128, "max_model_len": 2048,
                            "gpu_memory_utilization": 0.7, "enforce_eager": False, "dtype": "bfloat16",
                            "offload_train_param": True,
                            "sampling_config": {"logprobs": 1, "max_tokens": 1024, "temperature": 0.9,
                                                "top_p": 0.95, "top_k": -1, "min_p": 0.0}},
    }


def run(j=None, user=(), group=MODEL_GROUP):
    return import_job(j if j is not None else job(), group, shipped_layouts(), list(user), reward_registry_names())


def as_dict(result):
    return dict(o.split("=", 1) for o in result.overrides)


def test_every_mapped_key():
    o = as_dict(run())
    expected = {
        "rl.global_batch_size": "16", "rl.n_samples_per_prompt": "8", "rl.mini_batch_size": "8",
        "rl.max_prompt_length": "768", "rl.micro_batch_size": "4", "steps": "12", "save_every": "5", "seed": "7",
        "generate.sampling_config.max_tokens": "1024", "generate.sampling_config.temperature": "0.9",
        "generate.sampling_config.top_p": "0.95", "generate.sampling_config.top_k": "0",
        "model.tensor_model_parallel_size": "4", "model.pipeline_model_parallel_size": "2",
        "model.expert_model_parallel_size": "1", "model.context_parallel_size": "2",
        "model.infer_tensor_parallel_size": "4", "engine.tensor_parallel_size": "4", "layout.infer_instance_size": "4",
        "train.lr": "2e-06", "train.weight_decay": "0.05", "train.clip_grad": "0.5",
        "algo.clip_ratio_low": "0.25", "algo.clip_ratio_high": "0.25", "algo.kl_coef": "0.02",
        "algo.kl_estimator": "k1", "algo.scale_advantages": "true", "algo.loss_agg": "token_mean",
        # MindSpeed-RL's group_norm: (r - mean) / (std + 1e-6), torch's (sample) std.
        "algo.adv_std": "sample", "algo.adv_eps": "1e-06", "generate.sampling_config.min_p": "0.0",
        "task.verifier_function": "[base_acc,format]", "task.verifier_weight": "[1.0,0.5]",
        "model.path": "./ckpt/Demo-Qwen3", "model.name": "demo_qwen3", "model.family": "qwen3",
        "model.num_layers": "6", "model.hidden_size": "256", "model.intermediate_size": "768",
        "model.num_attention_heads": "8", "model.num_key_value_heads": "2", "model.head_dim": "32",
        "model.vocab_size": "1000", "model.tie_word_embeddings": "false", "model.max_position_embeddings": "4096",
        "engine": "mindspeed", "layout": "ascend910b3_t4g4", "hardware": "ascend910b3",
        "weights.transport": "collective", "engine.max_num_seqs": "128", "engine.max_model_len": "2048",
        "engine.gpu_memory_utilization": "0.7", "engine.enforce_eager": "false", "engine.dtype": "bfloat16",
        "task": "dataset", "task.path": "./data/train.jsonl",
        # One minibatch per instance in a group: 32 G devices / 4 = 8 instances;
        # queue (16 + 8 x (4 + 1)) x 8 with asp's base 4 and slack 1.
        "scheduler.group_size": "8", "mode.queue_capacity": str((16 + 8 * 5) * 8),
    }
    assert {k: o.get(k) for k in expected} == expected
    ignored = {i.key for i in run().ignored}
    assert {"megatron_training.use_flash_attn", "megatron_training.seq_length", "rl_config.use_tensorboard",
            "generate_config.offload_train_param", "actor_config.adam_beta2"} <= ignored   # engine=mindspeed


def test_mini_batch_size_stays_in_prompts():
    """MindSpeed-RL multiplies rl_config.mini_batch_size by n_samples_per_prompt after reading it
    (RLConfig); ours counts prompts, so the YAML value maps unchanged and a minibatch holds
    mini x n samples in both."""
    j = job()
    j["rl_config"].update(n_samples_per_prompt=4, mini_batch_size=2)
    j["megatron_training"]["global_batch_size"] = 8
    o = as_dict(run(j))
    assert o["rl.mini_batch_size"] == "2" and o["rl.n_samples_per_prompt"] == "4"
    cfg = load_config(merge_overrides(run(j).overrides, ["layout=ascend910b3_t4g4", "task=maze", "task.num_prompts=64"]),
                      validate=False)
    assert cfg.rl.mini_batch_size * cfg.rl.n_samples_per_prompt == 8
    assert cfg.rl.global_batch_size // cfg.rl.mini_batch_size == 4   # optimizer updates per step


@pytest.mark.parametrize("penalty, estimator", [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")])
def test_kl_penalties(penalty, estimator):
    j = job()
    j["rl_config"]["kl_penalty"] = penalty
    assert as_dict(run(j))["algo.kl_estimator"] == estimator


def test_dapo_clip_higher_and_sequence_loss():
    j = job()
    j["megatron_training"]["stage"] = "ray_dapo"
    j["rl_config"].update(clip_higher_enable=True, clip_ratio_low=0.2, clip_ratio_high=0.28, token_level_loss=False)
    o = as_dict(run(j))
    assert (o["algo.clip_ratio_low"], o["algo.clip_ratio_high"]) == ("0.2", "0.28")
    assert o["algo.loss_agg"] == "seq_mean_token_mean"


def test_moe_model_group_and_expert_parallel_instance():
    group = {"moe": {"num_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "num_experts": 16,
                     "moe_router_topk": 2, "moe_ffn_hidden_size": 64, "qk_layernorm": True}}
    j = job()
    j["defaults"] = [{"model": "moe"}]
    j["megatron_training"]["model"] = j["actor_config"]["model"] = "moe"
    j["generate_config"].update(infer_tensor_parallel_size=2, infer_expert_parallel_size=8, enable_expert_parallel=True)
    o = as_dict(run(j, group=group))
    assert o["model.family"] == "qwen3_moe" and o["model.num_experts"] == "16"
    assert o["model.num_experts_per_tok"] == "2" and o["model.moe_intermediate_size"] == "64"
    assert o["model.head_dim"] == "32" and o["model.num_key_value_heads"] == "4"   # derived: no GQA keys
    assert o["layout.infer_instance_size"] == "8"   # vLLM's EP group spans max(TP, EP) devices


def test_the_overrides_compose_with_the_hydra_config():
    result = run()
    cfg = load_config(merge_overrides(result.overrides, ["task=maze", "task.num_prompts=64"]), validate=False)
    assert cfg.layout.name == "ascend910b3_t4g4" and cfg.engine.name == "mindspeed"
    assert cfg.train.lr == pytest.approx(2e-6) and cfg.algo.kl_estimator == "k1"
    assert cfg.model.context_parallel_size == 2 and cfg.model.path == "./ckpt/Demo-Qwen3"
    assert list(cfg.task.verifier_function) == ["base_acc", "format"]
    assert cfg.generate.sampling_config.top_k == 0 and cfg.save_every == 5
    assert cfg.task.name == "maze"   # the user's task group wins over the imported task=dataset


def test_the_users_overrides_win():
    merged = merge_overrides(run().overrides, ["rl.global_batch_size=32", "engine=hf"])
    assert "rl.global_batch_size=16" not in merged and "engine=mindspeed" not in merged
    assert merged[-2:] == ["rl.global_batch_size=32", "engine=hf"]
    cfg = load_config(merged + ["task=maze", "task.num_prompts=64"], validate=False)
    assert cfg.rl.global_batch_size == 32 and cfg.engine.name == "hf"


def test_layout_rule_and_user_layout():
    layouts = shipped_layouts()
    assert choose_layout(64, layouts).file == "ascend910b3_t4g4"      # made by the rule; a file of that shape
    made = choose_layout(32, layouts)                                 # no file of 2 + 2 nodes: every key
    assert (made.name, made.file, made.train_nodes, made.gen_nodes) == ("ascend910b3_t2g2", None, 2, 2)
    # on the smallest shipped NPU file (device type, accelerator), every other layout key set
    assert made.overrides()["layout"] == "ascend910b3_t1g1" and made.overrides()["layout.nodes"] == 4
    assert choose_layout(64, layouts, user_overrides=["mode=hybrid"]).file == "ascend910b3_hybrid"
    assert choose_layout(32, layouts, user_overrides=["layout.devices_per_node=16"]).nodes == 2
    assert choose_layout(32, layouts, user_overrides=["layout.train_nodes=1"]).gen_nodes == 3
    assert run(user=["layout=ascend910b3_t2g6"]).layout.name == "ascend910b3_t2g6"
    assert "6 node(s) x 8 = 48 device(s) generate" in run(user=["layout=ascend910b3_t2g6"]).describe_layout()
    assert "asp-plan-layout" in run().describe_layout()


# --- bad input: one error naming the key and the fix ------------------------------------------------------

def refused(match, j=None, user=(), group=MODEL_GROUP):
    with pytest.raises(MindSpeedImportError, match=match) as error:
        run(j, user, group)
    return str(error.value)


def test_unknown_section_is_refused():
    j = job()
    j["critic_config"] = {"lr": 1e-6}
    assert "delete it" in refused("section critic_config", j)


def test_unknown_key_is_refused_with_a_suggestion():
    j = job()
    j["rl_config"]["n_sample_per_prompt"] = 8
    assert "did you mean rl_config.n_samples_per_prompt" in refused("rl_config.n_sample_per_prompt", j)


@pytest.mark.parametrize("section, key, value, fix", [
    ("rl_config", "entropy_coeff", 0.01, "entropy_coeff: 0"),
    ("rl_config", "adv_estimator", "gae", "group_norm"),
    ("rl_config", "epochs", 2, "epochs: 1"),
    ("rl_config", "kl_penalty", "abs", "low_var_kl"),
    ("rl_config", "kl_ctrl_type", "adaptive", "fixed"),
    ("rl_config", "verifier_function", ["no_such_reward"], "package.module:function"),
    ("actor_config", "lr_decay_style", "cosine", "constant"),
    ("actor_config", "lr_warmup_fraction", 0.1, "lr_warmup_fraction: 0"),
    ("actor_config", "lora_r", 16, "lora"),
    ("actor_config", "noop_layers", "5,95", "engine=mindspeed"),
    ("actor_config", "num_layers", 96, "engine=mindspeed"),
    ("actor_config", "load", "./ckpt-tp4", "delete load"),
    ("megatron_training", "stage", "ray_ppo", "ray_grpo"),
    ("rl_config", "multi_turn_enable", True, "multi_turn_enable: false"),
])
def test_a_key_that_cannot_be_honoured_is_refused(section, key, value, fix):
    j = job()
    j[section][key] = value
    if key == "verifier_function":
        j[section]["verifier_weight"] = [1.0]
    message = refused(f"{section}.{key}", j, ["engine=hf"])   # this project's own trainer
    assert fix in message


@pytest.mark.parametrize("section, key, value", [
    ("actor_config", "lr_decay_style", "cosine"),
    ("actor_config", "lr_warmup_fraction", 0.1), ("rl_config", "entropy_coeff", 0.01),
    ("rl_config", "kl_penalty", "abs"), ("rl_config", "kl_ctrl_type", "adaptive")])
def test_engine_mindspeed_honours_its_actors_keys(section, key, value):
    """With engine=mindspeed (the default on NPU layouts) MindSpeed-RL's own actor trains from
    the same YAML, so its optimizer, schedule and loss keys are honoured there, not refused."""
    j = job()
    j[section][key] = value
    result = import_job(j, MODEL_GROUP, shipped_layouts(), [], reward_registry_names(), source="job.yaml")
    assert any(i.key == f"{section}.{key}" and "MindSpeed-RL's own Megatron actor" in i.reason for i in result.ignored)
    from mindspeed_rl_asp.config.schema import EngineConfig

    if hasattr(EngineConfig(), "mindspeed_config"):   # the engine's key (integrations/mindspeed/engine.py)
        assert "engine.mindspeed_config=job.yaml" in result.overrides
    with pytest.raises(MindSpeedImportError, match=f"{section}.{key}.*or train with engine=mindspeed"):
        run(j, ["engine=hf"])


def test_adam_betas_go_to_either_trainer():
    j = job()
    j["actor_config"]["adam_beta2"] = 0.95
    assert as_dict(run(j, ["engine=hf"]))["train.adam_beta2"] == "0.95"   # this project's AdamW takes it
    result = run(j)   # engine=mindspeed (the NPU default): MindSpeed-RL's actor applies it
    assert "train.adam_beta2" not in as_dict(result)
    assert any(i.key == "actor_config.adam_beta2" and "Megatron actor" in i.reason for i in result.ignored)


@pytest.mark.parametrize("section, key, value", [
    ("actor_config", "noop_layers", "5,95"), ("actor_config", "num_layers", 96), ("actor_config", "load", "./ckpt"),
    ("megatron_training", "lora_r", 128), ("megatron_training", "lora_target_modules", ["linear_qkv"]),
    ("rl_config", "share_backbone", True)])
def test_engine_mindspeed_passes_lora_noop_layers_and_its_checkpoint_through(section, key, value):
    """MindSpeed-RL's own actor builds LoRA adapters and no-op layers and loads its Megatron
    checkpoint (actor_config.load: no second Hugging Face checkpoint needed there)."""
    j = job()
    j[section][key] = value
    result = run(j)   # engine=mindspeed, the NPU default
    assert any(i.key == f"{section}.{key}" and "passed through" in i.reason for i in result.ignored)
    message = refused(f"{section}.{key}", j, ["engine=hf"])
    assert "engine=hf" in message and "or train with engine=mindspeed" in message


def test_sampling_min_p_maps_and_a_bad_one_is_refused():
    j = job()
    j["generate_config"]["sampling_config"]["min_p"] = 0.05
    assert as_dict(run(j))["generate.sampling_config.min_p"] == "0.05"
    cfg = load_config(merge_overrides(run(j).overrides, ["task=maze", "task.num_prompts=64"]))
    assert cfg.generate.sampling_config.min_p == pytest.approx(0.05)
    j["generate_config"]["sampling_config"]["min_p"] = 1.5
    assert "must be in [0, 1)" in refused("generate_config.sampling_config.min_p", j)


def test_min_p_reaches_the_hf_sampler():
    import torch

    from mindspeed_rl_asp.engines.base import SamplingParams
    from mindspeed_rl_asp.engines.hf import _warpers

    scores = torch.log(torch.tensor([[0.6, 0.3, 0.08, 0.02]]))
    (warper,) = _warpers(SamplingParams.from_config({"max_tokens": 4, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                                                      "min_p": 0.2}))
    kept = torch.isfinite(warper(None, scores.clone()))[0].tolist()
    assert kept == [True, True, False, False]        # below 0.2 x 0.6 = 0.12: dropped
    assert _warpers(SamplingParams(max_tokens=4)) == []


@pytest.mark.slow
def test_min_p_reaches_vllms_sampling_params():
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed here")
    from mindspeed_rl_asp.engines.base import SamplingParams
    from mindspeed_rl_asp.engines.vllm_engine import VLLMGenerationEngine

    params = VLLMGenerationEngine._sampling(None, SamplingParams(max_tokens=4, min_p=0.05), 2, 3)
    assert params.min_p == pytest.approx(0.05) and params.n == 2


def test_profiler_and_msprobe_sections_pass_through():
    """Before the fix a profiler_config section crashed the import (UnboundLocalError)."""
    j = job()
    j["profiler_config"] = {"integrated": {"profile": True, "profile_save_path": "./prof"}}
    j["msprobe_config"] = {"msprobe": False}
    result = run(j)
    reasons = {i.key: i.reason for i in result.ignored}
    assert "passed through" in reasons["profiler_config"] and "passed through" in reasons["msprobe_config"]
    assert "nothing in it changes the run" in {i.key: i.reason for i in run(j, ["engine=hf"]).ignored}["profiler_config"]


def test_eplb_keys_are_speed_only():
    j = job()
    j["generate_config"].update(expert_map_path="mindspeed_rl/workers/eplb/expert_map.json", eplb_token_collects=True,
                                eplb_token_save_path="./json")
    reasons = {i.key: i.reason for i in run(j, ["engine=hf"]).ignored}
    assert all("speed only" in reasons[f"generate_config.{k}"]
               for k in ("expert_map_path", "eplb_token_collects", "eplb_token_save_path"))


def dapo(**rl):
    j = job()
    j["megatron_training"]["stage"] = "ray_dapo"
    j["rl_config"].update({"verifier_function": ["acc_for_dapo"], "verifier_weight": [1.0],
                           "filter_groups_enable": True, "filter_groups_metric": "acc_for_dapo",
                           "filter_groups_max_batches": -1, "filter_groups_train_batch_size": 16,
                           "overlong_buffer_enable": True, "overlong_buffer": 256,
                           "overlong_buffer_penalty_factor": 0.1, "rollout_max_tokens": 1024, **rl})
    return j


def test_dapo_dynamic_sampling_and_overlong_shaping_map_to_algo_keys():
    o = as_dict(run(dapo()))
    assert (o["algo.filter_groups"], o["algo.filter_groups_metric"], o["algo.max_num_gen_batches"]) == (
        "std", "acc_for_dapo", "0")
    assert (o["algo.overlong_buffer_len"], o["algo.overlong_penalty_factor"]) == ("256", "0.1")
    assert o["rl.global_batch_size"] == "16"          # the kept groups per step
    cfg = load_config(merge_overrides(run(dapo()).overrides, ["task=maze", "task.num_prompts=64"]), validate=False)
    assert cfg.algo.filter_groups == "std" and cfg.algo.overlong_buffer_len == 256
    assert as_dict(run(dapo(filter_groups_max_batches=3)))["algo.max_num_gen_batches"] == "3"   # the same unit
    off = as_dict(run(dapo(filter_groups_enable=False, overlong_buffer_enable=False)))
    assert "algo.filter_groups" not in off and "algo.overlong_buffer_len" not in off


@pytest.mark.parametrize("rl, key, fix", [
    ({"filter_groups_metric": "format"}, "rl_config.filter_groups_metric", "name one of them"),
    ({"rollout_max_tokens": 2048}, "rl_config.rollout_max_tokens", "make the two equal"),
    ({"overlong_buffer": 1024}, "rl_config.overlong_buffer", "shorten the buffer"),
])
def test_dapo_keys_that_cannot_be_honoured_are_refused(rl, key, fix):
    assert fix in refused(key, dapo(**rl))


def test_tp_x_pp_larger_than_the_t_side_is_reported_at_import():
    """16 NPUs are 2 nodes of 8; TP 4 x PP 2 x CP 2 = 16 fits no T side of 8: the import says
    so, naming the keys, and colocates (mode=hybrid), or refuses when mode=async was asked."""
    j = job()
    j["rl_config"]["actor_resource"]["num_npus"] = 16
    result = run(j)
    assert result.layout.hybrid and as_dict(result)["mode"] == "hybrid"
    assert "tensor_model_parallel_size x pipeline_model_parallel_size x context_parallel_size = 4 x 2 x 2 = 16 is " \
           "larger than the 8 device(s) of the T side" in result.describe_layout()
    message = refused("rl_config.actor_resource.num_npus=16: no T/G split", j, ["mode=async"])
    assert "actor_config.tensor_model_parallel_size" in message


def test_an_instance_of_whole_nodes_and_a_layout_made_from_the_npu_count():
    """An EP 64 instance (DeepSeek-R1's inference) takes 8 whole G nodes; the layout made for
    256 NPUs composes and validates as it is, without a layout file."""
    j = job()
    j["rl_config"]["actor_resource"]["num_npus"] = 256
    j["generate_config"].update(infer_tensor_parallel_size=4, infer_expert_parallel_size=64, enable_expert_parallel=True)
    result = run(j)
    assert (result.layout.train_nodes, result.layout.gen_nodes, result.layout.instances) == (16, 16, 2)
    assert "2 inference instance(s) of 64 (8 whole nodes each)" in result.describe_layout()
    assert "asp-plan-layout layout=ascend910b3_t1g1 " in result.describe_layout()
    j["actor_config"]["tensor_model_parallel_size"] = 64    # fits no T side: colocated, no split to sweep
    assert "asp-plan-layout has no split to sweep" in run(j).describe_layout()
    cfg = load_config(merge_overrides(result.overrides, ["task=maze", "task.num_prompts=64"]))
    assert (cfg.layout.name, cfg.layout.nodes, cfg.layout.infer_instance_size) == ("ascend910b3_t16g16", 32, 64)


def test_num_npus_inconsistent_with_the_chosen_layout():
    j = job()
    j["rl_config"]["actor_resource"]["num_npus"] = 16
    message = refused("rl_config.actor_resource.num_npus=16 does not match layout ascend910b3_t4g4", j,
                      ["layout=ascend910b3_t4g4"])
    assert "64" in message
    j["rl_config"]["actor_resource"]["num_npus"] = 20
    assert "set layout.devices_per_node" in refused("num_npus=20: .*not a whole number of nodes of "
                                                     "layout.devices_per_node=8", j)
    j["rl_config"]["actor_resource"]["num_npus"] = 48
    assert (run(j).layout.train_nodes, run(j).layout.file) == (4, "ascend910b3_t4g2")   # 3 + 3: 24 T devices
    # hold no TP x PP x CP of 16; 4 + 2 has a file
    j["rl_config"]["actor_resource"]["num_npus"] = 3         # CPU workers: the shipped CPU layout of 3
    j["actor_config"].update(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1)
    j["generate_config"]["infer_tensor_parallel_size"] = 1
    assert run(j, ["engine.mindspeed_workers=cpu"]).layout.file == "local"
    message = refused("layout=ascend910b3_t1g1 cannot hold the job", {**job(), "rl_config": {
        **job()["rl_config"], "actor_resource": {"num_npus": 16}}}, ["layout=ascend910b3_t1g1"])
    assert "= 16 is larger than the 8 device(s) of the T side" in message


def test_missing_model_group():
    j = job()
    del j["defaults"]
    assert "defaults: [{model: NAME}]" in refused("defaults.model is missing", j)
    assert "--model-dir" in refused("defaults.model='demo_qwen3': no model group", job(), group=None)


def test_missing_model_group_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job()))
    with pytest.raises(MindSpeedImportError, match="no model group demo_qwen3.yaml"):
        import_file(path)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "demo_qwen3.yaml").write_text(yaml.safe_dump(MODEL_GROUP))
    assert import_file(path).model_group == "demo_qwen3"


def test_a_preprocessed_dataset_is_read_by_task_dataset():
    j = job()
    j["megatron_training"].update(data_path="./data/alpaca", dataset_additional_keys=["labels"])   # a prefix
    o = as_dict(run(j))
    assert (o["task"], o["task.path"], o["task.prompt_key"], o["task.answer_key"], o["task.chat_template"]) == (
        "dataset", "./data/alpaca", "input_ids", "labels", "never")
    assert "task" not in as_dict(run(j, ["task=maze"]))


def test_inference_instance_must_divide_a_node_or_span_whole_nodes():
    j = job()
    j["generate_config"]["infer_tensor_parallel_size"] = 3
    assert "generate_config.infer_pipeline_parallel_size x max(" in refused("does not divide a node of 8", j)


# --- the example YAMLs and the CLIs ----------------------------------------------------------------------

def test_tiny_example_composes_to_the_local_layout():
    result = import_file(TINY, user_overrides=TINY_USER)
    cfg = load_config(merge_overrides(result.overrides, TINY_USER))
    assert cfg.layout.name == "local" and cfg.engine.name == "hf" and cfg.rl.n_samples_per_prompt == 4
    assert list(cfg.task.verifier_function) == ["maze_integrity", "maze_correctness"]
    assert cfg.steps == 4 and cfg.train.lr == pytest.approx(3e-5) and cfg.mode.queue_capacity == (8 + 2 * 5) * 4


@pytest.mark.parametrize("name", ["grpo_qwen3_30b_a3b_910b3", "grpo_qwen3_32b_910b3"])
def test_paper_examples_dry_run(name, capsys):
    from mindspeed_rl_asp.cli.train import main

    rc = main(["--mindspeed-config", str(EXAMPLES / f"{name}.yaml"), "task=maze", "task.prompt_format=alphamaze",
               "task.num_prompts=960", "task.min_size=5", "task.max_size=5", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "layout ascend910b3_t4g4" in out and "generation actor 3: node 7 (8 NPU)" in out
    assert "plan: asp" in out


def test_import_cli_prints_and_dry_runs(capsys):
    from mindspeed_rl_asp.cli.import_mindspeed import main

    assert main([str(TINY), *TINY_USER]) == 0
    out = capsys.readouterr().out
    assert "rl.mini_batch_size=8" in out and "key(s) ignored" in out and "layout local" in out
    assert "\nasp-train " in out and out.rstrip().endswith("layout=local task=maze")   # the user's last
    assert main([str(TINY), *TINY_USER, "task.num_prompts=16", "--dry-run"]) == 0
    assert "plan: asp" in capsys.readouterr().out


def test_cli_errors_are_one_line(capsys, tmp_path):
    from mindspeed_rl_asp.cli.import_mindspeed import main
    from mindspeed_rl_asp.cli.train import main as train_main

    bad = tmp_path / "job.yaml"
    j = copy.deepcopy(yaml.safe_load(TINY.read_text()))
    j["rl_config"]["entropy_coeff"] = 0.1
    bad.write_text(yaml.safe_dump(j))
    assert main([str(bad), "--model-dir", str(EXAMPLES / "model"), *TINY_USER]) == 2
    assert "rl_config.entropy_coeff" in capsys.readouterr().err
    assert train_main(["--mindspeed-config", str(tmp_path / "none.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_example_trains_two_steps(tmp_path, ray_cluster):
    import json

    from mindspeed_rl_asp.cli.train import main

    run_dir = tmp_path / "run"
    # One generation actor (layout.gen_nodes=1): the checks are on the imported job, not on actors.
    rc = main(["--mindspeed-config", str(TINY), *TINY_USER, "steps=2", "task.num_prompts=16", "eval.num_prompts=0",
               "generate.sampling_config.max_tokens=96", "layout.nodes=2", "layout.gen_nodes=1",
               f"run_dir={run_dir}"])
    assert rc == 0
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["rl"]["mini_batch_size"] == 8 and saved["task"]["verifier_function"] == ["maze_integrity",
                                                                                          "maze_correctness"]


# --- contract: MindSpeed-RL's own configs ----------------------------------------------------------------

CHECKOUT = os.environ.get("MINDSPEED_RL_CHECKOUT")
needs_checkout = pytest.mark.skipif(not CHECKOUT, reason="MINDSPEED_RL_CHECKOUT is unset: no MindSpeed-RL checkout "
                                                         "to read its configs/ from")


def grpo_configs():
    if not CHECKOUT:
        return []
    found = []
    for path in sorted((Path(CHECKOUT) / "configs").glob("*.yaml")):
        stage = (yaml.safe_load(path.read_text()) or {}).get("megatron_training", {}).get("stage")
        if stage in ("ray_grpo", "ray_dapo"):
            found.append(path)
    return found


@needs_checkout
def test_checkout_has_grpo_configs():
    assert len(grpo_configs()) >= 5


# The one shipped job this project refuses: multi-turn tool use (ReTool) is not implemented.
REFUSED = {"dapo_qwen25_7b_A2_multi_turn.yaml": "rl_config.multi_turn_enable"}


@needs_checkout
@pytest.mark.parametrize("path", grpo_configs(), ids=lambda p: p.name)
def test_every_grpo_config_imports_unchanged(path):
    """Each of MindSpeed-RL's GRPO / DAPO jobs, as it ships and with no override, imports and
    composes with this project's config; the multi-turn one is refused, naming its key."""
    if path.name in REFUSED:
        with pytest.raises(MindSpeedImportError, match=f"MindSpeed-RL key {REFUSED[path.name]}="):
            import_file(path)
        return
    result = import_file(path)
    cfg = load_config(list(result.overrides), validate=False)
    assert cfg.layout.nodes * cfg.layout.devices_per_node == result.layout.num_npus
    assert cfg.algo.adv_std == "sample" and cfg.task.name == "dataset"


@needs_checkout
def test_all_fifteen_are_there():
    assert len(grpo_configs()) == 15 and set(REFUSED) <= {p.name for p in grpo_configs()}


@needs_checkout
@pytest.mark.parametrize("path", grpo_configs(), ids=lambda p: p.name)
def test_every_key_of_the_real_configs_has_a_rule(path):
    """The importer classifies (maps, ignores or refuses by meaning) every key MindSpeed-RL's own
    GRPO / DAPO configs use: none falls through as 'not known'."""
    j = yaml.safe_load(path.read_text())
    missing = [f"{section}.{key}" for section, table in SECTION_KEYS.items() for key in (j.get(section) or {})
               if key not in table]
    missing += [f"generate_config.sampling_config.{k}" for k in (j.get("generate_config") or {}).get(
        "sampling_config", {}) if k not in SAMPLING_KEYS]
    assert "sampling_config" in GENERATE_KEYS
    assert not missing, missing


@pytest.fixture(scope="module")
def packed_prompts(tmp_path_factory):
    """A preprocessed dataset as MindSpeed-RL's preprocess_data.py lays one out (input_ids and
    labels), 512 prompts (the largest global_batch_size of the shipped jobs), in the tiny
    policy's tokens: what the dry runs read in place of each job's data_path."""
    from transformers import AutoTokenizer

    from mindspeed_rl_asp.tasks.megatron_data import write_packed

    tokenizer = AutoTokenizer.from_pretrained(str(REPO / "mindspeed_rl_asp" / "assets" / "tiny-maze-qwen3"))
    prefix = str(tmp_path_factory.mktemp("data") / "data")
    prompts = [tokenizer(f"<|{i % 5}-{i % 7}|><|blank|>", add_special_tokens=False)["input_ids"] for i in range(512)]
    write_packed(prefix, {"input_ids": prompts, "labels": [tokenizer("7", add_special_tokens=False)["input_ids"]] * 512})
    return prefix


@needs_checkout
@pytest.mark.slow
def test_every_imported_job_dry_runs_with_the_default_scheduler(packed_prompts, capsys):
    """Each importable shipped job, as it ships, dry-runs with the default scheduler (asp)
    on a preprocessed dataset: the only overrides are where its data and tokenizer are
    on this machine (no checkpoint or dataset of the jobs is here)."""
    from mindspeed_rl_asp.cli.train import main

    here = [f"model.path={REPO / 'mindspeed_rl_asp' / 'assets' / 'tiny-maze-qwen3'}", f"task.path={packed_prompts}"]
    for path in grpo_configs():
        if path.name in REFUSED:
            continue
        rc = main(["--mindspeed-config", str(path), *here, "--dry-run"])
        out = capsys.readouterr()
        assert rc == 0, (path.name, out.err[-2000:])
        assert "plan: asp" in out.out and f"task dataset: " in out.out, path.name


@needs_checkout
def test_a_job_whose_data_is_not_here_fails_at_the_first_read_naming_it(capsys):
    from mindspeed_rl_asp.cli.train import main

    job_file = Path(CHECKOUT) / "configs" / "grpo_qwen3_8b_A3.yaml"
    rc = main(["--mindspeed-config", str(job_file), f"model.path={REPO / 'mindspeed_rl_asp' / 'assets' / 'tiny-maze-qwen3'}",
               "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "task.path='./data': no such file and no preprocessed dataset there" in err[0]


@needs_checkout
def test_the_cli_imports_every_shipped_job_in_one_call(capsys):
    from mindspeed_rl_asp.cli.import_mindspeed import main

    assert main([str(p) for p in grpo_configs()]) == 2       # the multi-turn job is refused; the others print
    captured = capsys.readouterr()
    assert captured.out.count("### ") == 15 and captured.out.count("\nasp-train ") == 14
    refusals = captured.err.strip().splitlines()
    assert len(refusals) == 1 and "dapo_qwen25_7b_A2_multi_turn.yaml: MindSpeed-RL key rl_config.multi_turn_enable" \
        in refusals[0]


def test_hccl_buffersize_is_the_drivers_environment(tmp_path, monkeypatch):
    """MindSpeed-RL's cli/train_grpo.py exports HCCL_BUFFSIZE from rl_config.hccl_buffersize:
    a run started from the job does the same unless the variable is set already."""
    from mindspeed_rl_asp.integrations.mindspeed.config_import import expand_mindspeed_config

    j = job()
    j["rl_config"]["hccl_buffersize"] = 640
    assert run(j).env == {"HCCL_BUFFSIZE": "640"} and "HCCL_BUFFSIZE=640" in run(j).describe()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "demo_qwen3.yaml").write_text(yaml.safe_dump(MODEL_GROUP))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(j))
    monkeypatch.setenv("HCCL_BUFFSIZE", "")                  # recorded, so that the test leaves it as it was
    monkeypatch.delenv("HCCL_BUFFSIZE")
    expand_mindspeed_config(["--mindspeed-config", str(tmp_path / "job.yaml")], out=open(os.devnull, "w"))
    assert "HCCL_BUFFSIZE" not in os.environ                 # only a run that starts actors sets it
    expand_mindspeed_config(["--mindspeed-config", str(tmp_path / "job.yaml")], out=open(os.devnull, "w"),
                            apply_env=True)
    assert os.environ["HCCL_BUFFSIZE"] == "640"
    monkeypatch.setenv("HCCL_BUFFSIZE", "512")               # the operator's value wins
    expand_mindspeed_config(["--mindspeed-config", str(tmp_path / "job.yaml")], out=open(os.devnull, "w"),
                            apply_env=True)
    assert os.environ["HCCL_BUFFSIZE"] == "512"
