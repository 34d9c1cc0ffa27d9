"""Rates against the passive baseline: Newcombe's interval checked against the paper's worked examples and a
re-implementation from its text; the per-seed and pooled table on synthetic counts against the closed form."""

from __future__ import annotations

import math

import pytest

from palaestra.aed.contrast import newcombe_interval, passive_contrasts, seeds_table

Z = 1.959963984540054


def wilson_by_hand(k: int, n: int) -> tuple[float, float]:
    """Wilson's interval as the roots of its quadratic (Newcombe 1998, method 3), written out independently."""
    p = k / n
    root = Z * math.sqrt(Z * Z + 4 * n * p * (1 - p))
    return (2 * n * p + Z * Z - root) / (2 * (n + Z * Z)), (2 * n * p + Z * Z + root) / (2 * (n + Z * Z))


def newcombe_by_hand(k1, n1, k2, n2):
    (l1, u1), (l2, u2) = wilson_by_hand(k1, n1), wilson_by_hand(k2, n2)
    d = k1 / n1 - k2 / n2
    return d - math.hypot(k1 / n1 - l1, u2 - k2 / n2), d + math.hypot(u1 - k1 / n1, k2 / n2 - l2)


@pytest.mark.parametrize(
    "counts, expected",
    [((56, 70, 48, 80), (0.0524, 0.3339)), ((9, 10, 3, 10), (0.1705, 0.8090))],  # Newcombe 1998, Table II
)
def test_newcombe_interval_matches_the_papers_examples(counts, expected):
    lo, hi = newcombe_interval(*counts)
    assert lo == pytest.approx(expected[0], abs=6e-5) and hi == pytest.approx(expected[1], abs=6e-5)


@pytest.mark.parametrize("counts", [(3, 100, 0, 100), (0, 100, 7, 100), (40, 40, 1, 100), (12, 200, 12, 200)])
def test_newcombe_interval_equals_a_reimplementation(counts):
    assert newcombe_interval(*counts) == pytest.approx(newcombe_by_hand(*counts), abs=1e-12)


def result(episodes: int, target: int, responsible: int, accident_type: str = "rear_end") -> dict:
    return {
        "accident_type": accident_type,
        "episodes": episodes,
        "types": {accident_type: target, "other": 1},
        "effective_asr": responsible / episodes,
    }


def test_passive_contrasts_of_synthetic_counts():
    metrics = passive_contrasts("aed/highway/rear_end/llm", result(100, 30, 25), result(100, 4, 2))
    pre = "aed/highway/rear_end/llm"
    assert metrics[f"{pre}/target_rate_vs_passive"] == pytest.approx(0.26)
    lo, hi = newcombe_by_hand(30, 100, 4, 100)
    assert (metrics[f"{pre}/target_rate_vs_passive_lo"], metrics[f"{pre}/target_rate_vs_passive_hi"]) == (
        pytest.approx(lo),
        pytest.approx(hi),
    )
    assert metrics[f"{pre}/responsible_rate_vs_passive"] == pytest.approx(0.23)
    assert metrics[f"{pre}/passive_responsible_count"] == 2 and metrics[f"{pre}/responsible_count"] == 25
    assert lo > 0  # a clear effect: the interval excludes 0
    same = passive_contrasts(pre, result(100, 4, 2), result(100, 4, 2))  # the control: no effect
    assert same[f"{pre}/target_rate_vs_passive"] == 0
    assert same[f"{pre}/target_rate_vs_passive_lo"] < 0 < same[f"{pre}/target_rate_vs_passive_hi"]


def test_seeds_table_pools_counts_and_averages_differences():
    seeds = [(30, 4), (20, 6), (40, 2)]  # (attack, passive) target-type accidents of 100 episodes each
    records = []
    for attack, passive in seeds:
        m = passive_contrasts("aed/highway/rear_end/expert", result(100, attack, 10), result(100, passive, 1))
        records.append({f"attack/{k}": v for k, v in m.items()})  # as a pipeline's summary prefixes them
    table = seeds_table(records)
    [row] = [line for line in table.splitlines() if line.startswith("| highway/rear_end/expert")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "3"
    lo, hi = newcombe_by_hand(90, 300, 12, 300)
    assert cells[2] == f"{90 / 300 - 12 / 300:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    diffs = [(a - p) / 100 for a, p in seeds]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)  # t_{0.975, 2}
    assert cells[3] == f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"
    assert cells[5].startswith("+0.090") and "[" in cells[5]  # AV-responsible: 10 vs 1 per seed


def test_the_parent_runs_metrics_carry_the_passive_contrasts():
    """aggregate (the attack job's metrics) gives each arm's differences from the passive baseline of its group;
    a one-seed table of them has the pooled cell equal to that seed's difference."""
    from palaestra.aed.evaluation import summarize
    from palaestra.aed.report import aggregate

    def evaluated(kind, accident_type, responsible: int, **counts):
        found = [{"accident_type": t, "victim_responsible": False, "features": [0.0]} for t, n in counts.items()
                 for _ in range(n)]  # fmt: skip
        for a in found[:responsible]:
            a["victim_responsible"] = True
        ev = {k: v for k, v in summarize(found, 100, target=accident_type).items() if k != "accidents"}
        return {"kind": kind, "accident_type": accident_type, "steps_to_first_success": 1, "arm": "llm", **ev}

    items = [
        evaluated("attack", "rear_end", 12, rear_end=20, side_swipe=5),
        {**evaluated("passive", None, 2, rear_end=3), "arm": None},
    ]
    m = aggregate({"highway": items})
    pre = "aed/highway/rear_end/llm"
    assert m[f"{pre}/target_rate_vs_passive"] == pytest.approx(0.17)
    assert m[f"{pre}/responsible_rate_vs_passive"] == pytest.approx(0.10)
    lo, hi = newcombe_by_hand(12, 100, 2, 100)
    assert (m[f"{pre}/responsible_rate_vs_passive_lo"], m[f"{pre}/responsible_rate_vs_passive_hi"]) == (
        pytest.approx(lo),
        pytest.approx(hi),
    )
    row = next(line for line in seeds_table([m]).splitlines() if line.startswith("| highway/rear_end/llm"))
    assert "+0.170 [" in row and "(one seed)" in row
