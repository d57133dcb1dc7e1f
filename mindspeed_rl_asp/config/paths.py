"""Where the files the package ships are, and what a checkpoint directory must hold.

Shipped files (the Hydra configs, the tiny policy) are found with importlib.resources, so
that an installed wheel finds them from any working directory; nothing here reads a path
relative to the working directory except the paths a user writes.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

PACKAGE = "mindspeed_rl_asp"

# What transformers' from_pretrained reads: one of each group must be in a checkpoint.
CONFIG_FILES = ("config.json",)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
CHECKPOINT_PARTS = (("a config", CONFIG_FILES), ("weights", WEIGHT_FILES), ("a tokenizer", TOKENIZER_FILES))


def package_path(*parts: str) -> Path:
    """A file or folder shipped inside the package, wherever the package is installed.

    In a checkout (editable install) ``configs`` is the link ``mindspeed_rl_asp/configs ->
    ../configs``; a wheel carries the files themselves (pyproject.toml's package-data)."""
    # A real path is needed (Hydra and transformers open paths), which a package installed
    # on a file system has; a zipped package is not supported.
    return Path(str(resources.files(PACKAGE).joinpath(*parts)))


def locate(path: str) -> Path:
    """A path as the user wrote it (absolute, or relative to the working directory); when
    that does not exist and it starts with the package's name (``mindspeed_rl_asp/assets/
    tiny-maze-qwen3``, the default model.path), the file shipped inside the package."""
    candidate = Path(path)
    if candidate.is_absolute() or candidate.exists():
        return candidate
    parts = candidate.parts
    if len(parts) > 1 and parts[0] == PACKAGE:
        return package_path(*parts[1:])
    return candidate


def missing_checkpoint_parts(directory: Path) -> list[str]:
    """What a Hugging Face checkpoint directory lacks, one phrase per missing part
    (``[]`` when it has a config, weights and a tokenizer)."""
    missing = []
    for what, names in CHECKPOINT_PARTS:
        if not any((directory / name).is_file() for name in names):
            missing.append(f"{what} ({' or '.join(names)})")
    return missing
