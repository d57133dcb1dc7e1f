"""One reader of length files, one error type: every reader of the project (the history
predictor's profile, asp-schedule's predicted lengths, the simulator's replay) refuses a
bad file with LengthFileError naming file:line and the field, and reads a good one alike."""
import pytest

from mindspeed_rl_asp.schedule.length_profile import read_profile
from mindspeed_rl_asp.schedule.length_files import LengthFileError, read_length_file
from mindspeed_rl_asp.schedule.partition import ScheduleError
from mindspeed_rl_asp.schedule.plan import read_items_jsonl
from mindspeed_rl_asp.sim.workload import replay_workload

READERS = {"profile": read_profile, "predicted": read_items_jsonl, "replay": replay_workload}

# (lines, the reader's line number, a phrase of the message): bad for every reader.
BAD = [
    (['{"id": "a", "prompt": "x", "lengths": [3], "predicted_length": 3}', "not json"], 2, "not JSON"),
    (['[1, 2]'], 1, "JSON object"),
    (['{"prompt": "x", "lengths": [3], "predicted_length": 3}'], 1, "field 'id' is missing"),
    (['{"id": 7, "prompt": "x", "lengths": [3], "predicted_length": 3}'], 1, "must be a string"),
    (['{"id": "a", "prompt": "x", "lengths": [3], "predicted_length": 3}', '',
      '{"id": "a", "prompt": "x", "lengths": [4], "predicted_length": 4}'], 3, "repeats line 1"),
    (['{"id": "a", "prompt": "x"}'], 1, "expected"),
]


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("lines, lineno, phrase", BAD)
def test_every_reader_raises_the_one_error_naming_file_and_line(tmp_path, reader, lines, lineno, phrase):
    path = tmp_path / "lengths.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    with pytest.raises(LengthFileError) as info:
        READERS[reader](path)
    assert f"lengths.jsonl:{lineno}:" in str(info.value) and phrase in str(info.value)
    assert isinstance(info.value, ScheduleError)   # the commands print it as one line


@pytest.mark.parametrize("reader", sorted(READERS))
def test_an_empty_file_is_the_same_error_for_every_reader(tmp_path, reader):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(LengthFileError, match="empty.jsonl: no records"):
        READERS[reader](path)


def test_one_file_read_three_ways(tmp_path):
    path = tmp_path / "profile.jsonl"
    path.write_text('{"id": "a", "prompt": "x", "size": 3, "lengths": [3, 5.0], "predicted_length": 4.5}\n'
                    '{"id": "b", "prompt": "y", "lengths": [8, 2], "predicted_length": 0}\n', encoding="utf-8")
    assert read_profile(path) == [
        {"id": "a", "prompt": "x", "size": 3, "lengths": [3, 5], "predicted_length": 4.5},
        {"id": "b", "prompt": "y", "lengths": [8, 2], "predicted_length": 0}]
    assert read_items_jsonl(path) == [("a", 4.5), ("b", 0.0)]
    assert replay_workload(path).lengths_array().tolist() == [[3, 5], [8, 2]]


def test_what_each_kind_needs(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_text('{"id": "a", "predicted_length": 2.5}\n', encoding="utf-8")
    (record,) = read_length_file(path, "any")
    assert record.lengths == () and record.predicted == 2.5 and record.line == 1
    with pytest.raises(LengthFileError, match="f.jsonl:1: no observed length"):
        read_length_file(path, "observed")
    path.write_text('{"id": "a", "lengths": [2]}\n', encoding="utf-8")
    with pytest.raises(LengthFileError, match="f.jsonl:1: field 'prompt' is missing"):
        read_profile(path)
    with pytest.raises(LengthFileError, match="f.jsonl:1: no length field; expected 'predicted_length'"):
        read_items_jsonl(path)
    path.write_text('{"id": "a", "lengths": [2, 0]}\n', encoding="utf-8")
    with pytest.raises(LengthFileError, match=r"field 'lengths\[1\]'=0 must be >= 1"):
        read_length_file(path, "observed")
