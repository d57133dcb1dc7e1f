"""Megatron <-> Hugging Face weight map (integrations/mindspeed/weight_map.py), on CPU."""
import pytest
import torch

from mindspeed_rl_asp.integrations.mindspeed.weight_map import (
    MegatronRank, ModelShape, Parallel, WeightMapError, fuse_qkv, hf_to_megatron, megatron_name_of,
    megatron_to_hf, split_qkv, stage_layers, vllm_fused_name)


def random_hf(shape: ModelShape, seed: int = 0) -> dict:
    """A random Hugging Face state dict of ``shape`` (Qwen2 / Qwen3 / Qwen3-MoE names)."""
    g = torch.Generator().manual_seed(seed)
    h, hd = shape.hidden_size, shape.head_dim

    def r(*dims):
        return torch.randn(*dims, generator=g)

    sd = {"model.embed_tokens.weight": r(shape.vocab_size, h), "model.norm.weight": r(h)}
    if not shape.tie_word_embeddings:
        sd["lm_head.weight"] = r(shape.vocab_size, h)
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        sd |= {p + "input_layernorm.weight": r(h), p + "post_attention_layernorm.weight": r(h),
               p + "self_attn.q_proj.weight": r(shape.num_attention_heads * hd, h),
               p + "self_attn.k_proj.weight": r(shape.num_key_value_heads * hd, h),
               p + "self_attn.v_proj.weight": r(shape.num_key_value_heads * hd, h),
               p + "self_attn.o_proj.weight": r(h, shape.num_attention_heads * hd)}
        if shape.qkv_bias:
            sd |= {p + "self_attn.q_proj.bias": r(shape.num_attention_heads * hd),
                   p + "self_attn.k_proj.bias": r(shape.num_key_value_heads * hd),
                   p + "self_attn.v_proj.bias": r(shape.num_key_value_heads * hd)}
        if shape.qk_norm:
            sd |= {p + "self_attn.q_norm.weight": r(hd), p + "self_attn.k_norm.weight": r(hd)}
        if shape.num_experts:
            f = shape.moe_intermediate_size
            sd[p + "mlp.gate.weight"] = r(shape.num_experts, h)
            for e in range(shape.num_experts):
                sd |= {p + f"mlp.experts.{e}.gate_proj.weight": r(f, h), p + f"mlp.experts.{e}.up_proj.weight": r(f, h),
                       p + f"mlp.experts.{e}.down_proj.weight": r(h, f)}
        else:
            f = shape.intermediate_size
            sd |= {p + "mlp.gate_proj.weight": r(f, h), p + "mlp.up_proj.weight": r(f, h),
                   p + "mlp.down_proj.weight": r(h, f)}
    return sd


QWEN3 = ModelShape(num_layers=3, hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   vocab_size=30, intermediate_size=24, qk_norm=True)
QWEN2 = ModelShape(num_layers=2, hidden_size=16, num_attention_heads=8, num_key_value_heads=2, head_dim=4,
                   vocab_size=32, intermediate_size=24, qkv_bias=True, padded_vocab_size=40)
MOE = ModelShape(num_layers=2, hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                 vocab_size=32, num_experts=8, moe_intermediate_size=6, qk_norm=True)


def assert_same(a: dict, b: dict):
    assert sorted(a) == sorted(b), (sorted(set(a) ^ set(b)))[:5]
    for name in a:
        assert a[name].shape == b[name].shape, name
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("shape,parallel", [
    (QWEN3, Parallel()), (QWEN3, Parallel(tp=2)), (QWEN3, Parallel(tp=2, pp=2)), (QWEN3, Parallel(pp=3)),
    (QWEN2, Parallel(tp=2)), (QWEN2, Parallel(tp=2, pp=2)),
    (MOE, Parallel(ep=2)), (MOE, Parallel(tp=2, ep=2)), (MOE, Parallel(tp=2, ep=2, moe_tp_extend_ep=True)),
    (MOE, Parallel(tp=2, pp=2, ep=4)),
])
def test_round_trip_is_exact(shape, parallel):
    hf = random_hf(shape)
    shards = hf_to_megatron(hf, shape, parallel)
    assert sorted(shards) == parallel.ranks()
    assert_same(megatron_to_hf(shards, shape, parallel), hf)


def test_qkv_is_interleaved_per_query_group():
    # 4 query heads in 2 groups, head_dim 1: rows are q0 q1 k0 v0 | q2 q3 k1 v1.
    shape = ModelShape(num_layers=1, hidden_size=1, num_attention_heads=4, num_key_value_heads=2, head_dim=1,
                       vocab_size=1)
    q, k, v = torch.tensor([[0.], [1.], [2.], [3.]]), torch.tensor([[10.], [11.]]), torch.tensor([[20.], [21.]])
    qkv = fuse_qkv(q, k, v, shape)
    assert qkv.flatten().tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    # A TP rank holds whole groups: rank 1 of 2 is q2 q3 k1 v1.
    q1, k1, v1 = split_qkv(qkv.chunk(2)[1], shape, tp=2)
    assert q1.flatten().tolist() == [2, 3] and k1.flatten().tolist() == [11] and v1.flatten().tolist() == [21]


def test_gqa_shapes_per_tp_rank():
    shards = hf_to_megatron(random_hf(QWEN3), QWEN3, Parallel(tp=2))
    rank = shards[MegatronRank(tp=1)]
    # 2 query groups / 2 ranks = 1 group per rank: (2 query + 1 key + 1 value heads) x head_dim 8.
    assert rank["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (32, 16)
    assert rank["decoder.layers.0.self_attention.linear_proj.weight"].shape == (16, 16)   # row: 4 heads x 8 / 2
    assert rank["decoder.layers.0.mlp.linear_fc1.weight"].shape == (24, 16)              # [gate; up] halves
    assert rank["decoder.layers.0.mlp.linear_fc2.weight"].shape == (16, 12)
    assert rank["embedding.word_embeddings.weight"].shape == (15, 16)
    assert rank["decoder.layers.0.self_attention.q_layernorm.weight"].shape == (8,)


def test_fc1_rank_is_its_gate_slice_then_its_up_slice():
    hf = random_hf(QWEN3)
    shards = hf_to_megatron(hf, QWEN3, Parallel(tp=2))
    fc1 = shards[MegatronRank(tp=1)]["decoder.layers.1.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:12], hf["model.layers.1.mlp.gate_proj.weight"][12:])
    assert torch.equal(fc1[12:], hf["model.layers.1.mlp.up_proj.weight"][12:])


def test_grouped_experts_layout():
    hf = random_hf(MOE)
    shards = hf_to_megatron(hf, MOE, Parallel(ep=2))
    w1 = shards[MegatronRank(ep=1)]["decoder.layers.0.mlp.experts.weight1"]
    w2 = shards[MegatronRank(ep=1)]["decoder.layers.0.mlp.experts.weight2"]
    assert w1.shape == (16, 4 * 2 * 6) and w2.shape == (4 * 6, 16)
    # Expert 5 is local expert 1 of EP rank 1; GroupedMLP views weight1 as [El, hidden, 2F].
    view = w1.view(4, 16, -1)[1]
    assert torch.equal(view[:, :6], hf["model.layers.0.mlp.experts.5.gate_proj.weight"].t())
    assert torch.equal(view[:, 6:], hf["model.layers.0.mlp.experts.5.up_proj.weight"].t())
    assert torch.equal(w2.view(4, 6, 16)[1], hf["model.layers.0.mlp.experts.5.down_proj.weight"].t())


def test_pipeline_stages_number_layers_locally():
    shards = hf_to_megatron(random_hf(QWEN3), QWEN3, Parallel(pp=2))
    first, last = shards[MegatronRank(pp=0)], shards[MegatronRank(pp=1)]
    assert "embedding.word_embeddings.weight" in first and "output_layer.weight" in last
    assert "decoder.final_layernorm.weight" in last and "decoder.final_layernorm.weight" not in first
    assert {n.split(".")[2] for n in first if n.startswith("decoder.layers")} == {"0", "1"}
    assert {n.split(".")[2] for n in last if n.startswith("decoder.layers")} == {"0"}
    assert stage_layers(3, 2) == [range(0, 2), range(2, 3)]


def test_padded_vocab_is_cut_back():
    shards = hf_to_megatron(random_hf(QWEN2), QWEN2, Parallel(tp=2))
    assert shards[MegatronRank(tp=0)]["embedding.word_embeddings.weight"].shape == (20, 16)   # 40 padded / 2
    assert torch.count_nonzero(shards[MegatronRank(tp=1)]["output_layer.weight"][12:]) == 0   # the padding rows


def test_names():
    assert megatron_name_of("model.layers.3.self_attn.k_proj.weight") == "decoder.layers.3.self_attention.linear_qkv.weight"
    assert megatron_name_of("model.layers.0.mlp.experts.7.down_proj.weight") == "decoder.layers.0.mlp.experts.weight2"
    assert megatron_name_of("lm_head.weight") == "output_layer.weight"
    assert vllm_fused_name("model.layers.2.mlp.up_proj.weight") == "model.layers.2.mlp.gate_up_proj.weight"
    assert vllm_fused_name("model.layers.0.mlp.experts.3.gate_proj.weight") == "model.layers.0.mlp.experts.w13_weight"


def test_bad_input_names_the_problem():
    with pytest.raises(WeightMapError, match="num_key_value_heads=2 is not divisible by tp=4"):
        hf_to_megatron(random_hf(QWEN3), QWEN3, Parallel(tp=4))
    hf = random_hf(QWEN3)
    del hf["model.layers.1.self_attn.v_proj.weight"]
    with pytest.raises(WeightMapError, match="model.layers.1.self_attn.v_proj.weight"):
        hf_to_megatron(hf, QWEN3)
    with pytest.raises(WeightMapError, match="no state dict for Megatron ranks"):
        megatron_to_hf({MegatronRank(): {}}, QWEN3, Parallel(tp=2))
    with pytest.raises(WeightMapError, match="not a Qwen2 / Qwen3"):
        megatron_name_of("transformer.h.0.attn.c_attn.weight")


def test_random_qwen3_checkpoint_round_trips_through_tp2(tmp_path):
    """A real transformers Qwen3 (tests/hf_random.py) -> Megatron TP=2 -> HF, exactly."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from hf_random import save_random_checkpoint

    path = save_random_checkpoint(tmp_path / "qwen3", family="qwen3")
    config = AutoConfig.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    hf = {k: v.detach().clone() for k, v in model.state_dict().items()}
    shape = ModelShape.from_hf_config(config)
    assert shape.qk_norm and shape.num_key_value_heads == 2 and shape.head_dim == 8
    shards = hf_to_megatron(hf, shape, Parallel(tp=2))
    back = megatron_to_hf(shards, shape, Parallel(tp=2))
    assert_same(back, hf)
    # And the model loads it back unchanged (names and shapes are the checkpoint's).
    result = model.load_state_dict(back, strict=True)
    assert not result.missing_keys and not result.unexpected_keys


def test_saved_qwen3_moe_checkpoint_round_trips_through_tp2_ep2(tmp_path):
    """A real transformers Qwen3-MoE, as save_pretrained writes it (per-expert names; in
    memory transformers fuses the experts) -> Megatron TP=2 x EP=2 -> HF, exactly."""
    from safetensors.torch import load_file
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(vocab_size=40, hidden_size=16, intermediate_size=24, moe_intermediate_size=6,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            num_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)
    Qwen3MoeForCausalLM(config).save_pretrained(tmp_path, safe_serialization=True)
    hf = {}
    for file in sorted(tmp_path.glob("*.safetensors")):
        hf.update(load_file(file))
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in hf
    shape = ModelShape.from_hf_config(config)
    assert shape.num_experts == 4 and shape.qk_norm
    parallel = Parallel(tp=2, ep=2)
    assert_same(megatron_to_hf(hf_to_megatron(hf, shape, parallel), shape, parallel), hf)


def test_tied_embeddings_have_no_output_layer():
    shape = ModelShape(num_layers=1, hidden_size=8, num_attention_heads=4, num_key_value_heads=2, head_dim=2,
                       vocab_size=10, intermediate_size=8, tie_word_embeddings=True)
    hf = random_hf(shape)
    shards = hf_to_megatron(hf, shape, Parallel(tp=2))
    assert all("output_layer.weight" not in state for state in shards.values())
    assert_same(megatron_to_hf(shards, shape, Parallel(tp=2)), hf)
