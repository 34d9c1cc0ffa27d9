"""BFCL's data files as datagen and egpo read them (the optional ``bfcl-eval`` package; nothing here imports it).

`bfcl_data_dir` finds ``bfcl_eval/data`` without importing the package (its import pulls its pinned
dependencies); `read_entries` reads a data file (JSON lines, or for a few files one JSON document); `user_texts`
takes the user turns of an entry's ``question``; `word_ngrams` is the query-contamination rule both packages apply
to their training data: lowercase, everything but ``a-z0-9`` and spaces removed, word n-grams (n = 8 by default).

>>> sorted(word_ngrams("Book a flight, to Paris!", 3))
[('a', 'flight', 'to'), ('book', 'a', 'flight'), ('flight', 'to', 'paris')]
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

NGRAM = 8


def bfcl_data_dir(needed_for: str = "BFCL's data") -> Path:
    """``bfcl_eval/data``; ImportError naming the install command when bfcl-eval is missing."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{needed_for} needs the bfcl-eval package (pip install --no-deps bfcl-eval)")
    return Path(spec.submodule_search_locations[0]) / "data"


def read_entries(path: Path) -> list[dict]:
    """A BFCL data file's entries: JSON lines, or (a few files) one JSON document."""
    text = path.read_text()
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError:
        doc = json.loads(text)
        return [e for e in (doc if isinstance(doc, list) else [doc]) if isinstance(e, dict)]


def user_texts(question: Any) -> list[str]:
    """The text of every user message of a BFCL ``question`` (a list of turns, each a message or a list of them)."""
    out = []
    for turn in question or []:
        for message in turn if isinstance(turn, list) else [turn]:
            if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
                out.append(message["content"])
    return out


def word_ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    """The word n-grams of `text` under the contamination rule (lowercase, only ``a-z0-9`` and spaces)."""
    words = re.sub(r"[^a-z0-9 ]+", " ", text.lower()).split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}
