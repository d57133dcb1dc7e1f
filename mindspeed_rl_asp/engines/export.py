"""The trained policy as a Hugging Face checkpoint that loads where its source loads.

``export_policy(path, tensors, source)``: the weights in the source checkpoint's dtype (a
bfloat16 model exports as bfloat16, not as the float32 the CPU trainer holds), and the
source's config, generation config and tokenizer files copied verbatim, so the export
reads with any transformers the source reads with (re-saving them with the installed
transformers would write its own keys and tokenizer class: with 5.x, ``rope_parameters``
and ``TokenizersBackend``, which 4.x cannot read). One ``model.safetensors``; a tied
``lm_head`` is left out, as transformers does (the loader ties it again).

The checkpoints a run writes for its own resume (``checkpoints/step_N/policy``) keep the
trainer's dtype instead: resuming from a rounded copy would not continue the run exactly.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

__all__ = ["CARRIED_FILES", "source_dtype", "export_policy"]

# Files of the source checkpoint an export carries unchanged (those present).
CARRIED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                 "chat_template.jinja", "chat_template.json")
_DTYPES = ("float32", "bfloat16", "float16")


def source_dtype(config: dict) -> str | None:
    """The dtype a checkpoint's config.json names (``dtype``, or the older ``torch_dtype``)."""
    name = config.get("dtype") or config.get("torch_dtype")
    return name if name in _DTYPES else None


def export_policy(path: str | Path, tensors: dict, source: str | Path) -> Path:
    """Write ``tensors`` (a Hugging Face state dict) as a checkpoint at ``path`` in the
    dtype of ``source`` (a local checkpoint directory), with its files carried over."""
    import torch
    from safetensors.torch import save_file

    path, source = Path(path), Path(source)
    config = json.loads((source / "config.json").read_text())
    dtype = source_dtype(config)
    target = getattr(torch, dtype) if dtype else None
    tied = bool(config.get("tie_word_embeddings", False))
    out = {}
    for name, tensor in tensors.items():
        if tied and name == "lm_head.weight":
            continue
        tensor = tensor.detach().to("cpu")
        if target is not None and tensor.is_floating_point():
            tensor = tensor.to(target)
        out[name] = tensor.contiguous()
    path.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path / "model.safetensors"), metadata={"format": "pt"})
    for name in CARRIED_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, path / name)
    return path
