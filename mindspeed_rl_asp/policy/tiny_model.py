"""The tiny Qwen3-architecture policy: a config sized for a 2-core CPU.

About 0.8 M parameters (hidden 128, 4 layers, GQA 4/2 heads, tied embeddings): small
enough to ship in the package (a few MB) and to train and sample on a laptop, yet the
same architecture class as the paper's Qwen3 models, so every engine code path is the
real one.
"""
from __future__ import annotations

from .tokenizer import EOS_TOKEN, PAD_TOKEN


def tiny_qwen3_config(tokenizer, hidden_size: int = 128, num_layers: int = 4, max_positions: int = 1024):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        bos_token_id=None,
    )


def build_tiny_policy(tokenizer, seed: int = 0, **sizes):
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(tiny_qwen3_config(tokenizer, **sizes))
