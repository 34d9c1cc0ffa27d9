"""Each arm against the passive baseline: differences of rates with intervals, for one seed and over seeds.

An attack's rate means little beside the accidents the victim has on its own. `passive_contrasts` gives, per
accident type and arm, two differences from the passive adversaries (always IDLE) on the same episodes:

- the target-type rate (accidents of the adversary's own type per episode) minus the passive rate of that type;
- the AV-responsible rate (accidents the victim is responsible for, any type, per episode) minus the passive one.

Each comes with Newcombe's hybrid score interval for a difference of two proportions (Newcombe 1998, "Interval
estimation for the difference between independent proportions", method 10: built from the two Wilson intervals),
and with the counts behind it, so that `seeds_table` can pool several seeds (the ``matrix:`` seeds of
``compare_cpu.yaml``): the pooled difference with its Newcombe interval, and the mean of the per-seed differences
with its Student t interval. ``python -m palaestra.aed.contrast DIR`` prints that table from a matrix's
``DIR/*/matrix_result.json``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from palaestra.shared.stats import t_mean_interval, wilson_interval

RATES = {"target": "target-type rate", "responsible": "AV-responsible rate"}
"""The two rates compared with the passive baseline (the key of each in the metrics, and its name)."""


def newcombe_interval(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float]:
    """95% interval of ``k1/n1 - k2/n2`` (Newcombe's method 10: the square-and-add of the Wilson intervals)."""
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1)
    l2, u2 = wilson_interval(k2, n2)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def _counts(result: dict[str, Any], accident_type: str) -> dict[str, int]:
    """Episodes, target-type and AV-responsible accidents of an evaluation result (rates are counts / episodes)."""
    n = result["episodes"]
    return {
        "episodes": n,
        "target": result["types"].get(accident_type, 0),
        "responsible": round(result["effective_asr"] * n),
    }


def passive_contrasts(prefix: str, attack: dict[str, Any], passive: dict[str, Any]) -> dict[str, float]:
    """Metrics ``<prefix>/<rate>_rate_vs_passive`` (+ ``_lo``, ``_hi``) and the counts behind them."""
    mine, base = _counts(attack, attack["accident_type"]), _counts(passive, attack["accident_type"])
    metrics: dict[str, float] = {f"{prefix}/episodes": mine["episodes"], f"{prefix}/passive_episodes": base["episodes"]}
    for rate in RATES:
        k1, n1, k2, n2 = mine[rate], mine["episodes"], base[rate], base["episodes"]
        metrics[f"{prefix}/{rate}_count"], metrics[f"{prefix}/passive_{rate}_count"] = k1, k2
        lo, hi = newcombe_interval(k1, n1, k2, n2)
        key = f"{prefix}/{rate}_rate_vs_passive"
        metrics[key], metrics[f"{key}_lo"], metrics[f"{key}_hi"] = k1 / n1 - k2 / n2, lo, hi
    return metrics


def _arms(record: dict[str, float]) -> dict[str, str]:
    """Arm name (``highway/rear_end/llm``) -> its key prefix in a flat metrics record (pipeline prefixes kept)."""
    arms = {}
    for key in record:
        if key.endswith("/passive_target_count"):
            prefix = key[: -len("/passive_target_count")]
            arms[prefix.split("aed/", 1)[-1]] = prefix
    return arms


def seeds_table(records: list[dict[str, float]]) -> str:
    """Markdown: per arm, each rate minus the passive one, pooled over the seeds' counts (Newcombe) and as the
    mean of the per-seed differences (Student t, with at least two seeds)."""
    arms = sorted({arm for r in records for arm in _arms(r)})
    head = "| arm | seeds |" + "".join(f" {name} - passive: pooled | mean over seeds |" for name in RATES.values())
    lines = [head, "| --- | --- |" + " --- | --- |" * len(RATES)]
    for arm in arms:
        mine = [(r, _arms(r)[arm]) for r in records if arm in _arms(r)]
        cells = [arm, str(len(mine))]
        for rate in RATES:
            k1 = sum(int(r[f"{p}/{rate}_count"]) for r, p in mine)
            n1 = sum(int(r[f"{p}/episodes"]) for r, p in mine)
            k2 = sum(int(r[f"{p}/passive_{rate}_count"]) for r, p in mine)
            n2 = sum(int(r[f"{p}/passive_episodes"]) for r, p in mine)
            lo, hi = newcombe_interval(k1, n1, k2, n2)
            cells.append(f"{k1 / n1 - k2 / n2:+.3f} [{lo:+.3f}, {hi:+.3f}]")
            per_seed = [r[f"{p}/{rate}_rate_vs_passive"] for r, p in mine]
            mean = sum(per_seed) / len(per_seed)
            if len(per_seed) > 1:
                tlo, thi = t_mean_interval(per_seed)
                cells.append(f"{mean:+.3f} [{tlo:+.3f}, {thi:+.3f}]")
            else:
                cells.append(f"{mean:+.3f} (one seed)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def matrix_records(directory: str | Path) -> list[dict[str, float]]:
    """The flat summaries of a matrix's finished combinations (``<directory>/*/matrix_result.json``)."""
    return [json.loads(p.read_text())["summary"] for p in sorted(Path(directory).glob("*/matrix_result.json"))]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m palaestra.aed.contrast MATRIX_OUTPUT_DIR")
    found = matrix_records(sys.argv[1])
    if not found:
        sys.exit(f"no */matrix_result.json under {sys.argv[1]} (run the matrix config first)")
    print(seeds_table(found), end="")
