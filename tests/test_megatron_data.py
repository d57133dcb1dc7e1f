"""Preprocessed (Megatron indexed) datasets (tasks/megatron_data.py): the .bin / .idx layout
written and read back, every broken file named, rows decoded with the tiny tokenizer and read
by task=dataset, and, with MINDSPEED_RL_CHECKOUT, MindSpeed-RL's own IndexedDataset reading our
files and ours reading its builder's."""
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from mindspeed_rl_asp.tasks import megatron_data as md
from mindspeed_rl_asp.tasks.base import TaskError

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "mindspeed_rl_asp" / "assets" / "tiny-maze-qwen3"
CHECKOUT = os.environ.get("MINDSPEED_RL_CHECKOUT")


@pytest.mark.parametrize("dtype", ["int32", "uint16", "int64"])
def test_written_sequences_read_back(tmp_path, dtype):
    rows = [[5, 6, 7], [], [1], list(range(40))]
    md.write_indexed(str(tmp_path / "x"), rows, dtype)
    back = md.read_sequences(str(tmp_path / "x"))
    assert [r.tolist() for r in back] == rows and all(r.dtype == np.dtype(dtype) for r in back)


def test_fields_of_a_prefix(tmp_path):
    prefix = str(tmp_path / "data")
    md.write_packed(prefix, {"input_ids": [[1, 2], [3]], "labels": [[9], [8, 7]]})
    assert md.packed_fields(prefix) == ["input_ids", "labels"] and md.is_packed(prefix)
    packed = md.read_packed(prefix)
    assert [r.tolist() for r in packed["labels"]] == [[9], [8, 7]]
    assert not md.is_packed(str(tmp_path / "other"))


def test_broken_files_are_named(tmp_path):
    prefix = str(tmp_path / "data")
    with pytest.raises(TaskError, match=r"task.path=.*no such file and no preprocessed dataset there .*"
                                        r"data_packed_input_ids_document.idx"):
        md.read_packed(prefix)
    md.write_packed(prefix, {"input_ids": [[1, 2], [3]], "labels": [[9]]})
    with pytest.raises(TaskError, match="different row counts"):
        md.read_packed(prefix)
    idx = Path(md.field_prefix(prefix, "labels") + ".idx")
    idx.write_bytes(b"NOTANIDX" + idx.read_bytes()[8:])
    with pytest.raises(TaskError, match="no MMIDIDX header"):
        md.read_sequences(md.field_prefix(prefix, "labels"))
    md.write_indexed(md.field_prefix(prefix, "labels"), [[9], [8]])
    Path(md.field_prefix(prefix, "labels") + ".bin").write_bytes(b"\0\0\0\0")
    with pytest.raises(TaskError, match="past the end of the file"):
        md.read_packed(prefix)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY))


def write_prompts(prefix, tokenizer, questions, answers):
    """As MindSpeed-RL's preprocessing does: the chat-templated prompt's ids and the answer's ids."""
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
           if tokenizer.chat_template else q for q in questions]
    md.write_packed(prefix, {"input_ids": [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ids],
                             "labels": [tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]})
    return ids


def test_rows_decode_to_the_prompt_text_and_answer(tmp_path, tokenizer):
    prefix = str(tmp_path / "data")
    texts = write_prompts(prefix, tokenizer, ["<|0-0|><|blank|>", "<|up|><|down|>"], ["<|up|>", "<|left|>"])
    rows = md.packed_rows(prefix, tokenizer)
    assert [r["input_ids"] for r in rows] == texts
    assert [r["labels"] for r in rows] == ["<|up|>", "<|left|>"]
    with pytest.raises(TaskError, match="needs the model's tokenizer"):
        md.packed_rows(prefix, None)


def test_task_dataset_reads_a_prefix(tmp_path, tokenizer):
    from omegaconf import OmegaConf

    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.tasks import make_task

    prefix = str(tmp_path / "data")
    texts = write_prompts(prefix, tokenizer, ["<|0-0|><|blank|>", "<|1-1|><|blank|>"], ["<|up|>", "<|left|>"])
    cfg = load_config(["task=dataset", f"task.path={prefix}", "task.prompt_key=input_ids", "task.answer_key=labels",
                       "task.verifier_function=[exact_match]", "task.num_prompts=0"], validate=False)
    task = make_task(OmegaConf.to_object(cfg).task, tokenizer, 256)
    assert [p.prompt for p in task.prompts] == texts and [p.answer for p in task.prompts] == ["<|up|>", "<|left|>"]
    cfg.task.path = str(tmp_path / "absent")
    with pytest.raises(TaskError, match="absent'.*no preprocessed dataset there"):
        make_task(OmegaConf.to_object(cfg).task, tokenizer, 256)


def mindspeed_indexed_dataset():
    """MindSpeed-RL's indexed_dataset.py loaded on its own (its package __init__ imports far more)."""
    path = Path(CHECKOUT) / "mindspeed_rl" / "datasets" / "indexed_dataset.py"
    spec = importlib.util.spec_from_file_location("mindspeed_indexed_dataset", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not CHECKOUT, reason="MINDSPEED_RL_CHECKOUT is unset: no MindSpeed-RL checkout to compare with")
def test_the_same_layout_as_mindspeed_rls_own_reader_and_builder(tmp_path):
    theirs = mindspeed_indexed_dataset()
    rows = [[3, 1, 4], [1, 5], [9, 2, 6, 5]]
    md.write_indexed(str(tmp_path / "ours"), rows)
    read = theirs.IndexedDataset(str(tmp_path / "ours"))
    assert [read[i].tolist() for i in range(len(read))] == rows
    builder = theirs.IndexedDatasetBuilder(str(tmp_path / "theirs.bin"), dtype=np.int32)
    for row in rows:
        builder.add_document(row, [len(row)])
    builder.finalize(str(tmp_path / "theirs.idx"))
    assert [r.tolist() for r in md.read_sequences(str(tmp_path / "theirs"))] == rows
