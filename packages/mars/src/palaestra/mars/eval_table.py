"""MARS's results table: base vs trained per evaluation setting, with the relative change and 95% intervals.

MARS reports, per game and opponent, the base model's and the trained model's score and the relative
improvement (trained - base) / |base|. `compare` takes two lists of `mars.eval` records (the
``eval_results*.json`` artifacts: a ``mars.train`` run writes one at step 0, the base model when there is no
warm start, and one at its last step) and returns the rows; `format_table` prints them. The score is the win
rate (Wilson interval) against an opponent, the mean score (bootstrap interval) in Hanabi self-play; the
seats pooled (``both``) where both were played, else each seat.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def load_records(path: str | Path) -> list[dict[str, Any]]:
    return json.loads(Path(path).read_text())


def _score(record: dict[str, Any]) -> tuple[float, float, float]:
    key = "mean_return" if record["opponent"] == "self" else "win_rate"
    return record[key], record[f"{key}_lo"], record[f"{key}_hi"]


def _settings(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    by_key = {(r["game"], r["seat"], r["opponent"]): r for r in records if "seat" in r}
    pooled = {(g, o) for g, s, o in by_key if s == "both"}
    return {k: r for k, r in by_key.items() if k[1] in ("both", "selfplay") or (k[0], k[2]) not in pooled}


def compare(base: list[dict[str, Any]], trained: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per setting evaluated in both: scores with intervals and the relative change (NaN for a base of 0)."""
    b, t = _settings(base), _settings(trained)
    rows = []
    for key in [k for k in b if k in t]:
        (vb, lb, hb), (vt, lt, ht) = _score(b[key]), _score(t[key])
        change = (vt - vb) / abs(vb) if vb else math.nan
        game, seat, opponent = key
        rows.append(
            {"game": game, "seat": seat, "opponent": opponent, "base": vb, "base_lo": lb, "base_hi": hb}
            | {"trained": vt, "trained_lo": lt, "trained_hi": ht, "relative_change": change}
        )
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    head = "| game | seat | opponent | base | trained | relative change |\n| --- | --- | --- | --- | --- | --- |"
    lines = [head]
    for r in rows:
        change = "n/a" if math.isnan(r["relative_change"]) else f"{100 * r['relative_change']:+.1f}%"
        lines.append(
            f"| {r['game']} | {r['seat']} | {r['opponent']} | {r['base']:.3f} [{r['base_lo']:.3f}, {r['base_hi']:.3f}]"
            f" | {r['trained']:.3f} [{r['trained_lo']:.3f}, {r['trained_hi']:.3f}] | {change} |"
        )
    return "\n".join(lines)
