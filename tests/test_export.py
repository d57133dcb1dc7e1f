"""The final policy loads where its source loads: the source's dtype, config and tokenizer
files (engines/export.py)."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mindspeed_rl_asp.engines.export import CARRIED_FILES, export_policy

TINY = Path(__file__).resolve().parents[1] / "mindspeed_rl_asp" / "assets" / "tiny-maze-qwen3"


def bf16_source(tmp_path) -> Path:
    """The tiny policy as a bfloat16 checkpoint (what a user's model usually is)."""
    source = tmp_path / "source"
    shutil.copytree(TINY, source)
    config = json.loads((source / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (source / "config.json").write_text(json.dumps(config, indent=2))
    weights = {k: v.to(torch.bfloat16) for k, v in load_file(str(source / "model.safetensors")).items()}
    save_file(weights, str(source / "model.safetensors"), metadata={"format": "pt"})
    return source


def test_export_keeps_the_source_dtype_and_files(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = bf16_source(tmp_path)
    trained = {k: v.float() + 1e-3 for k, v in AutoModelForCausalLM.from_pretrained(str(TINY)).state_dict().items()}
    out = export_policy(tmp_path / "final_policy", trained, source)
    carried = [name for name in CARRIED_FILES if (source / name).is_file()]
    assert "config.json" in carried and len(carried) >= 2, carried   # the source has files to carry
    for name in carried:   # byte for byte: readable by whatever reads the source
        assert (out / name).read_bytes() == (source / name).read_bytes(), name
    weights = load_file(str(out / "model.safetensors"))
    assert {v.dtype for v in weights.values()} == {torch.bfloat16}
    assert "lm_head.weight" not in weights   # tied: the loader ties it again
    assert all(torch.equal(weights[k], trained[k].to(torch.bfloat16)) for k in weights)
    fp32_bytes = sum(v.numel() * 4 for k, v in trained.items() if k != "lm_head.weight")
    assert (out / "model.safetensors").stat().st_size < 0.55 * fp32_bytes   # half, not the trainer's float32
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    assert AutoTokenizer.from_pretrained(str(out))("<|up|>")["input_ids"] == \
        AutoTokenizer.from_pretrained(str(source))("<|up|>")["input_ids"]


def test_a_float32_source_exports_float32(tmp_path):
    trained = load_file(str(TINY / "model.safetensors"))
    out = export_policy(tmp_path / "out", trained, TINY)
    assert {v.dtype for v in load_file(str(out / "model.safetensors")).values()} == {torch.float32}


def reload_facts(path: str) -> dict:
    """The export loaded through the project's own loader: the transformers version, the
    token ids and last logits of a short prompt, and the rope theta it read."""
    import transformers

    from mindspeed_rl_asp.engines.hf import load_policy

    model, tokenizer = load_policy(path)
    ids = tokenizer("<|maze_start|><|0-0|>", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
    return {"version": transformers.__version__, "ids": ids, "logits": logits.tolist(),
            "rope_theta": getattr(model.config, "rope_theta", None) or model.config.rope_parameters["rope_theta"]}


# reload_facts in a fresh process (this file on its path): the floor's transformers goes first.
RELOAD = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from test_export import reload_facts
print(json.dumps(reload_facts(sys.argv[1])))
"""


def declared_transformers_floor() -> str:
    import re

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    return re.search(r'"transformers>=([0-9.]+)"', text).group(1)


def floor_python_path(floor: str):
    """Where the floor's transformers is: '' when it is the one installed (same major.minor),
    else ASP_TRANSFORMERS_FLOOR (a `pip install --target` directory of it), else None."""
    import os

    import transformers

    if transformers.__version__.split(".")[:2] == floor.split(".")[:2]:
        return ""
    return os.environ.get("ASP_TRANSFORMERS_FLOOR")


@pytest.mark.slow
def test_the_export_reloads_under_the_declared_transformers_floor(tmp_path):
    """final_policy/ (bfloat16 source, trained weights) loads through the project's own
    loader under the transformers version pyproject.toml declares as its floor, in a fresh
    process, and gives the logits and token ids the installed version gives."""
    import os
    import subprocess
    import sys

    floor = declared_transformers_floor()
    where = floor_python_path(floor)
    if where is None:
        pytest.skip(f"transformers {floor} (the declared floor) is not installed; point ASP_TRANSFORMERS_FLOOR at "
                    f"`pip install --target DIR transformers=={floor}` to run this")
    source = bf16_source(tmp_path)
    trained = {k: v.float() * 1.01 for k, v in load_file(str(source / "model.safetensors")).items()}
    out = export_policy(tmp_path / "final_policy", trained, source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (where, os.environ.get("PYTHONPATH", "")) if p)}
    reloaded = json.loads(subprocess.run([sys.executable, "-c", RELOAD, str(out)], env=env, check=True,
                                         capture_output=True, text=True).stdout.strip().splitlines()[-1])
    assert reloaded["version"].split(".")[:2] == floor.split(".")[:2]
    here = reload_facts(str(out))   # the installed version, in this process
    assert reloaded["ids"] == here["ids"] and reloaded["rope_theta"] == here["rope_theta"]
    assert torch.allclose(torch.tensor(reloaded["logits"]), torch.tensor(here["logits"]), atol=1e-4)
