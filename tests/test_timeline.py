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


def test_rolling_mean():
    from mindspeed_rl_asp.metrics.report import rolling_mean

    assert rolling_mean([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]


def test_report_draws_pngs(tmp_path):
    import json

    from mindspeed_rl_asp.metrics.report import make_report

    write_spans(tmp_path / "timeline.jsonl", [Span("gen-0", "generate", 0, 1), Span("train", "train", 1, 2)])
    (tmp_path / "queue.jsonl").write_text("\n".join(json.dumps({"time": t, "queued": t, "in_flight": 1,
                                                                 "capacity": 8}) for t in range(3)))
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(
        {"step": s, "elapsed_s": s, "reward_mean": 0.1 * s, "correctness_rate": 0.1, "integrity_rate": 1.0})
        for s in range(4)))
    made = make_report(tmp_path)
    assert sorted(p.name for p in made) == ["queue.png", "rewards.png", "timeline.png"]
    assert all(p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG" for p in made)
    from PIL import Image

    one_panel = Image.open(tmp_path / "rewards.png").size[0]

    # With several epochs the rewards picture gains the per-epoch panel (a wider figure).
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(
        {"step": s, "elapsed_s": s, "reward_mean": 0.1 * s, "correctness_rate": 0.1, "integrity_rate": 1.0,
         "epoch_correctness": {str(s // 2): [s, 4]}}) for s in range(4)))
    make_report(tmp_path)
    assert Image.open(tmp_path / "rewards.png").size[0] > 1.3 * one_panel


def test_report_on_a_non_run_dir(tmp_path):
    import pytest

    from mindspeed_rl_asp.cli.report import main

    assert main([str(tmp_path)]) == 2
    with pytest.raises(FileNotFoundError):
        from mindspeed_rl_asp.metrics.report import make_report

        make_report(tmp_path / "missing")
