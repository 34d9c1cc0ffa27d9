"""Near-duplicate removal: constructed near-duplicates are dropped, distinct samples kept, counts in stats.json."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from palaestra.datagen.dataset import SampleWriter, read_rows
from palaestra.shared.config import TrackingConfig


def _row(i: int, queries: list[str], calls: list[list[str]]) -> dict:
    return {"id": f"r{i}", "turns": [{"query": q} for q in queries], "ground_truth": calls}


def _trigrams(text: str) -> set[tuple[str, ...]]:
    """An independent word-trigram set: split on anything that is not a letter, digit or dot inside a number."""
    words = [w.strip(".") for w in re.split(r"[^a-z0-9.]+", text.lower()) if w.strip(".")]
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}


BASE = "please add the numbers two and five for me and tell me the sum right away today"  # 17 words, 15 trigrams


def test_near_duplicates_dropped_distinct_kept(tmp_path):
    reworded_end = BASE.replace("today", "now")  # 14 of 15 trigrams shared: 14 / 16 = 0.875
    other_words = "Compute the total of two plus five, quickly."
    assert len(_trigrams(BASE) & _trigrams(reworded_end)) / len(_trigrams(BASE) | _trigrams(reworded_end)) == 14 / 16
    path = tmp_path / "samples.jsonl"
    with SampleWriter(path, near_duplicate_threshold=0.8) as w:
        assert w.add("r0", _row(0, [BASE], [["add(a=2, b=5)"]]))
        assert not w.add("r1", _row(1, [reworded_end + "!"], [["add(a=2, b=5)"]]))  # 0.875 >= 0.8: dropped
        assert w.add("r2", _row(2, [reworded_end], [["subtract(a=2, b=5)"]]))  # other calls: kept
        assert w.add("r3", _row(3, [other_words], [["add(a=2, b=5)"]]))  # other words: kept
        # the same names with other arguments are the same call sequence
        assert not w.add("r4", _row(4, [BASE.replace("today", "now")], [["add(a=3, b=5)"]]))
        assert w.near_duplicates == 2 and w.duplicates == 0
    with SampleWriter(path, near_duplicate_threshold=0.9) as w:  # resumed: the index is rebuilt from the file
        assert not w.add("r5", _row(5, [BASE + "."], [["add(a=2, b=5)"]]))  # identical words: 1.0
        assert w.add("r6", _row(6, [reworded_end], [["add(a=2, b=5)"]]))  # 0.875 < 0.9: kept
    assert [r["id"] for r in read_rows(path)] == ["r0", "r2", "r3", "r6"]
    with SampleWriter(tmp_path / "off.jsonl") as w:  # no threshold: only exact duplicates go
        assert w.add("r0", _row(0, [BASE], [["add(a=2, b=5)"]]))
        assert w.add("r1", _row(1, [reworded_end], [["add(a=2, b=5)"]]))


def test_generation_counts_near_duplicates(tmp_path):
    """A low threshold over MathAPI (each of its 17 functions the target 3 times, one turn) drops some; no two
    kept rows with the same calls are as similar as the threshold, by an independent trigram count."""
    from palaestra.datagen.generate import DataGenerationConfig, generate
    from palaestra.datagen.pipeline import ItemConfig
    from palaestra.shared.tracking import Tracker

    cfg = DataGenerationConfig(
        num_samples=51,
        item=ItemConfig(max_turns=1),
        workers=0,
        envs=["MathAPI"],
        output_dir=str(tmp_path),
        tracking=TrackingConfig(enabled=False),
        near_duplicate_threshold=0.15,
        log_samples=False,
    )
    result = generate(cfg, Tracker(cfg.tracking))
    stats = json.loads((cfg.output_path.parent / "stats.json").read_text())
    assert stats["near_duplicates"] > 0
    assert result["kept"] + result["dropped"] + stats["near_duplicates"] + stats["duplicates"] == 51
    rows = read_rows(cfg.output_path)
    for a, b in itertools.combinations(rows, 2):
        if [[c.split("(")[0] for c in t] for t in a["ground_truth"]] != [
            [c.split("(")[0] for c in t] for t in b["ground_truth"]
        ]:
            continue
        ta = _trigrams(" | ".join(t["query"] for t in a["turns"] if t["query"]))
        tb = _trigrams(" | ".join(t["query"] for t in b["turns"] if t["query"]))
        assert len(ta & tb) / len(ta | tb) < 0.15


def test_bad_threshold_is_refused():
    from palaestra.datagen.neardup import NearDuplicates

    with pytest.raises(ValueError, match="threshold"):
        NearDuplicates(1.5)
