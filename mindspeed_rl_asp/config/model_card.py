"""The model of a run as its checkpoint says it is.

``model.*`` holds the architecture the simulator and the config checks read (layers,
widths, positions, experts). For a run on a checkpoint that is here, ``model.path``'s
``config.json`` is the truth: :func:`fill_from_checkpoint` writes its values into the
config before it is checked and saved, so ``config.yaml`` records the user's model (its
name, family and architecture), not the shipped tiny policy's, and the length check uses
the checkpoint's positions. A simulated cluster's model is numbers (its ``path`` is
usually not on this machine) and is left as configured.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["architecture_of", "fill_from_checkpoint"]

DEFAULT_NAME = "tiny-maze-qwen3"
# model.* key -> config.json key
HF_KEYS = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size",
           "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_key_value_heads",
           "head_dim": "head_dim", "intermediate_size": "intermediate_size", "vocab_size": "vocab_size",
           "tie_word_embeddings": "tie_word_embeddings", "max_position_embeddings": "max_position_embeddings",
           "num_experts": "num_experts", "num_experts_per_tok": "num_experts_per_tok",
           "moe_intermediate_size": "moe_intermediate_size"}


def architecture_of(hf: dict) -> dict:
    """``model.*`` values from a Hugging Face ``config.json`` (keys it lacks are left out;
    a dense model's experts are 0; ``head_dim`` defaults to hidden / heads as in transformers)."""
    values = {ours: hf[theirs] for ours, theirs in HF_KEYS.items() if hf.get(theirs) is not None}
    if "head_dim" not in values and hf.get("hidden_size") and hf.get("num_attention_heads"):
        values["head_dim"] = hf["hidden_size"] // hf["num_attention_heads"]
    if "num_key_value_heads" not in values and "num_attention_heads" in values:
        values["num_key_value_heads"] = values["num_attention_heads"]
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
        values.setdefault(key, 0)
    if hf.get("model_type"):
        values["family"] = str(hf["model_type"])
    return values


def fill_from_checkpoint(cfg, checkpoint: Path) -> dict:
    """Write the architecture of ``checkpoint`` (a directory with config.json) into
    ``cfg.model``; the name becomes the directory's when it is still the tiny policy's and
    the path is elsewhere. Returns what changed, ``{key: (was, now)}``. The shipped tiny
    policy is left alone: its model group states it already (tests/test_sim_profiles.py
    keeps the two equal), and tests vary its numbers on purpose."""
    from .paths import locate
    from .schema import ModelConfig

    config = Path(checkpoint) / "config.json"
    if not config.is_file() or Path(checkpoint).resolve() == locate(ModelConfig.path).resolve():
        return {}
    values = architecture_of(json.loads(config.read_text()))
    if cfg.model.name == DEFAULT_NAME and Path(checkpoint).name != DEFAULT_NAME:
        values["name"] = Path(checkpoint).name
    changed = {}
    for key, value in values.items():
        if key in cfg.model and cfg.model[key] != value:
            changed[key] = (cfg.model[key], value)
            cfg.model[key] = value
    return changed
