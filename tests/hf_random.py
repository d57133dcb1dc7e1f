"""Randomly initialised Hugging Face checkpoints of the Qwen2 / Qwen3 / Llama families, saved to
disk the way a downloaded checkpoint is laid out: config.json, safetensors weights and a
Qwen2Tokenizer (byte-level BPE, tokenizer_class Qwen2Tokenizer, a ChatML chat template),
so that ``model.path=DIR`` is exercised exactly as with a real one. No hub is reachable
here, so the tokenizer's BPE is trained in-process on a small corpus; the maze tags are
added tokens, as a fine-tuned maze model would have them."""
from __future__ import annotations

import json
from pathlib import Path

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def corpus() -> list[str]:
    from mindspeed_rl_asp.tasks.maze import ALPHAMAZE_INSTRUCTION

    return [ALPHAMAZE_INSTRUCTION, "What is 3 + 4? Think, then answer. <think> so </think> The answer is "
            "\\boxed{7}. <answer> </answer> 0123456789 + - * / = ( ) { } \\frac{1}{2} x y"] * 4


def qwen_tokenizer(chat_template: bool = True):
    """A Qwen2Tokenizer over a BPE trained on :func:`corpus`, with the maze tags added."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    from mindspeed_rl_asp.tasks.maze import maze_vocabulary

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = json.loads(core.to_str())["model"]
    tokenizer = Qwen2Tokenizer(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]], unk_token=None,
                               eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]})
    tokenizer.add_tokens(maze_vocabulary(8) + ["<|all_wall|>"])
    if chat_template:
        tokenizer.chat_template = CHATML
    return tokenizer


def save_random_checkpoint(path, family: str = "qwen3", chat_template: bool = True, seed: int = 0,
                           hidden_size: int = 32, num_layers: int = 2, max_positions: int = 1024) -> Path:
    """A random ``family`` (qwen3 | qwen2 | llama) causal LM with :func:`qwen_tokenizer`, saved at
    ``path`` (llama: the architecture of SmolLM and Llama 3, which a user trained with)."""
    import torch
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)

    path = Path(path)
    tokenizer = qwen_tokenizer(chat_template)
    common = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                  num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=max_positions, tie_word_embeddings=False,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=hidden_size // 4, **common))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(f"family={family!r}: qwen3, qwen2 or llama")
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
