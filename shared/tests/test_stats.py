"""The shared Wilson interval against published values."""

from palaestra.shared.stats import wilson_interval


def test_wilson_interval_matches_textbook_values():
    # 95% Wilson score intervals (Newcombe 1998): 5/10 -> (0.2366, 0.7634), 0/10 -> (0, 0.2775)
    assert [round(x, 4) for x in wilson_interval(5, 10)] == [0.2366, 0.7634]
    assert [round(x, 4) for x in wilson_interval(0, 10)] == [0.0, 0.2775]
    assert wilson_interval(0, 0) == (0.0, 1.0)
