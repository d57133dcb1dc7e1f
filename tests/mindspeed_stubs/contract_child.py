"""The MindSpeed-RL contract checks, run in a child process (all_checks_child.py, for
tests/test_mindspeed_contract.py) with this directory and a MindSpeed-RL checkout on
PYTHONPATH (so the stubs shadow vllm here, and only here) and a Ray of its own with enough
logical CPUs for the dock and the queue manager (``num_cpus=10`` each).
"""
from __future__ import annotations

import os
from types import SimpleNamespace

from child_checks import Checks, expect

check = Checks()


# ----------------------------------------------------------------------------- imports
@check
def import_mindspeed_rl_with_stubs():
    import mindspeed_rl  # noqa: F401
    import vllm

    from mindspeed_rl_asp.integrations.mindspeed.job import npu_standins_dir

    stubs = str(npu_standins_dir())
    expect(os.path.dirname(os.path.dirname(vllm.__file__)) == stubs, f"vllm came from {vllm.__file__}, not the stub")


@check
def engine_api_signatures():
    from mindspeed_rl_asp.integrations.mindspeed.engine import check_mindspeed_api

    problems = check_mindspeed_api()
    expect(not problems, "; ".join(problems))


@check
def engine_cli_functions():
    import inspect

    from mindspeed_rl_asp.integrations.mindspeed.engine import load_cli_functions

    functions = load_cli_functions(os.environ["MINDSPEED_RL_CHECKOUT"])
    expect(list(inspect.signature(functions["gpt_model_provider"]).parameters)[:2] == ["pre_process", "post_process"],
           "gpt_model_provider(pre_process, post_process)")
    expect("config" in inspect.signature(functions["initialize_megatron"]).parameters, "initialize_megatron(config=)")
    expect(callable(functions["get_megatron_module"]), "get_megatron_module")


# ----------------------------------------------------------------------------- weight map
@check
def qkv_split_matches_mindspeed_rl():
    import torch
    from mindspeed_rl.models.rollout.vllm_adapter.megatron_weight_loaders import (
        InferParallelConfig, qkv_split_bias, qkv_split_weight)

    from mindspeed_rl_asp.integrations.mindspeed.weight_map import ModelShape, split_qkv

    for heads, groups, hd, tp in [(4, 2, 8, 1), (4, 2, 8, 2), (8, 2, 4, 2), (16, 4, 2, 4), (6, 6, 3, 3)]:
        shape = ModelShape(num_layers=1, hidden_size=12, num_attention_heads=heads, num_key_value_heads=groups,
                           head_dim=hd, vocab_size=8)
        hf_config = SimpleNamespace(num_attention_heads=heads, num_key_value_heads=groups)
        parallel = InferParallelConfig(tp, 1, 1, -1)
        rows = (heads + 2 * groups) * hd // tp
        weight, bias = torch.randn(rows, 12), torch.randn(rows)
        for ours, theirs in ((split_qkv(weight, shape, tp), qkv_split_weight(weight, parallel, hf_config)),
                             (split_qkv(bias, shape, tp), qkv_split_bias(bias, parallel, hf_config))):
            expect(all(torch.equal(a, b) for a, b in zip(ours, theirs)),
                   f"split differs for heads={heads} groups={groups} head_dim={hd} tp={tp}")


@check
def names_match_mindspeed_rl_weight_adaptors():
    from mindspeed_rl.workers.resharding.weight_adaptor import get_weight_adaptor
    from test_mindspeed_weight_map import MOE, QWEN2, QWEN3, random_hf

    from mindspeed_rl_asp.integrations.mindspeed.weight_map import megatron_name_of, vllm_fused_name

    for arch, shape in (("Qwen2ForCausalLM", QWEN2), ("Qwen3ForCausalLM", QWEN3), ("Qwen3MoeForCausalLM", MOE)):
        adaptor = get_weight_adaptor(arch)(SimpleNamespace(lora_target_modules=None))
        for name in random_hf(shape):
            theirs = adaptor.replace_name_i2t(vllm_fused_name(name))
            expect(theirs == megatron_name_of(name), f"{arch}: {name}: theirs {theirs!r}, ours {megatron_name_of(name)!r}")


@check
def fc1_gather_matches_mindspeed_rl():
    import torch
    from mindspeed_rl.workers.resharding.vllm_weight_container import MegatronStyleVllmWeightContainer
    from test_mindspeed_weight_map import QWEN3, random_hf

    from mindspeed_rl_asp.integrations.mindspeed.weight_map import MegatronRank, Parallel, hf_to_megatron

    hf = random_hf(QWEN3)
    shards = hf_to_megatron(hf, QWEN3, Parallel(tp=2))
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    parts = [shards[MegatronRank(tp=r)][name] for r in range(2)]
    # The gather MindSpeed-RL's resharding does when the inference TP is smaller.
    theirs = MegatronStyleVllmWeightContainer._default_tp_concat_fn(None, name, parts[0], parts)
    want = torch.cat([hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]])
    expect(torch.equal(theirs, want), "MindSpeed-RL's fc1 TP concat of our shards is not [gate; up]")


# ----------------------------------------------------------------------------- data channel
def sample_groups(count, n, seed=0):
    import numpy as np

    from mindspeed_rl_asp.runtime.generation_unit import SampleGroup

    rng = np.random.default_rng(seed)
    groups = []
    for i in range(count):
        prompt = rng.integers(1, 100, size=int(rng.integers(2, 6)), dtype=np.int32)
        responses = [rng.integers(1, 100, size=int(rng.integers(1, 7)), dtype=np.int32) for _ in range(n)]
        groups.append(SampleGroup(f"p{i}", prompt, responses,
                                  [rng.standard_normal(len(r)).astype(np.float32) for r in responses], i % 3))
    return groups


def same_groups(got, want):
    import numpy as np

    expect([g.prompt_id for g in got] == [g.prompt_id for g in want], "prompt order")
    for a, b in zip(got, want):
        expect(a.version == b.version, f"{a.prompt_id}: version {a.version} != {b.version}")
        expect(np.array_equal(a.prompt_ids, b.prompt_ids), f"{a.prompt_id}: prompt")
        expect(all(np.array_equal(x, y) for x, y in zip(a.response_ids, b.response_ids)), f"{a.prompt_id}: responses")
        expect(all(np.allclose(x, y, rtol=0, atol=0) for x, y in zip(a.logprobs, b.logprobs)), f"{a.prompt_id}: logprobs")


DOCKS = {}


def dock_channel(prompts, n):
    """make_channel("transfer_dock", prompts, n), one for the checks that ask for the same
    shape (each dock is an actor process that imports MindSpeed-RL: about 5 CPU-s), emptied
    by clear() for each (transfer_dock_round_trip checks that clear() empties it)."""
    from mindspeed_rl_asp.integrations.mindspeed.queue import make_channel

    if (prompts, n) not in DOCKS:
        DOCKS[prompts, n] = make_channel("transfer_dock", prompts, n)
    DOCKS[prompts, n].clear()   # whatever a check that failed before left in it
    return DOCKS[prompts, n]


@check
def transfer_dock_round_trip():
    channel = dock_channel(3, 4)   # the advantage stage's dock too
    for step in range(2):   # two steps: clear() really empties the dock between them
        groups = sample_groups(3, 4, seed=step)
        channel.put_groups(groups)
        same_groups(channel.get_groups(), groups)
        channel.clear()


@check
def dock_model_matches_the_real_dock():
    """The same calls on GRPOTransferDock and on dock_model.InProcessDock, outcome by outcome."""
    import ray
    import torch
    from mindspeed_rl.trainer.utils.transfer_dock import GRPOTransferDock
    from mindspeed_rl.utils.metrics import Metric

    from mindspeed_rl_asp.integrations.mindspeed.dock_model import InProcessDock
    from mindspeed_rl_asp.integrations.mindspeed.queue import ASP_COLUMNS, DockLayout, groups_to_columns

    n, prompts = 2, 3
    columns, indexes = groups_to_columns(sample_groups(prompts, n), DockLayout(prompts, n))

    def run(call):
        """Outcomes of one script of calls: returned rows (sorted) or the error's type."""
        outcomes = []

        def step(name, **kw):
            try:
                batch, index = call(name, **kw) if name == "get_experience" else (call(name, **kw), None)
                if index is not None and "indexes" not in kw:
                    # The real dock picks among ready groups at random: compare how many
                    # rows, and that they are whole groups, not which.
                    index = (len(index), sorted({i // n for i in index}).__len__() * n == len(index))
                outcomes.append((name, index, None if batch is None
                                 else sorted(k for k in batch.keys() if k != "original_length")))
            except Exception as error:  # noqa: BLE001 - the outcome compared
                cause = getattr(error, "cause", None) or error   # a Ray task error wraps the dock's own
                outcomes.append((name, type(cause).__name__))

        step("put_experience", data_dict={k: v[:4] for k, v in columns.items()}, indexes=indexes[:4])
        step("get_experience", consumer="rule_reward", experience_columns=["prompts", "responses"],
             experience_count=prompts * n)      # all 3 groups asked for, 2 ready: nothing
        step("get_experience", consumer="rule_reward", experience_columns=["responses"], experience_count=3)
        step("get_experience", consumer="rule_reward", experience_columns=["responses", "response_length"],
             experience_count=2)
        step("get_experience", consumer="rule_reward", experience_columns=["responses"], experience_count=2)
        step("get_experience", consumer="rule_reward", experience_columns=["responses"], experience_count=2)
        step("put_experience", data_dict={"rm_scores": [torch.tensor([1.0])] * 2}, indexes=[0, 1])
        step("get_experience", consumer="compute_advantage", experience_columns=["responses", "rm_scores"],
             experience_count=2)
        step("get_experience", consumer="actor_train", experience_columns=["policy_version", "rollout_log_prob"],
             indexes=[2, 3])
        step("put_experience", data_dict={"no_such_column": [torch.zeros(1)]}, indexes=[0])
        step("put_experience", data_dict={"responses": [torch.zeros(1)]}, indexes=[9])
        step("get_experience", consumer="nobody", experience_columns=["responses"], indexes=[0])
        return outcomes

    real = GRPOTransferDock.remote(prompts_num=prompts, n_samples_per_prompt=n, metrics=Metric(), GBS_train=2,
                                   addition_columns=list(ASP_COLUMNS))
    model = InProcessDock(prompts, n, GBS_train=2, addition_columns=list(ASP_COLUMNS))
    theirs = run(lambda name, **kw: ray.get(getattr(real, name).remote(**kw)))
    ours = run(lambda name, **kw: getattr(model, name)(**kw))
    expect(theirs == ours, f"real {theirs} != model {ours}")
    ray.kill(real)


@check
def default_gbs_train_returns_nothing_on_the_real_dock():
    import ray
    from mindspeed_rl.trainer.utils.transfer_dock import GRPOTransferDock
    from mindspeed_rl.utils.metrics import Metric

    from mindspeed_rl_asp.integrations.mindspeed.queue import ASP_COLUMNS, DockLayout, groups_to_columns

    dock = GRPOTransferDock.remote(prompts_num=2, n_samples_per_prompt=2, metrics=Metric(),
                                   addition_columns=list(ASP_COLUMNS))
    columns, indexes = groups_to_columns(sample_groups(2, 2), DockLayout(2, 2))
    ray.get(dock.put_experience.remote(data_dict=columns, indexes=indexes))
    got = ray.get(dock.get_experience.remote("rule_reward", ["responses"], 2, get_n_samples=True))
    expect(got == (None, None), f"GBS_train=0 returned {got}")
    ray.kill(dock)


@check
def mindspeed_rl_advantage_stage_reads_asp_samples():
    """MindSpeed-RL's own compute_advantage (group_norm) over ASP's samples in the real dock,
    against this project's GRPO advantages: equal up to the std convention (MindSpeed-RL
    divides by torch.std, ddof=1; algo/grpo.group_advantages by the population std)."""
    import math

    import ray
    import torch
    from mindspeed_rl.trainer.utils.compute_utils import compute_advantage

    from mindspeed_rl_asp.algo.grpo import group_advantages

    n, prompts = 4, 3
    channel = dock_channel(prompts, n)   # the round trip's dock
    groups = sample_groups(prompts, n, seed=5)
    indexes = channel.put_groups(groups)
    rewards = [float((i * 7) % 5) for i in range(prompts * n)]
    dock = channel.handle
    ray.get(dock.put_experience.remote(data_dict={"rm_scores": [torch.tensor([r]) for r in rewards]},
                                       indexes=indexes))
    # A Ray task in MindSpeed-RL (the trainer launches it so), reading and writing the dock.
    ray.get(compute_advantage.remote(dock, gamma=1.0, lam=0.95, adv_estimator="group_norm", experience_count=n,
                                     tokenizer=SimpleNamespace(pad=0, eod=0), global_batch_size=prompts,
                                     guarantee_order=False, n_sample_per_prompt=n))
    batch, index = ray.get(dock.get_experience.remote("actor_train", ["advantages", "response_length"],
                                                      indexes=indexes))
    theirs = [float(batch["advantages"][i][0]) for i in range(len(index))]
    ours = group_advantages(rewards, [i // n for i in range(prompts * n)])
    for g in range(prompts):
        block = rewards[g * n:(g + 1) * n]
        mean = sum(block) / n
        std0 = math.sqrt(sum((r - mean) ** 2 for r in block) / n)
        std1 = math.sqrt(sum((r - mean) ** 2 for r in block) / (n - 1))
        for k in range(n):
            i = g * n + k
            want = ours[i] * (std0 + 1e-6) / (std1 + 1e-6)
            expect(abs(theirs[i] - want) < 1e-5, f"row {i}: MindSpeed-RL {theirs[i]}, ours rescaled {want}")
    # algo.adv_std=sample (what an imported job gets): MindSpeed-RL's advantages exactly; the
    # population std makes ours larger by sqrt(n / (n - 1)).
    sample = group_advantages(rewards, [i // n for i in range(prompts * n)], ddof=1)
    expect(all(abs(t - s) < 1e-5 for t, s in zip(theirs, sample)), f"ddof=1: {theirs} vs {sample}")
    expect(all(abs(o) >= abs(t) for o, t in zip(ours, theirs)), "population-std advantages are the larger ones")
    # Every token of a response carries its row's advantage.
    lengths = [int(x) for x in batch["response_length"].reshape(-1)]
    expect(all(torch.allclose(batch["advantages"][i][:lengths[i]], batch["advantages"][i][0].expand(lengths[i]))
               for i in range(len(index))), "per-token advantages differ within a response")
    channel.clear()
    ray.kill(dock)   # its last user
    del DOCKS[prompts, n]


@check
def transfer_queue_round_trip():
    from mindspeed_rl_asp.integrations.mindspeed.queue import make_channel

    channel = make_channel("transfer_queue", 3, 2)
    for step in range(2):
        groups = sample_groups(3, 2, seed=10 + step)
        channel.put_groups(groups)
        same_groups(channel.get_groups(), groups)
        channel.clear()

