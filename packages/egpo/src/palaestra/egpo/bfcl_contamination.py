"""BFCL contamination check of training tasks: a task whose user turns share a word n-gram with a BFCL test question.

The rule is datagen's query check (`palaestra.datagen.contamination`, which egpo may not import: packages depend on
the shared core only): lowercase, everything but ``a-z0-9`` and spaces removed, word 8-grams, any overlap with the
user turns of any ``BFCL_v4_*.json`` test file counts. A test checks that both give the same verdicts. Public sets
have no BFCL ``initial_config``, so datagen's other rule (identical environment configs) does not apply here.

``egpo.train`` runs every set it trains on through this check before training (`check_training_sets` in
`palaestra.egpo.train`) and logs the result as the run's artifact ``data/contamination.json``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from palaestra.shared.bfcl_data import NGRAM, bfcl_data_dir, read_entries, user_texts, word_ngrams


class BfclQueryIndex:
    """The word n-grams of every BFCL v4 test question."""

    def __init__(self, ngrams: set[tuple[str, ...]], n: int = NGRAM):
        self.ngrams, self.n = ngrams, n

    @classmethod
    @cache
    def from_bfcl(cls, n: int = NGRAM) -> BfclQueryIndex:
        ngrams: set[tuple[str, ...]] = set()
        for path in sorted(bfcl_data_dir("the contamination check").glob("BFCL_v4_*.json")):
            for entry in read_entries(path):
                for text in user_texts(entry.get("question")):
                    ngrams |= word_ngrams(text, n)
        return cls(ngrams, n)

    def text_hits(self, texts: list[str]) -> list[str]:
        """The shared n-grams (joined) between `texts` and BFCL's questions."""
        return [" ".join(g) for text in texts for g in word_ngrams(text, self.n) & self.ngrams]

    def sample_hits(self, samples: list[dict]) -> dict[str, list[str]]:
        """``{sample id (else its index): shared n-grams}`` of chat samples (``messages``) whose user turns
        overlap BFCL's questions."""
        hits = {}
        for i, sample in enumerate(samples):
            found = self.text_hits(user_texts_of(sample.get("messages") or []))
            if found:
                hits[str(sample.get("id", i))] = found
        return hits

    def task_hits(self, tasks: list) -> dict[str, list[str]]:
        """``{task id: shared n-grams}`` of the tasks (`FCTask`) whose user turns overlap BFCL's questions."""
        hits = {}
        for task in tasks:
            found = self.text_hits([m["content"] for m in task.messages if m.get("role") == "user"])
            if found:
                hits[task.id] = found
        return hits

    def summary(self, tasks: list, hits: dict[str, list[str]]) -> dict[str, Any]:
        """What goes into the data report: counts and a few examples."""
        return {
            "checked": len(tasks),
            "contaminated": len(hits),
            "ngram": self.n,
            "examples": [{"id": k, "ngram": v[0]} for k, v in list(hits.items())[:3]],
        }


def user_texts_of(messages: list[dict]) -> list[str]:
    """The text of a conversation's user turns."""
    return [m["content"] for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)]
