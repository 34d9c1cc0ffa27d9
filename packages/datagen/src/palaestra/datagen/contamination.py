"""Contamination check against BFCL's test entries: identical initial configs and query n-gram overlap.

A sample is *config-contaminated* when its initial config for an environment
equals (as canonical JSON) the config of that environment in any of BFCL's
multi-turn test entries (``multi_turn_base``, ``_miss_func``, ``_miss_param``,
``_long_context``). An empty config (``MathAPI``: the environment has no
state) says nothing about where a sample comes from and is not counted.
A sample is *query-contaminated* when one of its user turns shares a word
n-gram (default n = 8, lowercased, punctuation stripped) with any user turn
of any BFCL v4 test file. `ContaminationIndex.check(row)` returns the reasons
(empty when clean); `summary(rows)` is what goes into a run's ``stats.json``.
"""

from __future__ import annotations

import json
from functools import cache

from palaestra.shared.bfcl_data import NGRAM, bfcl_data_dir, read_entries, user_texts, word_ngrams

MULTI_TURN_FILES = [
    "BFCL_v4_multi_turn_base.json",
    "BFCL_v4_multi_turn_miss_func.json",
    "BFCL_v4_multi_turn_miss_param.json",
    "BFCL_v4_multi_turn_long_context.json",
]


def canonical_config(config: dict) -> str:
    """Canonical JSON of a config (keys sorted; int keys as strings, as JSON stores them)."""
    return json.dumps(json.loads(json.dumps(config, default=str)), sort_keys=True)


class ContaminationIndex:
    """BFCL's test configs (per environment class) and the n-grams of its test queries."""

    def __init__(self, configs: dict[str, set[str]], ngrams: set[tuple[str, ...]], n: int = NGRAM):
        self.configs = configs
        self.ngrams = ngrams
        self.n = n

    @classmethod
    @cache
    def from_bfcl(cls, n: int = NGRAM) -> ContaminationIndex:
        data = bfcl_data_dir("the contamination check")
        configs: dict[str, set[str]] = {}
        ngrams: set[tuple[str, ...]] = set()
        for path in sorted(data.glob("BFCL_v4_*.json")):
            for entry in read_entries(path):
                for text in user_texts(entry.get("question")):
                    ngrams |= word_ngrams(text, n)
                if path.name in MULTI_TURN_FILES:
                    for cls_name, config in (entry.get("initial_config") or {}).items():
                        configs.setdefault(cls_name, set()).add(canonical_config(config))
        return cls(configs, ngrams, n)

    def config_hits(self, initial_config: dict) -> list[str]:
        """Environment classes whose config equals a BFCL test config (empty configs excluded)."""
        return [c for c, cfg in initial_config.items() if cfg and canonical_config(cfg) in self.configs.get(c, set())]

    def query_hits(self, texts: list[str]) -> list[str]:
        """The shared n-grams (joined) between `texts` and BFCL's test queries."""
        hits = []
        for text in texts:
            hits += [" ".join(g) for g in word_ngrams(text, self.n) & self.ngrams]
        return hits

    def check(self, row: dict) -> list[str]:
        """Reasons the row is contaminated: ``config:<class>`` and/or ``query_ngram``; [] when clean."""
        config = json.loads(row["initial_config"]) if isinstance(row["initial_config"], str) else row["initial_config"]
        reasons = [f"config:{c}" for c in self.config_hits(config)]
        users = [m["content"] for m in row["messages"] if m["role"] == "user"]
        if self.query_hits(users):
            reasons.append("query_ngram")
        return reasons

    def summary(self, rows: list[dict]) -> dict:
        """``{"checked", "contaminated", "config_identical", "query_ngram_overlap", "ngram"}`` over `rows`."""
        config = query = bad = 0
        for row in rows:
            reasons = self.check(row)
            bad += bool(reasons)
            config += any(r.startswith("config:") for r in reasons)
            query += "query_ngram" in reasons
        return {
            "checked": len(rows),
            "contaminated": bad,
            "config_identical": config,
            "query_ngram_overlap": query,
            "ngram": self.n,
        }
