"""Near-duplicate removal: a sample that calls what a kept one calls and says nearly what it says.

Two rows are near-duplicates when their call sequences are the same (per turn, the called functions' names in
order: `call_signature`) and the Jaccard similarity of their requests' word-trigram sets (all user turns'
queries, lowercased, punctuation dropped: `shingles`) is at least the threshold. Values are words of the
request, so two requests that differ only in a value share most trigrams but not all: a threshold near 1 drops
only rewordings of the same request, a lower one also drops the same template with other values.

Similarity is exact (no MinHash sketch): rows are bucketed by call signature and a new row is compared with
the rows of its bucket only, so the cost per row is the size of its bucket (a few hundred at 10k samples over
BFCL's environments).
"""

from __future__ import annotations

import json
import re


def shingles(text: str, n: int = 3) -> frozenset[str]:
    """The word n-grams of `text`, lowercased, punctuation dropped (shorter texts: the whole text as one)."""
    words = re.findall(r"[a-z0-9]+(?:\.[0-9]+)?", text.lower())
    if len(words) < n:
        return frozenset([" ".join(words)]) if words else frozenset()
    return frozenset(" ".join(words[i : i + n]) for i in range(len(words) - n + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def call_signature(row: dict) -> str:
    """Per turn, the names of the ground-truth calls in order (BFCL syntax ``name(...)``)."""
    return json.dumps([[c.split("(", 1)[0] for c in turn] for turn in row["ground_truth"]])


def request_text(row: dict) -> str:
    return " | ".join(t["query"] for t in row["turns"] if t.get("query"))


class NearDuplicates:
    """The kept rows' signatures and shingles; `check` says which kept row a new one nearly repeats."""

    def __init__(self, threshold: float):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"near-duplicate threshold must be in (0, 1], got {threshold}")
        self.threshold = threshold
        self.buckets: dict[str, list[tuple[str, frozenset]]] = {}

    def check(self, row: dict) -> str | None:
        """The id of a kept row that `row` nearly repeats, or None."""
        grams = shingles(request_text(row))
        for other_id, other in self.buckets.get(call_signature(row), []):
            if jaccard(grams, other) >= self.threshold:
                return other_id
        return None

    def add(self, row: dict) -> None:
        self.buckets.setdefault(call_signature(row), []).append((row["id"], shingles(request_text(row))))
