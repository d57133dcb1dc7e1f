"""Megatron (MindSpeed-RL) <-> Hugging Face parameter mapping for Qwen2 / Qwen3 / Qwen3-MoE.

Pure torch over plain state dicts (name -> tensor): no Megatron, no process group. The
Training Unit of ``engine=mindspeed`` gathers its ranks' shards, maps them here to the
Hugging Face names and shapes our generation engines load (vLLM fuses them again inside
its own ``load_weights``), and sends that through the weight transport.

The Megatron side is the layout MindSpeed-RL trains (read from its source, not run):

* names of Megatron-core's "local" GPT layer spec that MindSpeed-RL's weight adaptors map
  (``workers/resharding/weight_adaptor.py``: ``embedding.word_embeddings``,
  ``decoder.layers.{i}.self_attention.linear_qkv``, ``...linear_proj``,
  ``...input_layernorm``, ``...pre_mlp_layernorm``, ``...mlp.linear_fc1`` / ``linear_fc2``,
  ``...self_attention.q_layernorm`` / ``k_layernorm`` (Qwen3), ``...mlp.router``,
  ``...mlp.experts.weight1`` / ``weight2`` (grouped GEMM), ``decoder.final_layernorm``,
  ``output_layer``);
* fused QKV interleaved per query group: for each of the ``num_key_value_heads`` groups,
  its ``heads / groups`` query heads, then its key head, then its value head (the split
  MindSpeed-RL's ``qkv_split_weight`` / ``qkv_split_bias`` undo in
  ``models/rollout/vllm_adapter/megatron_weight_loaders.py``); a TP rank holds a
  contiguous run of whole groups;
* ``linear_fc1`` = [gate; up] per TP rank, each rank its slice of both (the order
  ``_default_tp_concat_fn`` in ``vllm_weight_container.py`` re-assembles);
* column-parallel (split on dim 0): ``linear_qkv``, ``linear_fc1``, the embedding and the
  output layer (vocab-parallel, padded to ``padded_vocab_size``); row-parallel (dim 1):
  ``linear_proj``, ``linear_fc2``; norms, ``q/k_layernorm`` and the router replicated;
* grouped-GEMM experts: ``weight1`` of one expert rank is ``[hidden, local_experts * 2 *
  moe_ffn]`` whose memory, viewed as ``[local_experts, hidden, 2 * moe_ffn]`` (as
  Megatron's GroupedMLP and ``trans_ep_params_to_tp`` view it), holds each expert's
  ``[gate^T | up^T]``; ``weight2`` is ``[local_experts * moe_ffn, hidden]``, viewed as
  ``[local_experts, moe_ffn, hidden]``, each ``down^T``. Experts are split over the
  expert-parallel ranks in order, whole (no expert tensor parallelism). With
  ``moe_tp_extend_ep`` (MindSpeed; MindSpeed-RL's Qwen3-30B-A3B configs set it) the
  TP ranks split the experts too: expert rank = ``ep_rank * tp + tp_rank`` (tensor-
  parallel ranks adjacent, Megatron's rank order; read from the code, not run);
* pipeline stages hold consecutive layers, numbered locally from 0 on each stage
  (``global2local_layer``); the embedding is on the first stage, the final norm and the
  output layer on the last.

``megatron_to_hf(hf_to_megatron(sd)) == sd`` exactly, for every parallel layout
(tests/test_mindspeed_weight_map.py); tests/test_mindspeed_contract.py checks the QKV
split and the name map against MindSpeed-RL's own functions where a checkout is present.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["ModelShape", "Parallel", "MegatronRank", "WeightMapError", "hf_to_megatron", "megatron_to_hf",
           "fuse_qkv", "split_qkv", "megatron_name_of", "stage_layers", "vllm_fused_name"]


class WeightMapError(ValueError):
    """A state dict or a layout the map cannot convert; the message names the key."""


@dataclass(frozen=True)
class ModelShape:
    """The architecture numbers the mapping needs (Hugging Face config names)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int = 0          # dense FFN; 0 when every layer is MoE
    num_experts: int = 0                # 0: dense
    moe_intermediate_size: int = 0
    qk_norm: bool = False               # Qwen3: per-head RMSNorm of q and k
    qkv_bias: bool = False              # Qwen2: biases on q, k, v
    tie_word_embeddings: bool = False
    padded_vocab_size: int = 0          # Megatron's padded vocab (0: vocab_size)

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise WeightMapError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                                 f"num_key_value_heads={self.num_key_value_heads}")
        if self.padded_vocab_size and self.padded_vocab_size < self.vocab_size:
            raise WeightMapError(f"padded_vocab_size={self.padded_vocab_size} < vocab_size={self.vocab_size}")

    @property
    def megatron_vocab(self) -> int:
        return self.padded_vocab_size or self.vocab_size

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_config(cls, config: Any, padded_vocab_size: int = 0) -> "ModelShape":
        """From a transformers config (Qwen2Config, Qwen3Config, Qwen3MoeConfig) or its dict."""
        get = config.get if isinstance(config, Mapping) else lambda key, default=None: getattr(config, key, default)
        model_type = get("model_type", "")
        heads = get("num_attention_heads")
        num_experts = get("num_experts", 0) or 0
        if num_experts and (get("mlp_only_layers") or get("decoder_sparse_step", 1) != 1):
            raise WeightMapError("mixed dense / MoE layers (mlp_only_layers, decoder_sparse_step != 1) are not "
                                 "mapped; every layer must be MoE")
        return cls(num_layers=get("num_hidden_layers"), hidden_size=get("hidden_size"), num_attention_heads=heads,
                   num_key_value_heads=get("num_key_value_heads") or heads,
                   head_dim=get("head_dim") or get("hidden_size") // heads, vocab_size=get("vocab_size"),
                   intermediate_size=get("intermediate_size", 0) or 0, num_experts=num_experts,
                   moe_intermediate_size=get("moe_intermediate_size", 0) or 0,
                   qk_norm=model_type.startswith("qwen3"), qkv_bias=model_type == "qwen2",
                   tie_word_embeddings=bool(get("tie_word_embeddings", False)), padded_vocab_size=padded_vocab_size)


@dataclass(frozen=True)
class Parallel:
    """Megatron's training parallelism: tensor, pipeline, expert."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    moe_tp_extend_ep: bool = False

    def check(self, shape: ModelShape) -> None:
        problems = []
        if shape.num_key_value_heads % self.tp:
            problems.append(f"num_key_value_heads={shape.num_key_value_heads} is not divisible by tp={self.tp}")
        if shape.megatron_vocab % self.tp:
            problems.append(f"the (padded) vocab {shape.megatron_vocab} is not divisible by tp={self.tp}; set "
                            "padded_vocab_size as Megatron pads it")
        for name in ("intermediate_size",):
            if getattr(shape, name) % self.tp:
                problems.append(f"{name}={getattr(shape, name)} is not divisible by tp={self.tp}")
        if shape.num_experts and shape.num_experts % self.expert_ranks:
            problems.append(f"num_experts={shape.num_experts} is not divisible by the {self.expert_ranks} expert "
                            f"ranks (ep={self.ep}{' x tp' if self.moe_tp_extend_ep else ''})")
        if not shape.num_experts and self.ep != 1:
            problems.append(f"ep={self.ep} on a dense model")
        if shape.num_layers < self.pp:
            problems.append(f"pp={self.pp} stages for {shape.num_layers} layers")
        if problems:
            raise WeightMapError("; ".join(problems))

    @property
    def expert_ranks(self) -> int:
        return self.ep * (self.tp if self.moe_tp_extend_ep else 1)

    def expert_rank(self, tp_rank: int, ep_rank: int) -> int:
        return ep_rank * self.tp + tp_rank if self.moe_tp_extend_ep else ep_rank

    def ranks(self) -> list["MegatronRank"]:
        return [MegatronRank(pp, tp, ep) for pp in range(self.pp) for tp in range(self.tp) for ep in range(self.ep)]


@dataclass(frozen=True, order=True)
class MegatronRank:
    pp: int = 0
    tp: int = 0
    ep: int = 0


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """Consecutive global layers of each pipeline stage (Megatron's even split; the first
    ``num_layers % pp`` stages take one more, a convention of this map: Megatron itself
    needs an even split or an explicit ``num_layer_list``)."""
    base, extra = divmod(num_layers, pp)
    stages, start = [], 0
    for stage in range(pp):
        size = base + (1 if stage < extra else 0)
        stages.append(range(start, start + size))
        start += size
    return stages


# ----------------------------------------------------------------------------- fused QKV
def fuse_qkv(q, k, v, shape: ModelShape):
    """Hugging Face q, k, v (weights ``[heads * head_dim, hidden]`` or biases) -> Megatron's
    interleaved ``linear_qkv``: per query group, its query heads, its key, its value."""
    import torch

    groups, per, hd = shape.num_key_value_heads, shape.heads_per_group, shape.head_dim
    tail = q.shape[1:]
    parts = [q.reshape(groups, per * hd, *tail), k.reshape(groups, hd, *tail), v.reshape(groups, hd, *tail)]
    return torch.cat(parts, dim=1).reshape(groups * (per + 2) * hd, *tail)


def split_qkv(qkv, shape: ModelShape, tp: int = 1):
    """The inverse of :func:`fuse_qkv`; ``tp`` > 1: ``qkv`` is one TP rank's slice (its
    ``num_key_value_heads / tp`` groups), as MindSpeed-RL's ``qkv_split_weight`` reads it."""
    groups, per, hd = shape.num_key_value_heads // tp, shape.heads_per_group, shape.head_dim
    tail = qkv.shape[1:]
    if qkv.shape[0] != groups * (per + 2) * hd:
        raise WeightMapError(f"linear_qkv has {qkv.shape[0]} rows; {groups} query groups x ({per} + 2) heads x "
                             f"{hd} head_dim = {groups * (per + 2) * hd} expected")
    grouped = qkv.reshape(groups, (per + 2) * hd, *tail)
    q = grouped[:, : per * hd].reshape(groups * per * hd, *tail)
    k = grouped[:, per * hd: (per + 1) * hd].reshape(groups * hd, *tail)
    v = grouped[:, (per + 1) * hd:].reshape(groups * hd, *tail)
    return q, k, v


# ----------------------------------------------------------------------------- names
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")

# Hugging Face layer suffix -> (Megatron layer suffix, how TP splits it)
_LAYER_PARAMS = {
    "input_layernorm.weight": ("input_layernorm.weight", "replicated"),
    "self_attn.o_proj.weight": ("self_attention.linear_proj.weight", "row"),
    "self_attn.q_norm.weight": ("self_attention.q_layernorm.weight", "replicated"),
    "self_attn.k_norm.weight": ("self_attention.k_layernorm.weight", "replicated"),
    "post_attention_layernorm.weight": ("pre_mlp_layernorm.weight", "replicated"),
    "mlp.down_proj.weight": ("mlp.linear_fc2.weight", "row"),
    "mlp.gate.weight": ("mlp.router.weight", "replicated"),
}
_GLOBAL_PARAMS = {
    "model.embed_tokens.weight": "embedding.word_embeddings.weight",
    "model.norm.weight": "decoder.final_layernorm.weight",
    "lm_head.weight": "output_layer.weight",
}
# The Hugging Face names that fuse into one Megatron tensor.
_QKV = {"weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        "bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")}
_GATE_UP = ("mlp.gate_proj.weight", "mlp.up_proj.weight")


def megatron_name_of(hf_name: str) -> str:
    """The Megatron (global layer number) name a Hugging Face tensor lives in: several HF
    tensors (q/k/v, gate/up, every expert) map to one fused Megatron tensor."""
    if hf_name in _GLOBAL_PARAMS:
        return _GLOBAL_PARAMS[hf_name]
    match = _LAYER.match(hf_name)
    if not match:
        raise WeightMapError(f"{hf_name!r} is not a Qwen2 / Qwen3 / Qwen3-MoE parameter name")
    layer, rest = match.groups()
    prefix = f"decoder.layers.{layer}."
    if rest in _LAYER_PARAMS:
        return prefix + _LAYER_PARAMS[rest][0]
    for kind, names in _QKV.items():
        if rest in names:
            return prefix + f"self_attention.linear_qkv.{kind}"
    if rest in _GATE_UP:
        return prefix + "mlp.linear_fc1.weight"
    expert = _EXPERT.match(rest)
    if expert:
        return prefix + ("mlp.experts.weight2" if expert.group(2) == "down_proj" else "mlp.experts.weight1")
    raise WeightMapError(f"{hf_name!r}: no Megatron parameter known for {rest!r}")


def vllm_fused_name(hf_name: str) -> str:
    """The name vLLM gives the fused tensor ``hf_name`` loads into (``qkv_proj``,
    ``gate_up_proj``, ``experts.w13_weight`` / ``w2_weight``): the names MindSpeed-RL's
    weight adaptors map back to Megatron with ``replace_name_i2t``."""
    name = re.sub(r"self_attn\.[qkv]_proj\.", "self_attn.qkv_proj.", hf_name)
    name = re.sub(r"mlp\.(gate|up)_proj\.", "mlp.gate_up_proj.", name)
    name = re.sub(r"mlp\.experts\.\d+\.(gate|up)_proj\.weight$", "mlp.experts.w13_weight", name)
    return re.sub(r"mlp\.experts\.\d+\.down_proj\.weight$", "mlp.experts.w2_weight", name)


def _local_name(name: str, stages: list[range]) -> tuple[int, str]:
    """(stage, name with the stage-local layer number) of a global Megatron name."""
    match = re.match(r"^decoder\.layers\.(\d+)\.(.+)$", name)
    if not match:
        if name.startswith("embedding."):
            return 0, name
        return len(stages) - 1, name
    layer = int(match.group(1))
    for stage, layers in enumerate(stages):
        if layer in layers:
            return stage, f"decoder.layers.{layer - layers.start}.{match.group(2)}"
    raise WeightMapError(f"{name!r}: layer {layer} is on no pipeline stage")


def _global_name(name: str, stage: int, stages: list[range]) -> str:
    match = re.match(r"^decoder\.layers\.(\d+)\.(.+)$", name)
    if not match:
        return name
    local = int(match.group(1))
    if local >= len(stages[stage]):
        raise WeightMapError(f"{name!r} on pipeline stage {stage}, which holds {len(stages[stage])} layers")
    return f"decoder.layers.{stages[stage].start + local}.{match.group(2)}"


# ----------------------------------------------------------------------------- HF -> Megatron
def _full_megatron(hf: Mapping[str, Any], shape: ModelShape) -> dict[str, tuple[str, Any]]:
    """Global Megatron name -> (TP split kind, the full, unsharded tensor)."""
    import torch

    out: dict[str, tuple[str, Any]] = {}
    for hf_name, mega in _GLOBAL_PARAMS.items():
        if hf_name == "lm_head.weight" and shape.tie_word_embeddings:
            continue
        if hf_name not in hf:
            raise WeightMapError(f"the Hugging Face state dict has no {hf_name!r}")
        tensor = hf[hf_name]
        if hf_name != "model.norm.weight":
            tensor = _pad_vocab(tensor, shape)
        out[mega] = ("vocab" if hf_name != "model.norm.weight" else "replicated", tensor)
    for layer in range(shape.num_layers):
        pre, mpre = f"model.layers.{layer}.", f"decoder.layers.{layer}."

        def take(suffix: str):
            if pre + suffix not in hf:
                raise WeightMapError(f"the Hugging Face state dict has no {pre + suffix!r}")
            return hf[pre + suffix]

        for suffix, (msuffix, kind) in _LAYER_PARAMS.items():
            if pre + suffix in hf:
                out[mpre + msuffix] = (kind, hf[pre + suffix])
        out[mpre + "self_attention.linear_qkv.weight"] = ("column", fuse_qkv(*map(take, _QKV["weight"]), shape))
        if shape.qkv_bias:
            out[mpre + "self_attention.linear_qkv.bias"] = ("column", fuse_qkv(*map(take, _QKV["bias"]), shape))
        if shape.num_experts:
            experts = range(shape.num_experts)
            gates = [take(f"mlp.experts.{e}.gate_proj.weight") for e in experts]
            ups = [take(f"mlp.experts.{e}.up_proj.weight") for e in experts]
            downs = [take(f"mlp.experts.{e}.down_proj.weight") for e in experts]
            # [E, hidden, 2F] and [E, F, hidden]: the views GroupedMLP takes of weight1 / weight2.
            out[mpre + "mlp.experts.weight1"] = ("experts", torch.stack(
                [torch.cat([g.t(), u.t()], dim=1) for g, u in zip(gates, ups)]))
            out[mpre + "mlp.experts.weight2"] = ("experts", torch.stack([d.t() for d in downs]))
        else:
            out[mpre + "mlp.linear_fc1.weight"] = ("gate_up", (take(_GATE_UP[0]), take(_GATE_UP[1])))
    known = {megatron_name_of(n) for n in hf}
    missing = sorted(known - set(out) - ({"output_layer.weight"} if shape.tie_word_embeddings else set()))
    if missing:
        raise WeightMapError(f"Hugging Face tensors for {missing[:3]} are not part of a "
                             f"{'MoE' if shape.num_experts else 'dense'} layer of this shape")
    return out


def _pad_vocab(tensor, shape: ModelShape):
    import torch

    if tensor.shape[0] != shape.vocab_size:
        raise WeightMapError(f"a vocab tensor has {tensor.shape[0]} rows, vocab_size={shape.vocab_size}")
    extra = shape.megatron_vocab - shape.vocab_size
    return torch.cat([tensor, tensor.new_zeros(extra, *tensor.shape[1:])]) if extra else tensor


def _tp_slice(kind: str, tensor, tp: int, rank: int):
    import torch

    if kind in ("column", "vocab"):
        return tensor.chunk(tp, dim=0)[rank].clone()
    if kind == "row":
        return tensor.chunk(tp, dim=1)[rank].clone()
    if kind == "gate_up":
        gate, up = tensor
        return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]])
    return tensor.clone()


def hf_to_megatron(hf: Mapping[str, Any], shape: ModelShape,
                   parallel: Parallel = Parallel()) -> dict[MegatronRank, dict[str, Any]]:
    """A Hugging Face state dict as every Megatron rank holds it (stage-local layer names)."""
    parallel.check(shape)
    full = _full_megatron(hf, shape)
    stages = stage_layers(shape.num_layers, parallel.pp)
    out: dict[MegatronRank, dict[str, Any]] = {rank: {} for rank in parallel.ranks()}
    local_experts = shape.num_experts // parallel.expert_ranks if shape.num_experts else 0
    for name, (kind, tensor) in full.items():
        stage, local = _local_name(name, stages)
        for rank in parallel.ranks():
            if rank.pp != stage:
                continue
            if kind == "experts":
                index = parallel.expert_rank(rank.tp, rank.ep)
                block = tensor[index * local_experts: (index + 1) * local_experts]
                # Megatron's parameter shapes: [hidden, El * 2F] and [El * F, hidden], whose
                # memory is the [El, hidden, 2F] / [El, F, hidden] block above.
                out[rank][local] = (block.reshape(shape.hidden_size, -1) if name.endswith("weight1")
                                    else block.reshape(-1, shape.hidden_size)).clone()
            else:
                out[rank][local] = _tp_slice(kind, tensor, parallel.tp, rank.tp)
    return out


# ----------------------------------------------------------------------------- Megatron -> HF
def _gather(name: str, kind: str, shards: list):
    import torch

    if kind in ("column", "vocab"):
        return torch.cat(shards, dim=0)
    if kind == "row":
        return torch.cat(shards, dim=1)
    if kind == "gate_up":
        pairs = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([g for g, _ in pairs]), torch.cat([u for _, u in pairs])
    return shards[0]


def _kind_of(megatron_suffix: str) -> str:
    for msuffix, kind in _LAYER_PARAMS.values():
        if msuffix == megatron_suffix:
            return kind
    if megatron_suffix.startswith("self_attention.linear_qkv."):
        return "column"
    if megatron_suffix == "mlp.linear_fc1.weight":
        return "gate_up"
    if megatron_suffix.startswith("mlp.experts.weight"):
        return "experts"
    raise WeightMapError(f"no Hugging Face parameter known for Megatron {megatron_suffix!r}")


def megatron_to_hf(shards: Mapping[MegatronRank, Mapping[str, Any]], shape: ModelShape,
                   parallel: Parallel = Parallel()) -> dict[str, Any]:
    """Every rank's Megatron state dict (as :func:`hf_to_megatron` returns them, or as the
    trainer gathers them) -> one Hugging Face state dict with the original shapes."""
    import torch

    parallel.check(shape)
    missing = [rank for rank in parallel.ranks() if rank not in shards]
    if missing:
        raise WeightMapError(f"no state dict for Megatron ranks {missing[:3]} of {parallel}")
    stages = stage_layers(shape.num_layers, parallel.pp)
    # Global name -> {rank: tensor}
    by_name: dict[str, dict[MegatronRank, Any]] = {}
    for rank, state in shards.items():
        for local, tensor in state.items():
            by_name.setdefault(_global_name(local, rank.pp, stages), {})[rank] = tensor
    hf: dict[str, Any] = {}
    for name, held in sorted(by_name.items()):
        ep0 = [held[r] for r in sorted(held) if r.ep == 0]   # TP shards in order (EP ranks hold copies)
        if name in _GLOBAL_PARAMS.values():
            hf_name = next(k for k, v in _GLOBAL_PARAMS.items() if v == name)
            if hf_name == "model.norm.weight":
                hf[hf_name] = ep0[0].clone()
            else:
                hf[hf_name] = _gather(name, "vocab", ep0)[: shape.vocab_size].clone()
            continue
        match = re.match(r"^decoder\.layers\.(\d+)\.(.+)$", name)
        if not match:
            raise WeightMapError(f"Megatron {name!r} is not a Qwen GPT parameter")
        layer, suffix = match.groups()
        pre = f"model.layers.{layer}."
        kind = _kind_of(suffix)
        if kind == "experts":
            local = shape.num_experts // parallel.expert_ranks
            blocks = [None] * parallel.expert_ranks
            for rank, tensor in held.items():
                blocks[parallel.expert_rank(rank.tp, rank.ep)] = tensor
            if suffix.endswith("weight1"):
                stacked = torch.cat([b.reshape(local, shape.hidden_size, -1) for b in blocks])
                for e in range(shape.num_experts):
                    gate_t, up_t = stacked[e].chunk(2, dim=1)
                    hf[pre + f"mlp.experts.{e}.gate_proj.weight"] = gate_t.t().contiguous()
                    hf[pre + f"mlp.experts.{e}.up_proj.weight"] = up_t.t().contiguous()
            else:
                stacked = torch.cat([b.reshape(local, -1, shape.hidden_size) for b in blocks])
                for e in range(shape.num_experts):
                    hf[pre + f"mlp.experts.{e}.down_proj.weight"] = stacked[e].t().contiguous()
            continue
        full = _gather(name, kind, ep0)
        if suffix.startswith("self_attention.linear_qkv."):
            kind_name = suffix.rsplit(".", 1)[1]
            for hf_suffix, part in zip(_QKV[kind_name], split_qkv(full, shape)):
                hf[pre + hf_suffix] = part.clone()
        elif kind == "gate_up":
            hf[pre + _GATE_UP[0]], hf[pre + _GATE_UP[1]] = (t.clone() for t in full)
        else:
            hf_suffix = next(k for k, (m, _) in _LAYER_PARAMS.items() if m == suffix)
            hf[pre + hf_suffix] = full.clone()
    return hf
