from hypothesis import given
from hypothesis import strategies as st

from mindspeed_rl_asp.metrics.timeline import Span, idle_fraction, padding_bubble, read_spans, write_spans


def test_padding_bubble_hand_case():
    # [2, 4]: 6 useful of 8 padded; [3, 3]: 6 of 6 -> 1 - 12/14
    assert padding_bubble([[2, 4], [3, 3]]) == 1 - 12 / 14
    assert padding_bubble([]) == 0.0


@given(st.lists(st.lists(st.integers(1, 50), min_size=1, max_size=8), min_size=1, max_size=10))
def test_padding_bubble_in_unit_interval(groups):
    b = padding_bubble(groups)
    assert 0.0 <= b < 1.0
    assert (b == 0.0) == all(len(set(g)) == 1 for g in groups)


def test_idle_fraction():
    spans = [Span("gen-0", "generate", 0, 10), Span("gen-1", "generate", 0, 5), Span("gen-1", "load_weights", 8, 12)]
    # window [0, 10]: gen-0 busy 10, gen-1 busy 5 + 2 -> idle 3 of 20
    assert abs(idle_fraction(spans, ["gen-0", "gen-1"], 0, 10) - 3 / 20) < 1e-12


def test_spans_round_trip(tmp_path):
    spans = [Span("train", "train", 1.0, 2.5, "step 0", {"tokens": 3})]
    write_spans(tmp_path / "t.jsonl", spans)
    assert read_spans(tmp_path / "t.jsonl") == spans
