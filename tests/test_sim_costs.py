"""Cost models: hand-computed cases, monotonicity (hypothesis), the memory/compute
crossover, and errors that name the bad argument or config key."""
import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.sim import costs
from mindspeed_rl_asp.sim.profiles import (
    GIB, ProfileError, engine_profile_from_config, hardware_profile_from_config, model_profile_from_config,
)


def profiles(model: str, hardware: str = "ascend910b3", engine: str = "mindspeed"):
    cfg = load_config([f"model={model}", f"hardware={hardware}", f"engine={engine}", "layout=ascend910b3_t4g4"])
    return (model_profile_from_config(cfg.model), hardware_profile_from_config(cfg.hardware),
            engine_profile_from_config(cfg.engine))


MOE, ASCEND, MINDSPEED = profiles("qwen3_30b_a3b")
DENSE, _, _ = profiles("qwen3_32b")
H200 = profiles("qwen3_32b", hardware="h200", engine="vllm")[1]
VLLM = profiles("qwen3_32b", hardware="h200", engine="vllm")[2]

# The 910B3 numbers the hand-computed cases use (configs/hardware/ascend910b3.yaml).
BW_EFF = 8 * 1.6e12 * 0.81        # 8 devices x 1.6 TB/s x bandwidth efficiency
FLOPS_EFF = 8 * 313e12 * 0.5      # 8 devices x 313 TFLOPS x compute efficiency
# The roofline alone: a fitted engine adds one constant per step (30 ms here).
FITTED = dataclasses.replace(MINDSPEED, execution="fitted", decode_step_overhead=0.03)


# ------------------------------------------------------------------ distinct experts


def test_distinct_experts_by_hand():
    assert costs.expected_distinct_experts(128, 8, 0) == 0
    assert costs.expected_distinct_experts(128, 8, 1) == pytest.approx(8)
    assert costs.expected_distinct_experts(128, 8, 2) == pytest.approx(128 * (1 - (120 / 128) ** 2))  # 15.5
    assert costs.expected_distinct_experts(128, 8, 64) == pytest.approx(128 * (1 - 0.9375 ** 64))  # 125.9
    assert costs.expected_distinct_experts(0, 0, 64) == 0  # dense
    assert costs.expected_distinct_experts(8, 8, 3) == 8   # every token takes every expert


@settings(max_examples=200, deadline=None)
@given(experts=st.integers(1, 512), data=st.data(), tokens=st.integers(1, 5000))
def test_distinct_experts_lie_between_k_and_e_and_grow_with_the_batch(experts, data, tokens):
    k = data.draw(st.integers(1, experts))
    hit = costs.expected_distinct_experts(experts, k, tokens)
    more = costs.expected_distinct_experts(experts, k, tokens + 1)
    assert k - 1e-9 <= hit <= experts + 1e-9
    assert more >= hit
    if experts - hit > 1e-6:  # strictly, until the float saturates at E
        assert more > hit


# ------------------------------------------------------------------- decode step


def test_dense_decode_step_by_hand():
    # Qwen3-32B weights less the untied input embedding (looked up, not streamed) + 1000 cached tokens
    bytes_read = 65_524_246_528 - 151_936 * 5120 * 2 + 1000 * 262_144
    assert costs.decode_bytes_read(DENSE, 1, 1000) == bytes_read
    memory = bytes_read / BW_EFF                           # 6.19 ms
    compute = 2 * DENSE.matmul_params * 1 / FLOPS_EFF      # 0.05 ms
    assert costs.decode_step_time(DENSE, ASCEND, FITTED, 8, 1, 1000) == pytest.approx(0.03 + max(memory, compute))
    assert memory == pytest.approx(6.190e-3, rel=1e-3)


def test_eager_dense_step_by_hand():
    """Qwen3-32B, TP 8 on 8 x 910B3, batch 1, 1000 cached tokens, vllm-ascend eager
    (configs/engine/mindspeed.yaml): the host launches 64 x (9 + 3 + 2) + 15 = 911
    operators at 41.6 us = 37.9 ms, longer than the device's 6.19 ms of memory plus
    3.21 ms of all-reduces (2 per layer, 25 us + 2 x 7/8 x 10240 B / 392 GB/s each),
    so the step is host-bound: 4 ms fixed + 14 us for the one sequence + 37.9 ms."""
    assert costs.operators_per_step(DENSE, MINDSPEED, costs.parallel_of(DENSE, 8)) == 911
    allreduce = 25e-6 + 2 * 7 / 8 * 5120 * 2 / 392e9
    comm = 64 * 2 * allreduce
    assert costs.decode_comm_time(DENSE, ASCEND, costs.parallel_of(DENSE, 8), 1) == pytest.approx(comm)
    host = 911 * 41.6e-6
    device = (65_524_246_528 - 151_936 * 5120 * 2 + 1000 * 262_144) / BW_EFF + comm
    assert host > device
    assert costs.decode_step_time(DENSE, ASCEND, MINDSPEED, 8, 1, 1000) == pytest.approx(0.004 + 14e-6 + host)
    # Graph replay: no launches on the host, 6.35 us per operator on the device.
    graph = dataclasses.replace(MINDSPEED, execution="graph")
    assert costs.decode_step_time(DENSE, ASCEND, graph, 8, 1, 1000) == pytest.approx(
        0.004 + 14e-6 + device + 911 * 6.35e-6)


def test_eager_moe_step_with_data_parallel_attention_by_hand():
    """Qwen3-30B-A3B as MindSpeed-RL serves it (TP 1, EP 8: 8 attention replicas), 64
    sequences: each device reads all dense weights, an eighth of the experts the batch
    hits and an eighth of the cache; 8 tokens per device go to 8 experts each in a
    dispatch and a combine per layer; 48 x (9 + 9 + 2) + 15 = 975 launches."""
    par = costs.parallel_of(MOE, 8, tp=1, ep=8)
    assert par.dp == 8 and costs.operators_per_step(MOE, MINDSPEED, par) == 975
    hit = costs.expected_distinct_experts(128, 8, 64)
    per_device = (1_541_093_376 - 151_936 * 2048) * 2 + 48 * hit * 3 * 2048 * 768 * 2 / 8 + 64_000 * 98_304 / 8
    memory = per_device / (1.6e12 * 0.81)
    alltoall = 25e-6 + 7 / 8 * (64 / 8) * 8 * 2048 * 2 / 392e9
    comm = 48 * 2 * alltoall
    assert costs.decode_comm_time(MOE, ASCEND, par, 64) == pytest.approx(comm)
    host = 975 * 41.6e-6
    expected = 0.004 + 14e-6 * 64 / 8 + comm + max(memory, host - comm)
    assert costs.decode_step_time(MOE, ASCEND, MINDSPEED, 8, 64, 64_000, tp=1, ep=8) == pytest.approx(expected)
    # Sharding the dense weights too (TP 8) reads less per device.
    assert costs.decode_memory_time(MOE, ASCEND, 8, 64, 64_000) < memory


def test_moe_decode_step_reads_only_the_experts_the_batch_hits():
    embedding = 151_936 * 2048 * 2                        # untied input table: looked up, not streamed
    dense_bytes = 1_541_093_376 * 2 - embedding
    expert_bytes = 3 * 2048 * 768 * 2
    one_token = dense_bytes + 48 * 8 * expert_bytes       # a single token touches k=8 experts per layer
    assert costs.decode_bytes_read(MOE, 1, 0) == pytest.approx(one_token)
    assert costs.decode_memory_time(MOE, ASCEND, 8, 1, 0) == pytest.approx(one_token / BW_EFF)  # 0.59 ms
    every_expert = dense_bytes + 48 * 128 * expert_bytes
    assert costs.decode_bytes_read(MOE, 4096, 0) == pytest.approx(every_expert, rel=1e-9)  # all but the table
    assert every_expert == MOE.weight_bytes - embedding


@pytest.mark.parametrize("model", [MOE, DENSE], ids=["moe", "dense"])
@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 2048), more=st.integers(0, 512), kv=st.integers(0, 2_000_000), extra=st.integers(0, 100_000))
def test_step_time_never_falls_with_batch_or_cache(model, batch, more, kv, extra):
    step = costs.decode_step_time(model, ASCEND, MINDSPEED, 8, batch, kv)
    assert costs.decode_step_time(model, ASCEND, MINDSPEED, 8, batch + more, kv) >= step
    assert costs.decode_step_time(model, ASCEND, MINDSPEED, 8, batch, kv + extra) >= step


def test_more_devices_never_make_a_step_slower():
    assert (costs.decode_step_time(DENSE, H200, VLLM, 8, 64, 64_000)
            < costs.decode_step_time(DENSE, H200, VLLM, 4, 64, 64_000))


def test_dense_crossover_is_where_the_roofline_says():
    # Without a cache a dense step reads the same bytes at every batch, so it turns
    # compute-bound at b* = ceil(weight bytes x compute / (2 x matmul params x bandwidth)).
    expected = math.ceil(DENSE.decode_dense_bytes * FLOPS_EFF / (2 * DENSE.matmul_params * BW_EFF))
    crossover = costs.decode_crossover_batch(DENSE, ASCEND, 8)
    assert crossover == expected == 121
    below = costs.decode_memory_time(DENSE, ASCEND, 8, crossover - 1, 0)
    assert costs.decode_compute_time(DENSE, ASCEND, 8, crossover - 1) < below
    assert costs.decode_compute_time(DENSE, ASCEND, 8, crossover) >= costs.decode_memory_time(DENSE, ASCEND, 8,
                                                                                            crossover, 0)
    # A step of batch b* - 1 costs (nearly) the same as one of batch 1; past b* it grows linearly.
    step = lambda b: costs.decode_step_time(DENSE, ASCEND, FITTED, 8, b, 0)  # noqa: E731
    assert step(crossover - 1) == pytest.approx(step(1))
    assert step(4 * crossover) - step(2 * crossover) == pytest.approx(2 * (step(2 * crossover) - step(crossover)))


def test_moe_crossover_comes_later_than_dense_and_long_caches_can_prevent_it():
    moe = costs.decode_crossover_batch(MOE, ASCEND, 8)
    assert moe > costs.decode_crossover_batch(DENSE, ASCEND, 8)  # few FLOPs per byte of expert weights
    assert costs.decode_compute_time(MOE, ASCEND, 8, moe) >= costs.decode_memory_time(MOE, ASCEND, 8, moe, 0)
    assert costs.decode_compute_time(MOE, ASCEND, 8, moe - 1) < costs.decode_memory_time(MOE, ASCEND, 8, moe - 1, 0)
    # 1500 cached tokens per sequence add 147 MB of KV reads per sequence against 6 GFLOP:
    # the step stays memory-bound at every batch.
    assert costs.decode_crossover_batch(MOE, ASCEND, 8, kv_tokens_per_sequence=1500, max_batch=4096) == 4097


# ------------------------------------------------------------------ other costs


def test_prefill_is_compute_bound_for_real_prompts():
    tokens = 64 * 512
    assert costs.prefill_time(DENSE, ASCEND, 8, tokens) == pytest.approx(2 * DENSE.matmul_params * tokens / FLOPS_EFF)
    # One token cannot beat one read of the weights.
    assert costs.prefill_time(DENSE, ASCEND, 8, 1) == pytest.approx(DENSE.decode_dense_bytes / BW_EFF)


def test_kv_capacity_by_hand():
    usable = 8 * 64 * GIB * 0.8
    assert costs.kv_capacity_tokens(DENSE, ASCEND, MINDSPEED, 8, 2560) == math.floor(
        (usable - 65_524_246_528) / 262_144) == 1_427_766


def test_an_instance_too_small_for_the_weights_names_the_layout_key():
    with pytest.raises(ProfileError) as info:
        costs.kv_capacity_tokens(DENSE, ASCEND, MINDSPEED, 1, 2560)
    message = str(info.value)
    assert message.startswith("layout.infer_instance_size=1: 1 x 64 GiB (ascend910b3)")
    assert "Qwen3-32B's 61.0 GiB of weights plus one sequence of 2560 tokens" in message
    assert "use layout.infer_instance_size >= 2" in message
    assert costs.kv_capacity_tokens(DENSE, ASCEND, MINDSPEED, 2, 2560) >= 2560


def test_a_sequence_longer_than_the_cache_is_refused():
    with pytest.raises(ProfileError, match="use layout.infer_instance_size >= 9"):
        costs.kv_capacity_tokens(DENSE, ASCEND, MINDSPEED, 8, 1_500_000)


def test_training_time_by_hand():
    tokens = 32 * 8 * 2560
    expected = (6 + 2 * 2) * DENSE.matmul_params * tokens / (32 * 313e12 * 0.35)
    assert costs.training_time(DENSE, ASCEND, 32, tokens, extra_forwards=2) == pytest.approx(expected)
    assert costs.training_time(DENSE, ASCEND, 32, tokens) == pytest.approx(expected * 6 / 10)


def test_weight_transfer_by_hand():
    assert costs.weight_transfer_time(100e9, 50e9, 1.5) == pytest.approx(3.5)
    # A refresh converts every tensor: Qwen3-30B-A3B has 48 x (8 + 1 + 384) + 3 of them.
    assert MOE.num_tensors == 48 * (8 + 1 + 3 * 128) + 3 == 18_867
    assert DENSE.num_tensors == 64 * 11 + 3
    assert costs.publish_time(MOE, MINDSPEED) == pytest.approx(0.15 + 18_867 * 848e-6)
    # Rank 0's one 25 GB/s port feeds an 8-NPU instance (200 GB/s of its own links).
    assert costs.load_bandwidth(ASCEND, MINDSPEED, 8, 25e9) == pytest.approx(25e9)
    assert costs.load_bandwidth(ASCEND, MINDSPEED, 8, 25e9, concurrent=4) == pytest.approx(25e9 / 4)
    assert costs.load_bandwidth(ASCEND, FITTED.__class__(**{**FITTED.__dict__, "weight_sync_senders": 0}), 8,
                                25e9) == pytest.approx(200e9)


def test_training_with_attention_recompute_and_gradient_sync_by_hand():
    # One sequence of Qwen3-30B-A3B: attention is 2 x 48 x 32 x 128 x L^2 per forward, 6 % of
    # the weights' 2 x matmul x L at 1K tokens and 60 % at 9K (issue 18's figures).
    for L, share in ((1024, 0.066), (9216, 0.60)):
        weights = 2 * MOE.matmul_params * L
        attention = 2 * 48 * 32 * 128 * L * L
        assert attention / weights == pytest.approx(share, abs=0.01)
    assert costs.training_flops(MOE, L, 1, L * L) == pytest.approx(4 * (weights + attention))
    assert costs.training_flops(MOE, L, 0, L * L, recompute=True) == pytest.approx(4 * (weights + attention))
    # Data parallel: 32 devices at TP 8 x PP 2 are 2 DP ranks; each reduces its 1/16 of the
    # bf16 gradients across nodes (50 us + 2 x 1/2 x bytes / 25 GB/s), none of it hidden.
    grad = DENSE.total_params / 16 * 2
    assert costs.gradient_sync_time(DENSE, ASCEND, 32, 8, 2, 1, 0.0) == pytest.approx(50e-6 + grad / 25e9)
    assert costs.gradient_sync_time(DENSE, ASCEND, 32, 8, 2, 1, 0.5) == pytest.approx((50e-6 + grad / 25e9) / 2)
    assert costs.gradient_sync_time(DENSE, ASCEND, 16, 8, 2, 1, 0.0) == 0.0


def test_hybrid_offload_bytes_by_hand():
    # Qwen3-30B-A3B trained on 64 NPUs at TP 4 / EP 2: a device holds the dense part / 4 and
    # the experts / 8; it offloads bf16 params + fp32 grads of that share and 12 bytes per
    # parameter of optimizer state split over the 16 data-parallel ranks.
    share = 1_541_093_376 / 4 + (30_532_122_624 - 1_541_093_376) / 8
    assert costs.offload_bytes_per_device(MOE, 64, 4, 1, 2) == pytest.approx(share * 6 + share * 12 / 16)


@pytest.mark.parametrize(
    "call,expected",
    [
        (lambda: costs.decode_step_time(DENSE, ASCEND, MINDSPEED, 8, 0, 0), "batch=0 must be >= 1"),
        (lambda: costs.decode_step_time(DENSE, ASCEND, MINDSPEED, 0, 1, 0), "devices=0 must be >= 1"),
        (lambda: costs.decode_bytes_read(DENSE, 1, -5), "kv_tokens=-5 must be >= 0"),
        (lambda: costs.expected_distinct_experts(8, 9, 1), "experts_per_token=9 must be in [1, num_experts=8]"),
        (lambda: costs.training_time(DENSE, ASCEND, 8, 10, extra_forwards=-1), "extra_forwards=-1 must be >= 0"),
        (lambda: costs.weight_transfer_time(1.0, 0.0, 0.0), "bandwidth=0.0 must be > 0"),
    ],
)
def test_bad_arguments_are_named(call, expected):
    with pytest.raises(ValueError) as info:
        call()
    assert expected in str(info.value)


def test_a_first_principles_profile_without_a_number_names_the_key():
    cfg = load_config(["model=qwen3_30b_a3b", "hardware=ascend910b3", "engine=mindspeed", "layout=ascend910b3_t4g4",
                       "engine.op_launch_us=0", "engine.dp_comm_overlap=1.5"])
    from omegaconf import OmegaConf

    engine = OmegaConf.to_container(cfg.engine)
    del engine["sources"]["per_sequence_us"]
    with pytest.raises(ProfileError) as info:
        engine_profile_from_config(engine)
    message = str(info.value)
    assert "engine.op_launch_us=0.0 must be > 0" in message
    assert "engine.sources.per_sequence_us is missing" in message
    assert "engine.dp_comm_overlap=1.5 must be a share in [0, 1]" in message


def test_a_hardware_number_a_run_needs_is_named_when_absent():
    from mindspeed_rl_asp.sim.run import setup_from_config

    cfg = load_config(["experiment=table3_qwen3_30b_a3b_hybrid", "hardware.host_link_bandwidth_gbs=null"])
    with pytest.raises(ProfileError, match="hardware.host_link_bandwidth_gbs is missing: hybrid offload"):
        setup_from_config(cfg)
