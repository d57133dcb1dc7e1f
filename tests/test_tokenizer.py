"""The in-process maze tokenizer round-trips any text over its alphabet exactly."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspeed_rl_asp.engines.hf import load_tokenizer
from mindspeed_rl_asp.policy.tokenizer import ALPHABET, EOS_TOKEN, PAD_TOKEN, UNK_TOKEN, build_tokenizer, vocabulary
from mindspeed_rl_asp.tasks.maze import MazeTaskSpec, count_tokens, make_dataset, maze_vocabulary


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


pieces = st.one_of(st.sampled_from(ALPHABET), st.sampled_from(maze_vocabulary(8)))


@settings(max_examples=300, deadline=None)
@given(st.lists(pieces, max_size=60).map("".join))
def test_round_trip_exact(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id not in ids


def test_whitespace_is_kept(tokenizer):
    text = "  a\n\n\tb  <|up|> <|down|>\n"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_one_token_per_maze_tag(tokenizer):
    for item in make_dataset(50, 0, MazeTaskSpec()):
        for text in (item.prompt, item.reference_response):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert len(ids) == count_tokens(text)
            assert tokenizer.decode(ids) == text


def test_special_ids_are_stable(tokenizer):
    assert tokenizer.convert_tokens_to_ids([PAD_TOKEN, EOS_TOKEN, UNK_TOKEN]) == [0, 1, 2]
    assert tokenizer.pad_token_id == 0 and tokenizer.eos_token_id == 1
    assert len(tokenizer) == len(vocabulary())
    assert tokenizer.padding_side == "left"


def test_unknown_character_maps_to_unk(tokenizer):
    ids = tokenizer("é", add_special_tokens=False)["input_ids"]
    assert ids == [tokenizer.unk_token_id]


def test_eos_is_one_token(tokenizer):
    ids = tokenizer("<|up|>" + EOS_TOKEN, add_special_tokens=False)["input_ids"]
    assert ids[-1] == tokenizer.eos_token_id and len(ids) == 2


def test_save_and_load(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    text = make_dataset(1, 0, MazeTaskSpec())[0].prompt
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
