"""A tokenizer for the maze vocabulary, built in-process (no hub download exists here).

One token per maze tag (``<|2-3|>``, ``<|up_left_wall|>``, ``<|down|>``, ``<think>`` ...),
one per printable ASCII character, newline and tab for everything else. A word-level
model over a regex pre-tokenizer and a fusing decoder make decode(encode(text)) == text
exactly for any text over that alphabet: no token drops or adds spaces or newlines.
"""
from __future__ import annotations

import string

from ..engines.hf import load_tokenizer  # noqa: F401  (its home is the engine; kept importable here)
from ..tasks.maze import TOKEN_PATTERN, check_unique_tokens, maze_vocabulary

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)
# Cell tags for mazes up to this size are in the vocabulary.
VOCAB_MAX_MAZE_SIZE = 8
# Every character a text may hold and still round-trip exactly.
ALPHABET = string.printable[:95] + "\n\t"


def vocabulary(max_maze_size: int = VOCAB_MAX_MAZE_SIZE) -> list[str]:
    """Special tokens first (pad=0, eos=1, unk=2), then maze tags, then characters."""
    tags = maze_vocabulary(max_maze_size)
    chars = [c for c in ALPHABET if c not in tags]
    vocab = list(SPECIAL_TOKENS) + tags + chars
    # A special token that is also a maze tag would get two ids.
    check_unique_tokens(vocab, f"the tokenizer vocabulary (special tokens + maze tags up to size {max_maze_size})")
    return vocab


def build_tokenizer(max_maze_size: int = VOCAB_MAX_MAZE_SIZE):
    """A ``PreTrainedTokenizerFast`` that pads on the left (generation batches prompts)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = vocabulary(max_maze_size)
    core = Tokenizer(models.WordLevel(vocab={tok: i for i, tok in enumerate(vocab)}, unk_token=UNK_TOKEN))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(TOKEN_PATTERN), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
