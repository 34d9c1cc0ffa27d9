"""The parent run's metrics: target-type rates against the baselines' rates of the same type, and diversity."""

from __future__ import annotations

import math

import pytest

from palaestra.aed.evaluation import summarize
from palaestra.aed.report import aggregate


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Independent re-implementation (Wilson 1927) for the check."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def accidents(**counts):
    out = []
    for t, n in counts.items():
        out += [{"accident_type": t, "victim_responsible": False, "features": [float(len(out)), 0.0]} for _ in range(n)]
    return out


def result(kind, accident_type=None, episodes=100, **counts):
    ev = summarize(accidents(**counts), episodes, target=accident_type)
    ev = {k: v for k, v in ev.items() if k != "accidents"}
    return {"kind": kind, "accident_type": accident_type, "steps_to_first_success": 10, **ev}


def test_beats_random_compares_target_type_rates():
    items = [
        # rear_end adversary: many accidents, but mostly side-swipes: 6 rear-ends against the random's 8
        result("attack", "rear_end", rear_end=6, side_swipe=60),
        result("attack", "cut_in", cut_in=30, side_swipe=5),
        result("random", rear_end=8, cut_in=2, side_swipe=20),
        result("passive", rear_end=3),
    ]
    m = aggregate({"highway": items})
    assert m["aed/highway/rear_end/asr"] == pytest.approx(0.66)  # beats random on any type (0.66 > 0.30) ...
    assert m["aed/highway/rear_end/target_rate"] == pytest.approx(0.06)
    assert m["aed/highway/rear_end/random_target_rate"] == pytest.approx(0.08)
    assert m["aed/highway/rear_end/beats_random"] == 0.0  # ... but not on its own type
    assert m["aed/highway/cut_in/beats_random"] == 1.0 and m["aed/highway/cut_in/beats_random_ci"] == 1.0
    assert m["aed/highway/beats_random"] == 0.0
    lo, hi = wilson(30, 100)
    assert m["aed/highway/cut_in/target_rate_lo"] == pytest.approx(lo, abs=1e-6)
    assert m["aed/highway/cut_in/target_rate_hi"] == pytest.approx(hi, abs=1e-6)
    lo, hi = wilson(2, 100)
    assert (m["aed/highway/cut_in/random_target_rate_lo"], m["aed/highway/cut_in/random_target_rate_hi"]) == (
        pytest.approx(lo, abs=1e-6),
        pytest.approx(hi, abs=1e-6),
    )
    assert m["aed/highway/cut_in/passive_target_rate"] == 0.0
    assert m["aed/highway/distinct_types"] == 3
    p = [6 / 101, 65 / 101, 30 / 101]
    assert m["aed/highway/type_entropy"] == pytest.approx(-sum(x * math.log(x) for x in p))


def test_trajectory_diversity_is_the_mean_pairwise_distance():
    from palaestra.aed.evaluation import trajectory_diversity

    # a 3-4-5 right triangle: pairwise distances 3, 4, 5
    assert trajectory_diversity([[0.0, 0.0], [3.0, 0.0], [0.0, 4.0]]) == pytest.approx((3 + 4 + 5) / 3)
    assert trajectory_diversity([[1.0]]) == 0.0


def test_figures_draw_from_the_results(tmp_path):
    from palaestra.aed.report import curves_figure, rates_figure

    items = [result("attack", "cut_in", cut_in=30), result("random", cut_in=2)]
    items[0]["train"] = {"curve": [{"timesteps": 500, "target_rate": 0.1, "attack_rate": 0.2, "episode_reward": 1.0}]}
    fig = rates_figure("highway", items)
    heights = sorted(round(p.get_height(), 2) for p in fig.axes[0].patches)
    assert heights == [0.02, 0.3, 0.3]  # random's cut-in rate, the target and the any-type rate
    assert len(curves_figure("highway", items).axes[0].lines) == 2


def test_expert_vs_llm_table_and_figure_per_arm():
    from palaestra.aed.report import comparison_figure, comparison_table

    expert = {**result("attack", "cut_in", cut_in=30), "arm": "expert", "reward_source": "expert"}
    llm = {**result("attack", "cut_in", cut_in=12, side_swipe=8), "arm": "llm", "reward_source": "llm"}
    items = [llm, expert, result("random", cut_in=2)]
    m = aggregate({"highway": items})
    assert m["aed/highway/cut_in/expert/target_rate"] == pytest.approx(0.30)
    assert m["aed/highway/cut_in/llm/target_rate"] == pytest.approx(0.12)
    assert m["aed/highway/cut_in/llm/asr"] == pytest.approx(0.20)
    table = comparison_table({"highway": items}, "aed_scripted").splitlines()
    assert "aed_scripted" in table[0]
    lo, hi = wilson(12, 100)
    row = f"| highway | cut_in | expert | expert | 0.30 {fmt(30)} | 0.30 {fmt(30)} | 0.00 {fmt(0, 30)} "
    row += f"| 0.02 {fmt(2)} |"
    assert table[4] == row
    assert table[5].startswith("| highway | cut_in | llm | llm | 0.20") and f"0.12 [{lo:.2f}, {hi:.2f}]" in table[5]
    fig = comparison_figure("highway", items)
    assert [round(p.get_height(), 2) for p in fig.axes[1].patches] == [0.3, 0.12]  # target-type: expert, llm


def fmt(k: int, n: int = 100) -> str:
    lo, hi = wilson(k, n)
    return f"[{max(lo, 0.0):.2f}, {hi:.2f}]"  # k = 0: the lower bound is 0 (here -1e-17 by rounding)


def test_headline_pools_the_target_type_rate_against_random():
    from palaestra.aed.report import headline

    items = [
        result("attack", "rear_end", rear_end=6),
        result("attack", "cut_in", cut_in=30),
        result("random", cut_in=4),
    ]
    lo, hi = wilson(36, 200)
    expected = f"target-type accident rate 0.18 [{lo:.2f}, {hi:.2f}] (200 episodes, 95% Wilson; random adversary 0.02)"
    assert headline({"highway": items}) == expected


def test_proposed_types_meet_their_own_baselines_and_diversity_is_per_arm():
    """taxonomy: both. A proposed type is measured against the random adversary classified by the proposed
    recognizers (the fixed one never names it); distinct types and entropy come out per arm."""
    from palaestra.aed.report import comparison_table

    def armed(r, arm):
        return {**r, "arm": arm, "reward_source": "llm" if arm != "expert" else "expert"}

    items = [
        armed(result("attack", "rear_end", rear_end=10, side_swipe=10), "expert"),
        armed(result("attack", "rear_end", rear_end=5, side_swipe=5, cut_in=10), "llm"),
        armed(result("attack", "late_cut_in", late_cut_in=20, other=4), "proposed"),
        armed(result("random", rear_end=2, side_swipe=9), None),
        armed(result("random", late_cut_in=3, other=7), "proposed"),
    ]
    m = aggregate({"highway": items})
    assert m["aed/highway/late_cut_in/proposed/random_target_rate"] == pytest.approx(0.03)
    assert m["aed/highway/rear_end/llm/random_target_rate"] == pytest.approx(0.02)
    assert m["aed/highway/random_proposed/asr"] == pytest.approx(0.10)
    assert m["aed/highway/random/asr"] == pytest.approx(0.11)
    assert m["aed/highway/expert/distinct_types"] == 2 and m["aed/highway/llm/distinct_types"] == 3
    p = [0.25, 0.25, 0.5]
    assert m["aed/highway/llm/type_entropy"] == pytest.approx(-sum(x * math.log(x) for x in p))
    assert m["aed/highway/expert/type_entropy"] == pytest.approx(math.log(2))
    table = comparison_table({"highway": items}, "aed_scripted")
    assert "| highway | late_cut_in | proposed | llm |" in table and "| 0.03 [0.01, 0.08] |" in table
    assert "| highway | llm | 3 | 1.04 |" in table


def test_comparison_tables_are_well_formed_markdown():
    """Every table of the parent run's report has as many separator cells as header cells."""
    from palaestra.aed.report import comparison_table

    items = [
        {**result("attack", "rear_end", rear_end=6, side_swipe=4), "arm": arm, "reward_source": arm}
        for arm in ("expert", "llm")
    ] + [result("random", rear_end=8)]
    text = comparison_table({"highway": items}, "aed_scripted")
    rows = [line for line in text.splitlines() if line.startswith("|")]
    headers = [i for i, line in enumerate(rows) if i + 1 < len(rows) and set(rows[i + 1]) <= set("|- ")]
    assert len(headers) == 2  # the rates table and the diversity table
    for i in headers:
        assert rows[i].count("|") == rows[i + 1].count("|") == rows[i + 2].count("|"), (rows[i], rows[i + 1])
