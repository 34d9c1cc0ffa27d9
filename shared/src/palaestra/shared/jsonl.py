"""Reading JSONL files given by users: one value per line, blank lines skipped.

A line that is not JSON is a `ConfigError` naming the file and line, so every
loader reports bad input the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from palaestra.shared.config import ConfigError


def read_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line of `path` (the caller checks that it exists)."""
    path = Path(path)
    with path.open() as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}:{number}: not valid JSON ({err.msg})") from None
