"""docs/extending.md names real files: every path it lists exists, and every kind of extension has a section."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
KINDS = ("Advantage estimator", "Environment", "Task source", "Reward", "LLM backend", "Game", "Datagen role")
PATH = re.compile(r"`((?:shared|packages|tests|experiments|docs)/[\w./-]+)`")


def listed_paths(text: str) -> list[str]:
    return PATH.findall(text)


def test_every_listed_path_exists():
    paths = listed_paths(DOC.read_text())
    assert len(paths) > 20  # the doc names its files
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert missing == []


def test_every_kind_of_extension_has_a_section():
    headings = [line[3:] for line in DOC.read_text().splitlines() if line.startswith("## ")]
    for kind in KINDS:
        assert any(h.startswith(kind) for h in headings), kind


def test_a_wrong_path_is_caught():
    """Negative control: a path that is not in the tree is found by the same pattern and reported missing."""
    text = "touch `shared/src/palaestra/shared/rl/no_such_module.py` and `packages/mars/src/palaestra/mars/games.py`"
    paths = listed_paths(text)
    assert paths == ["shared/src/palaestra/shared/rl/no_such_module.py", "packages/mars/src/palaestra/mars/games.py"]
    assert [p for p in paths if not (ROOT / p).exists()] == [paths[0]]
